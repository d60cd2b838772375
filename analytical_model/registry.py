"""The operator registry: the single source of every per-operator fact.

Each :class:`OperatorClass` says how an operator appears in workloads (``workload_key``), which columns
describe one shape (``shape_columns``, ``optional_columns``), its calculators per architecture or
attention backend, its feature names in MLP input order (docs/METHOD.md §4.1), which features sum to the
ideal cycle count ``C_ideal`` (§4.2–4.3), its shape descriptors, and what the tools do with it
(``trainable``, ``quantile``, ``profiled``). The dataset builder, the training scripts, the profiler, the
kernel predictor, the aggregator and the reports all derive their operator lists and columns from here.

Feature functions (:mod:`analytical_model.operator_features`) take a *mapping of column name to 1-D values*
(:mod:`analytical_model.columns`: a dict of numpy arrays or lists, or a pandas DataFrame): the prediction path
never needs pandas. ``python3 -m analytical_model list`` prints
the registry.

Adding an operator = one calculator module + one :func:`register` call (or one entry in ``OPERATORS``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from . import descriptors, gemm_fp8, gemm_sm80, gemm_sm90, rmsnorm, siluandmul, triton_moe
from .attention import ATTENTION_CALCULATORS
from .columns import Columns, column_values
from .hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from .operator_features import (TILE_COLUMNS, attention, attention_cold_bytes, describe_attention, describe_elementwise,
                                describe_gemm, describe_moe, elementwise, gemm, gemm_cold_bytes, gemm_fp8_features, moe,
                                moe_cold_bytes)
from .pipes import FMA_FEATURES, MEMORY_FEATURES, TENSOR_FEATURES, XU_FEATURES, HardwareSpec, float32_sum

GEMM_FEATURES = TENSOR_FEATURES + MEMORY_FEATURES
ATTENTION_FEATURES = TENSOR_FEATURES + XU_FEATURES + MEMORY_FEATURES
ELEMENTWISE_FEATURES = FMA_FEATURES + XU_FEATURES + MEMORY_FEATURES
#: the memory-pipe feature the kernel roofline compares with the compute cycles (DRAM traffic at peak bandwidth)
DRAM_CYCLE_FEATURE = "global_cycle"
#: feature and descriptor columns inversely proportional to the per-SM tensor-core rate, all else (tiles,
#: waves, bytes) fixed: a tensor operator's features on a GPU whose tensor pipe is c times faster are these / c
TENSOR_RATE_COLUMNS = ("tensor_all_cycle", "tensor_sm_max_cycle", "exact_tensor_cycle")
#: every cycle column of the features and descriptors: (the hardware rate it divides the kernel's work by, whether
#: that rate is quoted per second) with the SM count fixed. "tensor" is the operator's tensor rate
#: (``OperatorClass.tensor_rate``); a rate per second (a bandwidth in GB/s) gives cycles that grow with the SM clock
#: (pipeweave.siblings.die_inputs: the same kernels on a GPU of the same die with other rates). A latency in time
#: takes :data:`TIME_RATE`, the same on every GPU: its cycles grow with the SM clock alone
TIME_RATE = "time"
PIPE_RATE_COLUMNS = {
    **{name: ("tensor", False) for name in TENSOR_RATE_COLUMNS},
    "xu_all_cycle": ("xu_fp32", False), "xu_sm_max_cycle": ("xu_fp32", False),
    "fma_all_cycle": ("fma_fp32", False), "fma_sm_max_cycle": ("fma_fp32", False),
    "global_cycle": ("mem_bandwidth", True), "sm_max_global_cycle": ("mem_bandwidth", True),
    "exact_dram_cycle": ("mem_bandwidth", True),
    "local_cycle": ("l2_cache_bandwidth", True), "sm_max_local_cycle": ("l2_cache_bandwidth", True),
    "sm_max_shared_cycle": ("shared_memory_bandwidth", False),
    "tile_latency_cycle": (TIME_RATE, True),
}


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
    #: the operator whose trained model predicts this one (same features), when it has no measurements of its own
    model_key: str | None = None
    #: a JSON in the ``pipeweave`` package holding a bandwidth model (pipeweave.memory_model parameters) fitted on
    #: this operator's own measurements, which predicts it on every GPU instead of ``model_key``'s MLP, with the
    #: coverage its extrapolation flag reads (pipeweave.quantize_model)
    bandwidth_model_file: str | None = None
    #: the DRAM-cycle feature counts each byte the kernel must move exactly once (no re-reads that a cache could
    #: absorb), so DRAM time at peak bandwidth is a true lower bound on the duration (pipeweave.bounds)
    dram_bound: bool = False
    #: the ``exact_dram_cycle`` descriptor counts each byte of the problem's operands and result once, so a kernel
    #: whose bytes do not fit in the L2 cannot beat their DRAM time at peak bandwidth (pipeweave.bounds)
    exact_dram_once: bool = False
    #: the HardwareSpec attribute of the per-SM tensor-core rate that the tensor-cycle columns
    #: (:data:`TENSOR_RATE_COLUMNS`) divide by; None: no tensor pipe (pipeweave.siblings)
    tensor_rate: str | None = None
    #: the pipeweave recipe's MLP reads each pipe's cycles as a share of the busiest pipe's, the busiest pipe's
    #: cycles and the shape, not log1p of every feature (pipeweave.mlp.PIPE_SHARES; docs/METHOD.md §4.1)
    pipe_share_inputs: bool = False
    #: descriptors whose values are discrete design choices of a model (MoE: the expert count and top-k): a
    #: combination of them that no training row had is extrapolation even where each lies inside its training range
    #: (pipeweave.predictor.coverage_codes; the combinations seen are in the model's metadata)
    discrete_inputs: tuple[str, ...] = ()
    #: measurement harnesses (:func:`source_family`) the pipeweave recipe's MLP tells apart from the reference one,
    #: one 0/1 input each, the last of ``descriptor_names`` (:func:`with_harness_inputs`); a prediction is 0
    harness_families: tuple[str, ...] = ()
    #: a time (us) every kernel takes besides its work (launch, prologue, tail): the pipeweave recipe's MLP
    #: predicts the efficiency of the rest, t = t0 + C_ideal / (p f) (pipeweave.mlp.total_efficiency); 0: none
    fixed_time_us: float = 0.0
    #: ``cold_bytes(columns)``: the bytes of a row's operands that a workload last touched a forward pass earlier
    #: (weights, cached KV), which no kernel of a workload reads faster than the DRAM allows, however large the L2
    #: (pipeweave.bounds.cold_fastest_us); None: every operand may be in the L2 (the previous kernel's output)
    cold_bytes: Callable[[Columns], np.ndarray] | None = None

    @property
    def model_op(self) -> str:
        """Key of the model directory (``mlp_models/<model_op>/``) that predicts this operator."""
        return self.model_key or self.key

    @property
    def int_columns(self) -> tuple[str, ...]:
        return tuple(c for c in self.shape_columns if c not in self.text_columns)

    def input_names(self, with_descriptors: bool = True) -> tuple[str, ...]:
        """MLP input columns: the docs/METHOD.md features, then (pipeweave recipe) the shape descriptors."""
        return self.feature_names + (self.descriptor_names if with_descriptors else ())

    def input_rows(self, features: np.ndarray, described: np.ndarray | None, n_inputs: int, model: str) -> np.ndarray:
        """The raw input rows of a model with ``n_inputs`` inputs (:meth:`input_names`): the features, then the
        descriptors when the model was trained with them (``model`` names it in the error when they are missing)."""
        if n_inputs <= len(self.feature_names):
            return features
        if described is None:
            raise ValueError(f"{model} needs the {self.key} shape descriptors as well as the features")
        return np.concatenate([features, described], axis=1)

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
        return float32_sum(features32[:, [self.feature_names.index(name) for name in self.ideal_cycle_features]])

    def ideal_us(self, rows: np.ndarray, sm_freq) -> np.ndarray:
        """C_ideal / f in microseconds of rows that start with the features (model input rows: descriptors may
        follow) on a GPU of SM clock ``sm_freq`` (MHz; one or per row)."""
        features32 = np.asarray(rows)[:, :len(self.feature_names)].astype(np.float32)
        return self.ideal_cycles(features32).astype(np.float64) / np.asarray(sm_freq, dtype=np.float64)

    def feature_roofline_cycles(self, columns: Columns) -> np.ndarray:
        """The *feature roofline*: max(ideal compute cycles, DRAM cycles), both analytical features at spec peaks.

        ``columns`` holds the feature columns (e.g. a dataset CSV). Not to be confused with the *shape roofline*
        of the end-to-end comparison (:mod:`pipeweave.baselines`), which uses FLOP and byte counts of the shapes.
        """
        compute = sum(np.asarray(columns[name], dtype=np.float64) for name in self.ideal_cycle_features)
        return np.maximum(compute, np.asarray(columns[DRAM_CYCLE_FEATURE], dtype=np.float64))


#: the harness whose measurements a prediction stands for (all harness inputs 0): aiconfigurator-core's collector,
#: which times vLLM's own layers as a serving engine runs them, and measured most GPUs with kernel data (BF16 GEMM
#: 9 of 11, FP8 GEMM 8 of 10)
REFERENCE_HARNESS = "aiconfigurator-core"


def source_family(source) -> str:
    """The harness a dataset row's ``source`` names: its first word (vidur, aiconfigurator-core, pipeweave, ...)."""
    words = str(source).split()
    return words[0] if words else ""


def harness_input_names(families: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{family}_harness" for family in families)


def harness_marks(sources, families: tuple[str, ...]) -> np.ndarray:
    """(rows, families) float64: 1 where a row's ``source`` names the family (:func:`source_family`), else 0."""
    named = np.array([source_family(source) for source in sources], dtype=object)
    return np.column_stack([named == family for family in families]).astype(np.float64).reshape(len(named), -1)


def with_harness_inputs(describe: Callable, families: tuple[str, ...]) -> Callable:
    """``describe`` followed by one input per harness family, 1 on a row whose ``source`` names that family.

    Two harnesses can time the same kernel on the same GPU differently (docs/ACCURACY.md, "Where measurement
    sources disagree"); with the input a model learns that difference where both measured, instead of folding it
    into the effects of a GPU that only one of them measured. Columns without ``source`` (every prediction: a
    shape, not a measurement) take 0, the :data:`REFERENCE_HARNESS`."""
    if not families:
        return describe

    def described(columns: Columns, hw: HardwareSpec) -> np.ndarray:
        shape = np.asarray(describe(columns, hw), dtype=np.float64)  # (rows, shape descriptors)
        marks = (harness_marks(column_values(columns, "source"), families) if "source" in columns
                 else np.zeros((shape.shape[0], len(families))))
        return np.concatenate([shape, marks], axis=1)

    return described


OPERATORS: dict[str, OperatorClass] = {}


def register(operator: OperatorClass) -> OperatorClass:
    """Add an operator class to the registry (the order of registration is the order of every listing)."""
    if operator.key in OPERATORS:
        raise ValueError(f"operator {operator.key!r} is already registered")
    if operator.workload_key and operator.workload_key in {op.workload_key for op in OPERATORS.values()}:
        raise ValueError(f"workload key {operator.workload_key!r} is already used")
    OPERATORS[operator.key] = operator
    return operator


def _gemm_operator(key: str, description: str, calculators: dict, compute, operand_bytes: int,
                   harness_families: tuple[str, ...] = (), **extra) -> OperatorClass:
    """BF16 and FP8 GEMM share shapes, features, shape descriptors and the ideal-cycle column."""
    return OperatorClass(
        key=key,
        description=description,
        shape_columns=("M", "N", "K"),
        feature_names=GEMM_FEATURES,
        ideal_cycle_features=("tensor_all_cycle",),
        calculators=calculators,
        compute=compute,
        descriptor_names=descriptors.GEMM_DESCRIPTORS + harness_input_names(harness_families),
        describe=with_harness_inputs(describe_gemm(operand_bytes, fp8=operand_bytes == 1), harness_families),
        harness_families=harness_families,
        quantile=True,
        profiled=True,
        exact_dram_once=True,
        cold_bytes=gemm_cold_bytes(operand_bytes),
        tensor_rate="tc_fp8" if operand_bytes == 1 else "tc_bf16",
        **extra,
    )


# A GEMM's launch, prologue and last wave's tail take about the same time whatever its work, on every GPU: fitted as
# part of the efficiency it is a per-GPU bias (held out, GEMMs under 6 us come out 1.19x too slow on H100 and 1.31x on
# A100, though H200 times the same shapes at 0.98x H100's). 1 us: below every measured GEMM (the shortest take 1.5 us)
GEMM_FIXED_TIME_US = 1.0
# on the GPUs both measured (A100, H100), Vidur's large GEMMs take 1.1-1.2x aiconfigurator's: without the input the
# model absorbs that offset into the GPU effects of the GPUs Vidur alone measured (A40)
register(_gemm_operator("gemm", "BF16 dense GEMM", {"sm80": gemm_sm80.features, "sm90": gemm_sm90.features}, gemm, 2,
                        harness_families=("vidur",), optional_columns=TILE_COLUMNS, workload_key="gemm",
                        pipe_share_inputs=True, fixed_time_us=GEMM_FIXED_TIME_US))
# H800 and H100 have the same model inputs, and PipeWeave's FP8 harness times H800 1.14x faster than
# aiconfigurator times H100 (median over 2,080 shapes), while it times H100 and H800 alike within 2 %
register(_gemm_operator("gemm_fp8", "FP8 dense GEMM (per-tensor scaled)", {"fp8": gemm_fp8.features},
                        gemm_fp8_features, 1, harness_families=("pipeweave",), dtype="fp8", workload_key="gemm_fp8",
                        fixed_time_us=GEMM_FIXED_TIME_US))
# by GEMM's rule, the largest whole us below every measured attention call (the shortest take 6.8 us on RTX PRO 6000,
# 10.5 on A100): that floor is about the same in us on every GPU, and fitted in cycles it made A100's small decodes,
# at 0.77x H100's clock, 1.2-1.3x too slow held out
ATTENTION_FIXED_TIME_US = 6.0
register(OperatorClass(
    key="attn",
    description="FlashAttention/FlashInfer prefill and decode",
    shape_columns=("attention_type", "bs", "q_lengths", "kv_lengths", "nh", "nkv", "hd"),
    text_columns=("attention_type", "q_lengths", "kv_lengths"),
    feature_names=ATTENTION_FEATURES,
    ideal_cycle_features=("tensor_all_cycle",),
    calculators=dict(ATTENTION_CALCULATORS),
    compute=attention,
    descriptor_names=descriptors.ATTENTION_DESCRIPTORS,
    describe=describe_attention,
    workload_key="attention",
    quantile=True,
    profiled=True,
    exact_dram_once=True,
    cold_bytes=attention_cold_bytes,
    tensor_rate="tc_bf16",
    pipe_share_inputs=True,
    fixed_time_us=ATTENTION_FIXED_TIME_US,
))
def elementwise_operator(key: str, description: str, calculator, output_fraction: float) -> OperatorClass:
    """RMSNorm and SiLU*Mul: one CTA per token row; ``output_fraction`` of the input width is written."""
    return OperatorClass(
        key=key,
        description=description,
        shape_columns=("seq", "dim"),
        feature_names=ELEMENTWISE_FEATURES,
        ideal_cycle_features=("fma_all_cycle", "xu_all_cycle"),
        calculators={key: calculator},
        compute=elementwise,
        descriptor_names=descriptors.ELEMENTWISE_DESCRIPTORS,
        describe=describe_elementwise(output_fraction),
        workload_key=key,
        profiled=True,
        dram_bound=True,
        exact_dram_once=True,
    )


register(elementwise_operator("rmsnorm", "fused RMSNorm", rmsnorm.features, 1.0))
register(elementwise_operator("siluandmul", "SiLU(gate)*up activation", siluandmul.features, 0.5))
# by the same rule, below every measured MoE layer (several kernels: routing, w13, activation, w2; the shortest take
# 20.7 us on L40S, 23.6 on H200, 24.3 on H100)
MOE_FIXED_TIME_US = 20.0
register(OperatorClass(
    key="moe",
    description="Triton fused-MoE (w13 and w2 passes)",
    shape_columns=("weight_type", "M", "E", "topk", "H", "N"),
    text_columns=("weight_type",),
    feature_names=GEMM_FEATURES,
    ideal_cycle_features=("tensor_all_cycle",),
    calculators={"triton_moe": triton_moe.features},
    compute=moe,
    descriptor_names=descriptors.MOE_DESCRIPTORS,
    describe=describe_moe,
    workload_key="moe",
    quantile=True,
    cold_bytes=moe_cold_bytes,
    exact_dram_once=True,
    tensor_rate="tc_bf16",
    pipe_share_inputs=True,
    discrete_inputs=("experts", "top_k"),
    fixed_time_us=MOE_FIXED_TIME_US,
))
# The BF16 -> FP8 activation pass before an FP8 GEMM reads a row, reduces it to a scale and writes it scaled:
# the structure of RMSNorm, whose features describe it. It is predicted by the bandwidth model fitted on
# aiconfigurator-core's measurements of it (pipeweave.quantize_model); RMSNorm's model, which predicted it before
# they were used, stays its model_key for what the model files carry (the physical band, the calibration class).
# Its exact bytes are a BF16 read and an FP8 write (half the bytes of a BF16 one): beyond twice the L2 they bound it as
# they bound RMSNorm (no measured row passes 0.90 of their DRAM time there; counted as reads only, predictions on
# L4, L40 and RTX 6000 Ada of 1.5 GB came out 1.2x faster than DRAM allows).
register(replace(
    OPERATORS["rmsnorm"],
    key="quantize",
    description="BF16 -> FP8 activation quantisation (bandwidth model fitted on its measurements)",
    bandwidth_model_file="quantize_bandwidth.json",
    workload_key="quantize",
    calculators={"quantize": rmsnorm.features},
    describe=describe_elementwise(0.5),
    trainable=False,
    profiled=False,
    model_key="rmsnorm",
))


def get_operator(key: str) -> OperatorClass:
    try:
        return OPERATORS[key]
    except KeyError:
        raise ValueError(f"unknown operator {key!r}; known: {', '.join(OPERATORS)}") from None


def operator_keys(*, trainable: bool | None = None, quantile: bool | None = None, profiled: bool | None = None
                  ) -> tuple[str, ...]:
    """Registry keys, in registration order, filtered by the given properties."""
    wanted = {"trainable": trainable, "quantile": quantile, "profiled": profiled}
    return tuple(
        op.key for op in OPERATORS.values()
        if all(value is None or getattr(op, name) == value for name, value in wanted.items())
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
    hardware = frame["hardware"].astype(object).fillna("").astype(str).to_numpy()
    for name in pd.unique(hardware):
        rows = np.flatnonzero(hardware == name)
        try:
            hw = registry.get(name)
        except ValueError as exc:
            raise ValueError(f"row {rows[0] + 1}: {exc}") from None
        part = frame.iloc[rows]
        out[rows] = operator.features(part, hw)
        described[rows] = operator.descriptors(part, hw)
    result = pd.DataFrame(out, columns=list(operator.feature_names), index=frame.index)
    for i, name in enumerate(operator.descriptor_names):
        result[name] = described[:, i]
    result["ideal_cycles"] = operator.ideal_cycles(out.astype(np.float32)).astype(np.float64)
    return result


def shape_columns_help() -> str:
    """One line for --help: every operator key with its shape columns (lists written "[a,b]")."""
    return "; ".join(f"{key}: {','.join(op.shape_columns)}" for key, op in OPERATORS.items()) + \
        ' (list columns written "[a,b]")'
