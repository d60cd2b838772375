"""Bounds from a trained GPU of the same die (compute capability and SM count) at other pipe rates
(pipeweave.siblings.die_band; docs/METHOD.md §4.3, "A trained GPU of the same die")."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, load_hardware
from analytical_model.registry import PIPE_RATE_COLUMNS, get_operator
from pipeweave.predictor import KernelPredictor
from pipeweave.siblings import die_band, die_inputs, die_rows, die_sibling, pipe_time_ratios

GEMM_SHAPES = {"M": [1, 64, 1000, 8192, 512], "N": [4096, 1280, 5120, 8192, 28672],
               "K": [4096, 8192, 5120, 1024, 4096]}
SHAPES = {
    "gemm": GEMM_SHAPES,
    "gemm_fp8": GEMM_SHAPES,
    "attn": {"attention_type": ["fa2_paged", "fa2_ragged", "fa2_ragged"], "bs": [2, 4, 1],
             "q_lengths": ["[1,1]", "[512,1024,256,2048]", "[4096]"],
             "kv_lengths": ["[900,4000]", "[512,1024,256,2048]", "[4096]"],
             "nh": [40, 64, 32], "nkv": [8, 8, 8], "hd": [128, 128, 128]},
    "rmsnorm": {"seq": [1, 256, 4096, 32768], "dim": [8192, 5120, 4096, 8192]},
    "siluandmul": {"seq": [1, 16, 4096, 32768], "dim": [28672, 8192, 14336, 4096]},
    "moe": {"weight_type": ["layer", "layer"], "M": [16, 4096], "E": [128, 128], "topk": [8, 8], "H": [2048, 2048],
            "N": [768, 384]},
}
#: one spec field raised per variant (the clock with its boost clock); every variant keeps the die's SM count
RAISED = {"l2bw": ("l2CacheBandwidth",), "clk": ("smFreq", "boostClock"), "bw": ("memBandwidth",),
          "tc": ("tcBf16", "tcFp8")}


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """A hardware folder: the shipped JSONs plus copies of H100, A100 and L40S renamed, unchanged ("copy") or with
    one resource raised by 30 %."""
    folder = tmp_path_factory.mktemp("hardware")
    for path in DEFAULT_HARDWARE_DIR.glob("*.json"):
        shutil.copy(path, folder)
    for base in ("H100", "A100", "L40S"):
        data = json.loads((DEFAULT_HARDWARE_DIR / f"{base}.json").read_text())
        for key in ("aliases", "aiconfiguratorSystem"):
            data.pop(key, None)
            data["provenance"].pop(key, None)
        for tag, fields in {"copy": (), **RAISED}.items():
            variant = json.loads(json.dumps(data))
            variant["name"] = f"{data['name']} {tag}"
            for field in fields:
                if variant.get(field):
                    variant[field] = variant[field] * 1.3
            (folder / f"{base} {tag}.json").write_text(json.dumps(variant))
    return folder


@pytest.fixture(scope="module")
def predictor(variants) -> KernelPredictor:
    return KernelPredictor(hardware_dir=variants)


def _predict(predictor, op, gpu):
    rows = len(next(iter(SHAPES[op].values())))
    return predictor.predict_columns(op, SHAPES[op], [gpu] * rows)


# A100 has no FP8 tensor rate, and no MoE model was trained on Ampere
@pytest.mark.parametrize("op, base", [(op, base) for base in ("H100", "A100", "L40S") for op in sorted(SHAPES)
                                      if base != "A100" or op not in ("gemm_fp8", "moe")])
def test_more_of_one_resource_on_the_same_die_is_never_slower(predictor, op, base):
    """Raising the L2 bandwidth of H100 by 30 % made its GEMMs up to 1.27x slower, L40S's 1.40x (the MLP is not
    monotone in the L2 share inside its training range); raising the clock at a fixed DRAM bandwidth slowed decode
    kernels. A copy of a trained GPU with more of one resource is bounded by the trained GPU itself."""
    reference = _predict(predictor, op, base)
    for tag in RAISED:
        raised = _predict(predictor, op, f"{base} {tag}")
        assert (raised <= reference * (1 + 1e-9)).all(), (tag, raised / reference)


@pytest.mark.parametrize("op", sorted(SHAPES))
def test_an_unchanged_renamed_copy_is_predicted_as_the_trained_gpu(predictor, op):
    """Renamed, H100 is outside training: its RMSNorm went from the MLP to the bandwidth model, 0.70-1.20x."""
    np.testing.assert_allclose(_predict(predictor, op, "H100 copy"), _predict(predictor, op, "H100"), rtol=1e-9)


@pytest.mark.parametrize("op", ["gemm", "attn", "rmsnorm", "siluandmul"])
def test_a_gpu_with_less_dram_bandwidth_on_the_same_die_is_not_faster(op):
    """A100 40GB (1,555 GB/s) is A100 80GB (2,039 GB/s, trained) with less DRAM bandwidth; its RMSNorm and
    SiLU*Mul came out up to 1.66x faster (bandwidth model against A100's MLP)."""
    predictor = KernelPredictor()
    assert (_predict(predictor, op, "A100 40GB") >= _predict(predictor, op, "A100") * (1 - 1e-9)).all()


def test_die_sibling_needs_the_compute_capability_and_the_sm_count():
    trained = [load_hardware(name) for name in ("H100", "H200", "H20", "A100", "A40", "L40S")]
    assert die_sibling("gemm", load_hardware("H800"), trained).name == "NVIDIA H100"  # identical rates
    assert die_sibling("rmsnorm", load_hardware("A100 40GB"), trained).name == "NVIDIA A100-SXM4-80GB"
    assert die_sibling("gemm", load_hardware("RTX A6000"), trained).name == "NVIDIA A40"
    assert die_sibling("gemm", load_hardware("H100 PCIe"), trained) is None  # 114 SMs, not 132
    assert die_sibling("gemm", load_hardware("L4"), trained) is None  # 58 SMs
    assert die_sibling("gemm", load_hardware("A10"), trained) is None  # 8.6 with 72 SMs
    assert die_sibling("gemm_fp8", load_hardware("L20"), trained) is None  # no FP8 rate


@pytest.mark.parametrize("op", sorted(SHAPES))
def test_die_inputs_are_the_features_recomputed_on_the_sibling(op):
    """Scaling each cycle column by its rate (PIPE_RATE_COLUMNS) is the calculator's own answer for the same kernels
    on a GPU of the same SM count with other rates (GEMM with its tiles fixed)."""
    operator, hw = get_operator(op), load_hardware("H100")
    other = replace(hw, name="other", sm_freq=hw.sm_freq * 1.21, mem_bandwidth=hw.mem_bandwidth * 0.7,
                    l2_cache_bandwidth=hw.l2_cache_bandwidth * 1.3, tc_bf16=hw.tc_bf16 * 2, tc_fp8=hw.tc_fp8 / 2,
                    shared_memory_bandwidth=hw.shared_memory_bandwidth * 1.5, xu_fp32=hw.xu_fp32 * 3,
                    fma_fp32=hw.fma_fp32 / 2)
    columns = dict(SHAPES[op])
    if op == "gemm":
        columns.update({"tile_M": [128] * 5, "tile_N": [128] * 5, "tile_K": [64] * 5, "is_split_k": [0] * 5,
                        "cta_count": [32, 10, 320, 4096, 132]})
    features, described = operator.features(columns, hw), operator.descriptors(columns, hw)
    virtual, virtual_described = die_inputs(op, features, described, hw, other)
    np.testing.assert_allclose(virtual, operator.features(columns, other), rtol=1e-9)
    np.testing.assert_allclose(virtual_described, operator.descriptors(columns, other), rtol=1e-9)
    for name in (*operator.feature_names, *operator.descriptor_names):
        if name.endswith("_cycle"):
            assert name in PIPE_RATE_COLUMNS, name


def test_pipe_time_ratios_are_the_rate_ratios():
    h100, h200 = load_hardware("H100"), load_hardware("H200")
    ratios = pipe_time_ratios("gemm", h200, h100)
    assert ratios["global_cycle"] == pytest.approx(h100.mem_bandwidth / h200.mem_bandwidth)
    assert ratios["local_cycle"] == pytest.approx(h100.l2_cache_bandwidth / h200.l2_cache_bandwidth)
    assert ratios["tensor_all_cycle"] == pytest.approx(1.0)


def test_evaluation_keeps_a_held_out_gpu_within_its_die_as_the_predictor_does():
    """The leave-one-GPU-out report scores the predictor as it predicts: H200 held out is bounded by H100 there too."""
    import pandas as pd

    from pipeweave.accuracy import sibling_bounded

    predictor = KernelPredictor()
    operator, h200 = get_operator("gemm"), load_hardware("H200")
    columns = {name: GEMM_SHAPES[name] for name in ("M", "N", "K")}
    features, described = operator.features(columns, h200), operator.descriptors(columns, h200)
    raw = np.full(len(features), 1e-4)  # far too slow: the bound decides
    train = pd.DataFrame({"hardware": ["NVIDIA H100", "NVIDIA A100-SXM4-80GB"]})
    test = pd.DataFrame({"hardware": ["NVIDIA H200"] * len(features)})
    with pytest.raises(ValueError, match="trained GPU of its die"):
        sibling_bounded("gemm", train, test, raw, features, described, None)
    def model_at(sm_freq):
        return lambda rows, shapes: predictor.efficiency_from_features("gemm", rows, shapes, sm_freq)

    bounded = sibling_bounded("gemm", train, test, raw, features, described, None, model_at)
    h100 = load_hardware("H100")
    slowest, _ = die_band("gemm", features, described, h200, h100, model_at(h100.sm_freq),
                          die_rows("gemm", features, described, h200, h100))
    np.testing.assert_allclose(bounded, slowest, rtol=1e-12)  # the lowest efficiency the die allows
    t_h100 = predictor.predict_columns("gemm", columns, ["H100"] * len(features))
    ideal = operator.ideal_cycles(features.astype(np.float32)).astype(np.float64)
    np.testing.assert_allclose(ideal / (bounded * h200.sm_freq), t_h100, rtol=1e-6)  # H200 is never slower than H100


def test_an_edited_json_of_a_trained_gpu_that_keeps_its_name_is_bounded_by_the_shipped_one(tmp_path):
    """H100.json keeping its name with 30 % more L2 bandwidth is a GPU outside training (it is respecified), whose
    trained self is the shipped H100: its GEMMs came out up to 1.27x slower, its prefill slower too."""
    import pipeweave

    for path in DEFAULT_HARDWARE_DIR.glob("*.json"):
        shutil.copy(path, tmp_path)
    edited = json.loads((tmp_path / "H100.json").read_text())
    edited["l2CacheBandwidth"] *= 1.3
    (tmp_path / "H100.json").write_text(json.dumps(edited))
    rows = len(GEMM_SHAPES["M"])
    with pytest.warns(UserWarning, match="other values"):
        faster = pipeweave.predict_kernels("gemm", GEMM_SHAPES, "H100", hardware_dir=tmp_path)
    assert (faster <= pipeweave.predict_kernels("gemm", GEMM_SHAPES, "H100") * (1 + 1e-9)).all()
    predictor = KernelPredictor(hardware_dir=tmp_path)
    assert predictor.die_sibling("gemm", predictor.hardware.get("H100")).l2_cache_bandwidth == \
        load_hardware("H100").l2_cache_bandwidth
    workload = "Qwen2.5-14B_arxiv_8_fa3_tp1_pp1"
    with pytest.warns(UserWarning, match="other values"):
        edited_run = pipeweave.predict_workload(workload, "H100", hardware_dir=tmp_path)["summary"]
    shipped = pipeweave.predict_workload(workload, "H100")["summary"]
    assert rows and all(edited_run[key] <= shipped[key] * (1 + 1e-9) for key in ("prefill_duration_ms",
                                                                             "decode_avg_duration_ms"))


def test_given_gemm_tiles_are_the_kernels_bounded_on_the_same_die():
    """Tile columns override the tile rule row by row; the die-mate's rows must then be the same kernels, not the
    rule's. H800 has H100's every rate, so its GEMMs with given tiles are H100's with those tiles: the rule's tiles
    on H100 made every tiling of an 8192^3 GEMM on H800 1444.8 us, where H100 itself gives 1268.3 and 1111.3 us."""
    predictor = KernelPredictor()
    tiled = {"M": [8192, 8192, 8192, 64], "N": [8192, 8192, 8192, 4096], "K": [8192, 8192, 8192, 4096],
             "tile_M": [64, 128, 256, 64], "tile_N": [64, 128, 128, 64], "tile_K": [64, 64, 64, 64],
             "is_split_k": [0, 0, 0, 0], "cta_count": [16384, 4096, 2048, 64]}
    np.testing.assert_allclose(predictor.predict_columns("gemm", tiled, ["H800"] * 4),
                               predictor.predict_columns("gemm", tiled, ["H100"] * 4), rtol=1e-9)
    rule = {name: tiled[name] for name in ("M", "N", "K")}  # rows of the rule's own tiles keep the sibling's rule
    np.testing.assert_allclose(predictor.predict_columns("gemm", rule, ["H800"] * 4),
                               predictor.predict_columns("gemm", rule, ["H100"] * 4), rtol=1e-9)


def test_the_bounds_table_counts_the_tensor_rate_sibling_band_alone(monkeypatch):
    """docs/ACCURACY.md's `(s x)`: the % of shapes the tensor-rate sibling's band moved; it counted the rows the
    same-die bound moved after it too (L40 GEMM: 71.8 -> 72.9 % of 1000 shapes). On L40, 9954x15x5526 is inside the
    tensor-rate band of L40S and moved by the die band alone."""
    import pandas as pd

    from pipeweave import accuracy

    shapes = pd.DataFrame({"M": [9954, 4096, 64], "N": [15, 4096, 8192], "K": [5526, 4096, 8192]})
    monkeypatch.setattr(accuracy, "read_dataset", lambda path: shapes)
    predictor = KernelPredictor()
    with_die = accuracy.band_binding("gemm", predictor, accuracy.DATASET_DIR)["NVIDIA L40"]
    monkeypatch.setattr(predictor, "die_sibling", lambda op, hw: None)
    without_die = accuracy.band_binding("gemm", predictor, accuracy.DATASET_DIR)["NVIDIA L40"]
    assert with_die[2] == without_die[2]
