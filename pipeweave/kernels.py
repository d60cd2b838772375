"""Per-kernel duration prediction for a CSV of shapes: the logic behind ``predict_kernels.py``.

    python3 predict_kernels.py --op gemm --input shapes.csv --output predicted.csv

The input needs the operator's shape columns (see ``analytical_model.registry``: gemm M,N,K [+ optional
tile_M, tile_N, tile_K, is_split_k, cta_count]; attn attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd with
lists written "[a,b]"; rmsnorm/siluandmul seq,dim; ...) and ``hardware`` (any GPU name the hardware loader
accepts). The output holds every input column unchanged (extra columns pass through, text as read) plus
``predicted_us``: C_ideal / (predicted efficiency × SM clock) (METHOD.md §4.3), from one batched MLP pass.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import OPERATORS, get_operator
from pipeweave.cli import ArgumentParser, UserError, write_atomically
from pipeweave.predictor import DEFAULT_MODEL_DIR, KernelPredictor


def read_shapes(path: str | Path) -> pd.DataFrame:
    """Read a CSV as text (so that pass-through columns are written back exactly as read)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input CSV not found: {path}")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise UserError(f"{path}: empty file (expected a header row)") from None


def predict_shapes(frame: pd.DataFrame, op: str, predictor: KernelPredictor, calibration=None) -> pd.DataFrame:
    """``frame`` plus ``predicted_us``; unknown GPUs and missing columns are errors naming the row/column.

    With a ``calibration`` (pipeweave.calibration), the rows on its GPU are corrected and marked in a
    ``calibration`` column (the file); other rows are unchanged and the column is empty there."""
    operator = get_operator(op)
    missing = [c for c in (*operator.shape_columns, "hardware") if c not in frame.columns]
    if missing:
        raise UserError(f"input lacks column(s) {', '.join(missing)} needed by --op {op} "
                        f"(shape columns: {', '.join(operator.shape_columns)}, plus hardware)")
    registry = hardware_registry(predictor.hardware_dir)
    hardware = frame["hardware"].astype(str).str.strip()
    for name in pd.unique(hardware):
        if name not in registry:
            row = int(np.flatnonzero((hardware == name).to_numpy())[0])
            raise UserError(f"row {row + 1} (CSV line {row + 2}): unknown GPU {name!r}; known GPUs: "
                            f"{', '.join(registry.known())}")
    out = frame.copy()
    if len(frame) == 0:
        out["predicted_us"] = pd.Series(dtype=float)
        return out
    columns = [c for c in (*operator.shape_columns, *operator.optional_columns) if c in frame.columns]
    compute = frame[columns].replace("", np.nan).assign(hardware=hardware.to_numpy())
    try:
        predicted = predictor.predict_frame(op, compute.reset_index(drop=True))
    except ValueError as exc:
        raise UserError(f"--op {op}: {exc.args[0] if exc.args else exc}") from None
    out["predicted_us"] = predicted["predicted_us"].to_numpy()
    if calibration is not None:
        stems = np.array([registry.get(name).stem for name in hardware], dtype=object)
        calibration.check_hardware(stems.tolist())
        rows = np.flatnonzero(stems == calibration.hardware)
        shapes = compute[list(operator.shape_columns)].to_numpy()[rows]
        features = predicted[list(operator.feature_names)].to_numpy()[rows]
        corrected = np.array(out["predicted_us"], dtype=np.float64)
        corrected[rows] = calibration.apply(op, registry.get(calibration.hardware), corrected[rows], features, shapes)
        out["predicted_us"] = corrected
        out["calibration"] = np.where(stems == calibration.hardware, str(calibration.path), "")
    return out


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="predict_kernels.py",
        description="Predict kernel durations (µs) for a CSV of operator shapes with the trained MLPs.",
    )
    parser.add_argument("--op", required=True, choices=list(OPERATORS), help="operator class")
    parser.add_argument("--input", required=True, help="CSV with the operator's shape columns and 'hardware'")
    parser.add_argument("--output", required=True, help="output CSV: the input columns plus predicted_us")
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR), help="root of the trained MLPs")
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR), help="directory of GPU spec JSONs")
    parser.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    parser.add_argument("--calibration", default=None, metavar="JSON",
                        help="a calibration written by calibrate.py: corrects the rows of its GPU (column "
                             "'calibration' names the file); refused if no row is on that GPU")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    frame = read_shapes(args.input)
    calibration = None
    if args.calibration:
        from pipeweave.calibration import load_calibration

        calibration = load_calibration(args.calibration)
    predictor = KernelPredictor(args.model_dir, args.device, args.hardware_dir)
    out = predict_shapes(frame, args.op, predictor, calibration)
    write_atomically(args.output, lambda tmp: out.to_csv(tmp, index=False))
    print(f"Predicted {len(out)} {args.op} kernels -> {args.output}")
    return 0
