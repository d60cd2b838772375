"""Fitting the efficiency MLPs (docs/METHOD.md §5.2, §5.4) with an explicit random state.

Two recipes:

* ``reference``: the artifact's recipe: ``MLP`` (sigmoid) on ``overall_perf``, MAPE loss on the
  efficiency, AdamW 1e-3 / 1e-4, grad-norm clip 1, reduce-on-plateau (0.6, patience 45), 2500 epochs,
  early stopping after 85 epochs, validation = a random 20 % of the training rows.
* ``pipeweave`` (default): ``MLP_v2`` on log(overall_perf) with an L1 loss in log space, which is the
  log of the duration ratio, so the model is fitted on what users read (duration error) rather than
  on efficiency (quirk §11.2.13). Validation holds out 20 % of the *shapes* (every GPU's rows of a
  shape together), so early stopping rewards generalisation to unseen shapes. Fewer epochs suffice
  (max 300, early stopping after 25, plateau patience 10).

Training runs on one CPU thread by default: with two cores shared by other work, PyTorch's
intra-op threads oversubscribe them and an epoch took 10× longer in our measurements.
* ``quantile``: ``MLP`` with the pinball loss at q = 0.8 on the efficiency, 200 epochs, no validation,
  best training loss kept (§5.4).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from pipeweave.cli import UserError
from pipeweave.torch_mlp import DROPOUT, build_model, float_path
from pipeweave.splits import group_ids

RECIPES = ("pipeweave", "reference", "quantile")


@dataclass
class TrainConfig:
    recipe: str = "pipeweave"
    epochs: int | None = None
    batch_size: int = 1024
    lr: float = 1e-3
    weight_decay: float = 1e-4
    seed: int = 42
    device: str = "cpu"
    patience: int | None = None
    val_fraction: float = 0.2
    quantile: float = 0.8
    dropout: float | None = None
    threads: int = 1
    max_rows_per_gpu: int | None = None
    progress: bool = True
    features: tuple[str, ...] | None = None  # MLP input columns; None: the recipe's (see modeling.input_names)

    def __post_init__(self):
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {self.recipe!r}")
        defaults = {"pipeweave": (300, 25), "reference": (2500, 85), "quantile": (200, None)}[self.recipe]
        if self.epochs is None:
            self.epochs = defaults[0]
        if self.patience is None:
            self.patience = defaults[1]
        if self.dropout is None:
            self.dropout = 0.0 if self.recipe == "pipeweave" else DROPOUT

    @property
    def architecture(self) -> str:
        return "MLP_v2" if self.recipe == "pipeweave" else "MLP"

    @property
    def scheduler_patience(self) -> int | None:
        return {"pipeweave": 10, "reference": 45, "quantile": None}[self.recipe]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["architecture"] = self.architecture
        d["mkl_cbwr"] = float_path()
        return d


def loss_function(config: TrainConfig):
    if config.recipe == "pipeweave":
        return lambda pred, target: torch.mean(torch.abs(pred - target))
    if config.recipe == "reference":
        return lambda pred, target: torch.mean(torch.abs(target - pred) / (target + 1e-9))
    q = config.quantile

    def pinball(pred, target):
        err = target - pred
        return torch.mean(torch.maximum((q - 1) * err, q * err))

    return pinball


def validation_split(n: int, config: TrainConfig, group_keys: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, val_idx). Reference: RandomState(42) permutation, first ceil(0.2 n) rows are validation."""
    if config.recipe == "quantile":
        return np.arange(n), np.arange(0)
    if config.recipe == "reference" or group_keys is None:
        perm = np.random.RandomState(config.seed).permutation(n)
        n_val = math.ceil(config.val_fraction * n)
        return np.sort(perm[n_val:]), np.sort(perm[:n_val])
    groups = group_ids(group_keys)
    rng = np.random.RandomState(config.seed)
    unique = np.unique(groups)
    val_groups = rng.choice(unique, size=max(1, math.ceil(config.val_fraction * len(unique))), replace=False)
    is_val = np.isin(groups, val_groups)
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def target_values(perf: np.ndarray, config: TrainConfig) -> np.ndarray:
    perf = np.asarray(perf, dtype=np.float64)
    if np.any(~np.isfinite(perf)) or np.any(perf <= 0):
        raise ValueError("overall_perf must be finite and positive for every training row")
    return np.log(perf) if config.recipe == "pipeweave" else perf


def train_epoch(model: nn.Module, optimizer, loss_fn, x: torch.Tensor, y: torch.Tensor, order: torch.Tensor,
                 batch_size: int) -> float:
    """One pass over the rows in ``order``; returns the mean training loss (grad-norm clipped at 1)."""
    model.train()
    total = 0.0
    for start in range(0, len(x), batch_size):
        batch = order[start : start + batch_size]
        if len(batch) < 2:  # BatchNorm needs two rows
            continue
        optimizer.zero_grad()
        loss = loss_fn(model(x[batch]), y[batch])
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        total += loss.item() * len(batch)
    return total / max(len(x), 1)


def fit(
    inputs: np.ndarray, perf: np.ndarray, config: TrainConfig, group_keys: np.ndarray | None = None
) -> tuple[nn.Module, dict]:
    """Train one model on log1p features ``inputs`` and efficiencies ``perf``; returns (model, history)."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    device = torch.device(config.device)
    x_all = torch.as_tensor(np.asarray(inputs, dtype=np.float32))
    y_all = torch.as_tensor(target_values(perf, config).astype(np.float32))
    train_idx, val_idx = validation_split(len(x_all), config, group_keys)
    x_train, y_train = x_all[train_idx].to(device), y_all[train_idx].to(device)
    x_val, y_val = x_all[val_idx].to(device), y_all[val_idx].to(device)

    model = build_model(config.architecture, x_all.shape[1], dropout=config.dropout).to(device)
    if hasattr(model, "set_target_range"):
        model.set_target_range(y_train)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = None
    if config.scheduler_patience is not None:
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=0.6, patience=config.scheduler_patience, min_lr=1e-6
        )
    loss_fn = loss_function(config)
    generator = torch.Generator().manual_seed(config.seed)
    best = {"loss": math.inf, "epoch": -1, "state": None, "train_loss": math.inf}
    history = {"train_loss": [], "val_loss": []}
    stale = 0
    epochs = range(config.epochs)
    bar = None
    if config.progress:
        from tqdm import tqdm

        bar = tqdm(epochs, desc=f"train ({config.recipe})", unit="epoch", leave=False)
        epochs = bar
    for epoch in epochs:
        order = torch.randperm(len(x_train), generator=generator).to(device)
        train_loss = train_epoch(model, optimizer, loss_fn, x_train, y_train, order, config.batch_size)
        history["train_loss"].append(train_loss)
        if len(x_val):
            model.eval()
            with torch.no_grad():
                val_loss = loss_fn(model(x_val), y_val).item()
        else:
            val_loss = train_loss
        history["val_loss"].append(val_loss)
        if scheduler is not None:
            scheduler.step(val_loss)
        if val_loss < best["loss"]:
            best = {
                "loss": val_loss,
                "epoch": epoch,
                "train_loss": train_loss,
                "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            }
            stale = 0
        else:
            stale += 1
        if bar is not None:
            bar.set_postfix(train=f"{train_loss:.4f}", val=f"{val_loss:.4f}", best=best["epoch"] + 1)
        if config.patience is not None and stale >= config.patience:
            break
    if bar is not None:
        bar.close()
    if best["state"] is None:  # NaN < inf is false: a loss never finite keeps no epoch
        watched = "validation" if len(x_val) else "training"  # the quantile recipe has no validation rows
        raise UserError(f"training kept no epoch: the {watched} loss was never finite over "
                        f"{len(history['val_loss'])} epoch(s) (learning rate {config.lr:g}); lower --lr, or check "
                        f"the dataset for non-finite inputs")
    model.load_state_dict(best["state"])
    model.to("cpu")  # what the callers predict and export with, whatever device trained it
    model.eval()
    history.update(
        best_epoch=best["epoch"],
        best_val_loss=best["loss"],
        best_train_loss=best["train_loss"],
        epochs_run=len(history["train_loss"]),
        train_rows=int(len(train_idx)),
        val_rows=int(len(val_idx)),
    )
    return model, history
