"""Measured prediction intervals: how far a kernel's measured duration lies from its prediction, on data the
predicting model never trained on (docs/METHOD.md §4.4; the table is ``pipeweave/error_intervals.json``, written
by ``python3 -m pipeweave.interval_eval --write``).

A prediction is in one of three states, and the error it can be expected to have depends on the state:

* ``trained``: the GPU is in the model's training data; the errors are the shipped model's on shapes held out of
  training (the test split), as the predictor gives them (inside the physical band);
* ``unseen_gpu``: the GPU is outside the training data, but a training GPU shares its SM design (compute
  capability: H20 beside H100, L40 beside L40S); the errors are the leave-one-GPU-out ones of such GPUs;
* ``unseen_architecture``: no training GPU shares its SM design; the leave-one-GPU-out errors of such GPUs.

Per operator class (the model that predicts it; quantisation, predicted by its bandwidth fit, takes that fit's own
intervals, :func:`stored_fit_quantiles`) and state, the table holds the
10th and 90th percentiles of log(measured / predicted duration) on a GPU that is not among the evaluated ones:
its bias drawn from the spread of the evaluated GPUs' biases (a Student t predictive distribution), plus their
residuals around their biases (:func:`pipeweave.interval_eval.predictive_quantiles`). So the interval
``[t̂ · e^q10, t̂ · e^q90]`` is meant to hold the measurement of 80 % of kernels. An unseen state with fewer than
three GPUs in the evaluation adds the other unseen state's (recorded as ``from`` in the table).

Kernel intervals are summed as if their errors were perfectly correlated (comonotone: the quantile of a sum of
comonotone variables is the sum of their quantiles). A kernel's low end is never below the fastest time its physical
band allows (:func:`pipeweave.bounds.fastest_us`; e.g. the DRAM time of a GEMM whose bytes spill the L2), nor above
its point. On a GPU outside training the error is mostly a bias that
all kernels of an operator share (docs/ACCURACY.md), so independent errors would give a far too narrow interval.
Collectives with measured models enter at their point value (the output says so); a collective that takes the
analytical estimate enters with that estimate's leave-one-GPU-out interval on its link family
(:meth:`pipeweave.collectives.CollectivePredictor.analytical_interval`).

A fourth state, ``calibrated``: a GPU outside training whose calibration (``calibrate.py --kernels``) was fitted on
at least k measured kernels of the operator, k = 8, 32 or 128, takes the interval of the k-shot evaluation (errors
on the GPU's other kernels after calibrating on k drawn ones; the largest evaluated k not above the user's count),
widened where the calibration's own kernels scatter more: each is predicted by the calibration fitted without its
fold (four folds; the corrections, and what they leave on the other folds interpolated to it as the calibration
interpolates its kernels' residuals), and the 10th / 90th percentiles of those errors, recorded in the calibration
file (``spread``), bound the interval from outside. The pooled interval is every GPU's; a GPU whose bias varies from
shape to shape more than the others' (L40S) would otherwise be given theirs. A calibration of a GPU in the training
data keeps the trained state's interval, widened likewise to its kernels' spread (a user's harness may differ from
the dataset's: H100's two FP8 harnesses differ by 1.14x at the median). A calibration from end-to-end runs only,
which has no such evaluation per kernel, leaves the interval of the uncalibrated state, scaled with the corrected
prediction. Quantisation keeps its fit's interval whatever the calibration: the RMSNorm kernels that correct it
measured another kernel.
"""
from __future__ import annotations

import inspect
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from analytical_model.registry import get_operator

STATES = ("trained", "unseen_gpu", "unseen_architecture")
TRAINED, UNSEEN_GPU, UNSEEN_ARCHITECTURE = range(len(STATES))
LEVELS = (0.1, 0.9)
DEFAULT_PATH = Path(__file__).resolve().parent / "error_intervals.json"
FORMAT = "pipeweave-error-intervals-v1"
COMMUNICATION_NOTE = ("collectives at their point value (not in the interval): those with measured models, and "
                      "analytical estimates on a link without an evaluated interval")


def prediction_states(trained: frozenset, gpu_names, codes: np.ndarray) -> np.ndarray:
    """State index per row on the GPU named ``gpu_names[row]`` (its device name): ``trained`` if that GPU is in the
    model's training data ``trained``, else by the row's architecture bit
    (:data:`pipeweave.predictor.UNSEEN_ARCHITECTURE`)."""
    from pipeweave.predictor import UNSEEN_ARCHITECTURE as ARCHITECTURE_BIT

    codes = np.asarray(codes)
    in_training = np.array([name in trained for name in gpu_names], dtype=bool)
    unseen = np.where(codes & ARCHITECTURE_BIT, UNSEEN_ARCHITECTURE, UNSEEN_GPU)
    return np.where(in_training, TRAINED, unseen).astype(np.int8)


class IntervalTable:
    """The log-ratio quantiles of ``error_intervals.json``: :meth:`factors` turns states into multipliers of the
    point prediction."""

    def __init__(self, table: dict, path: Path | str = "error_intervals.json"):
        if table.get("format") != FORMAT:
            raise ValueError(f"{path}: not a pipeweave error-interval table (format {table.get('format')!r}, "
                             f"expected {FORMAT!r}); rewrite it with: python3 -m pipeweave.interval_eval --write")
        self.path = Path(path)
        self.levels = tuple(table["levels"])
        self.models = dict(table.get("models", {}))  # model op -> folder name of the model the table measured
        self._quantiles, self._calibrated = {}, {}
        for op, states in table["operators"].items():
            missing = [state for state in (*STATES, "calibrated") if state not in states]
            if missing:
                raise ValueError(f"{path}: operator {op!r} lacks state(s) {', '.join(missing)}")
            self._quantiles[op] = np.array([[states[s]["log_low"], states[s]["log_high"]] for s in STATES])
            self._calibrated[op] = {int(k): (cell["log_low"], cell["log_high"])
                                    for k, cell in states["calibrated"].items()}

    @classmethod
    def load(cls, path: Path | str = DEFAULT_PATH) -> "IntervalTable":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"error-interval table not found: {path}; write it with: "
                                    f"python3 -m pipeweave.interval_eval --write")
        try:
            table = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not readable JSON ({exc}); rewrite it with: "
                             f"python3 -m pipeweave.interval_eval --write") from None
        return cls(table, path)

    def operators(self) -> list[str]:
        return sorted(self._quantiles)

    def calibrated_shots(self, op: str, kernels: int) -> int | None:
        """The largest evaluated calibration size k ≤ ``kernels`` (measured kernels of ``op`` a calibration was
        fitted on), None below the smallest."""
        shots = [k for k in self._calibrated.get(get_operator(op).model_op, {}) if k <= kernels]
        return max(shots) if shots else None

    def factors(self, op: str, states: np.ndarray, calibrated_kernels: int = 0, spread: tuple | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) multipliers of the point duration per row of operator ``op`` in ``states``, on a GPU whose
        calibration was fitted on ``calibrated_kernels`` measured kernels of that operator: outside training, at
        least the smallest evaluated k of them take the interval of the calibrated state (:meth:`calibrated_shots`);
        in any state the interval is widened to the calibration's own cross-validated ``spread`` (log low, log high)
        where that is wider. Quantisation's interval is its fit's own: a calibration measures RMSNorm for it."""
        model_op = get_operator(op).model_op
        quantiles = stored_fit_quantiles(op)
        if quantiles is None:
            quantiles = self._quantiles.get(model_op)
        if quantiles is None:  # an operator registered after the table was measured (other_model_warning says so)
            measured = np.stack(list(self._quantiles.values()))
            quantiles = np.stack([measured[..., 0].min(axis=0), measured[..., 1].max(axis=0)], axis=-1)
        states = np.asarray(states, dtype=np.int64)
        chosen = quantiles[states]
        # a bandwidth fit's operator (quantisation) was measured by no calibration: its model op's kernels are others
        shots = None if get_operator(op).bandwidth_model_file else self.calibrated_shots(op, calibrated_kernels)
        if shots is not None:
            if spread is not None:  # the user's own kernels scatter so on any GPU, one in training included
                chosen = np.stack([np.minimum(chosen[:, 0], spread[0]), np.maximum(chosen[:, 1], spread[1])], axis=-1)
            low, high = self._calibrated[model_op][shots]
            if spread is not None:
                low, high = min(low, spread[0]), max(high, spread[1])
            chosen = np.where((states != TRAINED)[:, None], np.array([low, high]), chosen)
        return np.exp(chosen[:, 0]), np.exp(chosen[:, 1])


def stored_fit_quantiles(op: str) -> np.ndarray | None:
    """Per state (log low, log high) of an operator predicted by a stored bandwidth fit (the quantisation), measured
    with the fit (:func:`pipeweave.quantize_model.interval_entries`); None for an operator its MLP predicts."""
    file = get_operator(op).bandwidth_model_file
    if file is None:
        return None
    from pipeweave import quantize_model

    states = quantize_model.load(file).get("intervals")
    if states is None:
        raise ValueError(f"{file} has no intervals: rewrite it with {quantize_model.REWRITE}")
    return np.array([[states[s]["log_low"], states[s]["log_high"]] for s in STATES])


def other_model_warning(op: str, model_dir) -> str | None:
    """A WARNING line when ``op`` is predicted by another model than the one the shipped interval table was measured
    for (a model trained by the user): its intervals describe that model's errors, not this one's. None otherwise."""
    if get_operator(op).bandwidth_model_file is not None:  # its stored fit predicts it, with its own intervals
        return None
    model_op = get_operator(op).model_op
    if model_op not in shipped_table().operators():
        return (f"WARNING: no 80 % intervals were measured for the {model_op} model ({shipped_table().path.name}): "
                f"low/high are the widest of the measured operators' (python3 -m pipeweave.interval_eval measures "
                f"them once the operator has data)")
    measured = shipped_table().models.get(model_op)
    if measured is None or Path(model_dir).name == measured:
        return None
    return (f"WARNING: the 80 % intervals of the {model_op} model were measured for {measured} "
            f"({shipped_table().path.name}); this prediction uses {Path(model_dir).name}, so low/high describe the "
            f"errors of the other model, not of this one (python3 -m pipeweave.interval_eval measures them anew)")


def spread_record(calibration, key: str, stem: str) -> dict | None:
    """``calibration``'s spread entry ``key`` (a model op, or "all_reduce" for a measured sweep;
    pipeweave.calibration.spread_entry) if it is for the GPU ``stem`` and recorded one, else None."""
    if calibration is None or getattr(calibration, "hardware", None) != stem:
        return None
    return getattr(calibration, "spread", {}).get(key)


def calibrated_spread(calibration, op: str, stem: str) -> tuple[float, float] | None:
    """(log low, log high) of the cross-validated scatter of the measured kernels of ``op``'s model around
    ``calibration`` if it is for the GPU ``stem`` and recorded one (pipeweave.calibration.spread_entry), else None."""
    entry = spread_record(calibration, get_operator(op).model_op, stem)
    return None if entry is None else (entry["log_low"], entry["log_high"])


def calibrated_kernels(calibration, op: str, stem: str, cls: str | None = None) -> int:
    """Measured kernels of ``op``'s model that ``calibration`` was fitted on, if it is for the GPU ``stem``
    (0 without one, for another GPU, or for a correction without that method, e.g. a caller's own); with ``cls``,
    those of that calibration class (attention's prefill or decode), where the method takes a class: a caller's own
    ``kernel_count(op)``, the engine's documented hook, counts every class's."""
    if calibration is None or getattr(calibration, "hardware", None) != stem:
        return 0
    count = getattr(calibration, "kernel_count", None)
    if count is None:
        return 0
    by_class = cls is not None and len(inspect.signature(count).parameters) > 1
    return int(count(get_operator(op).model_op, cls) if by_class else count(get_operator(op).model_op))


@lru_cache(maxsize=4)
def shipped_table(path: str = str(DEFAULT_PATH)) -> IntervalTable:
    return IntervalTable.load(path)


def row_factors(op: str, trained: frozenset, specs, codes: np.ndarray, calibration=None, attention_types=None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) multipliers of the point durations of rows on the GPUs ``specs[row]`` (hardware specs with
    ``stem`` and ``name``), with the rows' extrapolation bits ``codes``: the shipped table, each GPU's rows in
    their state, calibrated where ``calibration`` was fitted on that GPU's measured kernels of ``op``. A row of
    a memory-bound operator outside its MLP's range on a trained GPU is in the unseen-GPU state: the bandwidth
    model's trend predicts it (:meth:`pipeweave.predictor.KernelPredictor.unbounded_efficiency`), and the
    unseen-GPU errors are that model's. Attention rows (``attention_types`` given) count the calibration's measured
    kernels of their own class: prefill and decode have corrections of their own, and measured decode kernels leave
    the prefill correction to the prior (on Hopper a profiler file's prefill rows are not used: a kernel vLLM does
    not run there)."""
    from pipeweave.calibration_design import kernel_classes
    from pipeweave.predictor import OUTSIDE_RANGE

    stems = np.array([spec.stem for spec in specs], dtype=object)
    codes = np.asarray(codes)
    low, high = np.ones(len(specs)), np.ones(len(specs))
    for stem in dict.fromkeys(stems.tolist()):
        rows = np.flatnonzero(stems == stem)
        states = prediction_states(trained, [specs[rows[0]].name] * len(rows), codes[rows])
        # beyond its MLP's range the bandwidth model's trend predicts the row; a stored bandwidth fit (quantisation)
        # predicts every row so, and its trained state holds its own errors on the GPUs it was fitted on
        if get_operator(op).dram_bound and get_operator(op).bandwidth_model_file is None:
            states = np.where((states == TRAINED) & ((codes[rows] & OUTSIDE_RANGE) > 0), UNSEEN_GPU, states)
        classes = (kernel_classes(op, len(rows), [attention_types[row] for row in rows])
                   if op == "attn" and attention_types is not None else np.full(len(rows), None, dtype=object))
        for cls in dict.fromkeys(classes.tolist()):
            part = classes == cls
            low[rows[part]], high[rows[part]] = shipped_table().factors(op, states[part], calibrated_kernels(
                calibration, op, stem, cls), calibrated_spread(calibration, op, stem))
    return low, high


def physical_interval(point: np.ndarray, low: np.ndarray, high: np.ndarray, fastest: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) ends around ``point`` from the multipliers of :func:`row_factors`, the low end kept between the
    fastest time physics allows (``fastest``, same unit as ``point``) and the point itself (a table row whose
    errors all lie on one side has a low multiplier above 1)."""
    point = np.asarray(point, dtype=np.float64)
    return np.minimum(point, np.maximum(point * low, fastest)), point * high
