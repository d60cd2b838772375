"""Which kernels to measure (pipeweave.kernel_design): the greedy least-variance order, its use of the calibration's
prior, and the profiler grid it cuts."""
import numpy as np
import pytest

from analytical_model.hardware import hardware_registry
from analytical_model.registry import get_operator
from pipeweave.calibration import load_prior
from pipeweave.kernel_design import informative_kernels, kernel_terms, least_variance_order, log_error_covariance
from pipeweave.paths import DEFAULT_CONFIG_DIR
from pipeweave.profiler import grids


def summed_posterior_variance(covariance: np.ndarray, noise: np.ndarray, measured: np.ndarray) -> float:
    """Σ_i Var(e_i | the ``measured`` kernels), computed directly (not by the greedy's rank-one updates)."""
    if not len(measured):
        return float(np.trace(covariance))
    cross = covariance[:, measured]
    gram = covariance[np.ix_(measured, measured)] + np.diag(noise[measured])
    return float(np.trace(covariance) - np.einsum("ij,ji->", cross, np.linalg.solve(gram, cross.T)))


def test_independent_kernels_are_taken_most_uncertain_first():
    covariance = np.diag([1.0, 4.0, 2.0, 0.5])
    order = least_variance_order(covariance, np.full(4, 0.1), 3)
    assert order.tolist() == [1, 2, 0]


def test_a_kernel_like_one_already_chosen_comes_after_the_others():
    """Two tight clusters of three kernels: the second choice is from the other cluster, not a near copy."""
    block = np.full((3, 3), 0.99) + 0.01 * np.eye(3)
    covariance = np.block([[block, np.zeros((3, 3))], [np.zeros((3, 3)), 0.9 * block]])
    order = least_variance_order(covariance, np.full(6, 0.05), 2)
    assert {int(order[0]) // 3, int(order[1]) // 3} == {0, 1}


def test_each_choice_lowers_the_summed_variance_most_and_none_twice():
    rng = np.random.default_rng(0)
    factors = rng.normal(size=(40, 5))
    covariance, noise = factors @ factors.T + 0.1 * np.eye(40), np.full(40, 0.2)
    order = least_variance_order(covariance, noise, 12)
    assert len(set(order.tolist())) == 12
    for step in range(1, 12):
        before = order[:step - 1]
        best = min(range(40), key=lambda j: summed_posterior_variance(covariance, noise, np.append(before, j))
                   if j not in before else np.inf)
        assert order[step - 1] == best
    assert least_variance_order(covariance, noise, 100).shape == (40,)


def test_the_design_leaves_less_variance_than_random_draws_on_the_profiler_grid():
    """On the full GEMM grid for L40 (no measurement of it exists), 16 designed kernels leave less summed prior
    variance under the shipped calibration prior than any of 20 random draws of 16."""
    prior = load_prior()
    rows = grids.build_grid(grids.load_models(grids.DEFAULT_CONFIGS, DEFAULT_CONFIG_DIR), ops=["gemm"]).rows["gemm"]
    rows = [rows[i] for i in np.random.default_rng(1).choice(len(rows), 600, replace=False)]
    columns = get_operator("gemm").shape_columns
    spec = hardware_registry().get("L40")
    features = get_operator("gemm").features({c: [r[c] for r in rows] for c in columns}, spec)
    shapes = [tuple(r[c] for c in columns) for r in rows]
    terms = kernel_terms("gemm", features, shapes, prior)
    covariance, noise = log_error_covariance(*terms, prior)
    designed = informative_kernels(*terms, prior, 16)
    assert len(set(designed.tolist())) == 16
    left = summed_posterior_variance(covariance, noise, designed)
    drawn = [summed_posterior_variance(covariance, noise, np.random.default_rng(s).choice(600, 16, replace=False))
             for s in range(20)]
    assert left < min(drawn)
    # the corrections' size slope and hinges need both ends of the size range
    size = np.log(np.asarray(features)[:, get_operator("gemm").feature_names.index("tensor_all_ops")])
    chosen = size[designed]
    assert chosen.min() <= np.quantile(size, 0.1) and chosen.max() >= np.quantile(size, 0.9)


def test_a_pool_beyond_the_cap_is_a_seeded_draw():
    rng = np.random.default_rng(3)
    n = 50
    x = np.zeros((n, len(load_prior().covariance())))
    x[:, 0], x[:, 1] = rng.uniform(size=n), 1.0
    prior = load_prior()
    classes, groups, inputs = np.full(n, "gemm"), np.full(n, "gemm"), rng.normal(size=(n, 3))
    first = informative_kernels(x, classes, groups, inputs, prior, 5, max_candidates=20, seed=7)
    again = informative_kernels(x, classes, groups, inputs, prior, 5, max_candidates=20, seed=7)
    pool = np.sort(np.random.default_rng(7).choice(n, size=20, replace=False))
    assert first.tolist() == again.tolist() and set(first.tolist()) <= set(pool.tolist())
    assert informative_kernels(x, classes, groups, inputs, prior, 60).tolist() == list(range(n))


@pytest.mark.parametrize("op", ["attn", "rmsnorm", "siluandmul", "gemm_fp8"])
def test_every_profiled_operator_can_be_designed(op):
    """The profiler's grid rows of every kernel operator are a design's candidates (attention's length lists
    included); the cut grid keeps k rows of the grid, in the design's order."""
    grid = grids.build_grid(grids.load_models(["Llama-3.1-70B"], DEFAULT_CONFIG_DIR), [8], ops=[op])
    cut = grids.informative_grid(grid, hardware_registry().get("H200"), 6)
    assert len(cut.rows[op]) == 6 and all(row in grid.rows[op] for row in cut.rows[op])
    assert f"{op}: the 6 of its {len(grid.rows[op])} grid shapes" in cut.notes[-1]


def test_the_evaluation_section_says_where_the_design_loses():
    from pipeweave.design_eval import render

    results = {"attn": {"GPU A": {"n": 100, "shots": {"8": {"random": 10.0, "designed": 9.0},
                                                      "32": {"random": 8.0, "designed": 8.5}}},
                        "GPU B": {"n": 20, "shots": {"8": {"random": 6.0, "designed": 5.0}}}}}
    text = render(results, ["attn"])
    assert "| attn | GPU A | 100 | 10.0 → 9.0 | 8.0 → 8.5 | — |" in text
    assert "| attn | GPU B | 20 | 6.0 → 5.0 | — | — |" in text
    assert "attn k = 8: 8.0 → 7.0 % (lower on 2 of 2); attn k = 32: 8.0 → 8.5 % (lower on 0 of 1)" in text
    assert "from the operators attn only" in text


def test_the_evaluation_refuses_an_unknown_operator(capsys):
    from pipeweave.cli import run_cli
    from pipeweave.design_eval import main

    assert run_cli(main, ["--ops", "gemm,conv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ops: conv; choose from gemm, gemm_fp8, attn" in err[0]
