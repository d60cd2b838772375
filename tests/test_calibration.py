"""Per-GPU calibration (pipeweave/calibration*.py, calibrate.py, --calibration of aggregator.py and
predict_kernels.py): the MAP fit, shrinkage, GPU isolation, transfer across TP, input errors and provenance.

Uses the shipped models and workloads (no shared data needed); workloads are cut to a few iterations.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeweave import aggregate, calibration_fit, kernels
from pipeweave.calibration import MIN_TAU, Calibration, Equations, Prior, fit_map, load_calibration, load_prior
from pipeweave.calibration_design import (BANDWIDTH, COMMUNICATION_PARAMS, COVARIATES, HINGES, INTERCEPTS, LATENCY,
                                          PARAMS, class_covariates, design, fit_standardisation)
from pipeweave.calibration_eval import HeldOut, estimate_prior, kshot_errors, shared_intercept_scales
from pipeweave.cli import run_cli

from workload_copies import first_iterations

REPO = Path(__file__).resolve().parent.parent
TP1 = REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json"
TP2 = REPO / "workload" / "Qwen3-32B_arxiv_12_fa2_tp2_pp1.json"
TP4_70B = REPO / "workload" / "Llama-3.1-70B_arxiv_16_fa2_tp4_pp1.json"
E2E_HEADER = "workload,prefill_ms,decode_step_ms,total_ms\n"


def small(path: Path, tmp_path: Path, iterations: int = 4, edit=None, name: str | None = None) -> Path:
    return first_iterations(path, tmp_path, iterations, edit, name)


def kernel_equations(x: np.ndarray, log_ratio: np.ndarray, sigma: float = 0.1) -> Equations:
    return Equations(np.arange(len(x)), np.ones(len(x)), x, np.exp(log_ratio), np.full(len(x), sigma))


def gemm_rows(n: int, seed: int = 0) -> np.ndarray:
    """Design rows of GEMM kernels with compute shares spread over [0, 1]."""
    share = np.random.default_rng(seed).uniform(0, 1, n)
    x = np.zeros((n, len(PARAMS)))
    x[:, PARAMS.index("gemm.compute")] = share
    x[:, PARAMS.index("gemm.memory")] = 1 - share
    return x


# ------------------------------------------------------------------------------------------------
# the fit


def test_fit_recovers_known_correction():
    truth = np.zeros(len(PARAMS))
    truth[PARAMS.index("gemm.compute")], truth[PARAMS.index("gemm.memory")] = -0.3, 0.2
    x = gemm_rows(2000)
    noise = np.random.default_rng(1).normal(0, 0.02, len(x))
    theta, std = fit_map(kernel_equations(x, x @ truth + noise, 0.02), load_prior())
    assert theta[PARAMS.index("gemm.compute")] == pytest.approx(-0.3, abs=0.01)
    assert theta[PARAMS.index("gemm.memory")] == pytest.approx(0.2, abs=0.01)
    assert std[PARAMS.index("gemm.compute")] < 0.01


def test_fit_of_sums_matches_gauss_newton_truth():
    """End-to-end style equations (sums of terms) are non-linear in θ; the fit still finds the truth."""
    rng = np.random.default_rng(2)
    truth = np.zeros(len(PARAMS))
    truth[PARAMS.index("gemm.compute")], truth[PARAMS.index("gemm.memory")] = 0.25, -0.15
    parts = []
    for _ in range(300):
        x = gemm_rows(5, int(rng.integers(1 << 30)))
        base = rng.uniform(0.1, 2.0, 5)
        value = float(np.sum(base * np.exp(x @ truth)))
        parts.append(Equations(np.zeros(5, np.int64), base, x, np.array([value]), np.array([0.01])))
    theta, _ = fit_map(Equations.concat(parts), load_prior())
    assert theta[PARAMS.index("gemm.compute")] == pytest.approx(0.25, abs=0.02)
    assert theta[PARAMS.index("gemm.memory")] == pytest.approx(-0.15, abs=0.02)


def test_no_data_is_identity_and_more_data_shrinks_less():
    prior = load_prior()
    theta, std = fit_map(Equations.empty(), prior)
    assert np.all(theta == 0)
    np.testing.assert_allclose(std, np.sqrt(np.diag(prior.covariance())))
    truth = np.zeros(len(PARAMS))
    truth[PARAMS.index("gemm.compute")] = truth[PARAMS.index("gemm.memory")] = -0.4
    distances = []
    for n in (1, 4, 32, 512):
        x = gemm_rows(n, seed=n)
        theta, _ = fit_map(kernel_equations(x, x @ truth, prior.sigma_kernel["gemm"]), prior)
        distances.append(abs(theta[PARAMS.index("gemm.memory")] - truth[PARAMS.index("gemm.memory")]))
    assert all(a > b for a, b in zip(distances, distances[1:])), distances
    assert distances[0] > 0.05  # one kernel does not move the correction all the way


def test_gemm_data_moves_other_classes_through_the_shared_prior():
    """A GPU-wide slowdown seen on GEMMs moves the (unseen) attention correction the same way, less."""
    x = gemm_rows(64)
    theta, _ = fit_map(kernel_equations(x, np.full(len(x), 0.3)), load_prior())
    attention = theta[PARAMS.index("attn_decode.memory")]
    assert 0 < attention < theta[PARAMS.index("gemm.memory")]
    assert theta[LATENCY] == 0 and theta[BANDWIDTH] == 0


def test_design_splits_compute_and_memory_shares():
    features = np.zeros((2, 9))
    from analytical_model.registry import get_operator
    names = get_operator("gemm").feature_names
    features[:, names.index("tensor_all_cycle")] = [300.0, 100.0]
    features[:, names.index("global_cycle")] = [100.0, 300.0]
    x = design("gemm", features)
    np.testing.assert_allclose(x[:, PARAMS.index("gemm.compute")], [0.75, 0.25])
    np.testing.assert_allclose(x.sum(axis=1), 1.0)


def synthetic_gpu(gpu: str, bias: float, slope: float, n: int = 3000, seed: int = 0, cls: str = "gemm",
                  noise: float = 0.05) -> HeldOut:
    """Kernels of one GPU whose log error is ``bias`` plus ``slope`` per standard deviation of log size."""
    rng = np.random.default_rng(seed)
    raw = np.zeros((n, 4))
    raw[:, 0] = rng.normal(10.0, 2.0, n)  # log size
    raw[:, 1] = np.abs(rng.normal(0.0, 0.5, n))  # log imbalance
    y = bias + slope * (raw[:, 0] - 10.0) / 2.0 + rng.normal(0, noise, n)
    return HeldOut("gemm", gpu, np.full(n, cls, dtype=object), rng.uniform(0.3, 0.7, n), raw, y)


def test_prior_from_synthetic_corrections():
    """Every GPU equally slow in every class -> the shared GPU term carries the intercepts' spread; the size
    slopes' spread lands on the size slope; the noise is the residual spread."""
    rows = []
    for i, (bias, slope) in enumerate(((-0.3, 0.2), (-0.1, -0.2), (0.1, 0.2), (0.3, -0.2))):
        rows += [synthetic_gpu(f"gpu{i}", bias, slope, seed=i),
                 synthetic_gpu(f"gpu{i}", bias, 0.0, seed=10 + i, cls="attn_prefill")]
    prior = estimate_prior(rows, "synthetic")
    assert prior.tau_gpu == pytest.approx(np.sqrt(0.05), rel=0.1)
    terms = ("compute", "memory") + class_covariates("gemm") + HINGES
    moments = np.asarray(prior.class_moments["gemm"])
    assert np.sqrt(moments[terms.index("log_size"), terms.index("log_size")]) == pytest.approx(0.2, rel=0.15)
    assert np.sqrt(moments[terms.index("log_imbalance"), terms.index("log_imbalance")]) < 0.03
    assert prior.sigma_kernel["gemm"] == pytest.approx(0.05, rel=0.15)
    assert prior.standardisation["gemm"]["center"][0] == pytest.approx(10.0, abs=0.1)


def planted_intercepts(wide_gpus: int, n_gpus: int = 60, seed: int = 4) -> list:
    """Per-GPU corrections (GPU, class, (compute, memory) intercepts) of two classes that share a GPU-wide part and
    a per-pipe part (standard deviation 0.1 each, class noise 0.1), and on the first ``wide_gpus`` GPUs a third
    class whose intercepts are wide (±0.45) and run against the others (as MoE's on its three GPUs)."""
    rng = np.random.default_rng(seed)
    corrections = []
    for g in range(n_gpus):
        shared = rng.normal(0, 0.1) + rng.normal(0, 0.1, 2)
        for cls in ("gemm", "attn_prefill"):
            corrections.append((f"gpu{g}", cls, shared + rng.normal(0, 0.1, 2)))
        if g < wide_gpus:
            corrections.append((f"gpu{g}", "moe", -np.sign(corrections[-1][2]) * 0.45))
    return corrections


def intercept_moments(corrections: list) -> dict:
    return {cls: np.mean([np.outer(t, t) for _, c, t in corrections if c == cls], axis=0)
            for cls in {c for _, c, _ in corrections}}


def test_shared_intercept_scales_recover_the_planted_ones_and_a_wide_class_on_three_gpus_does_not_move_them():
    """The pairwise likelihood recovers τ_gpu = τ_pipe = 0.1 from 60 GPUs; a class with wide intercepts on three of
    them, against the others, moves neither by more than 0.005 (a plain mean of the intercepts' products fell to
    the floor that way on the real data)."""
    alone = planted_intercepts(wide_gpus=0)
    tau_gpu, tau_pipe = shared_intercept_scales(alone, intercept_moments(alone))
    assert tau_gpu == pytest.approx(0.1, abs=0.02) and tau_pipe == pytest.approx(0.1, abs=0.02)
    with_wide = planted_intercepts(wide_gpus=3)
    np.testing.assert_allclose(shared_intercept_scales(with_wide, intercept_moments(with_wide)), (tau_gpu, tau_pipe),
                               atol=0.005)
    assert shared_intercept_scales([], {}) == (MIN_TAU, MIN_TAU)


def test_fit_recovers_a_planted_shape_dependent_bias():
    """A held-out GPU whose error grows with kernel size: 128 shots recover the slope and, scored on the other
    kernels, beat the intercepts alone; k = 0 is the zero-shot error; the numbers are deterministic."""
    others = [synthetic_gpu(f"gpu{i}", b, s, seed=i) for i, (b, s) in enumerate(((-0.2, 0.3), (0.1, -0.25),
                                                                                   (0.2, 0.2), (-0.1, -0.3)))]
    prior = estimate_prior(others, "synthetic")
    held = synthetic_gpu("new", 0.15, 0.35, n=4000, seed=99)
    x = held.design(prior.standardisation)
    theta = fit_map(Equations(np.arange(128), np.ones(128), x[:128], np.exp(held.y[:128]),
                              np.full(128, prior.sigma_kernel["gemm"])), prior)[0]
    assert theta[PARAMS.index("gemm.log_size")] == pytest.approx(0.35, abs=0.06)
    shape_aware = kshot_errors(held, x, prior, 128, seed=1)
    intercepts_only = kshot_errors(held, held.design(None), prior, 128, seed=1)
    assert shape_aware[0] < 0.5 * intercepts_only[0]
    assert kshot_errors(held, x, prior, 0, seed=1)[0] == pytest.approx(np.mean(np.abs(np.exp(-held.y) - 1)) * 100)
    assert kshot_errors(held, x, prior, 32, seed=5) == kshot_errors(held, x, prior, 32, seed=5)
    again = estimate_prior(others, "synthetic")
    np.testing.assert_array_equal(again.covariance(), prior.covariance())


def test_slopes_shrink_to_zero_without_data():
    """No data: θ = 0 (the zero-shot model) with the prior's spread; more kernels narrow the slope's posterior
    and move the fitted size effect to the planted one."""
    others = [synthetic_gpu(f"gpu{i}", b, sl, seed=i, noise=0.15)
              for i, (b, sl) in enumerate(((-0.2, 0.3), (0.1, -0.25), (0.2, 0.2), (-0.1, -0.3)))]
    prior = estimate_prior(others, "synthetic")
    assert np.all(fit_map(Equations.empty(), prior)[0] == 0)
    held = synthetic_gpu("new", 0.0, 0.4, n=300, seed=3, noise=0.15)
    x = held.design(prior.standardisation)
    small_big = held.design(prior.standardisation)[[np.argmin(held.raw[:, 0]), np.argmax(held.raw[:, 0])]]
    truth = 0.4 * (held.raw[:, 0].max() - held.raw[:, 0].min()) / 2.0
    slope = PARAMS.index("gemm.log_size")
    effects, stds = [], []
    for k in (0, 1, 8, 300):
        theta, std = fit_map(Equations(np.arange(k), np.ones(k), x[:k], np.exp(held.y[:k]),
                                       np.full(k, prior.sigma_kernel["gemm"])), prior)
        effects.append(float((small_big[1] - small_big[0]) @ theta))
        stds.append(std[slope])
    assert effects[0] == 0 and stds[0] == pytest.approx(np.sqrt(prior.covariance()[slope, slope]))
    assert all(a > b for a, b in zip(stds, stds[1:])), stds  # every kernel narrows the slope's posterior
    assert effects[-1] == pytest.approx(truth, rel=0.15)


def test_covariates_are_standardised_and_clipped():
    from analytical_model.registry import get_operator

    names = get_operator("gemm").feature_names
    features = np.zeros((3, len(names)))
    features[:, names.index("tensor_all_cycle")] = [100.0, 1e4, 1e12]
    features[:, names.index("tensor_sm_max_cycle")] = [100.0 * 132, 2e4, 1e12]
    features[:, names.index("global_cycle")] = [1e3, 1e3, 1e3]
    standardisation = fit_standardisation({})  # centre 0, scale 1
    standardisation["gemm"] = {"center": [np.log(1e3), 0.0], "scale": [1.0, 1.0]}
    x = design("gemm", features, None, standardisation)
    np.testing.assert_allclose(x[:, PARAMS.index("gemm.log_size")], [0.0, np.log(10.0), 3.0])  # clipped at 3 σ
    np.testing.assert_allclose(x[:, PARAMS.index("gemm.compute")], [100 / 1100, 1e4 / 1.1e4, 1.0], rtol=1e-9)
    np.testing.assert_allclose(x[:, PARAMS.index("gemm.log_imbalance")], [3.0, np.log(2.0), 0.0])
    np.testing.assert_allclose(x[:, PARAMS.index("gemm.log_size_above_+1")], [0.0, np.log(10.0) - 1, 2.0])
    assert not x[:, [PARAMS.index(f"attn_decode.{c}") for c in COVARIATES]].any()


# ------------------------------------------------------------------------------------------------
# the commands


def calibrate(tmp_path: Path, rows: str, gpu: str = "A100", name: str = "cal.json", capsys=None):
    csv = tmp_path / "measured.csv"
    csv.write_text(E2E_HEADER + rows)
    out = tmp_path / name
    code = run_cli(calibration_fit.main, ["--hardware", gpu, "--e2e", str(csv), "--output", str(out)])
    return code, out


def zero_shot(workload: Path, gpu: str) -> dict:
    agg = aggregate.Aggregator(log=None)
    return agg.predict([aggregate.Job(aggregate.load_workload(workload), agg.gpu(gpu))])[0].result["summary"]


@pytest.fixture(scope="module")
def a100_calibration(tmp_path_factory):
    """A100 calibrated on a (truncated) TP1 run measured 20 % slower in prefill and 10 % faster per decode step."""
    tmp = tmp_path_factory.mktemp("cal")
    tp1 = small(TP1, tmp)
    summary = zero_shot(tp1, "A100")
    prefill, decode = summary["prefill_duration_ms"] * 1.2, summary["decode_avg_duration_ms"] * 0.9
    total = prefill + decode * (4 - 1)
    code, path = calibrate(tmp, f"{tp1},{prefill},{decode},{total}\n")
    assert code == 0
    return path


def test_a_calibration_covers_the_operators_it_measured():
    """engine.uncalibrated: the zero-shot note stays for the categories a calibration measured none of (kernel CSVs
    of other operators, or runs that did not hold them: a BF16 run says nothing of FP8 GEMMs)."""
    from pipeweave.engine import uncalibrated
    categories = ["gemm_fp8", "attention", "quantize"]
    assert uncalibrated(categories, None) == (categories, [])
    kernels = {"fitted_from": {"kernels": [{"op": "gemm", "rows": 3}]}}
    assert uncalibrated(categories, kernels) == (categories, ["gemm"])
    run = {"fitted_from": {"e2e": {"runs": ["x.json"], "ops": ["attn", "gemm", "rmsnorm", "siluandmul"]}}}
    assert uncalibrated(categories, run) == (["gemm_fp8", "quantize"], ["gemm", "attention", "rmsnorm", "siluandmul"])
    older = {"fitted_from": {"e2e": {"runs": ["x.json"]}}}  # written before the record: taken as covering all
    assert uncalibrated(categories, older) == ([], [])
    assert uncalibrated(categories, {"hook": True}) == ([], [])  # a calibration hook without a record
    # search_config's note: per row, what neither training nor the calibration of that GPU measured
    from pipeweave.serving.search import zero_shot_gpus

    class Engine:
        @staticmethod
        def calibration_record(gpu):
            return kernels if gpu == "A40" else None

        @staticmethod
        def gpu(name):
            return name

    table = pd.DataFrame({"hardware": ["A40", "A40", "H100", "L40"], "feasible": [True, True, True, False],
                          "unmeasured_gpu": ["gemm", "attention", "", float("nan")]})
    assert zero_shot_gpus(table, Engine) == ["A40"]  # attention: not in the GEMM calibration
    assert zero_shot_gpus(table.iloc[[0, 2, 3]], Engine) == []


def test_calibration_file_and_tp1_run_moves_tp2_prediction(a100_calibration, tmp_path):
    cal = load_calibration(a100_calibration)
    assert cal.hardware == "A100" and cal.fitted_from["e2e"]["runs"]
    assert cal.fitted_from["e2e"]["ops"] == ["attn", "gemm", "rmsnorm", "siluandmul"]
    # a TP1 run has no collectives: the communication factors stay at their prior
    assert cal.theta[LATENCY] == 0 and cal.theta[BANDWIDTH] == 0
    tp2 = small(TP2, tmp_path)
    out = tmp_path / "pred.json"
    assert run_cli(aggregate.main, ["--workload", str(tp2), "--hardware", "A100", "--calibration",
                                    str(a100_calibration), "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    base = zero_shot(tp2, "A100")
    assert result["summary"]["prefill_duration_ms"] > base["prefill_duration_ms"] * 1.05  # measured slower
    assert result["summary"]["decode_avg_duration_ms"] < base["decode_avg_duration_ms"]  # measured faster
    assert result["calibration"]["hardware"] == "NVIDIA A100-SXM4-80GB"
    assert result["calibration"]["file"] == str(a100_calibration) and "MAP" in result["calibration"]["method"]


def test_sweep_changes_only_the_calibrated_gpu(a100_calibration, tmp_path):
    tp1 = small(TP1, tmp_path)
    plain, out = tmp_path / "plain", tmp_path / "sweep"
    sweep = ["--workload", str(tp1), "--hardware", "A100,H100,L40"]
    assert run_cli(aggregate.main, [*sweep, "--output", str(plain)]) == 0
    assert run_cli(aggregate.main, [*sweep, "--calibration", str(a100_calibration), "--output", str(out)]) == 0
    for gpu in ("H100", "L40"):
        name = f"{tp1.stem}_{gpu}.json"
        assert (out / name).read_text() == (plain / name).read_text()  # byte for byte
    name = f"{tp1.stem}_A100.json"
    calibrated, base = json.loads((out / name).read_text()), json.loads((plain / name).read_text())
    assert calibrated["summary"] != base["summary"] and "calibration" in calibrated


def test_calibration_for_another_gpu_is_refused(a100_calibration, tmp_path, capsys):
    out = tmp_path / "pred.json"
    code = run_cli(aggregate.main, ["--workload", str(small(TP1, tmp_path)), "--hardware", "H100", "--calibration",
                                    str(a100_calibration), "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "fitted for A100" in err[0] and not out.exists()


def test_predict_kernels_applies_and_records_calibration(a100_calibration, tmp_path):
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,hardware\n8192,8192,8192,A100\n8192,8192,8192,H100\n")
    plain, calibrated = tmp_path / "plain.csv", tmp_path / "cal.csv"
    assert run_cli(kernels.main, ["--op", "gemm", "--input", str(shapes), "--output", str(plain)]) == 0
    assert run_cli(kernels.main, ["--op", "gemm", "--input", str(shapes), "--output", str(calibrated),
                                  "--calibration", str(a100_calibration)]) == 0
    a, b = pd.read_csv(plain), pd.read_csv(calibrated, keep_default_na=False)
    assert b["predicted_us"][0] > a["predicted_us"][0] * 1.05  # compute-bound GEMM on the calibrated GPU
    assert b["predicted_us"][1] == a["predicted_us"][1]
    assert b["calibration"].tolist() == [str(a100_calibration), ""]


def test_the_python_api_applies_a_calibration_as_the_command_line_tools_do(a100_calibration, tmp_path):
    """pipeweave.predict_workload and predict_kernels had no calibration (a TypeError): only Engine did, and it did
    not refuse a file fitted for another GPU."""
    import pipeweave

    out = tmp_path / "p.json"
    assert run_cli(aggregate.main, ["--workload", str(TP1), "--hardware", "A100", "--calibration",
                                    str(a100_calibration), "--output", str(out)]) == 0
    calibrated = pipeweave.predict_workload(TP1, "A100", calibration=a100_calibration)
    assert calibrated["summary"] == json.loads(out.read_text())["summary"]
    assert calibrated["calibration"] == json.loads(out.read_text())["calibration"]
    assert calibrated["summary"] != pipeweave.predict_workload(TP1, "A100")["summary"]
    with pytest.raises(ValueError, match="fitted for A100"):
        pipeweave.predict_workload(TP1, "H100", calibration=a100_calibration)
    shapes = {"M": [8192, 8192], "N": [8192, 8192], "K": [8192, 8192]}
    plain = pipeweave.predict_kernels("gemm", shapes, ["A100", "H100"])
    corrected, low, high = pipeweave.predict_kernels("gemm", shapes, ["A100", "H100"], interval=True,
                                                     calibration=a100_calibration)
    assert corrected[0] > plain[0] * 1.05 and corrected[1] == plain[1] and (low <= corrected).all()
    with pytest.raises(ValueError, match="calibration= .* fitted for A100"):
        pipeweave.predict_kernels("gemm", shapes, "H100", calibration=a100_calibration)
    empty = pipeweave.predict_kernels("gemm", {"M": [], "N": [], "K": []}, "A100", calibration=a100_calibration)
    assert len(empty) == 0  # no kernel is no GPU to refuse, as predict_kernels.py with a header-only CSV


def test_kernel_csv_calibration(tmp_path, capsys):
    measured = tmp_path / "measured_gemm.csv"
    rows = [f"gemm,{m},4096,4096,NVIDIA A40,{t}" for m, t in ((16, 40.0), (4096, 900.0), (1024, 260.0))]
    measured.write_text("op,M,N,K,hardware,avg_duration\n" + "\n".join(rows) + "\n")
    out = tmp_path / "a40.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(measured), "--output", str(out)]) == 0
    cal = load_calibration(out)
    assert cal.fitted_from["kernels"][0]["rows"] == 3 and np.any(cal.theta != 0)
    # each measured kernel is predicted closer to its measurement than zero-shot
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,hardware\n16,4096,4096,A40\n4096,4096,4096,A40\n1024,4096,4096,A40\n")
    before, after = tmp_path / "before.csv", tmp_path / "after.csv"
    assert run_cli(kernels.main, ["--op", "gemm", "--input", str(shapes), "--output", str(before)]) == 0
    assert run_cli(kernels.main, ["--op", "gemm", "--input", str(shapes), "--output", str(after),
                                  "--calibration", str(out)]) == 0
    truth = np.array([40.0, 900.0, 260.0])
    zero_shot, calibrated = (pd.read_csv(path)["predicted_us"].to_numpy() for path in (before, after))
    assert (np.abs(np.log(calibrated / truth)) < np.abs(np.log(zero_shot / truth))).all()
    # A40 has no attention kernel in training, and a GEMM calibration measured none either: the note stays, saying so
    capsys.readouterr()
    assert run_cli(aggregate.main, ["--workload", str(TP1), "--hardware", "A40", "--calibration", str(out),
                                    "--output", str(tmp_path / "pred.json")]) == 0
    said = capsys.readouterr().out
    assert ("no kernel of NVIDIA A40 is in the training data of attention, and the calibration measured none of "
            "theirs (it measured gemm): those predictions are zero-shot") in said, said


def test_attention_kernel_csv_calibration_learns_a_kv_length_trend(tmp_path):
    """Decode attention measured slower the longer the KV cache (the profiler's columns, lengths as "[...]"):
    the calibration learns the trend, and predict_kernels --calibration applies it to unseen shapes."""
    lengths = (256, 1024, 4096, 16384)
    shapes = [("fa2_paged", bs, "[" + ",".join(["1"] * bs) + "]", "[" + ",".join([str(kv)] * bs) + "]", 32, 8, 128)
              for bs in (1, 8, 32) for kv in lengths]
    header = "attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd"
    table = tmp_path / "shapes.csv"
    table.write_text(header + ",hardware\n" + "".join(
        f'{t},{bs},"{q}","{kv}",{nh},{nkv},{hd},A40\n' for t, bs, q, kv, nh, nkv, hd in shapes))
    plain = tmp_path / "plain.csv"
    assert run_cli(kernels.main, ["--op", "attn", "--input", str(table), "--output", str(plain)]) == 0
    zero_shot = pd.read_csv(plain)["predicted_us"].to_numpy()
    kv = np.array([lengths.index(int(s[3].strip("[]").split(",")[0])) for s in shapes])
    truth = zero_shot * np.exp(0.15 * (kv - 1.5))  # from 20 % faster at 256 to 25 % slower at 16384
    measured = tmp_path / "measured_attn.csv"  # not attn.csv: test_profiler reads every <op>.csv under the temp root
    measured.write_text("op," + header + ",hardware,avg_duration\n" + "".join(
        f'attn,{t},{bs},"{q}","{k}",{nh},{nkv},{hd},NVIDIA A40,{d}\n'
        for (t, bs, q, k, nh, nkv, hd), d in zip(shapes, truth)))
    out = tmp_path / "a40.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(measured), "--output", str(out)]) == 0
    assert load_calibration(out).theta[PARAMS.index("attn_decode.log_kv_length")] > 0.02
    calibrated = tmp_path / "cal.csv"
    assert run_cli(kernels.main, ["--op", "attn", "--input", str(table), "--output", str(calibrated),
                                  "--calibration", str(out)]) == 0
    after = pd.read_csv(calibrated)["predicted_us"].to_numpy()
    assert np.mean(np.abs(np.log(after / truth))) < 0.75 * np.mean(np.abs(np.log(zero_shot / truth)))


def unsharded(data: dict) -> None:
    """Llama-3.1-70B on one GPU: every GEMM four times wider (140 GB of weights)."""
    data["tp_size"] = 1
    for iteration in data["iterations"]:
        for gemm in iteration["operators"]["gemm"]:
            gemm["N"] *= 4
        iteration["operators"]["communication"] = []  # one GPU reduces nothing (a TP collective is refused there)


@pytest.mark.parametrize("rows,needle", [
    ("{tp1},0,20,100\n", "prefill_ms must be a positive number"),
    ("{tp1},3176000,61600,7057500\n", "times the zero-shot prediction"),  # µs typed as ms
    ("{tp1},3176000,61600,7057500\n", "measured.csv: line 2: "),  # the run's CSV line is named
    ("{tp1},1e8,20,100\n", "times the zero-shot prediction"),
    ("{tp1},1e300,20,100\n", "prefill_ms must be a positive number of ms from 1e-06 to 1e+09"),
    ("{tp1},-5,20,100\n", "prefill_ms must be a positive number"),
    ("{tp1},abc,20,100\n", "prefill_ms must be a positive number"),
    ("{tp1},100,1e400,200\n", "decode_step_ms must be a positive number"),
    ("", "no runs"),
    ("{missing},100,20,200\n", "workload file not found"),
    ("{big},100,20,200\n", "cannot have run on this GPU"),
])
def test_bad_e2e_input_is_one_line_exit_2(tmp_path, capsys, rows, needle):
    tp1 = small(TP1, tmp_path)
    big = small(TP4_70B, tmp_path, edit=unsharded)
    code, out = calibrate(tmp_path, rows.format(tp1=tp1, missing=tmp_path / "nope.json", big=big), gpu="A40")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "error:" in err[0] and needle in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("content,needle", [
    ("", "empty file"),
    ("workload,prefill_ms,decode_step_ms,total_ms,extra\nx,1,1,1,1\n", "unknown column(s) extra"),
    ("workload,prefill_ms,total_ms\nx,1,1\n", "missing column(s) decode_step_ms"),
])
def test_malformed_e2e_csv(tmp_path, capsys, content, needle):
    csv = tmp_path / "m.csv"
    csv.write_text(content)
    code = run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(csv), "--output",
                                          str(tmp_path / "c.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0]
    assert not (tmp_path / "c.json").exists()


def test_kernel_csv_errors(tmp_path, capsys):
    other_gpu = tmp_path / "measured_gemm.csv"
    other_gpu.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,16,16,NVIDIA H100,5.0\n")
    unknown = tmp_path / "measured_rmsnorm.csv"
    unknown.write_text("op,seq,dim,avg_duration,colour\nrmsnorm,1,128,3.0,red\n")
    infinite = tmp_path / "measured_gemm_inf.csv"
    infinite.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,16,16,A100,1e400\n")
    for path, needle in ((other_gpu, "not on A100"), (unknown, "unknown column(s) colour"),
                         (infinite, "line 2: avg_duration must be a positive number")):
        code = run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(path), "--output",
                                              str(tmp_path / "c.json")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and needle in err[0]


def test_calibration_file_validation(tmp_path, a100_calibration):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(ValueError, match="not a calibration file"):
        load_calibration(bad)
    data = json.loads(a100_calibration.read_text())
    bad.write_text(json.dumps({**data, "format": 7}))
    with pytest.raises(ValueError, match="calibration format 7, this pipeweave reads 1 to 6; refit"):
        load_calibration(bad)
    bad.write_text(json.dumps({key: value for key, value in data.items() if key != "standardisation"}))
    with pytest.raises(ValueError, match="lacks standardisation"):
        load_calibration(bad)
    with pytest.raises(FileNotFoundError, match="calibrate.py"):
        load_calibration(tmp_path / "absent.json")


def test_format_1_file_reads_with_zero_slopes(a100_calibration, tmp_path):
    """A file of the intercept-only calibration (format 1) still applies, with the same factors as before."""
    data = json.loads(a100_calibration.read_text())
    parameters = {p: v for p, v in data["parameters"].items() if p in INTERCEPTS}
    parameters["communication"] = data["parameters"][COMMUNICATION_PARAMS[0]]
    old = {**data, "format": 1, "parameters": parameters}
    del old["standardisation"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    cal = load_calibration(path)
    assert cal.standardisation is None
    assert not cal.theta[[i for i, p in enumerate(PARAMS) if p not in INTERCEPTS + COMMUNICATION_PARAMS]].any()
    from analytical_model.registry import get_operator

    features = np.ones((4, len(get_operator("gemm").feature_names)))
    expected = np.exp(cal.theta[PARAMS.index("gemm.compute")] * 0.5 + cal.theta[PARAMS.index("gemm.memory")] * 0.5)
    np.testing.assert_allclose(cal.factors("gemm", features), expected)


def test_prior_file_is_consistent(tmp_path):
    prior = load_prior()
    assert isinstance(prior, Prior) and prior.sigma_e2e > 0 and prior.tau_comm_latency > prior.tau_comm_bandwidth > 0
    assert np.all(np.linalg.eigvalsh(prior.covariance()) > 0)
    data = json.loads((REPO / "pipeweave" / "calibration_prior.json").read_text())
    data["class_moments"]["gemm"]["terms"] = ["compute", "memory"]
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="regenerate it"):
        load_prior(path)


@pytest.mark.parametrize("edit,needle", [
    # a noise of 0 fitted NaN factors, written with exit 0 (the file then refused when loaded)
    (lambda d: d.update(sigma_e2e=0), "sigma_e2e must be a finite positive number, got 0.0"),
    (lambda d: d["sigma_kernel"].update(gemm=float("nan")), "sigma_kernel.gemm must be a finite positive number"),
    (lambda d: d["sigma_kernel"].pop("communication"), "sigma_kernel.communication must be a finite positive"),
    (lambda d: d.update(tau_comm_latency=-1), "tau_comm_latency must be a finite non-negative number"),
    # a smaller matrix was broadcast over the whole class block
    (lambda d: d["class_moments"]["gemm"].update(matrix=[[0.01]]), "class_moments.gemm.matrix must be 7 x 7"),
])
def test_a_damaged_prior_is_one_clear_error_before_any_fit(tmp_path, capsys, edit, needle):
    data = json.loads((REPO / "pipeweave" / "calibration_prior.json").read_text())
    edit(data)
    prior = tmp_path / "prior.json"
    prior.write_text(json.dumps(data))
    measured = tmp_path / "measured_gemm.csv"
    measured.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,4096,4096,A100,40.0\n")
    out = tmp_path / "c.json"
    code = run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(measured), "--prior", str(prior),
                                          "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_engine_hook_scales_collectives_of_its_gpu_only():
    from analytical_model.hardware import load_hardware

    theta = np.zeros(len(PARAMS))
    theta[[LATENCY, BANDWIDTH]] = np.log(2.0)
    cal = Calibration("A100", "NVIDIA A100-SXM4-80GB", theta, np.zeros(len(PARAMS)), {}, {}, {})
    messages = [(1 << 10, 8), (1 << 20, 8), (1 << 30, 8)]
    np.testing.assert_allclose(cal.apply("all_reduce", load_hardware("A100"), np.ones(3), shapes=messages), 2.0)
    np.testing.assert_array_equal(cal.apply("all_reduce", load_hardware("H100"), np.ones(3), shapes=messages), 1.0)
    assert cal.record(load_hardware("H100")) is None and cal.record(load_hardware("A100"))["factors"]


def test_marked_sections_survive_regeneration(tmp_path):
    from pipeweave.cli import keep_marked_sections, write_marked_section

    doc = tmp_path / "DOC.md"
    doc.write_text("# Report\n\nold body\n")
    write_marked_section(doc, "calibration-x", "## Section\n\nnumbers 1")
    write_marked_section(doc, "calibration-x", "## Section\n\nnumbers 2")  # replaced, not appended twice
    text = doc.read_text()
    assert text.count("calibration-x:begin") == 1 and "numbers 2" in text and "numbers 1" not in text
    regenerated = keep_marked_sections("# Report\n\nnew body", doc)
    assert regenerated.startswith("# Report\n\nnew body") and "numbers 2" in regenerated
    assert keep_marked_sections("# Other", tmp_path / "absent.md") == "# Other"


def test_all_reduce_measurements_inform_only_the_communication_factor(tmp_path):
    """On PCIe (L40S) vLLM all-reduces with NCCL at every size, as the profiler times it: every row calibrates."""
    from pipeweave.collectives import CollectivePredictor

    sizes = np.array([1 << 16, 1 << 20, 1 << 24], dtype=np.float64)
    measured = CollectivePredictor("L40S").predict_ms("all_reduce", sizes, 2) * 1000.0 * 2.0  # twice as slow
    csv = tmp_path / "measured_all_reduce.csv"
    csv.write_text("op,size_bytes,num_workers,hardware,avg_duration\n" + "".join(
        f"all_reduce,{int(s)},2,NVIDIA L40S,{t}\n" for s, t in zip(sizes, measured)))
    out = tmp_path / "cal.json"
    assert run_cli(calibration_fit.main, ["--hardware", "L40S", "--kernels", str(csv), "--output", str(out)]) == 0
    assert load_calibration(out).fitted_from["kernels"][0]["rows"] == 3
    cal = load_calibration(out)
    assert 1.6 < np.exp(cal.theta[LATENCY]) < 2.2 and 1.6 < np.exp(cal.theta[BANDWIDTH]) < 2.2
    np.testing.assert_array_equal(cal.theta[:LATENCY], 0.0)


def test_calibration_warns_when_the_base_model_changed(a100_calibration, tmp_path, capsys):
    data = json.loads(a100_calibration.read_text())
    data["base_models"]["gemm"] = "mlp_models/gemm/19990101_000000"
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(data))
    out = tmp_path / "pred.json"
    assert run_cli(aggregate.main, ["--workload", str(small(TP1, tmp_path)), "--hardware", "A100", "--calibration",
                                    str(changed), "--output", str(out)]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "gemm model 19990101_000000" in warnings[0]
    assert run_cli(aggregate.main, ["--workload", str(small(TP1, tmp_path)), "--hardware", "A100", "--calibration",
                                    str(a100_calibration), "--output", str(out)]) == 0
    assert "WARNING" not in capsys.readouterr().out
    # pipeweave.predict_kernels gives predict_kernels.py's WARNING (it gave none)
    import warnings as python_warnings

    import pipeweave

    def api_warnings(calibration) -> list[str]:
        with python_warnings.catch_warnings(record=True) as caught:
            python_warnings.simplefilter("always")
            pipeweave.predict_kernels("gemm", {"M": [4096], "N": [4096], "K": [4096]}, "A100", calibration=calibration)
        return [str(w.message) for w in caught if str(w.message).startswith("WARNING")]

    lines = api_warnings(changed)
    assert len(lines) == 1 and f"calibration={str(changed)!r} was fitted against the gemm model 19990101_000000" \
        in lines[0]
    assert api_warnings(a100_calibration) == []


def test_small_messages_move_the_latency_factor_large_ones_the_bandwidth_factor():
    """A decode step's small all-reduces and a prefill's large ones take different corrections: a 2x slowdown
    measured at small sizes scales small messages, not 1 GiB transfers (and the other way round)."""
    from analytical_model.hardware import load_hardware
    from pipeweave.calibration_design import communication_design

    spec = load_hardware("H20")
    x = communication_design("all_reduce", np.array([0, 256 << 10, 1 << 30], dtype=np.float64), 8, spec)
    assert x[0, LATENCY] == 1.0 and x[1, LATENCY] > 0.9 and x[2, BANDWIDTH] > 0.95
    np.testing.assert_allclose(x[:, LATENCY] + x[:, BANDWIDTH], 1.0)
    for measured_at, moved, kept in (((1 << 12, 1 << 14), LATENCY, BANDWIDTH),
                                     ((1 << 30, 1 << 31), BANDWIDTH, LATENCY)):
        sizes = np.array(measured_at, dtype=np.float64)
        rows = communication_design("all_reduce", sizes, 8, spec)
        theta, _ = fit_map(Equations(np.arange(2), np.ones(2), rows, np.full(2, 2.0), np.full(2, 0.05)), load_prior())
        assert np.exp(theta[moved]) > 1.7 and np.exp(theta[kept]) < 1.15, (measured_at, np.exp(theta[[moved, kept]]))


def test_single_communication_factor_of_older_files_reads_as_both(a100_calibration, tmp_path):
    data = json.loads(a100_calibration.read_text())
    parameters = {p: v for p, v in data["parameters"].items() if p not in COMMUNICATION_PARAMS}
    parameters["communication"] = {"log_factor": float(np.log(1.5)), "factor": 1.5, "posterior_std": 0.1}
    path = tmp_path / "format3.json"
    path.write_text(json.dumps({**data, "format": 3, "parameters": parameters}))
    cal = load_calibration(path)
    np.testing.assert_allclose(np.exp(cal.theta[[LATENCY, BANDWIDTH]]), 1.5)


def test_corrections_fitted_on_all_kernels_bound_what_any_k_reaches():
    """The in-sample column of the k-shot table: a GPU whose error is exactly a bias and a size slope (the
    parametrisation's own terms) is left with its noise; one with structure the terms cannot see keeps it."""
    from pipeweave.calibration_eval import in_sample_errors

    prior = estimate_prior([synthetic_gpu(f"gpu{i}", b, 0.0, seed=i) for i, b in enumerate((-0.2, 0.1, 0.2))], "s")
    smooth = synthetic_gpu("smooth", 0.3, 0.2, noise=0.01, seed=5)
    assert in_sample_errors(smooth, smooth.design(prior.standardisation), prior)["mean"] < 1.5
    rough = synthetic_gpu("rough", 0.3, 0.0, noise=0.01, seed=6)
    rough.y = rough.y + np.where(np.arange(len(rough.y)) % 2 == 0, 0.2, -0.2)  # alternating: no term sees it
    assert 17.0 < in_sample_errors(rough, rough.design(prior.standardisation), prior)["mean"] < 23.0


# ------------------------------------------------------------------------------------------------
# found by an audit as a user (2026-12-04)


def generated(tmp_path: Path, model: str, tp: int, pp: int = 1, dtype: str = "bf16", output_tokens: int = 3,
              attention: str = "fa3") -> Path:
    """A small generated workload (two requests of 64 tokens) of a model config, with FlashAttention ``attention``
    (fa3: Hopper's kernels; fa2 for the other GPUs)."""
    from pipeweave.workload import build_workload, serialize_workload
    from pipeweave.workload_inputs import load_model_config

    workload = build_workload(load_model_config(model), [64, 64], output_tokens, tp=tp, pp=pp, dtype=dtype,
                              prefill_attn=f"{attention}_ragged", decode_attn=f"{attention}_paged")
    path = tmp_path / f"{model}_tp{tp}_pp{pp}_{dtype}_{output_tokens}_{attention}.json"
    path.write_bytes(serialize_workload(workload))
    return path


def test_fp8_workload_calibrates_and_applies_quantisation_with_rmsnorms_class(tmp_path):
    """FP8 workloads hold activation-quantisation kernels, predicted by RMSNorm's model: they take its class
    (a calibration used to refuse every FP8 workload: 'quantize has no calibration class')."""
    from pipeweave.calibration_design import kernel_classes

    assert kernel_classes("quantize", 2).tolist() == ["elementwise", "elementwise"]
    fp8 = generated(tmp_path, "Llama-3.1-8B", tp=1, dtype="fp8")
    summary = zero_shot(fp8, "H100")
    code, path = calibrate(tmp_path, f"{fp8},{summary['prefill_duration_ms'] * 1.3},,\n", gpu="H100")
    assert code == 0
    out = tmp_path / "pred.json"
    assert run_cli(aggregate.main, ["--workload", str(fp8), "--hardware", "H100", "--calibration", str(path),
                                    "--output", str(out)]) == 0
    assert json.loads(out.read_text())["summary"]["prefill_duration_ms"] > summary["prefill_duration_ms"] * 1.1


def test_memory_check_counts_pipeline_stages_and_experts(tmp_path, capsys):
    """A 70B model over four pipeline stages fits one H100 per stage; Mixtral's experts do not fit one L40."""
    staged = generated(tmp_path, "Llama-3.1-70B", tp=1, pp=4)
    assert calibrate(tmp_path, f"{staged},60,57,172\n", gpu="H100")[0] == 0  # about 1.1x the zero-shot
    experts = generated(tmp_path, "Mixtral-8x7B", tp=1)
    code, out = calibrate(tmp_path, f"{experts},4000,30,4100\n", gpu="L40", name="l40.json")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "cannot have run on this GPU" in err[0] and not out.exists()


def test_an_output_that_is_a_runs_workload_is_refused_before_fitting(tmp_path, capsys, monkeypatch):
    tp1 = small(TP1, tmp_path)
    monkeypatch.setattr(calibration_fit, "calibrate", lambda *a, **k: pytest.fail("fitted before the check"))
    code, _ = calibrate(tmp_path, f"{tp1},100,20,200\n", name=tp1.name)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"would overwrite the workload {tp1} of a run" in err[0], err


@pytest.mark.parametrize("content,needle", [
    ("{tp1},13878.9\n", "row 1 (CSV line 2) has 2 fields, the header 4"),
    ("{tp1},100,20,200,\n", "row 1 (CSV line 2) has 5 fields, the header 4"),
    ("{prefill_only},,20,\n", "decode_step_ms was given, but the workload has no decode iteration"),
])
def test_e2e_rows_that_cannot_be_read_as_given_are_errors(tmp_path, capsys, content, needle):
    tp1 = small(TP1, tmp_path)
    prefill_only = small(TP1, tmp_path, iterations=1, name="prefill_only.json")
    code, out = calibrate(tmp_path, content.format(tp1=tp1, prefill_only=prefill_only))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("name,content,needle", [
    ("measured_all_reduce.csv", "op,size_bytes,num_workers,hardware,avg_duration\nall_reduce,1024,1,A100,9.0\n",
     "row 1 (CSV line 2): num_workers must be an integer from 2 to 1,024 (pipeweave.validation), got '1'"),
    ("measured_all_reduce.csv", "op,size_bytes,num_workers,hardware,avg_duration\nall_reduce,1e30,2,A100,9.0\n",
     "size_bytes must be an integer from 1 to 1,099,511,627,776"),
    ("measured_all_reduce.csv", "op,size_bytes,num_workers,hardware,avg_duration\n"  # 3 GPUs: NCCL in vLLM too
                                "all_reduce,4096,3,A100,7000000\n", "times the zero-shot prediction"),
    ("measured_gemm.csv", "op,M,N,K,hardware,avg_duration\ngemm,100000000000,16,16,A100,5.0\n",
     "row 1 (CSV line 2): M = 100000000000 exceeds the limit"),
    ("measured_gemm.csv", "op,M,N,K,hardware,avg_duration\ngemm,16,16,16,A100,5.0,7\n",
     "row 1 (CSV line 2) has 7 fields, the header 6"),
    ("measured_attn.csv", 'op,attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd,hardware,avg_duration\n'
                          'attn,fa2_paged,1,[1],[100000000],32,8,128,A100,50.0\n', "exceeds the limit"),
    ("measured_attn.csv", 'op,attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd,hardware,avg_duration\n'
                          'attn,fa2_paged,1,[1],[1000],32,8,100,A100,50.0\n', "hd = 100 is not a head size"),
    # as for runs: a FlashAttention-3 kernel cannot have been measured on an Ampere GPU
    ("measured_attn.csv", 'op,attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd,hardware,avg_duration\n'
                          'attn,fa3_ragged,1,[512],[512],32,8,128,A100,50.0\n',
     "line 2: fa3_ragged is FlashAttention-3 (Hopper only), which A100 (ampere) cannot run"),
    # a hand-made file without the GPU of its rows: another GPU's rows would pass unseen
    ("measured_gemm.csv", "op,M,N,K,avg_duration\ngemm,16,4096,4096,40.0\n",
     "no hardware column; the profiler writes the GPU of every row"),
])
def test_kernel_rows_no_prediction_can_be_made_for_are_errors(tmp_path, capsys, name, content, needle):
    path = tmp_path / name
    path.write_text(content)
    out = tmp_path / "c.json"
    code = run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(path), "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not out.exists()


def test_output_that_cannot_be_written_is_refused_before_fitting(tmp_path, capsys):
    measured = tmp_path / "measured_gemm.csv"
    measured.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,4096,4096,A100,40.0\n")
    code = run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(measured), "--output", str(tmp_path)])
    err = capsys.readouterr()
    assert code == 2 and "is a directory" in err.err and "Calibration of" not in err.out


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d.update(parameters=[1, 2]), "parameters must be an object"),
    (lambda d: d["parameters"].update({"gemm.compute": 3}), "parameters.gemm.compute.log_factor must be a finite"),
    (lambda d: d["parameters"]["gemm.memory"].update(log_factor="abc"), "got 'abc'"),
    (lambda d: d["parameters"]["gemm.memory"].update(log_factor=800), "log_factor = 800 is beyond ±20"),
    (lambda d: d["standardisation"]["gemm"].update(scale=[0, 0]), "standardisation.gemm.scale must be 2 finite "
                                                                  "positive numbers"),
    (lambda d: d.update(fitted_from=[1]), "fitted_from must be an object"),
    (lambda d: d["parameters"].update({"gemm.bogus": d["parameters"]["gemm.memory"]}),
     "unknown parameter(s) gemm.bogus; refit the file with calibrate.py"),
    # fields every prediction reads: damaged, they ended the aggregator in a traceback (after writing its output)
    (lambda d: d["fitted_from"]["e2e"].update(ops=5), "whose runs, run_digests and ops are lists of text"),
    (lambda d: d["fitted_from"].update(kernels=5), "fitted_from.kernels must be a list of objects"),
    (lambda d: d["fitted_from"].update(kernels=[{"op": "gemm", "rows": "40"}]), "rows (an integer)"),
    # read by the intervals of attention rows (an AttributeError, or int("many")'s ValueError, naming no file)
    (lambda d: d["fitted_from"].update(kernels=[{"op": "attn", "rows": 40, "classes": ["attn_decode"]}]),
     "classes (an object of integers)"),
    (lambda d: d["fitted_from"].update(kernels=[{"op": "attn", "rows": 40, "classes": {"attn_decode": "40"}}]),
     "classes (an object of integers)"),
    (lambda d: d.update(base_models=["gemm"]), "base_models must be an object of model folders"),
    (lambda d: d.update(format=True), "calibration format True, this pipeweave reads 1 to 6"),  # was read as 1
    (lambda d: d["base_models"].update(gemm=5), "base_models must be an object of model folders"),
])
def test_a_damaged_calibration_file_names_the_field(a100_calibration, tmp_path, edit, needle):
    data = json.loads(a100_calibration.read_text())
    edit(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="bad.json: ") as info:
        load_calibration(bad)
    assert needle in str(info.value)


def test_kernel_rows_of_another_kernel_are_left_out_of_a_calibration(tmp_path, capsys):
    """A profiler CSV measured without FlashInfer holds eager SiLU*Mul rows: they are left out with a WARNING,
    and a file of nothing else is an error (their time is another kernel's, not the GPU's)."""
    header = "op,seq,dim,hardware,avg_duration,kernel\n"
    fused, eager = "flashinfer silu_and_mul [fused]", '"torch silu(gate)*up [eager, 2 kernels]"'  # as csv quotes it
    mixed = tmp_path / "siluandmul.csv"
    mixed.write_text(header + f"siluandmul,16,28672,A100,9.0,{fused}\nsiluandmul,32,28672,A100,30.0,{eager}\n")
    out = tmp_path / "c.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(mixed), "--output", str(out)]) == 0
    assert "1 of 2 rows left out: 1 ran as several eager torch kernels" in capsys.readouterr().out
    assert load_calibration(out).fitted_from["kernels"][0]["rows"] == 1
    only_eager = tmp_path / "eager" / "siluandmul.csv"
    only_eager.parent.mkdir()
    only_eager.write_text(header + f"siluandmul,32,28672,A100,30.0,{eager}\n")
    code = run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(only_eager), "--output",
                                          str(tmp_path / "d.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no measured kernel is left" in err[0]
    assert "every row timed another kernel" in err[0] and "install flashinfer" in err[0]
    # beside another file (dataset/measured/<gpu>/*.csv), a file of nothing else is left out, not an error
    gemm = tmp_path / "eager" / "gemm.csv"
    gemm.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,4096,4096,A100,40.0\n")
    out = tmp_path / "e.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(gemm), str(only_eager), "--output",
                                          str(out)]) == 0
    assert f"WARNING: --kernels {only_eager}: every row timed another kernel" in capsys.readouterr().out
    assert [entry["file"] for entry in load_calibration(out).fitted_from["kernels"]] == [str(gemm)]


def test_nccl_all_reduce_rows_where_vllm_runs_its_custom_all_reduce_are_left_out(tmp_path, capsys):
    """The profiler times NCCL; below 8 MiB over 2, 4, 6 or 8 NVLink GPUs vLLM runs its custom all-reduce, which
    pipeweave predicts there: NCCL's time would fit the latency factor to another collective. Those rows
    are left out with a WARNING; a file of nothing else is left out beside other measurements."""
    from pipeweave.collective_serving import CUSTOM_AR_MAX_BYTES
    from pipeweave.collectives import CollectivePredictor

    sizes = np.array([1 << 16, 1 << 20, CUSTOM_AR_MAX_BYTES, 1 << 26], dtype=np.float64)
    header = "op,size_bytes,num_workers,hardware,avg_duration,kernel\n"

    def rows(gpu: str, name: str, workers: int, keep) -> str:
        times = CollectivePredictor(gpu, allow_analytical=True).predict_ms("all_reduce", sizes, workers) * 1500.0
        return "".join(f"all_reduce,{int(s)},{workers},{name},{t},torch.distributed.all_reduce(nccl 2.21.5)\n"
                       for s, t in zip(sizes, times) if keep(s))

    nvlink = tmp_path / "H200" / "all_reduce.csv"
    nvlink.parent.mkdir()
    nvlink.write_text(header + rows("H200", "NVIDIA H200", 8, lambda s: True) + rows("H200", "NVIDIA H200", 3, bool))
    out = tmp_path / "h200.json"
    assert run_cli(calibration_fit.main, ["--hardware", "H200", "--kernels", str(nvlink), "--output", str(out)]) == 0
    warning = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING")]
    assert warning == [f"WARNING: --kernels {nvlink}: 2 of 8 rows left out: 2 timed NCCL below 8 MiB, where vLLM on "
                       f"nvlink4 runs its custom all-reduce over 2, 4, 6 or 8 GPUs (what pipeweave predicts there)"]
    assert load_calibration(out).fitted_from["kernels"][0]["rows"] == 6
    nvlink.write_text(header + rows("H200", "NVIDIA H200", 8, lambda s: s < CUSTOM_AR_MAX_BYTES))
    gemm = tmp_path / "H200" / "gemm.csv"
    gemm.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,4096,4096,H200,30.0\n")
    assert run_cli(calibration_fit.main, ["--hardware", "H200", "--kernels", str(gemm), str(nvlink), "--output",
                                          str(out)]) == 0
    assert f"WARNING: --kernels {nvlink}: every row timed another kernel" in capsys.readouterr().out
    pcie = tmp_path / "all_reduce.csv"  # PCIe: NCCL at every size in vLLM too
    pcie.write_text(header + rows("L40S", "NVIDIA L40S", 2, lambda s: True))
    assert run_cli(calibration_fit.main, ["--hardware", "L40S", "--kernels", str(pcie), "--output", str(out)]) == 0
    assert "WARNING" not in capsys.readouterr().out and load_calibration(out).fitted_from["kernels"][0]["rows"] == 4


def test_cross_validated_spread_measures_scatter_the_calibration_cannot_explain():
    """Kernels whose error is one shared factor leave no spread; kernels that scatter around it leave one of their
    scatter's size, each predicted by a fit that did not see it."""
    from pipeweave.calibration import cross_validated_log_residuals, spread_entry

    prior = load_prior()
    x = gemm_rows(40)
    shared = kernel_equations(x, np.full(40, 0.3))
    assert np.abs(cross_validated_log_residuals(shared, prior, np.arange(40))).max() < 0.05  # the prior's pull
    noise = np.random.default_rng(1).normal(0, 0.2, 40)
    scattered = kernel_equations(x, 0.3 + noise)
    entry = spread_entry(cross_validated_log_residuals(scattered, prior, np.arange(40)))
    assert entry["kernels"] == 40 and entry["folds"] == 4
    assert -0.45 < entry["log_low"] < -0.1 and 0.1 < entry["log_high"] < 0.45  # ±1.28 σ of the scatter, σ = 0.2
    subset = scattered.subset(np.arange(40) % 2 == 0)
    assert len(subset.measured) == 20 and subset.eq.tolist() == list(range(20))


def calibrated_on_ten_gemms(tmp_path, gpu: str, device: str, seed: int) -> Path:
    """A calibration file fitted (without fine-tuning) on ten M x 4096 x 4096 GEMMs of ``gpu`` (driver name
    ``device``) whose durations scatter by a factor e^N(0, 0.3) around a plausible curve."""
    measured = tmp_path / "measured_gemm.csv"
    rng = np.random.default_rng(seed)
    rows = [f"gemm,{m},4096,4096,{device},{t * np.exp(rng.normal(0, 0.3))}"
            for m, t in ((16, 40.0), (4096, 900.0), (1024, 260.0), (64, 45.0), (256, 80.0), (2048, 480.0),
                         (128, 55.0), (512, 140.0), (32, 42.0), (8192, 1800.0))]
    measured.write_text("op,M,N,K,hardware,avg_duration\n" + "\n".join(rows) + "\n")
    out = tmp_path / f"{gpu.lower()}.json"
    assert run_cli(calibration_fit.main, ["--hardware", gpu, "--kernels", str(measured), "--output", str(out),
                                          "--no_fine_tune"]) == 0
    return out


def test_calibrate_records_the_spread_of_its_kernels_and_reads_it_back(tmp_path):
    spread = load_calibration(calibrated_on_ten_gemms(tmp_path, "A40", "NVIDIA A40", 0)).spread
    assert set(spread) == {"gemm"} and spread["gemm"]["kernels"] == 10
    assert spread["gemm"]["log_low"] < 0 < spread["gemm"]["log_high"]


def test_a_kernel_calibration_sets_the_interval_of_its_gpu_from_its_count_and_spread(tmp_path):
    """A calibration from 10 GEMMs of L40 (outside the GEMM training data): predict_kernels.py takes the k = 8
    calibrated interval of the shipped table, widened to the calibration's own cross-validated spread; L40S's rows
    (trained, another GPU) keep their table factors."""
    from pipeweave.intervals import TRAINED, UNSEEN_GPU, shipped_table

    out = calibrated_on_ten_gemms(tmp_path, "L40", "NVIDIA L40", 1)
    calibration = load_calibration(out)
    assert calibration.kernel_count("gemm") == 10
    spread = calibration.spread["gemm"]
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,hardware\n2048,4096,4096,L40\n2048,4096,4096,L40S\n")
    predicted = tmp_path / "predicted.csv"
    assert run_cli(kernels.main, ["--op", "gemm", "--input", str(shapes), "--output", str(predicted),
                                  "--calibration", str(out)]) == 0
    frame = pd.read_csv(predicted)
    table = shipped_table()
    calibrated = table.factors("gemm", np.array([UNSEEN_GPU]), 8)
    assert calibrated[0][0] != pytest.approx(table.factors("gemm", np.array([UNSEEN_GPU]))[0][0])
    low, high = (np.exp(min(np.log(calibrated[0][0]), spread["log_low"])),
                 np.exp(max(np.log(calibrated[1][0]), spread["log_high"])))
    l40, l40s = frame.iloc[0], frame.iloc[1]
    assert l40["low_us"] / l40["predicted_us"] == pytest.approx(low, rel=1e-6)
    assert l40["high_us"] / l40["predicted_us"] == pytest.approx(high, rel=1e-6)
    trained = table.factors("gemm", np.array([TRAINED]))
    assert l40s["low_us"] / l40s["predicted_us"] == pytest.approx(trained[0][0], rel=1e-6)


def test_collective_dir_is_the_one_the_runs_collectives_are_predicted_with(tmp_path):
    """calibrate.py --collective_dir: the runs' collectives are predicted with the folder the calibrated predictions
    will use. An empty folder gives the textbook ring on L20's PCIe (no measured ring efficiency), the shipped one
    2.1x its bandwidth term, so the same measured run needs different communication factors."""
    from pipeweave.engine import Engine

    tp2 = generated(tmp_path, "Qwen2.5-14B", tp=2, attention="fa2")
    measured = Engine(log=None).predict_workload(tp2, "L20")["summary"]
    csv = tmp_path / "run.csv"
    csv.write_text("workload,prefill_ms,decode_step_ms,total_ms\n"
                   f"{tp2},{measured['prefill_duration_ms'] * 1.1},{measured['decode_avg_duration_ms'] * 1.1},\n")
    empty = tmp_path / "no_collectives"
    empty.mkdir()
    shipped, textbook = (calibration_fit.calibrate("L20", str(csv), [], collective_dir=folder, fine_tune=False,
                                                   log=lambda *_: None).summary()["factors"]
                         for folder in (None, empty))
    assert shipped["communication.bandwidth"] != pytest.approx(textbook["communication.bandwidth"], rel=1e-3)


def test_a_calibration_warns_when_the_collective_models_changed(tmp_path, capsys):
    """Communication factors fitted against one collective-model folder (its serving.json) and applied with another
    are stale, as factors fitted against a retrained MLP are: a WARNING names both."""
    from pipeweave import aggregate
    from pipeweave.engine import Engine

    tp2 = generated(tmp_path, "Qwen2.5-14B", tp=2, attention="fa2")
    measured = Engine(log=None).predict_workload(tp2, "L20")["summary"]
    csv = tmp_path / "run.csv"
    csv.write_text(f"workload,prefill_ms,decode_step_ms,total_ms\n{tp2},{measured['prefill_duration_ms'] * 1.1},,\n")
    out = tmp_path / "cal.json"
    assert run_cli(calibration_fit.main, ["--hardware", "L20", "--e2e", str(csv), "--output", str(out),
                                          "--no_fine_tune"]) == 0
    empty = tmp_path / "no_collectives"
    empty.mkdir()
    capsys.readouterr()
    for folder, stale in ((None, False), (empty, True)):
        args = ["--workload", str(tp2), "--hardware", "L20", "--calibration", str(out),
                "--output", str(tmp_path / "p.json")] + ([] if folder is None else ["--collective_dir", str(folder)])
        assert run_cli(aggregate.main, args) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if "fitted its communication factors" in line]
        assert bool(lines) == stale, lines
    assert f"recalibrate with calibrate.py --collective_dir {empty}" in lines[0]


def test_a_calibration_warns_when_its_gpus_collective_models_changed_or_another_gpus_are_used(tmp_path, capsys):
    """The check compared serving.json alone: factors fitted against A100's measured all-reduce were applied without
    a word to the analytical estimate of a folder without A100's models, or to H100's models
    (--collective_hardware H100)."""
    import shutil

    from pipeweave import aggregate
    from pipeweave.engine import Engine
    from pipeweave.paths import DEFAULT_COLLECTIVE_DIR

    tp2 = generated(tmp_path, "Qwen2.5-14B", tp=2, attention="fa2")
    measured = Engine(log=None).predict_workload(tp2, "A100")["summary"]
    csv = tmp_path / "run.csv"
    csv.write_text(f"workload,prefill_ms,decode_step_ms,total_ms\n{tp2},{measured['prefill_duration_ms'] * 1.1},"
                   f"{measured['decode_avg_duration_ms'] * 1.2},\n")
    out = tmp_path / "cal.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(csv), "--output", str(out),
                                          "--no_fine_tune"]) == 0
    without_a100 = tmp_path / "collectives"
    shutil.copytree(DEFAULT_COLLECTIVE_DIR, without_a100, ignore=shutil.ignore_patterns("A100"))
    capsys.readouterr()
    for extra, stale in (([], False), (["--collective_dir", str(without_a100)], True),
                         (["--collective_hardware", "H100"], True)):
        args = ["--workload", str(tp2), "--hardware", "A100", "--calibration", str(out),
                "--output", str(tmp_path / "p.json"), *extra]
        assert run_cli(aggregate.main, args) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if "fitted its communication factors" in line]
        assert bool(lines) == stale, (extra, lines)
    import pipeweave  # the API names the calibration as it was given there, not as a command-line flag

    with pytest.warns(UserWarning, match=r"^WARNING: calibration='.*cal\.json' fitted its communication factors"):
        pipeweave.predict_workload(tp2, "A100", calibration=out, collective_hardware="H100")


def test_runs_whose_collectives_are_all_estimated_keep_the_estimates_uncertainty(tmp_path):
    """H800 at TP4 has no 4-GPU all-reduce sweep: its collectives are the analytical estimate, whose own interval
    there is about x0.8-1.3. A run uniformly 15 % slower must not be explained by a collective factor of 2.5 (what
    the measured sources' log 3 prior allowed); with PP2 its send/recv is measured and the prior stays."""
    import math

    from pipeweave.engine import Engine

    def fitted(workload):
        summary = Engine(log=None).predict_workload(workload, "H800")["summary"]
        csv = tmp_path / f"{workload.stem}.csv"
        csv.write_text("workload,prefill_ms,decode_step_ms,total_ms\n" + f"{workload}," + ",".join(
            str(summary[key] * 1.15) for key in ("prefill_duration_ms", "decode_avg_duration_ms",
                                                 "total_duration_ms")) + "\n")
        notes = []
        calibration = calibration_fit.calibrate("H800", str(csv), [], fine_tune=False, log=notes.append)
        return calibration.summary()["factors"], calibration.prior, notes

    factors, prior, notes = fitted(generated(tmp_path, "Qwen3-32B", tp=4, output_tokens=8))
    assert any("every collective of the runs takes the analytical estimate" in note for note in notes)
    assert prior["tau_comm_latency"] == prior["tau_comm_bandwidth"] < 0.3
    assert factors["communication.latency"] < 1.25 and factors["gemm.compute"] > 1.03
    _, staged_prior, _ = fitted(generated(tmp_path, "Qwen3-32B", tp=4, pp=2, output_tokens=8))
    assert staged_prior["tau_comm_latency"] == pytest.approx(math.log(3))


NO_PANDAS_CALIBRATE = """
import sys
sys.modules["pandas"] = None  # a base install (numpy only): importing pandas fails
from pipeweave.commands import calibrate
sys.argv = ["pipeweave-calibrate", "--hardware", "L40", "--e2e", sys.argv[1], "--output", sys.argv[2], *sys.argv[3:]]
sys.exit(calibrate())
"""


@pytest.mark.parametrize("flags", [["--no_fine_tune"], []])
def test_e2e_calibration_runs_without_pandas(tmp_path, flags):
    """pipeweave-calibrate --e2e in a base install stopped with 'this command needs the training extras ... module
    'pandas' is missing' (the runs CSV was read with pandas), although the README promised it needs no extras."""
    import subprocess
    import sys

    from pipeweave.engine import Engine

    tp1 = small(TP1, tmp_path)
    summary = Engine(log=None).predict_workload(tp1, "L40")["summary"]
    csv = tmp_path / "runs.csv"
    csv.write_text(E2E_HEADER + f"{tp1},{summary['prefill_duration_ms'] * 1.1},"
                                f"{summary['decode_avg_duration_ms'] * 1.05},\n")
    out = tmp_path / "l40.json"
    run = subprocess.run([sys.executable, "-c", NO_PANDAS_CALIBRATE, str(csv), str(out), *flags], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert load_calibration(out).hardware == "L40"


def test_measurements_the_calibration_cannot_explain_are_warned(tmp_path, capsys):
    """Calibrating A100 from a run of another GPU (here H100's prediction of the run) was accepted without a word,
    though the fit stays far from its own data (the full run: 1.24x); a WARNING now says so. A run within the model's
    reach is calibrated silently."""
    tp1 = small(TP1, tmp_path)
    summary = zero_shot(tp1, "A100")
    on_h100 = zero_shot(tp1, "H100")
    prefill, decode = on_h100["prefill_duration_ms"], on_h100["decode_avg_duration_ms"]
    code, _ = calibrate(tmp_path, f"{tp1},{prefill},{decode},{on_h100['total_duration_ms']}\n")
    assert code == 0 and "WARNING: after calibration the measured runs are still" in capsys.readouterr().out
    prefill, decode = summary["prefill_duration_ms"] * 1.2, summary["decode_avg_duration_ms"] * 0.9
    code, _ = calibrate(tmp_path, f"{tp1},{prefill},{decode},{prefill + 3 * decode}\n", name="fine.json")
    assert code == 0 and "WARNING" not in capsys.readouterr().out


def test_the_fit_predicts_what_the_calibrated_engine_predicts_where_kernels_sit_at_their_floor():
    """The fit scaled the engine's floored durations while the engine scales the model's and floors after: on L40S,
    whose decode attention sits at its cached KV's DRAM time, a run measured 0.6x in decode was fitted to a 22.10 ms
    step the calibrated aggregator put at 22.26 ms. The fit now floors each term as the engine does: the two agree."""
    from pipeweave.calibration_e2e import runs_prior
    from pipeweave.engine import as_flat_workload
    from pipeweave.generate import WorkloadSpec, generate
    from pipeweave.schema import Workload

    generated = generate(WorkloadSpec("Llama-3.1-8B", None, requests=8, prompt_tokens=2048, output_tokens=4))
    flat = as_flat_workload(Workload.from_dict(json.loads(generated.content), "w.json"))
    engine = aggregate.Aggregator(collective_estimate="analytical", log=None)
    spec = engine.gpu("L40S")
    zero = engine.predict([aggregate.Job(flat, spec)])[0].result["summary"]
    decode = 0.6 * zero["decode_avg_duration_ms"]
    truth = {"prefill_ms": zero["prefill_duration_ms"], "decode_step_ms": decode,
             "total_ms": zero["prefill_duration_ms"] + 3 * decode}
    prior = runs_prior(engine, spec, [flat], load_prior())
    equations = calibration_fit.run_equations(engine, flat, spec, truth, prior, "run")
    np.testing.assert_allclose(equations.predict(np.zeros(len(PARAMS)))[0],
                               [zero["prefill_duration_ms"], zero["decode_avg_duration_ms"], zero["total_duration_ms"]],
                               rtol=1e-6)
    assert (equations.floor >= equations.base).any()  # some terms sit at their floor
    theta, std = fit_map(equations, prior)
    engine.calibration = Calibration(spec.stem, spec.name, theta, std, {"e2e": "run"}, {}, {}, prior.standardisation)
    calibrated = engine.predict([aggregate.Job(flat, spec)])[0].result["summary"]
    np.testing.assert_allclose(equations.predict(theta)[0], [calibrated["prefill_duration_ms"],
                               calibrated["decode_avg_duration_ms"], calibrated["total_duration_ms"]], rtol=1e-6)


def test_a_kernel_calibration_fits_what_predict_kernels_applies_where_kernels_sit_at_their_fastest(tmp_path):
    """predict_kernels keeps a calibrated kernel at its physical fastest time, but the kernel equations had no floor:
    a tiny GEMM measured faster than any GEMM can run pulled the fitted correction down as if the calibrated
    prediction could follow it. The fit now holds each kernel at its fastest time as predict_kernels does, so the
    fitted durations are the calibrated predictions."""
    from pipeweave.predictor import KernelPredictor

    measured = tmp_path / "gemm.csv"
    rows = [(m, n, 128, 0.3) for m in (1, 2, 4) for n in (128, 256)] + [
        (16, 4096, 4096, 70.0), (4096, 4096, 4096, 1200.0), (1024, 4096, 4096, 320.0), (256, 8192, 4096, 160.0)]
    measured.write_text("op,M,N,K,hardware,avg_duration\n"
                        + "".join(f"gemm,{m},{n},{k},NVIDIA A40,{t}\n" for m, n, k, t in rows))
    predictor, prior = KernelPredictor(), load_prior()
    spec = predictor.hardware.get("A40")
    op, frame, *_ = calibration_fit.read_kernel_csv(measured, spec, predictor.hardware)
    equations = calibration_fit.kernel_equations(op, frame, spec, predictor, prior, "gemm.csv")
    theta, std = fit_map(equations, prior)
    calibration = Calibration(spec.stem, spec.name, theta, std, {"kernels": []}, {}, {}, prior.standardisation)
    columns = {name: [shape[i] for shape in rows] for i, name in enumerate("MNK")}
    _, _, fastest = predictor.predict_columns_bounded("gemm", columns, ["A40"] * len(rows))
    assert (fastest[:6] > 0.3).all()  # measured faster than any GEMM can run
    applied = predictor.predict_columns("gemm", columns, ["A40"] * len(rows), calibration)
    assert (applied == fastest).sum() >= 2  # the correction would take them below it
    np.testing.assert_allclose(equations.predict(theta)[0], applied, rtol=1e-9)


def test_calibrate_refuses_to_overwrite_its_inputs_and_names_the_right_line(tmp_path, capsys):
    """--output equal to --e2e (or --kernels, --prior) replaced the measurements with exit 0; after a blank line or
    a superseded kernel row, errors named the line above the bad one; a workload path naming one file from the
    working directory and another beside the CSV took the first silently."""
    import os

    csv = tmp_path / "m.csv"
    csv.write_text(E2E_HEADER + "\nQwen2.5-14B_arxiv_8_fa2_tp1_pp1,3451.9,27.87,6824.4\n"
                   "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1,-1,27.87,6824.4\n")
    before = csv.read_text()
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(csv), "--output", str(csv)]) == 2
    assert "would overwrite the --e2e file" in capsys.readouterr().err and csv.read_text() == before
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(csv), "--output",
                                          str(tmp_path / "c.json")]) == 2
    assert "line 4: prefill_ms must be a positive number" in capsys.readouterr().err
    kernels_csv = tmp_path / "k.csv"
    kernels_csv.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,4096,4096,L40,40.0\ngemm,16,4096,4096,L40,41.0\n"
                           "gemm,128,4096,4096,L40,abc\n")
    assert run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(kernels_csv), "--output",
                                          str(tmp_path / "c.json")]) == 2
    assert "line 4: avg_duration must be a positive number" in capsys.readouterr().err
    runs, here = tmp_path / "runs", tmp_path / "cwd"
    for folder, source in ((runs, TP1), (here, TP2)):
        (folder / "wl").mkdir(parents=True)
        (folder / "wl" / "run.json").write_bytes(source.read_bytes())
    (runs / "m.csv").write_text(E2E_HEADER + "wl/run.json,3451.9,27.87,6824.4\n")
    cwd = os.getcwd()
    try:
        os.chdir(here)
        assert run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(runs / "m.csv"), "--output",
                                              str(tmp_path / "c.json")]) == 2
    finally:
        os.chdir(cwd)
    assert "names both" in capsys.readouterr().err


def test_repeats_of_one_run_count_once_and_impossible_runs_are_caught(tmp_path, capsys):
    """Five copies of one row were five equations, outweighing the prior; a total far from prefill + decode steps
    (a cell in the wrong unit) and an FA3 workload on a GPU that cannot run FA3 calibrated without a word; rows of
    one kernel measured twice under two spellings of the GPU were both kept."""
    tp1 = small(TP1, tmp_path)
    summary = zero_shot(tp1, "A100")
    prefill, decode = summary["prefill_duration_ms"] * 1.2, summary["decode_avg_duration_ms"]
    row = f"{tp1},{{}},{decode},{prefill + 3 * decode}\n"
    code, once = calibrate(tmp_path, row.format(prefill), name="once.json")
    assert code == 0
    code, repeated = calibrate(tmp_path, "".join(row.format(prefill * f) for f in (0.9, 1.0, 1.0, 1.1, 1.3)),
                               name="repeated.json")
    assert code == 0 and "5 rows of" in capsys.readouterr().out
    assert load_calibration(repeated).theta.tolist() == load_calibration(once).theta.tolist()  # the median row
    assert calibrate(tmp_path, f"{tp1},{prefill},{decode},{(prefill + 3 * decode) * 2}\n", name="twice.json")[0] == 0
    assert "is far from prefill_ms + 3 decode steps" in capsys.readouterr().out
    fa3 = small(REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa3_tp1_pp1.json", tmp_path, name="fa3.json")
    assert calibrate(tmp_path, f"{fa3},{prefill},{decode},\n", name="fa3_calibration.json")[0] == 2
    assert "FlashAttention-3, Hopper only" in capsys.readouterr().err
    measured = tmp_path / "k.csv"
    measured.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,4096,4096,L40,40.0\n"
                        "gemm,16.0, 4096,4096,NVIDIA L40,44.0\ngemm,4096,4096,4096,L40,900.0\n")
    from pipeweave.predictor import KernelPredictor

    predictor = KernelPredictor()
    capsys.readouterr()
    _, frame, *_ = calibration_fit.read_kernel_csv(measured, predictor.hardware.get("L40"), predictor.hardware)
    assert frame["avg_duration"].tolist() == [44.0, 900.0]
    # said (a third audit: two runs appended to one file were taken row by row without a word)
    assert (f"WARNING: --kernels {measured}: 1 row(s) measure a shape a later row measures again (the first: line "
            f"2); the later row of each shape is taken") in capsys.readouterr().out


def test_another_gpus_kernel_row_is_refused_whatever_the_row_order():
    """The re-measured-row rule dropped the hardware from its key before the other-GPU check: an H100 row followed by
    the same shape on L40 was dropped silently, the reverse order refused."""
    import tempfile

    from pipeweave.predictor import KernelPredictor

    predictor = KernelPredictor()
    for rows in (("H100", "L40"), ("L40", "H100")):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "gemm.csv"
            path.write_text("op,M,N,K,hardware,avg_duration\n" + "".join(
                f"gemm,16,4096,4096,{gpu},40.0\n" for gpu in rows))
            with pytest.raises(calibration_fit.UserError, match="rows measured on H100, not on L40"):
                calibration_fit.read_kernel_csv(path, predictor.hardware.get("L40"), predictor.hardware)


def test_a_changed_spec_of_the_calibrated_gpu_is_warned_of(a100_calibration, tmp_path, capsys):
    """A calibration is ratios of measurements to the predictions of the spec it was fitted with: applied after the
    GPU's hardware JSON changed (a corrected datasheet value) it would correct that change twice, so every tool that
    applies it warns, naming the fields; the same spec gives no warning."""
    hardware = tmp_path / "hardware"
    shutil.copytree(REPO / "hardware", hardware)
    spec = json.loads((hardware / "A100.json").read_text())
    spec["memBandwidth"] = 1555.0
    (hardware / "A100.json").write_text(json.dumps(spec))
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,hardware\n16,4096,4096,A100\n")
    capsys.readouterr()
    for folder in (REPO / "hardware", hardware):
        assert run_cli(aggregate.main, ["--workload", str(small(TP1, tmp_path)), "--hardware", "A100", "--calibration",
                                        str(a100_calibration), "--hardware_dir", str(folder),
                                        "--output", str(tmp_path / "pred.json")]) == 0
        assert run_cli(kernels.main, ["--op", "gemm", "--input", str(shapes), "--output", str(tmp_path / "k.csv"),
                                      "--calibration", str(a100_calibration), "--hardware_dir", str(folder)]) == 0
        warnings = [line for line in capsys.readouterr().out.splitlines() if "another spec" in line]
        if folder == hardware:
            assert len(warnings) == 2 and all("(mem_bandwidth 2039.04 -> 1555.0)" in line for line in warnings)
        else:
            assert warnings == []


def test_profiler_rows_of_the_flush_timing_are_warned_of(tmp_path, capsys):
    """On an H100 the flush timing measured small GEMMs up to 1.8x the training data's harness, and a calibration on
    its rows put H100's measured runs 13.0 % off instead of 2.8 % (2026-12-05): such rows are named."""
    from pipeweave.profiler.csvio import columns_for

    for timing, warned in (("flush", True), ("rotate", False)):
        measured = tmp_path / f"gemm_{timing}.csv"
        pd.DataFrame([{**dict.fromkeys(columns_for("gemm"), ""), "op": "gemm", "M": m, "N": 4096, "K": 4096,
                       "hardware": "NVIDIA A40", "dtype": "bfloat16", "avg_duration": t, "timing": timing}
                      for m, t in ((16, 40.0), (4096, 900.0))]).to_csv(measured, index=False)
        assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(measured), "--output",
                                              str(tmp_path / "cal.json"), "--no_fine_tune"]) == 0
        out = capsys.readouterr().out
        assert ("2 row(s) timed with profile_operators.py --timing flush" in out) == warned, out
    # a profiler file written before the timing column (2026-12-05) was timed with the flush timing, the only one
    old = tmp_path / "gemm_flush.csv"
    pd.read_csv(old).drop(columns="timing").to_csv(old, index=False)
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(old), "--output",
                                          str(tmp_path / "cal.json"), "--no_fine_tune"]) == 0
    assert "2 row(s) timed with profile_operators.py --timing flush" in capsys.readouterr().out


def test_flash_attention_2_prefill_rows_do_not_calibrate_a_gpu_whose_prefill_is_flash_attention_3(tmp_path, capsys):
    """On a real H100 without flash-attn the profiler timed prefill with torch SDPA, labelled fa2_ragged: the
    corrections have one prefill class, so those rows set H100's FA3 prefill ×1.76 (its runs 2.8 → 8.2 % off)."""
    from pipeweave.profiler.csvio import columns_for

    def kernels(gpu: str, name: str):
        path = tmp_path / f"attn_{gpu}.csv"
        pd.DataFrame([{**dict.fromkeys(columns_for("attn"), ""), "op": "attn", "attention_type": "fa2_ragged",
                       "bs": 1, "q_lengths": f"[{n}]", "kv_lengths": f"[{n}]", "nh": 32, "nkv": 8, "hd": 128,
                       "hardware": name, "avg_duration": 0.02 * n, "kernel": "torch.sdpa(flash backend)",
                       "timing": "rotate"} for n in (512, 2048, 4096)]).to_csv(path, index=False)
        return path

    out = tmp_path / "cal.json"
    assert run_cli(calibration_fit.main, ["--hardware", "H100", "--kernels", str(kernels("H100", "NVIDIA H100")),
                                          "--output", str(out), "--no_fine_tune"]) == 2
    assert "3 prefill ran FlashAttention-2 (or torch SDPA), where vLLM runs FlashAttention-3 on this GPU" in \
        capsys.readouterr().err and not out.exists()
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(kernels("A40", "NVIDIA A40")),
                                          "--output", str(out), "--no_fine_tune"]) == 0  # FA2 is A40's prefill


def test_kernels_that_pull_the_runs_away_are_said_and_unmeasured_classes_are_named(tmp_path, capsys):
    """On the real H100, runs plus 3,452 flush-timed GEMMs gave a calibration whose own runs were 6.2 % off (1.6 %
    from the runs alone), without a word: the kernels outweigh the runs. Each source's error is said apart, a
    worsening of the runs warned of, and the factors of classes nothing measured are marked."""
    import pipeweave

    workload = small(TP1, tmp_path)
    predicted = pipeweave.predict_workload(workload, "A100")["summary"]
    runs = tmp_path / "runs.csv"
    runs.write_text("workload,prefill_ms,decode_step_ms,total_ms\n"
                    f"{workload},{predicted['prefill_duration_ms']},{predicted['decode_avg_duration_ms']},\n")
    shapes = {"M": [1, 16, 128, 1024, 4096] * 4, "N": [5120] * 10 + [13824] * 10, "K": [5120] * 20}
    slow = 1.5 * pipeweave.predict_kernels("gemm", shapes, "A100")  # another harness's 1.5x
    kernels = tmp_path / "gemm.csv"
    pd.DataFrame({"op": "gemm", **shapes, "hardware": "NVIDIA A100-SXM4-80GB", "avg_duration": slow}).to_csv(
        kernels, index=False)
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(runs), "--kernels", str(kernels),
                                          "--output", str(tmp_path / "cal.json"), "--no_fine_tune"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"  kernels: 0\.40\d -> 0\.\d+; runs: 0\.000 -> 0\.\d+", out), out
    assert "WARNING: the measured runs are further from their predictions after the calibration" in out
    assert re.search(r"  moe\.compute: x[\d.]+ \(nothing of it measured: moved through the prior's correlations\)",
                     out)
    assert not re.search(r"  gemm\.\w+: x[\d.]+ \(nothing", out)
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(runs), "--output",
                                          str(tmp_path / "cal.json"), "--no_fine_tune"]) == 0
    assert "WARNING: the measured runs are further" not in capsys.readouterr().out
    # kernels that agree with the runs, but for their own scatter, move them a little: no warning for that
    noise = np.exp(np.random.default_rng(0).normal(0.0, 0.05, len(slow)))
    pd.DataFrame({"op": "gemm", **shapes, "hardware": "NVIDIA A100-SXM4-80GB",
                  "avg_duration": slow / 1.5 * noise}).to_csv(kernels, index=False)
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(runs), "--kernels", str(kernels),
                                          "--output", str(tmp_path / "cal.json"), "--no_fine_tune"]) == 0
    said = capsys.readouterr().out
    assert re.search(r"runs: 0\.000 -> 0\.00\d", said) and "WARNING: the measured runs are further" not in said


def test_a_shape_two_files_measure_counts_once_from_the_newer_measurement(tmp_path, capsys):
    """A quick and a full grid (or two timings) given together: the quick grid's 239 GEMMs, all in the full grid,
    were counted twice (3,691 measured quantities of 3,452 shapes). The newer measurement is taken whatever the order
    of the files (the rotate rows of a new --output_dir given before the old flush ones), the later file where the
    rows have no timestamps; the flush-timing WARNING counts only the rows that calibrate."""
    from pipeweave.profiler.csvio import columns_for

    def profiled(name: str, timing: str, stamp: str, rows) -> Path:
        path = tmp_path / name
        pd.DataFrame([{**dict.fromkeys(columns_for("gemm"), ""), "op": "gemm", "M": m, "N": 4096, "K": 4096,
                       "hardware": "NVIDIA A40", "avg_duration": t, "timing": timing, "timestamp": stamp}
                      for m, t in rows]).to_csv(path, index=False)
        return path

    new = profiled("rotate.csv", "rotate", "2026-12-06T10:00:00Z", ((16, 40.0), (4096, 900.0)))
    old = profiled("flush.csv", "flush", "2026-12-05T19:31:32Z", ((16, 44.0), (4096, 990.0), (64, 45.0)))
    out = tmp_path / "a40.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(new), str(old), "--output",
                                          str(out), "--no_fine_tune"]) == 0
    said = capsys.readouterr().out
    assert f"--kernels {old}: 2 of its 3 row(s) measure shapes {new} measures too, newer or given later" in said
    assert f"--kernels {old}: 1 row(s) timed with profile_operators.py --timing flush" in said
    assert "from 3 measured quantities" in said
    assert [(e["file"], e["rows"]) for e in load_calibration(out).fitted_from["kernels"]] == \
        [(str(new), 2), (str(old), 1)]
    quick, full = tmp_path / "quick.csv", tmp_path / "full.csv"  # hand-made: no timestamps, the later file wins
    quick.write_text("op,M,N,K,hardware,avg_duration\n" + "".join(
        f"gemm,{m},4096,4096,A40,{t}\n" for m, t in ((16, 44.0), (4096, 990.0))))
    full.write_text("op,M,N,K,hardware,avg_duration\n" + "".join(
        f"gemm,{m},4096,4096,A40,{t}\n" for m, t in ((16.0, 40.0), (4096, 900.0), (64, 45.0))))
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(quick), str(full), "--output",
                                          str(out), "--no_fine_tune"]) == 0
    said = capsys.readouterr().out
    assert f"--kernels {quick}: 2 of its 2 row(s) measure shapes {full} measures too" in said
    assert [(e["file"], e["rows"]) for e in load_calibration(out).fitted_from["kernels"]] == [(str(full), 3)]


def test_kernel_files_given_twice_count_once_and_unknown_gpu_names_name_the_line(tmp_path, capsys):
    measured = tmp_path / "gemm.csv"
    measured.write_text("op,M,N,K,hardware,avg_duration\n"
                        + "".join(f"gemm,{m},4096,4096,A40,{t}\n" for m, t in ((16, 40.0), (4096, 900.0))))
    copy = tmp_path / "gemm_copy.csv"
    copy.write_text(measured.read_text())
    out = tmp_path / "a40.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(measured), str(measured), str(copy),
                                          "--output", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"--kernels {measured}: given twice; counted once" in said
    assert f"--kernels {copy}: the same measurements as {measured}; counted once" in said
    assert [entry["rows"] for entry in load_calibration(out).fitted_from["kernels"]] == [2]
    renamed = tmp_path / "renamed.csv"
    renamed.write_text(measured.read_text().replace(",A40,", ",NVIDIA A40 PCIe,", 1))
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(renamed), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--kernels {renamed}: line 2: column hardware: unknown GPU 'NVIDIA A40 PCIe'" in err[0]


def test_no_output_lands_among_the_gpu_specs(tmp_path, capsys):
    """Every command loads each JSON of the hardware folder as a GPU spec: a calibration or a prediction written
    there would stop them all, so it is refused before any work."""
    measured = tmp_path / "gemm.csv"
    measured.write_text("op,M,N,K,hardware,avg_duration\ngemm,16,4096,4096,A40,40.0\n")
    hardware = tmp_path / "hardware"
    shutil.copytree(REPO / "hardware", hardware)
    for argv in (["--output", str(REPO / "hardware" / "A40_calibration.json")],
                 ["--hardware_dir", str(hardware), "--output", str(hardware / "cal.json")]):
        assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(measured), *argv]) == 2
        err = capsys.readouterr().err
        assert "holds the GPU spec JSONs" in err
    assert run_cli(aggregate.main, ["--workload", str(TP1), "--hardware", "A40", "--output",
                                    str(REPO / "hardware" / "pred.json")]) == 2
    assert "holds the GPU spec JSONs" in capsys.readouterr().err
    assert not list((REPO / "hardware").glob("*cal*.json")) and not (REPO / "hardware" / "pred.json").exists()


def test_a_measured_sweep_narrows_the_interval_of_the_estimate_it_calibrates(tmp_path):
    """L40 has no collective measurements, so its all-reduce is the analytical estimate, inside the PCIe spread of
    other GPUs (x0.46-6.8). Calibrated on its own 2-GPU sweep, the estimate takes that sweep's cross-validated
    scatter instead; a worker count the sweep did not measure keeps the wide one."""
    from pipeweave.collectives import CollectivePredictor
    from pipeweave.engine import Engine
    from pipeweave.workload import build_workload
    from pipeweave.workload_inputs import load_model_config

    sizes = np.geomspace(1 << 12, 1 << 30, 12)
    rng = np.random.default_rng(0)  # a real sweep scatters around any smooth correction
    truth = (CollectivePredictor("L40", allow_analytical=True).predict_ms("all_reduce", sizes, 2) * 1500.0
             * np.exp(rng.normal(0.0, 0.1, len(sizes))))
    csv = tmp_path / "measured_all_reduce.csv"
    csv.write_text("op,size_bytes,num_workers,hardware,avg_duration\n" + "".join(
        f"all_reduce,{int(s)},2,L40,{t}\n" for s, t in zip(sizes, truth)))
    out = tmp_path / "cal.json"
    assert run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(csv), "--output", str(out)]) == 0
    entry = load_calibration(out).spread["all_reduce"]
    assert entry["kernels"] == 12 and entry["workers"] == [2]
    cal = load_calibration(out)
    plain = Engine(collective_estimate="analytical", log=None)
    calibrated = Engine(collective_estimate="analytical", calibration=cal, log=None)
    for tp, narrowed in ((2, True), (4, False)):
        workload = tmp_path / f"tp{tp}.json"
        generated = build_workload(load_model_config("Llama-3.1-8B"), [512] * 4, 2, tp=tp)
        workload.write_text(json.dumps(generated.to_dict()))
        before, after = (e.predict_workload(workload, "L40")["extrapolation"]["analytical_collectives"]["interval"]
                         ["all_reduce"] for e in (plain, calibrated))
        assert (after != before) == narrowed, tp
        if narrowed:
            assert after[0] > before[0] and after[1] < before[1]
            assert after == pytest.approx([np.exp(min(entry["log_low"], 0)), np.exp(max(entry["log_high"], 0))],
                                          abs=1e-4)
