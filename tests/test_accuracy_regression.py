"""Accuracy regression: the shipped models, on a fixed sample of the shape-held-out test rows, stay within the
kernel-level error documented in docs/ACCURACY.md.

The durations are predicted from the shape columns alone, through the whole prediction path (registry features,
tile rule, MLP), not from the feature columns stored in the CSV, so a change anywhere on that path that moves the
accuracy fails here. Needs the built dataset (``python3 -m dataset.build``, which needs the shared data).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from analytical_model.registry import get_operator, operator_keys
from pipeweave.paths import DATASET_DIR, DOCS_DIR
from pipeweave.predictor import KernelPredictor

SAMPLE_ROWS = 1500  # per operator, drawn with a fixed seed
SEED = 0
#: the sample's mean may exceed the documented mean of all test rows by sampling noise and nothing more
RELATIVE_MARGIN = 1.15
ABSOLUTE_MARGIN_PCT = 0.5


def documented_mean_pct(op: str) -> float:
    """The ``**all**`` row's mean duration error of ``op`` in docs/ACCURACY.md."""
    text = (DOCS_DIR / "ACCURACY.md").read_text(encoding="utf-8")
    section = text.split(f"\n## {op}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^\| \*\*all\*\* \| \d+ \| ([\d.]+) / ", section, flags=re.M)
    assert match, f"docs/ACCURACY.md has no 'all' row for {op}"
    return float(match.group(1))


@pytest.fixture(scope="module")
def predictor() -> KernelPredictor:
    return KernelPredictor()


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("op", operator_keys(trainable=True))
def test_shipped_model_within_documented_error(op, predictor):
    path = DATASET_DIR / f"{op}_test.csv"
    if not path.is_file():
        pytest.skip(f"{path} not built (python3 -m dataset.build; needs the shared data)")
    operator = get_operator(op)
    test = pd.read_csv(path)
    # GEMM's test file also holds H20's FP8 measurements as the BF16 GEMMs of equal work they stand for
    # (dataset/build.py: fp8_rows_for_gemm), with the shape and features of those BF16 GEMMs: they stay
    sample = test.sample(n=min(SAMPLE_ROWS, len(test)), random_state=SEED).reset_index(drop=True)
    # no tile columns: the tile rule picks them; the source names each row's harness, which the GEMM models read
    shapes = sample[[*operator.shape_columns, "hardware", "source"]]
    predicted = predictor.predict_frame(op, shapes)["predicted_us"].to_numpy()
    measured = sample["avg_duration"].to_numpy(np.float64)
    error_pct = float(np.mean(np.abs(predicted / measured - 1)) * 100)
    documented = documented_mean_pct(op)
    print(f"{op}: sample mean {error_pct:.2f} %, documented {documented} %")
    assert error_pct <= documented * RELATIVE_MARGIN + ABSOLUTE_MARGIN_PCT, (op, error_pct, documented)
