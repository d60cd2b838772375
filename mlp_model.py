"""The learned efficiency models (METHOD.md §5.1) and their checkpoint format.

* ``MLP``: input d → [Linear → ReLU → BatchNorm1d → Dropout(0.1)] × (256, 128, 64) → Linear(64, 1) →
  Sigmoid; predicts ``overall_perf`` in (0, 1). The reference recipe.
* ``MLP_v2``: the same body without the sigmoid; pipeweave trains it on log(overall_perf), which
  removes the sigmoid's saturation for the element-wise operators (quirk §11.2.12).

Layer positions inside ``network`` follow the artifact (linear 0, 4, 8, 12; batch norms 2, 6, 10).

A model directory ``mlp_models/<op>/<timestamp>/`` holds ``<op>_mlp_model.pth`` and
``metadata.json``; ``load_model_dir`` reads the input size, architecture and target transform from
the metadata instead of hard-coding them (quirk §11.2.15).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

HIDDEN_DIMS = (256, 128, 64)
DROPOUT = 0.1


def _body(input_dim: int, hidden_dims=HIDDEN_DIMS, dropout: float = DROPOUT) -> list[nn.Module]:
    layers: list[nn.Module] = []
    width = input_dim
    for hidden in hidden_dims:
        layers += [nn.Linear(width, hidden), nn.ReLU(), nn.BatchNorm1d(hidden), nn.Dropout(dropout)]
        width = hidden
    layers.append(nn.Linear(width, 1))
    return layers


class MLP(nn.Module):
    """Efficiency in (0, 1) through a sigmoid (the reference model)."""

    target_transform = "identity"

    def __init__(self, input_dim: int, hidden_dims=HIDDEN_DIMS, dropout: float = DROPOUT):
        super().__init__()
        self.network = nn.Sequential(*_body(input_dim, hidden_dims, dropout), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x).squeeze(-1)

    def efficiency(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)


class MLP_v2(nn.Module):  # noqa: N801 - the artifact's name
    """Unbounded output; pipeweave trains it to predict log(overall_perf).

    ``log_bounds`` (saved with the weights) clamps the predicted log-efficiency at inference to the
    training targets' range widened by ``BOUND_MARGIN`` on each side: an unbounded network fed shapes or
    GPUs far from its data can otherwise extrapolate to efficiencies of 1e-20 or 1e20 (seen in a
    leave-one-GPU-out run before the clamp). The sigmoid of ``MLP`` plays this role in the reference.
    """

    target_transform = "log"
    BOUND_MARGIN = float(np.log(4.0))

    def __init__(self, input_dim: int, hidden_dims=HIDDEN_DIMS, dropout: float = DROPOUT):
        super().__init__()
        self.network = nn.Sequential(*_body(input_dim, hidden_dims, dropout))
        self.register_buffer("log_bounds", torch.tensor([-float("inf"), float("inf")]))

    def set_target_range(self, log_targets: torch.Tensor) -> None:
        self.log_bounds.copy_(torch.stack([log_targets.min() - self.BOUND_MARGIN, log_targets.max() + self.BOUND_MARGIN]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x).squeeze(-1)

    def efficiency(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(torch.clamp(self.forward(x), self.log_bounds[0], self.log_bounds[1]))


ARCHITECTURES = {"MLP": MLP, "MLP_v2": MLP_v2}


def build_model(architecture: str, input_dim: int, dropout: float = DROPOUT) -> nn.Module:
    try:
        return ARCHITECTURES[architecture](input_dim, dropout=dropout)
    except KeyError:
        raise ValueError(f"unknown architecture {architecture!r}; known: {', '.join(ARCHITECTURES)}") from None


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def checkpoint_path(model_dir: Path, op: str) -> Path:
    return Path(model_dir) / f"{op}_mlp_model.pth"


def latest_model_dir(root: str | Path, op: str) -> Path:
    """The lexicographically last timestamp directory under ``root/op`` that holds a checkpoint."""
    base = Path(root) / op
    candidates = sorted(d for d in base.glob("*") if d.is_dir() and checkpoint_path(d, op).is_file())
    if not candidates:
        raise FileNotFoundError(
            f"no trained {op} model under {base} (expected {base}/<timestamp>/{op}_mlp_model.pth); "
            f"train one with: python3 train_mlp.py --op {op}"
        )
    return candidates[-1]


def load_model_dir(model_dir: str | Path, op: str, device: str = "cpu") -> tuple[nn.Module, dict]:
    """Load a checkpoint and its metadata; the model is in eval mode on ``device``."""
    model_dir = Path(model_dir)
    meta_path = model_dir / "metadata.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} is missing (every model directory needs its metadata.json)")
    metadata = json.loads(meta_path.read_text())
    params = metadata["model_info"]["model_parameters"]
    architecture = metadata["model_info"].get("architecture", "MLP")
    model = build_model(architecture, int(params["input_dim"]), dropout=float(params.get("dropout_rate", DROPOUT)))
    state = torch.load(checkpoint_path(model_dir, op), map_location=device, weights_only=True)
    model.load_state_dict(state["model_state_dict"])
    model.to(device).eval()
    return model, metadata


@torch.no_grad()
def predict_efficiency(model: nn.Module, inputs: np.ndarray, device: str = "cpu") -> np.ndarray:
    """overall_perf for log1p feature rows (float32), in eval mode, one batched forward pass."""
    if len(inputs) == 0:
        return np.zeros(0, dtype=np.float64)
    x = torch.as_tensor(np.ascontiguousarray(inputs, dtype=np.float32), device=device)
    return model.efficiency(x).double().cpu().numpy()
