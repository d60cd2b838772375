"""Train the per-GPU collective-communication time models (docs/METHOD.md §5.5, with the fixes of pipeweave/collectives.py).

    python3 train_collective_rf.py                         # all GPUs with data -> collective_models/<GPU>/
    python3 train_collective_rf.py --hardware H100 --hardware A100
    python3 train_collective_rf.py --regressor rf --n_estimators 30 --max_depth 12   # small log-log random forest
    python3 train_collective_rf.py --reference_forest      # the artifact's exact RF -> collective_models_reference/

Reads PipeWeave / aiconfigurator / Vidur collective measurements through dataset.sources.load_collectives
(PIPEWEAVE_SHARED_DATA names the shared measurement folder, docs/DATA.md). Writes <kind>_model.json (a
forest: <kind>_model.joblib) and metadata.json per GPU and
prints the held-out error of the trained regressor next to the other regressors (every 5th size held out).
Deterministic: fixed random_state (--seed), no timestamps in the outputs.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analytical_model.hardware import load_hardware
from pipeweave.cli import ArgumentParser, UserError, nonnegative_int, run_cli
from pipeweave.paths import REPO_ROOT
from pipeweave.collective_training import MAX_MODEL_BYTES, format_table, train_collectives



def main(argv=None) -> int:
    parser = ArgumentParser(description="Train per-GPU all-reduce / send-recv time models.")
    parser.add_argument("--hardware", action="append", default=[], metavar="GPU",
                        help="GPU to train (any hardware name, stem or alias; repeatable; default: all with data)")
    parser.add_argument("--output_dir", type=Path, default=None,
                        help="root of the per-GPU folders (default: collective_models, or "
                             "collective_models_reference with --reference_forest)")
    parser.add_argument("--regressor", choices=["interp", "rf"], default=None,
                        help="interp: log-log piecewise-linear interpolation per worker count (default); "
                             "rf: small random forest on [log2 size, num_workers] -> log time "
                             "(implied by --n_estimators / --max_depth)")
    parser.add_argument("--n_estimators", type=int, help="trees of the rf regressor (default 30)")
    parser.add_argument("--max_depth", type=int, help="depth of the rf regressor (default 12)")
    parser.add_argument("--reference_forest", action="store_true",
                        help="train the artifact's exact RF ([size, num_workers] -> ms, 100 trees, depth 20, "
                             "min split 5, min leaf 2) for comparison, into collective_models_reference/ (not "
                             "committed: H20's files alone take 9.4 MB)")
    parser.add_argument("--seed", type=nonnegative_int, default=42, help="random_state of the forests (default 42)")
    parser.add_argument("--no_compare", action="store_true", help="skip the held-out errors of the other regressors")
    parser.add_argument("--n_jobs", type=int, default=1, help="cores for the forests (default 1)")
    args = parser.parse_args(argv)

    forest_flags = args.n_estimators is not None or args.max_depth is not None
    if args.reference_forest:
        if args.regressor or forest_flags:
            raise UserError("--reference_forest trains the artifact's fixed configuration; "
                            "drop --regressor / --n_estimators / --max_depth")
        regressor = "reference_rf"
    elif args.regressor == "interp" and forest_flags:
        raise UserError("--n_estimators / --max_depth apply to --regressor rf only")
    else:
        regressor = args.regressor or ("rf" if forest_flags else "interp")
    for flag in ("n_estimators", "max_depth", "n_jobs"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UserError(f"--{flag} must be >= 1, got {value}")
    output_dir = args.output_dir or REPO_ROOT / ("collective_models_reference" if args.reference_forest
                                           else "collective_models")
    for name in args.hardware:
        load_hardware(name)  # an unknown GPU is reported before any data is read

    rows = train_collectives(hardware=args.hardware, output_dir=output_dir, regressor=regressor, seed=args.seed,
                             n_estimators=args.n_estimators, max_depth=args.max_depth, compare=not args.no_compare,
                             n_jobs=args.n_jobs)
    print(f"\nheld-out error (every 5th size), regressor '{regressor}' = column 'model':")
    print(format_table(rows))
    big = [r for r in rows if r["file_bytes"] > MAX_MODEL_BYTES]
    if big:
        print(f"warning: {len(big)} model files exceed 2 MiB (not for committing)")
    print(f"saved {len(rows)} models under {output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
