"""Monotone bounds where a pipe-share model reads a pipe share beyond its training data (docs/METHOD.md §4.3).

A ReLU network extrapolates linearly beyond its training data, in whatever direction its last rows suggest. For
the pipe shares (:data:`pipeweave.mlp.PIPE_SHARES`) the physics fixes the direction. Efficiency is ``C_ideal``,
the work of the *ideal pipe* (the tensor pipe of GEMM, attention and MoE), over the kernel's cycles:

* a larger share of any other pipe (more memory, L2 or shared-memory demand per unit of the busiest pipe's work)
  cannot make the kernel faster relative to its ideal work, so efficiency does not increase with it;
* a larger share of the ideal pipe itself (the other pipes relatively smaller) cannot make it slower relative to
  that work, so efficiency does not decrease with it.

So where a share lies beyond the range of the training rows, the model evaluated with that share moved to the
edge of the range bounds the efficiency on one side. An other pipe's share above the training maximum: the
efficiency is at most the edge's; below the minimum: at least the edge's; the ideal pipe's shares the other way
round. The model's own value is kept when it lies on the permitted side. Inside the range nothing changes, so
the bound touches only GPUs whose balance of pipes no training GPU has (A100's per-SM L2 demand is above every
other GPU's, with A100 held out). Leave-one-GPU-out: BF16 GEMM A100 20.6 → 15.5 %; docs/METHOD.md §4.3 has every
cell that moved and the variants tried.

A model's edges are the minima and maxima of its network inputs over its training rows, stored in its
``metadata.json`` as ``network_input_ranges`` (``train_mlp.py`` writes them; ``python3 -m pipeweave.edges
MODEL_DIR`` writes them for a model trained before, from the dataset it was trained on).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from analytical_model.registry import get_operator
from pipeweave.mlp import (DISCRETE_INPUTS_KEY, PIPE_SHARES, discrete_inputs_entry, metadata_transform, model_inputs,
                           transformed_names)

METADATA_KEY = "network_input_ranges"


@dataclass(frozen=True)
class TrainingEdges:
    """Per network input: the training minimum and maximum; which inputs are the ideal pipe's shares, which the
    other pipes'."""

    low: np.ndarray
    high: np.ndarray
    ideal: np.ndarray
    other: np.ndarray

    def beyond(self, inputs: np.ndarray) -> np.ndarray:
        """Per network input row: whether a pipe share lies outside its training range (where :meth:`bound`
        acts)."""
        shares = self.ideal | self.other
        return ((inputs[:, shares] < self.low[shares]) | (inputs[:, shares] > self.high[shares])).any(axis=1)

    def bound(self, inputs: np.ndarray, efficiency: np.ndarray,
              efficiency_of: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """``efficiency`` of the network input rows ``inputs`` kept on the permitted side of the model's value at
        the edge (``efficiency_of``: the model's efficiency of network input rows), row by row and bound by bound:
        the other pipes' shares first, then the ideal pipe's."""
        efficiency = np.array(efficiency, dtype=np.float64)
        bounds, edges = [], []
        for columns, above, below in ((self.other, np.minimum, np.maximum), (self.ideal, np.maximum, np.minimum)):
            for beyond, keep in (((inputs[:, columns] > self.high[columns]).any(axis=1), above),
                                 ((inputs[:, columns] < self.low[columns]).any(axis=1), below)):
                if beyond.any():
                    edge = np.array(inputs[beyond], dtype=np.float64)
                    edge[:, columns] = np.clip(edge[:, columns], self.low[columns], self.high[columns])
                    bounds.append((beyond, keep))
                    edges.append(edge)
        if not edges:
            return efficiency
        # one pass of the model over every edge point (the passes cost more per call than per row)
        at_edges = np.split(efficiency_of(np.concatenate(edges)), np.cumsum([len(edge) for edge in edges])[:-1])
        for (beyond, keep), value in zip(bounds, at_edges):
            efficiency[beyond] = keep(efficiency[beyond], value)
        return efficiency


def share_groups(op: str, names) -> tuple[np.ndarray, np.ndarray]:
    """(the ideal pipe's shares, the other pipes' shares) among the network inputs a pipe-share model of ``op``
    makes from raw inputs ``names``: a cycle input belongs to the ideal pipe when its name, without the
    descriptors' ``exact_`` prefix, starts with that of a ``C_ideal`` feature's pipe (``tensor_all_cycle``:
    ``tensor_``)."""
    pipes = tuple(name.removesuffix("all_cycle") for name in get_operator(op).ideal_cycle_features)
    columns = transformed_names(names, PIPE_SHARES)
    shares = [name[len("share("):-1] if name.startswith("share(") else None for name in columns]
    ideal = np.array([share is not None and share.removeprefix("exact_").startswith(pipes) for share in shares])
    other = np.array([share is not None for share in shares]) & ~ideal
    return ideal, other


def ranges_entry(names, raw_rows: np.ndarray) -> dict:
    """The ``network_input_ranges`` metadata entry of a pipe-share model from its raw training input rows
    (columns ``names``): per network input, [minimum, maximum]."""
    inputs = model_inputs(raw_rows, names, PIPE_SHARES).astype(np.float64)
    return {name: [float(low), float(high)] for name, low, high in
            zip(transformed_names(names, PIPE_SHARES), inputs.min(axis=0), inputs.max(axis=0))}


def edges_from_ranges(op: str, names, ranges: dict) -> TrainingEdges:
    """:class:`TrainingEdges` of a pipe-share model of ``op`` with raw inputs ``names`` from its
    ``network_input_ranges`` entry (:func:`ranges_entry`)."""
    columns = transformed_names(names, PIPE_SHARES)
    missing = [name for name in columns if name not in ranges]
    if missing:
        raise ValueError(f"network_input_ranges lacks {', '.join(missing)}")
    ideal, other = share_groups(op, names)
    return TrainingEdges(np.array([ranges[name][0] for name in columns], dtype=np.float64),
                         np.array([ranges[name][1] for name in columns], dtype=np.float64), ideal, other)


def frame_edges(op: str, names, train) -> TrainingEdges:
    """:class:`TrainingEdges` of a pipe-share model of ``op`` with raw inputs ``names`` trained on the rows of the
    frame ``train``."""
    names = list(names)
    return edges_from_ranges(op, names, ranges_entry(names, train[names].to_numpy(np.float64)))


def model_edges(op: str, metadata: dict, where: str) -> TrainingEdges | None:
    """The edges a model directory's metadata stores (None for a model that does not read pipe shares); a
    pipe-share model without them is an error naming ``where`` and the command that writes them."""
    if metadata_transform(metadata) != PIPE_SHARES:
        return None
    if METADATA_KEY not in metadata:
        raise ValueError(f"{where}/metadata.json lacks {METADATA_KEY}; write it with: python3 -m pipeweave.edges "
                         f"{where}")
    try:
        return edges_from_ranges(op, metadata["model_info"]["features"], metadata[METADATA_KEY])
    except ValueError as exc:
        raise ValueError(f"{where}/metadata.json: {exc}; rewrite it with: python3 -m pipeweave.edges {where}") from None


def write_ranges(model_dir: str | Path, op: str, dataset_dir: str | Path) -> dict:
    """(Re)write ``network_input_ranges`` into a pipe-share model's metadata.json from the training split of the
    GPUs it trained on, and for an operator with discrete inputs (registry ``discrete_inputs``) the combinations of
    them it held (:data:`pipeweave.mlp.DISCRETE_INPUTS_KEY`); the split must be the one it trained on (its digest,
    or for older models its ``feature_ranges``, is checked). Returns the edges."""
    from pipeweave.modeling import dataset_paths, feature_ranges, read_dataset

    path = Path(model_dir) / "metadata.json"
    metadata = json.loads(path.read_text())
    if "model_info" not in metadata or "data_info" not in metadata:
        raise ValueError(f"{path} is not a trained model's metadata (no model_info or data_info)")
    discrete = list(get_operator(op).discrete_inputs)
    if metadata_transform(metadata) != PIPE_SHARES and not discrete:
        raise ValueError(f"{model_dir} does not read pipe shares ({metadata_transform(metadata)}): it has no edges")
    names = metadata["model_info"]["features"]
    train_path = dataset_paths(op, dataset_dir)[0]
    train = read_dataset(train_path)
    train = train[train["hardware"].isin(metadata["data_info"]["train_hardware_distribution"])]
    recorded = metadata["data_info"].get("digest", {}).get("train_path")  # models trained since 2026-12-04
    if recorded is not None:
        from pipeweave.calibration import file_digest

        same = file_digest(train_path) == recorded
    else:
        same = len(train) == metadata["data_info"]["train_samples"] and feature_ranges(train, names) == metadata[
            "feature_ranges"]
    if not same:
        raise ValueError(f"{train_path} is not the training split {model_dir} was trained on (its row count or "
                         f"input ranges differ); rebuild the dataset (python3 -m dataset.build) or retrain")
    if metadata_transform(metadata) == PIPE_SHARES:
        metadata[METADATA_KEY] = ranges_entry(names, train[names].to_numpy(np.float64))
    if discrete:
        metadata[DISCRETE_INPUTS_KEY] = discrete_inputs_entry(discrete, train[discrete].to_numpy(np.float64))
    path.write_text(json.dumps(metadata, indent=2, ensure_ascii=False))
    return metadata.get(METADATA_KEY, {})


def main(argv=None) -> int:
    from pipeweave.cli import ArgumentParser
    from pipeweave.paths import DATASET_DIR

    parser = ArgumentParser(prog="python3 -m pipeweave.edges",
                            description="(Re)write the training edges (network_input_ranges) of pipe-share model "
                                        "directories, and the combinations of an operator's discrete inputs "
                                        f"({DISCRETE_INPUTS_KEY}), from the dataset they were trained on.")
    parser.add_argument("model_dirs", nargs="+", type=Path, help="model directories <root>/<op>/<timestamp>")
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR,
                        help="folder of <op>_train.csv (default: dataset/)")
    args = parser.parse_args(argv)
    for model_dir in args.model_dirs:
        op = model_dir.resolve().parent.name
        ranges = write_ranges(model_dir, op, args.dataset_dir)
        discrete = f" and {DISCRETE_INPUTS_KEY}" if get_operator(op).discrete_inputs else ""
        print(f"{model_dir}: {METADATA_KEY} of {len(ranges)} inputs{discrete} written")
    return 0


if __name__ == "__main__":
    from pipeweave.cli import run_cli

    raise SystemExit(run_cli(main))
