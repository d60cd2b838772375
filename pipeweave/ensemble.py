"""Seed ensembles of one operator's efficiency MLP (training side; prediction reads them in :mod:`pipeweave.mlp`).

K members are trained exactly like a single model, each with its own seed (row sample, validation split and
initialisation). Where the data pin the model down (held-out shapes on a trained GPU) the members agree to a
fraction of a point; where they do not (a GPU or dtype outside the training data, e.g. BF16 GEMMs of GPUs whose
only GEMM measurements are FP8) single seeds differ by tens of percent and now and then one extrapolates absurdly;
the members' median is the estimate that depends neither on the draw nor on one wild member. A model directory
of an ensemble holds

* ``members/seed<S>/``: each member as a complete single-model directory (checkpoint, weights, metadata);
* ``<op>_mlp_weights.npz``: the members' exported weights in one file (format in :mod:`pipeweave.mlp`);
* ``metadata.json``: the first member's, with the ensemble's own test evaluation, an ``ensemble`` entry
  (seeds, each member's training history and its own test error) and ``member_spread``: the
  MEMBER_SPREAD_QUANTILE of the members' disagreement (:meth:`pipeweave.mlp.NumpyMLP.efficiency_and_spread`) on
  its test split, i.e. on held-out shapes of its training GPUs. A prediction whose members disagree more than
  that is flagged as extrapolated (docs/METHOD.md §4.3): only 1 in 100 in-distribution rows are.

    python3 -m pipeweave.ensemble MODEL_DIR [--dataset_dir dataset]   # (re)write member_spread of a model
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from pipeweave.mlp import NumpyMLP, ensemble_arrays, read_weight_arrays, weights_path
from pipeweave.modeling import evaluate, feature_matrix, train_and_evaluate, write_metadata, write_model_dir
from pipeweave.training import TrainConfig

MEMBERS_DIR = "members"
#: the seeds of the shipped ensembles (train_all.sh trains them; leave-one-GPU-out evaluates the same recipe):
#: the operators whose single seeds disagree on GPUs without data (docs/METHOD.md §5.2)
SHIPPED_SEEDS: dict[str, tuple[int, ...]] = {op: (42, 1, 2, 3, 4) for op in ("gemm", "gemm_fp8", "attn", "moe")}
#: the share of in-distribution rows (held-out shapes of training GPUs) allowed above the disagreement threshold
MEMBER_SPREAD_QUANTILE = 0.99


def median_of_members(efficiencies) -> np.ndarray:
    """The ensemble's efficiency from its members' (one array per member): the median of their log-efficiencies,
    as the numpy runtime combines them."""
    return np.exp(np.median(np.log(efficiencies), axis=0))


def member_dirs(model_dir: str | Path) -> list[Path]:
    """The member directories of an ensemble model directory, in training order (empty for a single model)."""
    path = Path(model_dir) / "metadata.json"
    if not path.is_file():
        return []
    seeds = json.loads(path.read_text()).get("ensemble", {}).get("seeds", [])
    return [Path(model_dir) / MEMBERS_DIR / f"seed{seed}" for seed in seeds]


def write_ensemble_weights(model_dir: str | Path, op: str, members: list[Path] | None = None) -> Path:
    """(Re)write an ensemble's weight file from its members' exported weights (default: the members its
    metadata.json lists)."""
    arrays = [read_weight_arrays(weights_path(member, op))
              for member in (member_dirs(model_dir) if members is None else members)]
    if not arrays:
        raise ValueError(f"{model_dir} is not an ensemble model directory (no ensemble seeds in its metadata.json)")
    path = weights_path(model_dir, op)
    with open(path, "wb") as handle:
        np.savez(handle, **ensemble_arrays(arrays))
    path.chmod(0o644)
    return path


def train_ensemble(op: str, train: pd.DataFrame, test: pd.DataFrame, config: TrainConfig, seeds: list[int],
                   out_dir: Path, paths: dict) -> tuple[np.ndarray, dict]:
    """Train one member per seed into ``out_dir/members/``, then :func:`assemble_ensemble`."""
    if len(set(seeds)) != len(seeds) or len(seeds) < 2:
        raise ValueError(f"an ensemble needs at least two distinct seeds, got {seeds}")
    for seed in seeds:
        member_config = replace(config, seed=seed)
        model, history, _, evaluation = train_and_evaluate(op, train, test, member_config)
        write_model_dir(out_dir / MEMBERS_DIR / f"seed{seed}", op, model, history, member_config, train, test,
                        evaluation, paths)
        print(f"  member seed {seed}: best epoch {history['best_epoch'] + 1}, {history['train_seconds']} s")
    return assemble_ensemble(op, out_dir, seeds, test, config)


def assemble_ensemble(op: str, out_dir: Path, seeds: list[int], test: pd.DataFrame,
                      config: TrainConfig) -> tuple[np.ndarray, dict]:
    """Write the ensemble's weights and metadata from the member directories ``out_dir/members/seed<S>``;
    returns its test predictions and evaluation, computed by the numpy runtime as prediction will."""
    directories = [out_dir / MEMBERS_DIR / f"seed{seed}" for seed in seeds]
    members = [json.loads((directory / "metadata.json").read_text()) for directory in directories]
    if any(m["training"]["seed"] != seed for m, seed in zip(members, seeds)):
        raise ValueError(f"{out_dir}: member directories do not match the seeds {seeds}")
    summaries = [{"seed": seed, **{key: m["training"][key] for key in
                                   ("best_epoch", "epochs_run", "best_val_loss", "train_seconds")},
                  **({"machine": m["training"]["machine"]} if "machine" in m["training"] else {}),
                  **({"test_duration_mean_abs_pct_error":
                      m["evaluation_results"]["overall"]["duration_mean_abs_pct_error"]}
                     if "evaluation_results" in m else {})} for m, seed in zip(members, seeds)]
    metadata = members[0]
    metadata["ensemble"] = {"seeds": list(seeds), "combination": "median of the members' log-efficiency outputs",
                            "members": summaries}
    metadata["model_info"]["model_parameters"]["total_parameters"] *= len(seeds)
    metadata["training"] = {**replace(config, seed=seeds[0]).as_dict(), "ensemble_seeds": list(seeds),
                            "train_seconds": round(sum(s["train_seconds"] for s in summaries), 1)}
    model = NumpyMLP.load(write_ensemble_weights(out_dir, op, directories))
    predicted = np.zeros(0)
    if len(test):
        predicted = model.efficiency(feature_matrix(test, op, config), test["sm_freq"].to_numpy(np.float64))
    evaluation = evaluate(test, predicted) if len(test) else {}
    metadata.pop("evaluation_results", None)
    if evaluation:
        metadata["evaluation_results"] = evaluation
    in_distribution = held_out_shapes_of_training_gpus(test, metadata)
    if len(in_distribution):  # none when --holdout_hardware made the test split another GPU's rows
        metadata["member_spread"] = member_spread_entry(model, feature_matrix(in_distribution, op, config))
    write_metadata(out_dir, metadata)
    return predicted, evaluation


def held_out_shapes_of_training_gpus(test: pd.DataFrame, metadata: dict) -> pd.DataFrame:
    """The test rows of the GPUs the model trained on: what its members' disagreement is normal on."""
    return test[test["hardware"].isin(metadata["data_info"]["train_hardware_distribution"])]


def member_spread_entry(model: NumpyMLP, inputs: np.ndarray) -> dict:
    """The ``member_spread`` metadata entry from the model inputs of held-out shapes of its training GPUs."""
    spread = model.spread(inputs)
    return {"threshold": float(np.quantile(spread, MEMBER_SPREAD_QUANTILE)), "quantile": MEMBER_SPREAD_QUANTILE,
            "rows": len(spread),
            "of": "standard deviation of the members' log-efficiency on the test split's rows of the training GPUs "
                  "(held-out shapes)"}


def write_member_spread(model_dir: str | Path, op: str, dataset_dir: str | Path) -> dict:
    """(Re)write ``member_spread`` into an ensemble's metadata.json from its operator's test split."""
    from pipeweave.modeling import dataset_paths, read_dataset

    model_dir = Path(model_dir)
    if not member_dirs(model_dir):
        raise ValueError(f"{model_dir} is not an ensemble model directory (no ensemble seeds in its metadata.json)")
    path = model_dir / "metadata.json"
    metadata = json.loads(path.read_text())
    test = held_out_shapes_of_training_gpus(read_dataset(dataset_paths(op, dataset_dir)[1]), metadata)
    if test.empty:
        raise ValueError(f"{dataset_paths(op, dataset_dir)[1]} has no rows of the GPUs {model_dir} trained on")
    model = NumpyMLP.load(weights_path(model_dir, op))
    metadata["member_spread"] = member_spread_entry(model, test[metadata["model_info"]["features"]].to_numpy(
        np.float64))
    write_metadata(model_dir, metadata)
    return metadata["member_spread"]


def main(argv=None) -> int:
    from pipeweave.cli import ArgumentParser
    from pipeweave.paths import DATASET_DIR

    parser = ArgumentParser(prog="python3 -m pipeweave.ensemble",
                            description="(Re)write the member-disagreement threshold of ensemble model directories.")
    parser.add_argument("model_dirs", nargs="+", help="ensemble directories such as mlp_models/gemm/<timestamp>")
    parser.add_argument("--dataset_dir", default=str(DATASET_DIR),
                        help="folder of <op>_test.csv, the held-out shapes the threshold is measured on "
                             "(default: dataset)")
    args = parser.parse_args(argv)
    for model_dir in args.model_dirs:
        op = Path(model_dir).resolve().parent.name
        entry = write_member_spread(model_dir, op, args.dataset_dir)
        print(f"{model_dir}: member_spread threshold {entry['threshold']:.4f} ({entry['quantile']:.0%} of "
              f"{entry['rows']} test rows)")
    return 0


if __name__ == "__main__":
    from pipeweave.cli import run_cli

    raise SystemExit(run_cli(main))
