"""Per-kernel duration prediction: registry features → float32 → input transform (docs/METHOD.md §4.1: log1p, or
pipe shares for BF16 GEMM, attention and MoE) → MLP → duration (docs/METHOD.md §4.3).

``KernelPredictor`` loads the newest model directory per operator class once (the exported numpy weights of
:mod:`pipeweave.mlp`: no torch) and predicts whole batches of shapes in one forward pass per operator. pandas is
needed only by the frame methods (dataset CSVs, the accuracy report), not by :meth:`predict_columns` (the
``predict_kernels`` tool and the Python API) or the aggregator.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import compute_features, get_operator
from pipeweave import memory_model, quantize_model
from pipeweave.bounds import clip_efficiency, fastest_us, has_regime_medians, l2_cycles, regime_efficiency
from pipeweave.edges import model_edges
from pipeweave.mlp import DISCRETE_INPUTS_KEY, NumpyMLP, latest_model_dir, load_model_dir
from pipeweave.moe import MOE_SHAPE_DESCRIPTORS, pass_fastest_us, pass_shares
from pipeweave.paths import DEFAULT_MODEL_DIR
from pipeweave.siblings import die_band, die_rows, die_sibling, sibling_band, sibling_of, tensor_rate_ratio

if TYPE_CHECKING:
    import pandas as pd


#: extrapolation bits (docs/METHOD.md §4.3): no training GPU has the GPU's architecture in the sense that decides
#: which kernels run, its SM design (compute capability; A40's 8.6 is not A100's 8.0); a model input (feature or
#: shape descriptor) lies outside the range it took in training; the members of an ensemble disagree more than
#: on 99 % of held-out shapes of their training GPUs (the inputs are inside the box of the training ranges, but
#: their combination is not like the training rows); a pipe share a pipe-share model reads lies outside its
#: training range, so the edge bounds of :mod:`pipeweave.edges` act on the prediction (the balance of the pipes
#: is unlike any training row's, although each raw input may be inside its range)
UNSEEN_ARCHITECTURE, OUTSIDE_RANGE, MEMBERS_DISAGREE, BEYOND_SHARES = 1, 2, 4, 8
EXTRAPOLATION_BITS = {UNSEEN_ARCHITECTURE: "architecture", OUTSIDE_RANGE: "range", MEMBERS_DISAGREE: "members",
                      BEYOND_SHARES: "shares"}
#: relative slack on the training range: features are float32 in training, float64 here
RANGE_TOLERANCE = 1e-5


def extrapolation_label(code: int) -> str:
    """'' for a covered row, else its bits' names joined by '+', e.g. ``range+members``."""
    return "+".join(name for bit, name in EXTRAPOLATION_BITS.items() if int(code) & bit)


def training_gpus(names, hardware) -> list:
    """The hardware specs of a model's training GPUs (``names``, from its metadata): from the registry ``hardware``
    or, for a GPU it lacks, the shipped one (a ``--hardware_dir`` of the user's own GPUs alone must not make every
    SM design look unseen and drop the sibling bounds). A name neither describes (the placeholder of the benchmarks'
    untrained models) contributes no SM design, which only makes more GPUs count as unseen."""
    shipped = None
    specs = []
    for name in sorted(names):
        if name in hardware:
            specs.append(hardware.get(name))
            continue
        shipped = shipped or hardware_registry(DEFAULT_HARDWARE_DIR)
        if name in shipped:
            specs.append(shipped.get(name))
    return specs


def training_coverage(metadata: dict, hardware, where: str, op: str) -> tuple:
    """(SM designs: the compute capabilities, input minima, input maxima, discrete combinations) of a model's
    training data from its metadata (``hardware``: the registry that names the training GPUs' compute capabilities,
    :func:`training_gpus`; ``where`` names the file in errors). The last is None for an operator without discrete
    inputs (registry ``discrete_inputs``), else (their positions among the inputs, the set of combinations seen)."""
    names = metadata.get("data_info", {}).get("train_hardware_distribution")
    ranges = metadata.get("feature_ranges")
    if not names or not ranges:
        raise ValueError(f"{where} lacks data_info.train_hardware_distribution or feature_ranges; retrain with: "
                         f"python3 train_mlp.py --op {op}")
    sm_designs = frozenset(spec.compute_capability for spec in training_gpus(names, hardware))
    inputs = metadata["model_info"]["features"]
    return (sm_designs, *_tolerant_range([ranges[name]["min"] for name in inputs],
                                         [ranges[name]["max"] for name in inputs]),
            discrete_coverage(metadata, inputs, where, op))


def discrete_coverage(metadata: dict, inputs: list[str], where: str, op: str) -> tuple[list[int], np.ndarray] | None:
    """(positions of the operator's discrete inputs among ``inputs``, the combinations of them the training rows
    held, one per row), from the model's metadata; None for an operator without discrete inputs."""
    discrete = list(get_operator(op).discrete_inputs)
    if not discrete:
        return None
    entry = metadata.get(DISCRETE_INPUTS_KEY)
    seen = None
    if isinstance(entry, dict) and entry.get("inputs") == discrete and set(discrete) <= set(inputs):
        try:
            seen = np.array(entry["seen"], dtype=np.float64)
        except (KeyError, TypeError, ValueError):  # absent, or not a table of numbers
            pass
    if seen is None or seen.ndim != 2 or seen.shape[1] != len(discrete) or not np.isfinite(seen).all():
        raise ValueError(f"{where} lacks a valid {DISCRETE_INPUTS_KEY} for {', '.join(discrete)}; write it with: "
                         f"python3 -m pipeweave.edges {Path(where).parent} (in the checkout whose dataset trained it), "
                         f"or retrain")
    return [inputs.index(name) for name in discrete], seen


def _tolerant_range(low, high) -> tuple[np.ndarray, np.ndarray]:
    """Input minima and maxima of training data widened by RANGE_TOLERANCE, the range a row is covered inside."""
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    return low - RANGE_TOLERANCE * np.abs(low), high + RANGE_TOLERANCE * np.abs(high)


def stored_bandwidth_fit(op: str) -> dict | None:
    """The bandwidth fit stored for ``op`` (registry ``bandwidth_model_file``; :mod:`pipeweave.quantize_model`), which
    predicts it on every GPU instead of an MLP; None for an operator predicted by its MLP."""
    stored = get_operator(op).bandwidth_model_file
    return None if stored is None else quantize_model.load(stored)


def stored_coverage(record: dict) -> tuple:
    """:func:`training_coverage` of a stored bandwidth fit's ``coverage`` (:mod:`pipeweave.quantize_model`)."""
    return (frozenset(tuple(c) for c in record["compute_capabilities"]),
            *_tolerant_range(record["min"], record["max"]), None)


def disagreement_codes(spread: np.ndarray, threshold: float) -> np.ndarray:
    """MEMBERS_DISAGREE where the members' disagreement exceeds the ensemble's threshold."""
    return np.where(spread > threshold, MEMBERS_DISAGREE, 0).astype(np.int8)


def coverage_codes(coverage: tuple, features: np.ndarray, described: np.ndarray | None,
                   compute_capability: tuple[int, int]) -> np.ndarray:
    """UNSEEN_ARCHITECTURE | OUTSIDE_RANGE per row of a GPU of ``compute_capability`` against a
    :func:`training_coverage`: OUTSIDE_RANGE where an input lies outside its training range or the combination of
    the discrete inputs is not one the training rows held."""
    sm_designs, low, high, discrete = coverage
    inputs = features
    if len(low) > features.shape[1]:
        inputs = np.concatenate([features, described], axis=1)
    outside = ((inputs < low) | (inputs > high)).any(axis=1)
    if discrete is not None:
        positions, seen = discrete
        outside |= ~(inputs[:, None, positions] == seen[None]).all(axis=2).any(axis=1)
    codes = np.where(outside, OUTSIDE_RANGE, 0).astype(np.int8)
    if tuple(compute_capability) not in sm_designs:
        codes |= UNSEEN_ARCHITECTURE
    return codes


def bandwidth_efficiency(parameters: dict, op: str, features: np.ndarray, hw) -> np.ndarray:
    """The efficiency of a memory-bound operator's feature rows on ``hw`` by the bandwidth model
    (:mod:`pipeweave.memory_model`, fitted ``parameters``)."""
    ideal = get_operator(op).ideal_cycles(features.astype(np.float32)).astype(np.float64)
    duration = memory_model.duration_us(parameters, op, features, hw.sm_freq, hw.max_threads_per_sm)
    return ideal / (duration * hw.sm_freq)


def duration_us(ideal_cycles: np.ndarray, efficiency: np.ndarray, sm_freq_mhz: np.ndarray) -> np.ndarray:
    """C_ideal / (overall_perf × f): cycles over (efficiency × MHz) gives microseconds."""
    return np.asarray(ideal_cycles, dtype=np.float64) / (np.asarray(efficiency) * np.asarray(sm_freq_mhz))


#: the hardware JSON values the analytical features read: a JSON that gives a trained GPU's name with other values
#: describes another GPU than the one the models were trained on
FEATURE_SPEC_FIELDS = ("num_sms", "sm_freq", "mem_bandwidth", "l2_cache_bandwidth", "shared_memory_bandwidth",
                       "shared_memory_size", "tc_bf16", "tc_fp8", "xu_fp32", "fma_fp32", "compute_capability")


def respecified_fields(spec, hardware_dir: Path) -> list[str]:
    """The :data:`FEATURE_SPEC_FIELDS` in which ``spec``, read from ``hardware_dir``, differs from the shipped JSON of
    the GPU of its name (none for the shipped folder itself or a GPU it does not have)."""
    if Path(hardware_dir).resolve() == Path(DEFAULT_HARDWARE_DIR).resolve():
        return []
    shipped = hardware_registry(DEFAULT_HARDWARE_DIR)
    if spec.name not in shipped:
        return []
    reference = shipped.get(spec.name)
    return [field for field in FEATURE_SPEC_FIELDS if getattr(spec, field) != getattr(reference, field)]


class KernelPredictor:
    """Loads ``<model_dir>/<op>/<latest timestamp>/`` per operator on first use."""

    def __init__(
        self,
        model_dir: str | Path = DEFAULT_MODEL_DIR,
        hardware_dir: str | Path = DEFAULT_HARDWARE_DIR,
        quantile: bool = False,
    ):
        self.model_dir = Path(model_dir)
        self.quantile = quantile  # reads the upper-efficiency models of train_mlp_quantile.py, not point models
        self.hardware_dir = Path(hardware_dir)
        self.hardware = hardware_registry(self.hardware_dir)
        # GPUs this folder names as a trained GPU but describes otherwise (an edited copy of a shipped JSON): their
        # kernels were never measured as described, so they are predicted as GPUs outside training
        self.respecified = {spec.name: fields for spec in self.hardware.specs.values()
                            if (fields := respecified_fields(spec, self.hardware_dir))}
        self._models: dict[str, tuple] = {}
        self._coverage: dict[str, tuple] = {}
        #: (op, hardware stem) -> (fine-tuned model, the range its log change is kept within or None)
        self._fine_tuned: dict[tuple[str, str], tuple[NumpyMLP, tuple[float, float] | None]] = {}

    def model(self, op: str):
        """(model, metadata, directory) for ``op``; a missing model is an error naming the file."""
        if op not in self._models:
            operator = get_operator(op)
            directory = latest_model_dir(self.model_dir, operator.model_op)
            model, metadata = load_model_dir(directory, operator.model_op)
            if (metadata.get("training", {}).get("recipe") == "quantile") != self.quantile:
                # trained into the other kind's folder, it would silently stand in for the model asked for
                kind, wanted, flag = (("a point", "quantile", "--model_dir") if self.quantile
                                      else ("a quantile", "point", "--quantile_dir"))
                raise ValueError(f"{directory} holds {kind} model, where {wanted} models are read; give its folder "
                                 f"as {flag}")
            names = metadata["model_info"]["features"]
            if names not in (list(operator.input_names(True)), list(operator.input_names(False))):
                raise ValueError(f"{directory}/metadata.json: its features are not the registry's {op} inputs")
            model.edges = model_edges(operator.model_op, metadata, str(directory))
            self._models[op] = (model, metadata, directory)
        return self._models[op]

    def efficiency_from_features(self, op: str, features: np.ndarray, described: np.ndarray | None,
                                 sm_freq: float | np.ndarray) -> np.ndarray:
        """The MLP's efficiency from the pipe features and (for models trained with them) the shape descriptors, on
        a GPU of SM clock ``sm_freq`` (MHz)."""
        return self.efficiency_and_spread(op, features, described, sm_freq)[0]

    def efficiency_and_spread(self, op: str, features: np.ndarray, described: np.ndarray | None,
                              sm_freq: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`efficiency_from_features`, the members' disagreement: :meth:`NumpyMLP.efficiency_and_spread`)."""
        return self.model(op)[0].efficiency_and_spread(self.model_inputs(op, features, described), sm_freq)

    def model_inputs(self, op: str, features: np.ndarray, described: np.ndarray | None) -> np.ndarray:
        """The model's raw input rows: the pipe features, then (for models trained with them) the descriptors."""
        _, metadata, directory = self.model(op)
        return get_operator(op).input_rows(features, described, len(metadata["model_info"]["features"]), directory)

    def use_fine_tuned(self, calibration) -> None:
        """Predict the GPU of ``calibration`` (:class:`pipeweave.calibration.Calibration`) with the models it
        fine-tuned on that GPU's kernels (:mod:`pipeweave.finetune`); every other GPU keeps the shipped models."""
        for op, model in calibration.fine_tuned_models().items():
            self._fine_tuned[(op, calibration.hardware)] = (model, calibration.trusted_log_change(op))

    @contextmanager
    def fine_tuned_by(self, calibration):
        """:meth:`use_fine_tuned` for the duration of a ``with`` block (nothing without a calibration)."""
        saved = dict(self._fine_tuned)
        if calibration is not None:
            self.use_fine_tuned(calibration)
        try:
            yield self
        finally:
            self._fine_tuned = saved

    def trained_on(self, op: str) -> frozenset:
        """Names of the GPUs in the model's training data (``data_info.train_hardware_distribution``; for an
        operator with a stored bandwidth fit, the GPUs it was fitted on), less those this folder respecifies."""
        return self._training_names(op) - set(self.respecified)

    def respecified_warning(self, hw) -> str | None:
        """The WARNING for a GPU :attr:`respecified` (None for any other)."""
        fields = self.respecified.get(hw.name)
        if not fields:
            return None
        return (f"WARNING: {hw.stem}.json in {self.hardware_dir} gives {hw.name!r}, a GPU the models were trained on, "
                f"other values ({', '.join(fields)}) than pipeweave's own JSON of that GPU: it is predicted as a "
                f"GPU outside training (zero-shot, with that state's intervals); give it a name of its own if it is "
                f"another GPU")

    def kernel_efficiency(self, op: str, features: np.ndarray, described: np.ndarray | None, hw,
                          band: dict | None = None) -> np.ndarray:
        """Efficiency of feature rows on the GPU ``hw``: :meth:`unbounded_efficiency` kept inside the physical band
        of :mod:`pipeweave.bounds` (before any calibration; ``band``: a band table other than the shipped one)."""
        return self._within_band(op, self.unbounded_efficiency(op, features, described, hw), features, described,
                                 hw, band)

    @staticmethod
    def _within_band(op: str, efficiency: np.ndarray, features: np.ndarray, described: np.ndarray | None, hw,
                     band: dict | None = None) -> np.ndarray:
        return clip_efficiency(op, efficiency, features, described, hw.sm_freq, band, l2=l2_cycles(hw))[0]

    def kernel_efficiency_and_codes(self, op: str, features: np.ndarray, described: np.ndarray | None, hw
                                    ) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`kernel_efficiency`, :meth:`extrapolation` bits with MEMBERS_DISAGREE where the ensemble that
        gave the efficiency disagrees beyond its threshold), from one forward pass."""
        efficiency, spread = self._unbounded(op, features, described, hw)
        codes = self.extrapolation(op, features, described, hw.compute_capability)
        threshold = self.member_spread_threshold(op)
        if threshold is not None:
            codes |= disagreement_codes(spread, threshold)
        return self._within_band(op, efficiency, features, described, hw), codes

    def member_spread_threshold(self, op: str) -> float | None:
        """The ensemble's disagreement threshold (metadata ``member_spread``; :mod:`pipeweave.ensemble`); None for
        a single model, which has no members to disagree."""
        _, metadata, directory = self.model(op)
        if "ensemble" not in metadata:
            return None
        if "member_spread" not in metadata:
            raise ValueError(f"{directory}/metadata.json lacks member_spread; write it with: "
                             f"python3 -m pipeweave.ensemble {directory}")
        return float(metadata["member_spread"]["threshold"])

    def unbounded_efficiency(self, op: str, features: np.ndarray, described: np.ndarray | None, hw) -> np.ndarray:
        """The MLP's efficiency, except where it carries no information. A memory-bound operator on a GPU outside
        its MLP's training data takes the bandwidth model of :mod:`pipeweave.memory_model` (stored with the model),
        and so does each of its rows with an input outside the MLP's training range on a trained GPU, anchored to the
        MLP at the edge of that range (:meth:`_beyond_range`; the MLP's log-efficiency drifts there: H100's RMSNorm
        of 131,072 tokens came out 2.1x faster than its bytes allow, while a streaming kernel's time only grows
        with its bytes).
        An MLP trained on a single GPU saw constant hardware inputs, so it knows nothing of how efficiency depends
        on the GPU: on another GPU the kernel takes the median efficiency of its regime
        (:func:`pipeweave.bounds.regime_efficiency`; only a GPU of the hardware directory counts, and only an
        operator with measured medians). On a GPU outside training whose SM design is trained at another tensor
        rate (H20 beside H100), the MLP's efficiency is kept inside the band of :mod:`pipeweave.siblings`; on one
        outside training whose compute capability and SM count a trained GPU has (A100 40GB beside A100 80GB, an
        edited copy of a trained GPU's JSON), the result is then kept within the pipe-rate ratios of the same kernels
        on that GPU (:func:`pipeweave.siblings.die_band`)."""
        return self._unbounded(op, features, described, hw)[0]

    def _unbounded(self, op: str, features: np.ndarray, described: np.ndarray | None, hw
                   ) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`unbounded_efficiency`, the members' disagreement; 0 where no MLP gave the efficiency), a fused-MoE
        layer over more tokens than any training row's kept within :meth:`_split_tokens`' bounds."""
        efficiency, spread = self._model_efficiency(op, features, described, hw)
        if op == "moe" and described is not None and len(efficiency):
            efficiency = self._split_tokens(op, efficiency, features, described, hw)
        return efficiency, spread

    def _split_tokens(self, op: str, efficiency: np.ndarray, features: np.ndarray, described: np.ndarray, hw
                      ) -> np.ndarray:
        """Efficiency of fused-MoE layers whose token count M exceeds the largest of the model's training rows
        (16,384: aiconfigurator's grid; one static prefill pass of Qwen3-30B-A3B reaches 262,144), kept between two
        predictions made inside the trained range. The same tokens run as n = ceil(M / M_max) launches of
        ceil(M / n) tokens each take at least as long as one launch over all of them (each launch re-reads the
        experts' weights and pays its own tail; vLLM itself splits a large batch into chunks this way), and one
        launch over more tokens takes no less than over M_max of them. Beyond the range the MLP's efficiency drifts
        (L40S: 2.7x the time for twice 131,072 tokens)."""
        operator = get_operator(op)
        limit = math.floor(self.model(op)[1]["feature_ranges"]["shape_M"]["max"])
        tokens = described[:, operator.descriptor_names.index("shape_M")]
        rows = np.flatnonzero(tokens > limit)
        if not len(rows):
            return efficiency
        shape = {column: np.rint(described[rows, operator.descriptor_names.index(name)]).astype(np.int64)
                 for column, name in MOE_SHAPE_DESCRIPTORS.items()}
        launches = np.ceil(shape["M"] / limit)
        chunk_us = self._layer_us(op, dict(shape, M=np.ceil(shape["M"] / launches).astype(np.int64)), hw) * launches
        edge_us = np.minimum(self._layer_us(op, dict(shape, M=np.full(len(rows), limit)), hw), chunk_us)
        ideal = operator.ideal_cycles(features[rows].astype(np.float32)).astype(np.float64)
        own_us = duration_us(ideal, efficiency[rows], hw.sm_freq)
        out = np.array(efficiency, dtype=np.float64)
        out[rows] = ideal / (np.clip(own_us, edge_us, chunk_us) * hw.sm_freq)
        return out

    def _layer_us(self, op: str, shape: dict, hw) -> np.ndarray:
        """Predicted µs of whole fused-MoE layers of ``shape`` (M, E, topk, H, N columns) inside the band."""
        operator = get_operator(op)
        columns = dict(shape, weight_type=["layer"] * len(shape["M"]))
        features, described = operator.features(columns, hw), operator.descriptors(columns, hw)
        efficiency = self._within_band(op, self._model_efficiency(op, features, described, hw)[0], features,
                                       described, hw)
        return duration_us(operator.ideal_cycles(features.astype(np.float32)), efficiency, hw.sm_freq)

    def _model_efficiency(self, op: str, features: np.ndarray, described: np.ndarray | None, hw
                          ) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`_unbounded` before the MoE token bound, the members' disagreement). A calibration's fine-tuned
        model changes the shipped model's efficiency (inside the physical band) only within the range of the changes
        it made on the measured kernels (:func:`pipeweave.finetune.trusted_efficiency`)."""
        model, log_change = self._fine_tuned.get((op, hw.stem), (None, None))
        if model is not None and log_change is None:  # a file before format 6: its model was chosen unbounded
            return model.efficiency_and_spread(self.model_inputs(op, features, described), hw.sm_freq)
        efficiency, spread = self._untuned(op, features, described, hw)
        die = self.die_sibling(op, hw)
        if die is not None and len(efficiency):
            # the same kernels on the trained GPU of the same die, as the predictor gives them there (its own model,
            # not a calibration's fine-tuning of it, which corrects that GPU alone)
            efficiency = np.clip(efficiency, *die_band(op, features, described, hw, die, lambda rows, shapes:
                                                       self._untuned(op, rows, shapes, die, as_trained=True)[0],
                                                       die_rows(op, features, described, hw, die)))
        if model is not None:
            from pipeweave.finetune import trusted_efficiency

            tuned, spread = model.efficiency_and_spread(self.model_inputs(op, features, described), hw.sm_freq)
            base = self._within_band(op, efficiency, features, described, hw)
            efficiency = trusted_efficiency(base, tuned, log_change)
        return efficiency, spread

    def _untuned(self, op: str, features: np.ndarray, described: np.ndarray | None, hw, as_trained: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_unbounded` without a calibration's fine-tuned model and without the bound of the same die;
        ``as_trained``: ``hw`` is a training GPU as the model saw it (the spec of :meth:`die_sibling`, which for a GPU
        whose JSON this folder gives other values is the shipped one)."""
        stored = stored_bandwidth_fit(op)
        if stored is not None:  # fitted on the operator's own measurements, every GPU
            return bandwidth_efficiency(stored["parameters"], op, features, hw), np.zeros(len(features))
        _, metadata, _ = self.model(op)
        parameters = metadata.get("memory_model")
        trained = self.trained_on(op)
        seen = as_trained or hw.name in trained
        none = np.zeros(len(features))
        if parameters and not seen:
            return bandwidth_efficiency(parameters, op, features, hw), none
        if not seen and len(training_gpus(trained, self.hardware)) == 1 and has_regime_medians(op):
            return regime_efficiency(op, features, hw.sm_freq), none
        efficiency, spread = self.efficiency_and_spread(op, features, described, hw.sm_freq)
        if parameters and len(efficiency):
            outside = (coverage_codes(self.coverage(op), features, described, hw.compute_capability)
                       & OUTSIDE_RANGE).astype(bool)
            if outside.any():
                efficiency[outside] = self._beyond_range(op, parameters, features[outside], described[outside], hw)
                spread[outside] = 0.0
        scale = None if as_trained else self.sibling_scale(op, hw)
        if scale is not None and len(efficiency):
            efficiency = np.clip(efficiency, *sibling_band(op, features, described, scale, lambda rows, shapes:
                                                           self.efficiency_from_features(op, rows, shapes, hw.sm_freq)))
        return efficiency, spread

    def _beyond_range(self, op: str, parameters: dict, features: np.ndarray, described: np.ndarray, hw) -> np.ndarray:
        """Efficiency of memory-bound rows outside the MLP's training range on a trained GPU: the bandwidth model's
        trend, anchored to the MLP at the same shape clipped into the trained shapes (so the time is continuous at
        the edge and grows with the bytes beyond it); the bandwidth model alone where even the clipped shape lies
        outside the range."""
        operator = get_operator(op)
        ranges = self.model(op)[1]["feature_ranges"]
        edge = {}
        for column in operator.shape_columns:
            name = f"shape_{column}"
            low, high = math.ceil(ranges[name]["min"]), math.floor(ranges[name]["max"])
            edge[column] = np.clip(described[:, operator.descriptor_names.index(name)], low, high).astype(np.int64)
        edge_features, edge_described = operator.features(edge, hw), operator.descriptors(edge, hw)
        beyond = bandwidth_efficiency(parameters, op, features, hw)
        anchor = self.efficiency_and_spread(op, edge_features, edge_described, hw.sm_freq)[0] / bandwidth_efficiency(
            parameters, op, edge_features, hw)
        covered = (coverage_codes(self.coverage(op), edge_features, edge_described, hw.compute_capability)
                   & OUTSIDE_RANGE) == 0
        return np.where(covered, beyond * anchor, beyond)

    def sibling(self, op: str, hw):
        """The trained GPU whose tensor rate bounds ``hw``'s predictions of ``op``
        (:func:`pipeweave.siblings.sibling_of` among the model's training GPUs); None on one of them, whose own
        data pin the model down, and where a calibration fine-tuned the model on ``hw``'s kernels."""
        if self.measured_on(op, hw):
            return None
        return sibling_of(op, hw, training_gpus(self.trained_on(op), self.hardware))

    def measured_on(self, op: str, hw) -> bool:
        """Whether ``op``'s model has measurements of ``hw``: in its training data, or through a calibration that
        fine-tuned it on ``hw``'s kernels."""
        return hw.name in self.trained_on(op) or (op, hw.stem) in self._fine_tuned

    def die_sibling(self, op: str, hw):
        """The trained GPU of ``hw``'s compute capability and SM count that bounds its predictions of ``op``
        (:func:`pipeweave.siblings.die_sibling` among the model's training GPUs); None on a GPU with measurements of
        ``op`` (:meth:`measured_on`), for an operator with a stored bandwidth fit (every GPU takes the same fit) and
        without such a GPU."""
        if self.measured_on(op, hw) or stored_bandwidth_fit(op) is not None:
            return None
        return die_sibling(op, hw, self.trained_specs(op))

    def trained_specs(self, op: str) -> list:
        """The specs of ``op``'s training GPUs as the model saw them: :func:`training_gpus`, and for a training GPU
        whose JSON this folder gives other values (:attr:`respecified`) the shipped JSON of it (an edited copy of a
        trained GPU is then bounded by that GPU, as a renamed one is)."""
        specs = training_gpus(self.trained_on(op), self.hardware)
        respecified = sorted(set(self.respecified) & set(self._training_names(op)))
        if respecified:
            shipped = hardware_registry(DEFAULT_HARDWARE_DIR)
            specs += [shipped.get(name) for name in respecified]
        return specs

    def _training_names(self, op: str) -> frozenset:
        """Names of the GPUs ``op``'s model was trained on (``data_info.train_hardware_distribution``; for an
        operator with a stored bandwidth fit, the GPUs it was fitted on), those this folder respecifies included."""
        stored = stored_bandwidth_fit(op)
        if stored is not None:
            return frozenset(stored["fitted_on"])
        return frozenset(self.model(op)[1].get("data_info", {}).get("train_hardware_distribution", {}))

    def sibling_scale(self, op: str, hw) -> float | None:
        """``r_target / r_sibling`` of :meth:`sibling` (None without one)."""
        sibling = self.sibling(op, hw)
        return None if sibling is None else tensor_rate_ratio(op, hw, sibling)

    def kernel_rows(self, op: str, features: np.ndarray, described: np.ndarray, gpus: Sequence[str]
                    ) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`kernel_efficiency`, :meth:`extrapolation` bits) of feature rows on the GPUs ``gpus[row]``."""
        names = np.asarray(list(gpus), dtype=object)
        efficiency, codes = np.zeros(len(names)), np.zeros(len(names), dtype=np.int8)
        for name in dict.fromkeys(names.tolist()):
            rows = np.flatnonzero(names == name)
            efficiency[rows], codes[rows] = self.kernel_efficiency_and_codes(op, features[rows], described[rows],
                                                                             self.hardware.get(name))
        return efficiency, codes

    def coverage(self, op: str) -> tuple:
        """(compute capabilities, input minima, input maxima, discrete combinations) of the model's training data,
        from its metadata (:func:`training_coverage`)."""
        if op not in self._coverage:
            stored = stored_bandwidth_fit(op)
            if stored is not None:
                self._coverage[op] = stored_coverage(stored["coverage"])
            else:
                _, metadata, directory = self.model(op)
                self._coverage[op] = training_coverage(metadata, self.hardware, f"{directory}/metadata.json", op)
        return self._coverage[op]

    def extrapolation(self, op: str, features: np.ndarray, described: np.ndarray | None,
                      compute_capability: tuple[int, int]) -> np.ndarray:
        """Per row of a GPU of ``compute_capability``, the bits UNSEEN_ARCHITECTURE | OUTSIDE_RANGE | BEYOND_SHARES
        (0: covered by training); the prediction paths add MEMBERS_DISAGREE (:meth:`kernel_efficiency_and_codes`)."""
        codes = coverage_codes(self.coverage(op), features, described, compute_capability)
        if stored_bandwidth_fit(op) is not None:  # no MLP, no pipe-share edges
            return codes
        model = self.model(op)[0]
        if model.edges is None or len(features) == 0:
            return codes
        beyond = model.edges.beyond(model.inputs(self.model_inputs(op, features, described)))
        return codes | np.where(beyond, BEYOND_SHARES, 0).astype(np.int8)

    def efficiency_from_frame(self, op: str, frame: pd.DataFrame) -> np.ndarray:
        """Efficiency for a frame that holds the feature (and descriptor) columns, e.g. a dataset CSV."""
        model, metadata, _ = self.model(op)
        inputs = frame[metadata["model_info"]["features"]].to_numpy(np.float64)
        return model.efficiency(inputs, frame["sm_freq"].to_numpy(np.float64))

    def predict_frame(self, op: str, frame: pd.DataFrame) -> pd.DataFrame:
        """Features, ideal cycles, predicted efficiency, ``predicted_us`` and the ``extrapolation`` bits for rows of
        shapes + ``hardware``."""
        features = compute_features(op, frame, self.hardware_dir)
        operator = get_operator(op)
        # every descriptor, as predict_columns passes them: the physical band reads them also for a model trained
        # without them (the reference and quantile recipes), whose own inputs are the features alone
        pipes = features[list(operator.feature_names)].to_numpy(np.float64)
        described = features[list(operator.descriptor_names)].to_numpy(np.float64)
        efficiency, codes = self.kernel_rows(op, pipes, described, frame["hardware"].tolist())
        sm_freq = frame["hardware"].map(lambda name: self.hardware.get(name).sm_freq).to_numpy(np.float64)
        features["predicted_perf"] = efficiency
        features["extrapolation"] = codes
        features["predicted_us"] = duration_us(features["ideal_cycles"].to_numpy(), efficiency, sm_freq)
        return features

    def predict_columns(self, op: str, columns: Mapping[str, Sequence], hardware: Sequence[str],
                        calibration=None, with_extrapolation: bool = False):
        """Predicted µs per row of a column mapping (the operator's shape columns) on ``hardware[row]``; a
        ``calibration`` (:class:`pipeweave.calibration.Calibration`) corrects the rows of its own GPU only (after
        the physical band); with ``with_extrapolation``, (µs, extrapolation bits) per row."""
        out, codes, _ = self.predict_columns_bounded(op, columns, hardware, calibration)
        return (out, codes) if with_extrapolation else out

    def predict_columns_bounded(self, op: str, columns: Mapping[str, Sequence], hardware: Sequence[str],
                                calibration=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(:meth:`predict_columns` µs, extrapolation bits, the fastest µs the physical band allows each row:
        :func:`pipeweave.bounds.fastest_us`, a pass's share of it for an MoE pass)."""
        with self.fine_tuned_by(calibration):
            return self._predict_columns(op, columns, hardware, calibration)

    def _predict_columns(self, op: str, columns: Mapping[str, Sequence], hardware: Sequence[str], calibration
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        operator = get_operator(op)
        names = np.asarray(list(hardware), dtype=object)
        out, fastest = np.zeros(len(names)), np.zeros(len(names))
        codes = np.zeros(len(names), dtype=np.int8)
        for name in dict.fromkeys(names.tolist()):
            rows = np.flatnonzero(names == name)
            hw = self.hardware.get(name)
            part = {column: [values[i] for i in rows] for column, values in columns.items()}
            shapes = list(zip(*(part[column] for column in operator.shape_columns)))
            modelled, share = part, 1.0
            if op == "moe":  # a pass is its share of the whole layer's prediction, as the engine predicts it
                modelled = dict(part, weight_type=["layer"] * len(rows))
                share = pass_shares([(hw.stem, shape) for shape in shapes], self.hardware)
            features, described = operator.features(modelled, hw), operator.descriptors(modelled, hw)
            ideal = operator.ideal_cycles(features.astype(np.float32))
            efficiency, codes[rows] = self.kernel_efficiency_and_codes(op, features, described, hw)
            out[rows] = duration_us(ideal, efficiency, hw.sm_freq) * share
            fastest[rows] = fastest_us(op, features, described, hw.sm_freq, l2=l2_cycles(hw))
            if op == "moe":  # a pass's share of its layer's bound, and no faster than its own FLOPs at the peak
                fastest[rows] = pass_fastest_us([(hw.stem, shape) for shape in shapes], self.hardware, fastest[rows],
                                                share)
                out[rows] = np.maximum(out[rows], fastest[rows])
            if calibration is not None:  # a correction cannot make the kernel beat its physical bound either
                out[rows] = np.maximum(calibration.apply(op, hw, out[rows], features, shapes), fastest[rows])
        return out, codes, fastest
