"""Attention calculators (docs/METHOD.md §3.5–§3.9): Appendix A.5–A.11, tile tables, literal reference
implementations on small GPUs, and properties that hold under the spec."""
from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from analytical_model import fa2, fa2_batch, fa3, fa_ck, fa_cutlass
from analytical_model.attention_common import heap_schedule
from analytical_model.attention import ATTENTION_CALCULATORS, attention_features, resolve_attention_type
from analytical_model.hardware import load_hardware
from analytical_model.pipes import AttentionProblem, compute_pipe, memory_pipe
from analytical_model.registry import ATTENTION_FEATURES

TENSOR_ALL, TENSOR_SM, XU_ALL, XU_SM, KIB_ALL, KIB_SM = 0, 2, 4, 6, 8, 11


def hw(name):
    return load_hardware(name)


def check_printed(actual, printed: str):
    """Compare to Appendix A values as printed: integers exactly, decimals to half a unit of the last digit."""
    expected = [s.strip() for s in printed.split(";")]
    actual = np.asarray(actual, dtype=np.float64).ravel()
    assert actual.shape == (15,) and len(expected) == 15
    for name, a, text in zip(ATTENTION_FEATURES, actual, expected):
        text = text.replace(",", "")
        value = float(text)
        if "." not in text:
            assert a == value, (name, a, text)
        else:
            decimals = len(text.split(".")[1])
            assert abs(a - value) <= 0.5 * 10**-decimals + 1e-12 * abs(value), (name, a, text)


def problem(q, kv, nh, nkv, hd, layout="ragged", causal=True):
    return AttentionProblem(len(q), tuple(q), tuple(kv), nh, nkv, hd, layout=layout, causal=causal)


# --------------------------------------------------------------------------- Appendix A.5–A.11


def test_a5_fa2_ragged_prefix_a40():
    gpu = hw("A40")
    p = problem([8], [225], 5, 1, 128)
    assert fa2.tile_sizes(p, gpu) == (64, 64)
    assert fa2.kv_chunk_size(p, gpu) == 128
    its = fa2.cta_iterations(p, 64, 64, 128)
    assert its.tolist() == [2, 2]
    assert fa2.cta_sm_ids(its.size, gpu.num_sms).tolist() == [0, 1]
    check_printed(
        attention_features("fa2_ragged", 1, [8], [225], 5, 1, 128, gpu),
        "8,650,752; 100.5714; 4,325,376; 4,224; 51,328; 38.1905; 25,664; 1,604;"
        "96; 228.850; 65.556; 48; 9,611.71; 384; 2,753.36",
    )


def test_a6_fa2_paged_decode_l40():
    check_printed(
        attention_features("fa2_paged", 4, [1, 1, 1, 1], [5, 72, 537, 5121], 6, 1, 128, hw("L40")),
        "148,684,800; 2,045.070; 1,081,344; 2,112; 5,777,200; 2,542.782; 42,016; 2,626;"
        "5,500; 15,114.72; 2,312.833; 40; 15,609.38; 320; 2,388.526",
    )


def test_a7_fa3_paged_h200():
    gpu = hw("H200")
    p = problem([11, 29], [99, 39], 16, 2, 128, layout="paged")
    assert fa3.tile_sizes(p, gpu) == (128, 96)
    its, deltas = fa3.tile_sequence(p, 128, 96)
    sm_ids = heap_schedule(deltas.tolist(), fa3.head_passes(p, 128), gpu.num_sms)
    assert sorted(sm_ids.tolist()) == list(range(32))  # 32 tasks on SMs 0-31
    check_printed(
        attention_features("fa3_paged", 2, [11, 29], [99, 39], 16, 2, 128, gpu),
        "301,989,888; 558.5455; 12,582,912; 3,072; 630,784; 298.667; 26,112; 1,632;"
        "2,176; 772.389; 365.049; 80; 3,748.36; 640; 1,771.56",
    )


def test_a8_fa3_ragged_h800_without_gqa_packing(monkeypatch):
    """A.8 is the artifact's rule, which schedules every query head; pipeweave's ragged launches pack GQA."""
    monkeypatch.setattr(fa3, "packs_gqa", lambda problem: False)
    check_printed(
        attention_features("fa3_ragged", 2, [1000, 300], [1000, 300], 8, 1, 128, hw("H800")),
        "2,818,572,288; 5,213.091; 67,108,864; 16,384; 5,722,112; 2,709.333; 135,680; 8,480;"
        "13,568; 7,063.526; 2,684.716; 288; 19,791.20; 2,304; 7,522.27",
    )


def test_a8_fa3_ragged_packs_the_gqa_group():
    """A.8's problem as the packed kernel runs it: one pass over the one KV head, rows = q x 8 heads; 63 + 19
    tiles of 128 rows instead of 8 x (8 + 3), and a causal reach set by each tile's last token."""
    p = problem([1000, 300], [1000, 300], 8, 1, 128)
    assert fa3.head_passes(p, 128) == 1
    its, _ = fa3.tile_sequence(p, 128, 128)
    assert its.size == 63 + 19
    assert its[0] == 8 and its[62] == 1  # request 0: last tile reaches token 999, first tile token 15
    assert its[63] == 3 and its[-1] == 1
    f = attention_features("fa3_ragged", 2, [1000, 300], [1000, 300], 8, 1, 128, hw("H800"))
    np.testing.assert_allclose(f, _ref_fa3(p, hw("H800")), rtol=1e-12, atol=0)


def test_fa3_ragged_one_token_prefills_take_a_tile_per_request_and_kv_head():
    """32 one-token prefills of 64 query heads: 32 x nkv packed tiles (measured on H100: 10.8-11.1 us up to nkv = 4,
    14.0 us at 8, 52.4 us at 64), whereas the unpacked rule counts 2,048 tiles whatever nkv."""
    gpu = hw("H100")
    tensor = {}
    for nkv in (1, 2, 4, 64):
        p = problem([1] * 32, [1] * 32, 64, nkv, 64)
        its, _ = fa3.tile_sequence(p, *fa3.tile_sizes(p))
        assert its.size * fa3.head_passes(p, fa3.tile_sizes(p)[0]) == 32 * nkv
        tensor[nkv] = attention_features("fa3_ragged", 32, [1] * 32, [1] * 32, 64, nkv, 64, gpu)[TENSOR_ALL]
    assert tensor[2] == 2 * tensor[1] and tensor[64] == 64 * tensor[1]


def test_a9_fa2_ragged_a100():
    check_printed(
        attention_features("fa2_ragged", 2, [1000, 300], [1000, 300], 8, 1, 128, hw("A100")),
        "2,781,216,768; 12,574.222; 51,904,512; 25,344; 5,390,208; 3,119.333; 88,320; 5,520;"
        "14,992; 9,886.738; 6,231.671; 256; 18,232.96; 2,048; 11,492.34",
    )


def test_a10_fa_ck_h20():
    p = problem([300, 300], [300, 300], 8, 8, 128)
    assert fa_ck.tile_sizes(p) == (128, 128)
    assert fa_ck.tile_iterations(p, 128, 128).tolist() == [1, 2, 3]
    check_printed(
        attention_features("ck", 2, [300, 300], [300, 300], 8, 8, 128, hw("H20")),
        "805,306,368; 10,082.46; 25,165,824; 24,576; 2,383,872; 1,910.154; 66,304; 4,144;"
        "7,680; 3,331.852; 1,520.513; 224; 7,579.96; 1,792; 3,459.17",
    )


def test_a11_fa_cutlass_rtx_pro_6000():
    p = problem([300, 50], [300, 500], 4, 1, 128)
    assert fa_cutlass.tile_sizes(p) == (128, 64)
    assert fa_cutlass.tile_extents(p, 128).tolist() == [300, 172, 44, 500]
    check_printed(
        attention_features("cutlass", 2, [300, 50], [300, 500], 4, 1, 128, hw("RTX PRO 6000 S")),
        "285,212,672; 1,481.532; 33,554,432; 32,768; 600,064; 199.489; 70,144; 4,384;"
        "1,600; 1,992.498; 479.656; 160; 37,458.96; 1,280; 9,017.53",
    )


# --------------------------------------------------------------------------- tile tables


@pytest.mark.parametrize(
    "cta_q, expected",
    [(128, (32, 64, 64)), (64, (64, 128, 128)), (16, (64, 128, 192))],
)
def test_fa2_cta_kv_table(cta_q, expected):
    """§3.6 step 3: cta_kv for hd 128, BF16, by shared memory per SM 100 / 164 / 228 KB."""
    assert tuple(fa2.cta_tile_kv(cta_q, 128, smem) for smem in (100, 164, 228)) == expected


def test_fa2_cta_kv_on_real_gpus():
    for name, smem in (("A40", 100), ("A100", 164), ("H100", 228), ("L40", 100)):
        gpu = hw(name)
        assert gpu.shared_memory_size == smem
        # avg packed length 6 -> cta_q 16; 40 -> 64; 1000 -> 128
        for q, cta_q in ((1, 16), (5, 64), (125, 128)):
            p = problem([q], [q + 10], 8, 1, 128)
            assert fa2.tile_sizes(p, gpu) == (cta_q, fa2.cta_tile_kv(cta_q, 128, smem))


def test_fa2_cta_q_rule():
    assert fa2.cta_tile_q([65], 128) == 128
    assert fa2.cta_tile_q([65], 256) == 64  # hd >= 256 never uses 128
    assert fa2.cta_tile_q([64], 128) == 64
    assert fa2.cta_tile_q([17], 128) == 64
    assert fa2.cta_tile_q([16], 128) == 16
    assert fa2.cta_tile_q([100, 1], 128) == 64  # floor(101 / 2) = 50


def test_fa2_cta_kv_invalid_candidates():
    # d_vo < 4 (hd < 64): every candidate invalid -> n = 1
    assert fa2.cta_tile_kv(64, 48, 228) == 16
    assert fa2.cta_tile_kv(16, 48, 228) == 64
    # d_vo = 4 (hd 64): odd n invalid; the smem limit is 3 -> n = 2
    assert fa2.cta_tile_kv(16, 64, 100) == 2 * 4 * 16
    # ds_kv = 1 with warps_q = 4: 2n must be a multiple of 4; smem limit 7 at 88 KB -> n = 6
    assert fa2.cta_tile_kv(64, 128, 88, 2, 1) == 6 * 16
    assert fa2.cta_tile_kv(64, 128, 88, 2, 2) == 3 * 16
    # accumulator budget: mma_q·(8·d_vo + 8·n) >= 256 for every n at cta_q 128, hd 256 -> n = 1
    assert fa2.cta_tile_kv(128, 256, 228) == 16


def test_fa2_kv_chunk_search():
    gpu = hw("A40")  # 84 SMs -> max_parallel = 168 // nkv
    # kv below min_chunk: chunk = min_chunk (128 ragged, 8 paged)
    assert fa2.kv_chunk_size(problem([1], [50], 8, 8, 128), gpu) == 128
    assert fa2.kv_chunk_size(problem([1], [5], 8, 8, 128, layout="paged"), gpu) == 8
    # one tile, kv 10000, nkv 1: smallest chunk with ceil(10000 / c) <= 168
    c = fa2.kv_chunk_size(problem([1], [10000], 8, 1, 128, layout="paged"), gpu)
    assert math.ceil(10000 / c) <= 168 < math.ceil(10000 / (c - 1))
    # more tiles than the grid allows: no split, chunk = longest kv
    assert fa2.kv_chunk_size(problem([1] * 200, [700] * 199 + [900], 8, 1, 128, layout="paged"), gpu) == 900


def test_fa2_sm_mapping_closed_form():
    ids = fa2.cta_sm_ids(14, 3).tolist()
    assert ids == [0, 1, 2, 0, 1, 2, 0, 0, 1, 1, 2, 2, 0, 0]


def test_fa3_tile_table():
    def tiles(hd, layout, causal=True):
        return fa3.tile_sizes(problem([1], [1], 1, 1, hd, layout=layout, causal=causal))

    assert tiles(64, "ragged") == (192, 128)
    assert tiles(128, "ragged") == (128, 128)
    assert tiles(128, "ragged", causal=False) == (128, 192)
    assert tiles(256, "ragged") == (128, 64)
    assert tiles(64, "paged") == (192, 96)
    assert tiles(128, "paged") == (128, 96)
    assert tiles(96, "paged") == (128, 32)


def test_fa_ck_and_cutlass_tile_tables():
    def ck(hd):
        return fa_ck.tile_sizes(problem([1], [1], 1, 1, hd))

    assert [ck(hd)[1] for hd in (32, 64, 96, 128, 160, 192, 256)] == [64, 64, 64, 128, 64, 64, 32]
    assert all(ck(hd)[0] == 128 for hd in (64, 128, 256))

    def cut(hd, causal=True):
        return fa_cutlass.tile_sizes(problem([1], [1], 1, 1, hd, causal=causal))

    assert cut(64) == (128, 128)
    assert cut(128) == (128, 64)
    assert cut(128, causal=False) == (128, 96)
    assert cut(192) == (128, 64)
    assert cut(256) == (128, 32)


# --------------------------------------------------------------------------- quirks


def test_fa3_head_replication_switch_at_8192_works():
    gpu = hw("H100")
    # paged hd 128: cta_q = 128; works = ceil(Σq / 128) + B − 1
    below = [8190 * 128, 128]  # works = 8191 + (B − 1) = 8192 -> nh head passes
    at_limit = [8191 * 128, 128]  # works = 8192 + 1 = 8193 -> a single head pass
    assert fa3.works(problem(below, below, 4, 1, 128, layout="paged"), 128) == 8192
    assert fa3.works(problem(at_limit, at_limit, 4, 1, 128, layout="paged"), 128) == 8193
    kw = dict(causal=False)
    f_below = {nh: attention_features("fa3_paged", 2, below, below, nh, 1, 128, gpu, **kw) for nh in (1, 2)}
    assert f_below[2][TENSOR_ALL] == 2 * f_below[1][TENSOR_ALL]
    f_above = {nh: attention_features("fa3_paged", 2, at_limit, at_limit, nh, 1, 128, gpu, **kw) for nh in (1, 2)}
    np.testing.assert_array_equal(f_above[1], f_above[2])  # one head pass whatever nh
    # a packed (ragged) launch has no switch: a second query head doubles the rows
    ragged = {nh: attention_features("fa3_ragged", 2, at_limit, at_limit, nh, 1, 128, gpu, **kw) for nh in (1, 2)}
    assert ragged[2][TENSOR_ALL] == 2 * ragged[1][TENSOR_ALL]


def test_fa3_stable_descending_sort_and_tie_break():
    # Requests 0 and 2 share kv 500 (kept in input order), request 1 (kv 900) goes first.
    p = problem([100, 50, 300], [500, 900, 500], 1, 1, 128, causal=False)
    its, deltas = fa3.tile_sequence(p, 128, 128)
    # order: req1 (1 tile), req0 (1 tile), req2 (3 tiles, t = 2, 1, 0)
    assert its.tolist() == [8, 4, 4, 4, 4]
    assert deltas.tolist() == [128 * 900, 128 * 500, 128 * 500, 128 * 500, 128 * 500]
    # heap: SM0 (900), SM1 (500), SM1 (1000), tie 1000 vs 1000 -> SM0, then SM1
    sm = fa3.heap_schedule(deltas.tolist(), 1, 2)
    assert sm.tolist() == [0, 1, 1, 0, 1]


def test_fa_ck_requires_uniform_lengths():
    with pytest.raises(ValueError, match="q_lengths"):
        attention_features("ck", 2, [10, 20], [30, 30], 4, 4, 128, hw("H20"))
    with pytest.raises(ValueError, match="kv_lengths"):
        attention_features("ck_ragged", 2, [10, 10], [30, 40], 4, 4, 128, hw("H20"))


def test_fa_ck_top_left_diagonal_ignores_prefix():
    p_short = problem([300], [300], 1, 1, 128)
    p_prefix = problem([300], [1000], 1, 1, 128)
    assert fa_ck.tile_iterations(p_short, 128, 128).tolist() == fa_ck.tile_iterations(p_prefix, 128, 128).tolist()


def test_fa2_mma_carries_33_over_32():
    f = attention_features("fa2_ragged", 1, [8], [225], 5, 1, 128, hw("A40"))
    assert f[TENSOR_ALL] == 2 * 2 * 4 * 64 * 64 * 128 * 33 / 32


# --------------------------------------------------------------------------- dispatch


def test_dispatch_and_layout():
    assert resolve_attention_type("fa2_paged") == ("fa2", "paged")
    assert resolve_attention_type("fa2_ragged") == ("fa2", "ragged")
    assert resolve_attention_type("fa3_ragged") == ("fa3", "ragged")
    assert resolve_attention_type("ck") == ("ck", "ragged")
    assert resolve_attention_type("ck_ragged") == ("ck", "ragged")
    assert resolve_attention_type("cutlass_ragged") == ("cutlass", "ragged")
    assert resolve_attention_type("FA2_Paged") == ("fa2", "paged")
    assert set(ATTENTION_CALCULATORS) == {"fa2", "fa3", "ck", "cutlass"}
    with pytest.raises(ValueError, match="unknown attention_type 'x'; expected one containing fa2, fa3, ck or cutlass"):
        attention_features("x", 1, [1], [1], 1, 1, 128, hw("A40"))
    with pytest.raises(ValueError, match="attention_type"):
        resolve_attention_type("fa2_paged_ragged")


@pytest.mark.parametrize("kind", ["fa2", "fa3", "fa2_page", "FA3_varlen"])
def test_fa2_fa3_type_without_a_layout_is_an_error(kind):
    """docs/METHOD.md §3.5 (the method specification's §7.3): the layout comes from "paged"/"ragged" in the type,
    else an error. FA2 and FA3 depend on it (FA2's minimum KV chunk is 8 paged, 128 ragged), and a type without
    either (a typo such as "fa2_page") was computed as ragged without a word: 10x fewer tensor ops than the paged
    launch it named."""
    with pytest.raises(ValueError, match=f"attention_type '{kind}' names no layout"):
        resolve_attention_type(kind)
    with pytest.raises(ValueError, match="names no layout"):
        attention_features(kind, 2, [1, 1], [50, 100], 32, 8, 128, hw("H100"))


def test_paged_and_ragged_differ_for_fa2_and_fa3():
    gpu = hw("H100")
    args = (2, [1, 1], [50, 100], 32, 8, 128, gpu)  # min chunk 8 (paged) vs 128 (ragged)
    assert not np.array_equal(attention_features("fa2_paged", *args), attention_features("fa2_ragged", *args))
    args = (2, [200, 100], [300, 700], 32, 8, 128, gpu)
    assert not np.array_equal(attention_features("fa3_paged", *args), attention_features("fa3_ragged", *args))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(bs=0, q_lengths=[], kv_lengths=[]), "bs"),
        (dict(bs=2, q_lengths=[1], kv_lengths=[1, 1]), "q_lengths"),
        (dict(bs=2, q_lengths=[1, 1], kv_lengths=[1]), "kv_lengths"),
        (dict(q_lengths=[0], kv_lengths=[4]), "q_lengths"),
        (dict(q_lengths=[-1], kv_lengths=[4]), "q_lengths"),
        (dict(q_lengths=[1], kv_lengths=[-4]), "kv_lengths"),
        (dict(q_lengths=[8], kv_lengths=[4]), "q_lengths"),
        (dict(nh=0), "nh"),
        (dict(nh=-8), "nh"),
        (dict(nkv=0), "nkv"),
        (dict(nh=6, nkv=4), "nh"),
        (dict(hd=0), "hd"),
        (dict(hd=-128), "hd"),
        (dict(q_lengths=[1.5], kv_lengths=[4]), "q_lengths"),
    ],
)
@pytest.mark.parametrize("kind", ["fa2_paged", "fa3_ragged", "ck", "cutlass"])
def test_invalid_inputs_name_the_field(kind, kwargs, field):
    args = dict(bs=1, q_lengths=[1], kv_lengths=[4], nh=8, nkv=2, hd=128)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        attention_features(kind, hw=hw("H100"), **args)


def test_fa2_requires_shared_memory_size():
    gpu = dataclasses.replace(hw("A40"), shared_memory_size=None)
    with pytest.raises(ValueError, match="A40: the FA2 calculator needs sharedMemorySize"):
        attention_features("fa2_ragged", 1, [8], [225], 5, 1, 128, gpu)


# --------------------------------------------------------------------------- literal reference implementations


def _pipes(mma_sm, xu_sm, bytes_sm, gpu):
    """Features from per-SM dicts of per-task lists, summed the plain way."""
    def tot(d):
        return sum(sum(v) for v in d.values()), max((sum(v) for v in d.values()), default=0)

    (m, m_sm), (x, x_sm), (b, b_sm) = tot(mma_sm), tot(xu_sm), tot(bytes_sm)
    return np.concatenate([
        compute_pipe(m, m_sm, gpu.tc_bf16, gpu.num_sms),
        compute_pipe(x, x_sm, gpu.xu_fp32, gpu.num_sms),
        memory_pipe(b, b_sm, gpu),
    ])


def _ref_fa2(p, gpu):
    g = p.num_qo_heads // p.num_kv_heads
    packed = [q * g for q in p.q_lengths]
    avg = sum(packed) // p.batch_size
    hd = p.head_dim
    cta_q = 128 if (avg > 64 and hd < 256) else 64 if avg > 16 else 16
    cta_kv = fa2.cta_tile_kv(cta_q, hd, gpu.shared_memory_size)
    page = 16 if p.layout == "paged" else 1
    low, high = max(128 // page, 1), max(1, max(p.kv_lengths))
    if p.layout == "paged" and not gpu.uses_sm90_gemm and not (max(p.q_lengths) == 1 and g > 1):
        low = max(low, max(p.kv_lengths))  # flash-attn FA2 varlen splits only GQA decode launches
    max_parallel = 2 * gpu.num_sms // p.num_kv_heads
    while low < high:
        mid = (low + high) // 2
        work = sum(-(-pk // cta_q) * -(-max(kv, 1) // mid) for pk, kv in zip(packed, p.kv_lengths))
        if work > max_parallel:
            low = mid + 1
        else:
            high = mid
    c = low
    ctas = []
    for q, kv, pk in zip(p.q_lengths, p.kv_lengths, packed):
        for t in range(-(-pk // cta_q)):
            for j in range(-(-kv // c)):
                z = min((j + 1) * c, kv) - j * c
                if p.causal:
                    upper = kv - q + -(-((t + 1) * cta_q) // g)
                    z = min(z, max(upper - j * c, 0))
                ctas += [-(-z // cta_kv)] * p.num_kv_heads
    S = gpu.num_sms
    mma, xu, nb = {}, {}, {}
    for j, it in enumerate(ctas):
        sm = j % S if j < 2 * S else ((j - 2 * S) % (2 * S)) // 2
        if it > 0:
            mma.setdefault(sm, []).append((4 * cta_q * cta_kv * hd * it) // 32 * 33)
            xu.setdefault(sm, []).append((32 + 4) * 128 * it + 128 * 128 + cta_q)
            nb.setdefault(sm, []).append(cta_q * hd * 2 + it * cta_kv * hd * 2)
    return _pipes(mma, xu, nb, gpu)


def _ref_heap_tasks(gpu, passes, order_tiles):
    heap = [(0, s) for s in range(gpu.num_sms)]
    heapq.heapify(heap)
    tasks = []
    for _ in range(passes):
        for it, delta in order_tiles:
            cost, sm = heapq.heappop(heap)
            if it > 0:
                tasks.append((sm, it))
            heapq.heappush(heap, (cost + delta, sm))
    return tasks


def _flash_costs(tasks, cta_q, cta_kv, hd, gpu):
    mma, xu, nb = {}, {}, {}
    for sm, it in tasks:
        mma.setdefault(sm, []).append(4 * cta_q * cta_kv * hd * it)
        xu.setdefault(sm, []).append(cta_q * cta_kv + (it - 1) * cta_q * (4 + cta_kv) + 8 * cta_q)
        nb.setdefault(sm, []).append(cta_q * hd * 2 + it * cta_kv * hd * 2)
    return _pipes(mma, xu, nb, gpu)


def _ref_fa3(p, gpu):
    cta_q, cta_kv = fa3.tile_sizes(p)
    if p.layout == "ragged":  # GQA packed: a pass per KV head, q x g rows (token-major, head fastest)
        g, passes = p.num_qo_heads // p.num_kv_heads, p.num_kv_heads
    else:
        works = -(-sum(p.q_lengths) // cta_q) + p.batch_size - 1
        g, passes = 1, 1 if works > 8192 else p.num_qo_heads
    order = sorted(range(p.batch_size), key=lambda i: p.kv_lengths[i], reverse=True)  # stable
    tiles = []
    for i in order:
        q, kv = p.q_lengths[i], p.kv_lengths[i]
        for t in range(-(-q * g // cta_q) - 1, -1, -1):
            last_token = min((t + 1) * cta_q, q * g) - 1
            reach = (t + 1) * cta_q + kv - q if g == 1 else last_token // g + 1 + kv - q
            it = -(-kv // cta_kv)
            if p.causal:
                it = min(it, -(-reach // cta_kv))
                delta = cta_q * max(min(reach, kv), 0)
            else:
                delta = cta_q * kv
            tiles.append((it, delta))
    return _flash_costs(_ref_heap_tasks(gpu, passes, tiles), cta_q, cta_kv, p.head_dim, gpu)


def _ref_cutlass(p, gpu):
    cta_q, cta_kv = fa_cutlass.tile_sizes(p)
    heap = [(0.0, s) for s in range(gpu.num_sms)]
    tasks = []
    for _h in range(p.num_qo_heads):
        for q, kv in zip(p.q_lengths, p.kv_lengths):
            n = -(-q // cta_q)
            for t in range(n - 1, -1, -1):
                cost, b = heapq.heappop(heap)
                e = max(0, kv - (n - t - 1) * cta_q) if p.causal else kv
                if e > 0:
                    tasks.append((b, -(-e // cta_kv)))
                heapq.heappush(heap, (cost + cta_q * e, b))
    return _flash_costs(tasks, cta_q, cta_kv, p.head_dim, gpu)


def _ref_ck(p, gpu):
    m0, n0 = fa_ck.tile_sizes(p)
    sq, sk = p.q_lengths[0], p.kv_lengths[0]
    hd = p.head_dim
    mma, xu, nb = {}, {}, {}
    ptr = 0
    for _b in range(p.batch_size):
        for _h in range(p.num_qo_heads):
            for t in range(-(-sq // m0)):
                n_k = -(-sk // n0)
                n_t = min(-(-min((t + 1) * m0, sq) // n0), n_k) if p.causal else n_k
                if n_t > 0:
                    sm = ptr % gpu.num_sms
                    ptr += 1
                    mma.setdefault(sm, []).append(4 * m0 * n0 * hd * n_t)
                    xu.setdefault(sm, []).append((m0 * n0 + 2 * m0) * n_t + m0 * hd)
                    nb.setdefault(sm, []).append(m0 * hd * 2 + n_t * 2 * n0 * hd * 2)
    return _pipes(mma, xu, nb, gpu)


REFERENCES = {"fa2": (fa2, _ref_fa2), "fa3": (fa3, _ref_fa3), "ck": (fa_ck, _ref_ck), "cutlass": (fa_cutlass, _ref_cutlass)}
GPUS = ("A40", "A100", "H100", "L40", "RTX PRO 6000 S")


@st.composite
def attention_problems(draw, uniform=False, max_len=400):
    bs = draw(st.integers(1, 4))
    nkv = draw(st.integers(1, 4))
    nh = nkv * draw(st.sampled_from([1, 2, 3, 4, 8]))
    hd = draw(st.sampled_from([32, 64, 96, 128, 192, 256]))
    if uniform:
        q = [draw(st.integers(1, max_len))] * bs
        kv = [q[0] + draw(st.integers(0, max_len))] * bs
    else:
        q = draw(st.lists(st.integers(1, max_len), min_size=bs, max_size=bs))
        kv = [x + draw(st.integers(0, max_len)) for x in q]
    layout = draw(st.sampled_from(["paged", "ragged"]))
    causal = draw(st.booleans())
    return AttentionProblem(bs, tuple(q), tuple(kv), nh, nkv, hd, layout=layout, causal=causal)


SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(p=attention_problems(), kind=st.sampled_from(["fa2", "fa3", "cutlass"]),
       gpu=st.sampled_from(GPUS), sms=st.integers(1, 9))
def test_matches_literal_reference_on_small_gpus(p, kind, gpu, sms):
    """Vectorised task lists, closed-form SM mapping and packed heap keys equal a literal per-CTA loop."""
    small = dataclasses.replace(hw(gpu), num_sms=sms)
    module, reference = REFERENCES[kind]
    np.testing.assert_allclose(module.features(p, small), reference(p, small), rtol=1e-12, atol=0)


@SETTINGS
@given(p=attention_problems(uniform=True), gpu=st.sampled_from(GPUS), sms=st.integers(1, 9))
def test_fa_ck_matches_literal_reference(p, gpu, sms):
    small = dataclasses.replace(hw(gpu), num_sms=sms)
    np.testing.assert_allclose(fa_ck.features(p, small), _ref_ck(p, small), rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- properties


def _uniform(p):
    return dataclasses.replace(p, q_lengths=(p.q_lengths[0],) * p.batch_size,
                               kv_lengths=(p.kv_lengths[0],) * p.batch_size)


def _features(kind, p, gpu):
    if kind == "ck":
        p = _uniform(p)
    return REFERENCES[kind][0].features(p, gpu)


@SETTINGS
@given(p=attention_problems(), kind=st.sampled_from(sorted(REFERENCES)), gpu=st.sampled_from(GPUS))
def test_features_finite_non_negative_and_consistent(p, kind, gpu):
    spec = hw(gpu)
    f = _features(kind, p, spec)
    assert f.shape == (15,) and f.dtype == np.float64
    assert np.all(np.isfinite(f)) and np.all(f >= 0)
    for all_ix, sm_ix in ((TENSOR_ALL, TENSOR_SM), (XU_ALL, XU_SM), (KIB_ALL, KIB_SM)):
        assert 0 < f[sm_ix] <= f[all_ix] <= spec.num_sms * f[sm_ix]
    assert f[1] == pytest.approx(f[0] / spec.tc_bf16 / spec.num_sms, rel=1e-12)
    assert f[5] == pytest.approx(f[4] / spec.xu_fp32 / spec.num_sms, rel=1e-12)
    assert f[0] == int(f[0]) and f[4] == int(f[4])  # op counts are integers
    if kind == "fa2":
        assert int(f[0]) % 33 == 0  # the 33/32 inflation


@SETTINGS
@given(p=attention_problems(), kind=st.sampled_from(["fa2", "fa3"]), gpu=st.sampled_from(GPUS))
def test_fa2_fa3_tensor_ops_cover_the_attention_flops(p, kind, gpu):
    """Every (query row, visible key) pair of every head is inside some processed tile (FA2, FA3; FA3
    only while all heads are scheduled, which small problems guarantee). FA-CK ignores the kv − q offset
    and FA-CUTLASS counts extents back from the padded last tile, so neither has this bound."""
    if p.causal:
        pairs = sum(q * (kv - q) + q * (q + 1) // 2 for q, kv in zip(p.q_lengths, p.kv_lengths))
    else:
        pairs = sum(q * kv for q, kv in zip(p.q_lengths, p.kv_lengths))
    f = _features(kind, p, hw(gpu))
    assert f[TENSOR_ALL] >= 4 * p.head_dim * p.num_qo_heads * pairs


TOTALS = (TENSOR_ALL, XU_ALL, KIB_ALL)


def _assert_not_smaller(before, after):
    for ix in TOTALS:
        assert after[ix] >= before[ix], (ATTENTION_FEATURES[ix], before[ix], after[ix])


@SETTINGS
@given(p=attention_problems(), kind=st.sampled_from(["fa3", "ck", "cutlass"]), gpu=st.sampled_from(GPUS),
       which=st.integers(0, 3), extra=st.integers(1, 300))
def test_totals_grow_with_kv(p, kind, gpu, which, extra):
    """FA3/FA-CK/FA-CUTLASS: a longer KV never reduces total ops or bytes (tiling and heads fixed)."""
    if kind == "ck":
        p = _uniform(p)
    i = which % p.batch_size
    kv = list(p.kv_lengths)
    kv[i] += extra
    if kind == "ck":
        kv = [kv[i]] * p.batch_size
    grown = dataclasses.replace(p, kv_lengths=tuple(kv))
    _assert_not_smaller(_features(kind, p, hw(gpu)), _features(kind, grown, hw(gpu)))


@SETTINGS
@given(p=attention_problems(), kind=st.sampled_from(["fa3", "ck", "cutlass"]), gpu=st.sampled_from(GPUS),
       which=st.integers(0, 3), extra=st.integers(1, 300))
def test_totals_grow_with_new_tokens(p, kind, gpu, which, extra):
    """FA3/FA-CK/FA-CUTLASS: q and kv of one request growing together (more new tokens, same prefix) never
    reduce totals. (FA3 with a growing q alone can shrink: the causal offset kv − q shrinks.)"""
    if kind == "ck":
        p = _uniform(p)
    i = which % p.batch_size
    q, kv = list(p.q_lengths), list(p.kv_lengths)
    q[i] += extra
    kv[i] += extra
    if kind == "ck":
        q, kv = [q[i]] * p.batch_size, [kv[i]] * p.batch_size
    grown = dataclasses.replace(p, q_lengths=tuple(q), kv_lengths=tuple(kv))
    assert fa3.works(grown, 128) <= fa3.HEAD_REPLICATION_LIMIT  # all heads scheduled in both
    _assert_not_smaller(_features(kind, p, hw(gpu)), _features(kind, grown, hw(gpu)))


@SETTINGS
@given(p=attention_problems(), kind=st.sampled_from(["ck", "cutlass"]), gpu=st.sampled_from(GPUS),
       which=st.integers(0, 3), extra=st.integers(1, 300))
def test_totals_grow_with_q_for_ck_and_cutlass(p, kind, gpu, which, extra):
    """FA-CK and FA-CUTLASS only add q tiles when q grows (existing extents do not shrink)."""
    if kind == "ck":
        p = _uniform(p)
    i = which % p.batch_size
    q = list(p.q_lengths)
    q[i] = min(q[i] + extra, p.kv_lengths[i])
    if kind == "ck":
        q = [q[i]] * p.batch_size
    grown = dataclasses.replace(p, q_lengths=tuple(q))
    _assert_not_smaller(_features(kind, p, hw(gpu)), _features(kind, grown, hw(gpu)))


@SETTINGS
@given(p=attention_problems(), kind=st.sampled_from(["fa3", "ck", "cutlass"]), gpu=st.sampled_from(GPUS),
       extra_groups=st.integers(1, 4))
def test_totals_scale_with_heads_and_ignore_nkv(p, kind, gpu, extra_groups):
    """FA3 paged, FA-CK and FA-CUTLASS schedule every q head separately: totals are exactly proportional to nh
    (small problems keep FA3 below the 8192-works switch) and nkv is ignored."""
    if kind == "fa3":
        p = dataclasses.replace(p, layout="paged")
    nh = p.num_qo_heads + extra_groups * p.num_kv_heads
    base = _features(kind, p, hw(gpu))
    more = _features(kind, dataclasses.replace(p, num_qo_heads=nh), hw(gpu))
    for ix in TOTALS:
        assert more[ix] * p.num_qo_heads == pytest.approx(base[ix] * nh, rel=1e-12)
    one_kv = _features(kind, dataclasses.replace(p, num_kv_heads=1), hw(gpu))
    np.testing.assert_array_equal(base, one_kv)


@SETTINGS
@given(p=attention_problems(), gpu=st.sampled_from(GPUS), more_kv=st.integers(2, 4))
def test_fa3_ragged_totals_scale_with_kv_heads_at_a_fixed_group(p, gpu, more_kv):
    """FA3 ragged packs each GQA group into its tiles: at a fixed group size, a pass per KV head of the same
    tiles, so totals are exactly proportional to nkv."""
    p = dataclasses.replace(p, layout="ragged")
    group = p.num_qo_heads // p.num_kv_heads
    more = dataclasses.replace(p, num_qo_heads=group * p.num_kv_heads * more_kv,
                               num_kv_heads=p.num_kv_heads * more_kv)
    base, scaled = fa3.features(p, hw(gpu)), fa3.features(more, hw(gpu))
    for ix in TOTALS:
        assert scaled[ix] == pytest.approx(base[ix] * more_kv, rel=1e-12)


@SETTINGS
@given(p=attention_problems(max_len=60), gpu=st.sampled_from(GPUS), extra=st.integers(1, 60),
       which=st.integers(0, 3), more_kv=st.integers(1, 4))
def test_fa2_single_chunk_regime(p, gpu, extra, which, more_kv):
    """FA2, ragged with every kv <= 128: one KV chunk per tile, so growing a kv never reduces totals and
    totals are proportional to nkv at a fixed GQA group. (Outside this regime the chunk size chosen by
    the split-KV search changes with kv and nkv, and totals are not monotone.)"""
    p = dataclasses.replace(p, layout="ragged")
    assume(max(p.kv_lengths) + extra <= 128)
    spec = hw(gpu)
    assert fa2.kv_chunk_size(p, spec) == 128
    kv = list(p.kv_lengths)
    kv[which % p.batch_size] += extra
    _assert_not_smaller(fa2.features(p, spec), fa2.features(dataclasses.replace(p, kv_lengths=tuple(kv)), spec))
    g = p.num_qo_heads // p.num_kv_heads
    nkv = p.num_kv_heads + more_kv
    wider = fa2.features(dataclasses.replace(p, num_qo_heads=g * nkv, num_kv_heads=nkv), spec)
    base = fa2.features(p, spec)
    for ix in TOTALS:
        assert wider[ix] * p.num_kv_heads == pytest.approx(base[ix] * nkv, rel=1e-12)


@SETTINGS
@given(p=attention_problems(), kind=st.sampled_from(["fa3", "cutlass"]), gpu=st.sampled_from(GPUS),
       extra=st.integers(1, 300), causal=st.booleans())
def test_totals_grow_with_an_added_request(p, kind, gpu, extra, causal):
    p = dataclasses.replace(p, causal=causal)
    grown = dataclasses.replace(p, batch_size=p.batch_size + 1, q_lengths=p.q_lengths + (extra,),
                                kv_lengths=p.kv_lengths + (extra + 7,))
    _assert_not_smaller(_features(kind, p, hw(gpu)), _features(kind, grown, hw(gpu)))


def test_fa2_paged_mha_decode_does_not_split_off_hopper():
    """flash-attn's FA2 varlen kernel (vLLM on Ampere, Ada, RTX PRO) splits the KV of a paged decode launch only
    for a GQA group; Hopper's decode kernel splits every launch (fa2.splits_kv)."""
    mha, gqa = problem([1], [131072], 8, 8, 128, layout="paged"), problem([1], [131072], 16, 8, 128, layout="paged")
    for name in ("A100", "L40S", "RTX PRO 6000 S"):
        gpu = hw(name)
        assert not fa2.splits_kv(mha, gpu) and fa2.kv_chunk_size(mha, gpu) == 131072
        assert fa2.splits_kv(gqa, gpu) and fa2.kv_chunk_size(gqa, gpu) < 131072
        mha_its = fa2.cta_iterations(mha, *fa2.tile_sizes(mha, gpu), fa2.kv_chunk_size(mha, gpu))
        assert mha_its.size == 8  # one CTA per KV head, over the whole KV
    assert fa2.splits_kv(mha, hw("H100")) and fa2.kv_chunk_size(mha, hw("H100")) < 131072
    # ragged launches keep the template's rule; a paged launch with q > 1 is no GQA decode step either
    assert fa2.splits_kv(problem([1], [131072], 8, 8, 128), hw("A100"))
    assert not fa2.splits_kv(problem([4], [131072], 8, 8, 128, layout="paged"), hw("A100"))
    # the batched calculator follows the same rule
    np.testing.assert_array_equal(fa2_batch.features_many([mha, gqa], hw("A100")),
                                  np.stack([fa2.features(mha, hw("A100")), fa2.features(gqa, hw("A100"))]))


def _num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    """flash-attn's flash_api.cpp num_splits_heuristic, line by line."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    efficiency = []
    for num_splits in range(1, max_splits + 1):
        if num_splits > 1 and math.ceil(num_n_blocks / num_splits) == math.ceil(num_n_blocks / (num_splits - 1)):
            efficiency.append(0.0)
            continue
        n_waves = batch_nheads_mblocks * num_splits / num_sms
        efficiency.append(n_waves / math.ceil(n_waves))
    best = max(efficiency)
    for num_splits in range(1, max_splits + 1):
        eligible = num_splits == 1 or efficiency[num_splits - 1] > 0
        if eligible and efficiency[num_splits - 1] >= 0.85 * best:
            return num_splits
    return 1


def test_fa2_varlen_num_splits_is_flash_attn_heuristic():
    rng = np.random.default_rng(0)
    ctas, blocks = rng.integers(1, 500, 2000), rng.integers(1, 700, 2000)
    for num_sms in (2 * 84, 2 * 108, 2 * 142, 2 * 188):
        expected = [_num_splits_heuristic(int(c), num_sms, int(b), fa2.VARLEN_MAX_SPLITS) for c, b in zip(ctas, blocks)]
        np.testing.assert_array_equal(fa2.varlen_num_splits(ctas, num_sms, blocks), expected)


def _launches(gpu, bs, q, kv, nh, nkv, hd):
    return tuple(fa2.varlen_auxiliary_launches([bs], [q], [kv], [nh], [nkv], [hd], hw(gpu))[0])


def test_fa2_varlen_auxiliary_launches():
    """A GQA decode launch through flash-attn's FA2 varlen kernel copies q and its output across a transpose when
    the reshape is no view, and a launch that splits the KV is followed by a combine kernel: one KV block (128
    tokens at head dimension 128, 256 at 64) never splits, two do when the CTAs leave the SMs idle."""
    for gpu in ("A100", "L40S", "RTX PRO 6000 S"):
        assert _launches(gpu, 1, 1, 128, 32, 8, 128) == (0, 0)
        assert _launches(gpu, 1, 1, 256, 32, 8, 128) == (0, 1)
        assert _launches(gpu, 1, 1, 256, 32, 8, 64) == (0, 0)
        assert _launches(gpu, 1, 1, 512, 32, 8, 64) == (0, 1)
        assert _launches(gpu, 2, 1, 16, 32, 8, 128) == (1, 0)  # two requests: the transpose is no view
        assert _launches(gpu, 16, 1, 16, 32, 1, 128) == (0, 0)  # one KV head: it is
        assert _launches(gpu, 16, 1, 4096, 32, 32, 128) == (0, 0)  # MHA is not packed, so not split either
        assert _launches(gpu, 16, 8, 4096, 32, 8, 128) == (0, 0)  # a prefill (q > 1) is not packed
        assert _launches(gpu, 256, 1, 4096, 32, 8, 128) == (1, 0)  # 2048 CTAs fill the SMs: no split
    for gpu in ("H100", "B200"):  # FA3 packs the group in the kernel
        assert _launches(gpu, 2, 1, 4096, 32, 8, 128) == (0, 0)


def test_attention_descriptors_carry_the_launches_of_fa2_rows_only():
    from analytical_model.registry import get_operator

    operator = get_operator("attn")
    columns = {"attention_type": np.array(["fa2_paged", "fa2_paged", "fa3_ragged"]), "bs": np.array([2, 1, 2]),
               "q_lengths": np.array(["[1,1]", "[1]", "[1,1]"]),
               "kv_lengths": np.array(["[300,20]", "[64]", "[300,20]"]),
               "nh": np.array([32, 32, 32]), "nkv": np.array([8, 8, 8]), "hd": np.array([128, 128, 128])}
    described = operator.describe(columns, hw("A100"))
    assert described.shape == (3, len(operator.descriptor_names))
    launches = described[:, [operator.descriptor_names.index(n) for n in ("varlen_gqa_copies", "varlen_split_combine")]]
    np.testing.assert_array_equal(launches, [[1, 1], [0, 0], [0, 0]])  # the longest KV (300) sets the blocks


def test_attention_tile_latency_is_a_microsecond_per_query_tile_on_the_busiest_sm():
    """One µs per 64-row tile of a KV head's packed query rows, on the busiest SM, in cycles of the GPU's clock: a
    latency in time, so a slower clock has fewer cycles of it and a GPU with more SMs fewer tiles per SM."""
    from analytical_model.registry import get_operator

    operator = get_operator("attn")
    column = operator.descriptor_names.index("tile_latency_cycle")
    many_decodes = "[" + ",".join(["1"] * 1024) + "]"
    columns = {"attention_type": np.array(["fa2_paged", "fa2_paged", "fa3_ragged"]), "bs": np.array([1024, 1, 2]),
               "q_lengths": np.array([many_decodes, "[4096]", "[1,130]"]),
               "kv_lengths": np.array([many_decodes.replace("1", "16"), "[4096]", "[300,200]"]),
               "nh": np.array([32, 32, 32]), "nkv": np.array([8, 8, 8]), "hd": np.array([128, 128, 128])}
    a100 = hw("A100")  # 108 SMs
    # 1,024 requests x 8 KV heads x one tile of 4 query rows; 8 x 4,096 x 4 / 64 tiles; 8 x (1 + 9) tiles
    expected_tiles_per_sm = [math.ceil(8192 / 108), math.ceil(2048 / 108), 1]
    np.testing.assert_allclose(operator.describe(columns, a100)[:, column],
                               np.array(expected_tiles_per_sm) * a100.sm_freq)
    slower = dataclasses.replace(a100, sm_freq=a100.sm_freq / 2)
    np.testing.assert_allclose(operator.describe(columns, slower)[:, column],
                               operator.describe(columns, a100)[:, column] / 2)
    wider = dataclasses.replace(a100, num_sms=2 * 8192)
    assert operator.describe(columns, wider)[0, column] == a100.sm_freq
