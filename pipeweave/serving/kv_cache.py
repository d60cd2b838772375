"""Paged KV cache (vLLM's block manager, block size 16) and its capacity from GPU memory.

Capacity follows vLLM's start-up profile with the project's memory model (:mod:`pipeweave.memory`):
``gpu_memory_utilization`` × the GPU's memory, minus the weights held by one GPU, the activation peak of a
``max_num_batched_tokens`` forward pass over ``max_num_seqs`` sequences and the runtime allowance, divided by the
bytes of one block (K and V of 16 tokens for the layers of one pipeline stage and the KV heads of one TP rank).
"""
from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

from pipeweave import memory
from pipeweave.workload import ModelConfig, WorkloadError

BLOCK_SIZE = memory.KV_BLOCK_TOKENS
GPU_MEMORY_UTILIZATION = memory.GPU_MEMORY_UTILIZATION
#: vLLM V1's block pool takes one block as its null block (the placeholder of skipped and padded block-table
#: entries) before any request arrives (v1/core/block_pool.py), so a cache of N blocks serves requests from N - 1
NULL_BLOCKS = 1


def kv_cache_blocks(cfg: ModelConfig, gpu_memory_bytes: int, tp: int, pp: int, max_num_batched_tokens: int,
                    max_num_seqs: int, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                    block_size: int = BLOCK_SIZE, dtype: str = "bf16", ep: int = 1,
                    model_len: int | None = None) -> int:
    """Number of KV-cache blocks one replica can hold with linear-layer weights in ``dtype`` (an MoE model's experts
    in ``ep`` groups, which changes the activation peak, not the weights per GPU); an error if weights,
    activations and runtime leave no room, naming the smallest TP (same PP) that leaves room for one request of
    ``model_len`` tokens (the engine's max_model_len, which vLLM checks at start-up), as the aggregator's memory
    check does."""
    memory.check_layout(cfg, tp, pp, ep)
    for name, value in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs),
                        ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkloadError(f"{name} must be a positive integer, got {value!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise WorkloadError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    blocks_at = _BlocksAt(cfg, gpu_memory_bytes, pp, max_num_batched_tokens, max_num_seqs, gpu_memory_utilization,
                          block_size, dtype, ep)
    blocks = blocks_at(tp)
    if blocks < 1:
        raise WorkloadError(
            f"{cfg.stem} with TP{tp} x PP{pp}{'' if dtype == 'bf16' else f' ({dtype.upper()})'} does not fit: weights "
            f"{blocks_at.weights(tp) / 1e9:.1f}, activations "
            f"{blocks_at.activations(tp) / 1e9:.1f} (the profiling pass: {max_num_batched_tokens} tokens over up to "
            f"{max_num_seqs} sequences) and runtime {memory.RUNTIME_OVERHEAD_BYTES / 1e9:.1f} GB per GPU leave no KV "
            f"cache in the {blocks_at.available / 1e9:.1f} GB available ({gpu_memory_utilization:g} x "
            f"totalGlobalMem); {smallest_tp_hint(cfg, blocks_at, pp, ep, model_len, block_size)}")
    return blocks


@dataclass(frozen=True)
class _BlocksAt:
    """The KV-cache blocks of :func:`kv_cache_blocks` as a function of the TP size (called with it), and the terms
    that leave them."""

    cfg: ModelConfig
    gpu_memory_bytes: int
    pp: int
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    block_size: int
    dtype: str
    ep: int

    @property
    def available(self) -> float:
        return self.gpu_memory_utilization * self.gpu_memory_bytes

    def weights(self, size: int) -> float:
        return memory.weight_bytes_per_gpu(self.cfg, size, self.pp, dtype=self.dtype)

    def activations(self, size: int) -> float:
        # vLLM's profiling pass: the token budget spread over up to max_num_seqs sequences
        sequences = min(self.max_num_seqs, self.max_num_batched_tokens)
        return memory.activation_bytes_per_gpu(self.cfg, self.max_num_batched_tokens, sequences, size, self.ep)

    def __call__(self, size: int) -> int:
        free = self.available - self.weights(size) - self.activations(size) - memory.RUNTIME_OVERHEAD_BYTES
        # one block's bytes from a whole 16-token block's (the function rounds lengths up to vLLM's 16)
        per_token = (memory.kv_cache_bytes_per_gpu(self.cfg, [memory.KV_BLOCK_TOKENS], size, self.pp)
                     / memory.KV_BLOCK_TOKENS)
        return int(free // (per_token * self.block_size))


def smallest_tp_hint(cfg: ModelConfig, blocks_at, pp: int, ep: int, model_len: int | None,
                     block_size: int = BLOCK_SIZE) -> str:
    """"the smallest TP that fits at PP…", and where it differs, the smallest whose KV cache holds one request of
    ``model_len`` tokens, which vLLM checks at start-up."""
    fits = memory.smallest_fitting_tp(cfg, lambda size: blocks_at(size) >= 1, ep)
    if fits is None:
        return f"no TP up to {memory.TP_CANDIDATES[-1]} fits at PP{pp}"
    hint = f"the smallest TP that fits at PP{pp} is {fits}"
    if model_len is None or blocks_at(fits) * block_size >= model_len:
        return hint
    return (f"{hint}, with a --max_model_len of {blocks_at(fits) * block_size} or less (one request of max_model_len "
            f"{model_len}, which vLLM checks at start-up, needs {_holding(cfg, blocks_at, ep, model_len, block_size)})")


def _holding(cfg: ModelConfig, blocks_at, ep: int, model_len: int, block_size: int) -> str:
    holds = memory.smallest_fitting_tp(cfg, lambda size: blocks_at(size) * block_size >= model_len, ep)
    return f"TP {holds}" if holds is not None else f"more than TP {memory.TP_CANDIDATES[-1]}"


def smallest_tp_holding(cfg: ModelConfig, gpu_memory_bytes: int, pp: int, max_num_batched_tokens: int,
                        max_num_seqs: int, gpu_memory_utilization: float, model_len: int, dtype: str = "bf16",
                        ep: int = 1, block_size: int = BLOCK_SIZE) -> str:
    """The smallest TP (at PP ``pp``, as "TP 8") whose KV cache, sized as :func:`kv_cache_blocks` sizes it, holds
    one request of ``model_len`` tokens."""
    blocks_at = _BlocksAt(cfg, gpu_memory_bytes, pp, max_num_batched_tokens, max_num_seqs, gpu_memory_utilization,
                          block_size, dtype, ep)
    return _holding(cfg, blocks_at, ep, model_len, block_size)


def vllm_block_manager(kv_cache_blocks: int) -> "BlockManager":
    """The block manager of a vLLM KV cache of ``kv_cache_blocks`` blocks (the size vLLM reports): every block but
    its null block."""
    return BlockManager(kv_cache_blocks - NULL_BLOCKS)


class BlockManager:
    """A paged KV cache with vLLM V1's prefix cache as far as a trace can use it (its requests carry no token ids,
    so no two share a block): a preempted request's own full blocks.

    vLLM frees a request's blocks into the tail of a free queue, its last block first, and takes new blocks from the
    head; a freed full block keeps its content (and hash) until it is taken. So a preempted request, readmitted,
    finds the prefix of its blocks that no allocation has reached yet and recomputes only the rest
    (``KVCacheManager.get_computed_blocks``, at most ``num_tokens - 1`` tokens). The queue is kept as segments
    ``[rid or None, blocks, full blocks]`` in queue order; a segment's blocks are taken from its front, where the
    preempted request's tail lies, so ``min(full, blocks)`` of its prefix blocks are still cached."""

    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks
        self.queue: deque = deque([[None, num_blocks, 0]])
        self.cached: dict = {}  # rid of a preempted request -> its segment of the queue

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def copy(self) -> "BlockManager":
        """An independent copy (the simulator's look-ahead)."""
        other = copy.copy(self)
        other.queue = deque(list(segment) for segment in self.queue)
        other.cached = {segment[0]: segment for segment in other.queue if segment[0] is not None}
        return other

    def _take(self, blocks: int) -> None:
        """Take ``blocks`` free blocks from the head of the queue (evicting what they cached)."""
        queue = self.queue
        while blocks:
            segment = queue[0]
            taken = min(blocks, segment[1])
            segment[1] -= taken
            blocks -= taken
            if not segment[1]:
                queue.popleft()
                if segment[0] is not None:
                    del self.cached[segment[0]]

    def allocate(self, request, new_tokens: int) -> bool:
        """Reserve blocks so ``request`` can hold ``num_computed + new_tokens`` tokens; False if they are lacking."""
        tokens = request.num_computed + new_tokens
        if tokens <= request.blocks * self.block_size:
            return True  # fits in the blocks it holds (most decode steps)
        needed = self.blocks_for(tokens) - request.blocks
        if needed > self.free:
            return False
        self.free -= needed
        self._take(needed)
        request.blocks += needed
        return True

    def cached_tokens(self, request) -> int:
        """Tokens of a waiting ``request`` whose KV its still cached blocks hold (0 if none): whole blocks, at most
        ``num_tokens - 1`` (vLLM recomputes at least the last token, whose logits it needs)."""
        segment = self.cached.get(request.rid)
        if segment is None:
            return 0
        blocks = min(segment[2], segment[1], (request.num_tokens - 1) // self.block_size)
        return blocks * self.block_size

    def admit(self, request, new_tokens: int) -> bool:
        """Admit a waiting ``request`` to compute ``new_tokens`` after its cached prefix (:meth:`cached_tokens`,
        which becomes its ``num_computed``); False, changing nothing, if the blocks are lacking. As in vLLM, the
        cached blocks it touches count against the free blocks too (they leave the free queue)."""
        hit = self.cached_tokens(request)
        total = self.blocks_for(hit + new_tokens)
        if total > self.free:
            return False
        segment = self.cached.pop(request.rid, None)
        if segment is not None:  # its prefix blocks leave the queue; the rest of the segment caches nothing now
            segment[1] -= hit // self.block_size
            segment[0], segment[2] = None, 0
        self.free -= total
        self._take(total - hit // self.block_size)
        request.blocks, request.num_computed = total, hit
        return True

    def release(self, request, cached_tokens: int = 0) -> None:
        """Free the blocks of ``request``, of which ``cached_tokens`` (a preempted request's computed tokens) stay
        cached in its whole blocks until taken."""
        blocks = request.blocks
        full = min(cached_tokens // self.block_size, blocks)
        if full:
            segment = [request.rid, blocks, full]
            self.queue.append(segment)
            self.cached[request.rid] = segment
        elif blocks:
            tail = self.queue[-1] if self.queue else None
            if tail is not None and tail[0] is None:
                tail[1] += blocks
            else:
                self.queue.append([None, blocks, 0])
        self.free += blocks
        request.blocks = 0


class UnlimitedBlocks(BlockManager):
    """No KV limit (the static batch: the workload generator and aggregator assume every request fits)."""

    def __init__(self):
        super().__init__(num_blocks=0)

    def allocate(self, request, new_tokens: int) -> bool:
        return True

    def release(self, request, cached_tokens: int = 0) -> None:
        pass
