"""The operator registry: everything downstream (dataset builder, training, kernel prediction and the
aggregator) reads operator classes from here.

Each :class:`OperatorClass` knows its shape columns, its calculators (per architecture or attention
backend), its feature names in MLP input order (METHOD.md §4.1) and which features sum to the ideal
cycle count ``C_ideal`` that turns an efficiency into a duration (METHOD.md §4.2–4.3).

Adding an operator = one calculator module + one entry in ``OPERATORS``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from . import descriptors, fa2_batch, gemm_fp8, gemm_sm80, gemm_sm90, rmsnorm, siluandmul, triton_moe
from .attention import ATTENTION_CALCULATORS, attention_problem
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


@dataclass(frozen=True)
class OperatorClass:
    key: str
    description: str
    shape_columns: tuple[str, ...]
    feature_names: tuple[str, ...]
    ideal_cycle_features: tuple[str, ...]
    calculators: dict[str, Callable]
    compute: Callable[[pd.DataFrame, HardwareSpec], np.ndarray]
    descriptor_names: tuple[str, ...]
    describe: Callable[[pd.DataFrame, HardwareSpec], np.ndarray]
    optional_columns: tuple[str, ...] = ()

    def input_names(self, with_descriptors: bool = True) -> tuple[str, ...]:
        """MLP input columns: the METHOD.md features, then (pipeweave recipe) the shape descriptors."""
        return self.feature_names + (self.descriptor_names if with_descriptors else ())

    def features(self, frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
        """float64 features, one row per frame row, all on the GPU ``hw``."""
        missing = [c for c in self.shape_columns if c not in frame.columns]
        if missing:
            raise ValueError(f"{self.key}: input lacks column(s) {', '.join(missing)}")
        if len(frame) == 0:
            return np.zeros((0, len(self.feature_names)))
        return np.asarray(self.compute(frame, hw), dtype=np.float64).reshape(len(frame), len(self.feature_names))

    def ideal_cycles(self, features32: np.ndarray) -> np.ndarray:
        """C_ideal from float32 features: the float32 sum of the ideal-cycle columns (METHOD.md §4.3)."""
        idx = [self.feature_names.index(name) for name in self.ideal_cycle_features]
        total = features32[:, idx[0]].astype(np.float32)
        for i in idx[1:]:
            total = total + features32[:, i].astype(np.float32)
        return total


def _int_column(frame: pd.DataFrame, column: str) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values != np.floor(values))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"column {column!r} must hold integers; row {row} has {frame[column].iloc[row]!r}")
    return values.astype(np.int64)


def gemm_problem(frame: pd.DataFrame, hw: HardwareSpec, dtype: str = "bfloat16") -> GemmProblem:
    """GEMM problems for the frame's rows: tile columns where given, the tile rule elsewhere."""
    m, n, k = (_int_column(frame, c) for c in ("M", "N", "K"))
    given = np.zeros(len(frame), dtype=bool)
    if all(c in frame.columns for c in TILE_COLUMNS):
        given = frame[list(TILE_COLUMNS)].notna().all(axis=1).to_numpy()
    tiles = {}
    if given.any():
        given_rows = frame[given]
        tiles = {c: _int_column(given_rows, c) for c in TILE_COLUMNS if c != "is_split_k"}
        tiles["is_split_k"] = _bool_column(given_rows, "is_split_k")
    if not given.all():
        chosen = choose_gemm_tiles(m[~given], n[~given], k[~given], hw, dtype)
        if given.any():
            for column in TILE_COLUMNS:
                merged = np.empty(len(frame), dtype=chosen[column].dtype)
                merged[given], merged[~given] = tiles[column], chosen[column]
                tiles[column] = merged
        else:
            tiles = chosen
    return GemmProblem.create(
        m, n, k, tiles["tile_M"], tiles["tile_N"], tiles["tile_K"], tiles["cta_count"], tiles["is_split_k"],
        data_size_bytes=1 if dtype == "fp8" else 2,
    )


def _bool_column(frame: pd.DataFrame, column: str) -> np.ndarray:
    values = frame[column]
    if values.dtype == bool:
        return values.to_numpy()
    text = values.astype(str).str.strip().str.lower()
    truthy, falsy = text.isin(["1", "1.0", "true", "yes"]), text.isin(["0", "0.0", "false", "no"])
    bad = ~(truthy | falsy)
    if bad.any():
        raise ValueError(f"column {column!r} must be 0/1 or true/false; row {int(np.flatnonzero(bad)[0])} has {values.iloc[int(np.flatnonzero(bad)[0])]!r}")
    return truthy.to_numpy()


def _gemm(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    problem = gemm_problem(frame, hw)
    calculator = gemm_sm90 if hw.uses_sm90_gemm else gemm_sm80
    return calculator.features(problem, hw)


def _gemm_fp8(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    return gemm_fp8.features(gemm_problem(frame, hw, dtype="fp8"), hw)


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


def _attention(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    """Per-row problems; FA2 rows go through the batched, bit-identical fast path (fa2_batch)."""
    bs, nh, nkv, hd = (_int_column(frame, c) for c in ("bs", "nh", "nkv", "hd"))
    keys, problems = [], []
    for i, (kind, q, kv) in enumerate(zip(frame["attention_type"], frame["q_lengths"], frame["kv_lengths"])):
        key, problem = attention_problem(
            str(kind),
            int(bs[i]),
            parse_length_list(q, "q_lengths"),
            parse_length_list(kv, "kv_lengths"),
            int(nh[i]),
            int(nkv[i]),
            int(hd[i]),
        )
        keys.append(key)
        problems.append(problem)
    out = np.zeros((len(problems), len(ATTENTION_FEATURES)))
    fa2_rows = [i for i, key in enumerate(keys) if key == "fa2"]
    if fa2_rows:
        out[fa2_rows] = fa2_batch.features_many([problems[i] for i in fa2_rows], hw)
    for i, key in enumerate(keys):
        if key != "fa2":
            out[i] = ATTENTION_CALCULATORS[key](problems[i], hw)
    return out


def _describe_gemm(operand_bytes: int, fp8: bool):
    def describe(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
        m, n, k = (_int_column(frame, c) for c in ("M", "N", "K"))
        return descriptors.gemm(m, n, k, hw, operand_bytes, hw.tc_fp8 if fp8 else hw.tc_bf16)

    return describe


def _describe_attention(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    return descriptors.attention(
        _int_column(frame, "bs"),
        [parse_length_list(v, "q_lengths") for v in frame["q_lengths"]],
        [parse_length_list(v, "kv_lengths") for v in frame["kv_lengths"]],
        _int_column(frame, "nh"), _int_column(frame, "nkv"), _int_column(frame, "hd"), hw,
    )


def _describe_elementwise(output_fraction: float):
    def describe(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
        return descriptors.elementwise(_int_column(frame, "seq"), _int_column(frame, "dim"), hw, output_fraction)

    return describe


def _describe_moe(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    kinds = frame["weight_type"].astype(str).to_numpy()
    passes = np.stack([(kinds == "w13") | (kinds == "layer"), (kinds == "w2") | (kinds == "layer")], axis=-1)
    return descriptors.moe(*(_int_column(frame, c) for c in ("M", "E", "topk", "H", "N")), hw, passes.astype(float))


def _elementwise(calculator) -> Callable[[pd.DataFrame, HardwareSpec], np.ndarray]:
    def compute(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
        problem = ElementwiseProblem.create(_int_column(frame, "seq"), _int_column(frame, "dim"))
        return calculator.features(problem, hw)

    return compute


def _moe(frame: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    """``weight_type`` w13 / w2 is one pass; ``layer`` (a whole MoE layer) is the sum of both passes."""
    dims = [_int_column(frame, c) for c in ("M", "E", "topk", "H", "N")]
    kinds = frame["weight_type"].astype(str).to_numpy()
    unknown = sorted(set(kinds) - set(MOE_WEIGHT_TYPES))
    if unknown:
        raise ValueError(f"weight_type must be one of {MOE_WEIGHT_TYPES}, got {unknown[0]!r}")
    out = np.zeros((len(frame), len(GEMM_FEATURES)))
    for pass_type in ("w13", "w2"):
        rows = (kinds == pass_type) | (kinds == "layer")
        if rows.any():
            problem = MoeProblem.create(*(d[rows] for d in dims), pass_type=pass_type)
            out[rows] += triton_moe.features(problem, hw)
    return out


OPERATORS: dict[str, OperatorClass] = {
    op.key: op
    for op in (
        OperatorClass(
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
        ),
        OperatorClass(
            key="gemm_fp8",
            description="FP8 dense GEMM (per-tensor scaled)",
            shape_columns=("M", "N", "K"),
            feature_names=GEMM_FEATURES,
            ideal_cycle_features=("tensor_all_cycle",),
            calculators={"fp8": gemm_fp8.features},
            compute=_gemm_fp8,
            descriptor_names=descriptors.GEMM_DESCRIPTORS,
            describe=_describe_gemm(1, fp8=True),
        ),
        OperatorClass(
            key="attn",
            description="FlashAttention/FlashInfer prefill and decode",
            shape_columns=("attention_type", "bs", "q_lengths", "kv_lengths", "nh", "nkv", "hd"),
            feature_names=ATTENTION_FEATURES,
            ideal_cycle_features=("tensor_all_cycle",),
            calculators=dict(ATTENTION_CALCULATORS),
            compute=_attention,
            descriptor_names=descriptors.ATTENTION_DESCRIPTORS,
            describe=_describe_attention,
        ),
        OperatorClass(
            key="rmsnorm",
            description="fused RMSNorm",
            shape_columns=("seq", "dim"),
            feature_names=ELEMENTWISE_FEATURES,
            ideal_cycle_features=("fma_all_cycle", "xu_all_cycle"),
            calculators={"rmsnorm": rmsnorm.features},
            compute=_elementwise(rmsnorm),
            descriptor_names=descriptors.ELEMENTWISE_DESCRIPTORS,
            describe=_describe_elementwise(1.0),
        ),
        OperatorClass(
            key="siluandmul",
            description="SiLU(gate)*up activation",
            shape_columns=("seq", "dim"),
            feature_names=ELEMENTWISE_FEATURES,
            ideal_cycle_features=("fma_all_cycle", "xu_all_cycle"),
            calculators={"siluandmul": siluandmul.features},
            compute=_elementwise(siluandmul),
            descriptor_names=descriptors.ELEMENTWISE_DESCRIPTORS,
            describe=_describe_elementwise(0.5),
        ),
        OperatorClass(
            key="moe",
            description="Triton fused-MoE (w13 and w2 passes)",
            shape_columns=("weight_type", "M", "E", "topk", "H", "N"),
            feature_names=GEMM_FEATURES,
            ideal_cycle_features=("tensor_all_cycle",),
            calculators={"triton_moe": triton_moe.features},
            compute=_moe,
            descriptor_names=descriptors.MOE_DESCRIPTORS,
            describe=_describe_moe,
        ),
    )
}


def get_operator(key: str) -> OperatorClass:
    try:
        return OPERATORS[key]
    except KeyError:
        raise ValueError(f"unknown operator {key!r}; known: {', '.join(OPERATORS)}") from None


def compute_features(
    op: str, frame: pd.DataFrame, hardware_dir: str | Path = DEFAULT_HARDWARE_DIR
) -> pd.DataFrame:
    """Features (float64, METHOD.md names and order), shape descriptors and ``ideal_cycles``, rows of mixed GPUs.

    ``frame`` needs the operator's shape columns and ``hardware`` (any name the hardware loader
    accepts). The result has the frame's index.
    """
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
        out[rows] = operator.features(frame.iloc[rows], hw)
        described[rows] = operator.describe(frame.iloc[rows], hw)
    result = pd.DataFrame(out, columns=list(operator.feature_names), index=frame.index)
    for i, name in enumerate(operator.descriptor_names):
        result[name] = described[:, i]
    result["ideal_cycles"] = operator.ideal_cycles(out.astype(np.float32)).astype(np.float64)
    return result


def model_inputs(features: np.ndarray) -> np.ndarray:
    """The MLP input: log1p of the float32-cast features (METHOD.md §0.3, §4.1)."""
    return np.log1p(np.asarray(features, dtype=np.float32))
