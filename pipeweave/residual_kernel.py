"""What a calibration leaves on its measured kernels, interpolated over the shape (a Gaussian process).

The corrections of :mod:`pipeweave.calibration` are a few smooth functions of the shape per kernel class. On a GPU
the models never measured, a kernel's error also has structure they cannot see: tile and wave effects, the
library's kernel choice at one size, a cache spill (fitted on every kernel of a GPU, the corrections still leave
GEMM on L40S 12 % off: docs/ACCURACY.md's k-shot table, its last column). Kernels of nearby shapes share much of
that error. So the residuals r_i = log(measured / calibrated) of one GPU's measured kernels of a group (an operator;
attention: its prefill or its decode class) give every kernel of the group the posterior mean of a zero-mean
Gaussian process in the log shape,

    E[r(z) | r_1..n] = k(z, Z) (K + σ_n² I)⁻¹ r,    k(a, b) = σ_f² (1 + √3 d) exp(−√3 d),
    d = ‖(a − b) / ℓ‖ (Matérn 3/2, a length scale per shape input):

near a measured shape the correction approaches that kernel's residual, shrunk by the noise; far from every
measured shape it is 0, the calibration alone. The residuals are first winsorised at Huber's constant (as the
corrections' likelihood, :data:`pipeweave.calibration.HUBER`) times their robust spread (1.4826 × median absolute
deviation) about their median: a kernel measured far off alone (a timing spike, another kernel chosen at one size)
would otherwise pull its neighbours with it (2026-12-07: FP8 GEMM on B200, 1,024 kernels, leave-one-GPU-out, 8.1 %
with the corrections alone, 11.6 % interpolated without it, 7.9 % with it).

The hyperparameters (ℓ, σ_f, σ_n per group) are part of the calibration prior, estimated like the rest of it from
kernel data of other GPUs, never from the user's kernels (:mod:`pipeweave.calibration_eval`: the pooled marginal
likelihood of every GPU's leave-one-GPU-out residuals after its own full-data corrections), so a handful of
measured kernels cannot over-fit them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from analytical_model.columns import parse_length_list
from pipeweave.calibration import HUBER
from pipeweave.calibration_design import attention_types, kernel_classes

#: per operator the shape inputs of its process, as functions of one row of its shape columns (all in log: a GEMM
#: twice as large is as far from its neighbour at any size)
RESIDUAL_INPUTS = {
    "gemm": ("log_M", "log_N", "log_K"),
    "gemm_fp8": ("log_M", "log_N", "log_K"),
    "attn": ("log_batch", "log_mean_q_length", "log_mean_kv_length", "log_heads", "log_kv_heads", "log_head_dim"),
    "rmsnorm": ("log_seq", "log_dim"),
    "siluandmul": ("log_seq", "log_dim"),
    "moe": ("log_M", "log_experts", "log_top_k", "log_hidden", "log_inter"),
}
#: the operator of every group
GROUP_OPS = {"gemm": "gemm", "gemm_fp8": "gemm_fp8", "attn_prefill": "attn", "attn_decode": "attn",
             "rmsnorm": "rmsnorm", "siluandmul": "siluandmul", "moe": "moe"}
#: the most measured kernels of a group one interpolation holds (a seeded draw beyond it): its (n × n) system takes
#: n² doubles, 128 MB at 4,000, and the profiler's full grid measures 3,790 GEMMs of a class
MAX_KERNELS = 4000
SEED = 0
LOG_LENGTHSCALE_BOUNDS = (np.log(0.05), np.log(20.0))  # in units of the log shape
LOG_SD_BOUNDS = (np.log(1e-3), np.log(1.0))  # log-space scales: 0.1 % to a factor e
ROWS_PER_CHUNK = 2048  # query rows per block of the cross-covariance


def winsorised(residuals: np.ndarray) -> np.ndarray:
    """``residuals`` clipped to their median ± HUBER × their robust spread (1.4826 × median absolute deviation)."""
    residuals = np.asarray(residuals, dtype=np.float64)
    if not len(residuals):
        return residuals
    centre = np.median(residuals)
    reach = HUBER * 1.4826 * np.median(np.abs(residuals - centre))
    return np.clip(residuals, centre - reach, centre + reach)


def residual_groups(op: str, shapes) -> np.ndarray:
    """The group of every row (``shapes``: the operator's shape columns per row): the operator, or for attention its
    calibration class (prefill and decode are different kernels)."""
    if op == "attn":
        return kernel_classes(op, len(shapes), attention_types(op, shapes)).astype(str)
    return np.full(len(shapes), op)


def residual_inputs(op: str, shapes) -> np.ndarray:
    """(n × len(RESIDUAL_INPUTS[op])) log shape inputs of every row."""
    def log(value) -> float:
        return float(np.log(max(float(value), 1.0)))

    if op == "attn":  # attention_type, bs, q_lengths, kv_lengths, nh, nkv, hd
        rows = [(log(s[1]), log(np.mean(parse_length_list(s[2], "q_lengths"))),
                 log(np.mean(parse_length_list(s[3], "kv_lengths"))), log(s[4]), log(s[5]), log(s[6]))
                for s in shapes]
    elif op == "moe":  # weight_type, M, E, topk, H, N
        rows = [tuple(log(v) for v in s[1:6]) for s in shapes]
    else:
        rows = [tuple(log(v) for v in s) for s in shapes]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(RESIDUAL_INPUTS[op]))


@dataclass(frozen=True)
class ResidualKernel:
    """The covariance of a group's residuals over its log shape inputs: Matérn 3/2 with a length scale per input,
    signal scale σ_f, noise scale σ_n (log space)."""

    lengthscales: tuple[float, ...]
    signal_sd: float
    noise_sd: float

    def distances(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = a / np.asarray(self.lengthscales), b / np.asarray(self.lengthscales)
        squared = (a ** 2).sum(axis=1)[:, None] + (b ** 2).sum(axis=1)[None, :] - 2 * a @ b.T
        return np.sqrt(np.maximum(squared, 0.0))

    def covariance(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        scaled = np.sqrt(3.0) * self.distances(a, b)
        return self.signal_sd ** 2 * (1 + scaled) * np.exp(-scaled)

    def as_dict(self) -> dict:
        return {"lengthscales": list(self.lengthscales), "signal_sd": self.signal_sd, "noise_sd": self.noise_sd}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> "ResidualKernel":
        try:
            kernel = cls(tuple(float(v) for v in data["lengthscales"]), float(data["signal_sd"]),
                         float(data["noise_sd"]))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where} must hold lengthscales (a list of numbers), signal_sd and noise_sd") from None
        values = (*kernel.lengthscales, kernel.signal_sd, kernel.noise_sd)
        if not kernel.lengthscales or not all(np.isfinite(v) and v > 0 for v in values):
            raise ValueError(f"{where}: its length scales and scales must be finite positive numbers")
        return kernel


def negative_log_likelihood(log_parameters: np.ndarray, samples: list[tuple[np.ndarray, np.ndarray]]
                            ) -> tuple[float, np.ndarray]:
    """(−log marginal likelihood of every sample (inputs, residuals) under independent processes of one kernel, its
    gradient) at ``log_parameters`` = (log ℓ_1..d, log σ_f, log σ_n)."""
    dims = len(log_parameters) - 2
    lengthscales, signal_sd, noise_sd = np.exp(log_parameters[:dims]), *np.exp(log_parameters[dims:])
    total, gradient = 0.0, np.zeros(len(log_parameters))
    for inputs, residuals in samples:
        scaled = inputs / lengthscales
        differences = (scaled[:, None, :] - scaled[None, :, :]) ** 2  # n × n × d
        root3d = np.sqrt(3.0 * differences.sum(axis=2))
        decay = np.exp(-root3d)
        signal = signal_sd ** 2 * (1 + root3d) * decay
        covariance = signal + noise_sd ** 2 * np.eye(len(inputs))
        try:
            factor = np.linalg.cholesky(covariance)
        except np.linalg.LinAlgError:
            return np.inf, gradient
        inverse = np.linalg.inv(covariance)
        alpha = inverse @ residuals
        total += 0.5 * residuals @ alpha + np.log(np.diag(factor)).sum()
        outer = np.outer(alpha, alpha) - inverse  # d(−NLL)/dK = ½ (αα' − K⁻¹)
        # d k / d log ℓ_j = 3 σ_f² exp(−√3 d) (Δ_j / ℓ_j)²
        weighted = 3.0 * signal_sd ** 2 * decay * outer
        gradient[:dims] -= 0.5 * np.einsum("ij,ijk->k", weighted, differences)
        gradient[dims] -= np.sum(outer * signal)  # d K / d log σ_f = 2 signal, times ½
        gradient[dims + 1] -= noise_sd ** 2 * np.trace(outer)  # d K / d log σ_n = 2 σ_n² I, times ½
    return total, gradient


def fit_residual_kernel(samples: list[tuple[np.ndarray, np.ndarray]]) -> ResidualKernel:
    """The kernel maximising the marginal likelihood of every sample (inputs, residuals), each one GPU's residuals as
    an independent draw of the same process (L-BFGS-B from length scales of 1 and the residuals' variance split
    evenly between signal and noise: deterministic)."""
    from scipy.optimize import minimize

    dims = samples[0][0].shape[1]
    variance = float(np.mean(np.concatenate([residuals for _, residuals in samples]) ** 2))
    start_sd = np.log(np.sqrt(max(variance, 1e-6) / 2))
    start = np.concatenate([np.zeros(dims), [start_sd, start_sd]])
    bounds = [LOG_LENGTHSCALE_BOUNDS] * dims + [LOG_SD_BOUNDS] * 2
    result = minimize(negative_log_likelihood, start, args=(samples,), jac=True, method="L-BFGS-B", bounds=bounds)
    values = np.exp(result.x)
    return ResidualKernel(tuple(float(v) for v in values[:dims]), float(values[dims]), float(values[dims + 1]))


@dataclass
class ResidualInterpolation:
    """One group's process conditioned on the residuals of its measured kernels: ``weights`` = (K + σ_n² I)⁻¹ r."""

    kernel: ResidualKernel
    inputs: np.ndarray
    weights: np.ndarray

    @classmethod
    def fit(cls, kernel: ResidualKernel, inputs: np.ndarray, residuals: np.ndarray) -> "ResidualInterpolation":
        """Conditioned on ``residuals`` (log measured / calibrated) at ``inputs``, :func:`winsorised`; beyond
        :data:`MAX_KERNELS` on a seeded draw of them."""
        inputs, residuals = np.asarray(inputs, dtype=np.float64), winsorised(residuals)
        if len(inputs) > MAX_KERNELS:
            kept = np.sort(np.random.default_rng(SEED).choice(len(inputs), size=MAX_KERNELS, replace=False))
            inputs, residuals = inputs[kept], residuals[kept]
        covariance = kernel.covariance(inputs, inputs) + kernel.noise_sd ** 2 * np.eye(len(inputs))
        return cls(kernel, inputs, np.linalg.solve(covariance, residuals))

    def log_correction(self, inputs: np.ndarray) -> np.ndarray:
        """The posterior mean of the residual at every row of ``inputs``."""
        inputs = np.asarray(inputs, dtype=np.float64)
        out = np.empty(len(inputs))
        for start in range(0, len(inputs), ROWS_PER_CHUNK):
            block = inputs[start:start + ROWS_PER_CHUNK]
            out[start:start + len(block)] = self.kernel.covariance(block, self.inputs) @ self.weights
        return out

    def as_dict(self) -> dict:
        return {**self.kernel.as_dict(), "inputs": self.inputs.tolist(), "weights": self.weights.tolist()}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> "ResidualInterpolation":
        kernel = ResidualKernel.from_dict(data, where)
        try:
            inputs = np.asarray(data["inputs"], dtype=np.float64)
            weights = np.asarray(data["weights"], dtype=np.float64)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where} must hold inputs (rows of numbers) and weights (numbers)") from None
        if (inputs.ndim != 2 or inputs.shape[1] != len(kernel.lengthscales) or weights.shape != (len(inputs),)
                or not (np.isfinite(inputs).all() and np.isfinite(weights).all())):
            raise ValueError(f"{where}: inputs must be {len(kernel.lengthscales)} finite numbers per row and weights "
                             f"one finite number per row")
        return cls(kernel, inputs, weights)


def residual_kernels_from_dict(data, where: str) -> dict[str, ResidualKernel]:
    """{group: kernel} of a prior's ``residual_kernels`` entry, each of a known group with a length scale per input
    of its operator."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be an object of groups")
    out = {}
    for group, entry in data.items():
        where_group = f"{where}.{group}"
        if group not in GROUP_OPS:
            raise ValueError(f"{where_group}: unknown group; known: {', '.join(GROUP_OPS)}")
        out[group] = ResidualKernel.from_dict(entry if isinstance(entry, dict) else {}, where_group)
        if len(out[group].lengthscales) != len(RESIDUAL_INPUTS[GROUP_OPS[group]]):
            raise ValueError(f"{where_group}: {len(out[group].lengthscales)} length scales, its inputs are "
                             f"{', '.join(RESIDUAL_INPUTS[GROUP_OPS[group]])}")
    return out


def interpolations_from_dict(data, where: str) -> dict[str, ResidualInterpolation]:
    """{group: interpolation} of a calibration file's ``residuals`` entry (validated as
    :func:`residual_kernels_from_dict`)."""
    kernels = residual_kernels_from_dict(data, where)
    return {group: ResidualInterpolation.from_dict(data[group], f"{where}.{group}") for group in kernels}


def conditioned(kernels: dict[str, ResidualKernel], groups: np.ndarray, inputs: np.ndarray, residuals: np.ndarray
                ) -> dict[str, ResidualInterpolation]:
    """{group: interpolation} conditioned on the ``residuals`` of measured kernels (their ``groups`` and ``inputs``
    per row), for every group of them with a kernel in ``kernels`` (the prior's)."""
    residuals = np.asarray(residuals, dtype=np.float64)
    return {group: ResidualInterpolation.fit(kernels[group], inputs[groups == group], residuals[groups == group])
            for group in sorted(set(groups)) if group in kernels}


def corrections_at(interpolations: dict[str, ResidualInterpolation], groups: np.ndarray, inputs) -> np.ndarray:
    """The interpolated residual of every row (its group in ``groups``; ``inputs()`` gives the rows' inputs, asked
    only where a group has an interpolation); 0 where its group has none."""
    out = np.zeros(len(groups))
    present = [group for group in sorted(set(groups)) if group in interpolations]
    if present:
        values = inputs()
        for group in present:
            rows = groups == group
            out[rows] = interpolations[group].log_correction(values[rows])
    return out


def interpolator(kernels: dict[str, ResidualKernel], groups: np.ndarray, inputs: np.ndarray
                 ) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """``interpolate(known, residuals, query)``: the interpolated residual at the rows ``query`` of measured kernels
    (their ``groups`` and ``inputs`` per row) conditioned on the ``residuals`` of the rows ``known`` (positions in
    those arrays), 0 in a group without a covariance in ``kernels``: how the calibration's cross-validation predicts
    a fold it did not see (:func:`pipeweave.calibration.cross_validated_log_residuals`)."""
    groups, inputs = np.asarray(groups), np.asarray(inputs, dtype=np.float64)

    def interpolate(known: np.ndarray, residuals: np.ndarray, query: np.ndarray) -> np.ndarray:
        interpolations = conditioned(kernels, groups[known], inputs[known], residuals)
        return corrections_at(interpolations, groups[query], lambda: inputs[query])

    return interpolate


def fit_interpolations(kernels: dict[str, ResidualKernel], op: str, shapes, residuals: np.ndarray
                       ) -> dict[str, ResidualInterpolation]:
    """:func:`conditioned` on measured kernels of ``op`` (``shapes``: their shape columns per row)."""
    if op not in RESIDUAL_INPUTS:
        return {}
    return conditioned(kernels, residual_groups(op, shapes), residual_inputs(op, shapes), residuals)


def log_corrections(interpolations: dict[str, ResidualInterpolation], op: str, shapes) -> np.ndarray:
    """The interpolated residual of every row of ``op`` (0 where its group has no interpolation)."""
    if op not in RESIDUAL_INPUTS or not interpolations or not len(shapes):
        return np.zeros(len(shapes))
    return corrections_at(interpolations, residual_groups(op, shapes), lambda: residual_inputs(op, shapes))
