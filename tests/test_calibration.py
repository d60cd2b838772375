"""Per-GPU calibration (pipeweave/calibration*.py, calibrate.py, --calibration of aggregator.py and
predict_kernels.py): the MAP fit, shrinkage, GPU isolation, transfer across TP, input errors and provenance.

Uses the shipped models and workloads (no shared data needed); workloads are cut to a few iterations.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeweave import aggregate, calibration_fit, kernels
from pipeweave.calibration import (COMMUNICATION, PARAMS, Calibration, Equations, Prior, design, fit_map,
                                   load_calibration, load_prior)
from pipeweave.calibration_eval import estimate_prior
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
    assert theta[COMMUNICATION] == 0


def test_design_splits_compute_and_memory_shares():
    features = np.zeros((2, 9))
    from analytical_model.registry import get_operator
    names = get_operator("gemm").feature_names
    features[:, names.index("tensor_all_cycle")] = [300.0, 100.0]
    features[:, names.index("global_cycle")] = [100.0, 300.0]
    x = design("gemm", features)
    np.testing.assert_allclose(x[:, PARAMS.index("gemm.compute")], [0.75, 0.25])
    np.testing.assert_allclose(x.sum(axis=1), 1.0)


def test_prior_from_synthetic_corrections():
    """Every GPU equally slow in every class -> the shared GPU term carries the spread, classes little."""
    corrections = {f"gpu{i}": {"gemm.compute": s, "gemm.memory": s, "attn_prefill.compute": s,
                               "attn_decode.memory": s} for i, s in enumerate((-0.3, -0.1, 0.1, 0.3))}
    residuals = {"gemm": [np.random.default_rng(0).normal(0, 0.1, 5000)]}
    prior = estimate_prior(corrections, residuals, "synthetic")
    assert prior.tau_gpu == pytest.approx(np.sqrt(0.05), rel=0.01)
    assert prior.tau_class["gemm"] < 0.05
    assert prior.sigma_kernel["gemm"] == pytest.approx(0.1, rel=0.1)


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


def test_calibration_file_and_tp1_run_moves_tp2_prediction(a100_calibration, tmp_path):
    cal = load_calibration(a100_calibration)
    assert cal.hardware == "A100" and cal.fitted_from["e2e"]["runs"]
    assert cal.theta[COMMUNICATION] == 0  # a TP1 run has no collectives: the communication factor stays at its prior
    assert cal.theta[PARAMS.index("gemm.compute")] > 0.05  # prefill (compute-bound GEMMs) measured slower
    tp2 = small(TP2, tmp_path)
    out = tmp_path / "pred.json"
    assert run_cli(aggregate.main, ["--workload", str(tp2), "--hardware", "A100", "--calibration",
                                    str(a100_calibration), "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    base = zero_shot(tp2, "A100")
    assert result["summary"]["prefill_duration_ms"] > base["prefill_duration_ms"] * 1.05
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


def test_kernel_csv_calibration(tmp_path):
    measured = tmp_path / "measured_gemm.csv"
    rows = [f"gemm,{m},4096,4096,NVIDIA A40,{t}" for m, t in ((16, 40.0), (4096, 900.0), (1024, 260.0))]
    measured.write_text("op,M,N,K,hardware,avg_duration\n" + "\n".join(rows) + "\n")
    out = tmp_path / "a40.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(measured), "--output", str(out)]) == 0
    cal = load_calibration(out)
    assert cal.fitted_from["kernels"][0]["rows"] == 3 and np.any(cal.theta != 0)


def unsharded(data: dict) -> None:
    """Llama-3.1-70B on one GPU: every GEMM four times wider (140 GB of weights)."""
    data["tp_size"] = 1
    for iteration in data["iterations"]:
        for gemm in iteration["operators"]["gemm"]:
            gemm["N"] *= 4


@pytest.mark.parametrize("rows,needle", [
    ("{tp1},0,20,100\n", "prefill_ms must be a positive number"),
    ("{tp1},-5,20,100\n", "prefill_ms must be a positive number"),
    ("{tp1},abc,20,100\n", "prefill_ms must be a positive number"),
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
    for path, needle in ((other_gpu, "not on A100"), (unknown, "unknown column(s) colour")):
        code = run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(path), "--output",
                                              str(tmp_path / "c.json")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and needle in err[0]


def test_calibration_file_validation(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(ValueError, match="not a calibration file"):
        load_calibration(bad)
    with pytest.raises(FileNotFoundError, match="calibrate.py"):
        load_calibration(tmp_path / "absent.json")


def test_prior_file_is_consistent():
    prior = load_prior()
    assert isinstance(prior, Prior) and prior.sigma_e2e > 0 and prior.tau_comm > 0
    assert np.all(np.linalg.eigvalsh(prior.covariance()) > 0)


def test_engine_hook_scales_collectives_of_its_gpu_only():
    from analytical_model.hardware import load_hardware

    theta = np.zeros(len(PARAMS))
    theta[COMMUNICATION] = np.log(2.0)
    cal = Calibration("A100", "NVIDIA A100-SXM4-80GB", theta, np.zeros(len(PARAMS)), {}, {}, {})
    np.testing.assert_allclose(cal.apply("all_reduce", load_hardware("A100"), np.ones(3)), 2.0)
    np.testing.assert_array_equal(cal.apply("all_reduce", load_hardware("H100"), np.ones(3)), 1.0)
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
    from pipeweave.collectives import CollectivePredictor

    sizes = np.array([1 << 16, 1 << 20, 1 << 24], dtype=np.float64)
    measured = CollectivePredictor("A100").predict_ms("all_reduce", sizes, 2) * 1000.0 * 2.0  # twice as slow
    csv = tmp_path / "measured_all_reduce.csv"
    csv.write_text("op,size_bytes,num_workers,hardware,avg_duration\n" + "".join(
        f"all_reduce,{int(s)},2,NVIDIA A100-SXM4-80GB,{t}\n" for s, t in zip(sizes, measured)))
    out = tmp_path / "cal.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--kernels", str(csv), "--output", str(out)]) == 0
    cal = load_calibration(out)
    assert 1.6 < np.exp(cal.theta[COMMUNICATION]) < 2.0
    np.testing.assert_array_equal(cal.theta[:COMMUNICATION], 0.0)


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
