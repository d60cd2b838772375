"""Physical bounds on a predicted kernel efficiency (docs/METHOD.md §4.3): the predictor keeps every MLP output
inside the band ``[low, high]`` of ``overall_perf`` below, whatever the GPU or shape.

Duration is ``t = C_ideal / (eff × f)`` (``C_ideal``: the registry's ideal-cycle features, ``f``: SM clock in MHz).

* **Ceiling (a kernel never beats its roofline).** ``C_ideal`` is the compute work at the spec peak of the
  operator's compute pipe, so ``eff ≤ 1``. For operators whose DRAM-cycle feature counts every byte exactly once
  (:attr:`OperatorClass.dram_bound`: RMSNorm, SiLU*Mul; no measured row in any dataset beats it) the DRAM time at
  the spec bandwidth binds too: ``t ≥ max(C_ideal, C_dram) / f``, i.e. ``eff ≤ C_ideal / max(C_ideal, C_dram)``.
  For GEMM, attention and MoE the DRAM feature assumes tile re-reads that the L2 cache absorbs (1–46 % of their
  measured rows beat it), so only the compute ceiling applies.
* **Floor (a well-formed kernel is not arbitrarily slow).** ``t ≤ R / floor + L`` with ``R`` the roofline time
  above, ``L`` = :data:`LAUNCH_LATENCY_US` and ``floor`` = :data:`EFFICIENCY_FLOOR` per operator: the
  :data:`FLOOR_PERCENTILE`-th percentile of ``R / (t − L)`` over every measured row of every GPU in
  ``dataset/<op>_{train,test}.csv`` (``python3 -m pipeweave.bounds`` recomputes them; a data test checks the
  constants against the datasets). So at most 0.1 % of measured kernels are slower than the floor allows.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from analytical_model.registry import DRAM_CYCLE_FEATURE, get_operator, operator_keys

#: fixed cost of any kernel in µs (launch, CTA dispatch, prologue and tail): the smallest measured kernels of
#: the datasets take 1–7 µs, so a kernel's time above its roofline share is at most this much "free" latency
LAUNCH_LATENCY_US = 5.0
#: percentile (in %) of the measured roofline efficiency R / (t − L) that defines the floor
FLOOR_PERCENTILE = 0.1
#: per trained operator (an operator predicted by another's model, e.g. quantize by rmsnorm, takes that one's):
#: the FLOOR_PERCENTILE-th percentile of R / (t − L) over all measured rows of all GPUs (4 significant digits)
EFFICIENCY_FLOOR = {
    "gemm": 0.001987,
    "gemm_fp8": 0.001003,
    "attn": 0.0002755,
    "rmsnorm": 0.004552,
    "siluandmul": 0.006332,
    "moe": 0.002284,
}


def efficiency_floor(op: str) -> float:
    """The operator's floor (that of the model predicting it); an operator without measurements (a newly
    registered one) gets the loosest measured floor."""
    return EFFICIENCY_FLOOR.get(get_operator(op).model_op, min(EFFICIENCY_FLOOR.values()))


def roofline_cycles(op: str, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(C_ideal, roofline cycles R·f) of float64 feature rows (columns in the registry's feature order)."""
    operator = get_operator(op)
    ideal = operator.ideal_cycles(np.asarray(features, dtype=np.float32)).astype(np.float64)
    if not operator.dram_bound:
        return ideal, ideal
    dram = np.asarray(features, dtype=np.float64)[:, operator.feature_names.index(DRAM_CYCLE_FEATURE)]
    return ideal, np.maximum(ideal, dram)


def efficiency_band(op: str, features: np.ndarray, sm_freq_mhz) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) efficiency per feature row on GPUs clocked at ``sm_freq_mhz`` (scalar or per row)."""
    ideal, roof = roofline_cycles(op, features)
    safe = np.maximum(roof, np.finfo(np.float64).tiny)
    high = ideal / safe
    slowest_cycles = roof / efficiency_floor(op) + LAUNCH_LATENCY_US * np.asarray(sm_freq_mhz, dtype=np.float64)
    return np.minimum(ideal / slowest_cycles, high), high


def clip_efficiency(op: str, efficiency: np.ndarray, features: np.ndarray, sm_freq_mhz
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(efficiency kept inside the band, side): side is -1 where the floor bound, +1 the ceiling, 0 neither."""
    low, high = efficiency_band(op, features, sm_freq_mhz)
    efficiency = np.asarray(efficiency, dtype=np.float64)
    side = np.where(efficiency < low, -1, np.where(efficiency > high, 1, 0)).astype(np.int8)
    return np.clip(efficiency, low, high), side


def measured_floor(op: str, frame) -> float:
    """The FLOOR_PERCENTILE-th percentile of R / (t − L) over the measured rows of ``frame`` (a dataset frame)."""
    operator = get_operator(op)
    _, roof = roofline_cycles(op, frame[list(operator.feature_names)].to_numpy(np.float64))
    measured = frame["avg_duration"].to_numpy(np.float64)
    slow = measured > LAUNCH_LATENCY_US  # faster kernels are inside the band for any floor
    roof_us = roof[slow] / frame["sm_freq"].to_numpy(np.float64)[slow]
    return float(np.percentile(roof_us / (measured[slow] - LAUNCH_LATENCY_US), FLOOR_PERCENTILE))


def main(argv=None) -> int:
    """Print the efficiency floors measured on the datasets (the source of EFFICIENCY_FLOOR)."""
    import pandas as pd

    from pipeweave.cli import ArgumentParser
    from pipeweave.modeling import dataset_paths, read_dataset
    from pipeweave.paths import DATASET_DIR

    parser = ArgumentParser(prog="python3 -m pipeweave.bounds", description=main.__doc__)
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR)
    args = parser.parse_args(argv)
    for op in operator_keys(trainable=True):
        frame = pd.concat([read_dataset(path) for path in dataset_paths(op, args.dataset_dir)], ignore_index=True)
        print(f"{op}: floor {measured_floor(op, frame):.4g} (shipped {EFFICIENCY_FLOOR[op]}; {len(frame)} rows, "
              f"{frame['hardware'].nunique()} GPUs)")
    return 0


if __name__ == "__main__":
    from pipeweave.cli import run_cli

    sys.exit(run_cli(main))
