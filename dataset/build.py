"""python3 -m dataset.build: real measurements → per-operator training and test CSVs.

For every operator class, the measurements of all sources (dataset/sources.py) are mapped to the
registry's shapes, repeated keys are averaged, invalid rows are dropped with a logged reason, and
the analytical features and the ``overall_perf`` target are computed. Rows are split by shape
(pipeweave/splits.py): no shape is in both files. Output, per operator:
``dataset/<op>_{train,test}.csv`` in the artifact's schema (docs/METHOD.md §5.3) plus ``source`` and
``dtype``; and ``dataset/collective.csv`` for the collective models. Generated files are not
committed.
"""
from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.pipes import HARDWARE_SPEC_COLUMNS
from analytical_model.registry import TILE_COLUMNS, compute_features, get_operator, operator_keys
from analytical_model.tiles import choose_gemm_tiles
from dataset.sources import load_collectives, load_measurements
from pipeweave.cli import ArgumentParser, UserError, run_cli, write_atomically
from pipeweave.paths import DATASET_DIR
from pipeweave.splits import shape_holdout_mask, shape_keys

TRAINABLE_OPS = operator_keys(trainable=True)


def _log_drop(log, op: str, reason: str, frame: pd.DataFrame) -> None:
    if len(frame):
        by_gpu = ", ".join(f"{k}: {v}" for k, v in frame["hardware"].value_counts().sort_index().items())
        log(f"  {op}: dropped {len(frame)} rows ({reason}) [{by_gpu}]")


def average_repeats(frame: pd.DataFrame, op: str) -> pd.DataFrame:
    """One row per (shape, GPU, dtype, source): the mean of repeated measurements."""
    keys = list(get_operator(op).shape_columns) + ["hardware", "dtype", "source"]
    return frame.groupby(keys, sort=True, as_index=False, dropna=False)["avg_duration"].mean()


PARALLEL_OPS = ("attn",)  # the only operator whose features loop per row in Python
PARALLEL_CHUNK = 2000


def _parallel_features(op: str, frame: pd.DataFrame, workers: int) -> pd.DataFrame:
    """compute_features over row chunks in ``workers`` processes; identical to one call, just faster."""
    if op not in PARALLEL_OPS or workers < 2 or len(frame) <= PARALLEL_CHUNK:
        return compute_features(op, frame)
    chunks = [frame.iloc[i : i + PARALLEL_CHUNK] for i in range(0, len(frame), PARALLEL_CHUNK)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        parts = list(pool.map(compute_features, [op] * len(chunks), chunks))
    return pd.concat(parts)


def _features_with_row_fallback(op: str, frame: pd.DataFrame, log, workers: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Features for every valid row; rows the calculators reject are dropped, reason logged."""
    try:
        return frame, _parallel_features(op, frame, workers)
    except ValueError:
        pass
    keep, reasons = [], {}
    for i in range(len(frame)):
        try:
            compute_features(op, frame.iloc[[i]])
            keep.append(i)
        except ValueError as exc:
            reasons.setdefault(str(exc).split(";")[0][:120], []).append(i)
    for reason, rows in reasons.items():
        _log_drop(log, op, f"calculator rejected: {reason}", frame.iloc[rows])
    frame = frame.iloc[keep]
    return frame, compute_features(op, frame)


def build_operator(op: str, raw: pd.DataFrame, log=print, workers: int = 1) -> pd.DataFrame:
    """Map raw measurements of one operator class to dataset rows (all GPUs, before the split)."""
    operator = get_operator(op)
    registry = hardware_registry(DEFAULT_HARDWARE_DIR)
    raw = raw.copy()
    if "dtype" not in raw.columns:
        raw["dtype"] = "bfloat16"
    known = raw["hardware"].map(lambda name: name in registry)
    _log_drop(log, op, "GPU without a hardware JSON", raw[~known])
    raw = raw[known]
    bad = ~np.isfinite(pd.to_numeric(raw["avg_duration"], errors="coerce")) | ~(raw["avg_duration"] > 0)
    _log_drop(log, op, "missing or non-positive duration", raw[bad])
    raw = raw[~bad]
    raw = raw.assign(hardware=raw["hardware"].map(lambda name: registry.get(name).name))
    frame = average_repeats(raw, op).reset_index(drop=True)
    frame, features = _features_with_row_fallback(op, frame, log, workers)
    frame = frame.reset_index(drop=True)
    features = features.reset_index(drop=True)
    specs = frame["hardware"].map(registry.get)
    sm_freq = specs.map(lambda s: s.sm_freq).to_numpy(np.float64)
    perf = features["ideal_cycles"].to_numpy() / (frame["avg_duration"].to_numpy() * sm_freq)
    bad = ~np.isfinite(perf) | (perf <= 0)
    if bad.any():
        _log_drop(log, op, "zero ideal cycles", frame[bad])
    columns = list(operator.shape_columns)
    out = frame[columns].copy()
    if op == "gemm":
        for hw_name, rows in frame.groupby("hardware").groups.items():
            rows = np.asarray(rows)
            tiles = choose_gemm_tiles(frame.loc[rows, "M"], frame.loc[rows, "N"], frame.loc[rows, "K"], registry.get(hw_name))
            for column in TILE_COLUMNS:
                out.loc[rows, column] = tiles[column].astype(np.int64)
        out[list(TILE_COLUMNS)] = out[list(TILE_COLUMNS)].astype(np.int64)
    out["avg_duration"] = frame["avg_duration"]
    out["hardware"] = frame["hardware"]
    for column in HARDWARE_SPEC_COLUMNS:
        out[column] = specs.map(lambda s, c=column: s.spec_columns()[c]).to_numpy()
    for column in operator.feature_names + operator.descriptor_names:
        out[column] = features[column].to_numpy()
    out["overall_perf"] = perf
    out["source"] = frame["source"].to_numpy()
    out["dtype"] = frame["dtype"].to_numpy()
    out = out[~bad].reset_index(drop=True)
    return out


def fp8_rows_for_gemm(gemm: pd.DataFrame, fp8: pd.DataFrame) -> pd.DataFrame:
    """Compute-bound FP8 GEMM rows of GPUs that have no BF16 GEMM measurement, in the gemm schema (``dtype`` fp8).

    Features and descriptors of these rows use the FP8 calculator and the FP8 tensor rate, so in cycle
    space their ``overall_perf`` is the same kind of efficiency as a BF16 row's; they give the BF16
    model the only measurements of compute-starved, bandwidth-rich GPUs (H20, H800). Only rows whose FP8
    roofline is compute-bound (``exact_tensor_cycle >= exact_dram_cycle``) are taken: in the memory-bound
    regime PipeWeave's FP8 kernels reach a median 0.20 of spec DRAM bandwidth on H100 where BF16 GEMMs of
    the same GPU reach 0.49 (aiconfigurator) and 0.54 (Vidur), so those rows would teach the BF16 model a
    bandwidth efficiency that BF16 GEMMs do not have (H20's reach 0.06). Tile columns hold the FP8
    kernel's 128×128×128 tiles.
    """
    extra = fp8[~fp8["hardware"].isin(set(gemm["hardware"]))
                & (fp8["exact_tensor_cycle"] >= fp8["exact_dram_cycle"])].copy()
    if extra.empty:
        return extra
    extra["tile_M"] = extra["tile_N"] = extra["tile_K"] = 128
    extra["is_split_k"] = 0
    extra["cta_count"] = -(-extra["M"] // 128) * -(-extra["N"] // 128)
    return extra[list(gemm.columns)]


def split(frame: pd.DataFrame, op: str, test_fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    is_test = shape_holdout_mask(shape_keys(frame, op), test_fraction)
    return frame[~is_test].reset_index(drop=True), frame[is_test].reset_index(drop=True)


def row_count_table(frames: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> str:
    lines = ["| operator | GPU | train | test |", "|---|---|---|---|"]
    for op, (train, test) in frames.items():
        counts = pd.concat(
            [train["hardware"].value_counts().rename("train"), test["hardware"].value_counts().rename("test")], axis=1
        ).fillna(0).astype(int).sort_index()
        for gpu, row in counts.iterrows():
            lines.append(f"| {op} | {gpu} | {row['train']} | {row['test']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python3 -m dataset.build", description="Build per-operator datasets from real measurements.")
    parser.add_argument("--ops", default=",".join(TRAINABLE_OPS),
                        help=f"comma list of operator classes (default: {','.join(TRAINABLE_OPS)})")
    parser.add_argument("--output_dir", type=Path, default=DATASET_DIR,
                        help="folder of the <op>_{train,test}.csv files (default: dataset)")
    parser.add_argument("--test_fraction", type=float, default=0.2,
                        help="share of shapes held out for testing (default 0.2)")
    parser.add_argument("--no_collectives", action="store_true", help="skip dataset/collective.csv")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes for the attention features (default: 2, or 1 on a one-core machine)")
    args = parser.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for op in ops:
        if op not in TRAINABLE_OPS:
            raise UserError(f"unknown operator {op!r}; choose from {', '.join(TRAINABLE_OPS)}")
    if not 0 < args.test_fraction < 1:
        raise UserError("--test_fraction must be between 0 and 1")
    started = time.perf_counter()
    raw = load_measurements(sorted(set(ops) | ({"gemm_fp8"} if "gemm" in ops else set())))
    built, operator_frames = {}, {}

    def operator_frame(op: str) -> pd.DataFrame:
        """Each operator is built once, also when GEMM borrows the FP8 rows."""
        if op not in operator_frames:
            operator_frames[op] = build_operator(op, raw[op], workers=args.workers)
        return operator_frames[op]

    for op in ops:
        if op not in raw or raw[op].empty:
            print(f"{op}: no measurements found; skipped (no files written)")
            continue
        t0 = time.perf_counter()
        frame = operator_frame(op)
        if op == "gemm" and not raw.get("gemm_fp8", pd.DataFrame()).empty:
            extra = fp8_rows_for_gemm(frame, operator_frame("gemm_fp8"))
            print(f"gemm: + {len(extra)} FP8 rows of GPUs without BF16 data ({', '.join(sorted(pd.unique(extra['hardware'])))})")
            frame = pd.concat([frame, extra], ignore_index=True)
        train, test = split(frame, op, args.test_fraction)
        for name, part in (("train", train), ("test", test)):
            path = args.output_dir / f"{op}_{name}.csv"
            write_atomically(path, lambda tmp, p=part: p.to_csv(tmp, index=False))
        built[op] = (train, test)
        print(f"{op}: {len(train)} train / {len(test)} test rows ({time.perf_counter() - t0:.1f} s)")
    if not args.no_collectives:
        collectives = load_collectives()
        path = args.output_dir / "collective.csv"
        write_atomically(path, lambda tmp: collectives.to_csv(tmp, index=False))
        print(f"collective: {len(collectives)} rows")
    print(row_count_table(built))
    print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
