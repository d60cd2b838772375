"""Paged KV cache (vLLM's block manager, block size 16) and its capacity from GPU memory.

Capacity follows vLLM's profile: ``gpu_memory_utilization`` × the GPU's memory, minus the weights held by one
GPU and the activation peak of a ``max_num_batched_tokens`` forward pass, divided by the bytes of one block
(K and V of ``block_size`` tokens for the layers of one pipeline stage and the KV heads of one TP rank).

``weight_bytes_per_gpu`` and ``activation_bytes_per_gpu`` are this module's own estimate (BF16 weights and KV,
untied embeddings, the largest pipeline stage). They are the adapter to switch to ``pipeweave.memory`` once it
exists; nothing else computes memory.
"""
from __future__ import annotations

import math

from pipeweave.workload import ModelConfig, RankShapes, WorkloadError

BLOCK_SIZE = 16
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
BYTES_BF16 = 2


def weight_bytes_per_gpu(cfg: ModelConfig, tp: int, pp: int) -> int:
    """BF16 weights on the most loaded GPU: its stage's layers (TP-sharded) plus an embedding and the lm_head.

    With PP > 1 the first stage holds the embedding and the last the lm_head; counting both on one stage is the
    conservative (largest-stage) bound vLLM's profile would also see on one of them.
    """
    shard = RankShapes.of(cfg, tp)
    hidden = cfg.hidden_size
    per_layer = hidden * (shard.qkv_n + shard.gate_up_n) + shard.o_k * hidden + shard.down_k * hidden + 2 * hidden
    layers = math.ceil(cfg.num_hidden_layers / pp)
    vocab_shard = math.ceil(cfg.vocab_size / tp)
    embeddings = vocab_shard * hidden * (2 if pp == 1 else 1)
    return BYTES_BF16 * (layers * per_layer + embeddings + hidden)


def activation_bytes_per_gpu(cfg: ModelConfig, tp: int, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Peak activations of the profiling forward pass: the widest intermediate (gate_up output and its SiLU*Mul
    result) and a few hidden-size buffers per token, plus FP32 logits for ``max_num_seqs`` sequences."""
    shard = RankShapes.of(cfg, tp)
    per_token = BYTES_BF16 * (shard.gate_up_n + shard.gate_up_n // 2 + shard.qkv_n + 4 * cfg.hidden_size)
    logits = 4 * max_num_seqs * math.ceil(cfg.vocab_size / tp)
    return max_num_batched_tokens * per_token + logits


def kv_bytes_per_token(cfg: ModelConfig, tp: int, pp: int) -> int:
    """K and V of one token for one GPU's layers and KV heads (BF16)."""
    shard = RankShapes.of(cfg, tp)
    return 2 * shard.nkv * cfg.head_dim * BYTES_BF16 * math.ceil(cfg.num_hidden_layers / pp)


def kv_cache_blocks(cfg: ModelConfig, gpu_memory_bytes: int, tp: int, pp: int, max_num_batched_tokens: int,
                    max_num_seqs: int, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                    block_size: int = BLOCK_SIZE) -> int:
    """Number of KV-cache blocks one replica can hold; an error if the weights leave no room."""
    budget = gpu_memory_utilization * gpu_memory_bytes
    weights = weight_bytes_per_gpu(cfg, tp, pp)
    free = budget - weights - activation_bytes_per_gpu(cfg, tp, max_num_batched_tokens, max_num_seqs)
    blocks = int(free // (kv_bytes_per_token(cfg, tp, pp) * block_size))
    if blocks < 1:
        raise WorkloadError(
            f"{cfg.stem} with TP{tp} x PP{pp} does not fit: {weights / 2**30:.1f} GiB of weights per GPU leave no "
            f"KV cache in {gpu_memory_utilization:.0%} of {gpu_memory_bytes / 2**30:.1f} GiB")
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
