"""BF16 GEMM on Hopper-style GPUs (TMA + warpgroup MMA): split-K or persistent data-parallel kernels.

docs/METHOD.md §3.3. The split-K branch assumes one wave (no wave multiplier, quirk §11.1.7, kept because
the features define what the model learned). The persistent branch gives each CTA
``ceil(tiles / cta_count)`` output tiles; ``cta_count`` above the tile count replicates work.
"""
from __future__ import annotations

import numpy as np

from .pipes import GemmProblem, HardwareSpec, ceil_div, compute_pipe, memory_pipe, stack_features


def features(problem: GemmProblem, hw: HardwareSpec) -> np.ndarray:
    p = problem
    tiles = p.output_tiles
    k_p = p.k_padded
    split = p.is_split_k
    _, k_slice = p.split_k_slice()
    tiles_per_cta = ceil_div(tiles, p.cta_count)
    replication = np.maximum(1.0, p.cta_count / tiles)

    split_sm_flops = 2.0 * p.tile_m * p.tile_n * k_slice
    split_bytes_sm = p.data_size_bytes * (p.tile_m + p.tile_n) * k_slice
    persistent_sm_flops = 2.0 * p.tile_m * p.tile_n * k_p * tiles_per_cta
    persistent_bytes_sm = p.data_size_bytes * (p.tile_m + p.tile_n) * k_p * tiles_per_cta

    flops = np.where(split, p.flops_padded, p.flops_padded * replication)
    sm_flops = np.where(split, split_sm_flops, persistent_sm_flops)
    bytes_sm = np.where(split, split_bytes_sm, persistent_bytes_sm)
    return stack_features(
        compute_pipe(flops, sm_flops, hw.tc_bf16, hw.num_sms),
        memory_pipe(p.bytes_total, bytes_sm, hw),
    )
