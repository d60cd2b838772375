"""The efficiency MLPs as torch modules (docs/METHOD.md §5.1): training, checkpoints and weight export.

* ``MLP``: input d → [Linear → ReLU → BatchNorm1d → Dropout(0.1)] × (256, 128, 64) → Linear(64, 1) →
  Sigmoid; predicts ``overall_perf`` in (0, 1). The reference recipe.
* ``MLP_v2``: the same body without the sigmoid; pipeweave trains it on log(overall_perf), which
  removes the sigmoid's saturation for the element-wise operators (quirk §11.2.12).

Layer positions inside ``network`` follow the artifact (linear 0, 4, 8, 12; batch norms 2, 6, 10).

A model directory ``mlp_models/<op>/<timestamp>/`` holds the checkpoint ``<op>_mlp_model.pth``, the exported
weights ``<op>_mlp_weights.npz`` that prediction reads without torch (format: :mod:`pipeweave.mlp`) and
``metadata.json``; ``load_model_dir`` reads the input size, architecture and target transform from the metadata
instead of hard-coding them (quirk §11.2.15). Needs the training extras (``pip install '.[train]'``).

    pipeweave-export-mlp mlp_models mlp_models_quantile     # (re-)export every checkpoint under the roots
"""
from __future__ import annotations

import os
import pickle
import platform
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pipeweave.mlp import (CHECKPOINT_SUFFIX, WEIGHTS_FORMAT, checkpoint_path, metadata_transform, read_metadata,
                           read_weight_arrays, transformed_names, weights_path)


#: MKL chooses its matrix-multiply kernels by CPU (SSE, AVX2, AVX-512), and each sums in its own order: trained with
#: the same seed on MKL's AVX2 and AVX-512 paths, a GEMM model's weights were 0.46 apart after 6 epochs, and
#: leave-one-GPU-out cells moved by up to 2.5 points between machines (README, "Deterministic across machines").
#: MKL documents its compatible path as the same on every x86 CPU (an Intel and an AMD machine still trained different
#: models on it: README); a GEMM epoch took 2.3x as long on it here. MKL reads the variable
#: at the process's first matrix product, so it is set when this module is imported, before any training; a value
#: already in the environment is kept (MKL_CBWR=AUTO: the fastest path, which another CPU does not repeat).
FLOAT_PATH_VARIABLE = "MKL_CBWR"
REPRODUCIBLE_FLOAT_PATH = "COMPATIBLE"
os.environ.setdefault(FLOAT_PATH_VARIABLE, REPRODUCIBLE_FLOAT_PATH)


def float_path() -> str:
    """The MKL code path CPU training runs on (recorded in every model's metadata)."""
    return os.environ.get(FLOAT_PATH_VARIABLE, "AUTO")


def training_machine() -> dict:
    """The processor and torch build a model was trained with (recorded in its metadata): the same data, flags and
    float path trained different models on an Intel and an AMD machine (README, "Deterministic across machines"),
    so a table can say which machine's models it scores."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.is_file() else []
    cpu = names[0] if names else platform.processor() or platform.machine()
    return {"cpu": cpu, "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


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


def load_model_dir(model_dir: str | Path, op: str, device: str = "cpu") -> tuple[nn.Module, dict]:
    """Load a torch checkpoint (or, where the directory has none, its numpy weight file: :func:`load_exported`) and
    its metadata; the model is in eval mode on ``device``."""
    metadata = read_metadata(model_dir)
    if "ensemble" in metadata:
        raise ValueError(f"{model_dir} is an ensemble of {len(metadata['ensemble']['seeds'])} members; load one "
                         f"of its member directories ({model_dir}/members/seed<S>) instead")
    params = metadata["model_info"]["model_parameters"]
    architecture = metadata["model_info"].get("architecture", "MLP")
    model = build_model(architecture, int(params["input_dim"]), dropout=float(params.get("dropout_rate", DROPOUT)))
    path = checkpoint_path(model_dir, op)
    if not path.is_file() and weights_path(model_dir, op).is_file():
        load_exported(model, weights_path(model_dir, op), op)
        model.to(device).eval()
        return model, metadata
    try:
        model.load_state_dict(torch.load(path, map_location=device, weights_only=True)["model_state_dict"])
    except (pickle.UnpicklingError, EOFError, RuntimeError) as exc:  # torch's errors for a damaged checkpoint
        raise ValueError(f"{path}: damaged or not a checkpoint of this model (torch: {type(exc).__name__}); restore "
                         f"it or retrain with train_mlp.py --op {op}") from None
    model.to(device).eval()
    return model, metadata


def load_exported(model: nn.Module, path: Path, op: str) -> None:
    """Set ``model``'s weights from its numpy weight file (:func:`exported_arrays`), for a model directory without
    its torch checkpoint: an installed package ships the ensemble members' weight files only (no pickles), and
    fine-tuning starts from them. The file holds every weight and running statistic an evaluation reads, in the
    checkpoint's float32; only batch norm's update counter, which its fixed momentum never reads, starts at 0."""
    linears = [m for m in model.network if isinstance(m, nn.Linear)]
    norms = [m for m in model.network if isinstance(m, nn.BatchNorm1d)]
    try:
        arrays = read_weight_arrays(path)
        with torch.no_grad():
            if str(arrays["architecture"]) != type(model).__name__ or int(arrays["num_layers"]) != len(linears):
                raise ValueError("another architecture")
            for i, linear in enumerate(linears):
                linear.weight.copy_(torch.from_numpy(arrays[f"linear{i}.weight"]))
                linear.bias.copy_(torch.from_numpy(arrays[f"linear{i}.bias"]))
            for i, norm in enumerate(norms):
                for name, tensor in (("mean", norm.running_mean), ("var", norm.running_var), ("weight", norm.weight),
                                     ("bias", norm.bias)):
                    tensor.copy_(torch.from_numpy(arrays[f"bn{i}.{name}"]))
                norm.eps = float(arrays[f"bn{i}.eps"])
            if hasattr(model, "log_bounds"):
                model.log_bounds.copy_(torch.from_numpy(arrays["log_bounds"]))
    except (KeyError, ValueError, RuntimeError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: damaged or not the weights of this model ({exc}); restore it or retrain with "
                         f"train_mlp.py --op {op}") from None


@torch.no_grad()
def predict_efficiency(model: nn.Module, inputs: np.ndarray, device: str = "cpu") -> np.ndarray:
    """overall_perf for log1p feature rows (float32), in eval mode, one batched forward pass."""
    if len(inputs) == 0:
        return np.zeros(0, dtype=np.float64)
    x = torch.as_tensor(np.ascontiguousarray(inputs, dtype=np.float32), device=device)
    return model.efficiency(x).double().cpu().numpy()


def exported_arrays(model: nn.Module, features: list[str], transform: str, fixed_time_us: float = 0.0,
                    ideal_cycle_features: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """The arrays of the numpy weight file (format in :mod:`pipeweave.mlp`) for an MLP / MLP_v2 that reads
    ``features`` through ``transform`` (and, trained with a fixed time, predicts the efficiency of the rest)."""
    linears = [m for m in model.network if isinstance(m, nn.Linear)]
    norms = [m for m in model.network if isinstance(m, nn.BatchNorm1d)]
    width = len(transformed_names(features, transform))
    if len(norms) != len(linears) - 1 or linears[0].in_features != width:
        raise ValueError(f"cannot export {type(model).__name__}: expected linear/batch-norm blocks over "
                         f"{width} inputs ({transform} of {len(features)} features)")
    arrays = {"format": np.array(WEIGHTS_FORMAT), "architecture": np.array(type(model).__name__),
              "input_transform": np.array(transform), "features": np.array(features),
              "num_layers": np.array(len(linears))}

    def numpy(tensor: torch.Tensor) -> np.ndarray:
        return tensor.detach().cpu().numpy().astype(np.float32)

    for i, linear in enumerate(linears):
        arrays[f"linear{i}.weight"], arrays[f"linear{i}.bias"] = numpy(linear.weight), numpy(linear.bias)
    for i, norm in enumerate(norms):
        arrays.update({f"bn{i}.mean": numpy(norm.running_mean), f"bn{i}.var": numpy(norm.running_var),
                       f"bn{i}.weight": numpy(norm.weight), f"bn{i}.bias": numpy(norm.bias),
                       f"bn{i}.eps": np.array(norm.eps, dtype=np.float64)})
    if hasattr(model, "log_bounds"):
        arrays["log_bounds"] = numpy(model.log_bounds)
    if fixed_time_us:
        arrays["fixed_time_us"] = np.array(float(fixed_time_us), dtype=np.float64)
        arrays["ideal_cycle_features"] = np.array(list(ideal_cycle_features))
    return arrays


def export_weights(model: nn.Module, features: list[str], transform: str, path: str | Path,
                   fixed_time_us: float = 0.0, ideal_cycle_features: tuple[str, ...] = ()) -> Path:
    """Write the numpy weight file of ``model`` (atomically)."""
    from pipeweave.cli import write_atomically

    arrays = exported_arrays(model, list(features), transform, fixed_time_us, ideal_cycle_features)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a file object: np.savez would append .npz to a path
            np.savez(handle, **arrays)

    write_atomically(path, write)
    Path(path).chmod(0o644)
    return Path(path)


def export_model_dir(model_dir: str | Path, op: str) -> Path:
    """Export the checkpoint of one model directory beside it (of an ensemble: every member, then the ensemble)."""
    from pipeweave.ensemble import member_dirs, write_ensemble_weights

    members = member_dirs(model_dir)
    if members:
        for member in members:
            export_model_dir(member, op)
        return write_ensemble_weights(model_dir, op)
    model, metadata = load_model_dir(model_dir, op)
    return export_weights(model, metadata["model_info"]["features"], metadata_transform(metadata),
                          weights_path(model_dir, op), *fixed_time_of(metadata, op))


def fixed_time_of(metadata: dict, op: str) -> tuple[float, tuple[str, ...]]:
    """(the fixed time a model directory's metadata records, the features whose sum is its C_ideal): the
    :func:`exported_arrays` arguments after the transform."""
    from analytical_model.registry import get_operator

    return float(metadata["model_info"].get("fixed_time_us", 0.0)), get_operator(op).ideal_cycle_features


def export_roots(roots: list[str | Path], log=print) -> list[Path]:
    """Export every ``<root>/<op>/<timestamp>/<op>_mlp_model.pth`` and every ensemble (``<timestamp>/members/``)
    under the roots; returns the written files."""
    written = []
    for root in map(Path, roots):
        if not root.is_dir():
            raise FileNotFoundError(f"model root not found: {root}")
        ensembles = {members.parent for members in root.glob("*/*/members")}
        for directory in sorted(ensembles | {c.parent for c in root.glob(f"*/*/*{CHECKPOINT_SUFFIX}")}):
            op = directory.parent.name
            if directory in ensembles or checkpoint_path(directory, op).is_file():
                written.append(export_model_dir(directory, op))
                log(f"exported {written[-1]}")
    return written


def main(argv: list[str] | None = None) -> int:
    from pipeweave.cli import ArgumentParser

    parser = ArgumentParser(prog="pipeweave-export-mlp",
                            description="Write the numpy weight file (<op>_mlp_weights.npz) beside every torch "
                                        "checkpoint under the given model roots (training does this itself).")
    parser.add_argument("roots", nargs="+", help="model roots such as mlp_models mlp_models_quantile")
    args = parser.parse_args(argv)
    if not export_roots(args.roots):
        raise FileNotFoundError(f"no <op>/<timestamp>/<op>{CHECKPOINT_SUFFIX} under {', '.join(args.roots)}")
    return 0


if __name__ == "__main__":
    import sys

    from pipeweave.cli import run_cli

    sys.exit(run_cli(main))
