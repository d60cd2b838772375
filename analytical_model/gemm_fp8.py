"""FP8 GEMM (Hopper CUTLASS-style 128x128x128 tiles, one byte per element). docs/METHOD.md §3.4.

``cta_count`` and ``is_split_k`` are ignored: every output tile is one CTA and the busiest SM runs
``ceil(tiles / SMs)`` waves of full-K tiles.
"""
from __future__ import annotations

import numpy as np

from .pipes import GemmProblem, HardwareSpec, ceil_div, compute_pipe, memory_pipe, stack_features

FP8_TILE = 128


def missing_rate(hw: HardwareSpec) -> str | None:
    """Why no FP8 GEMM can be predicted on ``hw`` (None if one can): the one reason, shared with the aggregator, which
    gives it before any memory check (no TP makes an FP8 workload run on such a GPU)."""
    if hw.tc_fp8:
        return None
    return (f"{hw.stem} has no FP8 tensor-core rate (tcFp8) in its hardware JSON (add the dense FP8 rate with FP32 "
            f"accumulation and its source if the GPU has FP8 tensor cores)")


def features(problem: GemmProblem, hw: HardwareSpec) -> np.ndarray:
    p = problem
    missing = missing_rate(hw)
    if missing:
        raise ValueError(missing)
    waves = ceil_div(p.output_tiles, hw.num_sms)
    k_p = p.k_padded
    tile_flops = 2.0 * p.tile_m * p.tile_n * k_p
    bytes_sm = p.data_size_bytes * (p.tile_m + p.tile_n) * k_p * waves
    return stack_features(
        compute_pipe(p.flops_padded, tile_flops * waves, hw.tc_fp8, hw.num_sms),
        memory_pipe(p.bytes_total, bytes_sm, hw),
    )
