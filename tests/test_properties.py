"""Property tests of the GEMM, element-wise and MoE calculators and of the tile rule."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from analytical_model import gemm_fp8, gemm_sm80, gemm_sm90, rmsnorm, siluandmul, triton_moe
from analytical_model.hardware import load_hardware
from analytical_model.pipes import ElementwiseProblem, GemmProblem, MoeProblem
from analytical_model.registry import compute_features
from analytical_model.tiles import choose_gemm_tiles

GPUS = ["A100", "A40", "L40", "H100", "H20", "RTX PRO 6000 S", "B200", "L40S"]
dims = st.integers(1, 20000)
tile = st.sampled_from([8, 16, 32, 64, 128, 256])
FEW = settings(max_examples=40, deadline=None)

OPS_COL, BYTES_COL = 0, 4  # tensor/fma all_ops, global_in_flight


def gemm_features(calc, m, n, k, tm, tn, tk, cta, split, hw):
    return calc.features(GemmProblem.create(m, n, k, tm, tn, tk, cta, split), hw)[0]


@FEW
@given(m=dims, n=dims, k=dims, tm=tile, tn=tile, tk=tile, cta=st.integers(1, 2000), split=st.booleans(),
       grow=st.integers(1, 5000), axis=st.sampled_from("mnk"), gpu=st.sampled_from(GPUS))
def test_gemm_finite_nonnegative_and_monotone(m, n, k, tm, tn, tk, cta, split, grow, axis, gpu):
    hw = load_hardware(gpu)
    calcs = [gemm_sm80, gemm_sm90] + ([gemm_fp8] if hw.tc_fp8 else [])
    bigger = dict(m=m, n=n, k=k)
    bigger[axis] += grow
    for calc in calcs:
        base = gemm_features(calc, m, n, k, tm, tn, tk, cta, split, hw)
        grown = gemm_features(calc, bigger["m"], bigger["n"], bigger["k"], tm, tn, tk, cta, split, hw)
        assert np.all(np.isfinite(base)) and np.all(base >= 0)
        assert grown[OPS_COL] >= base[OPS_COL] * (1 - 1e-12)  # SM90 replication is a real-valued ratio
        assert grown[BYTES_COL] >= base[BYTES_COL]


@FEW
@given(m=dims, n=dims, k=dims, gpu=st.sampled_from(GPUS), dtype=st.sampled_from(["bfloat16", "fp8"]))
def test_tile_rule_covers_the_problem(m, n, k, gpu, dtype):
    hw = load_hardware(gpu)
    assume(dtype != "fp8" or hw.tc_fp8)
    t = choose_gemm_tiles(m, n, k, hw, dtype)
    tiles = -(-m // t["tile_M"]) * -(-n // t["tile_N"])
    assert t["cta_count"][0] >= 1
    if hw.uses_sm90_gemm and dtype == "bfloat16" and not t["is_split_k"][0]:
        assert t["cta_count"][0] == min(tiles[0], hw.num_sms)
    else:
        assert t["cta_count"][0] % tiles[0] == 0
    frame = pd.DataFrame({"M": [m], "N": [n], "K": [k], "hardware": [gpu]})
    out = compute_features("gemm_fp8" if dtype == "fp8" else "gemm", frame)
    assert out["tensor_all_ops"].iloc[0] >= 2.0 * m * n * k
    assert np.all(np.isfinite(out.to_numpy())) and np.all(out.to_numpy() >= 0)


def test_tile_rule_is_deterministic_and_vectorised():
    hw = load_hardware("H100")
    m = np.array([1, 16, 128, 4096, 32768])
    a = choose_gemm_tiles(m, 8192, 8192, hw)
    b = {key: np.array([choose_gemm_tiles(int(x), 8192, 8192, hw)[key][0] for x in m]) for key in a}
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    decode = choose_gemm_tiles(1, 8192, 8192, hw)
    assert decode["tile_M"][0] <= 32  # skinny kernel for a decode GEMM


@FEW
@given(seq=st.integers(1, 70000), dim=st.integers(8, 40000), grow=st.integers(1, 4096),
       axis=st.sampled_from(["seq", "dim"]), gpu=st.sampled_from(GPUS))
def test_elementwise_finite_and_monotone(seq, dim, grow, axis, gpu):
    """Bytes always grow with seq and dim; ops grow with seq, and with dim inside one vectorisation regime.

    Across regimes the reference rules are not monotone in dim (by design of docs/METHOD.md §3.10-3.11): an
    odd dim drops RMSNorm's vector width from 8 to 1, and above 8192 the tail term is added on top of
    rounded-up rounds, so dim 20480 counts more work than 24576. Those rules are reproduced exactly
    (Appendix A.12), so the property is stated for dims that are multiples of 8 up to 8192.
    """
    hw = load_hardware(gpu)
    bigger = {"seq": seq, "dim": dim}
    bigger[axis] += grow
    for calc in (rmsnorm, siluandmul):
        base = calc.features(ElementwiseProblem.create(seq, dim), hw)[0]
        grown = calc.features(ElementwiseProblem.create(bigger["seq"], bigger["dim"]), hw)[0]
        assert np.all(np.isfinite(base)) and np.all(base >= 0)
        assert grown[8] >= base[8]  # global_in_flight
        same_regime = axis == "seq" or (dim % 8 == 0 and bigger["dim"] % 8 == 0 and bigger["dim"] <= 8192)
        if same_regime:
            assert grown[OPS_COL] >= base[OPS_COL]


@FEW
@given(m=st.integers(1, 9000), e=st.sampled_from([8, 16, 32, 60, 64, 128]), topk=st.sampled_from([1, 2, 4, 6, 8]),
       h=st.integers(1, 64).map(lambda x: 64 * x), n=st.integers(1, 64).map(lambda x: 64 * x),
       gpu=st.sampled_from(GPUS), pass_type=st.sampled_from(["w13", "w2"]))
def test_moe_covers_routed_work(m, e, topk, h, n, gpu, pass_type):
    f = triton_moe.features(MoeProblem.create(m, e, topk, h, n, pass_type), load_hardware(gpu))[0]
    width = 2 * n if pass_type == "w13" else n
    assert np.all(np.isfinite(f)) and np.all(f >= 0)
    assert f[0] >= 2.0 * m * topk * width * h


@pytest.mark.parametrize(
    "factory,field",
    [
        (lambda: GemmProblem.create(0, 1, 1, 16, 16, 16, 1), "M"),
        (lambda: GemmProblem.create(4, -2, 1, 16, 16, 16, 1), "N"),
        (lambda: GemmProblem.create(4, 2, 1.5, 16, 16, 16, 1), "K"),
        (lambda: GemmProblem.create(4, 2, 1, 0, 16, 16, 1), "tile_M"),
        (lambda: GemmProblem.create(4, 2, 1, 16, 16, 16, 0), "cta_count"),
        (lambda: ElementwiseProblem.create(0, 128), "seq"),
        (lambda: ElementwiseProblem.create(3, -8), "dim"),
        (lambda: MoeProblem.create(3, 8, 2, 64, 64, "w3"), "weight_type"),
        (lambda: MoeProblem.create(3, 8, 9, 64, 64), "topk"),
        (lambda: siluandmul.features(ElementwiseProblem.create(3, 4), load_hardware("A100")), "dim"),
        (lambda: choose_gemm_tiles(4, 4, 4, load_hardware("A100"), "int3"), "dtype"),
        (lambda: gemm_fp8.features(GemmProblem.create(4, 4, 4, 128, 128, 128, 1), load_hardware("A100")), "tcFp8"),
    ],
)
def test_invalid_inputs_name_the_field(factory, field):
    with pytest.raises(ValueError, match=field):
        factory()


def test_registry_rejects_unknown_gpu_naming_the_row():
    frame = pd.DataFrame({"M": [4, 4], "N": [4, 4], "K": [4, 4], "hardware": ["A100", "V100"]})
    # rows are counted from 1, as in every message of the command-line tools
    with pytest.raises(ValueError, match=r"row 2: unknown GPU 'V100'"):
        compute_features("gemm", frame)
