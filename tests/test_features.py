"""Appendix A test vectors for GEMM, element-wise and MoE calculators, plus the FP8 dataset."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analytical_model import gemm_fp8, gemm_sm80, gemm_sm90, rmsnorm, siluandmul, triton_moe
from analytical_model.hardware import load_hardware
from analytical_model.pipes import ElementwiseProblem, GemmProblem, MoeProblem
from analytical_model.descriptors import GEMM_DESCRIPTORS
from analytical_model.registry import GEMM_FEATURES, compute_features, get_operator


def approx(values, rel=1e-6):
    return pytest.approx(values, rel=rel)


def check(actual, expected, digits_rel=1e-6):
    """Appendix values are rounded for display: compare each to its printed precision."""
    actual = np.asarray(actual).ravel()
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        text = repr(e)
        decimals = len(text.split(".")[1]) if "." in text else 0
        tol = max(abs(e) * digits_rel, 0.5 * 10 ** (-decimals))
        assert abs(a - e) <= tol, (a, e)


def test_a1_gemm_sm80_a40():
    p = GemmProblem.create(3, 2560, 8192, 64, 128, 64, 60, True)
    f = gemm_sm80.features(p, load_hardware("A40"))
    check(f, [2684354560, 31207.619, 45088768, 44032, 41984, 100083.85, 28669.946, 1032, 206651.79, 8256, 59197.32])
    perf = f[0, 1] / (1026.7022 * 1740)
    assert perf == approx(0.0174690, rel=1e-5)


def test_a2_gemm_sm90_persistent_h200():
    p = GemmProblem.create(50, 1024, 256, 64, 8, 64, 128, False)
    f = gemm_sm90.features(p, load_hardware("H200"))
    check(f, [2**25, 62.0606, 262144, 64, 544, 193.097, 91.2623, 36, 1686.76, 288, 797.203])


def test_a3_gemm_sm90_split_k_h200():
    p = GemmProblem.create(84, 640, 3072, 24, 64, 64, 80, True)
    f = gemm_sm90.features(p, load_hardware("H200"))
    check(f, [377487360, 698.1818, 4718592, 1152, 4416, 1567.496, 740.835, 264, 12369.59, 2112, 5846.16])


def test_a4_gemm_fp8_h20():
    p = GemmProblem.create(108, 8192, 1024, 128, 128, 128, 1, False, data_size_bytes=1)
    hw = load_hardware("H20")
    f = gemm_fp8.features(p, hw)
    check(f, [2147483648, 13443.282, 33554432, 16384, 8320, 3609.506, 1647.222, 256, 8662.815, 2048, 3953.333])
    assert f[0, 1] / (13.6596 * hw.sm_freq) == approx(0.537794, rel=1e-5)


def test_a12_rmsnorm():
    f = rmsnorm.features(ElementwiseProblem.create(2, 128), load_hardware("H20"))
    check(f, [164.917476, 0.0165182, 82.458738, 0.644209, 10.000002, 0.00801282, 5.000001, 0.3125,
              0.5, 0.216917, 0.0989917, 0.25, 8.45978, 2, 3.86068])
    assert (f[0, 1] + f[0, 5]) / (1.8836 * 1830) == approx(7.1166e-6, rel=1e-4)
    f = rmsnorm.features(ElementwiseProblem.create(3, 12288), load_hardware("A100"))
    check(f, [13838.516, 2.0021, 4612.839, 72.0756, 640.000128, 0.37037, 213.333376, 13.3333,
              72, 47.4817, 29.928, 24, 1709.34, 192, 1077.41])


def test_a13_siluandmul():
    f = siluandmul.features(ElementwiseProblem.create(8097, 768), load_hardware("H200"))
    check(f, [1336005, 79.0723, 10230, 79.9219, 461529, 218.527, 3534, 220.875,
              12145.5, 4311.147, 2037.549, 93, 4357.47, 744, 2059.44])
    f = siluandmul.features(ElementwiseProblem.create(200, 27648), load_hardware("A100"))
    check(f, [2816000, 407.407, 28160, 440, 972800, 562.963, 9728, 608,
              10800, 7122.25, 4489.20, 108, 7692.03, 864, 4848.33])


def test_a14_triton_moe():
    hw = load_hardware("A100")
    bm, bn = triton_moe.block_sizes(np.array([300]), np.array([64]), np.array([2048]), hw.shared_memory_size)
    assert (bm[0], bn[0]) == (64, 128)
    w13 = triton_moe.features(MoeProblem.create(300, 64, 6, 2048, 1408, "w13"), hw)
    check(w13, [47244640256, 213598.81, 469762048, 229376, 1081344, 713111.3, 449478.4, 10752, 765784.3, 86016, 482678.5])
    w2 = triton_moe.features(MoeProblem.create(300, 64, 6, 2048, 1408, "w2"), hw)
    check(w2, [23622320128, 106799.41, 230686720, 112640, 540672, 356555.7, 224739.2, 5280, 376054.8, 42240, 237029.6])


def test_moe_bytes_do_not_overflow_at_the_shape_limits():
    """At the limits of pipeweave.validation (M = 2^20 tokens at topk = 1000, H = N near 2^20) CTAs x bytes per CTA
    passed 2^63: int64 wrapped, and the DRAM features came out negative (w2 of 10^6 everywhere) or zero (powers of
    two), silently, with an overflow warning from the band."""
    hw = load_hardware("H100")
    loaded = get_operator("moe").feature_names.index("global_in_flight")  # KiB
    for shape in ((1000000, 1000, 1000, 1000000, 1000000), (2 ** 20, 1024, 1024, 2 ** 20, 2 ** 20)):
        m, _, topk, h, n = shape
        for kind, width in (("w13", h), ("w2", n)):
            features = triton_moe.features(MoeProblem.create(*shape, kind), hw)[0]
            assert np.isfinite(features).all() and (features > 0).all(), (shape, kind)
            # at least every routed token's activation row, read once
            assert features[loaded] >= m * topk * width * 2 / 1024, (shape, kind, features[loaded])


def test_registry_gemm_uses_given_tiles():
    frame = pd.DataFrame({"M": [3], "N": [2560], "K": [8192], "tile_M": [64], "tile_N": [128], "tile_K": [64],
                          "is_split_k": [1], "cta_count": [60], "hardware": ["NVIDIA A40"]})
    out = compute_features("gemm", frame)
    assert list(out.columns) == list(GEMM_FEATURES) + list(get_operator("gemm").descriptor_names) + ["ideal_cycles"]
    assert out[list(GEMM_DESCRIPTORS)].iloc[0].tolist()[:3] == [3, 2560, 8192]
    assert out["tensor_all_ops"].iloc[0] == 2684354560
    assert out["ideal_cycles"].iloc[0] == pytest.approx(31207.619, rel=1e-6)


def test_fp8_gemm_ignores_tile_columns_as_the_predictor_does():
    """`features --op gemm_fp8` took an input's tile columns (unchecked: tile 7x9x3, 10^8 CTAs) where
    predict_kernels.py and the aggregator use FP8's 128x128x128 tiles (docs/METHOD.md §3.4): the features written
    were not the ones predicted from."""
    shapes = {"M": [1, 300], "N": [4096, 8192], "K": [4096, 1000], "hardware": ["H100", "H100"]}
    tiles = {"tile_M": [7, 64], "tile_N": [9, 64], "tile_K": [3, 64], "is_split_k": [0, 1], "cta_count": [10**8, 7]}
    plain = compute_features("gemm_fp8", pd.DataFrame(shapes))
    pd.testing.assert_frame_equal(compute_features("gemm_fp8", pd.DataFrame({**shapes, **tiles})), plain)
    assert plain["tensor_all_ops"].iloc[0] == 2 * 128 * 4096 * 4096


@pytest.mark.data
@pytest.mark.parametrize("split", ["train", "test"])
def test_fp8_dataset_features_exact(shared_data, split):
    data = pd.read_csv(shared_data / "pipeweave" / "dataset" / f"gemm_fp8_{split}.csv")
    out = compute_features("gemm_fp8", data)
    expected = data[list(GEMM_FEATURES)].to_numpy(np.float32).astype(np.float64)
    actual = out[list(GEMM_FEATURES)].to_numpy(np.float32).astype(np.float64)
    rel = np.abs(actual - expected) / np.maximum(np.abs(expected), 1e-30)
    assert rel.max() <= 1e-6, f"worst row {int(rel.max(axis=1).argmax())}"
    assert len(data) == {"train": 16818, "test": 8410}[split]
    perf = out["ideal_cycles"] / (data["avg_duration"] * data["sm_freq"])
    np.testing.assert_allclose(perf, data["overall_perf"], rtol=1e-6)


def test_partial_tile_columns_are_an_error_naming_the_missing_ones():
    """Only some of the tile override columns (tile_M alone) were silently ignored: every row got the tile rule's
    tiles. A tile overrides the rule with all five columns, per row; the error names the ones missing."""
    shapes = {"M": [3, 4096], "N": [2560, 4096], "K": [8192, 4096], "hardware": ["NVIDIA A40"] * 2}
    with pytest.raises(ValueError, match=r"^tile column\(s\) tile_M without tile_N, tile_K, is_split_k, cta_count"):
        compute_features("gemm", pd.DataFrame({**shapes, "tile_M": [64, 64]}))
    rows = {**shapes, "tile_M": [64, 128], "tile_N": [128, None], "tile_K": [64, None], "is_split_k": [1, None],
            "cta_count": [60, None]}
    with pytest.raises(ValueError, match="^the GEMM M=4096, N=4096, K=4096 has tile_M but not tile_N, tile_K, "
                                         "is_split_k, cta_count"):
        compute_features("gemm", pd.DataFrame(rows))
    rows.update(tile_M=[64, None])  # an empty row takes the tile rule
    assert compute_features("gemm", pd.DataFrame(rows))["ideal_cycles"].iloc[0] == pytest.approx(31207.619, rel=1e-6)
