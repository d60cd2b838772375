"""Which kernels to measure on a GPU the models never saw: the k of a candidate grid that teach its calibration most.

A calibration (:mod:`pipeweave.calibration`) corrects a kernel's zero-shot log duration by x·θ (x its design row,
θ its corrections, Gaussian a priori with covariance Σ₀) and then interpolates what the corrections leave over the
log shape (:mod:`pipeweave.residual_kernel`: a Gaussian process of covariance K per kernel group). Before anything
is measured, the log errors of the candidate kernels of one operator are therefore one Gaussian vector,

    C = X Σ₀ Xᵀ + K   (K between kernels of the same group only),

each measured with noise σ_j² (the calibration's noise of its class plus the process's own). Measuring kernel j
lowers the variance of kernel i by C_ij² / (C_jj + σ_j²), and the covariance left is C − c_j c_jᵀ / (C_jj + σ_j²).
:func:`least_variance_order` picks, one at a time, the candidate whose measurement lowers the summed variance of
all candidates most (a sequential V-optimal design), so k kernels spread over what the prior leaves uncertain: both
ends of the size range and of the compute share, which fix the corrections' slopes, and the regions of the shape
space that no chosen kernel covers yet. A random draw instead follows the grid's density and leaves the corners
to chance. The design reads the shapes and the GPU's spec sheet only, never a measurement, so it can be chosen
before the GPU runs anything, and an evaluation that scores it on the kernels not chosen stays honest.

Measured leave-one-GPU-out (docs/ACCURACY.md, "Which kernels to measure"; corrections and interpolation, no
fine-tuning; the prior of 2026-12-07): averaged over the GPUs of an operator, the kernels not chosen are predicted
better than after a random draw of the same size for 12 of the 18 operators and sizes (8, 32, 128 kernels), by up
to 1.3 points (FP8 GEMM with 8), and worse by up to 0.3 in the other six. It helps FP8 GEMM, attention and
RMSNorm; for BF16 GEMM it is no better than a draw (L40S with 32 kernels 13.2 → 14.7 %), where under the prior
before it had been a little better: the kernels it places at the ends of the shape range fix the corrections'
slopes there, which is only as good as their linear form and the prior.
"""
from __future__ import annotations

import numpy as np

from pipeweave.calibration import Prior
from pipeweave.calibration_design import attention_types, design, kernel_classes
from pipeweave.residual_kernel import residual_groups, residual_inputs

#: the most candidates one design weighs (a seeded draw beyond it): the (n × n) covariance takes n² doubles, 128 MB
#: at 4,000, and the profiler's full GEMM grid holds 3,790 shapes
MAX_CANDIDATES = 4000
SEED = 0


def kernel_terms(op: str, features: np.ndarray, shapes: list[tuple], prior: Prior
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(design rows, calibration classes, residual groups, residual inputs) of kernels of ``op`` (``features``: their
    analytical features in the registry's order, ``shapes``: their shape columns), as a calibration under ``prior``
    sees them."""
    features = np.asarray(features, dtype=np.float64)
    return (design(op, features, shapes, prior.standardisation),
            kernel_classes(op, len(features), attention_types(op, shapes)),
            residual_groups(op, shapes), residual_inputs(op, shapes))


def log_error_covariance(x: np.ndarray, classes: np.ndarray, groups: np.ndarray, inputs: np.ndarray, prior: Prior
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(C, σ²): the prior covariance of the log errors of kernels (:func:`kernel_terms`) under the calibration of
    ``prior``, and each one's measurement noise variance."""
    covariance = x @ prior.covariance() @ x.T
    noise = np.array([prior.sigma_kernel[cls] ** 2 for cls in classes])
    for group in np.unique(groups):
        kernel = prior.residual_kernels.get(str(group))
        if kernel is None:  # a prior without the group's process: the corrections alone
            continue
        members = np.flatnonzero(groups == group)
        covariance[np.ix_(members, members)] += kernel.covariance(inputs[members], inputs[members])
        noise[members] += kernel.noise_sd ** 2
    return covariance, noise


def least_variance_order(covariance: np.ndarray, noise: np.ndarray, k: int) -> np.ndarray:
    """The positions of ``k`` kernels, chosen one at a time, each the one whose measurement (with variance ``noise``)
    lowers the summed variance of all kernels most given those chosen before it (``covariance``: their joint prior
    covariance; not modified).

    The covariance left after t choices is C − V Vᵀ (V's columns: each chosen kernel's column of what was left,
    over the square root of its variance plus noise), never formed: each choice takes one product C · c, and the
    column sums of squares that rank the candidates are updated from it, so 240 choices among 4,000 kernels read C
    240 times instead of writing it as often."""
    covariance = np.asarray(covariance, dtype=np.float64)
    n, k = len(covariance), min(k, len(covariance))
    factors = np.zeros((n, k))
    variance = np.diag(covariance).copy()
    squares = np.einsum("ij,ij->j", covariance, covariance)  # Σ_i of each column's squared entries
    chosen: list[int] = []
    for t in range(k):
        gain = np.maximum(squares, 0.0) / (variance + noise)
        gain[chosen] = -np.inf
        best = int(np.argmax(gain))
        done = factors[:, :t]
        column = covariance[:, best] - done @ done[best]
        scale = column[best] + noise[best]
        product = covariance @ column - done @ (done.T @ column)
        squares += column * (column * (column @ column) / scale - 2.0 * product) / scale
        factors[:, t] = column / np.sqrt(scale)
        variance -= factors[:, t] ** 2
        chosen.append(best)
    return np.array(chosen, dtype=np.int64)


def informative_kernels(x: np.ndarray, classes: np.ndarray, groups: np.ndarray, inputs: np.ndarray, prior: Prior,
                        k: int, max_candidates: int = MAX_CANDIDATES, seed: int = SEED) -> np.ndarray:
    """The positions, among candidate kernels of one operator (:func:`kernel_terms`), of the ``k`` whose measurements
    teach a calibration under ``prior`` most (:func:`least_variance_order`), in the order chosen. Beyond
    ``max_candidates`` a seeded draw of that many is weighed; all of them when ``k`` is at least their number."""
    n = len(x)
    if k >= n:
        return np.arange(n)
    pool = np.arange(n)
    if n > max_candidates:
        pool = np.sort(np.random.default_rng(seed).choice(n, size=max_candidates, replace=False))
    covariance, noise = log_error_covariance(x[pool], classes[pool], groups[pool], inputs[pool], prior)
    return pool[least_variance_order(covariance, noise, k)]
