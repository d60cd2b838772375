"""FA-CUTLASS calculator: FlashInfer's CUTLASS SM100 (B200) FMHA (docs/METHOD.md §3.9; not used end-to-end).

Work tiles (head, request, q tile) go to S cost-based buckets (a min-heap, ties to the lowest bucket id);
heads are scheduled separately (nkv unused) and requests keep input order.

Quirks kept on purpose (docs/METHOD.md §11.1 item 4), so that features match the reference calculator bit
for bit (*features, not fixes*): one KV tile (K or V) per iteration, Q once per task, and the causal
extent of q tile t is kv − (n_tiles − t − 1)·cta_q (tiles counted back from the last one).
"""
from __future__ import annotations

import numpy as np

from .attention_common import heap_schedule, task_pipes
from .pipes import AttentionProblem, HardwareSpec, ceil_div


def tile_sizes(problem: AttentionProblem, hw: HardwareSpec | None = None) -> tuple[int, int]:
    """(cta_q, cta_kv) by head dim."""
    hd = problem.head_dim
    if hd == 64:
        return 128, 128
    if hd == 128:
        return (128, 64) if problem.causal else (128, 96)
    if hd == 192:
        return 128, 64
    return 128, 32


def tile_extents(problem: AttentionProblem, cta_q: int) -> np.ndarray:
    """KV extent e of every q tile of one head pass, in scheduling order (t descending per request)."""
    extents = []
    for q, kv in zip(problem.q_lengths, problem.kv_lengths):
        n_tiles = ceil_div(q, cta_q)
        t = np.arange(n_tiles - 1, -1, -1, dtype=np.int64)
        if problem.causal:
            extents.append(np.maximum(0, kv - (n_tiles - t - 1) * cta_q))
        else:
            extents.append(np.full(t.shape, kv, dtype=np.int64))
    return np.concatenate(extents)


def features(problem: AttentionProblem, hw: HardwareSpec) -> np.ndarray:
    cta_q, cta_kv = tile_sizes(problem, hw)
    extents = tile_extents(problem, cta_q)
    passes = problem.num_qo_heads
    sm_ids = heap_schedule((cta_q * extents).tolist(), passes, hw.num_sms)
    its = np.tile(ceil_div(extents, cta_kv), passes)  # e = 0 -> it = 0 -> not recorded
    hd = problem.head_dim
    return task_pipes(
        sm_ids,
        its,
        hw,
        mma=(0, 4 * cta_q * cta_kv * hd),
        xu=(cta_q * cta_kv - cta_q * (4 + cta_kv) + 8 * cta_q, cta_q * (4 + cta_kv)),
        nbytes=(cta_q * hd * problem.data_size_q, cta_kv * hd * problem.data_size_kv),
    )
