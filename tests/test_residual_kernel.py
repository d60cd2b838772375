"""The Gaussian-process interpolation of a calibration's residuals (pipeweave.residual_kernel)."""
import json

import numpy as np
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
