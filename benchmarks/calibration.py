"""Time to fit a calibration (calibrate.py) on this machine, per kind of measurement.

    python3 -m benchmarks.calibration [--repeats 1] [--workers N] [--keep DIR]

Each case calibrates L40 (a GPU without kernel data) from "measurements" written here: the shipped prediction
of shapes of the profiler's grids times a planted factor. What it times is the work a user waits for: one
end-to-end run (the corrections alone); the profiler's quick GEMM grid (239 kernels: a held-out fifth chooses
between the corrections and two fine-tunings) and its full grid (3,790); 200 attention kernels and 200 fused-MoE
layers (the same choice).
Fine-tuning needs torch; the time of a case is the wall time of :func:`pipeweave.calibration_fit.calibrate`,
inputs read and validated included, models loaded excluded (a first call warms them). ``--workers``: processes
that fine-tune the ensemble members at once, as calibrate.py's flag (default: the same default); the start of the
processes is timed where a case first needs them. ``--keep DIR`` writes each case's calibration file there
(``<case>.json``), e.g. for ``python3 -m benchmarks.aggregator --calibration``.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeweave.calibration_fit import calibrate  # noqa: E402
from pipeweave.cli import positive_int  # noqa: E402
from pipeweave.finetune import default_workers, replay_shapes  # noqa: E402
from pipeweave.predictor import KernelPredictor  # noqa: E402
from pipeweave.profiler.grids import DEFAULT_CONFIGS, build_grid, load_models  # noqa: E402
from pipeweave.paths import DEFAULT_CONFIG_DIR  # noqa: E402

GPU = "L40"
RUN = "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1"


def kernel_csv(directory: Path, op: str, shapes: pd.DataFrame, predictor: KernelPredictor, name: str = "") -> Path:
    """``shapes`` "measured" on GPU: the shipped prediction, 1.3x slower for the larger half of the kernels (written
    to ``<op><name>.csv``)."""
    predicted = predictor.predict_frame(op, shapes.assign(hardware=GPU))["predicted_us"].to_numpy()
    measured = predicted * np.where(predicted > np.median(predicted), 1.3, 1.0)
    path = directory / f"{op}{name}.csv"
    shapes.assign(op=op, hardware=GPU, avg_duration=measured).to_csv(path, index=False)
    return path


def grid_sample(op: str, n: int) -> pd.DataFrame:
    shapes = pd.DataFrame(replay_shapes(op))
    return shapes.iloc[np.random.default_rng(0).choice(len(shapes), n, replace=False)].reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.calibration",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=1)
    parser.add_argument("--workers", type=positive_int, default=default_workers())
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write each case's calibration to DIR/<case>.json")
    args = parser.parse_args()
    predictor = KernelPredictor()
    quiet = lambda message: None  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        e2e = tmp / "e2e.csv"
        e2e.write_text(f"workload,prefill_ms,decode_step_ms,total_ms\n{RUN},8000,50,13000\n")
        models = load_models(DEFAULT_CONFIGS, DEFAULT_CONFIG_DIR)
        quick, full = (pd.DataFrame(build_grid(models, ops=["gemm"], quick=q).rows["gemm"]) for q in (True, False))
        cases = [("e2e_run", "one end-to-end run", e2e, []),
                 ("gemm_quick", "GEMM, the quick grid (239)", None,
                  [kernel_csv(tmp, "gemm", quick, predictor, "_quick")]),
                 ("gemm_full", f"GEMM, the full grid ({len(full):,})", None,
                  [kernel_csv(tmp, "gemm", full, predictor, "_full")]),
                 ("attn_200", "attention, 200 kernels", None,
                  [kernel_csv(tmp, "attn", grid_sample("attn", 200), predictor)]),
                 ("moe_200", "MoE, 200 layers", None, [kernel_csv(tmp, "moe", grid_sample("moe", 200), predictor)])]
        calibrate(GPU, str(e2e), [], log=quiet)  # loads the models
        print(f"| measurements | fine-tuned | seconds ({args.workers} worker{'s' if args.workers > 1 else ''}) |")
        print("|---|---|---|")
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
        for case, name, runs, kernels in cases:
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                calibration = calibrate(GPU, str(runs) if runs else None, [str(k) for k in kernels],
                                        workers=args.workers, log=quiet)
                times.append(time.perf_counter() - started)
            tuned = ", ".join(f"{op} ({entry['recipe']})" for op, entry in calibration.fine_tuned.items()) or "no"
            print(f"| {name} | {tuned} | {min(times):.2f} |")
            if args.keep:
                calibration.save(args.keep / f"{case}.json")


if __name__ == "__main__":
    main()
