"""FA3 calculator: FlashInfer's SM90 (Hopper) prefill kernel (docs/METHOD.md §3.7).

Models attention types containing "fa3" (in the workloads only "fa3_ragged" prefill on Hopper).  Work tiles
(request, q tile, head pass) are placed by FlashInfer's cost-based min-heap scheduler.

GQA packing (a deliberate change, README "Differences"): the artifact schedules every query head separately
and ignores nkv (docs/METHOD.md §11.1.5). The ragged (prefill) kernel that the Hopper measurements ran, vLLM's
FA3 varlen kernel, packs the query heads of a GQA group into the rows of a tile (``PackGQA``, always on for a
varlen launch): a head pass per KV head, q·g rows per request (g = nh / nkv). Measured (aiconfigurator-core,
vLLM 0.24, H100 and H200), 32 one-token prefills of 64 query heads take 10.8–11.1 µs with 1, 2 or 4 KV heads, 14.0 µs
with 8 and 52.4 µs with 64: 32·nkv packed tiles, one wave up to 132, 16 waves at 2,048. Unpacked, every
launch is 2,048 tiles and the features do not move. For long prompts both count the same tiles and
iterations; they differ where q·g is not a multiple of cta_q. The paged layout keeps the artifact's rule, which
docs/METHOD.md's worked example A.7 fixes.

Quirks kept on purpose (docs/METHOD.md §11.1 items 4-5):

* unpacked (paged), when ceil(Σq / cta_q) + B − 1 > 8192 only one head pass is scheduled ("same schedule
  for all heads"), under-counting the work by a factor nh; a packed launch has no such switch (vLLM's kernel
  schedules every tile);
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


def packs_gqa(problem: AttentionProblem) -> bool:
    """Whether the launch packs each GQA group into the rows of its tiles: ragged (varlen) launches do."""
    return problem.layout == "ragged"


def rows_per_query(problem: AttentionProblem) -> int:
    """Tile rows per query token: the GQA group size g = nh / nkv where the launch packs it, else 1."""
    return problem.num_qo_heads // problem.num_kv_heads if packs_gqa(problem) else 1


def works(problem: AttentionProblem, cta_q: int) -> int:
    return int(ceil_div(sum(problem.q_lengths), cta_q)) + problem.batch_size - 1


def head_passes(problem: AttentionProblem, cta_q: int) -> int:
    """nkv head passes where the launch packs GQA; else nh, or a single one once the work count exceeds 8192
    (quirk §11.1.5)."""
    if packs_gqa(problem):
        return problem.num_kv_heads
    return 1 if works(problem, cta_q) > HEAD_REPLICATION_LIMIT else problem.num_qo_heads


def tile_sequence(problem: AttentionProblem, cta_q: int, cta_kv: int) -> tuple[np.ndarray, np.ndarray]:
    """(it, heap cost delta) of every q tile of one head pass, in scheduling order. A packed tile's rows are
    (query token, head of the group) with the head fastest, so its causal reach is set by its last token."""
    order = sorted(range(problem.batch_size), key=lambda i: -problem.kv_lengths[i])  # stable
    g = rows_per_query(problem)
    its, deltas = [], []
    for i in order:
        q, kv = problem.q_lengths[i], problem.kv_lengths[i]
        t = np.arange(ceil_div(q * g, cta_q) - 1, -1, -1, dtype=np.int64)
        it = np.full(t.shape, ceil_div(kv, cta_kv), dtype=np.int64)
        if problem.causal:
            reach = ((t + 1) * cta_q - 1) // g + 1 + kv - q
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
