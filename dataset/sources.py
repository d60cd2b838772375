"""Real kernel and collective measurements, read in place and returned in one common schema.

Sources: A the PipeWeave artifact (FP8 GEMM CSVs, collective sweeps), B Vidur (FP16 per-layer operator times,
network sweeps), C aiconfigurator-core 0.12.0 (vLLM tables of the installed package, located, never imported),
and the project's own ``dataset/measured/<gpu>/*.csv``. Nothing is copied into the repository.

Every loader returns one DataFrame per operator class with the registry's shape columns plus ``hardware`` (the
device name as in the data), ``dtype``, ``avg_duration`` [µs] and ``source``; rows are cleaned (each drop logged
with its count and reason), repeated keys averaged and sorted stably by (hardware, source, shape, dtype).
Collectives come from :func:`load_collectives` in their own schema.

docs/DATA.md says, per source, what is read, how each measurement becomes an operator shape and why (kernel
choices, units, the decode labelling, MoE widths, Vidur's layer mapping) and which oddities are kept.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

import pandas as pd

from analytical_model.hardware import hardware_registry
from dataset.aiconfigurator import AIC_MOE_DISTRIBUTIONS, aiconfigurator_data_dir, load_aiconfigurator
from dataset.collective_sources import load_collectives
from dataset.common import (COLLECTIVE_COLUMNS, COLUMNS, DEFAULT_DTYPE, INT_COLUMNS, OP_ALIASES, OPS, PIPEWEAVE_COMMIT,
                            SHAPE_COLUMNS, Log, concat_frames, finalize, normalise_dtype, wanted_ops)
from dataset.vidur import load_vidur
from pipeweave.paths import DEFAULT_MEASURED_DIR, REPO_ROOT, existing_shared_data_dir
from pipeweave.profiler.csvio import FLUSH_TIMING_GAP, TIMING_BEFORE_COLUMN, unmodelled_reasons

#: the public entry points of the measurement loaders (the per-source modules hold the details)
__all__ = [
    "OPS", "SHAPE_COLUMNS", "INT_COLUMNS", "COLUMNS", "COLLECTIVE_COLUMNS", "load_measurements", "load_aiconfigurator",
    "load_vidur", "load_pipeweave_fp8", "load_measured", "load_collectives", "aiconfigurator_data_dir",
]


def load_pipeweave_fp8(log: Log = print, data_dir: Path | None = None) -> pd.DataFrame:
    """PipeWeave's FP8 GEMM measurements (train and test CSVs; ``source`` names the file)."""
    data_dir = data_dir or existing_shared_data_dir()
    frames = []
    for name in ("gemm_fp8_train.csv", "gemm_fp8_test.csv"):
        path = data_dir / "pipeweave" / "dataset" / name if data_dir else None
        if path is None or not path.is_file():
            log(f"[pipeweave] dataset/{name} not found; skipped")
            continue
        d = pd.read_csv(path, usecols=["M", "N", "K", "avg_duration", "hardware"])
        d["dtype"] = "fp8"
        d["source"] = f"pipeweave {PIPEWEAVE_COMMIT} dataset/{name}"
        frames.append(finalize("gemm_fp8", d, log, f"pipeweave {name}"))
    return concat_frames("gemm_fp8", frames)


def load_measured(measured_dir: Path | str | None = None, ops=None, log: Log = print) -> dict[str, pd.DataFrame]:
    """Raw CSVs of the project's profiler: ``<measured_dir>/<gpu>/*.csv`` (default dataset/measured)."""
    ops = wanted_ops(ops)
    base = Path(measured_dir) if measured_dir is not None else DEFAULT_MEASURED_DIR
    if not base.is_dir():
        return {}
    parts: dict[str, list[pd.DataFrame]] = {op: [] for op in ops}
    for path in sorted(base.glob("*/*.csv")):
        try:
            rel = path.relative_to(REPO_ROOT).as_posix()
        except ValueError:
            rel = path.relative_to(base.parent).as_posix()
        label = f"measured {rel}"
        try:
            d = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
            log(f"[{label}] unreadable ({exc}); skipped")
            continue
        need = [c for c in ("op", "hardware", "avg_duration") if c not in d.columns]
        if need:
            log(f"[{label}] lacks required columns {need}; skipped")
            continue
        if d.empty:
            continue
        op_names = d["op"].astype(str).str.strip().map(lambda o: OP_ALIASES.get(o, o))
        unknown = sorted(set(op_names) - set(OPS))
        if unknown:
            log(f"[{label}] {int(op_names.isin(unknown).sum())} rows with unknown op {unknown}; skipped")
        for op in ops:
            rows = d.loc[(op_names == op).to_numpy()]
            if rows.empty:
                continue
            lacking = [c for c in SHAPE_COLUMNS[op] if c not in rows.columns]
            if lacking:
                log(f"[{label}] {len(rows)} {op} rows lack shape columns {lacking}; skipped")
                continue
            reasons = unmodelled_reasons(op, rows)  # another kernel's time is not this GPU's
            for reason in dict.fromkeys(r for r in reasons if r):
                log(f"[{label}] {reasons.count(reason)} {op} rows {reason}; skipped")
            rows = rows[[reason is None for reason in reasons]]
            timing = (rows["timing"].astype(object).where(rows["timing"].notna(), TIMING_BEFORE_COLUMN).astype(str)
                      if "timing" in rows.columns else pd.Series(TIMING_BEFORE_COLUMN, index=rows.index))
            # a shape measured again with another --timing: the later timing only
            latest = timing.groupby([rows[c] for c in (*SHAPE_COLUMNS[op], "hardware")], sort=False,
                                    dropna=False).transform("last")  # a row missing a cell is dropped later, said
            rows, timing = rows[(timing == latest).to_numpy()], timing[(timing == latest).to_numpy()]
            if rows.empty:
                continue
            flushed = int((timing == TIMING_BEFORE_COLUMN).sum())
            if flushed:  # kept (the user measured them), but said: they train and calibrate like any other row
                log(f"[{label}] {flushed} {op} rows timed with profile_operators.py --timing flush, "
                    f"{FLUSH_TIMING_GAP}; kept (README, 'Measuring a new GPU'): measure them again with the default "
                    f"--timing rotate")
            frame = rows[SHAPE_COLUMNS[op] + ["hardware", "avg_duration"]].copy()
            dtypes = rows["dtype"] if "dtype" in rows.columns else pd.Series([None] * len(rows), index=rows.index)
            frame["dtype"] = [normalise_dtype(v, DEFAULT_DTYPE[op]) for v in dtypes]
            frame["source"] = f"measured {rel}"
            parts[op].append(finalize(op, frame, log, label, check_lists=(op == "attn")))
    out = {op: concat_frames(op, frames) for op, frames in parts.items()}
    return {op: frame for op, frame in out.items() if not frame.empty}


def load_measurements(ops=None, log: Log = print, measured_dir: Path | str | None = None,
                      moe_distributions: Iterable[str] = AIC_MOE_DISTRIBUTIONS) -> dict[str, pd.DataFrame]:
    """Every real measurement, one frame per operator class (all requested ops present, possibly empty).

    Sources: aiconfigurator-core (vLLM tables), Vidur (FP16 layers), PipeWeave FP8 GEMM, dataset/measured.
    Missing sources are skipped with a log line.
    """
    ops = wanted_ops(ops)
    start = time.perf_counter()
    parts: dict[str, list[pd.DataFrame]] = {op: [] for op in ops}
    for loaded in (load_aiconfigurator(ops, log=log, moe_distributions=moe_distributions),
                   load_vidur(ops, log=log),
                   {"gemm_fp8": load_pipeweave_fp8(log=log)} if "gemm_fp8" in ops else {},
                   load_measured(measured_dir, ops, log=log)):
        for op, frame in loaded.items():
            parts[op].append(frame)
    out = {op: concat_frames(op, frames) for op, frames in parts.items()}
    registry = hardware_registry()
    for op, frame in out.items():
        unknown = sorted(h for h in frame["hardware"].unique() if h not in registry)
        if unknown:
            log(f"[measurements] {op}: hardware without a hardware JSON (rows kept): {unknown}")
    log("[measurements] " + ", ".join(f"{op} {len(f)}" for op, f in out.items())
        + f" rows in {time.perf_counter() - start:.1f} s")
    return out
