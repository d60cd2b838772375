"""FA3 calculator: FlashInfer's SM90 (Hopper) prefill kernel (docs/METHOD.md §3.7).

Models attention types containing "fa3" (in the workloads only "fa3_ragged" prefill on Hopper).  There
is no GQA packing: every query head is scheduled separately and nkv is unused.  Work tiles (request,
q tile, head pass) are placed by FlashInfer's cost-based min-heap scheduler.

Quirks kept on purpose (docs/METHOD.md §11.1 items 4-5): the trained attention model was fitted on features
computed this way, so they are *features, not bugs*:

* when ceil(Σq / cta_q) + B − 1 > 8192 only one head pass is scheduled ("same schedule for all
  heads"), under-counting the work by a factor nh;
* the heap breaks cost ties by the lowest SM id, and requests are *stably* sorted by kv descending —
  both decide the sm_max features and are replicated exactly;
* one KV tile (K or V) per iteration, Q once per task; KV reloads across the GQA group are counted.
"""
from __future__ import annotations

import numpy as np

from .attention_common import heap_schedule, task_pipes
from .pipes import AttentionProblem, HardwareSpec, ceil_div

HEAD_REPLICATION_LIMIT = 8192


def tile_sizes(problem: AttentionProblem, hw: HardwareSpec | None = None) -> tuple[int, int]:
    """(cta_q, cta_kv) by layout and head dim (hd_qk = hd_vo = hd)."""
    hd = problem.head_dim
    if problem.layout == "ragged":
        if hd == 64:
            return 192, 128
        if hd == 128:
            return (128, 128) if problem.causal else (128, 192)
        return 128, 64
    if hd == 64:
        return 192, 96
    if hd == 128:
        return 128, 96
    return 128, 32


def works(problem: AttentionProblem, cta_q: int) -> int:
    return int(ceil_div(sum(problem.q_lengths), cta_q)) + problem.batch_size - 1


def head_passes(problem: AttentionProblem, cta_q: int) -> int:
    """nh head passes, or a single one once the work count exceeds 8192 (quirk §11.1.5)."""
    return 1 if works(problem, cta_q) > HEAD_REPLICATION_LIMIT else problem.num_qo_heads


def tile_sequence(problem: AttentionProblem, cta_q: int, cta_kv: int) -> tuple[np.ndarray, np.ndarray]:
    """(it, heap cost delta) of every q tile of one head pass, in scheduling order."""
    order = sorted(range(problem.batch_size), key=lambda i: -problem.kv_lengths[i])  # stable
    its, deltas = [], []
    for i in order:
        q, kv = problem.q_lengths[i], problem.kv_lengths[i]
        t = np.arange(ceil_div(q, cta_q) - 1, -1, -1, dtype=np.int64)
        it = np.full(t.shape, ceil_div(kv, cta_kv), dtype=np.int64)
        if problem.causal:
            reach = (t + 1) * cta_q + kv - q
            it = np.minimum(it, ceil_div(reach, cta_kv))
            delta = cta_q * np.maximum(np.minimum(reach, kv), 0)
        else:
            delta = np.full(t.shape, cta_q * kv, dtype=np.int64)
        its.append(it)
        deltas.append(delta)
    return np.concatenate(its), np.concatenate(deltas)


def features(problem: AttentionProblem, hw: HardwareSpec) -> np.ndarray:
    cta_q, cta_kv = tile_sizes(problem, hw)
    passes = head_passes(problem, cta_q)
    its, deltas = tile_sequence(problem, cta_q, cta_kv)
    sm_ids = heap_schedule(deltas.tolist(), passes, hw.num_sms)
    hd = problem.head_dim
    return task_pipes(
        sm_ids,
        np.tile(its, passes),
        hw,
        mma=(0, 4 * cta_q * cta_kv * hd),
        # cta_q·cta_kv + (it − 1)·cta_q·(4 + cta_kv) + 8·cta_q
        xu=(cta_q * cta_kv - cta_q * (4 + cta_kv) + 8 * cta_q, cta_q * (4 + cta_kv)),
        nbytes=(cta_q * hd * problem.data_size_q, cta_kv * hd * problem.data_size_kv),
    )
