"""Shape descriptors: exact, tile-free quantities fed to the MLP beside the pipe features.

The pipe features describe what the modelled kernel does (tiles, padding, scheduling), which is only
as good as the tile rule and the scheduler model. The descriptors give the network the problem itself:
its dimensions and the unpadded work and minimum DRAM traffic, in cycles on this GPU (so they are
comparable across GPUs and carry no GPU identity). Measured on held-out shapes they cut the duration
error from 10.0 % to 7.0 % for BF16 GEMM and from 15.7 % to 6.6 % for attention (docs/ACCURACY.md,
README "Differences from the reference"). The reference recipe (``--recipe reference``) does not use
them, so the artifact's feature vector stays reachable.

All values are float64, non-negative; cycles = work / (rate per SM per clock × SMs) or bytes at the
spec DRAM bandwidth (same 2^30 scaling as the memory pipe, docs/METHOD.md §0.3).
"""
from __future__ import annotations

from itertools import chain

import numpy as np

from .fa2 import VARLEN_SPLIT_BLOCK_M
from .pipes import HardwareSpec

GEMM_DESCRIPTORS = ("shape_M", "shape_N", "shape_K", "exact_tensor_cycle", "exact_dram_cycle")
# varlen_*: no property of the problem alone but of the kernels that run it (fa2.varlen_auxiliary_launches);
# tile_latency_cycle: a latency in time at the GPU's clock (attention_tile_latency_cycles)
ATTENTION_DESCRIPTORS = (
    "batch_size", "mean_q_length", "mean_kv_length", "num_qo_heads", "num_kv_heads", "head_dim",
    "exact_tensor_cycle", "exact_dram_cycle", "varlen_gqa_copies", "varlen_split_combine", "tile_latency_cycle",
)
ELEMENTWISE_DESCRIPTORS = ("shape_seq", "shape_dim", "exact_dram_cycle")
MOE_DESCRIPTORS = ("shape_M", "experts", "top_k", "hidden", "inter", "exact_tensor_cycle", "exact_dram_cycle")


def dram_cycles(nbytes, hw: HardwareSpec) -> np.ndarray:
    return np.asarray(nbytes, dtype=np.float64) / 1024 / hw.mem_bandwidth / 1024**2 * hw.sm_freq * 1e6


def tensor_cycles(flops, rate: float, hw: HardwareSpec) -> np.ndarray:
    return np.asarray(flops, dtype=np.float64) / rate / hw.num_sms


def gemm(m, n, k, hw: HardwareSpec, operand_bytes: int = 2, rate: float | None = None) -> np.ndarray:
    """A and B read and C (BF16) written once; ``rate`` is the tensor rate of the operands (default BF16's)."""
    if rate is not None and not rate > 0:
        raise ValueError(f"{hw.stem}: tensor rate must be positive, got {rate!r}")
    m, n, k = (np.asarray(x, dtype=np.float64) for x in (m, n, k))
    flops = 2.0 * m * n * k
    nbytes = operand_bytes * (m * k + n * k) + 2 * m * n
    return np.stack([m, n, k, tensor_cycles(flops, hw.tc_bf16 if rate is None else rate, hw),
                     dram_cycles(nbytes, hw)], axis=-1)


def attention(bs, rows, q_lengths, kv_lengths, nh, nkv, hd, hw: HardwareSpec) -> np.ndarray:
    """Per row: causal (bottom-right aligned) QK^T and PV FLOPs; Q and O once, K and V once per KV head.

    Vectorised over rows: the requests' lengths come flattened (:func:`per_request`: ``rows`` the row of each) and
    are summed per row with bincount.
    """
    bs = np.asarray(bs, dtype=np.int64)
    q, kv = (np.asarray(x, dtype=np.float64) for x in (q_lengths, kv_lengths))
    count = np.bincount(rows, minlength=len(bs)).astype(np.float64)
    sum_q = np.bincount(rows, weights=q, minlength=len(bs))
    sum_kv = np.bincount(rows, weights=kv, minlength=len(bs))
    pairs = np.bincount(rows, weights=q * (kv - q) + q * (q + 1) / 2, minlength=len(bs))
    heads, kv_heads, dim = (np.asarray(x, dtype=np.float64) for x in (nh, nkv, hd))
    flops = 4.0 * dim * heads * pairs
    nbytes = 2.0 * (2 * sum_kv * kv_heads * dim + 2 * sum_q * heads * dim)
    return np.stack([bs.astype(np.float64), sum_q / count, sum_kv / count, heads, kv_heads, dim,
                     tensor_cycles(flops, hw.tc_bf16, hw), dram_cycles(nbytes, hw)], axis=-1)


def per_request(*lists_per_row) -> tuple[np.ndarray, ...]:
    """(the row of each request, then each argument's per-request integers, flattened) of per-row lists of
    per-request values, every argument with the first's list lengths (an attention row's q and kv lengths)."""
    rows = np.repeat(np.arange(len(lists_per_row[0])), [len(values) for values in lists_per_row[0]])
    return rows, *(np.fromiter(chain.from_iterable(lists), dtype=np.int64, count=len(rows)) for lists in lists_per_row)


#: query rows per tile of :func:`attention_tile_latency_cycles`: the query block of flash-attn's split-KV kernel,
#: taken as a unit of work for every attention kernel, not as each kernel's own tile
ATTENTION_LATENCY_TILE_ROWS = VARLEN_SPLIT_BLOCK_M


def attention_tile_latency_cycles(rows, q_lengths, nh, nkv, hw: HardwareSpec) -> np.ndarray:
    """Per row, one microsecond per query tile on the busiest SM, in SM cycles: ⌈T / S⌉ · f, T = Σ_i nkv ·
    ⌈q_i · g / 64⌉ tiles of the GQA group's query rows (g = nh / nkv) per request and KV head.

    Measured decodes of many short requests take about 4 µs per tile and SM on every GPU (bs = 1,024, KV ≤ 64,
    nh = 32, nkv = 8: A100 4.2, L40S 4.1, RTX PRO 6000 4.5, H100 3.5 µs) at clocks from 1.41 to 2.52 GHz: a
    latency in time, not in cycles. The pipes count cycles of throughput, so a model trained on faster clocks took
    A100's such decodes for 1.3–1.5x longer than they are; in cycles at the GPU's own clock this pipe scales as
    the latency does (the microsecond is a unit: the model learns the multiple). The requests' query lengths come
    flattened (:func:`per_request`: ``rows`` the row of each).
    """
    heads, kv_heads, q = (np.asarray(x, dtype=np.int64) for x in (nh, nkv, q_lengths))
    group = (heads // kv_heads)[rows]
    tiles = np.bincount(rows, weights=-(-(q * group) // ATTENTION_LATENCY_TILE_ROWS) * kv_heads[rows],
                        minlength=len(heads))
    return np.ceil(tiles / hw.num_sms) * hw.sm_freq


def elementwise(seq, dim, hw: HardwareSpec, output_fraction: float) -> np.ndarray:
    """Rows of ``dim`` BF16 elements read; ``output_fraction`` of them written (1 RMSNorm, 1/2 SiLU*Mul)."""
    seq, dim = (np.asarray(x, dtype=np.float64) for x in (seq, dim))
    nbytes = 2.0 * seq * dim * (1 + output_fraction)
    return np.stack([seq, dim, dram_cycles(nbytes, hw)], axis=-1)


def moe(m, experts, top_k, hidden, inter, hw: HardwareSpec, passes: np.ndarray) -> np.ndarray:
    """Routed FLOPs, and the weights of the experts a random routing reaches in expectation, E (1 − (1 − k/E)^M),
    per pass (w13: 2N×H, w2: H×N), with the routed tokens' activations.

    ``passes`` holds, per row, how many times each of (w13, w2) runs: (1, 0), (0, 1) or (1, 1) for a layer.
    """
    m, e, k, h, n = (np.asarray(x, dtype=np.float64) for x in (m, experts, top_k, hidden, inter))
    w13, w2 = passes[:, 0], passes[:, 1]
    routed = m * k
    active = e * (1 - (1 - k / e) ** m)  # experts a random routing reaches, in expectation
    flops = 2.0 * routed * h * n * (2 * w13 + w2)
    nbytes = 2.0 * (active * h * n * (2 * w13 + w2) + routed * (h * w13 + n * w2))
    return np.stack([m, e, k, h, n, tensor_cycles(flops, hw.tc_bf16, hw), dram_cycles(nbytes, hw)], axis=-1)


# Operand bytes a workload last touched a whole forward pass earlier (weights, the cached KV): between two reads of
# a layer's weights or KV every other layer's stream through the L2, so in a workload these come from DRAM however
# large the L2, where a benchmark that re-runs one kernel finds them L2-resident (pipeweave.bounds).

def gemm_weight_bytes(n, k, operand_bytes: int) -> np.ndarray:
    """The weight matrix, N × K."""
    return operand_bytes * np.asarray(n, dtype=np.float64) * np.asarray(k, dtype=np.float64)


def attention_cached_kv_bytes(q_lengths, kv_lengths, nkv, hd) -> np.ndarray:
    """K and V (BF16) of the tokens cached before this iteration, kv − q per request; the q new ones were just
    written."""
    cached = np.array([sum(kv - q for q, kv in zip(qs, kvs)) for qs, kvs in zip(q_lengths, kv_lengths)],
                      dtype=np.float64)
    return 2.0 * 2 * cached * np.asarray(nkv, dtype=np.float64) * np.asarray(hd, dtype=np.float64)


def moe_expert_weight_bytes(m, experts, top_k, hidden, inter, passes: np.ndarray) -> np.ndarray:
    """The weights (BF16) of the experts that receive tokens (balanced routing), per pass as in :func:`moe`."""
    m, e, k, h, n = (np.asarray(x, dtype=np.float64) for x in (m, experts, top_k, hidden, inter))
    return 2.0 * np.minimum(e, m * k) * h * n * (2 * passes[:, 0] + passes[:, 1])
