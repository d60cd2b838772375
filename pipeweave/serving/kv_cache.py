"""Paged KV cache (vLLM's block manager, block size 16) and its capacity from GPU memory.

Capacity follows vLLM's start-up profile with the project's memory model (:mod:`pipeweave.memory`):
``gpu_memory_utilization`` × the GPU's memory, minus the weights held by one GPU, the activation peak of a
``max_num_batched_tokens`` forward pass over ``max_num_seqs`` sequences and the runtime allowance, divided by the
bytes of one block (K and V of 16 tokens for the layers of one pipeline stage and the KV heads of one TP rank).
"""
from __future__ import annotations

from pipeweave import memory
from pipeweave.workload import ModelConfig, WorkloadError

BLOCK_SIZE = memory.KV_BLOCK_TOKENS
GPU_MEMORY_UTILIZATION = memory.GPU_MEMORY_UTILIZATION


def kv_cache_blocks(cfg: ModelConfig, gpu_memory_bytes: int, tp: int, pp: int, max_num_batched_tokens: int,
                    max_num_seqs: int, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                    block_size: int = BLOCK_SIZE, dtype: str = "bf16", ep: int = 1) -> int:
    """Number of KV-cache blocks one replica can hold with linear-layer weights in ``dtype`` (an MoE model's experts
    in ``ep`` groups, which changes the activation peak, not the weights per GPU); an error if weights,
    activations and runtime leave no room, naming the smallest TP (same PP) that leaves some, as the aggregator's
    memory check does."""
    # vLLM's profiling pass: the token budget spread over up to max_num_seqs sequences
    sequences = min(max_num_seqs, max_num_batched_tokens)
    available = gpu_memory_utilization * gpu_memory_bytes

    def blocks_at(size: int) -> int:
        free = (available - memory.weight_bytes_per_gpu(cfg, size, pp, dtype=dtype)
                - memory.activation_bytes_per_gpu(cfg, max_num_batched_tokens, sequences, size, ep) - memory.RUNTIME_OVERHEAD_BYTES)
        return int(free // memory.kv_cache_bytes_per_gpu(cfg, [block_size], size, pp))

    blocks = blocks_at(tp)
    if blocks < 1:
        weights = memory.weight_bytes_per_gpu(cfg, tp, pp, dtype=dtype)
        activations = memory.activation_bytes_per_gpu(cfg, max_num_batched_tokens, sequences, tp, ep)
        smallest = memory.smallest_fitting_tp(cfg, lambda size: blocks_at(size) >= 1, ep)
        hint = (f"the smallest TP that fits at PP{pp} is {smallest}" if smallest is not None
                else f"no TP up to {memory.TP_CANDIDATES[-1]} fits at PP{pp}")
        raise WorkloadError(
            f"{cfg.stem} with TP{tp} x PP{pp}{'' if dtype == 'bf16' else f' ({dtype.upper()})'} does not fit: weights "
            f"{weights / 1e9:.1f}, activations "
            f"{activations / 1e9:.1f} (the profiling pass: {max_num_batched_tokens} tokens over up to {max_num_seqs} "
            f"sequences) and runtime {memory.RUNTIME_OVERHEAD_BYTES / 1e9:.1f} GB per GPU leave no KV cache in the "
            f"{available / 1e9:.1f} GB available ({gpu_memory_utilization:g} x totalGlobalMem); {hint}")
    return blocks


class BlockManager:
    """Free-block accounting of a paged KV cache (no prefix sharing: trace requests carry no token ids)."""

    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def allocate(self, request, new_tokens: int) -> bool:
        """Reserve blocks so ``request`` can hold ``num_computed + new_tokens`` tokens; False if they are lacking."""
        tokens = request.num_computed + new_tokens
        if tokens <= request.blocks * self.block_size:
            return True  # fits in the blocks it holds (most decode steps)
        needed = self.blocks_for(tokens) - request.blocks
        if needed > self.free:
            return False
        self.free -= needed
        request.blocks += needed
        return True

    def release(self, request) -> None:
        self.free += request.blocks
        request.blocks = 0


class UnlimitedBlocks(BlockManager):
    """No KV limit (the static batch: the workload generator and aggregator assume every request fits)."""

    def __init__(self):
        super().__init__(num_blocks=0)

    def allocate(self, request, new_tokens: int) -> bool:
        return True

    def release(self, request) -> None:
        pass
