"""Batch schedulers: what each iteration computes.

A scheduler holds the waiting queue and the running list. ``schedule()`` returns the next micro-batch as
entries ``(request, new_tokens, context_len, epoch, samples)``: the request computes ``new_tokens`` tokens whose
KV lengths end at ``context_len``; ``samples`` says whether the step ends the request's pending tokens and so
yields a generated token. ``complete()`` applies a finished micro-batch and returns the requests it finished.

* ``StaticScheduler``: the static batch of ``pipeweave.workload`` (docs/METHOD.md §6): when nothing runs, every waiting
  request (up to ``max_num_seqs``) is admitted; one prefill iteration of all full prompts, then one decode
  iteration per further token, the batch shrinking as requests finish; no token budget and no KV paging (``admit``
  checks that each batch fits in memory as a whole).
* ``VllmScheduler``: vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py``, v0.10.1) with FCFS policy. Running
  requests first, in order, each taking ``num_tokens - num_computed_tokens`` tokens (a decode: 1; a partial
  prefill: its remainder) within the step's ``max_num_batched_tokens`` budget; when KV blocks run out the last
  running request is preempted (recompute: its blocks are freed, it returns to the front of the queue and later
  recomputes prompt and generated tokens, less the prefix its blocks still cache when it is readmitted:
  :class:`pipeweave.serving.kv_cache.BlockManager`). Then, if nothing was preempted, waiting requests are admitted
  in order
  while budget, ``max_num_seqs`` and free blocks allow, their prompts chunked to the remaining budget (chunked
  prefill mixes with decodes). ``num_computed_tokens`` advances when a request is scheduled, so with pipeline
  parallelism a request whose token is still in flight is skipped (decode) or gets its next chunk (prefill).
  Prefix caching (on in vLLM) shares nothing between requests here (trace requests have no token ids), only a
  preempted request's own cached blocks.
"""
from __future__ import annotations

import copy
import itertools
from collections import deque

from pipeweave.serving.kv_cache import BlockManager, UnlimitedBlocks

#: vLLM V1 defaults (v0.10.1 ``EngineArgs._set_default_args_v1``), by usage context and whether the GPU is large:
#: >= 70 GiB and not an A100 (vLLM excludes A100s by device name, for both usages: the larger token budget lowered
#: their throughput, vLLM PR #17885).
VLLM_DEFAULTS = {
    ("serve", True): {"max_num_batched_tokens": 8192, "max_num_seqs": 1024},
    ("serve", False): {"max_num_batched_tokens": 2048, "max_num_seqs": 256},
    ("offline", True): {"max_num_batched_tokens": 16384, "max_num_seqs": 1024},
    ("offline", False): {"max_num_batched_tokens": 8192, "max_num_seqs": 256},
}
LARGE_GPU_BYTES = 70 * 2**30
SPECULATIVE_WAITING = 512


def vllm_defaults(gpu_memory_bytes: int, device_name: str, usage: str = "serve") -> dict:
    """vLLM's defaults for ``vllm serve`` (usage "serve") or the ``LLM`` class / latency benchmark ("offline") on a GPU
    of ``gpu_memory_bytes`` whose driver name is ``device_name`` (before max_num_seqs is capped by the token budget)."""
    large = gpu_memory_bytes >= LARGE_GPU_BYTES and "a100" not in device_name.lower()
    return dict(VLLM_DEFAULTS[(usage, large)])


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.waiting: deque = deque()
        self.running: list = []

    def add(self, request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def speculative_copy(self, copy_of) -> "Scheduler":
        """An independent copy holding ``copy_of(request)`` for each request, for the simulator's look-ahead. A long
        queue is cut to its first ``SPECULATIVE_WAITING`` requests: the look-ahead only chooses what to predict, and
        one that would admit more simply foresees less."""
        other = copy.copy(self)
        other.blocks = self.blocks.copy()
        other.waiting = deque(map(copy_of, itertools.islice(self.waiting, SPECULATIVE_WAITING)))
        other.running = list(map(copy_of, self.running))
        return other

    @staticmethod
    def _entry(request, new_tokens: int) -> tuple:
        computed = request.num_computed + new_tokens
        request.num_computed = computed
        return request, new_tokens, computed, request.epoch, computed >= request.num_tokens

    def complete(self, entries, now: float) -> list:
        """Apply a finished micro-batch at time ``now``; returns the requests that finished."""
        finished = []
        for request, _, _, epoch, samples in entries:
            if not samples or epoch != request.epoch:
                continue  # no token, or preempted since (its result is discarded)
            request.num_output += 1
            if request.first_token_ms is None:
                request.first_token_ms = now
            if request.num_output >= request.output_tokens:  # finished
                request.finish_ms = now
                finished.append(request)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
            for request in finished:
                self.blocks.release(request)
        return finished


class StaticScheduler(Scheduler):
    def __init__(self, max_num_seqs: int | None = None, admit=None):
        super().__init__(UnlimitedBlocks(), max_num_seqs or 2**62)
        self.admit = admit  # called with each batch admitted (run.py: the memory check, which raises)

    def speculative_copy(self, copy_of) -> "StaticScheduler":
        other = super().speculative_copy(copy_of)
        other.admit = None  # the look-ahead runs on estimated durations: its batches may never be admitted
        return other

    def schedule(self) -> list:
        if not self.running:
            while self.waiting and len(self.running) < self.max_num_seqs:
                self.running.append(self.waiting.popleft())
            if self.running and self.admit is not None:
                self.admit(self.running)
        return [self._entry(r, r.num_tokens - r.num_computed) for r in self.running
                if r.num_tokens > r.num_computed]


class VllmScheduler(Scheduler):
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        super().__init__(blocks, max_num_seqs)
        self.max_num_batched_tokens = max_num_batched_tokens

    def _preempt(self, request) -> None:
        self.blocks.release(request, min(request.num_computed, request.num_tokens))
        request.num_computed = 0
        request.epoch += 1
        request.preemptions += 1
        self.waiting.appendleft(request)

    def schedule(self) -> list:
        budget = self.max_num_batched_tokens
        entries = []
        preempted = False
        running, allocate, block_size = self.running, self.blocks.allocate, self.blocks.block_size
        i = 0
        while i < len(running) and budget > 0:  # the hot loop of a simulation: attributes read inline
            request = running[i]
            i += 1
            computed = request.num_computed
            new = request.prompt_tokens + request.num_output - computed  # num_tokens - num_computed
            if new <= 0:
                continue
            if new > budget:
                new = budget
            # most decode steps fit in the blocks the request holds: the allocator is asked only when they do not
            if computed + new > request.blocks * block_size and not allocate(request, new):
                while True:  # preempt from the back until it fits, or until it is the one preempted
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is request or allocate(request, new):
                        break
                if victim is request:
                    break
            computed += new
            request.num_computed = computed
            entries.append((request, new, computed, request.epoch, computed >= request.prompt_tokens + request.num_output))
            budget -= new
        if not preempted:
            while self.waiting and budget > 0 and len(running) < self.max_num_seqs:
                request = self.waiting[0]
                new = min(request.num_tokens - self.blocks.cached_tokens(request), budget)
                if not self.blocks.admit(request, new):
                    break
                self.waiting.popleft()
                running.append(request)
                entries.append(self._entry(request, new))
                budget -= new
        return entries
