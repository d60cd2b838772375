"""The Gaussian-process interpolation of a calibration's residuals (pipeweave.residual_kernel)."""
import json

import numpy as np
import pandas as pd
import pytest

from pipeweave.calibration import Calibration, Prior, load_calibration, load_prior
from pipeweave.calibration_design import PARAMS
from pipeweave.calibration_eval import HeldOut, estimate_prior, interpolated_residuals, kshot_errors
from pipeweave.residual_kernel import (ResidualInterpolation, ResidualKernel, fit_residual_kernel, log_corrections,
                                       negative_log_likelihood, residual_groups, residual_inputs,
                                       residual_kernels_from_dict, winsorised)

PLANTED = ResidualKernel((0.7, 1.5), 0.1, 0.03)


def draws(kernel: ResidualKernel, n_sets: int, n: int, seed: int = 0) -> list:
    """Independent draws of the process of ``kernel`` at uniform inputs in [-2, 2]²."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_sets):
        inputs = rng.uniform(-2, 2, size=(n, len(kernel.lengthscales)))
        covariance = kernel.covariance(inputs, inputs) + kernel.noise_sd ** 2 * np.eye(n)
        out.append((inputs, np.linalg.cholesky(covariance) @ rng.normal(size=n)))
    return out


def test_the_likelihood_gradient_is_the_derivative_of_the_likelihood():
    samples = draws(PLANTED, 2, 40, seed=1)
    point = np.array([0.1, -0.2, np.log(0.05), np.log(0.04)])
    _, gradient = negative_log_likelihood(point, samples)
    step = 1e-6
    numeric = [(negative_log_likelihood(point + step * e, samples)[0]
                - negative_log_likelihood(point - step * e, samples)[0]) / (2 * step) for e in np.eye(len(point))]
    np.testing.assert_allclose(gradient, numeric, rtol=1e-5)


def test_the_marginal_likelihood_recovers_a_planted_covariance():
    fitted = fit_residual_kernel(draws(PLANTED, 6, 250))
    np.testing.assert_allclose(fitted.lengthscales, PLANTED.lengthscales, rtol=0.25)
    assert fitted.signal_sd == pytest.approx(PLANTED.signal_sd, rel=0.2)
    assert fitted.noise_sd == pytest.approx(PLANTED.noise_sd, rel=0.2)
    assert fit_residual_kernel(draws(PLANTED, 6, 250)) == fitted  # deterministic


def test_interpolation_predicts_unmeasured_shapes_from_measured_ones_and_nothing_far_from_them():
    (inputs, residuals), = draws(PLANTED, 1, 600, seed=3)
    measured, other = np.arange(300), np.arange(300, 600)
    interpolation = ResidualInterpolation.fit(PLANTED, inputs[measured], residuals[measured])
    predicted = interpolation.log_correction(inputs[other])
    assert np.mean(np.abs(residuals[other] - predicted)) < 0.6 * np.mean(np.abs(residuals[other]))
    far = interpolation.log_correction(np.full((1, 2), 50.0))
    assert abs(far[0]) < 1e-9  # the calibration alone


def test_the_cross_validated_spread_interpolates_each_fold_from_the_others():
    """Kernels whose error follows a smooth function of the shape: the corrections' cross-validation leaves its
    swing, the interpolated one only the noise; an interpolator without a covariance for the group changes
    nothing."""
    from pipeweave.calibration import Equations, cross_validated_log_residuals
    from pipeweave.residual_kernel import interpolator

    (inputs, residuals), = draws(PLANTED, 1, 200, seed=7)
    prior = load_prior()
    x = np.zeros((200, len(PARAMS)))  # no correction term: the prior alone, so the residuals are the planted ones
    equations = Equations(np.arange(200), np.ones(200), x, np.exp(residuals), np.full(200, 0.1))
    groups = np.full(200, "gemm")
    plain = cross_validated_log_residuals(equations, prior, np.arange(200))
    np.testing.assert_allclose(plain, residuals)
    interpolated = cross_validated_log_residuals(equations, prior, np.arange(200),
                                                 interpolator({"gemm": PLANTED}, groups, inputs))
    assert np.std(interpolated) < 0.6 * np.std(plain)
    unknown = cross_validated_log_residuals(equations, prior, np.arange(200), interpolator({}, groups, inputs))
    np.testing.assert_array_equal(unknown, plain)


def test_one_kernel_measured_far_off_does_not_pull_its_neighbours():
    """A timing spike (a factor e² on one kernel among smooth residuals) is winsorised: its neighbours move by
    less than 0.05 in log, where without it they would follow it far."""
    rng = np.random.default_rng(5)
    inputs = rng.uniform(-2, 2, size=(200, 2))
    residuals = 0.02 * rng.normal(size=200)
    residuals[0] = 2.0
    kernel = ResidualKernel((1.0, 1.0), 0.1, 0.03)
    neighbour = inputs[:1] + 0.05
    assert abs(ResidualInterpolation.fit(kernel, inputs, residuals).log_correction(neighbour)[0]) < 0.05
    assert winsorised(residuals)[0] < 0.1
    covariance = kernel.covariance(inputs, inputs) + kernel.noise_sd ** 2 * np.eye(len(inputs))
    unclipped = kernel.covariance(neighbour, inputs) @ np.linalg.solve(covariance, residuals)
    assert unclipped[0] > 0.5


@pytest.mark.parametrize("op, shapes, expected", [
    ("gemm", [(4096, 8192, 1024)], [[np.log(4096), np.log(8192), np.log(1024)]]),
    ("rmsnorm", [(1, 4096)], [[0.0, np.log(4096)]]),
    ("moe", [("layer", 64, 128, 8, 4096, 768)], [[np.log(64), np.log(128), np.log(8), np.log(4096), np.log(768)]]),
    ("attn", [("fa2_paged", 2, "[1,1]", "[100,300]", 32, 8, 128)],
     [[np.log(2), 0.0, np.log(200), np.log(32), np.log(8), np.log(128)]]),
])
def test_residual_inputs_are_the_log_shape(op, shapes, expected):
    np.testing.assert_allclose(residual_inputs(op, shapes), expected)


def test_attention_prefill_and_decode_are_interpolated_apart():
    shapes = [("fa2_paged", 1, "[1]", "[512]", 32, 8, 128), ("fa2_ragged", 1, "[512]", "[512]", 32, 8, 128)]
    assert list(residual_groups("attn", shapes)) == ["attn_decode", "attn_prefill"]
    kernel = ResidualKernel((1.0,) * 6, 0.1, 0.03)
    decode_only = {"attn_decode": ResidualInterpolation.fit(kernel, residual_inputs("attn", shapes[:1]),
                                                            np.array([0.2]))}
    corrections = log_corrections(decode_only, "attn", shapes)
    assert corrections[0] != 0 and corrections[1] == 0


def test_a_prior_or_file_entry_of_an_unknown_group_or_the_wrong_inputs_is_refused():
    with pytest.raises(ValueError, match="x.conv: unknown group"):
        residual_kernels_from_dict({"conv": PLANTED.as_dict()}, "x")
    with pytest.raises(ValueError, match="x.gemm: 2 length scales, its inputs are log_M, log_N, log_K"):
        residual_kernels_from_dict({"gemm": PLANTED.as_dict()}, "x")
    with pytest.raises(ValueError, match="x.gemm: its length scales and scales must be finite positive"):
        residual_kernels_from_dict({"gemm": {"lengthscales": [1, 1, -1], "signal_sd": 0.1, "noise_sd": 0.1}}, "x")


def synthetic_gpu(gpu: str, seed: int, n: int = 2000) -> HeldOut:
    """GEMM kernels whose log error is a smooth function of the log shape (wave-like in log M) plus 3 % noise: a
    structure no intercept or slope on log size describes."""
    rng = np.random.default_rng(seed)
    inputs = rng.uniform([0, 6, 6], [10, 10, 10], size=(n, 3))
    raw = np.zeros((n, 4))
    raw[:, 0] = inputs.sum(axis=1)
    y = 0.15 * np.sin(1.5 * inputs[:, 0] + seed) + 0.03 * rng.normal(size=n)
    return HeldOut("gemm", gpu, np.full(n, "gemm", dtype=object), np.full(n, 0.5), raw, y, None,
                   np.full(n, "gemm").astype(str), inputs)


def test_the_prior_learns_the_residual_covariance_and_128_kernels_then_predict_the_others_better():
    others = [synthetic_gpu(f"gpu{i}", seed=i) for i in range(4)]
    prior = estimate_prior(others, "synthetic")
    kernel = prior.residual_kernels["gemm"]
    assert kernel.lengthscales[0] < min(kernel.lengthscales[1:])  # the structure is along M alone
    held = synthetic_gpu("new", seed=9)
    x = held.design(prior.standardisation)
    without = HeldOut(*[getattr(held, name) for name in ("op", "gpu", "classes", "compute_share", "raw", "y")])
    assert kshot_errors(held, x, prior, 128, seed=1)[0] < 0.5 * kshot_errors(without, x, prior, 128, seed=1)[0]
    drawn = np.arange(10)
    np.testing.assert_array_equal(interpolated_residuals(without, prior, drawn, held.y[drawn]), 0.0)
    again = Prior.from_dict(json.loads(json.dumps(prior.as_dict())))
    assert again.residual_kernels == prior.residual_kernels


def test_a_calibration_file_keeps_its_interpolation_and_an_older_one_reads_without(tmp_path):
    interpolation = ResidualInterpolation.fit(ResidualKernel((1.0, 1.0, 1.0), 0.1, 0.03), np.zeros((1, 3)),
                                              np.array([0.3]))
    calibration = Calibration("A100", "NVIDIA A100-SXM4-80GB", np.zeros(len(PARAMS)), np.zeros(len(PARAMS)),
                              {}, {}, {}, load_prior().standardisation, residuals={"gemm": interpolation})
    path = tmp_path / "cal.json"
    calibration.save(path)
    loaded = load_calibration(path)
    shapes = [(1, 1, 1), (1 << 20, 1 << 20, 1 << 20)]
    features = np.ones((2, 11))
    np.testing.assert_array_equal(loaded.factors("gemm", features, shapes), calibration.factors("gemm", features,
                                                                                                 shapes))
    near, far = loaded.factors("gemm", features, shapes)
    assert near > 1.2 and far == pytest.approx(1.0, abs=1e-9)
    assert loaded.summary()["interpolated_kernels"] == {"gemm": 1}
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "format": 4}))
    assert load_calibration(path).residuals == {}
    data["residuals"]["gemm"]["weights"] = [float("nan")]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="residuals.gemm: inputs must be 3 finite numbers per row and weights"):
        load_calibration(path)


def test_calibrate_interpolates_its_kernels_residuals_and_predict_kernels_applies_them(tmp_path, capsys):
    """GEMMs of L40 (outside the GEMM model's training data) measured with an error that swings with log M (a
    structure the corrections' slopes cannot follow): calibrate.py, with a prior that has a GEMM covariance,
    interpolates it, and predict_kernels.py then predicts GEMMs between the measured ones closer than the same
    calibration without it. On A40, a GPU the model trained on, nothing is interpolated, and it says so."""
    from pipeweave import calibration_fit, kernels
    from pipeweave.cli import run_cli

    def truth_factor(m):
        return np.exp(0.25 * np.sin(2.0 * np.log(m)))

    def table(ms, path, with_time=None, gpu="L40"):
        rows = [(m, n, k) for m in ms for n, k in ((4096, 4096), (8192, 1024))]
        if with_time is None:
            path.write_text("M,N,K,hardware\n" + "".join(f"{m},{n},{k},{gpu}\n" for m, n, k in rows))
        else:
            path.write_text("op,M,N,K,hardware,avg_duration\n" + "".join(
                f"gemm,{m},{n},{k},NVIDIA {gpu},{t}\n" for (m, n, k), t in zip(rows, with_time)))
        return np.array([m for m, _, _ in rows], dtype=float)

    def predicted(shapes, calibration=None):
        out = tmp_path / "out.csv"
        args = ["--op", "gemm", "--input", str(shapes), "--output", str(out)]
        assert run_cli(kernels.main, args + (["--calibration", str(calibration)] if calibration else [])) == 0
        return pd.read_csv(out)["predicted_us"].to_numpy()

    measured_ms = [int(2 ** e) for e in np.arange(4, 13.5, 0.5)]
    unseen_ms = [int(2 ** e) for e in np.arange(4.25, 13, 0.5)]
    grid = tmp_path / "grid.csv"
    m = table(measured_ms, grid)
    measured = tmp_path / "measured_gemm.csv"
    table(measured_ms, measured, predicted(grid) * truth_factor(m))
    unseen = tmp_path / "unseen.csv"
    unseen_m = table(unseen_ms, unseen)
    truth = predicted(unseen) * truth_factor(unseen_m)
    data = load_prior().as_dict()
    errors = {}
    for name, kernels_prior in (("without", {}), ("with", {"gemm": ResidualKernel((0.7, 1.0, 1.0), 0.15, 0.02)})):
        prior = tmp_path / f"prior_{name}.json"
        prior.write_text(json.dumps({**data, "residual_kernels": {g: k.as_dict() for g, k in kernels_prior.items()}}))
        out = tmp_path / f"{name}.json"
        assert run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(measured), "--output", str(out),
                                              "--prior", str(prior), "--no_fine_tune"]) == 0
        errors[name] = np.mean(np.abs(np.log(predicted(unseen, out) / truth)))
    assert load_calibration(tmp_path / "with.json").summary()["interpolated_kernels"] == {"gemm": len(m)}
    assert load_calibration(tmp_path / "without.json").residuals == {}
    assert errors["with"] < 0.5 * errors["without"], errors
    # the spread the interval is widened to: each fold predicted with the other folds' residuals interpolated to it
    widths = {name: np.subtract(*[load_calibration(tmp_path / f"{name}.json").spread["gemm"][end]
                                  for end in ("log_high", "log_low")]) for name in ("with", "without")}
    assert widths["with"] < 0.6 * widths["without"], widths
    trained = tmp_path / "measured_a40.csv"
    table(measured_ms, trained, predicted(grid) * truth_factor(m), gpu="A40")
    capsys.readouterr()
    assert run_cli(calibration_fit.main, ["--hardware", "A40", "--kernels", str(trained), "--output",
                                          str(tmp_path / "a40.json"), "--prior", str(tmp_path / "prior_with.json"),
                                          "--no_fine_tune"]) == 0
    assert load_calibration(tmp_path / "a40.json").residuals == {}
    assert "Not interpolated over their shapes: the residuals of the measured gemm kernels" in capsys.readouterr().out
