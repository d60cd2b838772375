"""Measured prediction intervals: how far a kernel's measured duration lies from its prediction, on data the
predicting model never trained on (docs/METHOD.md §4.4; the table is ``pipeweave/error_intervals.json``, written
by ``python3 -m pipeweave.interval_eval --write``).

A prediction is in one of three states, and the error it can be expected to have depends on the state:

* ``trained``: the GPU is in the model's training data; the errors are the shipped model's on shapes held out of
  training (the test split), as the predictor gives them (inside the physical band);
* ``unseen_gpu``: the GPU is outside the training data, but a training GPU shares its SM design (compute
  capability: H20 beside H100, L40 beside L40S); the errors are the leave-one-GPU-out ones of such GPUs;
* ``unseen_architecture``: no training GPU shares its SM design; the leave-one-GPU-out errors of such GPUs.

Per operator class (the model that predicts it: quantisation takes RMSNorm's) and state, the table holds the
10th and 90th percentiles of log(measured / predicted duration) on a GPU that is not among the evaluated ones:
its bias drawn from the spread of the evaluated GPUs' biases (a Student t predictive distribution), plus their
residuals around their biases (:func:`pipeweave.interval_eval.predictive_quantiles`). So the interval
``[t̂ · e^q10, t̂ · e^q90]`` is meant to hold the measurement of 80 % of kernels. An unseen state with fewer than
three GPUs in the evaluation adds the other unseen state's (recorded as ``from`` in the table).

Kernel intervals are summed as if their errors were perfectly correlated (comonotone: the quantile of a sum of
comonotone variables is the sum of their quantiles). On a GPU outside training the error is mostly a bias that
all kernels of an operator share (docs/ACCURACY.md), so independent errors would give a far too narrow interval.
Collectives enter at their point value: no held-out evaluation of their errors exists (the output says so). A
calibration scales a kernel's interval with its point prediction; it does not narrow it.
"""
from __future__ import annotations

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
COMMUNICATION_NOTE = "collectives at their point value (no held-out evaluation of collective errors)"


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
        self._quantiles = {}
        for op, states in table["operators"].items():
            missing = [state for state in STATES if state not in states]
            if missing:
                raise ValueError(f"{path}: operator {op!r} lacks state(s) {', '.join(missing)}")
            self._quantiles[op] = np.array([[states[s]["log_low"], states[s]["log_high"]] for s in STATES])

    @classmethod
    def load(cls, path: Path | str = DEFAULT_PATH) -> "IntervalTable":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"error-interval table not found: {path}; write it with: "
                                    f"python3 -m pipeweave.interval_eval --write")
        return cls(json.loads(path.read_text()), path)

    def operators(self) -> list[str]:
        return sorted(self._quantiles)

    def factors(self, op: str, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) multipliers of the point duration per row of operator ``op`` in ``states``."""
        model_op = get_operator(op).model_op
        quantiles = self._quantiles.get(model_op)
        if quantiles is None:
            raise ValueError(f"{self.path} has no intervals for {model_op!r} (operators: "
                             f"{', '.join(self.operators())}); rewrite it with: "
                             f"python3 -m pipeweave.interval_eval --write")
        chosen = quantiles[np.asarray(states, dtype=np.int64)]
        return np.exp(chosen[:, 0]), np.exp(chosen[:, 1])


@lru_cache(maxsize=4)
def shipped_table(path: str = str(DEFAULT_PATH)) -> IntervalTable:
    return IntervalTable.load(path)
