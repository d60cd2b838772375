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
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from analytical_model.pipes import HardwareSpec
from analytical_model.registry import TENSOR_RATE_COLUMNS, get_operator

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
    operator = get_operator(op)

    def scaled(rows: np.ndarray | None, names: tuple[str, ...]) -> np.ndarray | None:
        if rows is None:
            return None
        rows = np.array(rows, dtype=np.float64)
        for i, name in enumerate(names):
            if name in TENSOR_RATE_COLUMNS:
                rows[:, i] *= scale
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
