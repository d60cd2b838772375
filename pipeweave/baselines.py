"""Baselines beside pipeweave's end-to-end predictions: the shape roofline and the artifact's published predictions.

* **Shape roofline (this project)**, computed here on the same workload files: every kernel takes
  max(FLOPs / peak BF16 tensor FLOP/s, bytes / peak DRAM bandwidth) with the hardware JSON peaks
  (``tcBf16 × numSms × smFreq``; ``memBandwidth`` in GB/s = 10⁹ B/s) and this project's FLOP/byte counts (below);
  communication takes exactly the durations of the PipeWeave prediction it is compared beside (same collective
  models), so the two differ only in the kernel model. Counts (BF16, 2 bytes per element):
  GEMM 2MNK FLOPs, 2(MK + KN + MN) bytes; attention 4·hd·nh·Σ causal (query, key) pairs FLOPs
  (pairs = q(kv − q) + q(q + 1)/2 per request), bytes 2·hd·(2·nh·Σq + 2·nkv·Σkv) (Q read, O written, K, V
  read);
  RMSNorm 4·seq·dim FLOPs (non-tensor, ignored by the tensor roof) and 2·(2·seq·dim + dim) bytes; SiLU*Mul on input
  width dim: 2·(seq·dim + seq·dim/2) bytes.
* **Artifact predictions** (source A, ``e2e/<method>_comparison.csv``, the shared copies in
  ``$PIPEWEAVE_SHARED_DATA/pipeweave/e2e/baselines/``, read in place): only their prediction columns are used and
  their errors are recomputed against the same medians; our outputs keep those errors, not the artifact's
  prediction values. The artifact's roofline files carry no decode prediction
  (its decode column is 0, a schema mismatch, docs/METHOD.md §8.1), so that column is left empty.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from pipeweave.cli import UserError
from pipeweave.measured_runs import gpu_stem
from pipeweave.paths import shared_data_dir

ARTIFACT_METHODS = ("pipeweave", "roofline", "neusight", "habitat", "linear")


def artifact_baselines_dir() -> Path:
    return shared_data_dir() / "pipeweave" / "e2e" / "baselines"



def shape_roofline_kernel_ms(op: str, shapes: list[tuple], hw) -> np.ndarray:
    """Shape-roofline duration (ms) of unique kernel shapes of one registry operator class on one GPU: the FLOP
    and byte counts of the shape at the spec peaks (not the analytical features: that is the *feature roofline*
    of :meth:`analytical_model.registry.OperatorClass.feature_roofline_cycles` in the kernel accuracy report)."""
    peak_flops = float(hw.tc_bf16) * hw.num_sms * hw.sm_freq * 1e6
    bandwidth = float(hw.mem_bandwidth) * 1e9
    if not shapes:
        return np.zeros(0)
    if op == "gemm":
        m, n, k = (np.array([s[i] for s in shapes], dtype=np.float64) for i in range(3))
        flops = 2.0 * m * n * k
        nbytes = 2.0 * (m * k + k * n + m * n)
    elif op == "attn":
        flops = np.empty(len(shapes))
        nbytes = np.empty(len(shapes))
        for i, (_, _, q, kv, nh, nkv, hd) in enumerate(shapes):
            pairs = sum(a * (b - a) + a * (a + 1) // 2 for a, b in zip(q, kv))
            flops[i] = 4.0 * hd * nh * pairs
            nbytes[i] = 2.0 * hd * (2.0 * nh * sum(q) + 2.0 * nkv * sum(kv))
    elif op == "rmsnorm":
        seq, dim = (np.array([s[i] for s in shapes], dtype=np.float64) for i in range(2))
        flops = np.zeros(len(shapes))  # non-tensor work: below the tensor roof's reach, memory-bound anyway
        nbytes = 2.0 * (2.0 * seq * dim + dim)
    elif op == "siluandmul":
        seq, dim = (np.array([s[i] for s in shapes], dtype=np.float64) for i in range(2))
        flops = np.zeros(len(shapes))
        nbytes = 2.0 * (seq * dim + seq * dim / 2.0)
    else:
        raise ValueError(f"no roofline for operator class {op!r}")
    return np.maximum(flops / peak_flops, nbytes / bandwidth) * 1000.0


def shape_roofline_prediction(workload_path: str | Path, hardware: str, prediction: dict | None = None,
                        hardware_dir: Path = DEFAULT_HARDWARE_DIR, own_collectives: bool = False) -> dict:
    """The aggregator's output object with roofline kernel durations.

    Communication durations are copied from ``prediction`` (a PipeWeave aggregator output for the same workload
    and GPU), so that both use the same collective models. Without a prediction, ``own_collectives`` predicts
    them as the batch scripts do (the GPU's own collective models, the analytical estimate where none covers a
    collective); otherwise a workload with communication is an error.
    """
    from pipeweave.engine import Job
    from pipeweave.flatten import CATEGORY_CODE, COMMUNICATION_CODE, KERNEL_CATEGORIES, load_workload
    from pipeweave.report import build_result

    workload = load_workload(workload_path)
    hw = hardware_registry(Path(hardware_dir)).get(hardware)
    single = np.zeros(len(workload.inst_code))
    for category, op in KERNEL_CATEGORIES.items():
        rows = np.flatnonzero(workload.inst_code == CATEGORY_CODE[category])
        if rows.size:
            unique = shape_roofline_kernel_ms(op, workload.shapes[op], hw)
            single[rows] = unique[workload.inst_local[rows]]
    comm = np.flatnonzero(workload.inst_code == COMMUNICATION_CODE)
    if comm.size and prediction is None:
        if not own_collectives:
            raise UserError(f"{workload.stem}: roofline needs the PipeWeave prediction's communication durations")
        from pipeweave.engine import Engine

        engine = Engine(hardware_dir=hardware_dir, collective_estimate="analytical", log=None)
        job = Job(workload, hw)
        ms, _ = engine.collective_durations(job, engine.collective_predictor(job))
        single[comm] = ms[workload.inst_local[comm]]
    elif comm.size:
        iterations = prediction["iterations"]
        if len(iterations) != len(workload.numbers):
            raise UserError(f"{workload.stem}: the prediction has {len(iterations)} iterations, the workload "
                            f"{len(workload.numbers)}")
        for position, entries in enumerate(workload.layout):
            durations = iterations[position]["operator_durations"].get("communication", {})
            for category, name, i in entries:
                if category == "communication":
                    if name not in durations:
                        raise UserError(f"{workload.stem}: iteration {position + 1}: the prediction lacks "
                                        f"communication {name!r}")
                    single[i] = float(durations[name]["single_duration_ms"])
    return build_result(Job(workload, hw), single)


def read_artifact_baselines(baselines_dir: Path | None, hardware_dir: Path = DEFAULT_HARDWARE_DIR
                            ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(static predictions, vLLM predictions, notes) from the artifact's *_comparison.csv (prediction columns only)."""
    notes = []
    static_rows, vllm_rows = [], []
    if baselines_dir is None or not Path(baselines_dir).is_dir():
        notes.append(f"artifact baseline predictions not found ({baselines_dir}); those columns are omitted")
        return pd.DataFrame(), pd.DataFrame(), notes
    baselines_dir = Path(baselines_dir)
    for method in ARTIFACT_METHODS:
        path = baselines_dir / f"{method}_comparison.csv"
        if not path.is_file():
            notes.append(f"{path.name} absent: no artifact {method} column")
            continue
        frame = pd.read_csv(path)
        for _, row in frame.iterrows():
            static_rows.append({
                "method": method, "gpu": gpu_stem(str(row["Hardware"]), hardware_dir), "tp": int(row["TP"]),
                "pp": int(row["PP"]), "model": row["Model"], "trace": row["Workload"],
                "pred_prefill_ms": float(row["pred_prefill_ms"]),
                # the artifact's roofline files have no decode prediction (read as 0: docs/METHOD.md §8.1)
                "pred_decode_ms": np.nan if method == "roofline" else float(row["pred_decode_ms"]),
                "pred_total_ms": float(row["pred_total_ms"]),
            })
    path = baselines_dir / "vllm_comparison.csv"
    if path.is_file():
        for _, row in pd.read_csv(path).iterrows():
            vllm_rows.append({"method": row["Method"], "gpu": gpu_stem(str(row["Hardware"]), hardware_dir),
                              "model": row["Model"], "trace": f"vllm_{row['Workload']}",
                              "pred_total_ms": float(row["pred_e2e_ms"])})
    else:
        notes.append("vllm_comparison.csv absent: no artifact vLLM columns")
    return pd.DataFrame(static_rows), pd.DataFrame(vllm_rows), notes
