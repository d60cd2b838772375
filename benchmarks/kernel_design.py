"""Time to choose which kernels to measure (profile_operators.py --kernels K) on this machine, per operator.

    python3 -m benchmarks.kernel_design [--repeats 3] [--hardware L40]

Each case cuts one kernel operator's full profiler grid (the default configs and TP sizes, the trace batches of
workload/traces in attention's) to the K shapes :mod:`pipeweave.kernel_design` chooses for the GPU: its features,
the prior covariance of every candidate's log error and the greedy choice. The time is the best of ``--repeats``
calls of :func:`pipeweave.profiler.grids.informative_grid` (the prior read from its file each time, as a run does).
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from analytical_model.hardware import hardware_registry  # noqa: E402
from pipeweave.cli import positive_int  # noqa: E402
from pipeweave.paths import DEFAULT_CONFIG_DIR, DEFAULT_TRACE_DIR  # noqa: E402
from pipeweave.profiler.grids import (DEFAULT_CONFIGS, Grid, build_grid, informative_grid, load_models,  # noqa: E402
                                      load_trace_prompts)

OPS = ("gemm", "gemm_fp8", "attn", "rmsnorm", "siluandmul")
KERNELS = (32, 240)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.kernel_design", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--hardware", default="L40")
    args = parser.parse_args()
    spec = hardware_registry().get(args.hardware)
    full = build_grid(load_models(DEFAULT_CONFIGS, DEFAULT_CONFIG_DIR), ops=OPS,
                      traces=load_trace_prompts(DEFAULT_TRACE_DIR))
    print(f"{'operator':<11} {'grid':>6} " + " ".join(f"{f'K={k} (s)':>10}" for k in KERNELS))
    for op in OPS:
        grid = Grid(rows={op: full.rows[op]}, notes=[])
        times = []
        for k in KERNELS:
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                informative_grid(grid, spec, k)
                best = min(best, time.perf_counter() - start)
            times.append(best)
        print(f"{op:<11} {len(full.rows[op]):>6} " + " ".join(f"{t:>10.2f}" for t in times))


if __name__ == "__main__":
    main()
