"""Bounds from a trained sibling for a GPU outside a model's training data (docs/METHOD.md §4.3).

Export and workstation variants keep a die's SM design and change the tensor-core rate per SM: H20 runs
Hopper's SM at a quarter of H100's dense rate; L40, L20 and RTX 6000 Ada run FP32-accumulate GEMMs at half
of L40S's. For the same shape their tensor-cycle features are several times the other pipes', a combination
no training row has, and the MLP extrapolates (leave-one-GPU-out, H20's BF16 and FP8 GEMMs were predicted
too slow: median 16 % and 44 % off).

Two facts bound the duration without that extrapolation. Take the same kernel (same tiles, waves and bytes)
on a *virtual* GPU that is the target with the tensor rate of a trained GPU of the same compute capability
(the sibling): its features are the target's with the tensor-cycle columns
(:data:`analytical_model.registry.TENSOR_RATE_COLUMNS`) scaled by ``r_target / r_sibling``, a tensor rate the
model was trained on for that SM design, and the model predicts its duration ``t_v``. Let ``ΔT`` be the change
of the busiest SM's tensor cycles (``tensor_sm_max_cycle``) from the virtual GPU to the target. Where the
target's tensor pipe is slower (``ΔT > 0``), the kernel cannot get faster (``t ≥ t_v``) and it gets slower by
at most ``ΔT``: the other pipes' work is unchanged and overlaps the longer tensor work at least as well
(``t ≤ t_v + ΔT``). Where it is faster, symmetrically ``t_v − |ΔT| ≤ t ≤ t_v``. The model's own prediction for
the target is kept inside ``[t_v, t_v + ΔT]`` (:func:`sibling_band`); where the model is consistent with itself
that changes nothing.

The sibling must share the compute capability: only then do the same kernels (cuBLAS, FlashAttention,
Triton) run on the same SM with the same shared memory, issue and L1, so that only the tensor rate differs.
Of several, the one whose rate is closest (in log) to the target's; a trained GPU with the target's own rate
means the rate is covered and no bound applies. A100 (8.0) is no sibling of A40 (8.6), nor B200 (10.0) of
RTX PRO 6000 (12.0).

**A trained GPU of the same die** (:func:`die_band`). Where a trained GPU has the target's compute capability *and*
its SM count (A100 80GB for A100 40GB and A100 PCIe, A40 for RTX A6000, L40S for L40 and RTX 6000 Ada, H100 for
H800, H200 and any edited copy of a trained GPU's JSON), the same kernel runs on both with the same CTAs on the
same number of SMs, and every pipe's cycle count on one follows from the other's by the pipe's rate
(:data:`analytical_model.registry.PIPE_RATE_COLUMNS`: :func:`die_inputs`). Each pipe's time (cycles over the clock)
then changes by the ratio of the two rates, ``ρ_p = T_p(target) / T_p(sibling)``; a fixed part of the kernel's
time (launch, latencies) by 1 if it is counted in seconds and by the clock ratio if in cycles. A duration that is a
non-decreasing, degree-1 homogeneous function of those times (more time in any pipe never shortens the kernel;
every time scaled by c scales the kernel by c) changes by a ratio in ``[min ρ, max ρ]``, the ratios of the pipes the
kernel uses, 1 and the clock ratio included. The model's duration for the same kernels on the sibling, ``t_s``,
bounds the target's to ``[min ρ · t_s, max ρ · t_s]``. Physically a GPU with more of one resource than its trained
die-mate is never predicted slower than it, and a renamed copy is predicted as the trained GPU. The premise
fails where the spec sheet is not what the chip sustains (a power limit that lowers the clock: measured GB200 BF16
GEMMs are 1.33x B200's on large shapes although GB200's spec is faster in every rate), which no spec-derived bound
can know.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from analytical_model.pipes import HardwareSpec
from analytical_model.registry import PIPE_RATE_COLUMNS, TENSOR_RATE_COLUMNS, TIME_RATE, get_operator

#: the busiest SM's tensor cycles: the part of a kernel's time that a change of the tensor rate moves
BUSIEST_TENSOR_FEATURE = "tensor_sm_max_cycle"

ModelEfficiency = Callable[[np.ndarray, "np.ndarray | None"], np.ndarray]


def sibling_of(op: str, hw: HardwareSpec, trained: Iterable[HardwareSpec]) -> HardwareSpec | None:
    """The trained GPU that bounds ``hw``'s predictions of ``op``: of those sharing its compute capability, the one
    whose tensor rate for ``op`` is closest (in log) to ``hw``'s; None when ``op`` has no tensor pipe, no trained
    GPU shares the compute capability, or one of them has ``hw``'s own rate (the rate is covered)."""
    attribute = get_operator(op).tensor_rate
    own = getattr(hw, attribute) if attribute else 0
    if not own:
        return None
    same_sm = sorted((spec for spec in trained
                      if spec.compute_capability == hw.compute_capability and getattr(spec, attribute)),
                     key=lambda spec: (getattr(spec, attribute), spec.name))
    if not same_sm or any(getattr(spec, attribute) == own for spec in same_sm):
        return None
    return min(same_sm, key=lambda spec: abs(np.log(getattr(spec, attribute) / own)))


def sibling_scale(op: str, hw: HardwareSpec, trained: Iterable[HardwareSpec]) -> float | None:
    """``r_target / r_sibling`` (:func:`sibling_of`): the factor on the tensor-cycle columns that turns ``hw``'s
    features into those of the same kernels at the sibling's tensor rate; None without a sibling."""
    sibling = sibling_of(op, hw, trained)
    return None if sibling is None else tensor_rate_ratio(op, hw, sibling)


def tensor_rate_ratio(op: str, hw: HardwareSpec, other: HardwareSpec) -> float:
    """``hw``'s tensor rate for ``op`` over ``other``'s."""
    attribute = get_operator(op).tensor_rate
    return getattr(hw, attribute) / getattr(other, attribute)


def virtual_inputs(op: str, features: np.ndarray, described: np.ndarray | None, scale: float
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    """(features, descriptors) of the same kernels at a tensor rate 1 / ``scale`` times the target's (the
    tensor-cycle columns times ``scale``)."""
    return _scaled_columns(op, features, described, lambda name: scale if name in TENSOR_RATE_COLUMNS else None)


def _scaled_columns(op: str, features: np.ndarray, described: np.ndarray | None,
                    factor: Callable[[str], float | None]) -> tuple[np.ndarray, np.ndarray | None]:
    """Copies of ``op``'s feature and descriptor rows with each column multiplied by ``factor(its name)``, those
    whose factor is None kept."""
    operator = get_operator(op)

    def scaled(rows: np.ndarray | None, names: tuple[str, ...]) -> np.ndarray | None:
        if rows is None:
            return None
        rows = np.array(rows, dtype=np.float64)
        for i, name in enumerate(names):
            if (multiplier := factor(name)) is not None:
                rows[:, i] *= multiplier
        return rows

    return scaled(features, operator.feature_names), scaled(described, operator.descriptor_names)


def sibling_band(op: str, features: np.ndarray, described: np.ndarray | None, scale: float,
                 model_efficiency: ModelEfficiency) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) efficiency of feature rows on the target from the model's prediction for the virtual GPU
    (``model_efficiency(features, descriptors)``, at the sibling's tensor rate): the durations
    ``t_v`` and ``t_v + ΔT`` in the target's terms."""
    operator = get_operator(op)
    virtual_features, virtual_described = virtual_inputs(op, features, described, scale)
    ideal = operator.ideal_cycles(np.asarray(features, dtype=np.float32)).astype(np.float64)
    virtual_ideal = operator.ideal_cycles(virtual_features.astype(np.float32)).astype(np.float64)
    virtual_cycles = virtual_ideal / model_efficiency(virtual_features, virtual_described)
    busiest = operator.feature_names.index(BUSIEST_TENSOR_FEATURE)
    shift = np.asarray(features, dtype=np.float64)[:, busiest] - virtual_features[:, busiest]
    shortest = np.minimum(virtual_cycles, virtual_cycles + shift)
    longest = np.maximum(virtual_cycles, virtual_cycles + shift)
    # a target faster than its sibling by more than the kernel's virtual time has no upper bound from it
    return ideal / longest, np.divide(ideal, shortest, out=np.full_like(ideal, np.inf), where=shortest > 0)


def sibling_note(what: str, gpu: str, sibling: str) -> str:
    """The line the command-line tools print where the bound applies (``what``: an operator or its category)."""
    return (f"Note: {what} on {gpu} is kept between the same kernels at the tensor rate of {sibling} (trained, same "
            f"SM design) and that plus the extra tensor time (docs/METHOD.md §4.3)")


def _rate(op: str, hw: HardwareSpec, rate: str) -> float:
    """``hw``'s value of a :data:`PIPE_RATE_COLUMNS` rate ("tensor": ``op``'s tensor rate; :data:`TIME_RATE`: 1)."""
    if rate == TIME_RATE:
        return 1.0
    return getattr(hw, get_operator(op).tensor_rate if rate == "tensor" else rate)


def die_sibling(op: str, hw: HardwareSpec, trained: Iterable[HardwareSpec]) -> HardwareSpec | None:
    """The trained GPU of ``hw``'s die for ``op`` (:func:`die_band`): of those with its compute capability and SM
    count (and, for a tensor operator, a tensor rate on both), the one closest in its rates: the smallest sum of
    |log ρ| over the pipe rates ``op`` reads and the clock (then by name), so that a copy of a trained GPU with more
    of one resource is bounded by that GPU; None without one. The caller leaves out a GPU whose own measurements
    trained the model."""
    operator = get_operator(op)
    if operator.tensor_rate and not getattr(hw, operator.tensor_rate):
        return None
    same_die = [spec for spec in trained if spec.compute_capability == hw.compute_capability
                and spec.num_sms == hw.num_sms and (not operator.tensor_rate or getattr(spec, operator.tensor_rate))]
    if not same_die:
        return None

    def distance(spec: HardwareSpec) -> float:
        rates = {PIPE_RATE_COLUMNS[name][0]: ratio for name, ratio in pipe_time_ratios(op, hw, spec).items()}
        return sum(abs(np.log(ratio)) for ratio in rates.values()) + abs(np.log(spec.sm_freq / hw.sm_freq))

    return min(same_die, key=lambda spec: (distance(spec), spec.name))


def pipe_time_ratios(op: str, hw: HardwareSpec, sibling: HardwareSpec) -> dict[str, float]:
    """``T(hw) / T(sibling)`` of the same kernel's time in each of ``op``'s cycle columns
    (:data:`PIPE_RATE_COLUMNS`), the two GPUs having the same SM count: the sibling's rate over ``hw``'s, times the
    sibling's clock over ``hw``'s for a rate per cycle (the pipe's throughput is rate × clock)."""
    operator = get_operator(op)
    out = {}
    for name in (*operator.feature_names, *operator.descriptor_names):
        if name in PIPE_RATE_COLUMNS:
            rate, per_second = PIPE_RATE_COLUMNS[name]
            ratio = _rate(op, sibling, rate) / _rate(op, hw, rate)
            out[name] = ratio if per_second else ratio * sibling.sm_freq / hw.sm_freq
    return out


def die_inputs(op: str, features: np.ndarray, described: np.ndarray | None, hw: HardwareSpec,
               sibling: HardwareSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """(features, descriptors) of the same kernels (tiles, CTAs, bytes) as ``hw``'s rows on ``sibling``, a GPU of
    the same SM count: each cycle column times ``hw``'s rate over the sibling's, and for a rate per second (a
    bandwidth) times the sibling's clock over ``hw``'s: the sibling's clock over ``hw``'s, over the column's
    :func:`pipe_time_ratios` (cycles are time × clock)."""
    ratios, clock = pipe_time_ratios(op, hw, sibling), sibling.sm_freq / hw.sm_freq
    return _scaled_columns(op, features, described, lambda name: clock / ratios[name] if name in ratios else None)


def die_rows(op: str, features: np.ndarray, described: np.ndarray | None, hw: HardwareSpec, sibling: HardwareSpec
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """(features, descriptors) of the same kernels as ``hw``'s rows on ``sibling``, a GPU of the same compute
    capability and SM count: where the descriptors hold the whole shape (GEMM, FP8 GEMM, RMSNorm, SiLU*Mul), the
    features of the sibling's own kernels of it, since a library picks its kernels by SM design and SM count, which
    the two share (the GEMM tile rule, which also weighs the rates, picked other tiles for an H100 with 30 % more L2
    bandwidth); else, and for the descriptors (shape, rates and a harness input, kept), :func:`die_inputs`. A row
    whose kernel was given rather than picked (GEMM tile columns, which override the tile rule row by row: its
    features are not the rule's on ``hw``) is that kernel on the sibling, :func:`die_inputs`' row."""
    operator = get_operator(op)
    virtual_features, virtual_described = die_inputs(op, features, described, hw, sibling)
    names = [f"shape_{column}" for column in operator.shape_columns]
    if described is None or not all(name in operator.descriptor_names for name in names):
        return virtual_features, virtual_described
    shape = {column: np.rint(np.asarray(described)[:, operator.descriptor_names.index(name)]).astype(np.int64)
             for column, name in zip(operator.shape_columns, names)}
    own = operator.features(shape, sibling)
    if operator.optional_columns:  # the kernel may have been given: only the rule's own rows take the sibling's rule
        picked = np.all(np.isclose(np.asarray(features, dtype=np.float64), operator.features(shape, hw), rtol=1e-9,
                                   atol=0.0), axis=1)
        own = np.where(picked[:, None], own, virtual_features)
    return own, virtual_described


def die_band(op: str, features: np.ndarray, described: np.ndarray | None, hw: HardwareSpec, sibling: HardwareSpec,
             sibling_efficiency: ModelEfficiency, sibling_rows: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) efficiency of ``hw``'s feature rows from the predicted efficiency of the same kernels on
    ``sibling`` (``sibling_efficiency(features, descriptors)``), a trained GPU of the same compute capability and SM
    count: the durations ``min ρ · t_s`` and ``max ρ · t_s`` in ``hw``'s terms, ``ρ`` the :func:`pipe_time_ratios`
    of the cycle columns a row uses (non-zero), 1 (a fixed time) and the clock ratio (a fixed number of cycles). The
    sibling's rows are ``sibling_rows`` (features, descriptors: :func:`die_rows`) where the caller has them, else
    :func:`die_inputs`'."""
    operator = get_operator(op)
    features = np.asarray(features, dtype=np.float64)
    virtual_features, virtual_described = (die_inputs(op, features, described, hw, sibling) if sibling_rows is None
                                           else sibling_rows)
    ideal = operator.ideal_cycles(features.astype(np.float32)).astype(np.float64)
    virtual_ideal = operator.ideal_cycles(virtual_features.astype(np.float32)).astype(np.float64)
    sibling_us = virtual_ideal / (sibling_efficiency(virtual_features, virtual_described) * sibling.sm_freq)
    fixed = np.array([1.0, sibling.sm_freq / hw.sm_freq])
    low = np.full(len(features), fixed.min())
    high = np.full(len(features), fixed.max())
    ratios = pipe_time_ratios(op, hw, sibling)
    for rows, names in ((features, operator.feature_names), (described, operator.descriptor_names)):
        if rows is None:
            continue
        for i, name in enumerate(names):
            if name in ratios:
                used = np.asarray(rows)[:, i] > 0
                low = np.where(used, np.minimum(low, ratios[name]), low)
                high = np.where(used, np.maximum(high, ratios[name]), high)
    # efficiency = ideal / (t × f): the longest time gives the lowest efficiency
    return ideal / (high * sibling_us * hw.sm_freq), ideal / (low * sibling_us * hw.sm_freq)


def die_note(what: str, gpu: str, sibling: str) -> str:
    """The line the command-line tools print where :func:`die_band` applies (``what``: an operator or category)."""
    return (f"Note: {what} on {gpu} is kept within the pipe-rate ratios of the same kernels on {sibling} (trained, "
            f"same SM design and SM count; docs/METHOD.md §4.3)")
