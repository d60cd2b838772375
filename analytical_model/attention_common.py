"""Building blocks shared by the four attention calculators (docs/METHOD.md §3.5).

Every attention calculator reduces a kernel launch to a list of *tasks* (CTAs or work tiles), each with an
iteration count ``it`` (KV tiles processed) and the SM it runs on.  In all four calculators the per-task
MMA FLOPs, XU ops and loaded bytes are affine in ``it`` (``const + per_it * it``) and only tasks with
``it > 0`` contribute, so the per-SM sums only need, per SM, the number of contributing tasks and the sum of
their ``it``.  That keeps the arithmetic exact (integers) and vectorised (``np.bincount``).

The min-heap scheduler of FA3 and FA-CUTLASS is sequential by nature; :func:`heap_schedule` runs it with
(cost, sm_id) packed into one integer so that one C-level ``heapq.heapreplace`` per task does the work.
"""
from __future__ import annotations

import heapq

import numpy as np

from .pipes import HardwareSpec, compute_pipe, memory_pipe

ATTENTION_FEATURE_COUNT = 15


def task_pipes(
    sm_ids: np.ndarray,
    its: np.ndarray,
    hw: HardwareSpec,
    *,
    mma: tuple[int, int],
    xu: tuple[int, int],
    nbytes: tuple[int, int],
) -> np.ndarray:
    """The 15 attention features from a task list.

    ``sm_ids``/``its`` give, for every task, its SM and iteration count (tasks with ``it <= 0`` are
    ignored).  ``mma``, ``xu`` and ``nbytes`` are ``(const, per_it)`` pairs: a contributing task costs
    ``const + per_it * it``.  Totals are summed over all tasks, sm_max is the largest per-SM sum, taken
    separately for each quantity (docs/METHOD.md §3.0).
    """
    sm_ids = np.asarray(sm_ids, dtype=np.int64)
    its = np.asarray(its, dtype=np.int64)
    active = its > 0
    if not active.all():
        sm_ids = sm_ids[active]
        its = its[active]
    num_sms = int(hw.num_sms)
    counts = np.bincount(sm_ids, minlength=num_sms).astype(np.int64)
    # Float weights, but the sums are integers far below 2**53, so the round trip is exact.
    it_sums = np.rint(np.bincount(sm_ids, weights=its, minlength=num_sms)).astype(np.int64)
    n_total = int(its.size)
    it_total = int(its.sum(dtype=np.int64))

    def totals(coeffs: tuple[int, int]) -> tuple[int, int]:
        const, per_it = (int(c) for c in coeffs)
        total = const * n_total + per_it * it_total
        sm_max = int(np.max(const * counts + per_it * it_sums)) if num_sms else 0
        return total, sm_max

    mma_total, mma_sm = totals(mma)
    xu_total, xu_sm = totals(xu)
    bytes_total, bytes_sm = totals(nbytes)
    return np.concatenate(
        [
            compute_pipe(float(mma_total), float(mma_sm), hw.tc_bf16, num_sms),
            compute_pipe(float(xu_total), float(xu_sm), hw.xu_fp32, num_sms),
            memory_pipe(float(bytes_total), float(bytes_sm), hw),
        ]
    ).astype(np.float64)


def heap_schedule(deltas, passes: int, num_sms: int) -> np.ndarray:
    """SM id of every task under the min-heap scheduler of FA3 / FA-CUTLASS.

    ``num_sms`` buckets start at cost 0; for each task (the ``deltas`` sequence, repeated ``passes``
    times) the bucket with the lowest (cost, id) is popped — ties go to the lowest id — the task is
    placed there and the bucket is pushed back with its cost increased by the task's delta (which may
    be 0).  Costs are non-negative integers; packing ``(cost << shift) | id`` into one integer orders
    exactly like the (cost, id) tuple.  FA-CUTLASS keeps float costs in the reference, but they are
    integer-valued and far below 2**53, so integer arithmetic gives the identical schedule.
    """
    shift = max(int(num_sms - 1).bit_length(), 1)
    mask = (1 << shift) - 1
    shifted = [int(d) << shift for d in deltas]
    heap = list(range(num_sms))  # cost 0, ids 0..S-1: already a valid heap
    replace = heapq.heapreplace
    popped: list[int] = []
    extend = popped.extend
    for _ in range(passes):
        # heapreplace pops the minimum (heap[0], read before the call) and pushes it back plus delta.
        extend([replace(heap, heap[0] + d) for d in shifted])
    if not popped:
        return np.zeros(0, dtype=np.int64)
    try:
        keys = np.array(popped, dtype=np.int64)
    except OverflowError:  # astronomically large costs: fall back to Python ints
        return np.array([k & mask for k in popped], dtype=np.int64)
    return keys & mask
