"""FA-CK calculator: AMD Composable-Kernel FMHA forward (docs/METHOD.md §3.8; not used end-to-end).

For ROCm MI-series GPUs ("SM" = compute unit).  Tasks are (batch, head, q tile) in that order and are
dealt round-robin over the SMs; heads = nh (nkv unused).

Quirks kept on purpose (docs/METHOD.md §11.1 items 4 and 6), so that features match the reference
calculator bit for bit (*features, not fixes*):

* only uniform batches are supported (all q equal, all kv equal), anything else is a ValueError;
* the causal mask uses a top-left aligned diagonal, ignoring the kv − q offset;
* kM0 = 128 (the reference documentation disagrees); K *and* V tiles are counted per iteration.
"""
from __future__ import annotations

import numpy as np

from .attention_common import task_pipes
from .pipes import AttentionProblem, HardwareSpec, ceil_div

TILE_M0 = 128


def tile_sizes(problem: AttentionProblem, hw: HardwareSpec | None = None) -> tuple[int, int]:
    """(kM0, kN0)."""
    hd = problem.head_dim
    if hd <= 64:
        return TILE_M0, 64
    if hd == 128:
        return TILE_M0, 128
    if hd <= 192:
        return TILE_M0, 64
    return TILE_M0, 32


def uniform_lengths(problem: AttentionProblem) -> tuple[int, int]:
    """(sq, sk); raises ValueError naming the field when lengths differ across the batch."""
    for name in ("q_lengths", "kv_lengths"):
        values = getattr(problem, name)
        if any(v != values[0] for v in values):
            raise ValueError(f"FA-CK requires uniform {name} (all entries equal), got {list(values)!r}")
    return problem.q_lengths[0], problem.kv_lengths[0]


def tile_iterations(problem: AttentionProblem, m0: int, n0: int) -> np.ndarray:
    """n_t of the q tiles t = 0..ceil(sq / kM0) − 1 of one (batch, head)."""
    sq, sk = uniform_lengths(problem)
    n_k = ceil_div(sk, n0)
    t = np.arange(ceil_div(sq, m0), dtype=np.int64)
    if problem.causal:
        return np.minimum(ceil_div(np.minimum((t + 1) * m0, sq), n0), n_k)
    return np.full(t.shape, n_k, dtype=np.int64)


def features(problem: AttentionProblem, hw: HardwareSpec) -> np.ndarray:
    m0, n0 = tile_sizes(problem, hw)
    per_head = tile_iterations(problem, m0, n0)
    its = np.tile(per_head, problem.batch_size * problem.num_qo_heads)
    its = its[its > 0]  # the round-robin pointer only advances on recorded tasks
    sm_ids = np.arange(its.size, dtype=np.int64) % hw.num_sms
    hd = problem.head_dim
    return task_pipes(
        sm_ids,
        its,
        hw,
        mma=(0, 4 * m0 * n0 * hd),
        xu=(m0 * hd, m0 * n0 + 2 * m0),
        nbytes=(m0 * hd * problem.data_size_q, 2 * n0 * hd * problem.data_size_kv),
    )
