"""SiLU(gate)·up activation, one CTA per token row (docs/METHOD.md §3.11).

``dim`` is the input width (gate|up concatenated, 2·I/TP in workloads). Per-element FMA and XU costs
carry the artifact's empirical multipliers; see rmsnorm.py for why the scale is kept.
"""
from __future__ import annotations

import numpy as np

from .pipes import ElementwiseProblem, HardwareSpec, ceil_div, row_kernel_features

VEC = 8
FMA_PER_ELEMENT = 4 * 1.71875
XU_PER_ELEMENT = 2 * 1.1875


def features(problem: ElementwiseProblem, hw: HardwareSpec) -> np.ndarray:
    dim = problem.dim
    if np.any(dim < VEC):
        raise ValueError(f"dim must be at least {VEC} for SiLU*Mul, got {dim[dim < VEC].ravel()[0]}")
    block = np.minimum(1024, dim // VEC)
    warps = ceil_div(block, 32)
    elements = ceil_div(dim // VEC, block) * VEC
    fma = elements * FMA_PER_ELEMENT * warps
    xu = elements * XU_PER_ELEMENT * warps
    rem = dim % (block * VEC)
    tail = np.where(rem > 0, np.minimum(rem, block), 0)
    fma = fma + tail * FMA_PER_ELEMENT
    xu = xu + tail * XU_PER_ELEMENT
    return row_kernel_features(problem, fma, xu, hw)
