"""Kernel-level baselines for the MLP, on the same rows and inputs (docs/PAPER.md §4).

* roofline: the analytical ideal, no learning: t = max(C_ideal, DRAM cycles) / f (the roofline of
  docs/ACCURACY.md), so its efficiency is C_ideal / max(C_ideal, DRAM cycles);
* ridge: a linear model on the MLP's log1p inputs (standardised), target log(overall_perf);
* hgb: scikit-learn's HistGradientBoostingRegressor on the same inputs and target, fixed random_state.

Every learned baseline's log-efficiency is clamped to the training targets' range widened by the same
margin as the MLP (``MLP_v2.BOUND_MARGIN``), so no method is helped or hurt by extrapolation rules.
The gradient-boosted model gets 500 boosting rounds (scikit-learn's default of 100 is still improving at
our row counts) with its default early stopping; nothing else is changed from scikit-learn's defaults.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeweave.mlp import model_inputs
from pipeweave.torch_mlp import MLP_v2
from pipeweave.accuracy import feature_roofline_us

LEARNED = ("ridge", "hgb")
HGB_MAX_ITER = 500


def roofline_efficiency(frame: pd.DataFrame, op: str) -> np.ndarray:
    """overall_perf the roofline implies: p · t / t_roofline (same C_ideal and clock as the measurement)."""
    measured = frame["overall_perf"].to_numpy(np.float64) * frame["avg_duration"].to_numpy(np.float64)
    return measured / feature_roofline_us(frame, op)


def _estimator(kind: str, seed: int):
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if kind == "ridge":
        return make_pipeline(StandardScaler(), Ridge(alpha=1.0))
    if kind == "hgb":
        return HistGradientBoostingRegressor(max_iter=HGB_MAX_ITER, random_state=seed)
    raise ValueError(f"unknown baseline {kind!r}; known: {', '.join(LEARNED)}")


def fit_predict(kind: str, train: pd.DataFrame, test: pd.DataFrame, names, seed: int) -> np.ndarray:
    """Fit ``kind`` on ``train``'s ``names`` columns (one thread) and return test efficiencies."""
    from threadpoolctl import threadpool_limits

    names = list(names)
    target = np.log(train["overall_perf"].to_numpy(np.float64))
    estimator = _estimator(kind, seed)
    with threadpool_limits(1):
        estimator.fit(model_inputs(train[names].to_numpy(np.float64)), target)
        predicted = estimator.predict(model_inputs(test[names].to_numpy(np.float64)))
    low, high = target.min() - MLP_v2.BOUND_MARGIN, target.max() + MLP_v2.BOUND_MARGIN
    return np.exp(np.clip(predicted, low, high))
