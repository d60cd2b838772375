"""The operator registry: the single source of every per-operator fact.

Each :class:`OperatorClass` says how an operator appears in workloads (``workload_key``), which columns
describe one shape (``shape_columns``, ``optional_columns``), its calculators per architecture or
attention backend, its feature names in MLP input order (docs/METHOD.md §4.1), which features sum to the
ideal cycle count ``C_ideal`` (§4.2–4.3), its shape descriptors, and what the tools do with it
(``trainable``, ``quantile``, ``profiled``). The dataset builder, the training scripts, the profiler, the
kernel predictor, the aggregator and the reports all derive their operator lists and columns from here.

Feature functions take a *mapping of column name to 1-D values* (a dict of numpy arrays or lists, or a
pandas DataFrame): the prediction path never needs pandas. ``python3 -m analytical_model list`` prints
the registry.

Adding an operator = one calculator module + one :func:`register` call (or one entry in ``OPERATORS``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from . import descriptors, fa2_batch, gemm_fp8, gemm_sm80, gemm_sm90, rmsnorm, siluandmul, triton_moe
from .attention import ATTENTION_CALCULATORS, attention_problem, resolve_attention_type
from .hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from .pipes import (
    FMA_FEATURES,
    MEMORY_FEATURES,
    TENSOR_FEATURES,
    XU_FEATURES,
    ElementwiseProblem,
    GemmProblem,
    HardwareSpec,
    MoeProblem,
)
from .tiles import choose_gemm_tiles

GEMM_FEATURES = TENSOR_FEATURES + MEMORY_FEATURES
ATTENTION_FEATURES = TENSOR_FEATURES + XU_FEATURES + MEMORY_FEATURES
ELEMENTWISE_FEATURES = FMA_FEATURES + XU_FEATURES + MEMORY_FEATURES
TILE_COLUMNS = ("tile_M", "tile_N", "tile_K", "is_split_k", "cta_count")
MOE_WEIGHT_TYPES = ("w13", "w2", "layer")
#: the memory-pipe feature the kernel roofline compares with the compute cycles (DRAM traffic at peak bandwidth)
DRAM_CYCLE_FEATURE = "global_cycle"

#: column name -> one value per row (numpy array, list or pandas Series); a pandas DataFrame is one
Columns = Mapping[str, Any]


@dataclass(frozen=True)
class OperatorClass:
    """Everything the tools know about one operator class.

    ``compute(operator, columns, hw)`` returns the float64 features of the rows on GPU ``hw`` and may use
    ``operator.calculators``; ``describe(columns, hw)`` returns the shape descriptors.
    """

    key: str
    description: str
    shape_columns: tuple[str, ...]
    feature_names: tuple[str, ...]
    ideal_cycle_features: tuple[str, ...]
    calculators: dict[str, Callable]
    compute: Callable[["OperatorClass", Columns, HardwareSpec], np.ndarray]
    descriptor_names: tuple[str, ...]
    describe: Callable[[Columns, HardwareSpec], np.ndarray]
    optional_columns: tuple[str, ...] = ()
    #: shape columns that hold text (a type name, or a list written "[a,b]"); the others are integers
    text_columns: tuple[str, ...] = ()
    #: data type of the measured kernels, unless a dataset row says otherwise
    dtype: str = "bfloat16"
    #: key of the operator under an iteration's "operators" in a workload JSON; None: not in workloads
    workload_key: str | None = None
    #: the dataset builder makes dataset/<key>_{train,test}.csv and train_mlp.py trains a model
    trainable: bool = True
    #: an upper-bound (quantile) model is trained and shipped (train_mlp_quantile.py, aggregator --quantiles)
    quantile: bool = False
    #: profile_operators.py measures it on a local GPU
    profiled: bool = False

    @property
    def int_columns(self) -> tuple[str, ...]:
        return tuple(c for c in self.shape_columns if c not in self.text_columns)

    def input_names(self, with_descriptors: bool = True) -> tuple[str, ...]:
        """MLP input columns: the docs/METHOD.md features, then (pipeweave recipe) the shape descriptors."""
        return self.feature_names + (self.descriptor_names if with_descriptors else ())

    def calculator(self, name: str) -> Callable:
        """The calculator registered under ``name`` (an architecture or attention backend)."""
        try:
            return self.calculators[name]
        except KeyError:
            raise ValueError(f"{self.key}: no calculator {name!r}; known: {', '.join(self.calculators)}") from None

    def _check_columns(self, columns: Columns) -> int:
        missing = [c for c in self.shape_columns if c not in columns]
        if missing:
            raise ValueError(f"{self.key}: input lacks column(s) {', '.join(missing)}")
        return len(columns[self.shape_columns[0]])

    def features(self, columns: Columns, hw: HardwareSpec) -> np.ndarray:
        """float64 features, one row per input row, all on the GPU ``hw``."""
        rows = self._check_columns(columns)
        if rows == 0:
            return np.zeros((0, len(self.feature_names)))
        return np.asarray(self.compute(self, columns, hw), dtype=np.float64).reshape(rows, len(self.feature_names))

    def descriptors(self, columns: Columns, hw: HardwareSpec) -> np.ndarray:
        """float64 shape descriptors, one row per input row."""
        rows = self._check_columns(columns)
        if rows == 0:
            return np.zeros((0, len(self.descriptor_names)))
        return np.asarray(self.describe(columns, hw), dtype=np.float64).reshape(rows, len(self.descriptor_names))

    def ideal_cycles(self, features32: np.ndarray) -> np.ndarray:
        """C_ideal from float32 features: the float32 sum of the ideal-cycle columns (docs/METHOD.md §4.3)."""
        idx = [self.feature_names.index(name) for name in self.ideal_cycle_features]
        total = features32[:, idx[0]].astype(np.float32)
        for i in idx[1:]:
            total = total + features32[:, i].astype(np.float32)
        return total

    def kernel_roofline_cycles(self, columns: Columns) -> np.ndarray:
        """The kernel roofline: max(ideal compute cycles at spec peak, DRAM cycles at spec bandwidth).

        ``columns`` holds the feature columns (e.g. a dataset CSV). Not to be confused with the end-to-end
        roofline baseline of :mod:`pipeweave.compare`, which sums per-operator roofline times of a workload.
        """
        compute = sum(np.asarray(columns[name], dtype=np.float64) for name in self.ideal_cycle_features)
        return np.maximum(compute, np.asarray(columns[DRAM_CYCLE_FEATURE], dtype=np.float64))


# --------------------------------------------------------------------------------------------------
# column access without pandas
# --------------------------------------------------------------------------------------------------

def _values(columns: Columns, column: str) -> np.ndarray:
    values = columns[column]
    to_numpy = getattr(values, "to_numpy", None)
    return to_numpy() if to_numpy is not None else np.asarray(values)


def _as_number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _int_column(columns: Columns, column: str) -> np.ndarray:
    raw = _values(columns, column)
    if raw.dtype.kind in "iu":
        return raw.astype(np.int64)
    if raw.dtype.kind in "fb":
        values = raw.astype(np.float64)
    else:
        values = np.fromiter((_as_number(v) for v in raw), dtype=np.float64, count=len(raw))
    bad = ~np.isfinite(values) | (values != np.floor(values))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"column {column!r} must hold integers; row {row} has {raw[row]!r}")
    return values.astype(np.int64)


def _bool_column(columns: Columns, column: str) -> np.ndarray:
    raw = _values(columns, column)
    if raw.dtype == bool:
        return raw
    text = np.char.lower(np.char.strip(raw.astype(str)))
    truthy, falsy = np.isin(text, ["1", "1.0", "true", "yes"]), np.isin(text, ["0", "0.0", "false", "no"])
    bad = ~(truthy | falsy)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"column {column!r} must be 0/1 or true/false; row {row} has {raw[row]!r}")
    return truthy


def _present(columns: Columns, column: str) -> np.ndarray:
    """True where the row has a value (not None, NaN or missing), like pandas' notna."""
    raw = _values(columns, column)
    if raw.dtype.kind == "f":
        return ~np.isnan(raw)
    if raw.dtype.kind != "O":
        return np.ones(len(raw), dtype=bool)
    return np.fromiter((v is not None and type(v).__name__ != "NAType" and not (isinstance(v, float) and math.isnan(v))
                        for v in raw), dtype=bool, count=len(raw))


def _take(columns: Columns, names, rows: np.ndarray) -> dict[str, np.ndarray]:
    return {name: _values(columns, name)[rows] for name in names}


# --------------------------------------------------------------------------------------------------
# feature functions
# --------------------------------------------------------------------------------------------------

def gemm_problem(columns: Columns, hw: HardwareSpec, dtype: str = "bfloat16") -> GemmProblem:
    """GEMM problems for the rows: tile columns where given, the tile rule elsewhere."""
    m, n, k = (_int_column(columns, c) for c in ("M", "N", "K"))
    given = np.zeros(len(m), dtype=bool)
    if all(c in columns for c in TILE_COLUMNS):
        given = np.logical_and.reduce([_present(columns, c) for c in TILE_COLUMNS])
    tiles = {}
    if given.any():
        given_rows = _take(columns, TILE_COLUMNS, given)
        tiles = {c: _int_column(given_rows, c) for c in TILE_COLUMNS if c != "is_split_k"}
        tiles["is_split_k"] = _bool_column(given_rows, "is_split_k")
    if not given.all():
        chosen = choose_gemm_tiles(m[~given], n[~given], k[~given], hw, dtype)
        if given.any():
            for column in TILE_COLUMNS:
                merged = np.empty(len(m), dtype=chosen[column].dtype)
                merged[given], merged[~given] = tiles[column], chosen[column]
                tiles[column] = merged
        else:
            tiles = chosen
    return GemmProblem.create(
        m, n, k, tiles["tile_M"], tiles["tile_N"], tiles["tile_K"], tiles["cta_count"], tiles["is_split_k"],
        data_size_bytes=1 if dtype == "fp8" else 2,
    )


def _gemm(operator: OperatorClass, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    calculator = operator.calculator("sm90" if hw.uses_sm90_gemm else "sm80")
    return calculator(gemm_problem(columns, hw), hw)


def _gemm_fp8(operator: OperatorClass, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    return operator.calculator("fp8")(gemm_problem(columns, hw, dtype=operator.dtype), hw)


def parse_length_list(value, column: str) -> list[int]:
    """Parse "[a,b,...]" (or a list) into positive ints; errors name the column."""
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
    else:
        try:
            items = json.loads(str(value))
        except json.JSONDecodeError:
            raise ValueError(f"{column} must be a list like [a,b], got {value!r}") from None
        if not isinstance(items, list):
            items = [items]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise ValueError(f"{column} entries must be integers, got {item!r}")
    return [int(v) for v in items]


def _length_lists(columns: Columns, column: str) -> list:
    """Per row a tuple/list of ints; workload shapes arrive as tuples and are used as they are."""
    return [v if type(v) is tuple else parse_length_list(v, column) for v in columns[column]]


def _attention_arrays(columns: Columns):
    """(kinds, bs, q lists, kv lists, nh, nkv, hd) of attention rows, validated as AttentionProblem would."""
    bs, nh, nkv, hd = (_int_column(columns, c) for c in ("bs", "nh", "nkv", "hd"))
    kinds = [str(v) for v in _values(columns, "attention_type")]
    q, kv = _length_lists(columns, "q_lengths"), _length_lists(columns, "kv_lengths")
    q_count = np.fromiter(map(len, q), dtype=np.int64, count=len(q))
    kv_count = np.fromiter(map(len, kv), dtype=np.int64, count=len(kv))
    ok = (bs > 0) & (nh > 0) & (nkv > 0) & (hd > 0) & (q_count == bs) & (kv_count == bs)
    if ok.all():
        ok = (nh % nkv == 0)
        q_flat = np.fromiter((v for lengths in q for v in lengths), dtype=np.int64, count=int(bs.sum()))
        kv_flat = np.fromiter((v for lengths in kv for v in lengths), dtype=np.int64, count=int(bs.sum()))
        row = np.repeat(np.arange(len(bs)), bs)
        bad_request = (q_flat <= 0) | (q_flat > kv_flat)
        ok &= np.bincount(row[bad_request], minlength=len(bs)) == 0
    for i in np.flatnonzero(~ok):  # the per-row constructor raises the precise error
        attention_problem(kinds[i], int(bs[i]), q[i], kv[i], int(nh[i]), int(nkv[i]), int(hd[i]))
    return kinds, bs, q, kv, nh, nkv, hd


def _attention(operator: OperatorClass, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    """FA2 rows in one vectorised pass (fa2_batch, bit-identical to the per-launch calculator), others per row."""
    kinds, bs, q, kv, nh, nkv, hd = _attention_arrays(columns)
    resolved = {kind: resolve_attention_type(kind) for kind in set(kinds)}
    out = np.zeros((len(kinds), len(operator.feature_names)))
    fa2_rows = np.array([resolved[kind][0] == "fa2" for kind in kinds], dtype=bool)
    if fa2_rows.any():
        sel = np.flatnonzero(fa2_rows)
        count = int(bs[sel].sum())
        q_flat = np.fromiter((v for i in sel for v in q[i]), dtype=np.int64, count=count)
        kv_flat = np.fromiter((v for i in sel for v in kv[i]), dtype=np.int64, count=count)
        paged = np.array([resolved[kinds[i]][1] == "paged" for i in sel], dtype=bool)
        out[sel] = fa2_batch.features_from_arrays(bs[sel], q_flat, kv_flat, nh[sel], nkv[sel], hd[sel], paged, hw)
    for i in np.flatnonzero(~fa2_rows):
        key, problem = attention_problem(kinds[i], int(bs[i]), q[i], kv[i], int(nh[i]), int(nkv[i]), int(hd[i]))
        out[i] = operator.calculator(key)(problem, hw)
    return out


def _describe_gemm(operand_bytes: int, fp8: bool):
    def describe(columns: Columns, hw: HardwareSpec) -> np.ndarray:
        m, n, k = (_int_column(columns, c) for c in ("M", "N", "K"))
        return descriptors.gemm(m, n, k, hw, operand_bytes, hw.tc_fp8 if fp8 else hw.tc_bf16)

    return describe


def _describe_attention(columns: Columns, hw: HardwareSpec) -> np.ndarray:
    return descriptors.attention(
        _int_column(columns, "bs"), _length_lists(columns, "q_lengths"), _length_lists(columns, "kv_lengths"),
        _int_column(columns, "nh"), _int_column(columns, "nkv"), _int_column(columns, "hd"), hw,
    )


def _describe_elementwise(output_fraction: float):
    def describe(columns: Columns, hw: HardwareSpec) -> np.ndarray:
        return descriptors.elementwise(_int_column(columns, "seq"), _int_column(columns, "dim"), hw, output_fraction)

    return describe


def _moe_kinds(columns: Columns) -> np.ndarray:
    kinds = _values(columns, "weight_type").astype(str)
    unknown = sorted(set(kinds.tolist()) - set(MOE_WEIGHT_TYPES))
    if unknown:
        raise ValueError(f"weight_type must be one of {MOE_WEIGHT_TYPES}, got {unknown[0]!r}")
    return kinds


def _describe_moe(columns: Columns, hw: HardwareSpec) -> np.ndarray:
    kinds = _moe_kinds(columns)
    passes = np.stack([(kinds == "w13") | (kinds == "layer"), (kinds == "w2") | (kinds == "layer")], axis=-1)
    return descriptors.moe(*(_int_column(columns, c) for c in ("M", "E", "topk", "H", "N")), hw, passes.astype(float))


def _elementwise(operator: OperatorClass, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    problem = ElementwiseProblem.create(_int_column(columns, "seq"), _int_column(columns, "dim"))
    return operator.calculator(operator.key)(problem, hw)


def _moe(operator: OperatorClass, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    """``weight_type`` w13 / w2 is one pass; ``layer`` (a whole MoE layer) is the sum of both passes."""
    dims = [_int_column(columns, c) for c in ("M", "E", "topk", "H", "N")]
    kinds = _moe_kinds(columns)
    out = np.zeros((len(kinds), len(operator.feature_names)))
    for pass_type in ("w13", "w2"):
        rows = (kinds == pass_type) | (kinds == "layer")
        if rows.any():
            problem = MoeProblem.create(*(d[rows] for d in dims), pass_type=pass_type)
            out[rows] += operator.calculator("triton_moe")(problem, hw)
    return out


OPERATORS: dict[str, OperatorClass] = {}


def register(operator: OperatorClass) -> OperatorClass:
    """Add an operator class to the registry (the order of registration is the order of every listing)."""
    if operator.key in OPERATORS:
        raise ValueError(f"operator {operator.key!r} is already registered")
    if operator.workload_key and operator.workload_key in {op.workload_key for op in OPERATORS.values()}:
        raise ValueError(f"workload key {operator.workload_key!r} is already used")
    OPERATORS[operator.key] = operator
    return operator


register(OperatorClass(
    key="gemm",
    description="BF16 dense GEMM",
    shape_columns=("M", "N", "K"),
    optional_columns=TILE_COLUMNS,
    feature_names=GEMM_FEATURES,
    ideal_cycle_features=("tensor_all_cycle",),
    calculators={"sm80": gemm_sm80.features, "sm90": gemm_sm90.features},
    compute=_gemm,
    descriptor_names=descriptors.GEMM_DESCRIPTORS,
    describe=_describe_gemm(2, fp8=False),
    workload_key="gemm",
    quantile=True,
    profiled=True,
))
register(OperatorClass(
    key="gemm_fp8",
    description="FP8 dense GEMM (per-tensor scaled)",
    shape_columns=("M", "N", "K"),
    feature_names=GEMM_FEATURES,
    ideal_cycle_features=("tensor_all_cycle",),
    calculators={"fp8": gemm_fp8.features},
    compute=_gemm_fp8,
    descriptor_names=descriptors.GEMM_DESCRIPTORS,
    describe=_describe_gemm(1, fp8=True),
    dtype="fp8",
    quantile=True,
    profiled=True,
))
register(OperatorClass(
    key="attn",
    description="FlashAttention/FlashInfer prefill and decode",
    shape_columns=("attention_type", "bs", "q_lengths", "kv_lengths", "nh", "nkv", "hd"),
    text_columns=("attention_type", "q_lengths", "kv_lengths"),
    feature_names=ATTENTION_FEATURES,
    ideal_cycle_features=("tensor_all_cycle",),
    calculators=dict(ATTENTION_CALCULATORS),
    compute=_attention,
    descriptor_names=descriptors.ATTENTION_DESCRIPTORS,
    describe=_describe_attention,
    workload_key="attention",
    quantile=True,
    profiled=True,
))
def _elementwise_operator(key: str, description: str, calculator, output_fraction: float) -> OperatorClass:
    """RMSNorm and SiLU*Mul: one CTA per token row; ``output_fraction`` of the input width is written."""
    return OperatorClass(
        key=key,
        description=description,
        shape_columns=("seq", "dim"),
        feature_names=ELEMENTWISE_FEATURES,
        ideal_cycle_features=("fma_all_cycle", "xu_all_cycle"),
        calculators={key: calculator},
        compute=_elementwise,
        descriptor_names=descriptors.ELEMENTWISE_DESCRIPTORS,
        describe=_describe_elementwise(output_fraction),
        workload_key=key,
        profiled=True,
    )


register(_elementwise_operator("rmsnorm", "fused RMSNorm", rmsnorm.features, 1.0))
register(_elementwise_operator("siluandmul", "SiLU(gate)*up activation", siluandmul.features, 0.5))
register(OperatorClass(
    key="moe",
    description="Triton fused-MoE (w13 and w2 passes)",
    shape_columns=("weight_type", "M", "E", "topk", "H", "N"),
    text_columns=("weight_type",),
    feature_names=GEMM_FEATURES,
    ideal_cycle_features=("tensor_all_cycle",),
    calculators={"triton_moe": triton_moe.features},
    compute=_moe,
    descriptor_names=descriptors.MOE_DESCRIPTORS,
    describe=_describe_moe,
    quantile=True,
))


def get_operator(key: str) -> OperatorClass:
    try:
        return OPERATORS[key]
    except KeyError:
        raise ValueError(f"unknown operator {key!r}; known: {', '.join(OPERATORS)}") from None


def operator_keys(*, trainable: bool | None = None, quantile: bool | None = None, profiled: bool | None = None,
                  in_workloads: bool | None = None) -> tuple[str, ...]:
    """Registry keys, in registration order, filtered by the given properties."""
    wanted = {"trainable": trainable, "quantile": quantile, "profiled": profiled}
    return tuple(
        op.key for op in OPERATORS.values()
        if all(value is None or getattr(op, name) == value for name, value in wanted.items())
        and (in_workloads is None or (op.workload_key is not None) == in_workloads)
    )


def workload_operators() -> dict[str, OperatorClass]:
    """Workload JSON key -> operator class, for the operators that appear in workloads (registration order)."""
    return {op.workload_key: op for op in OPERATORS.values() if op.workload_key is not None}


def compute_features(op: str, frame, hardware_dir: str | Path = DEFAULT_HARDWARE_DIR):
    """Features (float64, docs/METHOD.md names and order), shape descriptors and ``ideal_cycles`` as a
    pandas DataFrame with the frame's index; rows may be on different GPUs.

    ``frame`` (a pandas DataFrame) needs the operator's shape columns and ``hardware`` (any name the
    hardware loader accepts). For the CSV-facing tools; prediction uses :meth:`OperatorClass.features`.
    """
    import pandas as pd

    operator = get_operator(op)
    if "hardware" not in frame.columns:
        raise ValueError("input lacks column 'hardware'")
    registry = hardware_registry(Path(hardware_dir))
    out = np.zeros((len(frame), len(operator.feature_names)))
    described = np.zeros((len(frame), len(operator.descriptor_names)))
    hardware = frame["hardware"].astype(str).to_numpy()
    for name in pd.unique(hardware):
        rows = np.flatnonzero(hardware == name)
        try:
            hw = registry.get(name)
        except ValueError as exc:
            raise ValueError(f"row {rows[0]}: {exc}") from None
        part = frame.iloc[rows]
        out[rows] = operator.features(part, hw)
        described[rows] = operator.descriptors(part, hw)
    result = pd.DataFrame(out, columns=list(operator.feature_names), index=frame.index)
    for i, name in enumerate(operator.descriptor_names):
        result[name] = described[:, i]
    result["ideal_cycles"] = operator.ideal_cycles(out.astype(np.float32)).astype(np.float64)
    return result


def model_inputs(features: np.ndarray) -> np.ndarray:
    """The MLP input: log1p of the float32-cast features (docs/METHOD.md §0.3, §4.1)."""
    return np.log1p(np.asarray(features, dtype=np.float32))
