"""Train the upper-bound (80th-percentile) efficiency model and flag under-performing kernels (METHOD.md §5.4).

    python3 train_mlp_quantile.py --op gemm [--quantile 0.8] [--threshold 0.0] [--topk 100]

Trains the sigmoid MLP with the pinball loss on the whole training file (no validation; the epoch with
the lowest training loss is kept), then applies it to the training rows: a kernel whose measured
efficiency is below the predicted achievable one by more than ``--threshold`` is under-performing.
Writes mlp_models_quantile/<op>/<timestamp>/ with the checkpoint, metadata.json and kernel_reports/
(topk_underperforming_<GPU>.csv per GPU and summary.csv). The aggregator's --quantiles uses these
models for an optimistic latency.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.registry import get_operator, operator_keys
from pipeweave.cli import ArgumentParser, UserError, run_cli
from pipeweave.mlp import model_inputs
from pipeweave.modeling import (DATASET_DIR, cap_rows_per_gpu, dataset_paths, feature_matrix, read_dataset,
                                timestamp_dir, write_model_dir)
from pipeweave.torch_mlp import predict_efficiency
from pipeweave.training import TrainConfig, fit

QUANTILE_OPS = operator_keys(quantile=True)


def kernel_reports(op: str, train: pd.DataFrame, predicted: np.ndarray, threshold: float, topk: int | None, out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = train.copy()
    frame["pred_perf"] = np.maximum(predicted, 1e-9)
    frame["perf_diff"] = frame["overall_perf"] - frame["pred_perf"]
    frame["rel_gap"] = frame["perf_diff"] / (frame["pred_perf"] + 1e-9)
    columns = list(get_operator(op).shape_columns) + ["avg_duration", "overall_perf", "pred_perf", "perf_diff", "rel_gap"]
    files, summary = [], []
    for hw, rows in frame.groupby("hardware", sort=True):
        under = rows[rows["perf_diff"] < threshold].sort_values("perf_diff", kind="stable")
        top = under if topk is None else under.head(topk)
        name = f"topk_underperforming_{hw}.csv"
        top[columns].to_csv(out_dir / name, index=False)
        files.append(name)
        summary.append({
            "hardware": hw, "total_underperforming": len(under),
            "avg_perf_diff": under["perf_diff"].mean() if len(under) else 0.0,
            "min_perf_diff": under["perf_diff"].min() if len(under) else 0.0,
            "avg_rel_gap": under["rel_gap"].mean() if len(under) else 0.0,
            "min_rel_gap": under["rel_gap"].min() if len(under) else 0.0,
            "topk_count": len(top),
        })
    pd.DataFrame(summary).to_csv(out_dir / "summary.csv", index=False)
    return files + ["summary.csv"]


def main(argv=None) -> int:
    parser = ArgumentParser(description="Train an upper-bound (quantile) efficiency MLP and write kernel reports.")
    parser.add_argument("--op", required=True, choices=QUANTILE_OPS)
    parser.add_argument("--quantile", type=float, default=0.8)
    parser.add_argument("--threshold", type=float, default=0.0, help="perf_diff below this flags a kernel")
    parser.add_argument("--topk", type=int, help="rows per GPU in the reports (default: all)")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR)
    parser.add_argument("--output_dir", type=Path, default=Path("mlp_models_quantile"))
    parser.add_argument("--max_rows_per_gpu", type=int, default=20000,
                        help="fit on at most this many rows per GPU, drawn with --seed (0: all); reports cover all rows")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch CPU threads")
    parser.add_argument("--no_progress", action="store_true")
    args = parser.parse_args(argv)
    if not 0 < args.quantile < 1:
        raise UserError("--quantile must be between 0 and 1")

    train_path, _ = dataset_paths(args.op, args.dataset_dir)
    train = read_dataset(train_path)
    config = TrainConfig(recipe="quantile", quantile=args.quantile, epochs=args.epochs, batch_size=args.batch_size,
                         lr=args.lr, seed=args.seed, device=args.device, threads=args.threads,
                         progress=not args.no_progress)
    fitted = cap_rows_per_gpu(train, args.max_rows_per_gpu or None, args.seed)
    model, history = fit(model_inputs(feature_matrix(fitted, args.op, config)), fitted["overall_perf"].to_numpy(), config)
    predicted = predict_efficiency(model, model_inputs(feature_matrix(train, args.op, config)))
    out_dir = timestamp_dir(args.output_dir, args.op)
    files = kernel_reports(args.op, train, predicted, args.threshold, args.topk, out_dir / "kernel_reports")
    below = float(np.mean(train["overall_perf"].to_numpy() < predicted) * 100)
    write_model_dir(out_dir, args.op, model, history, config, train, None, None,
                    {"train_path": str(train_path), "validation": "none: fitted on the train file (at most --max_rows_per_gpu rows per GPU), best training loss kept"},
                    extra={"kernel_reports": {
                        "report_directory": "kernel_reports",
                        "description": "kernels whose measured efficiency is below the predicted upper bound",
                        "threshold": args.threshold, "topk_per_hardware": args.topk,
                        "note": f"{below:.1f} % of training kernels lie below the predicted q={args.quantile} efficiency",
                        "files": files}})
    print(f"{args.op}: best training loss {history['best_train_loss']:.5f} at epoch {history['best_epoch']}; "
          f"{below:.1f} % of kernels below the predicted upper bound (target {args.quantile * 100:.0f} %)")
    print(f"saved {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
