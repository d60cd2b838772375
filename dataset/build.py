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
from pipeweave.cli import ArgumentParser, UserError, run_cli, trainable_operator_list, write_atomically
from pipeweave.paths import DATASET_DIR, require_shared_data
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


#: a calculator may reject a few malformed measured shapes (a zero dimension); rejecting more than this share of an
#: operator's rows, or every row of one GPU, is a calculator bug, and the build stops instead of writing a dataset
#: without them (none of the real measurements is rejected today)
MAX_REJECTED_SHARE = 0.01


class CalculatorRejectedRows(RuntimeError):
    """The analytical calculators rejected too many measured rows for the rejections to be bad measurements."""


def _features_with_row_fallback(op: str, frame: pd.DataFrame, log, workers: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Features for every valid row; the few rows the calculators reject are dropped, reason logged
    (:data:`MAX_REJECTED_SHARE`: more stop the build)."""
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
    rejected = len(frame) - len(keep)
    emptied = sorted(set(frame["hardware"]) - set(frame["hardware"].iloc[keep]))
    if rejected > MAX_REJECTED_SHARE * len(frame) or emptied:
        reason, rows = max(reasons.items(), key=lambda item: len(item[1]))
        raise CalculatorRejectedRows(
            f"{op}: the calculators rejected {rejected} of {len(frame)} rows"
            + (f", every row of {', '.join(emptied)}" if emptied else "")
            + f" (more than {MAX_REJECTED_SHARE:.0%} is a calculator bug, not bad measurements); most common reason "
            f"({len(rows)} rows): {reason}")
    frame = frame.iloc[keep]
    return frame, compute_features(op, frame)


def build_operator(op: str, raw: pd.DataFrame, log=print, workers: int = 1) -> pd.DataFrame:
    """Map raw measurements of one operator class to dataset rows (all GPUs, before the split)."""
    operator = get_operator(op)
    registry = hardware_registry(DEFAULT_HARDWARE_DIR)
    raw = raw.copy()
    if "dtype" not in raw.columns:
        raw["dtype"] = "bfloat16"
    # per GPU name, not per row (hundreds of thousands of rows, a few dozen names)
    known = raw["hardware"].map({name: name in registry for name in raw["hardware"].unique()})
    _log_drop(log, op, "GPU without a hardware JSON", raw[~known])
    raw = raw[known]
    bad = ~np.isfinite(pd.to_numeric(raw["avg_duration"], errors="coerce")) | ~(raw["avg_duration"] > 0)
    _log_drop(log, op, "missing or non-positive duration", raw[bad])
    raw = raw[~bad]
    raw = raw.assign(hardware=raw["hardware"].map({name: registry.get(name).name for name in raw["hardware"].unique()}))
    frame = average_repeats(raw, op).reset_index(drop=True)
    frame, features = _features_with_row_fallback(op, frame, log, workers)
    frame = frame.reset_index(drop=True)
    features = features.reset_index(drop=True)
    specs = {name: registry.get(name) for name in frame["hardware"].unique()}
    sm_freq = frame["hardware"].map({name: spec.sm_freq for name, spec in specs.items()}).to_numpy(np.float64)
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
    spec_columns = {name: spec.spec_columns() for name, spec in specs.items()}
    for column in HARDWARE_SPEC_COLUMNS:
        out[column] = frame["hardware"].map({name: values[column] for name, values in spec_columns.items()}).to_numpy()
    for column in operator.feature_names + operator.descriptor_names:
        out[column] = features[column].to_numpy()
    out["overall_perf"] = perf
    out["source"] = frame["source"].to_numpy()
    out["dtype"] = frame["dtype"].to_numpy()
    out = out[~bad].reset_index(drop=True)
    return out


#: an FP8 row stands for a BF16 GEMM only where both kernels' tiles divide the work alike: total and busiest-SM
#: tensor cycles within this relative tolerance
TILING_AGREEMENT = 0.05


def fp8_rows_for_gemm(gemm: pd.DataFrame, fp8: pd.DataFrame, log=print, workers: int = 1) -> pd.DataFrame:
    """Compute-bound FP8 GEMM measurements of GPUs that have no BF16 GEMM measurement, as the BF16 GEMM of equal
    hardware work (``dtype`` fp8): an FP8 GEMM of shape (M, N, K) is a BF16 GEMM of shape (M, N, K/2).

    Both read the same bytes (K one-byte operand elements are K/2 two-byte ones), take the same tensor cycles
    (the FP8 rate is twice the BF16 rate on every GPU here) and write the same BF16 output. The rows keep the
    measured duration and take the BF16 calculator's features, descriptors and ``overall_perf`` for (M, N, K/2)
    on that GPU, so they sit exactly where the GPU's own BF16 queries of that shape do. (Keeping the FP8
    features with the shape (M, N, K) paired the shape with cycle counts and tiles that no BF16 query has, so
    the model met H20's own BF16 GEMMs as an unknown GPU: its BF16 prefill GEMMs were predicted at 0.71-0.90 of
    peak where its rows of the same shapes reach 0.96.)

    Equal work means equal time only where the two kernels also divide it alike, so a row is kept only where
    the FP8 kernel's 128x128x128 tiles (``fp8``, the FP8 calculator's rows) and the BF16 tile rule give total
    and busiest-SM tensor cycles within :data:`TILING_AGREEMENT`. That leaves out decode-sized and narrow
    GEMMs: the FP8 kernel pads M to 128 and runs N/128 CTAs (10 on H20's 78 SMs for N = 1280, 0.12 of its
    roofline), which a BF16 kernel with smaller tiles does not. No rescaling replaces them: on H800, the H100
    chip, FP8 durations below M = 128 scaled by either cycle ratio are 1.7-14x off H100's measured BF16 GEMMs
    of equal work (medians per M range; memory-bound rows there, the only comparison the data allow).

    Only rows whose roofline is compute-bound (``exact_tensor_cycle >= exact_dram_cycle``) are taken: in the
    memory-bound regime PipeWeave's FP8 kernels reach a median 0.20 of spec DRAM bandwidth on H100 where BF16
    GEMMs of the same GPU reach 0.49 (aiconfigurator) and 0.54 (Vidur), so those rows would teach the BF16
    model a bandwidth efficiency that BF16 GEMMs do not have (H20's reach 0.06).

    A GPU whose compute and memory spec (``HARDWARE_SPEC_COLUMNS``) equals that of a GPU with BF16 rows gets
    none: that GPU's measured BF16 GEMMs already describe it (the model sees the same features), and are closer
    to its BF16 GEMMs than converted FP8 rows: H800 runs its FP8 GEMMs a median 1.25x slower than H100 runs
    the BF16 GEMMs of equal work (compute-bound, 1.24-1.45x by M; PipeWeave's FP8 kernels reach less of the
    doubled FP8 peak), so as stand-ins they would contradict H100's rows on the same features.
    """
    # a GPU with BF16 rows, or with the spec of one, is described by them
    bf16_specs = set(map(tuple, gemm[list(HARDWARE_SPEC_COLUMNS)].drop_duplicates().to_numpy().tolist()))
    fp8_specs = map(tuple, fp8[list(HARDWARE_SPEC_COLUMNS)].to_numpy().tolist())
    described = np.array([spec in bf16_specs for spec in fp8_specs], dtype=bool)
    candidates = fp8[~described & (fp8["K"] % 2 == 0) & (fp8["exact_tensor_cycle"] >= fp8["exact_dram_cycle"])]
    if candidates.empty:
        return gemm.iloc[:0]
    halved = candidates.assign(K=candidates["K"] // 2)
    keys = ["hardware", "M", "N", "K", "source"]  # one row per key after average_repeats
    as_bf16 = build_operator("gemm", halved[keys + ["dtype", "avg_duration"]], log=log, workers=workers)
    cycles = ["tensor_all_cycle", "tensor_sm_max_cycle"]
    rows = as_bf16.join(halved.set_index(keys)[cycles].add_prefix("fp8_"), on=keys, how="inner")
    alike = np.logical_and.reduce([np.abs(rows[c] / rows[f"fp8_{c}"] - 1) <= TILING_AGREEMENT for c in cycles])
    _log_drop(log, "gemm", "FP8 row whose tiles divide the work unlike a BF16 kernel's", rows[~alike])
    return rows[alike][list(gemm.columns)].reset_index(drop=True)


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
    parser.add_argument("--ops", type=trainable_operator_list, default=list(TRAINABLE_OPS),
                        help=f"comma list of operator classes (default: {','.join(TRAINABLE_OPS)})")
    parser.add_argument("--output_dir", type=Path, default=DATASET_DIR,
                        help="folder of the <op>_{train,test}.csv files (default: dataset)")
    parser.add_argument("--test_fraction", type=float, default=0.2,
                        help="share of shapes held out for testing (default 0.2)")
    parser.add_argument("--no_collectives", action="store_true", help="skip dataset/collective.csv")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="processes for the attention features (default: 2, or 1 on a one-core machine)")
    args = parser.parse_args(argv)
    ops = args.ops
    if not 0 < args.test_fraction < 1:
        raise UserError("--test_fraction must be between 0 and 1")
    require_shared_data("python3 -m dataset.build")
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
            extra = fp8_rows_for_gemm(frame, operator_frame("gemm_fp8"), workers=args.workers)
            print(f"gemm: + {len(extra)} FP8 rows as BF16 GEMMs of half the K, of GPUs without BF16 data "
                  f"({', '.join(sorted(pd.unique(extra['hardware'])))})")
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
