"""The computations behind docs/PAPER.md: shipped-model metrics, feature ablations, leave-one-GPU-out
ablations and kernel-level baselines. Every function returns plain dicts (JSON-ready).

All evaluations use data the evaluated model never trained on: the shape-held-out test split
(``dataset/<op>_test.csv``, the split the shipped models were trained against) or, for transfer, every
row of a GPU left out of training. Every variant of one comparison gets the same :class:`Budget`, the
same seeds and the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.pipes import MEMORY_FEATURES, TENSOR_FEATURES
from analytical_model.registry import get_operator, operator_keys
from pipeweave.modeling import cap_rows_per_gpu, evaluate, hold_out, load_splits, train_and_evaluate
from pipeweave.paper.baselines import LEARNED, fit_predict, roofline_efficiency
from pipeweave.paths import REPO_ROOT
from pipeweave.predictor import KernelPredictor
from pipeweave.training import TrainConfig

OPS = operator_keys(trainable=True)
ABLATION_OPS = ("gemm", "attn")
LOGO_OPS = ("gemm",)
VARIANTS = ("pipeweave", "paper_full", "no_math", "no_mio", "descriptors_only")
SHIPPED_ROWS_PER_GPU = 20000  # train_mlp.py's --max_rows_per_gpu, with which the shipped models were trained


@dataclass(frozen=True)
class Budget:
    """How much each comparison trains; the same for every variant within it."""

    mode: str
    rows_per_gpu: int  # ablation: training rows per GPU, drawn with the seed
    epochs: int  # ablation and leave-one-GPU-out: maximum epochs (pipeweave recipe otherwise)
    seeds: tuple[int, ...]  # ablation seeds; the first one is used everywhere else
    baseline_rows_per_gpu: int  # baselines: the shipped models' training cap (train_mlp.py's default)
    test_rows_per_gpu: int | None  # None: every test row
    logo_rows_per_gpu: int
    logo_epochs: int


FULL = Budget("full", rows_per_gpu=8000, epochs=100, seeds=(42, 43), baseline_rows_per_gpu=SHIPPED_ROWS_PER_GPU,
              test_rows_per_gpu=None, logo_rows_per_gpu=1500, logo_epochs=100)
QUICK = Budget("quick", rows_per_gpu=1000, epochs=60, seeds=(42, 43), baseline_rows_per_gpu=2000,
               test_rows_per_gpu=1000, logo_rows_per_gpu=300, logo_epochs=40)


def feature_sets(op: str) -> dict[str, tuple[str, ...]]:
    """The ablation's input sets. Without math pipes = the 7 memory features, without MIO = the 4 tensor
    features (the paper's ablations, docs/METHOD.md §4.1); plus our shape descriptors with and without the
    pipe features, which test our own claim that the descriptors help and the paper's that the pipe
    features are what matter."""
    operator = get_operator(op)
    return {
        "pipeweave": operator.input_names(with_descriptors=True),
        "paper_full": operator.feature_names,
        "no_math": MEMORY_FEATURES,
        "no_mio": TENSOR_FEATURES,
        "descriptors_only": operator.descriptor_names,
    }


def _subsample_test(test: pd.DataFrame, budget: Budget) -> pd.DataFrame:
    return cap_rows_per_gpu(test, budget.test_rows_per_gpu, seed=0).reset_index(drop=True)


def load_operator(op: str, dataset_dir: Path, budget: Budget) -> tuple[pd.DataFrame, pd.DataFrame]:
    train, test = load_splits(op, dataset_dir)
    return train, _subsample_test(test, budget)


def _config(seed: int, rows_per_gpu: int, epochs: int, features, bars: bool) -> TrainConfig:
    """The pipeweave recipe with a budget and an input set (default early stopping and learning rate)."""
    return TrainConfig(epochs=epochs, seed=seed, max_rows_per_gpu=rows_per_gpu, features=tuple(features),
                       progress=bars)


def shipped_model(op: str, predictor: KernelPredictor, train: pd.DataFrame, test: pd.DataFrame) -> tuple[dict, np.ndarray]:
    """The shipped model on the test rows, in the paper's metrics; also its predictions."""
    _, metadata, directory = predictor.model(op)
    predicted = predictor.efficiency_from_frame(op, test)
    shipped_rows = metadata.get("data_info", {}).get("train_samples")
    result = {
        "model_dir": str(directory.relative_to(REPO_ROOT)) if directory.is_relative_to(REPO_ROOT) else str(directory),
        "features": metadata["model_info"]["features"],
        "trained_on_rows": shipped_rows,
        "dataset_train_rows": int(len(train)),
        **evaluate(test, predicted),
    }
    return result, predicted


def baselines(op: str, train: pd.DataFrame, test: pd.DataFrame, names, shipped_predicted: np.ndarray,
              budget: Budget) -> dict:
    """Roofline, ridge and gradient boosting on the shipped model's inputs and training rows (the cap
    train_mlp.py draws with seed 42), beside the shipped MLP, all on the same test rows."""
    seed = 42
    rows = cap_rows_per_gpu(train, budget.baseline_rows_per_gpu, seed)
    predicted = {"roofline": roofline_efficiency(test, op)}
    for kind in LEARNED:
        predicted[kind] = fit_predict(kind, rows, test, names, seed)
    predicted["mlp"] = shipped_predicted
    return {"train_rows": int(len(rows)), "methods": {k: evaluate(test, p) for k, p in predicted.items()}}


def ablation(op: str, train: pd.DataFrame, test: pd.DataFrame, budget: Budget, progress, bars: bool) -> dict:
    """Each feature set: the MLP per seed and gradient boosting (first seed), on the same rows and test rows.
    ``progress`` has ``expect(n)`` and ``step(description)``; ``bars`` shows per-epoch bars."""
    progress.expect(len(VARIANTS) * len(budget.seeds))
    out = {}
    for variant, names in feature_sets(op).items():
        entry = {"features": list(names), "mlp": {}}
        for seed in budget.seeds:
            progress.step(f"{op} ablation {variant} seed {seed}")
            config = _config(seed, budget.rows_per_gpu, budget.epochs, names, bars)
            _, history, _, evaluation = train_and_evaluate(op, train, test, config)
            entry["mlp"][str(seed)] = {**evaluation, "best_epoch": history["best_epoch"],
                                       "train_rows": history["train_rows"]}
        rows = cap_rows_per_gpu(train, budget.rows_per_gpu, budget.seeds[0])
        entry["hgb"] = evaluate(test, fit_predict("hgb", rows, test, names, budget.seeds[0]))
        out[variant] = entry
    return out


def logo_ablation(op: str, dataset_dir: Path, budget: Budget, progress, bars: bool) -> dict:
    """Leave-one-GPU-out: per held-out GPU and feature set, an MLP trained on the other GPUs (first seed)
    and tested on every row of the held-out GPU; the roofline on the same rows for scale."""
    every_train, every_test = load_splits(op, dataset_dir)
    gpus = sorted(set(every_train["hardware"].unique()) | set(every_test["hardware"].unique()))
    progress.expect(len(gpus) * len(VARIANTS))
    out = {}
    for gpu in gpus:
        train, test = hold_out(op, every_train, every_test, [gpu])
        test = _subsample_test(test, budget)
        cell = {"roofline": evaluate(test, roofline_efficiency(test, op))["overall"]}
        for variant, names in feature_sets(op).items():
            progress.step(f"{op} leave-one-GPU-out {gpu} {variant}")
            config = _config(budget.seeds[0], budget.logo_rows_per_gpu, budget.logo_epochs, names, bars)
            _, _, _, evaluation = train_and_evaluate(op, train, test, config)
            cell[variant] = evaluation["overall"]
        out[gpu] = cell
    return out
