"""Bounds from a trained sibling of the same SM design at another tensor rate (pipeweave.siblings)."""
from __future__ import annotations

import json

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from analytical_model.hardware import load_hardware
from analytical_model.operator_features import TILE_COLUMNS
from analytical_model.registry import TENSOR_RATE_COLUMNS, get_operator, operator_keys
from pipeweave.accuracy import sibling_bounded
from pipeweave.bounds import clip_efficiency, l2_cycles
from pipeweave.predictor import KernelPredictor
from pipeweave.siblings import sibling_band, sibling_scale, virtual_inputs

GEMM_SHAPES = {"M": [1, 64, 1000, 8192], "N": [4096, 1280, 5120, 8192], "K": [4096, 8192, 5120, 1024]}
SHAPES = {
    "gemm": GEMM_SHAPES,
    "gemm_fp8": GEMM_SHAPES,
    "attn": {"attention_type": ["fa2_paged", "fa3_paged"], "bs": [2, 4],
             "q_lengths": ["[512,1024]", "[1,1,1,1]"], "kv_lengths": ["[512,1024]", "[900,70,4000,12]"],
             "nh": [40, 64], "nkv": [8, 8], "hd": [128, 128]},
    "moe": {"weight_type": ["layer", "layer"], "M": [16, 4096], "E": [64, 128], "topk": [6, 8], "H": [2048, 4096],
            "N": [1408, 1536]},
}


def test_every_tensor_operator_declares_its_rate():
    for op in operator_keys():
        operator = get_operator(op)
        has_tensor = "tensor_all_cycle" in operator.feature_names
        assert (operator.tensor_rate is not None) == has_tensor, op
        if has_tensor:
            assert operator.tensor_rate in ("tc_bf16", "tc_fp8")


@pytest.mark.parametrize("op", ["gemm", "gemm_fp8", "attn", "moe"])
def test_virtual_inputs_are_the_features_recomputed_at_the_other_rate(op):
    """Scaling the tensor-cycle columns is the calculator's own answer for the same kernels at another rate
    (GEMM with its tiles fixed: the invented tile rule weighs the tensor rate, the bound is for the same kernel)."""
    operator, hw = get_operator(op), load_hardware("H20")
    columns = dict(SHAPES[op])
    if op == "gemm":
        columns.update({"tile_M": [128] * 4, "tile_N": [128] * 4, "tile_K": [64] * 4, "is_split_k": [0] * 4,
                        "cta_count": [32, 10, 320, 4096]})
        assert set(TILE_COLUMNS) <= set(columns)
    faster = replace(hw, tc_bf16=hw.tc_bf16 * 4, tc_fp8=hw.tc_fp8 * 4)
    features, described = operator.features(columns, hw), operator.descriptors(columns, hw)
    virtual, virtual_described = virtual_inputs(op, features, described, 0.25)
    np.testing.assert_allclose(virtual, operator.features(columns, faster), rtol=1e-12)
    np.testing.assert_allclose(virtual_described, operator.descriptors(columns, faster), rtol=1e-12)
    moved = [name in TENSOR_RATE_COLUMNS for name in operator.feature_names]
    assert (virtual[:, moved] != features[:, moved]).all() and (virtual[:, ~np.array(moved)] ==
                                                              features[:, ~np.array(moved)]).all()


def test_sibling_is_a_trained_gpu_of_the_same_compute_capability_at_another_rate():
    h100, h200, h20 = load_hardware("H100"), load_hardware("H200"), load_hardware("H20")
    assert sibling_scale("gemm", h20, [h100, h200]) == pytest.approx(1024 / 4096)
    assert sibling_scale("gemm_fp8", h20, [h100]) == pytest.approx(2048 / 8192)
    assert sibling_scale("attn", load_hardware("L40"), [load_hardware("L40S")]) == pytest.approx(0.5)
    assert sibling_scale("rmsnorm", h20, [h100]) is None  # no tensor pipe
    assert sibling_scale("gemm", h100, [h200, h20]) is None  # its own rate is trained
    assert sibling_scale("gemm", load_hardware("A40"), [load_hardware("A100")]) is None  # 8.6 is not 8.0
    assert sibling_scale("gemm", load_hardware("RTX PRO 6000 S"), [load_hardware("B200")]) is None  # 12.0, 10.0
    assert sibling_scale("gemm", h100, [h20]) == pytest.approx(4.0)  # a faster target is bounded too
    assert sibling_scale("gemm_fp8", load_hardware("L40"), [load_hardware("L40S")]) == pytest.approx(0.5)
    assert sibling_scale("gemm_fp8", load_hardware("L20"), [load_hardware("L40S")]) is None  # no FP8 rate


def _durations(op, features, efficiency):
    return get_operator(op).ideal_cycles(features.astype(np.float32)).astype(np.float64) / efficiency


@pytest.mark.parametrize("scale", [0.25, 4.0])
def test_sibling_band_spans_the_sibling_time_and_it_plus_the_extra_tensor_time(scale):
    op, hw = "gemm", load_hardware("H20")
    operator = get_operator(op)
    features, described = operator.features(GEMM_SHAPES, hw), operator.descriptors(GEMM_SHAPES, hw)
    sibling_efficiency = np.array([0.3, 0.5, 0.7, 0.8])
    model = lambda rows, shapes: sibling_efficiency  # noqa: E731 (the model at the sibling's rate)
    low, high = sibling_band(op, features, described, scale, model)
    virtual, _ = virtual_inputs(op, features, described, scale)
    t_virtual = _durations(op, virtual, sibling_efficiency)
    busiest = operator.feature_names.index("tensor_sm_max_cycle")
    shift = features[:, busiest] - virtual[:, busiest]
    assert ((shift > 0) if scale < 1 else (shift < 0)).all()  # slower target: longer tensor time
    np.testing.assert_allclose(np.sort([_durations(op, features, high), _durations(op, features, low)], axis=0),
                               np.sort([t_virtual, t_virtual + shift], axis=0), rtol=1e-9)
    assert (low < high).all()


@pytest.fixture(scope="module")
def predictor() -> KernelPredictor:
    return KernelPredictor()


def test_predictor_bounds_an_untrained_gpu_by_its_sibling_and_leaves_others(predictor):
    op = "attn"
    trained = predictor.trained_on(op)
    assert "NVIDIA H20" not in trained and "NVIDIA H100" in trained
    operator = get_operator(op)
    for gpu, expect_bound in (("H20", True), ("H100", False), ("A40", False)):
        hw = load_hardware(gpu)
        features, described = operator.features(SHAPES[op], hw), operator.descriptors(SHAPES[op], hw)
        raw = predictor.efficiency_from_features(op, features, described, hw.sm_freq)
        bounded = predictor.unbounded_efficiency(op, features, described, hw)
        if not expect_bound:
            assert predictor.sibling_scale(op, hw) is None
            np.testing.assert_array_equal(bounded, raw)
            continue
        siblings = [load_hardware(name) for name in sorted(trained)]
        low, high = sibling_band(op, features, described, sibling_scale(op, hw, siblings),
                                 lambda rows, shapes: predictor.efficiency_from_features(op, rows, shapes, hw.sm_freq))
        np.testing.assert_allclose(bounded, np.clip(raw, low, high), rtol=1e-12)
        assert (bounded > raw).any()  # H20's FA2 prefill: the model alone has it slower than the bound allows
        kept = predictor.kernel_efficiency(op, features, described, hw)
        np.testing.assert_allclose(kept, clip_efficiency(op, bounded, features, described, hw.sm_freq,
                                                         l2=l2_cycles(hw))[0])


def test_evaluation_refuses_a_sibling_bound_without_the_model():
    train = pd.DataFrame({"hardware": ["NVIDIA H100"]})
    test = pd.DataFrame({"hardware": ["NVIDIA H20"]})
    features = np.ones((1, len(get_operator("gemm").feature_names)))
    described = np.ones((1, len(get_operator("gemm").descriptor_names)))
    with pytest.raises(ValueError, match="NVIDIA H20 has a trained sibling"):
        sibling_bounded("gemm", train, test, np.ones(1), features, described, None)
    unchanged = sibling_bounded("gemm", pd.DataFrame({"hardware": ["NVIDIA A100-SXM4-80GB"]}),
                                pd.DataFrame({"hardware": ["NVIDIA A40"]}), np.full(1, 0.5), features, described, None)
    np.testing.assert_array_equal(unchanged, [0.5])


def test_aggregator_output_names_the_sibling_per_category():
    from pipeweave.engine import Engine, Job
    from pipeweave.flatten import load_workload
    from pipeweave.paths import DEFAULT_WORKLOAD_DIR

    engine = Engine(log=None)
    workload = load_workload(DEFAULT_WORKLOAD_DIR / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json")
    on_l40, on_h100 = engine.predict([Job(workload, load_hardware("L40")), Job(workload, load_hardware("H100"))])
    assert on_l40.result["extrapolation"]["sibling"] == {"gemm": "NVIDIA L40S", "attention": "NVIDIA L40S"}
    assert "sibling" not in on_h100.result["extrapolation"]


def test_the_output_names_the_categories_that_never_saw_the_gpu(tmp_path, capsys):
    """RTX A6000 has no kernel measurement anywhere, but its SM design is A40's, so its GEMMs carry almost no flag:
    nothing told a user the prediction was zero-shot."""
    from pipeweave import aggregate
    from pipeweave.cli import run_cli
    from pipeweave.paths import DEFAULT_WORKLOAD_DIR

    workload = DEFAULT_WORKLOAD_DIR / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json"
    for gpu, unmeasured in (("RTX A6000", ["gemm", "attention", "rmsnorm", "siluandmul"]), ("H100", None),
                            ("A40", ["attention"])):
        out = tmp_path / f"{gpu}.json"
        assert run_cli(aggregate.main, ["--workload", str(workload), "--hardware", gpu, "--output", str(out)]) == 0
        assert json.loads(out.read_text())["extrapolation"].get("unmeasured_gpu") == unmeasured
        said = capsys.readouterr().out
        assert ("those predictions are zero-shot" in said) == (unmeasured is not None), said
    assert json.loads((tmp_path / "RTX A6000.json").read_text())["extrapolation"]["by_operator"]["gemm"] < 0.05


def test_a_fine_tuned_model_is_not_held_to_the_sibling(predictor, monkeypatch):
    h20 = load_hardware("H20")
    assert predictor.sibling("attn", h20).name == "NVIDIA H100"
    monkeypatch.setitem(predictor._fine_tuned, ("attn", h20.stem), object())
    assert predictor.sibling("attn", h20) is None and predictor.sibling_scale("attn", h20) is None


def test_predict_kernels_says_where_a_sibling_bounds_the_rows(tmp_path, capsys):
    from pipeweave.kernels import main

    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,hardware\n4096,4096,4096,L40\n16,4096,4096,H100\n64,64,64,NVIDIA L40\n")  # once
    assert main(["--op", "gemm", "--input", str(shapes), "--output", str(tmp_path / "out.csv")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Note:")]
    assert [note for note in notes if "is kept" in note] == [
        "Note: gemm on NVIDIA L40 is kept between the same kernels at the tensor rate of NVIDIA L40S "
        "(trained, same SM design) and that plus the extra tensor time (docs/METHOD.md §4.3)",
        "Note: gemm on NVIDIA L40 is kept within the pipe-rate ratios of the same kernels on NVIDIA L40S "
        "(trained, same SM design and SM count; docs/METHOD.md §4.3)"]


def test_predict_kernels_says_which_gpus_are_zero_shot(tmp_path, capsys):
    """predict_kernels.py said nothing where no kernel of a GPU is in the operator's training data (L4, L40, a GPU of
    one's own): its extrapolation column is empty where the SM design is covered, so a zero-shot prediction looked
    like a trained one, while the aggregator, serve_sim.py and search_config.py say so (found by a hardware audit)."""
    from pipeweave.kernels import main

    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,hardware\n4096,4096,4096,L4\n16,4096,4096,H100\n64,64,64,NVIDIA L4\n1,64,64,L40\n")
    assert main(["--op", "gemm", "--input", str(shapes), "--output", str(tmp_path / "out.csv")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "zero-shot" in line]
    assert notes == [f"Note: no kernel of NVIDIA {gpu} is in the training data of gemm: those predictions are zero-shot "
                     f"(leave-one-GPU-out errors in docs/ACCURACY.md); calibrate.py with a few measured kernels or one "
                     f"measured run corrects them" for gpu in ("L4", "L40")]  # once per GPU; none for H100


def test_a_hardware_dir_of_the_users_own_gpus_keeps_the_shipped_training_gpus(tmp_path, repo_root):
    """Training GPUs missing from --hardware_dir were dropped: with a folder holding only the user's new GPU, every
    SM design looked unseen (flags, intervals and the "rough estimate" note changed) and no sibling bounded H20."""
    import shutil

    shutil.copy(repo_root / "hardware" / "H20.json", tmp_path)
    own, shipped = KernelPredictor(hardware_dir=tmp_path), KernelPredictor()
    hw = load_hardware("H20")
    for op in ("attn", "moe"):  # H20 has no data of either
        operator = get_operator(op)
        features, described = operator.features(SHAPES[op], hw), operator.descriptors(SHAPES[op], hw)
        assert own.sibling(op, hw).name == shipped.sibling(op, hw).name == "NVIDIA H100"
        np.testing.assert_array_equal(own.kernel_efficiency_and_codes(op, features, described, hw)[1],
                                      shipped.kernel_efficiency_and_codes(op, features, described, hw)[1])
        assert own.coverage(op)[0] == shipped.coverage(op)[0]
    # one training GPU beside the user's own (H100 with L4) made the model look single-GPU-trained, and L4's GEMMs
    # took the regime medians instead of the MLP: 16 % on a whole prefill
    for path in ("L4.json", "H100.json"):
        shutil.copy(repo_root / "hardware" / path, tmp_path)
    mixed, l4, gemm = KernelPredictor(hardware_dir=tmp_path), load_hardware("L4"), get_operator("gemm")
    features, described = gemm.features(GEMM_SHAPES, l4), gemm.descriptors(GEMM_SHAPES, l4)
    np.testing.assert_array_equal(mixed.kernel_efficiency_and_codes("gemm", features, described, l4)[0],
                                  shipped.kernel_efficiency_and_codes("gemm", features, described, l4)[0])


def test_a_target_much_faster_than_its_sibling_has_no_upper_bound_and_no_overflow():
    """A hypothetical target whose tensor pipe is 4x its sibling's: the sibling's time less the extra tensor time can
    be negative, which bounds nothing (it divided by the smallest float, with an overflow warning)."""
    import warnings

    from pipeweave.siblings import sibling_band

    operator, hw = get_operator("gemm"), load_hardware("H100")
    columns = {"M": [16, 4096], "N": [4096, 4096], "K": [4096, 4096]}
    features, described = operator.features(columns, hw), operator.descriptors(columns, hw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low, high = sibling_band("gemm", features, described, 4.0, lambda f, d: np.full(len(f), 1e6))
    assert np.isfinite(low).all() and np.isinf(high).all()
