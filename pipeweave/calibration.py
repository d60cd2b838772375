"""Per-GPU calibration: small log-space corrections of the zero-shot model, fitted by MAP with shrinkage.

Why: on a GPU it never measured, pipeweave's error is mostly a per-GPU efficiency bias (docs/ACCURACY.md,
leave-one-GPU-out); a user can nearly always measure something on their GPU (one benchmark run, a few
minutes of ``profile_operators.py --quick``). A calibration turns those measurements into a correction of
that GPU's predictions only.

Parametrisation. Every kernel's duration t̂ (the zero-shot prediction) becomes t̂ · exp(x · θ), where x splits
the analytical model's ideal work of that kernel between its compute pipe (tensor or FMA+XU cycles, C) and
its memory pipe (DRAM cycles, M): x has C / (C + M) in the kernel class's ``compute`` slot and M / (C + M) in
its ``memory`` slot. The classes are GEMM, FP8 GEMM, attention prefill, attention decode (the paged kernel),
element-wise (RMSNorm, SiLU*Mul) and MoE; collectives get one separate ``communication`` factor. So a
compute-bound prefill and a memory-bound decode step inform different parameters, and a correction learned
from a TP1 run (same kernel classes, other shapes) moves a TP2 prediction, while the communication factor
stays at its prior until collectives are measured.

Prior (shrinkage toward the zero-shot model). θ ~ N(0, Σ₀) with Σ₀ = τ_gpu² (every kernel parameter moves
together: "this GPU is slower than its spec sheet says") + τ_pipe² (same pipe across classes) + τ_class,c²
(one class alone); communication is independent with τ_comm. The τ's and the observation noise per kernel
class come from the leave-one-GPU-out biases of the kernel models (``pipeweave.calibration_eval`` estimates
them and writes ``pipeweave/calibration_prior.json``), never from end-to-end runs.

Fit. Each measurement is an equation log(measured) = log(Σ_terms base · exp(x θ)) + ε: a measured kernel is
one term; an end-to-end prefill, decode step or total latency is the sum over the workload's kernel and
collective instances. The MAP estimate minimises Σ huber(residual / σ) + θᵀ Σ₀⁻¹ θ by Gauss-Newton (a robust
ridge regression when every equation is one kernel). No data gives θ = 0, the zero-shot model.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analytical_model.attention import resolve_attention_type
from analytical_model.registry import get_operator

CLASSES = ("gemm", "gemm_fp8", "attn_prefill", "attn_decode", "elementwise", "moe")
PIPES = ("compute", "memory")
KERNEL_PARAMS = tuple(f"{c}.{p}" for c in CLASSES for p in PIPES)
PARAMS = KERNEL_PARAMS + ("communication",)
COMMUNICATION = len(PARAMS) - 1
COLLECTIVE_KINDS = ("all_reduce", "send_recv")
OP_CLASS = {"gemm": "gemm", "gemm_fp8": "gemm_fp8", "rmsnorm": "elementwise", "siluandmul": "elementwise", "moe": "moe"}
DEFAULT_PRIOR_PATH = Path(__file__).resolve().parent / "calibration_prior.json"
FORMAT_VERSION = 1
HUBER = 1.345  # the usual Huber constant (95 % efficiency under Gaussian noise)


def kernel_classes(op: str, n: int, attention_types=None) -> np.ndarray:
    """Calibration class of ``n`` kernels of ``op``; attention splits into prefill and decode by its layout
    (the paged kernel is the decode kernel in every workload and dataset row)."""
    if op == "attn":
        layouts = {kind: resolve_attention_type(str(kind))[1] for kind in set(attention_types)}
        return np.array(["attn_decode" if layouts[kind] == "paged" else "attn_prefill" for kind in attention_types],
                        dtype=object)
    if op not in OP_CLASS:
        raise ValueError(f"operator {op!r} has no calibration class (known: {', '.join(OP_CLASS)}, attn)")
    return np.full(n, OP_CLASS[op], dtype=object)


def pipe_split(op: str, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(compute share, memory share) of each kernel's ideal cycles: C / (C + M), M / (C + M)."""
    operator = get_operator(op)
    names = operator.feature_names
    features = np.asarray(features, dtype=np.float64)
    compute = sum(features[:, names.index(n)] for n in operator.ideal_cycle_features)
    memory = features[:, names.index("global_cycle")]
    total = compute + memory
    share = np.divide(compute, total, out=np.full(len(total), 0.5), where=total > 0)
    return share, 1.0 - share


def design(op: str, features: np.ndarray, attention_types=None) -> np.ndarray:
    """Design rows x (n × len(PARAMS)) of kernels of one operator class."""
    features = np.asarray(features, dtype=np.float64)
    classes = kernel_classes(op, len(features), attention_types)
    compute, memory = pipe_split(op, features)
    x = np.zeros((len(features), len(PARAMS)))
    for cls in np.unique(classes):
        rows = classes == cls
        x[rows, PARAMS.index(f"{cls}.compute")] = compute[rows]
        x[rows, PARAMS.index(f"{cls}.memory")] = memory[rows]
    return x


def communication_design(n: int) -> np.ndarray:
    x = np.zeros((n, len(PARAMS)))
    x[:, COMMUNICATION] = 1.0
    return x


# ------------------------------------------------------------------------------------------------
# prior


@dataclass
class Prior:
    """Prior scales (log space) and observation noise; see the module docstring for their meaning."""

    tau_gpu: float
    tau_pipe: float
    tau_class: dict[str, float]
    tau_comm: float
    sigma_kernel: dict[str, float]
    sigma_e2e: float
    source: str = ""

    def covariance(self) -> np.ndarray:
        n = len(PARAMS)
        cov = np.zeros((n, n))
        for i, a in enumerate(KERNEL_PARAMS):
            for j, b in enumerate(KERNEL_PARAMS):
                cov[i, j] = self.tau_gpu ** 2 + (self.tau_pipe ** 2 if a.split(".")[1] == b.split(".")[1] else 0.0)
            cov[i, i] += self.tau_class[a.split(".")[0]] ** 2
        cov[COMMUNICATION, COMMUNICATION] = self.tau_comm ** 2
        return cov

    def as_dict(self) -> dict:
        return {"tau_gpu": self.tau_gpu, "tau_pipe": self.tau_pipe, "tau_class": dict(self.tau_class),
                "tau_comm": self.tau_comm, "sigma_kernel": dict(self.sigma_kernel), "sigma_e2e": self.sigma_e2e,
                "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> "Prior":
        return cls(float(data["tau_gpu"]), float(data["tau_pipe"]), {k: float(v) for k, v in data["tau_class"].items()},
                   float(data["tau_comm"]), {k: float(v) for k, v in data["sigma_kernel"].items()},
                   float(data["sigma_e2e"]), str(data.get("source", "")))


def load_prior(path: str | Path = DEFAULT_PRIOR_PATH) -> Prior:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"calibration prior {path} not found; "
                                f"generate it with python3 -m pipeweave.calibration_eval")
    return Prior.from_dict(json.loads(path.read_text()))


# ------------------------------------------------------------------------------------------------
# MAP fit


@dataclass
class Equations:
    """Measured quantities as sums of terms: quantity e = Σ_{terms t of e} base_t · exp(x_t · θ)."""

    eq: np.ndarray  # equation index of every term
    base: np.ndarray  # zero-shot duration of every term (count-weighted), > 0
    x: np.ndarray  # design rows of the terms
    measured: np.ndarray  # per equation, > 0
    sigma: np.ndarray  # per equation, observation noise in log space
    labels: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls) -> "Equations":
        return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros((0, len(PARAMS))), np.zeros(0), np.zeros(0), [])

    @classmethod
    def concat(cls, parts: list["Equations"]) -> "Equations":
        out, offset = cls.empty(), 0
        for part in parts:
            out = cls(np.concatenate([out.eq, part.eq + offset]), np.concatenate([out.base, part.base]),
                      np.vstack([out.x, part.x]), np.concatenate([out.measured, part.measured]),
                      np.concatenate([out.sigma, part.sigma]), out.labels + part.labels)
            offset += len(part.measured)
        return out

    def predict(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predicted quantities, their Jacobian d log(prediction) / dθ)."""
        n = len(self.measured)
        weighted = self.base * np.exp(self.x @ theta)
        total = np.bincount(self.eq, weights=weighted, minlength=n)
        jac = np.stack([np.bincount(self.eq, weights=weighted * self.x[:, p], minlength=n)
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
    path: Path | None = None

    @property
    def method(self) -> str:
        return ("per-GPU log-duration corrections per kernel class, split by the analytical compute/memory share, "
                "plus a communication factor; MAP with a Gaussian prior toward the zero-shot model "
                "(pipeweave.calibration)")

    def summary(self) -> dict:
        """What an output records: file, GPU, method and the data it was fitted from."""
        return {"file": str(self.path) if self.path else None, "hardware": self.device_name,
                "method": self.method, "fitted_from": self.fitted_from,
                "factors": {p: round(float(np.exp(t)), 4) for p, t in zip(PARAMS, self.theta) if abs(t) > 1e-9}}

    def factors(self, op: str, features: np.ndarray, attention_types=None) -> np.ndarray:
        return np.exp(design(op, features, attention_types) @ self.theta)

    def apply(self, kind: str, hardware, durations_ms: np.ndarray, features: np.ndarray | None = None,
              shapes=None) -> np.ndarray:
        """The engine's hook (pipeweave.engine.Calibration): durations of one GPU's rows of one operator class
        (features and shape keys given) or collective kind; other GPUs' rows come back unchanged."""
        if hardware.stem != self.hardware:
            return durations_ms
        if kind in COLLECTIVE_KINDS:
            return durations_ms * float(np.exp(self.theta[COMMUNICATION]))
        types = [shape[0] for shape in shapes] if kind == "attn" else None
        return durations_ms * self.factors(kind, features, types)

    def record(self, hardware) -> dict | None:
        """What a prediction on ``hardware`` records (None for a GPU this calibration does not change)."""
        return self.summary() if hardware.stem == self.hardware else None

    def stale_models(self, loaded: dict) -> list[str]:
        """WARNING lines for operators whose model (``{op: directory}``) is not the one the calibration was
        fitted against: a retrained model has other biases, so the correction may no longer fit."""
        return [f"WARNING: --calibration {self.path} was fitted against the {op} model {Path(fitted).name}, "
                f"this prediction uses {Path(loaded[op]).name}; recalibrate with calibrate.py"
                for op, fitted in sorted(self.base_models.items())
                if op in loaded and Path(fitted).name != Path(loaded[op]).name]

    def check_hardware(self, stems) -> None:
        """A calibration for a GPU none of the predictions are for is refused (it would silently do nothing)."""
        stems = list(dict.fromkeys(stems))
        if self.hardware not in stems:
            raise ValueError(f"--calibration {self.path}: it was fitted for {self.hardware} ({self.device_name}) "
                             f"and cannot be applied to {', '.join(stems)}; calibrate that GPU with calibrate.py")

    def to_dict(self) -> dict:
        return {"format": FORMAT_VERSION, "kind": "pipeweave-calibration", "hardware": self.hardware,
                "device_name": self.device_name, "method": self.method,
                "parameters": {p: {"log_factor": float(t), "factor": float(np.exp(t)), "posterior_std": float(s)}
                               for p, t, s in zip(PARAMS, self.theta, self.std)},
                "fitted_from": self.fitted_from, "base_models": self.base_models, "prior": self.prior}

    def save(self, path: str | Path) -> None:
        from pipeweave.cli import write_atomically

        text = json.dumps(self.to_dict(), indent=2) + "\n"
        write_atomically(path, lambda tmp: tmp.write_text(text))


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; errors name the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"calibration file not found: {path} (write one with calibrate.py)")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a calibration file (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("kind") != "pipeweave-calibration":
        raise ValueError(f"{path}: not a calibration file (write one with calibrate.py)")
    if data.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: calibration format {data.get('format')!r}, this pipeweave reads {FORMAT_VERSION}")
    parameters = data.get("parameters", {})
    missing = [p for p in PARAMS if p not in parameters]
    if missing:
        raise ValueError(f"{path}: calibration lacks parameter(s) {', '.join(missing)}")
    theta = np.array([float(parameters[p]["log_factor"]) for p in PARAMS])
    std = np.array([float(parameters[p]["posterior_std"]) for p in PARAMS])
    if not np.all(np.isfinite(theta)):
        raise ValueError(f"{path}: calibration has non-finite parameters")
    return Calibration(str(data["hardware"]), str(data.get("device_name", data["hardware"])), theta, std,
                       data.get("fitted_from", {}), data.get("base_models", {}), data.get("prior", {}), path)


def file_digest(path: str | Path) -> str:
    return hashlib.blake2b(Path(path).read_bytes(), digest_size=8).hexdigest()
