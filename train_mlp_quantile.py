"""Train the upper-bound (80th-percentile) efficiency model and flag under-performing kernels (docs/METHOD.md §5.4).

    python3 train_mlp_quantile.py --op gemm [--quantile 0.8] [--threshold 0.0] [--topk 100]

Trains the sigmoid MLP with the pinball loss on the training file, at most --max_rows_per_gpu rows per GPU
(default 20,000; no validation; the epoch with the lowest training loss is kept), then applies it to the
training rows: a kernel whose measured efficiency is below the predicted achievable one by more than ``--threshold`` is under-performing.
Writes mlp_models_quantile/<op>/<timestamp>/ with the checkpoint, metadata.json and kernel_reports/
(topk_underperforming_<GPU>.csv per GPU and summary.csv). The aggregator's --quantiles uses these
models for an optimistic latency.
"""
from __future__ import annotations

import sys

import numpy as np

from analytical_model.registry import operator_keys
from pipeweave.cli import ArgumentParser, UserError, check_device, finite_float, positive_int, run_cli
from pipeweave.modeling import (add_training_arguments, cap_rows_per_gpu, dataset_paths, kernel_reports,
                                network_inputs, read_dataset, removed_on_failure, saved_note, timestamp_dir,
                                write_model_dir)
from pipeweave.paths import DEFAULT_QUANTILE_DIR
from pipeweave.torch_mlp import predict_efficiency
from pipeweave.training import TrainConfig, fit

QUANTILE_OPS = operator_keys(quantile=True)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="train_mlp_quantile.py",
                            description="Train an upper-bound (quantile) efficiency MLP and write kernel reports.")
    parser.add_argument("--op", required=True, choices=QUANTILE_OPS, help="operator class to train")
    parser.add_argument("--quantile", type=float, default=0.8,
                        help="quantile of the efficiency the model predicts, between 0 and 1 (default 0.8)")
    parser.add_argument("--threshold", type=finite_float, default=0.0,
                        help="perf_diff (measured minus bound) below this flags a kernel in the reports (default 0)")
    parser.add_argument("--topk", type=positive_int, help="rows per GPU in the reports (default: all)")
    add_training_arguments(parser, output_dir=DEFAULT_QUANTILE_DIR,
                           output_help="default: mlp_models_quantile, the folder aggregator.py --quantiles loads",
                           epochs_default=200, epochs_help="training epochs (default 200)",
                           rows_help="fit on at most this many rows per GPU, drawn with --seed (default 20000; 0: "
                                     "all); reports cover all rows")
    args = parser.parse_args(argv)
    check_device(args.device)
    if not 0 < args.quantile < 1:
        raise UserError("--quantile must be between 0 and 1")

    train_path, _ = dataset_paths(args.op, args.dataset_dir)
    train = read_dataset(train_path)
    config = TrainConfig(recipe="quantile", quantile=args.quantile, epochs=args.epochs, batch_size=args.batch_size,
                         lr=args.lr, seed=args.seed, device=args.device, threads=args.threads,
                         max_rows_per_gpu=args.max_rows_per_gpu or None, progress=not args.no_progress)
    fitted = cap_rows_per_gpu(train, args.max_rows_per_gpu or None, args.seed)
    out_dir = timestamp_dir(args.output_dir, args.op)  # before the minutes of training: a bad --output_dir fails now
    with removed_on_failure(out_dir):
        model, history = fit(network_inputs(fitted, args.op, config), fitted["overall_perf"].to_numpy(), config)
        predicted = predict_efficiency(model, network_inputs(train, args.op, config))
        files = kernel_reports(args.op, train, predicted, args.threshold, args.topk, out_dir / "kernel_reports")
        below = float(np.mean(train["overall_perf"].to_numpy() < predicted) * 100)
        paths = {"train_path": str(train_path),
                 "validation": "none: fitted on the train file (at most --max_rows_per_gpu rows per GPU), best "
                               "training loss kept"}
        reports = {"report_directory": "kernel_reports",
                   "description": "kernels whose measured efficiency is below the predicted upper bound",
                   "threshold": args.threshold, "topk_per_hardware": args.topk,
                   "note": f"{below:.1f} % of training kernels lie below the predicted q={args.quantile} efficiency",
                   "files": files}
        write_model_dir(out_dir, args.op, model, history, config, train, None, None, paths,
                        extra={"kernel_reports": reports})
    print(f"{args.op}: best training loss {history['best_train_loss']:.5f} at epoch {history['best_epoch'] + 1}; "
          f"{below:.1f} % of kernels below the predicted upper bound (target {args.quantile * 100:.0f} %)")
    print(saved_note(out_dir, args.op, flag="--quantile_dir"))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
