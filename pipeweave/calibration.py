"""Per-GPU calibration: small log-space corrections of the zero-shot model, fitted by MAP with shrinkage.

Why: on a GPU it never measured, pipeweave's error is a per-GPU efficiency bias that also varies with the shape
(docs/ACCURACY.md, leave-one-GPU-out); a user can nearly always measure something on their GPU (one benchmark
run, a few minutes of ``profile_operators.py --quick``). A calibration turns those measurements into a
correction of that GPU's predictions only.

Parametrisation (:mod:`pipeweave.calibration_design`). Every kernel's duration t̂ (the zero-shot prediction)
becomes t̂ · exp(x · θ): per kernel class a compute and a memory intercept weighted by the analytical
compute/memory share of the kernel, plus slopes on a few standardised shape covariates (log size with hinges,
arithmetic intensity relative to the ridge point, SM imbalance; for attention KV length and GQA group size);
collectives get a latency and a bandwidth factor, weighted by the latency share of their analytical estimate.
A Bayesian linear regression of the log residual.

Prior (shrinkage toward the zero-shot model, empirical Bayes). θ ~ N(0, Σ₀), zero mean: with no data the
calibration is the zero-shot model. Within a class, Σ₀ is the second-moment matrix of the corrections that
the other GPUs need (each GPU's leave-one-GPU-out model corrected with this parametrisation fitted on all its
kernels), so shape effects that tend to come together on a new GPU are learned together. Across classes the
intercepts share a GPU-wide part τ_gpu² and a per-pipe part τ_pipe² ("this GPU's memory system is slower than
its spec sheet says"), so GEMM kernels or a prefill move attention too. ``pipeweave.calibration_eval`` estimates
all of it, and the observation noise per class, from kernel data (``pipeweave/calibration_prior.json``), never
from end-to-end runs and, in its evaluation, never from the held-out GPU.

Fit. Each measurement is an equation log(measured) = log(Σ_terms base · exp(x θ)) + ε: a measured kernel is
one term; an end-to-end prefill, decode step or total latency is the sum over the workload's kernel and
collective instances. The MAP estimate minimises Σ huber(residual / σ) + θᵀ Σ₀⁻¹ θ by Gauss-Newton (a robust
ridge regression when every equation is one kernel). No data gives θ = 0, the zero-shot model.
"""
from __future__ import annotations

import hashlib
import json
import math
import zipfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np

from pipeweave.calibration_design import (BANDWIDTH, CLASSES, COMMUNICATION_PARAMS, INTERCEPTS, LATENCY, PARAMS,
                                          class_covariates, class_slice, class_terms, communication_design, design)
from pipeweave.schema import COLLECTIVE_KINDS
from pipeweave.paths import command

DEFAULT_PRIOR_PATH = Path(__file__).resolve().parent / "calibration_prior.json"
FORMAT_VERSION = 6  # 1: intercepts and the communication factor only (read with every shape slope at 0); 2: no
# fine-tuned models (read as such); 1-3: one communication factor (read as equal latency and bandwidth factors); 1-4:
# no interpolation of the measured kernels' residuals (read without it); 3-5: fine-tuned models without the range of
# their change on the measured kernels (applied unbounded, as they were chosen)
HUBER = 1.345  # the usual Huber constant (95 % efficiency under Gaussian noise)
FACTORS = INTERCEPTS + COMMUNICATION_PARAMS  # parameters that are a plain factor (the others: slopes)
MIN_TAU = 0.02  # least prior scale of any parameter (log space): no correction is ruled out a priori


# ------------------------------------------------------------------------------------------------
# prior


@dataclass
class Prior:
    """Prior scales (log space), observation noise and covariate standardisation (module docstring)."""

    tau_gpu: float
    tau_pipe: float
    class_moments: dict[str, list]  # {class: second-moment matrix over class_terms(class)}
    tau_comm_latency: float
    tau_comm_bandwidth: float
    sigma_kernel: dict[str, float]
    sigma_e2e: float
    standardisation: dict[str, dict]
    source: str = ""
    #: {group: pipeweave.residual_kernel.ResidualKernel}: the covariance of what the corrections leave, per kernel
    #: group (a prior of an older pipeweave has none: no interpolation)
    residual_kernels: dict = field(default_factory=dict)

    def covariance(self) -> np.ndarray:
        """Σ₀: class blocks from the moments, shared intercept parts across classes, projected to be positive
        definite (every eigenvalue at least MIN_TAU²: moments of a few GPUs need not be consistent)."""
        cov = np.zeros((len(PARAMS), len(PARAMS)))
        intercepts = [PARAMS.index(p) for p in INTERCEPTS]
        for i in intercepts:
            for j in intercepts:
                same_pipe = PARAMS[i].split(".")[1] == PARAMS[j].split(".")[1]
                cov[i, j] = self.tau_gpu ** 2 + (self.tau_pipe ** 2 if same_pipe else 0.0)
        for cls in CLASSES:
            block = class_slice(cls)
            cov[block, block] = np.asarray(self.class_moments[cls], dtype=np.float64)
        cov[LATENCY, LATENCY] = self.tau_comm_latency ** 2
        cov[BANDWIDTH, BANDWIDTH] = self.tau_comm_bandwidth ** 2
        values, vectors = np.linalg.eigh((cov + cov.T) / 2)
        return (vectors * np.maximum(values, MIN_TAU ** 2)) @ vectors.T

    def summary(self) -> dict:
        """What a calibration file records of its prior (the matrices are in the prior file)."""
        return {"source": self.source, "tau_gpu": self.tau_gpu, "tau_pipe": self.tau_pipe,
                "tau_comm_latency": self.tau_comm_latency, "tau_comm_bandwidth": self.tau_comm_bandwidth,
                "sigma_kernel": dict(self.sigma_kernel), "sigma_e2e": self.sigma_e2e}

    def as_dict(self) -> dict:
        return {"tau_gpu": self.tau_gpu, "tau_pipe": self.tau_pipe,
                "class_moments": {c: {"terms": list(class_terms(c)), "matrix": np.asarray(m).tolist()}
                                  for c, m in self.class_moments.items()},
                "tau_comm_latency": self.tau_comm_latency, "tau_comm_bandwidth": self.tau_comm_bandwidth,
                "sigma_kernel": dict(self.sigma_kernel), "sigma_e2e": self.sigma_e2e,
                "standardisation": self.standardisation, "source": self.source,
                "residual_kernels": {group: kernel.as_dict()
                                     for group, kernel in sorted(self.residual_kernels.items())}}

    @classmethod
    def from_dict(cls, data: dict, where: str = "calibration prior") -> "Prior":
        from pipeweave.residual_kernel import residual_kernels_from_dict

        moments = {}
        for name in CLASSES:
            entry = data["class_moments"][name]
            if list(entry["terms"]) != list(class_terms(name)):
                raise ValueError(f"calibration prior: class {name} has terms {entry['terms']}, this pipeweave "
                                 f"expects {list(class_terms(name))}; regenerate it with "
                                 f"python3 -m pipeweave.calibration_eval")
            moments[name] = entry["matrix"]
        return cls(float(data["tau_gpu"]), float(data["tau_pipe"]), moments, float(data["tau_comm_latency"]),
                   float(data["tau_comm_bandwidth"]),
                   {k: float(v) for k, v in data["sigma_kernel"].items()}, float(data["sigma_e2e"]),
                   data["standardisation"], str(data.get("source", "")),
                   residual_kernels_from_dict(data.get("residual_kernels", {}), f"{where}: residual_kernels"))


def load_prior(path: str | Path = DEFAULT_PRIOR_PATH) -> Prior:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"calibration prior {path} not found; "
                                f"generate it with python3 -m pipeweave.calibration_eval")
    data = json.loads(path.read_text())
    for key, lacks in (("class_moments", "no shape covariates"), ("tau_comm_latency", "one communication factor")):
        if key not in data:
            raise ValueError(f"calibration prior {path} is of an older pipeweave ({lacks}); regenerate it "
                             f"with python3 -m pipeweave.calibration_eval")
    prior = Prior.from_dict(data, f"calibration prior {path}")
    check_prior(path, prior)
    return prior


def check_prior(path: Path, prior: Prior) -> None:
    """Finite scales (≥ 0), finite positive noise levels for every class, and each class's moments a square matrix
    over its terms: a noise of 0 fitted a calibration of NaNs (written, and refused only when loaded), and a smaller
    matrix was broadcast over its class's block without a word."""
    scales = {"tau_gpu": prior.tau_gpu, "tau_pipe": prior.tau_pipe, "tau_comm_latency": prior.tau_comm_latency,
              "tau_comm_bandwidth": prior.tau_comm_bandwidth}
    noises = {"sigma_e2e": prior.sigma_e2e,
              **{f"sigma_kernel.{name}": prior.sigma_kernel.get(name) for name in (*CLASSES, "communication")}}
    for name, value in {**scales, **noises}.items():
        if value is None or not np.isfinite(value) or value < 0 or (name in noises and value == 0):
            kind = "positive" if name in noises else "non-negative"
            raise ValueError(f"calibration prior {path}: {name} must be a finite {kind} number, got {value!r}; "
                             f"regenerate it with python3 -m pipeweave.calibration_eval")
    for cls, matrix in prior.class_moments.items():
        size = len(class_terms(cls))
        values = np.asarray(matrix, dtype=object)
        if values.shape != (size, size) or not all(isinstance(v, (int, float)) and np.isfinite(v) for v in values.flat):
            raise ValueError(f"calibration prior {path}: class_moments.{cls}.matrix must be {size} x {size} finite "
                             f"numbers; regenerate it with python3 -m pipeweave.calibration_eval")


# ------------------------------------------------------------------------------------------------
# MAP fit


@dataclass
class Equations:
    """Measured quantities as sums of terms: quantity e = Σ_{terms t of e} max(base_t · exp(x_t · θ), floor_t), the
    floor being the fastest time the engine allows the term after a calibration (0: none)."""

    eq: np.ndarray  # equation index of every term
    base: np.ndarray  # zero-shot duration of every term (count-weighted), > 0
    x: np.ndarray  # design rows of the terms
    measured: np.ndarray  # per equation, > 0
    sigma: np.ndarray  # per equation, observation noise in log space
    labels: list[str] = field(default_factory=list)
    floor: np.ndarray | None = None  # per term (count-weighted), >= 0; None: zeros

    def __post_init__(self):
        if self.floor is None:
            self.floor = np.zeros(len(self.base))

    @classmethod
    def empty(cls) -> "Equations":
        return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros((0, len(PARAMS))), np.zeros(0), np.zeros(0), [])

    @classmethod
    def concat(cls, parts: list["Equations"]) -> "Equations":
        out, offset = cls.empty(), 0
        for part in parts:
            out = cls(np.concatenate([out.eq, part.eq + offset]), np.concatenate([out.base, part.base]),
                      np.vstack([out.x, part.x]), np.concatenate([out.measured, part.measured]),
                      np.concatenate([out.sigma, part.sigma]), out.labels + part.labels,
                      np.concatenate([out.floor, part.floor]))
            offset += len(part.measured)
        return out

    def subset(self, keep: np.ndarray) -> "Equations":
        """The equations where the boolean mask ``keep`` (one entry per equation) is true, renumbered."""
        keep = np.asarray(keep, dtype=bool)
        terms = keep[self.eq]
        renumber = np.cumsum(keep) - 1
        return Equations(renumber[self.eq[terms]], self.base[terms], self.x[terms], self.measured[keep],
                         self.sigma[keep], [label for label, kept in zip(self.labels, keep) if kept]
                         if self.labels else [], self.floor[terms])

    def predict(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predicted quantities, their Jacobian d log(prediction) / dθ; a term held at its floor moves nothing)."""
        n = len(self.measured)
        scaled = self.base * np.exp(self.x @ theta)
        free = scaled >= self.floor  # at the tie a correction upward moves the term: its one-sided derivative
        total = np.bincount(self.eq, weights=np.where(free, scaled, self.floor), minlength=n)
        moving = np.where(free, scaled, 0.0)
        jac = np.stack([np.bincount(self.eq, weights=moving * self.x[:, p], minlength=n)
                        for p in range(self.x.shape[1])], axis=1)
        return total, jac / total[:, None]


def fit_map(equations: Equations, prior: Prior, max_iter: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """(θ, posterior standard deviations): MAP of the prior and a Huber likelihood of the log residuals.

    Gauss-Newton with iteratively reweighted least squares: residuals beyond ``HUBER`` σ count linearly, so
    one odd kernel among a few shots does not drag the whole correction (kernel residuals are heavy-tailed).
    """
    precision = np.linalg.inv(prior.covariance())
    theta = np.zeros(len(PARAMS))
    log_measured = np.log(equations.measured)
    sigma = equations.sigma

    def evaluate(t):
        pred, jac = equations.predict(t)
        u = (np.log(pred) - log_measured) / sigma
        loss = np.where(np.abs(u) <= HUBER, u * u, 2 * HUBER * np.abs(u) - HUBER ** 2)
        return float(np.sum(loss) + t @ precision @ t), u, jac

    value, u, jac = evaluate(theta)
    for _ in range(max_iter):
        weights = np.minimum(1.0, HUBER / np.maximum(np.abs(u), 1e-12)) / sigma ** 2
        hessian = jac.T @ (weights[:, None] * jac) + precision
        step = -np.linalg.solve(hessian, jac.T @ (weights * u * sigma) + precision @ theta)
        scale = 1.0
        while True:
            candidate = theta + scale * step
            new_value, new_u, new_jac = evaluate(candidate)
            if new_value <= value + 1e-12 or scale < 1e-4:
                break
            scale /= 2
        converged = abs(value - new_value) <= 1e-12 * max(1.0, value) or np.max(np.abs(scale * step)) < 1e-10
        theta, value, u, jac = candidate, new_value, new_u, new_jac
        if converged:
            break
    weights = np.minimum(1.0, HUBER / np.maximum(np.abs(u), 1e-12)) / sigma ** 2
    hessian = jac.T @ (weights[:, None] * jac) + precision
    return theta, np.sqrt(np.diag(np.linalg.inv(hessian)))


#: folds of the cross-validation that measures how far a calibration's own kernels scatter around it
SPREAD_FOLDS = 4
#: fewest measured kernels of an operator for their spread to widen its interval (the smallest evaluated k)
MIN_SPREAD_KERNELS = 8


def cross_validated_log_residuals(equations: Equations, prior: Prior, rows: np.ndarray,
                                  interpolate: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None
                                  ) -> np.ndarray:
    """log(measured / calibrated) of the equations ``rows`` (ascending indices), each from the fit on every other
    equation but its fold's (:data:`SPREAD_FOLDS` folds by position in ``rows``, as :func:`spread_entry` records): how
    far a kernel the calibration did not see lies from it. With ``interpolate``
    (:func:`pipeweave.residual_kernel.interpolator` over ``rows``, positions in it), a fold is also corrected by
    what its refitted corrections leave on the other folds' kernels, interpolated to it, as the calibration
    interpolates its measured kernels' residuals to the kernels it predicts."""
    rows = np.asarray(rows)
    selected = np.zeros(len(equations.measured), dtype=bool)
    selected[rows] = True
    of_rows = equations.subset(selected)  # in the order of rows (ascending)
    out = np.empty(len(rows))
    fold = np.arange(len(rows)) % SPREAD_FOLDS
    for f in range(min(SPREAD_FOLDS, len(rows))):
        held = np.zeros(len(equations.measured), dtype=bool)
        held[rows[fold == f]] = True
        theta = fit_map(equations.subset(~held), prior)[0]
        log_ratio = np.log(of_rows.measured / of_rows.predict(theta)[0])
        query = np.flatnonzero(fold == f)
        out[query] = log_ratio[query]
        if interpolate is not None:
            known = np.flatnonzero(fold != f)
            out[query] -= interpolate(known, log_ratio[known], query)
    return out


def refitted_without(equations: Equations, prior: Prior, rows: np.ndarray, theta: np.ndarray,
                     values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """fold -> ``values`` (one per kernel equation ``rows``, one term each, under the corrections ``theta`` fitted on
    ``equations``) under the corrections refitted without the kernels ``fold`` (positions in ``rows``): what a
    fine-tuning choice scores on kernels the corrections did not see (:func:`pipeweave.finetune.fine_tune_selected`;
    ``calibrate.py`` and its evaluation call the same)."""
    rows = np.asarray(rows)

    def without(fold: np.ndarray) -> np.ndarray:
        kept = np.ones(len(equations.measured), dtype=bool)
        kept[rows[fold]] = False
        refitted = fit_map(equations.subset(kept), prior)[0]
        return values * np.exp(equations.x[rows] @ (refitted - theta))

    return without


def spread_entry(residuals: np.ndarray) -> dict:
    """The calibration file's record of one operator's cross-validated residuals: their count and the quantiles of
    the interval levels (pipeweave.intervals.LEVELS: 10th and 90th percentiles)."""
    from pipeweave.intervals import LEVELS

    low, high = np.quantile(residuals, LEVELS)
    return {"kernels": int(len(residuals)), "folds": SPREAD_FOLDS, "log_low": float(low), "log_high": float(high)}


# ------------------------------------------------------------------------------------------------
# the calibration file


@dataclass
class Calibration:
    """A fitted correction for one GPU. Only rows on ``hardware`` (a hardware file stem) are changed."""

    hardware: str
    device_name: str
    theta: np.ndarray
    std: np.ndarray
    fitted_from: dict
    base_models: dict
    prior: dict
    standardisation: dict | None = None  # None: a format-1 file, intercepts only
    path: Path | None = None
    #: {op: {"weights": base64 weight file, ...how it was fitted}}: models fine-tuned on this GPU's kernels
    fine_tuned: dict = field(default_factory=dict)
    #: {model op: spread_entry}: the cross-validated scatter of its measured kernels around the calibration, which
    #: widens their measured interval where it exceeds it (pipeweave.intervals)
    spread: dict = field(default_factory=dict)
    #: {group: pipeweave.residual_kernel.ResidualInterpolation}: what the corrections (and fine-tuned models) leave
    #: on the measured kernels, interpolated over the shape to the other kernels of their group
    residuals: dict = field(default_factory=dict)
    _models: dict = field(default_factory=dict, repr=False)

    @property
    def method(self) -> str:
        method = ("per-GPU log-duration corrections per kernel class: compute and memory intercepts split by the "
                  "analytical compute/memory share and slopes on standardised shape covariates, plus communication "
                  "latency and bandwidth factors split by the analytical latency share; MAP with an empirical-Bayes "
                  "Gaussian prior toward the zero-shot model (pipeweave.calibration)")
        if self.fine_tuned:
            method += (f"; the {', '.join(sorted(self.fine_tuned))} model fine-tuned on this GPU's measured kernels, "
                       f"where the shipped model extrapolates or many kernels choose it (pipeweave.finetune), under "
                       f"those corrections")
            if all("trusted_log_change" in entry for entry in self.fine_tuned.values()):
                method += ", its change of the shipped model's efficiency kept within its range on those kernels"
        if self.residuals:
            method += (f"; what remains on the measured {', '.join(sorted(self.residuals))} kernels interpolated over "
                       f"the log shape by a Gaussian process with the prior's covariance (pipeweave.residual_kernel)")
        return method

    def trusted_log_change(self, op: str) -> tuple[float, float] | None:
        """The range of the log efficiency change that ``op``'s fine-tuned model made on the measured kernels,
        within which its change is kept (:func:`pipeweave.finetune.trusted_efficiency`); None for a file of a format
        before 6, whose models were chosen unbounded."""
        log_change = self.fine_tuned[op].get("trusted_log_change")
        return None if log_change is None else (float(log_change[0]), float(log_change[1]))

    def fine_tuned_models(self) -> dict:
        """{op: NumpyMLP} of the models fine-tuned on this GPU (decoded once)."""
        from pipeweave.finetune import decode_arrays
        from pipeweave.mlp import NumpyMLP

        for op, entry in self.fine_tuned.items():
            if op not in self._models:
                self._models[op] = NumpyMLP(decode_arrays(entry["weights"]), f"{self.path}: fine_tuned.{op}")
        return dict(self._models)

    def summary(self) -> dict:
        """What an output records: file, GPU, method and the data it was fitted from."""
        return {"file": str(self.path) if self.path else None, "hardware": self.device_name,
                "method": self.method, "fitted_from": self.fitted_from,
                "factors": {p: round(float(np.exp(t)), 4) for p, t in zip(PARAMS, self.theta)
                            if abs(t) > 1e-9 and p in FACTORS},
                "slopes_per_sd": {p: round(float(t), 4) for p, t in zip(PARAMS, self.theta)
                                  if abs(t) > 1e-9 and p not in FACTORS},
                **({"fine_tuned": {op: {k: v for k, v in entry.items() if k != "weights"}
                                   for op, entry in sorted(self.fine_tuned.items())}} if self.fine_tuned else {}),
                **({"interpolated_kernels": {group: len(interpolation.inputs)
                                             for group, interpolation in sorted(self.residuals.items())}}
                   if self.residuals else {})}

    def kernel_count(self, op: str, cls: str | None = None) -> int:
        """Measured kernels of operator ``op`` this calibration was fitted on (``fitted_from.kernels``); with ``cls``,
        those of that calibration class (a file written before the entries counted classes: all of them)."""
        return sum(int(entry.get("classes", {}).get(cls, 0) if cls is not None and "classes" in entry
                       else entry.get("rows", 0))
                   for entry in self.fitted_from.get("kernels", []) if entry.get("op") == op)

    def factors(self, op: str, features: np.ndarray, shapes=None) -> np.ndarray:
        """The correction of every row of ``op`` (``shapes``: its shape columns per row; without them the interpolated
        residuals are left out, as before any were fitted)."""
        log_factor = design(op, features, shapes, self.standardisation) @ self.theta
        if self.residuals and shapes is not None:
            from pipeweave.residual_kernel import log_corrections

            log_factor = log_factor + log_corrections(self.residuals, op, shapes)
        return np.exp(log_factor)

    def apply(self, kind: str, hardware, durations_ms: np.ndarray, features: np.ndarray | None = None,
              shapes=None) -> np.ndarray:
        """The engine's hook (pipeweave.engine.Calibration): durations of one GPU's rows of one operator class
        (features and shape keys given) or collective kind (``shapes``: (message bytes, workers) per row); other
        GPUs' rows come back unchanged."""
        if hardware.stem != self.hardware:
            return durations_ms
        if kind in COLLECTIVE_KINDS:
            size, workers = np.asarray(shapes, dtype=np.float64).reshape(-1, 2).T
            return durations_ms * np.exp(communication_design(kind, size, workers, hardware) @ self.theta)
        return durations_ms * self.factors(kind, features, shapes)

    def record(self, hardware) -> dict | None:
        """What a prediction on ``hardware`` records (None for a GPU this calibration does not change)."""
        return self.summary() if hardware.stem == self.hardware else None

    def stale_models(self, loaded: dict, named: str | None = None) -> list[str]:
        """WARNING lines for operators whose model (``{op: directory}``) is not the one the calibration was
        fitted against: a retrained model has other biases, so the correction may no longer fit. ``named`` is the
        calibration as the caller gave it (default ``--calibration PATH``)."""
        named = named or f"--calibration {self.path}"
        return [f"WARNING: {named} was fitted against the {op} model {Path(fitted).name}, "
                f"this prediction uses {Path(loaded[op]).name}; recalibrate with {command('calibrate.py')}"
                for op, fitted in sorted(self.base_models.items())
                if op in loaded and Path(fitted).name != Path(loaded[op]).name]

    def stale_spec(self, hardware, named: str | None = None) -> str | None:
        """A WARNING line when ``hardware``, the calibrated GPU's spec as loaded now, differs from the spec the
        calibration was fitted against (``fitted_from.hardware_spec``; a file written before it was recorded is not
        checked): its corrections are ratios of measurements to predictions of the old spec, so a corrected
        datasheet value would be corrected twice. None when it is the same, or for another GPU. ``named`` as in
        :meth:`stale_models`."""
        fitted = self.fitted_from.get("hardware_spec")
        if not isinstance(fitted, dict) or hardware.stem != self.hardware:
            return None
        now = spec_record(hardware)
        changed = [f"{name} {fitted[name]!r} -> {value!r}" for name, value in now.items()
                   if name in fitted and fitted[name] != value]
        if not changed:
            return None
        named = named or f"--calibration {self.path}"
        return (f"WARNING: {named} was fitted against another spec of {hardware.name} ({', '.join(changed)}): its "
                f"corrections were measured against the old spec's predictions; recalibrate with "
                f"{command('calibrate.py')}")

    def stale_collectives(self, collective_dir: str | Path, gpu: str | None = None,
                          named: str | None = None) -> str | None:
        """A WARNING line when the collective models predicting now (``serving.json``: ring efficiency, custom
        all-reduce; and the measured models of ``gpu``, the GPU whose collectives are predicted, by default the
        calibrated one) are not those the communication factors were fitted against; None when they are, or when
        the calibration fitted no communication factor. (A file written before the models were recorded is checked
        on ``serving.json`` alone.) ``named`` as in :meth:`stale_models`."""
        fitted = self.fitted_from.get("collective_models")
        if not isinstance(fitted, dict):
            return None
        now = collective_models_record(collective_dir, gpu or self.hardware)
        same = now["serving_digest"] == fitted.get("serving_digest")
        if "models_digest" in fitted:
            same = same and (now["gpu"], now["models_digest"]) == (fitted.get("gpu"), fitted["models_digest"])
        if same:
            return None
        named = named or f"--calibration {self.path}"
        return (f"WARNING: {named} fitted its communication factors against the collective models "
                f"of {fitted.get('dir')} ({_models_named(fitted)}), this prediction uses {now['dir']} "
                f"({_models_named(now)}); recalibrate with {command('calibrate.py')} --collective_dir {now['dir']}")

    def check_hardware(self, stems, option: str = "--calibration") -> None:
        """A calibration for a GPU none of the predictions are for is refused (it would silently do nothing);
        ``option`` names it as the caller gives it."""
        stems = list(dict.fromkeys(stems))
        if self.hardware not in stems:
            raise ValueError(f"{option} {self.path}: it was fitted for {self.hardware} ({self.device_name}) "
                             f"and cannot be applied to {', '.join(stems)}; calibrate that GPU with "
                             f"{command('calibrate.py')}")

    def to_dict(self) -> dict:
        return {"format": FORMAT_VERSION, "kind": "pipeweave-calibration", "hardware": self.hardware,
                "device_name": self.device_name, "method": self.method,
                "parameters": {p: {"log_factor": float(t), "factor": float(np.exp(t)), "posterior_std": float(s)}
                               for p, t, s in zip(PARAMS, self.theta, self.std)},
                "standardisation": self.standardisation, "fitted_from": self.fitted_from,
                "base_models": self.base_models, "prior": self.prior, "fine_tuned": self.fine_tuned,
                "spread": self.spread,
                "residuals": {group: interpolation.as_dict()
                              for group, interpolation in sorted(self.residuals.items())}}

    def save(self, path: str | Path) -> None:
        from pipeweave.cli import write_atomically

        text = json.dumps(self.to_dict(), indent=2) + "\n"
        write_atomically(path, lambda tmp: tmp.write_text(text))


#: the largest |log factor| a calibration file may hold: e^20 is 5·10^8, beyond any correction (calibrate.py refuses
#: a measurement 30x from its zero-shot prediction), and the exponentials of larger values overflow
MAX_LOG_FACTOR = 20.0


def parameter_value(path: Path, where: str, entry, key: str) -> float:
    """<where>.<key> of a calibration file as a finite float (a log factor within :data:`MAX_LOG_FACTOR`);
    anything else names the field."""
    value = entry.get(key) if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"{path}: {where}.{key} must be a finite number, got {value!r}; "
                         f"refit the file with {command('calibrate.py')}")
    if key == "log_factor" and abs(value) > MAX_LOG_FACTOR:
        raise ValueError(f"{path}: {where}.{key} = {value!r} is beyond ±{MAX_LOG_FACTOR:g} (a factor e^{value:g}); "
                         f"refit the file with {command('calibrate.py')}")
    return float(value)


def check_standardisation(path: Path, standardisation: dict) -> None:
    """Each class's covariate centres are finite and its scales finite and positive, one per covariate."""
    for cls, entry in standardisation.items():
        size = len(class_covariates(cls))
        for key, least in (("center", -np.inf), ("scale", 0.0)):
            values = entry.get(key) if isinstance(entry, dict) else None
            if (not isinstance(values, list) or len(values) != size
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
                               and v > least for v in values)):
                raise ValueError(f"{path}: standardisation.{cls}.{key} must be {size} finite"
                                 f"{' positive' if key == 'scale' else ''} numbers, got {values!r}; refit the file "
                                 f"with {command('calibrate.py')}")


def checked_spread(path: Path, spread) -> dict:
    """The ``spread`` record of a calibration file (absent in files written before 2026-12-04: no widening)."""
    if not isinstance(spread, dict):
        raise ValueError(f"{path}: spread must be an object; refit the file with {command('calibrate.py')}")
    for op, entry in spread.items():
        for key in ("log_low", "log_high"):
            parameter_value(path, f"spread.{op}", entry, key)  # finite numbers, or the error names the field
    return spread


def _is_log_range(value) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
            and value[0] <= value[1])


def _class_counts(classes) -> bool:
    """``fitted_from.kernels[i].classes`` well-formed: each calibration class's rows, an integer (the intervals of
    attention rows read their class's count)."""
    return isinstance(classes, dict) and all(type(rows) is int for rows in classes.values())


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; errors name the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"calibration file not found: {path} (write one with {command('calibrate.py')})")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a calibration file (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("kind") != "pipeweave-calibration":
        raise ValueError(f"{path}: not a calibration file (write one with {command('calibrate.py')})")
    version = data.get("format")
    # true == 1 in Python: a damaged "format": true would read as format 1, its slopes and fine-tuned models dropped
    if isinstance(version, bool) or version not in range(1, FORMAT_VERSION + 1):
        raise ValueError(f"{path}: calibration format {version!r}, this pipeweave reads 1 to {FORMAT_VERSION}; "
                         f"refit it with {command('calibrate.py')}")
    # format 1 had the intercepts and the communication factor only: its shape slopes are 0, same predictions
    expected = [p for p in PARAMS if p in FACTORS] if version == 1 else PARAMS
    parameters = data.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ValueError(f"{path}: parameters must be an object of named parameters; refit the file with "
                         f"{command('calibrate.py')}")
    parameters = dict(parameters)
    if version < 4 and "communication" in parameters:  # one factor on every collective: equal latency and bandwidth
        shared = parameters.pop("communication")
        parameters.update({p: shared for p in COMMUNICATION_PARAMS})
    missing = [p for p in expected if p not in parameters]
    standardisation = data.get("standardisation") if version > 1 else None
    if version > 1 and (not isinstance(standardisation, dict) or set(standardisation) != set(CLASSES)):
        missing.append("standardisation")
    # fine-tuned models came with format 3; format 4 changed only the communication factors, so a format-3 file's
    # models still apply (dropped, its GEMM corrections, fitted under them, would meet the shipped model instead)
    fine_tuned = data.get("fine_tuned", {}) if version >= 3 else {}
    if not isinstance(fine_tuned, dict) or any(not isinstance(entry, dict) or "weights" not in entry
                                               for entry in fine_tuned.values()):
        missing.append("the weights of its fine_tuned models")
    elif version >= 6 and not all(_is_log_range(entry.get("trusted_log_change")) for entry in fine_tuned.values()):
        missing.append("the trusted_log_change of its fine_tuned models ([least, greatest], finite numbers)")
    if missing:
        raise ValueError(f"{path}: calibration lacks {', '.join(missing)}")
    unknown = sorted(set(parameters) - set(PARAMS)) if version == FORMAT_VERSION else []
    if unknown:  # an edited or foreign file: such a parameter would be ignored without a word
        raise ValueError(f"{path}: unknown parameter(s) {', '.join(unknown)}; refit the file with "
                         f"{command('calibrate.py')}")
    theta, std = (np.array([parameter_value(path, f"parameters.{p}", parameters[p], key) if p in expected else 0.0
                            for p in PARAMS])
                  for key in ("log_factor", "posterior_std"))
    if standardisation is not None:
        check_standardisation(path, standardisation)
    if not isinstance(data.get("fitted_from", {}), dict):
        raise ValueError(f"{path}: fitted_from must be an object (as {command('calibrate.py')} writes it)")
    e2e = data.get("fitted_from", {}).get("e2e")
    if e2e is not None and not (isinstance(e2e, dict) and all(
            isinstance(e2e.get(key, []), list) and all(isinstance(item, str) for item in e2e.get(key, []))
            for key in ("runs", "run_digests", "ops"))):
        raise ValueError(f"{path}: fitted_from.e2e must be an object whose runs, run_digests and ops are lists of "
                         f"text (as {command('calibrate.py')} writes it)")
    # read by every prediction (the operators measured, the kernel counts of the intervals, the stale-model WARNING):
    # checked here, or a damaged entry ends a command in a traceback, after its output was written
    kernels = data.get("fitted_from", {}).get("kernels", [])
    if not isinstance(kernels, list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("op"), str) and type(entry.get("rows")) is int
            and _class_counts(entry.get("classes", {})) for entry in kernels):
        raise ValueError(f"{path}: fitted_from.kernels must be a list of objects with an op (text), rows (an "
                         f"integer) and, where given, classes (an object of integers), as {command('calibrate.py')} "
                         f"writes it")
    base_models = data.get("base_models", {})
    if not isinstance(base_models, dict) or not all(isinstance(model, str) for model in base_models.values()):
        raise ValueError(f"{path}: base_models must be an object of model folders (text), as "
                         f"{command('calibrate.py')} writes it")
    from pipeweave.residual_kernel import interpolations_from_dict

    # residuals came with format 5
    residuals = interpolations_from_dict(data.get("residuals", {}) if version >= 5 else {}, f"{path}: residuals")
    calibration = Calibration(str(data["hardware"]), str(data.get("device_name", data["hardware"])), theta, std,
                              data.get("fitted_from", {}), base_models, data.get("prior", {}),
                              standardisation, path, fine_tuned, checked_spread(path, data.get("spread", {})),
                              residuals)
    try:
        calibration.fine_tuned_models()
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: a fine-tuned model does not load ({exc}); refit it with "
                         f"{command('calibrate.py')}") from None
    return calibration


def calibration_key(path: str | Path) -> tuple[str, str]:
    """(path, digest) of a calibration file: what names one calibration in a cache or across Dask workers."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"calibration file not found: {path} (write one with {command('calibrate.py')})")
    return str(path), file_digest(path)


def _models_named(record: dict) -> str:
    models = (f"{record['gpu']}'s measured models {record['models_digest']}" if record.get("models_digest")
              else f"no measured models of {record['gpu']}" if record.get("gpu") else None)
    return ", ".join(filter(None, [f"serving.json {record.get('serving_digest')}", models]))


#: the spec fields that only name the GPU: changing them changes no prediction
_NAMING_FIELDS = ("stem", "name", "aliases", "aiconfigurator_system")


def spec_record(hardware) -> dict:
    """The spec values of ``hardware`` (a HardwareSpec) a calibration is fitted against, as JSON values."""
    return json.loads(json.dumps({f.name: getattr(hardware, f.name) for f in fields(hardware)
                                  if f.name not in _NAMING_FIELDS}))


def file_digest(path: str | Path) -> str:
    return hashlib.blake2b(Path(path).read_bytes(), digest_size=8).hexdigest()


def collective_models_record(collective_dir: str | Path, gpu: str) -> dict:
    """Which collective models predict a calibration's collectives: the folder, the digest of its ``serving.json``
    (None for a folder without one: the plain textbook estimate) and of the measured models of ``gpu`` (the GPU
    stem whose collectives are predicted; None without any: the analytical estimate)."""
    serving = Path(collective_dir) / "serving.json"
    models = sorted((Path(collective_dir) / gpu).glob("*_model.*"))
    digest = hashlib.blake2b(digest_size=8)
    for path in models:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {"dir": str(collective_dir), "serving_digest": file_digest(serving) if serving.is_file() else None,
            "gpu": gpu, "models_digest": digest.hexdigest() if models else None}
