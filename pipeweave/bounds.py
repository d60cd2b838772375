"""Physical bounds on a predicted kernel efficiency (docs/METHOD.md §4.3): the predictor keeps every MLP output
inside the band ``[low, high]`` of ``overall_perf`` below, whatever the GPU or shape.

Duration is ``t = C_ideal / (eff × f)`` (``C_ideal``: the registry's ideal-cycle features, ``f``: SM clock in MHz).

* **Ceiling (a kernel never beats its roofline).** No kernel does its unpadded work faster than the spec peak:
  ``t ≥ E / f`` with ``E`` the shape descriptor ``exact_tensor_cycle`` (the problem's FLOPs at the spec peak,
  without tiles or padding; GEMM, attention, MoE), i.e. ``eff ≤ C_ideal / E``. ``C_ideal`` itself counts padded
  tiles and is beaten by measured rows (GEMM with M = 257 or 769; FA3 ragged attention up to 5.7x before it
  packed GQA), so ``eff ≤ 1`` is no bound: clipping there made the shipped attention model's correct predictions
  on those rows 97 % off; the exact-work bound holds on every measured row but 43 (RTX PRO 6000, by at most 1.9 %). For
  operators whose DRAM-cycle feature counts every byte it reads exactly once (:attr:`OperatorClass.dram_bound`:
  RMSNorm, SiLU*Mul; no measured row in any dataset beats it) the DRAM time of those reads binds too:
  ``t ≥ max(C_ideal, C_dram) / f``. For GEMM, attention and MoE the DRAM feature assumes tile re-reads that the L2
  cache absorbs (1–46 % of their measured rows beat it), so it is no bound. Every DRAM time of a bound is at the
  datasheet's decimal GB/s (:data:`SPEC_GB_CYCLES`): the features count 2^30 B/s per GB/s, a bound in their unit let
  a prediction beat the physical transfer by 7.4 %.
* **Ceiling where the problem does not fit in the L2.** GEMM and attention have a descriptor that counts each byte
  of their operands and result once, ``D = exact_dram_cycle`` (:attr:`OperatorClass.exact_dram_once`). A
  benchmark that re-runs a kernel keeps operands in the L2 that fit there, so measured rows beat ``D / f`` (up to
  2.8x, mostly GPUs with a large L2). But where those bytes exceed the L2 by more than :data:`L2_SPILL_FACTOR`,
  ``t ≥ D / f``: the L2 keeps too little of a streamed working set to matter. No such measured row beats
  ``D / f``: 153,725 GEMMs of 11 GPUs, 66,347 FP8 GEMMs of 10 and 41,396 attention kernels of 5; the fastest reach
  0.93–0.95 of it (at the decimal GB/s). Below 1.05x the L2 size, 8 L40S GEMMs and 667 attention rows (L40S, RTX
  PRO 6000) do, up to 2.7x, and the factor leaves a margin above that. With no L2 size in a GPU's JSON the bound
  does not apply. Leave-one-GPU-out it moves L40S only: GEMM 16.8 -> 16.6 %, attention 16.7 -> 16.2 %, FP8 GEMM by
  0.02 points (README, "Differences"). MoE's ``D`` counts the experts a random routing reaches, E (1 - (1 - k/E)^M)
  (a balanced routing's min(E, M k) is beaten by measured layers at any size); no measured layer beyond the spill
  factor beats it once the layers of the models whose experts are not gated are left out of the dataset
  (``dataset.aiconfigurator.NON_GATED_MOE_MODELS``). RMSNorm's and SiLU*Mul's ``D`` is their rows read
  and their output written (twice, 1.5x their reads): beyond :data:`ELEMENTWISE_L2_SPILL_FACTOR` times the L2 it
  binds too (a prediction of RMSNorm on 131,072 tokens had been 2.1x faster than its bytes allow).
* **Ceiling by the share of the L2 the problem fills** (GEMM, attention, MoE: :func:`streams_through_l2`). How much
  of a working set near the L2 size survives between two runs depends on the replacement policy and the access
  order, which no datasheet gives (between 0.95 and 1.05x its L2, L40S runs GEMMs of neighbouring shapes at 1.0x
  and 1.9x their DRAM time). So the band table records, per edge of :data:`L2_SHARE_EDGES`, the fastest measured
  speed ``D`` / (t f) of the rows whose bytes fill at least that share of their GPU's L2 (``dram_speed_max``,
  :func:`fastest_streaming_speeds`), and ``t ≥ D / (f s)`` with ``s`` that of the largest edge a kernel's share
  reaches (:func:`speed_allowed`). Leave-one-GPU-out it comes from the other GPUs' rows: held out, L40S's skinny
  GEMMs of about its L2's size had been predicted up to 3.6x faster than measured, as if resident, where no other
  GPU streamed bytes of that share of its L2 faster than 1.01x their DRAM time. RMSNorm and SiLU*Mul do not
  take it: held out, A40 beats the other GPUs' speeds by up to 2x from a quarter of its 6 MB L2 on.
* **Ceiling in a workload: cold operands come from DRAM.** The benchmarks behind the models re-run one kernel, so
  weights or a KV cache that fit in the L2 are read from it, and the bound above exempts them. In a workload a
  layer's weights and cached KV were last read a whole forward pass earlier, and every other layer's (gigabytes)
  streamed through the L2 since: whatever its size they come from DRAM. So the engine (workloads, serving, search)
  also keeps each kernel at or above the DRAM time of those bytes, :func:`cold_fastest_us`, from the registry's
  ``cold_bytes`` (GEMM: the weights; attention: the KV cached before this iteration; MoE: the weights of the experts
  that receive tokens). The element-wise operators read the previous kernel's output, which may be in the L2, and
  take no such bound. ``predict_kernels.py`` predicts the benchmark (the measured rows it was trained on) and does
  not apply it. On the 26 measured runs it binds no kernel (their per-layer KV spills the L2 or their L2 is small);
  it slows decode steps of large-L2 GPUs (RTX PRO 6000 Blackwell, RTX 6000 Ada) by 0.4–3.7 % in the batch scripts.
* **No kernel beats the launch:** ``t ≥ t_fastest``, the shortest duration measured for the operator on any GPU
  (``fastest_us`` of the band table; GEMM 1.5 µs, attention 6.8 µs, fused MoE layer 21 µs). Without it a tiny
  kernel whose exact work takes nanoseconds could be predicted thousands of times too fast (attention with Hopper
  held out: 5,324x).
* **Floor, conditional on the kernel's regime (a well-formed kernel is not arbitrarily slow).** With
  ``R = max(C_ideal, C_dram) / f`` the feature roofline time (µs), ``t ≤ L + A``:

  - ``L``, the operator's latency allowance (:func:`latency_allowance_us`): the 99.9th percentile of ``t − R`` over
    its measured kernels whose ``R`` is under :data:`LATENCY_BOUND_ROOF_US` (1 µs: all fixed cost), or over its
    :data:`MIN_BIN_ROWS` kernels of smallest ``R`` where fewer are (no MoE layer is under 1 µs). Measured: GEMM
    18 µs, FP8 GEMM 123 µs (M = 16,384 with N, K ≤ 256 take ~120 µs on Hopper and Blackwell), attention
    45 µs, RMSNorm 8 µs, SiLU*Mul 23 µs, MoE layer 101 µs.
  - ``floor``: the :data:`FLOOR_PERCENTILE`-th percentile of the measured ``R / (t − L)`` over the rows of every
    GPU (``dataset/<op>_{train,test}.csv``) in the same regime bin. The regime is GPU-independent: the roofline time
    in half decades (:data:`SIZE_EDGES`: latency and tails dominate small kernels) and the intensity relative to
    the GPU's ridge point, ``log10(C_ideal / C_dram)`` (:data:`INTENSITY_EDGES`: memory-bound kernels reach a
    larger share of their roofline than compute-bound ones of the same size). A bin with fewer than
    :data:`MIN_BIN_ROWS` rows takes the percentile of its whole size row; a size row with fewer takes the nearest
    size row that has them (beyond the measured sizes). A floor of ``inf`` (``null`` in the file): every kernel of
    the bin ran within ``L``.
  - ``A``, the allowance: each bin's ``R / floor`` at its centre (:data:`SIZE_CENTRES`, :data:`INTENSITY_CENTRES`),
    made non-decreasing in size and in intensity, interpolated bilinearly in ``log10 R`` and the log intensity
    (beyond the outer size centres at the outer bins' floor, beyond the outer intensity centres constant),
    :func:`slowest_us`. ``A`` is never below the fastest time physics allows the kernel (the ceiling's,
    :func:`physical_us`), and for GEMM, attention and MoE, whose DRAM feature is not their bytes, it is also the
    allowance of their regime at that time: a GEMM whose output spills the L2 can need 13x its feature roofline
    (L40S, M = 32,768, N = 65,536, K = 32), and the band had collapsed to the ceiling there (10 measured rows,
    predicted 2x too fast whatever the model said).
  - Doubling a GEMM's M, N or K, or an attention batch, length or head count, raises ``R`` and, where the padded
    work grows with it, does not lower the intensity, so more work is not allowed less time. Exceptions: off powers
    of two the padded work can grow less than the DRAM feature, so the intensity falls (157 of 1.07 M doublings of
    the measured BF16 GEMM shapes, by up to 25 %: A40, M = 328, N = 4,096, K 1,376 -> 2,752; none of the 0.93 M FP8
    ones); and where ``R`` itself falls (the analytical model's tile or split choice: 0.2–3.3 % of doublings of
    measured attention shapes), the allowed time falls with it, by up to 1.1x more.

  So at most 0.1 % of the measured kernels are slower than the floor allows (0.005–0.07 % per operator), and a
  kernel whose roofline time is large cannot be predicted many times slower than the measured kernels of its
  regime ran. Until 2026-12-05 ``L`` was 5 µs for every operator and ``A`` was ``R / floor`` of the kernel's own
  bin, a step. 5 µs is below what the slowest small kernels take (attention's sub-µs ones: median 12 µs), so the
  smallest bins' floors absorbed the latency (attention 0.0009, RMSNorm 0.0046, the operator-wide percentile
  that also held for its largest kernels), and the allowed time jumped down where the floor rose from one bin to
  the next: twice the work was allowed less time on 8–20 % of the doublings of random GEMM shapes and 6–10 % of
  measured attention shapes, by up to 19x (FP8 GEMM on B200, N = 128, K = 32: 212 µs at M = 32,768, 109 µs at
  65,536). Measured kernels outside the band
  were 0.11–0.29 % per operator. The price of the monotone band is width: the median allowed / measured time goes
  from 2.4 to 4.0 (GEMM), 10.5 to 12.8 (FP8 GEMM), 7.7 to 14.2 (attention; its memory-bound bins' loose floors now
  carry to the balanced ones), 1.4 to 1.5 (RMSNorm), 1.7 to 1.9 (SiLU*Mul) and 2.9 to 3.4 (MoE).
  The bins' floors and medians (used by :func:`regime_efficiency`), and ``L``, are in
  ``pipeweave/efficiency_band.json`` (``python3 -m pipeweave.bounds --write`` recomputes it; a data test checks it
  against the datasets). A ceiling from the same bins was tried and rejected: the fast tail depends on
  the GPU's L2 size (an L40S holds in its 96 MB L2 weights an H100's 50 MB does not), so a ceiling derived from
  the other architectures forced FP8 GEMM on L40S 10x too slow (leave-one-architecture-out 30.8 -> 45.0 %). The
  ceiling by the share of the L2 is that idea in the L2's own terms.
"""
from __future__ import annotations

import json
import math
import re
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from analytical_model.columns import column_values
from analytical_model.descriptors import dram_cycles as bytes_as_dram_cycles
from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import DRAM_CYCLE_FEATURE, get_operator, operator_keys

#: a kernel whose feature roofline time is under this (µs) is all fixed cost (launch, CTA dispatch, prologue, tail):
#: the slowest of them set the operator's latency allowance ``L`` of the floor
LATENCY_BOUND_ROOF_US = 1.0
#: percentile (in %) of the measured roofline efficiency R / (t − L) that defines the floor of a regime bin; its
#: complement is the percentile of the latency-bound kernels' time beyond R that defines ``L``
FLOOR_PERCENTILE = 0.1
#: regime bins: edges of log10(roofline time in µs) and of log10(C_ideal / C_dram); outer bins are open
SIZE_EDGES = (-0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)
INTENSITY_EDGES = (-1.0, -0.5, 0.0, 0.5, 1.0)


def bin_centres(edges) -> np.ndarray:
    """Where each bin's floor holds exactly: the middle of an inner bin, an outer bin half a bin width (0.25)
    beyond its edge; between them the allowance R / floor is interpolated."""
    return np.concatenate([[edges[0] - 0.25], np.add(edges[:-1], edges[1:]) / 2, [edges[-1] + 0.25]])


#: log10(roofline time in µs) and log10 intensity at the bins' centres (:func:`bin_centres`)
SIZE_CENTRES, INTENSITY_CENTRES = bin_centres(SIZE_EDGES), bin_centres(INTENSITY_EDGES)
#: fewer rows than this in a bin: its floor is not trusted (a 0.1th percentile of 200 rows is below the minimum)
MIN_BIN_ROWS = 200
BAND_TABLE_PATH = Path(__file__).with_name("efficiency_band.json")
#: the descriptor of the unpadded work at the spec peak (cycles), the compute ceiling
EXACT_WORK_DESCRIPTOR = "exact_tensor_cycle"
#: the descriptor of the problem's bytes at the spec DRAM bandwidth (cycles), a ceiling where they spill the L2
EXACT_DRAM_DESCRIPTOR = "exact_dram_cycle"
#: the problem's bytes must exceed the L2 size by this factor for their DRAM time to bound the kernel: measured
#: rows beat it up to 1.05x the L2 size, none beyond on any GPU
L2_SPILL_FACTOR = 1.1
#: the same for RMSNorm and SiLU*Mul, whose exact bytes are their rows read and their output written: A40's
#: SiLU*Mul, 5–8 µs kernels timed to the whole µs, beats that DRAM time by up to 1.11x at 1.1–1.5x its 6 MB L2, no
#: row beyond 1.5x reaches 0.85 of it (every GPU)
ELEMENTWISE_L2_SPILL_FACTOR = 2.0
#: shares of the L2 (the problem's bytes D over the L2 size) at which the band table records the fastest measured
#: streaming speed, D's DRAM time over the kernel's (``dram_speed_max``): a GEMM, attention or MoE kernel whose bytes
#: are at least that share of its GPU's L2 is kept at or below it (module docstring)
L2_SHARE_EDGES = (0.25, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05)
#: DRAM cycles at the datasheet's decimal GB/s per cycle feature: the features divide bytes by memBandwidth × 2^30
#: (the artifact's unit, kept for them: docs/METHOD.md §11.1.11), 7.4 % fewer cycles than the physical transfer takes
SPEC_GB_CYCLES = 2 ** 30 / 1e9
#: stands for an infinite R / (t − L) (a kernel faster than the launch latency) inside a percentile
BIGGEST = np.finfo(np.float64).max


def l2_cycles(hw) -> float:
    """The L2 size of the GPU ``hw`` as DRAM cycles at its spec bandwidth, in the units of ``exact_dram_cycle``
    (inf without an L2 size: no L2 ceiling)."""
    if not hw.l2_cache_size:
        return np.inf
    return float(bytes_as_dram_cycles(hw.l2_cache_size * 1024.0, hw))


def frame_l2_cycles(frame) -> np.ndarray:
    """:func:`l2_cycles` of each row's GPU (column ``hardware``) of a dataset frame."""
    registry = hardware_registry(DEFAULT_HARDWARE_DIR)
    cycles = {name: l2_cycles(registry.get(name)) for name in frame["hardware"].unique()}
    return frame["hardware"].map(cycles).to_numpy(np.float64)


def ceiling_cycles(op: str, features: np.ndarray, described: np.ndarray | None, l2: np.ndarray | float,
                   dram_speed_max: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(C_ideal, the fewest cycles the kernel can take) of float64 feature rows (columns in the registry's feature
    order) and their shape descriptors (the registry's descriptor order) on GPUs whose L2 holds ``l2`` DRAM cycles
    (:func:`l2_cycles`; scalar or per row); ``dram_speed_max``: the band table's fastest streaming speed per
    :data:`L2_SHARE_EDGES` (None: no such ceiling)."""
    operator = get_operator(op)
    ideal = operator.ideal_cycles(np.asarray(features, dtype=np.float32)).astype(np.float64)
    needed = EXACT_DRAM_DESCRIPTOR if operator.dram_bound else EXACT_WORK_DESCRIPTOR
    if operator.dram_bound:
        ceiling = np.maximum(ideal, dram_cycles(op, features) * SPEC_GB_CYCLES)
    elif EXACT_WORK_DESCRIPTOR in operator.descriptor_names:
        ceiling = None
    else:
        return ideal, ideal
    if described is None:
        raise ValueError(f"{op}: the physical band needs the shape descriptors ({needed})")
    described = np.asarray(described, dtype=np.float64)
    if ceiling is None:
        ceiling = described[:, operator.descriptor_names.index(EXACT_WORK_DESCRIPTOR)]
    if operator.exact_dram_once:
        exact_dram = described[:, operator.descriptor_names.index(EXACT_DRAM_DESCRIPTOR)]
        spills = exact_dram > l2_spill_factor(op) * np.asarray(l2, dtype=np.float64)
        ceiling = np.where(spills, np.maximum(ceiling, exact_dram * SPEC_GB_CYCLES), ceiling)
        if streams_through_l2(op) and dram_speed_max is not None:
            speed = speed_allowed(exact_dram / np.asarray(l2, dtype=np.float64), dram_speed_max)
            ceiling = np.maximum(ceiling, exact_dram * SPEC_GB_CYCLES / speed)
    return ideal, ceiling


def streams_through_l2(op: str) -> bool:
    """Whether the fastest measured streaming speed per L2 share bounds ``op`` (:data:`L2_SHARE_EDGES`): GEMM,
    attention and MoE. Not RMSNorm and SiLU*Mul, whose DRAM feature bounds them at every size: held out, A40's
    kernels beat the other GPUs' speeds by up to 2x at a quarter of its 6 MB L2 and more."""
    operator = get_operator(op)
    return operator.exact_dram_once and not operator.dram_bound


def speed_allowed(l2_share: np.ndarray, dram_speed_max: list) -> np.ndarray:
    """The fastest streaming speed (the bytes' DRAM time over the kernel's) allowed a kernel whose bytes are
    ``l2_share`` times its GPU's L2: the band table's ``dram_speed_max`` at the largest edge of
    :data:`L2_SHARE_EDGES` not above it (inf below the first edge, or where no measured row reached the edge)."""
    speeds = np.array([np.inf if speed is None else speed for speed in dram_speed_max], dtype=np.float64)
    edge = np.searchsorted(L2_SHARE_EDGES, np.nan_to_num(l2_share, nan=0.0), side="right") - 1
    return np.where(edge >= 0, speeds[np.maximum(edge, 0)], np.inf)


def fastest_streaming_speeds(exact_dram: np.ndarray, l2: np.ndarray, sm_freq_mhz: np.ndarray,
                             measured_us: np.ndarray) -> list:
    """``dram_speed_max`` of the band table: per edge of :data:`L2_SHARE_EDGES`, the largest measured ratio of the
    bytes' DRAM time at the datasheet bandwidth to the kernel's time over the rows whose bytes ``exact_dram`` (DRAM
    cycles) are at least that share of their GPU's L2 ``l2`` (None where there is none)."""
    share = exact_dram / l2
    speed = exact_dram * SPEC_GB_CYCLES / (sm_freq_mhz * measured_us)
    # rounded up to 4 decimals, so that the table's speed is never below a measured one
    return [math.ceil(speed[share >= edge].max() * 1e4) / 1e4 if (share >= edge).any() else None
            for edge in L2_SHARE_EDGES]


def l2_spill_factor(op: str) -> float:
    """How far the problem's bytes must exceed the L2 for their DRAM time to bound the kernel
    (:data:`L2_SPILL_FACTOR`, :data:`ELEMENTWISE_L2_SPILL_FACTOR` for the memory-bound operators)."""
    return ELEMENTWISE_L2_SPILL_FACTOR if get_operator(op).dram_bound else L2_SPILL_FACTOR


def dram_cycles(op: str, features: np.ndarray) -> np.ndarray:
    return np.asarray(features, dtype=np.float64)[:, get_operator(op).feature_names.index(DRAM_CYCLE_FEATURE)]


def regime(op: str, features: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C_ideal, feature roofline cycles max(C_ideal, C_dram), log10 intensity C_ideal / C_dram) of float64
    feature rows: the coordinates of the regime bins and of the floor's allowance."""
    tiny = np.finfo(np.float64).tiny
    ideal = get_operator(op).ideal_cycles(np.asarray(features, dtype=np.float32)).astype(np.float64)
    dram = dram_cycles(op, features)
    roof = np.maximum(np.maximum(ideal, dram), tiny)
    return ideal, roof, np.log10(np.maximum(ideal, tiny) / np.maximum(dram, tiny))


def regime_bins(op: str, features: np.ndarray, sm_freq_mhz) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C_ideal, feature roofline cycles, flat regime-bin index) of float64 feature rows."""
    ideal, roof, log_intensity = regime(op, features)
    size = np.searchsorted(SIZE_EDGES, np.log10(roof / np.asarray(sm_freq_mhz, dtype=np.float64)))
    intensity = np.searchsorted(INTENSITY_EDGES, log_intensity)
    return ideal, roof, size * (len(INTENSITY_EDGES) + 1) + intensity


def latency_allowance_us(roof_us: np.ndarray, measured_us: np.ndarray) -> float:
    """``L`` of the floor: the (100 − :data:`FLOOR_PERCENTILE`)th percentile of the measured time beyond the
    roofline, ``t − R``, of the kernels whose roofline time is under :data:`LATENCY_BOUND_ROOF_US` (all fixed
    cost), or of the :data:`MIN_BIN_ROWS` kernels of smallest ``R`` where fewer are (MoE layers: none is)."""
    latency_bound = roof_us < LATENCY_BOUND_ROOF_US
    if latency_bound.sum() < MIN_BIN_ROWS:  # ties at the last included R included
        last = min(MIN_BIN_ROWS, len(roof_us)) - 1
        latency_bound = roof_us <= np.partition(roof_us, last)[last]
    return max(float(np.percentile((measured_us - roof_us)[latency_bound], 100 - FLOOR_PERCENTILE)), 0.0)


def band_table(op: str, features: np.ndarray, sm_freq_mhz: np.ndarray, measured_us: np.ndarray,
               described: np.ndarray | None = None, l2: np.ndarray | None = None) -> dict:
    """{"latency_us": L, "floor": [[...]], "median": [[...]], "fastest_us": t, "dram_speed_max": [...]}: the latency
    allowance, per size bin (rows) and intensity bin (columns) the floor and median efficiency, the shortest measured
    duration, and for an operator :func:`streams_through_l2` with its rows' shape descriptors and L2 sizes (DRAM
    cycles, :func:`frame_l2_cycles`) :func:`fastest_streaming_speeds`, from measured rows (feature rows, clock,
    duration)."""
    measured_us = np.asarray(measured_us, dtype=np.float64)
    if not len(measured_us):
        raise ValueError(f"{op}: no measured rows to derive the band from")
    sm_freq_mhz = np.asarray(sm_freq_mhz, dtype=np.float64)
    _, roof, bins = regime_bins(op, features, sm_freq_mhz)
    roof_us = roof / sm_freq_mhz
    latency = latency_allowance_us(roof_us, measured_us)
    slow = measured_us > latency  # faster kernels are inside the band for any floor
    latency_free = np.where(slow, roof_us / np.maximum(measured_us - latency, 1e-9), np.inf)

    def floor_of(rows: np.ndarray) -> float:
        if not (rows & slow).any():
            return np.inf
        floor = np.percentile(np.minimum(latency_free[rows], BIGGEST), FLOOR_PERCENTILE)
        # beyond every kernel slower than L, the percentile lies among those within it (interpolated towards
        # BIGGEST it was a huge finite number, e.g. 8.4e307)
        return np.inf if floor > latency_free[rows & slow].max() else floor

    efficiency = roof_us / measured_us  # the median: a kernel's typical speed, latency included
    table = {"latency_us": float(f"{latency:.4g}"), "floor": per_bin(bins, floor_of),
             "median": per_bin(bins, lambda rows: np.median(efficiency[rows])), "fastest_us": float(measured_us.min())}
    if streams_through_l2(op) and described is not None:
        exact_dram = np.asarray(described, dtype=np.float64)[:, get_operator(op).descriptor_names.index(
            EXACT_DRAM_DESCRIPTOR)]
        table["dram_speed_max"] = fastest_streaming_speeds(exact_dram, np.asarray(l2, dtype=np.float64), sm_freq_mhz,
                                                           measured_us)
    return table


def per_bin(bins: np.ndarray, statistic) -> list[list[float]]:
    """``statistic(rows)`` per size bin (rows) and intensity bin (columns) of the flat regime-bin indices ``bins``:
    a bin with fewer than :data:`MIN_BIN_ROWS` rows takes its size row's, a size row with fewer the nearest size
    row's that has them (beyond the measured sizes), and without any such row the statistic of all rows."""
    width = len(INTENSITY_EDGES) + 1
    sizes = bins // width
    row_counts = np.bincount(sizes, minlength=len(SIZE_EDGES) + 1)
    measured_sizes = np.flatnonzero(row_counts >= MIN_BIN_ROWS)
    table = []
    for size in range(len(SIZE_EDGES) + 1):
        if row_counts[size] < MIN_BIN_ROWS:
            if not len(measured_sizes):
                table.append([float(f"{statistic(np.ones(len(bins), dtype=bool)):.4g}")] * width)
                continue
            size = int(measured_sizes[np.argmin(np.abs(measured_sizes - size))])
        row_value = statistic(sizes == size)
        table.append([float(f"{statistic(rows) if rows.sum() >= MIN_BIN_ROWS else row_value:.4g}")
                      for rows in (bins == size * width + intensity for intensity in range(width))])
    return table


def frame_band_table(op: str, frame) -> dict:
    """:func:`band_table` of a dataset frame (feature and descriptor columns, ``hardware``, ``sm_freq``,
    ``avg_duration``)."""
    operator = get_operator(op)
    described = frame[list(operator.descriptor_names)].to_numpy(np.float64) if streams_through_l2(op) else None
    return band_table(op, frame[list(operator.feature_names)].to_numpy(np.float64),
                      frame["sm_freq"].to_numpy(np.float64), frame["avg_duration"].to_numpy(np.float64), described,
                      frame_l2_cycles(frame) if described is not None else None)


@lru_cache(maxsize=1)
def shipped_tables() -> dict:
    tables = json.loads(BAND_TABLE_PATH.read_text())
    for table in tables.values():  # null (JSON has no inf): every measured kernel of the bin ran within L
        table["floor"] = [[np.inf if floor is None else floor for floor in row] for row in table["floor"]]
    return tables


def table_for(op: str, table: dict | None) -> dict:
    """``table`` or the shipped one of the model predicting ``op``; an operator without measurements (a newly
    registered one) gets, per bin, the loosest floor of the measured operators, their longest latency allowance and
    their shortest duration, and no streaming speed per share of the L2."""
    if table is not None:
        return table
    tables = shipped_tables()
    model_op = get_operator(op).model_op
    if model_op in tables:
        return tables[model_op]
    return {"latency_us": max(t["latency_us"] for t in tables.values()),
            "floor": np.min([t["floor"] for t in tables.values()], axis=0).tolist(), "median": None,
            "fastest_us": min(t["fastest_us"] for t in tables.values()), "dram_speed_max": None}


def has_regime_medians(op: str) -> bool:
    """Whether the shipped table has measured medians for ``op``'s model (not for a newly registered operator)."""
    return get_operator(op).model_op in shipped_tables()


def efficiency_band(op: str, features: np.ndarray, described: np.ndarray | None, sm_freq_mhz,
                    table: dict | None = None, *, l2) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) efficiency per feature row (and its shape descriptors) on GPUs clocked at ``sm_freq_mhz``
    whose L2 holds ``l2`` DRAM cycles (:func:`l2_cycles`; both scalar or per row); ``table``
    (:func:`band_table`) replaces the shipped floors, e.g. one derived without a held-out GPU."""
    table = table_for(op, table)
    sm_freq_mhz = np.asarray(sm_freq_mhz, dtype=np.float64)
    ideal = get_operator(op).ideal_cycles(np.asarray(features, dtype=np.float32)).astype(np.float64)
    physical = physical_us(op, features, described, sm_freq_mhz, table, l2=l2)
    high = ideal / (np.maximum(physical, table["fastest_us"]) * sm_freq_mhz)
    low = ideal / (slowest_us(op, features, sm_freq_mhz, table, physical) * sm_freq_mhz)
    return np.minimum(low, high), high


def slowest_us(op: str, features: np.ndarray, sm_freq_mhz, table: dict | None = None,
               physical: np.ndarray | None = None) -> np.ndarray:
    """The longest duration (µs) the floor allows each feature row on GPUs clocked at ``sm_freq_mhz``:
    ``L + A``, the allowance ``A`` interpolated (bilinearly in log10 R and log10 intensity) between the bins'
    ``R / floor`` at their :data:`SIZE_CENTRES` and :data:`INTENSITY_CENTRES`, made non-decreasing in both first;
    beyond the outer size centres at the outer bins' floor, beyond the outer intensity centres constant (module
    docstring). ``physical``: the fastest time physics allows each row (:func:`physical_us`). ``A`` is never below
    it, and for GEMM, attention and MoE, whose DRAM feature is not their bytes, ``A`` is also the allowance of their
    regime at that time where it is longer than ``R``: a GEMM whose exact bytes spill the L2 can need far more time
    than ``R`` (L40S, M = 32,768, N = 65,536, K = 32: R = 375 µs, its bytes at the DRAM bandwidth 4,978 µs, measured
    9,972 µs), and the band had collapsed to that ceiling, whatever the model said."""
    table = table_for(op, table)
    sm_freq_mhz = np.asarray(sm_freq_mhz, dtype=np.float64)
    _, roof, log_intensity = regime(op, features)
    knots = 10.0 ** SIZE_CENTRES[:, None] / np.asarray(table["floor"], dtype=np.float64)  # R / inf = 0: all latency
    knots = np.maximum.accumulate(np.maximum.accumulate(knots, axis=0), axis=1)
    allowance = interpolated_allowance(knots, roof / sm_freq_mhz, log_intensity)
    if physical is None:
        return table["latency_us"] + allowance
    if not get_operator(op).dram_bound:
        # at the datasheet's GB/s the feature's bytes take 7.4 % longer than the feature says (SPEC_GB_CYCLES),
        # which the floors already hold: the physical time goes back to the features' unit
        allowance = np.maximum(allowance, interpolated_allowance(knots, physical / SPEC_GB_CYCLES, log_intensity))
    return table["latency_us"] + np.maximum(allowance, physical)


def interpolated_allowance(knots: np.ndarray, roof_us: np.ndarray, log_intensity: np.ndarray) -> np.ndarray:
    """The allowance of :func:`slowest_us` at roofline times ``roof_us`` (µs) and log10 intensities, from the
    non-decreasing ``knots`` (size centres x intensity centres)."""
    log_roof_us = np.log10(roof_us)
    below, above = log_roof_us < SIZE_CENTRES[0], log_roof_us > SIZE_CENTRES[-1]
    by_column = np.empty((len(log_roof_us), knots.shape[1]))
    for column in range(knots.shape[1]):
        by_column[:, column] = np.where(
            below, knots[0, column] * 10.0 ** (log_roof_us - SIZE_CENTRES[0]),
            np.where(above, knots[-1, column] * 10.0 ** (log_roof_us - SIZE_CENTRES[-1]),
                     np.interp(log_roof_us, SIZE_CENTRES, knots[:, column])))
    right = np.clip(np.searchsorted(INTENSITY_CENTRES, log_intensity), 1, len(INTENSITY_CENTRES) - 1)
    weight = np.clip((log_intensity - INTENSITY_CENTRES[right - 1])
                     / (INTENSITY_CENTRES[right] - INTENSITY_CENTRES[right - 1]), 0.0, 1.0)
    rows = np.arange(len(log_roof_us))
    return (1 - weight) * by_column[rows, right - 1] + weight * by_column[rows, right]


def fastest_us(op: str, features: np.ndarray, described: np.ndarray | None, sm_freq_mhz, table: dict | None = None,
               *, l2) -> np.ndarray:
    """The shortest duration (µs) the ceiling allows each row (arguments as :func:`efficiency_band`'s): no
    prediction, nor the low end of its interval, may be faster."""
    return np.maximum(physical_us(op, features, described, sm_freq_mhz, table, l2=l2),
                      table_for(op, table)["fastest_us"])


def physical_us(op: str, features: np.ndarray, described: np.ndarray | None, sm_freq_mhz, table: dict | None = None,
                *, l2) -> np.ndarray:
    """The fastest time (µs) physics and the measured streaming speeds allow each row: the ceiling's cycles
    (:func:`ceiling_cycles`, with ``table``'s ``dram_speed_max``: the shipped one by default) at the clock."""
    speeds = table_for(op, table).get("dram_speed_max")
    return ceiling_cycles(op, features, described, l2, speeds)[1] / np.asarray(sm_freq_mhz, dtype=np.float64)


def cold_fastest_us(op: str, columns, mem_bandwidth_gb_s) -> np.ndarray:
    """The DRAM time (µs) of each row's cold operands (the registry's ``cold_bytes``) at the datasheet's decimal
    ``mem_bandwidth_gb_s`` (scalar or per row): in a workload no kernel is faster (module docstring); zeros for an
    operator without cold operands."""
    operator = get_operator(op)
    if operator.cold_bytes is None:
        return np.zeros(len(column_values(columns, operator.shape_columns[0])))
    return operator.cold_bytes(columns) / (np.asarray(mem_bandwidth_gb_s, dtype=np.float64) * 1e3)


def regime_efficiency(op: str, features: np.ndarray, sm_freq_mhz, table: dict | None = None) -> np.ndarray:
    """The efficiency of a kernel running at the median roofline efficiency of its regime bin: the prediction
    where the model carries no information on the GPU (see :meth:`pipeweave.predictor.KernelPredictor`)."""
    medians = table_for(op, table)["median"]
    if medians is None:
        raise ValueError(f"{op}: no measured rows, so no regime medians (python3 -m pipeweave.bounds --write)")
    ideal, roof, bins = regime_bins(op, features, sm_freq_mhz)
    return ideal * np.ravel(medians)[bins] / roof


def clip_efficiency(op: str, efficiency: np.ndarray, features: np.ndarray, described: np.ndarray | None, sm_freq_mhz,
                    table: dict | None = None, *, l2) -> tuple[np.ndarray, np.ndarray]:
    """(efficiency kept inside the band, side): side is -1 where the floor bound, +1 the ceiling, 0 neither
    (arguments as :func:`efficiency_band`'s)."""
    efficiency = np.asarray(efficiency, dtype=np.float64)
    bad = ~np.isfinite(efficiency)
    if bad.any():  # np.clip would pass a NaN through as a NaN duration
        raise ValueError(f"{op}: the model gave a non-finite efficiency for {int(bad.sum())} of {bad.size} kernel "
                         f"rows (first: row {int(np.flatnonzero(bad)[0])}); a model file with non-finite weights "
                         "or a shape whose features overflow would do it")
    low, high = efficiency_band(op, features, described, sm_freq_mhz, table, l2=l2)
    side = np.where(efficiency < low, -1, np.where(efficiency > high, 1, 0)).astype(np.int8)
    return np.clip(efficiency, low, high), side


def main(argv=None) -> int:
    """Print (with --write: store in pipeweave/efficiency_band.json) the regime floors measured on the datasets."""
    import pandas as pd

    from pipeweave.cli import ArgumentParser, write_atomically
    from pipeweave.modeling import dataset_paths, read_dataset
    from pipeweave.paths import DATASET_DIR

    parser = ArgumentParser(prog="python3 -m pipeweave.bounds", description=main.__doc__)
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR,
                        help="the built datasets (default: dataset)")
    parser.add_argument("--write", action="store_true", help=f"write {BAND_TABLE_PATH.name}")
    args = parser.parse_args(argv)
    tables = {}
    for op in operator_keys(trainable=True):
        frame = pd.concat([read_dataset(path) for path in dataset_paths(op, args.dataset_dir)], ignore_index=True)
        tables[op] = frame_band_table(op, frame)
        floors = np.ravel(tables[op]["floor"])
        print(f"{op}: {len(frame)} rows, {frame['hardware'].nunique()} GPUs; floors {floors.min():.3g} .. "
              f"{floors.max():.3g}")
    if args.write:  # one line per size bin
        for table in tables.values():
            table["floor"] = [[None if np.isinf(floor) else floor for floor in row] for row in table["floor"]]
        text = json.dumps(tables, indent=1, allow_nan=False)
        text = re.sub(r"\[\s+([^\[\]]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
        write_atomically(BAND_TABLE_PATH, lambda tmp: tmp.write_text(text + "\n"))
        print(f"wrote {BAND_TABLE_PATH}")
    return 0


if __name__ == "__main__":
    from pipeweave.cli import run_cli

    sys.exit(run_cli(main))
