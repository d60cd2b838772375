"""FA2 calculator: FlashInfer's FA2 batch prefill/decode template (docs/METHOD.md §3.6).

Models every attention type containing "fa2" (Ampere/Ada/Blackwell-workstation prefill and all decode
steps).  Query heads of one GQA group are packed into the q dimension, the KV axis is split into chunks
by FlashInfer's binary search (except where the kernel that runs does not split, :func:`splits_kv`), and one
CTA per (request, packed q tile, KV chunk, KV head) is emitted.

Quirks kept on purpose (docs/METHOD.md §11.1 items 1-4): the trained attention model was fitted on features
computed with them, so they are *features, not bugs*, and changing any of them changes every sm_max
feature and requires retraining:

* the CTA→SM mapping is the reference's *effective* static one (its dynamic scheduler runs on exhausted
  counters): the first 2S CTAs round-robin, then consecutive pairs to SM 0, 0, 1, 1, …;
* 2 resident CTAs per SM are assumed for scheduling and for the split-KV grid (2·S), whatever the
  shared-memory check says;
* MMA FLOPs carry a 33/32 factor, XU counts assume 128 threads per CTA;
* one KV tile (K *or* V) is counted per iteration, Q once per CTA.
"""
from __future__ import annotations

import numpy as np

from .attention_common import task_pipes
from .pipes import AttentionProblem, HardwareSpec, ceil_div

XU_PER_ITERATION = (32 + 4) * 128  # exp2 of scores and of rescale factors, 128 threads
XU_CONSTANT = 128 * 128  # reciprocal at the output


def cta_tile_q(packed_lengths, head_dim: int) -> int:
    """CTA_TILE_Q from the average packed length floor(Σ p_i / B) (step 1)."""
    packed = list(packed_lengths)
    avg = sum(packed) // len(packed)
    if avg > 64 and head_dim < 256:
        return 128
    if avg > 16:
        return 64
    return 16


def cta_tile_kv(cta_q: int, head_dim: int, shared_memory_kb: float, ds_q: int = 2, ds_kv: int = 2) -> int:
    """CTA_TILE_KV from the shared-memory and register budgets (steps 2-3)."""
    warps_q = 4 if cta_q > 16 else 1
    warps_kv = 4 // warps_q
    mma_q = 2 if cta_q > 64 else 1
    d_vo = head_dim // 16
    smem_sm = int(np.floor(shared_memory_kb * 1024))
    q_bytes = cta_q * head_dim * ds_q
    kv_stage_bytes = 2 * head_dim * 16 * warps_kv * ds_kv
    smem_cta = q_bytes + kv_stage_bytes
    ctas_per_sm = 2 if smem_sm >= 2 * smem_cta else 1
    smem_tb = smem_sm // ctas_per_sm
    limit_reg = 8 // mma_q
    limit_smem = (smem_tb - q_bytes) // kv_stage_bytes

    def invalid(n: int) -> bool:
        return (
            d_vo < 4
            or (d_vo == 4 and n % 2 == 1)
            or mma_q * (8 * d_vo + 8 * n) >= 256
            or (ds_kv == 1 and (2 * n) % warps_q != 0)
        )

    chosen = 1
    for n in range(min(limit_reg, limit_smem), 0, -1):
        if not invalid(n):
            chosen = n
            break
    return chosen * warps_kv * 16


def _shared_memory_kb(hw: HardwareSpec) -> float:
    if hw.shared_memory_size is None:
        raise ValueError(f"{hw.stem}: the FA2 calculator needs sharedMemorySize (shared memory per SM in KiB) in the "
                         f"hardware JSON")
    return hw.shared_memory_size


def group_size(problem: AttentionProblem) -> int:
    return problem.num_qo_heads // problem.num_kv_heads


def tile_sizes(problem: AttentionProblem, hw: HardwareSpec) -> tuple[int, int]:
    """(cta_q, cta_kv) FlashInfer picks for this problem on this GPU."""
    g = group_size(problem)
    cta_q = cta_tile_q([q * g for q in problem.q_lengths], problem.head_dim)
    cta_kv = cta_tile_kv(cta_q, problem.head_dim, _shared_memory_kb(hw), problem.data_size_q, problem.data_size_kv)
    return cta_q, cta_kv


def packs_gqa_group(max_q, group):
    """Whether flash-attn's FA2 varlen kernel packs the GQA group into the query dimension (``mha_varlen_fwd``'s
    ``seqlenq_ngroups_swapped``): a decode launch (every q = 1) of more than one query head per KV head; per row
    when given arrays."""
    return (np.asarray(max_q) == 1) & (np.asarray(group) > 1)


def splits_kv(problem: AttentionProblem, hw: HardwareSpec) -> bool:
    """Whether the launch splits the KV axis (step 4).

    FlashInfer's template always splits, and so do the decode kernels that run the ``fa2_paged`` steps on Hopper
    and datacenter Blackwell (FA3, FlashInfer). On the other GPUs vLLM runs flash-attn's FA2 varlen kernel, which
    splits a paged launch only when it is a decode step whose GQA group is packed into the query dimension
    (``flash_api.cpp``, ``mha_varlen_fwd``: ``seqlenq_ngroups_swapped`` needs every q = 1 and nh > nkv). So an MHA
    decode launch (nh = nkv) runs one CTA per request and head over the whole KV: measured (aiconfigurator-core,
    vLLM), such launches on A100, L40S and RTX PRO 6000 stream 22-28 GB/s per CTA, one CTA per SM, and take
    30-60x as long as the GQA launch of the same KV, while Hopper's take the same time. Ragged (prefill) launches
    keep the template's rule, which docs/METHOD.md's worked examples fix (docs/METHOD.md §3.6, step 4)."""
    if hw.uses_sm90_gemm or problem.layout != "paged":
        return True
    return bool(packs_gqa_group(max(problem.q_lengths), group_size(problem)))


def kv_chunk_size(problem: AttentionProblem, hw: HardwareSpec, cta_q: int | None = None) -> int:
    """KV chunk size of the split-KV binary search (step 4); one chunk per request where :func:`splits_kv` says
    the launch does not split."""
    if cta_q is None:
        cta_q = tile_sizes(problem, hw)[0]
    page = 16 if problem.layout == "paged" else 1
    min_chunk = max(128 // page, 1)
    if not splits_kv(problem, hw):
        return max(min_chunk, max(problem.kv_lengths))
    max_parallel = (2 * hw.num_sms) // problem.num_kv_heads
    g = group_size(problem)
    q_tiles = ceil_div(np.array(problem.q_lengths, dtype=np.int64) * g, cta_q)
    kv = np.maximum(np.array(problem.kv_lengths, dtype=np.int64), 1)
    low, high = min_chunk, max(1, int(kv.max()))
    while low < high:
        mid = (low + high) // 2
        work = int(np.sum(q_tiles * ceil_div(kv, mid)))
        if work > max_parallel:
            low = mid + 1
        else:
            high = mid
    return low


# flash-attn's FA2 varlen entry point (``flash_api.cpp``, ``mha_varlen_fwd`` and ``set_params_splitkv``), which vLLM
# runs off Hopper and datacenter Blackwell. Its split-KV choice is not FlashInfer's binary search above.
VARLEN_SPLIT_BLOCK_M = 64
VARLEN_MAX_SPLITS = 128


def varlen_split_block_n(head_dim) -> np.ndarray:
    """KV block of the split-KV kernel, by head dimension (``set_params_splitkv``)."""
    head_dim = np.asarray(head_dim, dtype=np.int64)
    return np.where(head_dim <= 64, 256, np.where(head_dim <= 128, 128, 64))


def varlen_num_splits(ctas, num_sms: int, n_blocks) -> np.ndarray:
    """flash-attn's ``num_splits_heuristic`` per row: 1 when the CTAs nearly fill ``num_sms`` (the caller passes
    twice the SMs, as ``set_params_splitkv`` does), else the fewest splits whose wave efficiency is at least 0.85 of
    the best, counting only splits that change the blocks per split."""
    ctas = np.asarray(ctas, dtype=np.int64)
    n_blocks = np.asarray(n_blocks, dtype=np.int64)
    limit = np.minimum(np.minimum(VARLEN_MAX_SPLITS, num_sms), n_blocks)
    splits = np.arange(1, VARLEN_MAX_SPLITS + 1, dtype=np.int64)[:, None]
    changes_blocks = ceil_div(n_blocks, splits) != ceil_div(n_blocks, np.maximum(splits - 1, 1))
    eligible = (splits <= limit) & ((splits == 1) | changes_blocks)
    waves = ctas * splits / num_sms
    efficiency = np.where(eligible, waves / np.ceil(waves), 0.0)
    chosen = np.argmax(efficiency >= 0.85 * efficiency.max(axis=0), axis=0) + 1
    return np.where(ctas >= 0.8 * num_sms, 1, chosen)


def varlen_auxiliary_launches(bs, max_q, max_kv, nh, nkv, hd, hw: HardwareSpec) -> np.ndarray:
    """Per row, (copies, combine) of a launch through flash-attn's FA2 varlen kernel, 1.0 where it happens.

    A decode launch whose GQA group is packed into the query dimension (every q = 1, nh > nkv) reshapes q, and
    then its output, across a transpose; with more than one request and KV head the reshape is no view, so
    torch copies them in kernels of their own (*copies*). The packed launch alone splits the KV axis
    (:func:`varlen_num_splits`), and a split launch is followed by a kernel that combines the splits (*combine*).
    Measured (aiconfigurator-core, vLLM), on A100, L40S and RTX PRO 6000 each adds a few microseconds whatever
    the work, a step from KV 128 to 256 at head dimension 128 and from 256 to 512 at 64 (one KV block more);
    Hopper's FA3 packs the group in the kernel and shows neither step. 0 on GPUs that run FA3 (Hopper, datacenter
    Blackwell), whose split-KV combine is not modelled."""
    bs, max_q, max_kv, nh, nkv = (np.asarray(x, dtype=np.int64) for x in (bs, max_q, max_kv, nh, nkv))
    group = nh // nkv
    packed = packs_gqa_group(max_q, group) & (not hw.uses_sm90_gemm)
    copies = packed & (bs > 1) & (nkv > 1)
    ctas = bs * nkv * ceil_div(group, VARLEN_SPLIT_BLOCK_M)
    n_blocks = ceil_div(np.maximum(max_kv, 1), varlen_split_block_n(hd))
    combine = packed & (varlen_num_splits(ctas, 2 * hw.num_sms, n_blocks) > 1)
    return np.stack([copies, combine], axis=-1).astype(np.float64)


def cta_iterations(problem: AttentionProblem, cta_q: int, cta_kv: int, chunk: int) -> np.ndarray:
    """`it` of every CTA in launch order (step 5), zero-iteration CTAs included."""
    g = group_size(problem)
    q = np.array(problem.q_lengths, dtype=np.int64)
    kv = np.array(problem.kv_lengths, dtype=np.int64)
    n_tiles = ceil_div(q * g, cta_q)
    n_chunks = ceil_div(kv, chunk)
    cells = n_tiles * n_chunks
    total = int(cells.sum())
    req = np.repeat(np.arange(problem.batch_size), cells)
    offset = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(cells) - cells, cells)
    nc = n_chunks[req]
    t = offset // nc
    start = (offset % nc) * chunk
    kv_r = kv[req]
    z = np.minimum(chunk, kv_r - start)
    if problem.causal:
        upper = kv_r - q[req] + ceil_div((t + 1) * cta_q, g)
        z = np.minimum(z, np.maximum(upper - start, 0))
    it = ceil_div(z, cta_kv)
    return np.repeat(it, problem.num_kv_heads)  # one identical CTA per KV head, consecutively


def cta_sm_ids(num_ctas: int, num_sms: int) -> np.ndarray:
    """Effective static CTA→SM mapping (step 6, quirk §11.1.1)."""
    j = np.arange(num_ctas, dtype=np.int64)
    return np.where(j < 2 * num_sms, j % num_sms, ((j - 2 * num_sms) % (2 * num_sms)) // 2)


def features(problem: AttentionProblem, hw: HardwareSpec) -> np.ndarray:
    cta_q, cta_kv = tile_sizes(problem, hw)
    chunk = kv_chunk_size(problem, hw, cta_q)
    its = cta_iterations(problem, cta_q, cta_kv, chunk)
    sm_ids = cta_sm_ids(its.size, hw.num_sms)
    hd = problem.head_dim
    mma_per_it = 4 * cta_q * cta_kv * hd
    # floor(mma_per_it * it / 32) * 33 is linear in it: cta_q >= 16 and cta_kv is a multiple of 16.
    assert mma_per_it % 32 == 0
    return task_pipes(
        sm_ids,
        its,
        hw,
        mma=(0, mma_per_it // 32 * 33),
        xu=(XU_CONSTANT + cta_q, XU_PER_ITERATION),
        nbytes=(cta_q * hd * problem.data_size_q, cta_kv * hd * problem.data_size_kv),
    )
