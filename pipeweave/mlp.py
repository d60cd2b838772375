"""The efficiency MLPs at prediction time: a numpy forward pass over exported weights (no torch).

Training (:mod:`pipeweave.torch_mlp`, torch) writes, beside each checkpoint ``<op>_mlp_model.pth``, an exported
weight file ``<op>_mlp_weights.npz`` that this module reads. Its arrays (all float32 unless noted):

=========================== ===================================================================================
``format``                  ``"pipeweave-mlp-v1"`` (string)
``architecture``            ``"MLP"`` (sigmoid output: efficiency) or ``"MLP_v2"`` (log-efficiency output)
``input_transform``         how raw input rows become the network's input (string, :data:`INPUT_TRANSFORMS`):
                            ``"log1p(float32(x))"`` (docs/METHOD.md §4.1) or ``"pipe-shares(float32(x))"``
                            (:func:`model_inputs`)
``features``                the raw input names, in order (strings; the same as ``metadata.json``)
``num_layers``              number of linear layers L (int; 4 for the shipped models)
``linear{i}.weight/.bias``  layer i's weight (out, in) and bias, i = 0 .. L-1
``bn{i}.mean/.var/.weight`` the batch norm after layer i's ReLU (i < L-1): running mean and variance,
``bn{i}.bias/.eps``         affine weight and bias, and eps (float64), as trained (not folded)
``log_bounds``              MLP_v2 only: [low, high] clamp of the predicted log-efficiency
``members``                 optional (int, default 1): an ensemble of K independently seeded members; member j's
                            ``linear*``, ``bn*`` and ``log_bounds`` arrays then carry the prefix ``member{j}.``
``fixed_time_us``           optional (float64, default 0): a time t0 every kernel takes besides its work; the
                            network then predicts the efficiency p_w of the rest, t = t0 + C_ideal / (p_w f)
``ideal_cycle_features``    with ``fixed_time_us``: the features whose sum is C_ideal (strings)
=========================== ===================================================================================

Forward (eval mode; dropout is the identity): ``h = x``; for each hidden layer ``h = bn(relu(W h + b))`` with
``bn(z) = (z - mean) / sqrt(var + eps) * weight + bias``; then ``y = W h + b`` of the last layer. Efficiency is
``sigmoid(y)`` for ``MLP`` and ``exp(clip(y, *log_bounds))`` for ``MLP_v2`` (docs/METHOD.md §5.1). An ensemble
takes the median of its members' (clipped) ``y``. Members differ only in their seed; where the data do not pin the
model down (a GPU or dtype outside the training data) single seeds differ by tens of percent and now and then one
extrapolates absurdly (a GEMM 1000x too slow), so the median, not the mean, is the ensemble's estimate.
A model with a fixed time reports the efficiency over the whole duration, C_ideal / (f t) with t as above, so it
needs the GPU's SM clock f (:func:`total_efficiency`); its edges and members' disagreement stay in p_w.
:class:`NumpyMLP` folds each batch norm into the following linear layer when it loads (in float64: exact to
rounding), which halves the work of the pass, and runs the pass in float64. It equals the torch model evaluated in
float64 to ~1e-14 relative, and torch's float32 pass to float32 rounding (≤ ~1e-5; tests/test_runtime.py).

A model directory ``<root>/<op>/<timestamp>/`` holds the weight file and ``metadata.json``; :func:`load_model_dir`
checks that the two agree.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from analytical_model.pipes import float32_sum

WEIGHTS_FORMAT = "pipeweave-mlp-v1"
#: every input log1p'd (docs/METHOD.md §4.1): the artifact's transform
LOG1P = "log1p(float32(x))"
#: each pipe's cycles as a share of the busiest pipe's, the busiest pipe's cycles, the shape (:func:`model_inputs`)
PIPE_SHARES = "pipe-shares(float32(x))"
INPUT_TRANSFORMS = (LOG1P, PIPE_SHARES)
#: a pipe below this share of the busiest one counts as idle (keeps the log finite for a pipe with no work)
MIN_PIPE_SHARE = 1e-6
CHECKPOINT_SUFFIX = "_mlp_model.pth"
WEIGHTS_SUFFIX = "_mlp_weights.npz"


def total_efficiency(work_efficiency: np.ndarray, ideal_us: np.ndarray, fixed_time_us: float) -> np.ndarray:
    """The efficiency over a kernel's whole duration, C / (f t), from that of its work above the fixed time t0:
    t = t0 + ideal_us / p_w (``ideal_us`` = C / f)."""
    work_efficiency = np.asarray(work_efficiency, dtype=np.float64)
    if not fixed_time_us:
        return work_efficiency
    ideal_us = np.asarray(ideal_us, dtype=np.float64)
    return ideal_us / (fixed_time_us + ideal_us / work_efficiency)


def work_efficiency(efficiency: np.ndarray, ideal_us: np.ndarray, fixed_time_us: float) -> np.ndarray:
    """The inverse of :func:`total_efficiency`: C / (f (t − t0)) of kernels of efficiency C / (f t); an error where
    a duration t is not above t0 (the fixed time could not be part of it)."""
    efficiency = np.asarray(efficiency, dtype=np.float64)
    if not fixed_time_us:
        return efficiency
    duration = np.asarray(ideal_us, dtype=np.float64) / efficiency
    if (duration <= fixed_time_us).any():
        raise ValueError(f"a duration of {duration.min():.3g} us is not above the fixed time of {fixed_time_us} us "
                         f"that every kernel of the model takes")
    return np.asarray(ideal_us, dtype=np.float64) / (duration - fixed_time_us)


#: metadata key of the combinations of an operator's discrete inputs (registry ``discrete_inputs``) its training
#: rows hold: {"inputs": names, "seen": [[value, ...], ...]}
DISCRETE_INPUTS_KEY = "discrete_input_values"


def discrete_inputs_entry(names, rows: np.ndarray) -> dict:
    """The :data:`DISCRETE_INPUTS_KEY` entry of training ``rows`` (one column per name of ``names``)."""
    return {"inputs": list(names), "seen": sorted(list(row) for row in {tuple(map(float, r)) for r in rows})}


def checkpoint_path(model_dir: str | Path, op: str) -> Path:
    """The torch checkpoint a training run writes (read only by the training extras)."""
    return Path(model_dir) / f"{op}{CHECKPOINT_SUFFIX}"


def weights_path(model_dir: str | Path, op: str) -> Path:
    """The exported weights the numpy forward pass reads."""
    return Path(model_dir) / f"{op}{WEIGHTS_SUFFIX}"


@lru_cache(maxsize=1)
def _blas_threads():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def metadata_transform(metadata: dict) -> str:
    """The input transform a model directory's metadata names (models written before the field: log1p)."""
    return str(metadata["model_info"].get("input_transform", LOG1P))


def _cycle_input(name: str) -> bool:
    return name.endswith("_cycle")


def _absolute_demand(name: str) -> bool:
    """A pipe's operation count or bytes in flight (analytical_model.pipes): how much work, not how long."""
    return name.endswith("_ops") or name.endswith("_in_flight")


@lru_cache(maxsize=64)
def _pipe_share_columns(names: tuple[str, ...]) -> tuple[list[int], list[int]]:
    """(the cycle inputs, the shape inputs) of raw input ``names`` for :data:`PIPE_SHARES`."""
    cycles = [i for i, name in enumerate(names) if _cycle_input(name)]
    shape = [i for i, name in enumerate(names) if not _cycle_input(name) and not _absolute_demand(name)]
    return cycles, shape


def transformed_names(names, transform: str) -> list[str]:
    """Names of the network's input columns that :func:`model_inputs` makes from raw inputs ``names``."""
    names = tuple(str(name) for name in names)
    if transform == LOG1P:
        return list(names)
    if transform == PIPE_SHARES:
        cycles, shape = _pipe_share_columns(names)
        return ([f"share({names[i]})" for i in cycles] + ["log(busiest_cycles)"]
                + [f"log1p({names[i]})" for i in shape])
    raise ValueError(f"unknown input transform {transform!r}; known: {', '.join(INPUT_TRANSFORMS)}")


def model_inputs(raw: np.ndarray, names=None, transform: str = LOG1P) -> np.ndarray:
    """The network's input from raw input rows (float32, columns ``names``).

    ``LOG1P`` (docs/METHOD.md §4.1): log1p of every input. ``PIPE_SHARES``: every cycle input (``*_cycle``: a
    pipe's cycles at spec peak, features and descriptors alike) as the log of its share of the row's busiest
    one, that busiest count as log cycles, and the other inputs but the pipes' absolute demands (operation
    counts and bytes in flight) log1p'd: the shape descriptors. Efficiency depends on which pipe binds, by how
    much, and on the kernel's size and shape; the absolute per-pipe counts add how fast each pipe of the GPU is,
    a fingerprint of the training GPUs that an unseen GPU's model extrapolates from (docs/METHOD.md §4.1).
    """
    x = np.asarray(raw, dtype=np.float32)
    if transform == LOG1P:
        return np.log1p(x)
    if transform != PIPE_SHARES:
        raise ValueError(f"unknown input transform {transform!r}; known: {', '.join(INPUT_TRANSFORMS)}")
    names = tuple(str(name) for name in names)
    if x.ndim != 2 or x.shape[1] != len(names):
        raise ValueError(f"expected input rows of width {len(names)} ({', '.join(names)}), got shape {x.shape}")
    cycle_columns, shape_columns = _pipe_share_columns(names)
    cycles = x[:, cycle_columns].astype(np.float64)
    busiest = np.maximum(cycles.max(axis=1, initial=0.0), 1.0)
    shares = np.log(np.maximum(cycles, 0.0) / busiest[:, None] + MIN_PIPE_SHARE)
    return np.column_stack([shares, np.log(busiest), np.log1p(x[:, shape_columns])]).astype(np.float32)


class NumpyMLP:
    """An exported efficiency MLP; :meth:`efficiency` maps raw feature rows to ``overall_perf``."""

    def __init__(self, arrays: dict[str, np.ndarray], source: str = "<arrays>"):
        if str(arrays.get("format", "")) != WEIGHTS_FORMAT:
            raise ValueError(f"{source}: not a {WEIGHTS_FORMAT} weight file")
        self.input_transform = str(arrays["input_transform"])
        if self.input_transform not in INPUT_TRANSFORMS:
            raise ValueError(f"{source}: unsupported input transform {self.input_transform!r}; known: "
                             f"{', '.join(INPUT_TRANSFORMS)}")
        self.source = source
        self.architecture = str(arrays["architecture"])
        if self.architecture not in ("MLP", "MLP_v2"):
            raise ValueError(f"{source}: unknown architecture {self.architecture!r}; known: MLP, MLP_v2")
        self.features = [str(name) for name in arrays["features"]]
        count = int(arrays["num_layers"])
        prefixes = [""] if "members" not in arrays else [f"member{j}." for j in range(int(arrays["members"]))]
        if not prefixes:
            raise ValueError(f"{source}: an ensemble weight file needs at least one member")
        members = [_folded_layers(arrays, prefix, count) for prefix in prefixes]
        # members stacked per layer, (members, in, out) and (members, 1, out): one batched matmul per layer
        self.layers = [(np.stack([m[i][0] for m in members]), np.stack([m[i][1] for m in members])[:, None, :])
                       for i in range(count)]
        width = len(transformed_names(self.features, self.input_transform))
        if self.layers[0][0].shape[1] != width:
            raise ValueError(f"{source}: the first layer takes {self.layers[0][0].shape[1]} inputs, but "
                             f"{self.input_transform} makes {width} of its {len(self.features)} features")
        self.log_bounds = (np.stack([arrays[f"{prefix}log_bounds"].astype(np.float64) for prefix in prefixes])
                           if self.architecture == "MLP_v2" else None)
        #: the time every kernel takes besides its work (us; module docstring), and C_ideal's features
        self.fixed_time_us = float(arrays.get("fixed_time_us", 0.0))
        ideal_names = [str(name) for name in arrays.get("ideal_cycle_features", [])]
        if self.fixed_time_us and not ideal_names:
            raise ValueError(f"{source}: a fixed time needs ideal_cycle_features, the features C_ideal sums")
        unknown = [name for name in ideal_names if name not in self.features]
        if unknown:
            raise ValueError(f"{source}: ideal_cycle_features {unknown} are not among its features")
        self.ideal_columns = [self.features.index(name) for name in ideal_names]
        #: monotone bounds beyond the training data (:class:`pipeweave.edges.TrainingEdges`), set by whoever
        #: knows that data: the predictor from the model's metadata, the held-out evaluations from their rows
        self.edges = None

    @classmethod
    def load(cls, path: str | Path) -> "NumpyMLP":
        return cls(read_weight_arrays(path), str(path))

    @classmethod
    def from_members(cls, paths: list[Path], source: str) -> "NumpyMLP":
        """One model from single-model weight files (an ensemble of them if more than one)."""
        arrays = [read_weight_arrays(path) for path in paths]
        return cls(ensemble_arrays(arrays) if len(arrays) > 1 else arrays[0], source)

    @property
    def input_dim(self) -> int:
        """Width of the raw input rows (:attr:`features`)."""
        return len(self.features)

    def inputs(self, raw: np.ndarray) -> np.ndarray:
        """The network's input for raw input rows (:func:`model_inputs` with this model's transform)."""
        return model_inputs(raw, self.features, self.input_transform)

    def output(self, inputs: np.ndarray) -> np.ndarray:
        """Each member's last-layer output for transformed inputs (:meth:`inputs`): shape (members, rows)."""
        h = np.asarray(inputs, dtype=np.float64)[None]
        for weight, bias in self.layers[:-1]:
            h = h @ weight
            h += bias
            np.maximum(h, 0.0, out=h)
        weight, bias = self.layers[-1]
        return (h @ weight + bias)[:, :, 0]

    def efficiency(self, features: np.ndarray, sm_freq: float | np.ndarray | None = None) -> np.ndarray:
        """``overall_perf`` for raw feature rows (columns in ``self.features`` order) on a GPU of SM clock
        ``sm_freq`` (MHz; per row or one; needed only by a model with a fixed time)."""
        return self.efficiency_and_spread(features, sm_freq)[0]

    def efficiency_and_spread(self, features: np.ndarray, sm_freq: float | np.ndarray | None = None
                              ) -> tuple[np.ndarray, np.ndarray]:
        """(``overall_perf``, the members' disagreement) for raw feature rows, from one forward pass. The
        disagreement is the standard deviation of the members' log-efficiencies (0 for a single model): members
        trained alike agree where the training data pin the answer down and scatter where the input lies outside
        what they saw, even when every input is inside its training range (docs/METHOD.md §4.3)."""
        inputs = self._checked_inputs(features)
        if len(inputs) == 0:
            return np.zeros(0), np.zeros(0)
        ideal_us = self._ideal_us(features, sm_freq)
        # One BLAS thread: the batches are a few hundred rows, where thread start-up and contention cost far
        # more than they save (the aggregator's 403-iteration benchmark on a busy 2-core machine: 150 ms with
        # the default OpenBLAS threads, 47 ms with one).
        with _blas_threads().limit(limits=1, user_api="blas"):
            y = self.output(inputs)
            work = self._within_edges(inputs, self._median_efficiency(y))
            return total_efficiency(work, ideal_us, self.fixed_time_us), self._log_efficiencies(y).std(axis=0)

    def spread(self, features: np.ndarray) -> np.ndarray:
        """The members' disagreement of :meth:`efficiency_and_spread` alone (it needs no SM clock)."""
        inputs = self._checked_inputs(features)
        with _blas_threads().limit(limits=1, user_api="blas"):
            return self._log_efficiencies(self.output(inputs)).std(axis=0) if len(inputs) else np.zeros(0)

    def within_edges(self, features: np.ndarray, efficiency: np.ndarray,
                     sm_freq: float | np.ndarray | None = None) -> np.ndarray:
        """``efficiency`` of raw feature rows (this model's or its members' prediction, on a GPU of SM clock
        ``sm_freq``) inside the monotone bounds of :attr:`edges` (unchanged without edges)."""
        if self.edges is None:
            return np.asarray(efficiency, dtype=np.float64)
        ideal_us = self._ideal_us(np.asarray(features), sm_freq)
        with _blas_threads().limit(limits=1, user_api="blas"):
            work = self._within_edges(self._checked_inputs(features),
                                      work_efficiency(efficiency, ideal_us, self.fixed_time_us))
            return total_efficiency(work, ideal_us, self.fixed_time_us)

    def _ideal_us(self, features: np.ndarray, sm_freq) -> np.ndarray | None:
        """C_ideal / f of raw feature rows (C_ideal summed as the registry sums it); None without a fixed time,
        which needs none."""
        if not self.fixed_time_us:
            return None
        if sm_freq is None:
            raise ValueError(f"{self.source}: the model takes a fixed {self.fixed_time_us} us out of every kernel, "
                             f"so its efficiency needs the GPU's SM clock")
        cycles = float32_sum(np.asarray(features)[:, self.ideal_columns])
        return cycles.astype(np.float64) / np.asarray(sm_freq, dtype=np.float64)

    def _within_edges(self, inputs: np.ndarray, efficiency: np.ndarray) -> np.ndarray:
        if self.edges is None:
            return efficiency
        return self.edges.bound(inputs, efficiency, lambda rows: self._median_efficiency(self.output(rows)))

    def _checked_inputs(self, features: np.ndarray) -> np.ndarray:
        """:meth:`inputs` of raw feature rows of the right width."""
        features = np.asarray(features)
        if features.ndim != 2 or features.shape[1] != self.input_dim:
            raise ValueError(f"{self.source}: expected feature rows of width {self.input_dim}, got shape "
                             f"{features.shape}")
        return self.inputs(features)

    def _median_efficiency(self, y: np.ndarray) -> np.ndarray:
        """The ensemble's efficiency: the members' median of the raw outputs for a sigmoid head, of the clamped
        log-efficiencies for MLP_v2 (a single model: its own)."""
        if self.log_bounds is None:  # sigmoid(y) = exp(-log(1 + exp(-y))), without overflow for very negative y
            return np.exp(-np.logaddexp(0.0, -np.median(y, axis=0)))
        return np.exp(np.median(self._log_efficiencies(y), axis=0))

    def _log_efficiencies(self, y: np.ndarray) -> np.ndarray:
        """Each member's log-efficiency from its last-layer output (MLP_v2: clamped to its training bounds)."""
        if self.log_bounds is None:
            return -np.logaddexp(0.0, -y)
        return np.clip(y, self.log_bounds[:, :1], self.log_bounds[:, 1:])


def read_weight_arrays(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def _folded_layers(arrays: dict[str, np.ndarray], prefix: str, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """One member's (weight (in, out), bias) per layer in float64, each batch norm folded into the next layer."""
    layers = []
    for i in range(count):
        weight = arrays[f"{prefix}linear{i}.weight"].astype(np.float64).T
        bias = arrays[f"{prefix}linear{i}.bias"].astype(np.float64)
        if i:  # bn(h) = h * scale + offset  =>  bn(h) @ W + b = h @ (scale[:, None] * W) + (offset @ W + b)
            norm = {key: arrays[f"{prefix}bn{i - 1}.{key}"].astype(np.float64)
                    for key in ("mean", "var", "weight", "bias")}
            scale = norm["weight"] / np.sqrt(norm["var"] + float(arrays[f"{prefix}bn{i - 1}.eps"]))
            offset = norm["bias"] - norm["mean"] * scale
            weight, bias = scale[:, None] * weight, offset @ weight + bias
        layers.append((weight, bias))
    return layers


def ensemble_arrays(members: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One weight file's arrays from the exported arrays of K single models trained alike (same features)."""
    first = members[0]
    if any([str(f) for f in m["features"]] != [str(f) for f in first["features"]]
           or str(m["architecture"]) != str(first["architecture"])
           or str(m["input_transform"]) != str(first["input_transform"]) for m in members):
        raise ValueError("ensemble members must share architecture, input transform and features")
    if any(float(m.get("fixed_time_us", 0.0)) != float(first.get("fixed_time_us", 0.0)) for m in members):
        raise ValueError("ensemble members must share their fixed time")
    shared = ("format", "architecture", "input_transform", "features", "num_layers", "fixed_time_us",
              "ideal_cycle_features")
    arrays = {key: first[key] for key in shared if key in first}
    arrays["members"] = np.array(len(members))
    for j, member in enumerate(members):
        arrays.update({f"member{j}.{key}": value for key, value in member.items() if key not in shared})
    return arrays


def latest_model_dir(root: str | Path, op: str) -> Path:
    """The lexicographically last timestamp directory under ``root/op`` that holds exported weights and its
    ``metadata.json``, which training writes last: a folder whose training was interrupted before it is not a
    model (it had made every prediction fail on "metadata.json is missing")."""
    base = Path(root) / op
    candidates = sorted(d for d in base.glob("*") if d.is_dir() and weights_path(d, op).is_file()
                        and (d / "metadata.json").is_file())
    if candidates:
        return candidates[-1]
    interrupted = sorted(d for d in base.glob("*") if d.is_dir() and weights_path(d, op).is_file())
    if interrupted:
        raise FileNotFoundError(
            f"{interrupted[-1]} has no metadata.json, which training writes last: its training was interrupted; "
            f"delete the folder and train again with: python3 train_mlp.py --op {op}")
    unexported = sorted(d for d in base.glob("*") if d.is_dir() and checkpoint_path(d, op).is_file())
    if unexported:
        raise FileNotFoundError(
            f"{unexported[-1]} has a torch checkpoint but no exported {weights_path(unexported[-1], op).name}; "
            f"export it with: pipeweave-export-mlp {base.parent} (needs the training extras)")
    from pipeweave.paths import DEFAULT_MODEL_DIR

    shipped = Path(DEFAULT_MODEL_DIR) / op
    elsewhere = Path(root).resolve() != Path(DEFAULT_MODEL_DIR).resolve()
    raise FileNotFoundError(
        f"no trained {op} model under {base} (expected {base}/<timestamp>/{op}{WEIGHTS_SUFFIX}); "
        f"train one with: python3 train_mlp.py --op {op}"
        + (f" --output_dir {root}, or copy the shipped {shipped} into {root} (a model folder needs every "
           f"operator the prediction uses)" if elsewhere and shipped.is_dir() else ""))


def read_metadata(model_dir: str | Path) -> dict:
    meta_path = Path(model_dir) / "metadata.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} is missing (every model directory needs its metadata.json)")
    return json.loads(meta_path.read_text())


def load_model_dir(model_dir: str | Path, op: str) -> tuple[NumpyMLP, dict]:
    """The exported model of a directory and its metadata (their architecture and features must agree)."""
    metadata = read_metadata(model_dir)
    model = NumpyMLP.load(weights_path(model_dir, op))
    info = metadata["model_info"]
    if (model.architecture != info.get("architecture", "MLP") or model.features != list(info["features"])
            or model.input_transform != metadata_transform(metadata)
            or model.fixed_time_us != float(info.get("fixed_time_us", 0.0))):
        raise ValueError(f"{model.source} does not match {Path(model_dir) / 'metadata.json'} (architecture, input "
                         f"transform, features or fixed time differ); re-export it with: pipeweave-export-mlp "
                         f"{Path(model_dir).parent.parent}")
    return model, metadata
