"""Fused RMSNorm, one CTA per token row (docs/METHOD.md §3.10).

Instruction counts are warp-level with the artifact's empirical multipliers; they are divided by
per-lane throughputs, so efficiencies come out around 1e-5..1e-3 (quirk §11.1.8). Kept because the
features and the ``overall_perf`` target are defined on this scale; the learned model absorbs it.
"""
from __future__ import annotations

import numpy as np

from .pipes import ElementwiseProblem, HardwareSpec, ceil_div, row_kernel_features

FMA_CALIBRATION = 1.616838
XU_CALIBRATION = 1.666667


def per_cta_counts(dim: np.ndarray, dtype_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(FMA-pipe ops, XU ops) of one CTA normalising a row of ``dim`` elements."""
    vec = np.gcd(16 // dtype_size, dim)
    block = np.minimum(1024, np.maximum(1, dim // vec))
    warps = ceil_div(block, 32)
    rounds = ceil_div(dim, vec * block)
    per_thread = rounds * vec * warps
    fadd = per_thread + (5 * warps + 5) + per_thread
    fmul = 2 * per_thread
    ffma = per_thread + warps
    mufu = 3 * warps
    rem = dim % (block * vec)
    tail = np.minimum(rem, block)
    has_rem = rem > 0
    fadd = fadd + np.where(has_rem, ceil_div(3 * tail, 32), 0)
    mufu = mufu + np.where(has_rem, ceil_div(tail, 32), 0)
    return (fadd + fmul + ffma) * FMA_CALIBRATION, mufu * XU_CALIBRATION


def features(problem: ElementwiseProblem, hw: HardwareSpec) -> np.ndarray:
    fma, xu = per_cta_counts(problem.dim, problem.dtype_size)
    return row_kernel_features(problem, fma, xu, hw)
