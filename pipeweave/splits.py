"""Train/test splits that never put one shape on both sides.

A *shape* is an operator's shape columns without the GPU (e.g. (M, N, K) for GEMM), so the test
split measures generalisation to unseen shapes on every GPU at once. Assignment hashes the shape
key, so it does not depend on row order or on which GPUs are present, and is reproducible.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from analytical_model.registry import get_operator


def shape_keys(frame: pd.DataFrame, op: str) -> np.ndarray:
    columns = list(get_operator(op).shape_columns)
    parts = [frame[c].astype(str) for c in columns]
    return parts[0].str.cat(parts[1:], sep="|").to_numpy(dtype=object)


def group_ids(keys: np.ndarray) -> np.ndarray:
    return pd.factorize(pd.Series(keys), sort=True)[0]


def _unit_hash(key: str, salt: str) -> float:
    digest = hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def shape_holdout_mask(keys: np.ndarray, test_fraction: float = 0.2, salt: str = "pipeweave-split-v1") -> np.ndarray:
    """True for rows whose shape falls in the held-out test fraction."""
    unique = pd.unique(pd.Series(keys))
    chosen = {k for k in unique if _unit_hash(str(k), salt) < test_fraction}
    return np.fromiter((k in chosen for k in keys), dtype=bool, count=len(keys))
