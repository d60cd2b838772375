"""BF16 GEMM on SM80-class GPUs (Ampere, Ada, Blackwell workstation): mma.sync tiles, split-K grids.

docs/METHOD.md §3.2. ``cta_count`` is always read as a split-K grid (``is_split_k`` is ignored), and the
busiest SM runs ``waves`` CTAs, each covering a ``k_slice`` of the reduction.
"""
from __future__ import annotations

import numpy as np

from .pipes import GemmProblem, HardwareSpec, ceil_div, compute_pipe, memory_pipe, stack_features


def features(problem: GemmProblem, hw: HardwareSpec) -> np.ndarray:
    p = problem
    _, k_slice = p.split_k_slice()
    waves = ceil_div(p.cta_count, hw.num_sms)
    tile_flops = 2.0 * p.tile_m * p.tile_n * k_slice
    bytes_sm = p.data_size_bytes * (p.tile_m * k_slice + p.tile_n * k_slice) * waves
    return stack_features(
        compute_pipe(p.flops_padded, tile_flops * waves, hw.tc_bf16, hw.num_sms),
        memory_pipe(p.bytes_total, bytes_sm, hw),
    )
