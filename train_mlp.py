"""Train one operator's efficiency MLP (docs/METHOD.md §5.1–5.2).

    python3 train_mlp.py --op gemm                      # pipeweave recipe, all GPUs, shape-held-out test
    python3 train_mlp.py --op attn --holdout_hardware H100   # leave-one-GPU-out evaluation
    python3 train_mlp.py --op gemm --recipe reference   # the artifact's recipe (sigmoid MLP, MAPE on efficiency)
    python3 train_mlp.py --op gemm --ensemble_seeds 42,1,2,3,4   # the shipped GEMM model: a 5-seed ensemble

Writes mlp_models/<op>/<YYYYMMDD_HHMMSS>/ (with --holdout_hardware: runs/<op>/<YYYYMMDD_HHMMSS>/, so that an
evaluation model never becomes the one the predictor loads; --output_dir mlp_models promotes it explicitly) with <op>_mlp_model.pth, metadata.json and
worst_cases_top100.csv. Needs dataset/<op>_{train,test}.csv (python3 -m dataset.build).
"""
from __future__ import annotations

import sys

from analytical_model.registry import operator_keys
from pipeweave.cli import ArgumentParser, check_device, positive_int, run_cli, seed_list
from pipeweave.ensemble import train_ensemble, write_member_spread
from pipeweave.modeling import (add_training_arguments, dataset_paths, load_splits, removed_on_failure, saved_note,
                                timestamp_dir, train_and_evaluate, worst_cases, write_model_dir)
from pipeweave.paths import DEFAULT_MODEL_DIR, DEFAULT_RUNS_DIR
from pipeweave.training import RECIPES, TrainConfig


def main(argv=None) -> int:
    parser = ArgumentParser(prog="train_mlp.py", description="Train a per-operator efficiency MLP.")
    parser.add_argument("--op", required=True, choices=operator_keys(trainable=True),
                        help="operator class to train (python3 -m analytical_model list describes each)")
    parser.add_argument("--recipe", choices=[r for r in RECIPES if r != "quantile"], default="pipeweave",
                        help="pipeweave (default): log-efficiency MLP_v2 with shape descriptors; reference: the "
                             "artifact's sigmoid MLP and MAPE loss")
    add_training_arguments(parser, output_dir=None,
                           output_help="default: mlp_models, the folder the predictor loads; with --holdout_hardware "
                                       "runs/, so an evaluation model never replaces a shipped one",
                           epochs_default=None, epochs_help="maximum epochs (default: 300 pipeweave, 2500 reference)",
                           rows_help="train on at most this many rows per GPU, drawn with --seed (default 20000; "
                                     "0: all rows)")
    parser.add_argument("--patience", type=positive_int,
                        help="early-stopping patience in epochs (default: 25 pipeweave, 85 reference)")
    parser.add_argument("--holdout_hardware", action="append", default=[], metavar="GPU",
                        help="leave this GPU out of training and test on all its rows (repeatable; default: none)")
    parser.add_argument("--ensemble_seeds", type=seed_list, metavar="S1,S2,...",
                        help="train one member per seed and predict with their median log-efficiency (an ensemble, "
                             "pipeweave/ensemble.py; --seed is then ignored; default: one model, --seed)")
    args = parser.parse_args(argv)
    check_device(args.device)
    if args.output_dir is None:
        args.output_dir = DEFAULT_RUNS_DIR if args.holdout_hardware else DEFAULT_MODEL_DIR

    config = TrainConfig(recipe=args.recipe, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                         patience=args.patience, seed=args.seed, device=args.device, threads=args.threads,
                         max_rows_per_gpu=args.max_rows_per_gpu or None, progress=not args.no_progress)
    train, test = load_splits(args.op, args.dataset_dir, args.holdout_hardware)
    out_dir = timestamp_dir(args.output_dir, args.op)
    train_path, test_path = dataset_paths(args.op, args.dataset_dir)
    paths = {"train_path": str(train_path), "test_path": str(test_path), "holdout_hardware": args.holdout_hardware}
    with removed_on_failure(out_dir):
        if args.ensemble_seeds:
            predicted, evaluation = train_ensemble(args.op, train, test, config, args.ensemble_seeds, out_dir, paths)
            if args.holdout_hardware:  # its test split is the held-out GPU: the others' held-out shapes set the
                write_member_spread(out_dir, args.op, args.dataset_dir)  # spread the members flag is read against
            print(f"{args.op}: ensemble of {len(args.ensemble_seeds)} members (seeds {args.ensemble_seeds})")
        else:
            model, history, predicted, evaluation = train_and_evaluate(args.op, train, test, config)
            write_model_dir(out_dir, args.op, model, history, config, train, test, evaluation, paths)
            print(f"{args.op}: best epoch {history['best_epoch'] + 1} of {history['epochs_run']}, "
                  f"{history['train_seconds']} s")
    worst_cases(test, predicted).to_csv(out_dir / "worst_cases_top100.csv", index=False)
    overall = evaluation["overall"]
    print(f"test duration error: mean {overall['duration_mean_abs_pct_error']:.2f} %, "
          f"median {overall['duration_median_abs_pct_error']:.2f} %")
    for hw, metrics in evaluation["by_hardware"].items():
        print(f"  {hw}: mean {metrics['duration_mean_abs_pct_error']:.2f} %, median "
              f"{metrics['duration_median_abs_pct_error']:.2f} % (n={metrics['test_samples']})")
    print(saved_note(out_dir, args.op))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
