"""The calibration's parametrisation: which correction a kernel gets, as a design row x with t = t̂ · exp(x · θ).

Per kernel class (GEMM, FP8 GEMM, attention prefill, attention decode, element-wise, MoE) the log correction is

    x · θ = a_compute · s + a_memory · (1 − s) + Σ_j b_j · z_j

* ``s`` = C / (C + M): the share of the analytical model's ideal cycles on the compute pipe (tensor or FMA+XU
  cycles, C) against the memory pipe (DRAM cycles, M). The two intercepts are the GPU's compute and memory
  efficiency bias: a compute-bound prefill and a memory-bound decode step inform different ones.
* ``z_j``: standardised shape covariates, each a physical reason for a bias that varies from shape to shape
  (the leave-one-GPU-out error of a GPU is not one number: docs/ACCURACY.md):
  - ``log_size`` = log max(C, M), the roofline cycles: small kernels are latency-bound (launch, prologue, too
    few CTAs to hide DRAM latency), big ones throughput-bound, and a GPU's efficiency may differ in the two
    regimes. It also enters through three hinges max(z − knot, 0) at knots −1, 0, +1 standard deviations, so
    the size effect may bend (a piecewise-linear function of log size);
  - ``log_imbalance`` = log(busiest SM's compute cycles / the average SM's): wave quantisation and SMs left
    idle when there are fewer CTAs than SMs;
  - attention only: ``log_kv_length`` (mean KV length per request: split-KV parallelism and the paged
    kernel's per-block overhead) and ``log_group_size`` (query heads per KV head, the GQA ratio).
  Standardised with the centre and scale of the kernels the prior was estimated from (stored in the prior
  and in every calibration file) and clipped to ±3 so that a shape far outside them is not extrapolated.
* Collectives get a latency and a bandwidth factor, weighted like the kernels' pipe intercepts by the share of
  the analytical ring estimate (:func:`pipeweave.collectives.analytical_collective_terms`, the GPU's link
  latency and bandwidth) that is latency: a decode step's small all-reduces are latency-bound, a prefill's large
  ones bandwidth-bound, and one run's decode error must not rescale the prefill's transfers.
"""
from __future__ import annotations

import numpy as np

from analytical_model.attention import resolve_attention_type
from analytical_model.columns import parse_length_list
from analytical_model.registry import ELEMENTWISE_FEATURES, get_operator
from pipeweave.collectives import analytical_collective_terms

CLASSES = ("gemm", "gemm_fp8", "attn_prefill", "attn_decode", "elementwise", "moe")
PIPES = ("compute", "memory")
COVARIATES = ("log_size", "log_imbalance")
ATTENTION_COVARIATES = ("log_kv_length", "log_group_size")
SIZE_KNOTS = (-1.0, 0.0, 1.0)
HINGES = tuple(f"log_size_above_{knot:+g}" for knot in SIZE_KNOTS)
CLIP = 3.0  # standard deviations
#: calibration class of each predicting model (an operator predicted by another's model, as quantisation by
#: RMSNorm's, takes that model's class: the correction is of the model's efficiency)
MODEL_CLASS = {"gemm": "gemm", "gemm_fp8": "gemm_fp8", "rmsnorm": "elementwise", "siluandmul": "elementwise",
               "moe": "moe"}


def class_covariates(cls: str) -> tuple[str, ...]:
    return COVARIATES + (ATTENTION_COVARIATES if cls.startswith("attn") else ())


def class_terms(cls: str) -> tuple[str, ...]:
    """Names of a class's parameters: the two pipe intercepts, the covariate slopes, the size hinges."""
    return PIPES + class_covariates(cls) + HINGES


KERNEL_PARAMS = tuple(f"{c}.{t}" for c in CLASSES for t in class_terms(c))
COMMUNICATION_PARAMS = ("communication.latency", "communication.bandwidth")
PARAMS = KERNEL_PARAMS + COMMUNICATION_PARAMS
LATENCY, BANDWIDTH = (PARAMS.index(p) for p in COMMUNICATION_PARAMS)
INTERCEPTS = tuple(f"{c}.{p}" for c in CLASSES for p in PIPES)


def class_slice(cls: str) -> slice:
    start = PARAMS.index(f"{cls}.{PIPES[0]}")
    return slice(start, start + len(class_terms(cls)))


def kernel_classes(op: str, n: int, attention_types=None) -> np.ndarray:
    """Calibration class of ``n`` kernels of ``op``; attention splits into prefill and decode by its layout
    (the paged kernel is the decode kernel in every workload and dataset row)."""
    if op == "attn":
        layouts = {kind: resolve_attention_type(str(kind))[1] for kind in set(attention_types)}
        return np.array(["attn_decode" if layouts[kind] == "paged" else "attn_prefill" for kind in attention_types],
                        dtype=object)
    model = get_operator(op).model_op
    # an element-wise model registered later (the registry's row-kernel features, memory-bound as RMSNorm and
    # SiLU*Mul) shares their class: the same features and physics, so the same corrections apply
    cls = MODEL_CLASS.get(model) or ("elementwise" if get_operator(model).feature_names == ELEMENTWISE_FEATURES
                                     and get_operator(model).dram_bound else None)
    if cls is None:
        raise ValueError(f"operator {op!r} (predicted by the {model!r} model) has no calibration class "
                         f"(models with one: {', '.join(MODEL_CLASS)}, attn, and any element-wise model)")
    return np.full(n, cls, dtype=object)


def pipe_cycles(op: str, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(C, M): ideal compute-pipe cycles and DRAM cycles of each kernel."""
    operator = get_operator(op)
    names = operator.feature_names
    features = np.asarray(features, dtype=np.float64)
    compute = sum(features[:, names.index(n)] for n in operator.ideal_cycle_features)
    return compute, features[:, names.index("global_cycle")]


def pipe_split(op: str, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(compute share, memory share) of each kernel's ideal cycles: C / (C + M), M / (C + M)."""
    compute, memory = pipe_cycles(op, features)
    total = compute + memory
    share = np.divide(compute, total, out=np.full(len(total), 0.5), where=total > 0)
    return share, 1.0 - share


def raw_covariates(op: str, features: np.ndarray, shapes=None) -> np.ndarray:
    """Unstandardised covariates (n × len(COVARIATES + ATTENTION_COVARIATES)); attention's need ``shapes``
    (the operator's shape columns per row), other operators leave them 0."""
    features = np.asarray(features, dtype=np.float64)
    names = get_operator(op).feature_names
    compute, memory = pipe_cycles(op, features)
    tiny = np.finfo(np.float64).tiny
    pipe = get_operator(op).ideal_cycle_features[0].removesuffix("_all_cycle")
    busiest = features[:, names.index(f"{pipe}_sm_max_cycle")]
    average = features[:, names.index(f"{pipe}_all_cycle")]
    out = np.zeros((len(features), len(COVARIATES) + len(ATTENTION_COVARIATES)))
    out[:, 0] = np.log(np.maximum(np.maximum(compute, memory), tiny))
    out[:, 1] = np.log(np.maximum(np.divide(busiest, average, out=np.ones(len(average)), where=average > 0), 1.0))
    if op == "attn" and len(features):
        kv = [np.mean(parse_length_list(shape[3], "kv_lengths")) for shape in shapes]
        out[:, 2] = np.log(np.maximum(kv, 1.0))
        out[:, 3] = np.log(np.array([float(shape[4]) / float(shape[5]) for shape in shapes]))
    return out


def attention_types(op: str, shapes) -> list | None:
    return [shape[0] for shape in shapes] if op == "attn" else None


def design(op: str, features: np.ndarray, shapes=None, standardisation: dict | None = None) -> np.ndarray:
    """Design rows x (n × len(PARAMS)) of kernels of one operator (``shapes``: its shape columns per row,
    needed for attention). ``standardisation`` {class: {"center", "scale"}} places the covariates; without
    it (a calibration with intercepts only) their columns stay 0."""
    features = np.asarray(features, dtype=np.float64)
    classes = kernel_classes(op, len(features), attention_types(op, shapes))
    raw = raw_covariates(op, features, shapes) if standardisation else None
    return assemble(classes, pipe_split(op, features)[0], raw, standardisation)


def assemble(classes: np.ndarray, compute_share: np.ndarray, raw: np.ndarray | None,
             standardisation: dict | None) -> np.ndarray:
    """Design rows from each kernel's class, compute share and raw covariates (see :func:`design`)."""
    x = np.zeros((len(classes), len(PARAMS)))
    for cls in np.unique(classes):
        rows = classes == cls
        x[rows, PARAMS.index(f"{cls}.compute")] = compute_share[rows]
        x[rows, PARAMS.index(f"{cls}.memory")] = 1.0 - compute_share[rows]
        if raw is None or standardisation is None:
            continue
        names = class_covariates(cls)
        center = np.asarray(standardisation[cls]["center"], dtype=np.float64)
        scale = np.asarray(standardisation[cls]["scale"], dtype=np.float64)
        z = np.clip((raw[rows][:, :len(names)] - center) / scale, -CLIP, CLIP)
        for j, name in enumerate(names):
            x[rows, PARAMS.index(f"{cls}.{name}")] = z[:, j]
        for knot, name in zip(SIZE_KNOTS, HINGES):
            x[rows, PARAMS.index(f"{cls}.{name}")] = np.maximum(z[:, 0] - knot, 0.0)
    return x


def fit_standardisation(raw_by_class: dict[str, list[np.ndarray]]) -> dict:
    """{class: {"center", "scale"}}: mean and standard deviation of the pooled raw covariates of each class (a
    constant covariate gets scale 1); a class without kernels gets centre 0 and scale 1."""
    out = {}
    for cls in CLASSES:
        width = len(class_covariates(cls))
        parts = raw_by_class.get(cls)
        if not parts:
            out[cls] = {"center": [0.0] * width, "scale": [1.0] * width}
            continue
        pooled = np.vstack(parts)[:, :width]
        scale = pooled.std(axis=0)
        out[cls] = {"center": pooled.mean(axis=0).tolist(), "scale": np.where(scale > 1e-9, scale, 1.0).tolist()}
    return out


def communication_design(kind: str, size_bytes, num_workers, spec) -> np.ndarray:
    """Design rows of collectives of one kind on ``spec``: latency factor weighted by the latency share s of the
    analytical ring estimate, bandwidth factor by 1 − s (a collective that takes no time: all latency)."""
    latency, transfer = analytical_collective_terms(kind, size_bytes, num_workers, spec.link_gbps,
                                                    spec.link_latency_us)
    total = latency + transfer
    share = np.divide(latency, total, out=np.ones(len(total)), where=total > 0)
    x = np.zeros((len(share), len(PARAMS)))
    x[:, LATENCY] = share
    x[:, BANDWIDTH] = 1.0 - share
    return x
