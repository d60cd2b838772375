"""One GEMM pass of vLLM/SGLang's Triton fused-MoE kernel (docs/METHOD.md §3.12).

Routing is assumed perfectly balanced (round-robin over experts); each expert's token count is
padded to the block size BM, and CTAs are dealt uniformly over SMs. BK and GROUP_M of the tiling
heuristic do not enter the features and are therefore not computed.
"""
from __future__ import annotations

import numpy as np

from .pipes import HardwareSpec, MoeProblem, ceil_div, compute_pipe, memory_pipe, stack_features


def block_sizes(m: np.ndarray, experts: np.ndarray, hidden: np.ndarray, smem_kb: float):
    """(BM, BN) of the Triton heuristic for ``m`` tokens on a GPU with ``smem_kb`` KiB shared memory per SM."""
    if smem_kb <= 100:
        bm_mid, bm_large = 128, np.where(experts < 64, 64, 128)
        bn = np.where(hidden <= 1536, np.where(m <= 128, 16, 64), 64)
    elif smem_kb <= 164:
        bm_mid, bm_large = 64, np.full_like(m, 64)
        bn = np.full_like(m, 128)
    else:
        bm_mid, bm_large = 128, np.full_like(m, 128)
        bn = np.full_like(m, 128)
    bm = np.select([m <= 128, m <= 256, m <= 512, m <= 2048], [16, 32, 64, bm_mid], default=bm_large)
    return bm, bn


def padded_tokens(m, experts, top_k, bm):
    """Σ over experts of the expert's token count rounded up to BM, under balanced routing."""
    slots = m * top_k
    base, extra = slots // experts, slots % experts
    return (experts - extra) * (ceil_div(base, bm) * bm) + extra * (ceil_div(base + 1, bm) * bm)


def features(problem: MoeProblem, hw: HardwareSpec) -> np.ndarray:
    if hw.shared_memory_size is None:
        raise ValueError(f"{hw.stem}: the Triton MoE heuristic needs sharedMemorySize in the hardware JSON")
    p = problem
    bm, bn = block_sizes(p.m, p.experts, p.hidden, hw.shared_memory_size)
    tokens = padded_tokens(p.m, p.experts, p.top_k, bm)
    # bytes in float64: at the shape limits (2^30 routed tokens, H = N = 2^20) CTAs x bytes per CTA pass 2^63, and
    # int64 wrapped to negative or zero DRAM traffic
    size = float(p.data_size_bytes)
    if p.pass_type == "w13":
        grid = ceil_div(tokens, bm) * ceil_div(2 * p.inter, bn)
        flops = 2.0 * tokens * (2 * p.inter) * p.hidden
        cta_bytes = (bm * p.hidden + p.hidden * bn) * size
    else:
        grid = ceil_div(tokens, bm) * ceil_div(p.hidden, bn)
        flops = 2.0 * tokens * p.hidden * p.inter
        cta_bytes = (bm * p.inter + p.inter * bn) * size
    busiest = ceil_div(grid, hw.num_sms)
    flops_per_cta = flops / grid
    return stack_features(
        compute_pipe(flops, flops_per_cta * busiest, hw.tc_bf16, hw.num_sms),
        memory_pipe(cta_bytes * grid, cta_bytes * busiest, hw),
    )
