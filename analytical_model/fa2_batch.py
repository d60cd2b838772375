"""Batched FA2 features: many attention problems on one GPU in one vectorised pass.

:func:`analytical_model.fa2.features` handles one kernel launch; an end-to-end workload has one
attention launch per decode step (hundreds of distinct problems, because every step's KV lengths
grow by one). This module computes exactly the same 15 features for a list of problems at once by
flattening all requests (and then all CTAs) of all problems into single arrays tagged with their
problem index:

* the tile sizes, the split-KV binary search (run for all problems in lock step, each problem frozen
  once its search interval is closed), the CTA iteration counts and the effective static CTA→SM
  mapping follow :mod:`analytical_model.fa2` step by step on integers;
* per-(problem, SM) sums come from one ``np.bincount`` over ``problem * num_sms + sm``;
* the final float arithmetic is the same element-wise expressions as
  :func:`analytical_model.attention_common.task_pipes`, so the result is **bit-identical** to calling
  ``fa2.features`` on every problem (``tests/test_aggregator.py`` checks this on random batches).

:func:`features_from_arrays` mirrors :func:`analytical_model.fa2.features` step by step, one helper per step
(tile sizes, split-KV chunk, CTA iterations, per-SM sums); the steps share the flattened request arrays.

Integer intermediates are int64; a batch whose totals could approach 2**62 falls back to the
per-problem path (which uses Python integers), so the identity holds for every input.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from . import fa2
from .attention_common import ATTENTION_FEATURE_COUNT
from .pipes import AttentionProblem, HardwareSpec, ceil_div, compute_pipe, memory_pipe

_SAFE_LIMIT = 2**62


@lru_cache(maxsize=256)
def _cta_tile_kv(cta_q: int, head_dim: int, shared_memory_kb: float, ds_q: int, ds_kv: int) -> int:
    return fa2.cta_tile_kv(cta_q, head_dim, shared_memory_kb, ds_q, ds_kv)


_SM_TABLES: dict[int, np.ndarray] = {}


def _sm_table(num_sms: int, size: int) -> np.ndarray:
    """SM of launch position j (fa2.cta_sm_ids), for j < size; cached and grown per SM count."""
    table = _SM_TABLES.get(num_sms)
    if table is None or table.size < size:
        table = fa2.cta_sm_ids(max(size, 4 * num_sms, 2 * (0 if table is None else table.size)), num_sms)
        _SM_TABLES[num_sms] = table
    return table


def _segment_sum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(values, starts) if values.size else np.zeros(len(starts), dtype=values.dtype)


def features_many(problems: Sequence[AttentionProblem], hw: HardwareSpec) -> np.ndarray:
    """(len(problems), 15) float64 FA2 features, identical to ``fa2.features`` row by row."""
    count = len(problems)
    if count == 0:
        return np.zeros((0, ATTENTION_FEATURE_COUNT))
    as_array = lambda values: np.fromiter(values, dtype=np.int64, count=count)  # noqa: E731
    bs = as_array(p.batch_size for p in problems)
    n_req = int(bs.sum())
    return features_from_arrays(
        bs,
        np.fromiter((v for p in problems for v in p.q_lengths), dtype=np.int64, count=n_req),
        np.fromiter((v for p in problems for v in p.kv_lengths), dtype=np.int64, count=n_req),
        as_array(p.num_qo_heads for p in problems),
        as_array(p.num_kv_heads for p in problems),
        as_array(p.head_dim for p in problems),
        np.fromiter((p.layout == "paged" for p in problems), dtype=bool, count=count),
        hw,
        causal=np.fromiter((bool(p.causal) for p in problems), dtype=bool, count=count),
        ds_q=as_array(p.data_size_q for p in problems),
        ds_kv=as_array(p.data_size_kv for p in problems),
    )


def features_from_arrays(
    bs: np.ndarray,
    q: np.ndarray,
    kv: np.ndarray,
    nh: np.ndarray,
    nkv: np.ndarray,
    hd: np.ndarray,
    paged: np.ndarray,
    hw: HardwareSpec,
    *,
    causal=True,
    ds_q=2,
    ds_kv=2,
) -> np.ndarray:
    """FA2 features of problems given as arrays (no per-problem Python objects).

    ``bs``, ``nh``, ``nkv``, ``hd``, ``paged`` (bool) hold one entry per problem; ``q`` and ``kv`` are the
    concatenated per-request lengths of all problems (``bs.sum()`` entries). ``causal``, ``ds_q`` and
    ``ds_kv`` are scalars or per-problem arrays. Inputs must already be valid (positive integers,
    q <= kv, nkv dividing nh), as :class:`AttentionProblem` would enforce.
    """
    bs = np.asarray(bs, dtype=np.int64)
    count = int(bs.size)
    if count == 0:
        return np.zeros((0, ATTENTION_FEATURE_COUNT))
    per_problem = lambda v, dtype=np.int64: np.broadcast_to(np.asarray(v, dtype=dtype), (count,))  # noqa: E731
    nh, nkv, hd = (per_problem(v) for v in (nh, nkv, hd))
    ds_q, ds_kv = per_problem(ds_q), per_problem(ds_kv)
    paged, causal = per_problem(paged, bool), per_problem(causal, bool)
    q = np.asarray(q, dtype=np.int64)
    kv = np.asarray(kv, dtype=np.int64)
    n_req = int(bs.sum())
    if q.size != n_req or kv.size != n_req:
        raise ValueError(f"q and kv need bs.sum() = {n_req} entries, got {q.size} and {kv.size}")
    S = int(hw.num_sms)
    g = nh // nkv

    # requests of all problems, flattened: problem of each request and first request of each problem
    starts = np.concatenate([[0], np.cumsum(bs)[:-1]])
    req_prob = np.repeat(np.arange(count), bs)
    packed = q * g[req_prob]
    cta_q, cta_kv = _tile_sizes(packed, starts, bs, hd, ds_q, ds_kv, fa2._shared_memory_kb(hw))
    q_tiles = ceil_div(packed, cta_q[req_prob])
    # fa2.splits_kv per problem: a paged launch off Hopper / datacenter Blackwell splits only a GQA decode step
    splits = ~paged | fa2.packs_gqa_group(np.maximum.reduceat(q, starts), g) | hw.uses_sm90_gemm
    chunk = _kv_chunk_sizes(q_tiles, kv, starts, req_prob, paged, splits, nkv, S)
    its, tasks_r = _cta_iterations(q, kv, g, nkv, causal, cta_q, cta_kv, chunk, q_tiles, req_prob)
    counts, it_sums = _per_sm_sums(its, tasks_r, req_prob, count, S)

    n_total = counts.sum(axis=1)
    it_total = it_sums.sum(axis=1)
    mma_per_it = 4 * cta_q * cta_kv * hd
    if np.any(mma_per_it % 32):
        raise AssertionError("FA2: MMA FLOPs per iteration must be a multiple of 32")
    coefficients = {
        "mma": (np.zeros(count, dtype=np.int64), mma_per_it // 32 * 33),
        "xu": (fa2.XU_CONSTANT + cta_q, np.full(count, fa2.XU_PER_ITERATION, dtype=np.int64)),
        "bytes": (cta_q * hd * ds_q, cta_kv * hd * ds_kv),
    }
    largest = max(int(np.max(c)) * int(n_total.max()) + int(np.max(p)) * int(it_total.max())
                  for c, p in coefficients.values())
    if largest >= _SAFE_LIMIT:  # beyond int64 comfort: the per-problem path uses Python integers
        return np.vstack([fa2.features(p, hw) for p in _problems(bs, q, kv, nh, nkv, hd, paged, causal, ds_q, ds_kv)])

    totals = {}
    for name, (const, per_it) in coefficients.items():
        total = const * n_total + per_it * it_total
        sm_max = np.max(const[:, None] * counts + per_it[:, None] * it_sums, axis=1)
        totals[name] = (total.astype(np.float64), sm_max.astype(np.float64))
    return np.concatenate(
        [
            compute_pipe(*totals["mma"], hw.tc_bf16, S),
            compute_pipe(*totals["xu"], hw.xu_fp32, S),
            memory_pipe(*totals["bytes"], hw),
        ],
        axis=1,
    ).astype(np.float64)


def _tile_sizes(packed, starts, bs, hd, ds_q, ds_kv, smem: float) -> tuple[np.ndarray, np.ndarray]:
    """Steps 1-3, per problem: CTA_TILE_Q from the average packed length, CTA_TILE_KV (few distinct inputs)."""
    avg = _segment_sum(packed, starts) // bs
    cta_q = np.where((avg > 64) & (hd < 256), 128, np.where(avg > 16, 64, 16)).astype(np.int64)
    combo = np.stack([cta_q, hd, ds_q, ds_kv], axis=1)
    code = ((cta_q * (int(hd.max()) + 1) + hd) * (int(ds_q.max()) + 1) + ds_q) * (int(ds_kv.max()) + 1) + ds_kv
    _, first_index, inverse = np.unique(code, return_index=True, return_inverse=True)
    cta_kv = np.array([_cta_tile_kv(int(a), int(b), smem, int(c), int(d)) for a, b, c, d in combo[first_index]],
                      dtype=np.int64)[inverse.reshape(-1)]
    return cta_q, cta_kv


def _kv_chunk_sizes(q_tiles, kv, starts, req_prob, paged, splits, nkv, num_sms: int) -> np.ndarray:
    """Step 4, per problem: the split-KV chunk size, every problem's binary search run in lock step (a problem
    that does not split starts, and stays, at one chunk per request)."""
    min_chunk = np.maximum(128 // np.where(paged, 16, 1), 1).astype(np.int64)
    max_parallel = (2 * num_sms) // nkv
    kv_pos = np.maximum(kv, 1)
    high = np.maximum(1, np.maximum.reduceat(kv_pos, starts))
    low = np.where(splits, min_chunk, np.maximum(min_chunk, np.maximum.reduceat(kv, starts)))
    while True:
        active = low < high
        if not active.any():
            return low
        mid = (low + high) // 2
        work = _segment_sum(q_tiles * ceil_div(kv_pos, mid[req_prob]), starts)
        over = work > max_parallel
        low = np.where(active & over, mid + 1, low)
        high = np.where(active & ~over, mid, high)


def _cta_iterations(q, kv, g, nkv, causal, cta_q, cta_kv, chunk, q_tiles, req_prob) -> tuple[np.ndarray, np.ndarray]:
    """Step 5: iterations of every CTA of every problem, and the number of CTAs of each request.

    CTAs run request-major, then q tile, then KV chunk, one CTA per KV head. For one (request, q tile) with
    causal reach L = min(kv, kv - q + ceil((t+1)·cta_q / g)) (L = kv if not causal), chunk c covers
    z = min(chunk, max(L - c·chunk, 0)) keys: the first m - 1 chunks (m = ceil(L / chunk)) are full, chunk
    m - 1 holds the rest and later chunks are empty. So the iteration counts along the launch order are
    piecewise constant and are built from run boundaries with one cumulative sum instead of per-CTA arithmetic.
    """
    nkv_r = nkv[req_prob]
    chunk_r = chunk[req_prob]
    n_chunks = ceil_div(kv, chunk_r)
    tasks_r = q_tiles * n_chunks * nkv_r
    task_base_r = np.cumsum(tasks_r) - tasks_r
    total_tasks = int(tasks_r.sum())
    rt_req = np.repeat(np.arange(kv.size), q_tiles)
    t = np.arange(rt_req.size, dtype=np.int64) - np.repeat(np.cumsum(q_tiles) - q_tiles, q_tiles)
    rt_prob = req_prob[rt_req]
    kv_rt = kv[rt_req]
    chunk_rt = chunk_r[rt_req]
    nkv_rt = nkv_r[rt_req]
    reach = kv_rt - q[rt_req] + ceil_div((t + 1) * cta_q[rt_prob], g[rt_prob])
    L = np.where(causal[rt_prob], np.minimum(kv_rt, reach), kv_rt)
    m = ceil_div(L, chunk_rt)
    cta_kv_rt = cta_kv[rt_prob]
    full = ceil_div(chunk_rt, cta_kv_rt)
    last = ceil_div(L - (m - 1) * chunk_rt, cta_kv_rt)
    p0 = task_base_r[rt_req] + t * n_chunks[rt_req] * nkv_rt
    p1 = p0 + (m - 1) * nkv_rt
    p2 = p1 + nkv_rt
    # integer-valued float64 throughout (far below 2**53), so the cumulative sum is exact
    steps = np.bincount(
        np.concatenate([p0, p1, p2]),
        weights=np.concatenate([full, last - full, -last]).astype(np.float64),
        minlength=total_tasks + 1,
    )
    return np.cumsum(steps[:total_tasks]), tasks_r


def _per_sm_sums(its, tasks_r, req_prob, count: int, num_sms: int) -> tuple[np.ndarray, np.ndarray]:
    """Step 6 and task_pipes: per (problem, SM), the CTAs with iterations and their iteration sum.

    Position j of a CTA inside its problem's launch order gives its SM by the effective static CTA→SM mapping.
    """
    tasks_per_prob = np.bincount(req_prob, weights=tasks_r, minlength=count).astype(np.int64)
    task_start = np.cumsum(tasks_per_prob) - tasks_per_prob
    j = np.arange(its.size, dtype=np.int64) - np.repeat(task_start, tasks_per_prob)
    key = (_sm_table(num_sms, int(tasks_per_prob.max()))[j]
           + np.repeat(np.arange(count, dtype=np.int64) * num_sms, tasks_per_prob))
    shape = (count, num_sms)
    counts = np.rint(np.bincount(key, weights=(its > 0), minlength=count * num_sms)).astype(np.int64).reshape(shape)
    it_sums = np.rint(np.bincount(key, weights=its, minlength=count * num_sms)).astype(np.int64).reshape(shape)
    return counts, it_sums


def _problems(bs, q, kv, nh, nkv, hd, paged, causal, ds_q, ds_kv) -> list[AttentionProblem]:
    ends = np.cumsum(bs)
    out = []
    for i, end in enumerate(ends):
        start = end - bs[i]
        out.append(AttentionProblem(
            batch_size=int(bs[i]), q_lengths=tuple(q[start:end].tolist()), kv_lengths=tuple(kv[start:end].tolist()),
            num_qo_heads=int(nh[i]), num_kv_heads=int(nkv[i]), head_dim=int(hd[i]),
            layout="paged" if paged[i] else "ragged", causal=bool(causal[i]),
            data_size_q=int(ds_q[i]), data_size_kv=int(ds_kv[i]),
        ))
    return out
