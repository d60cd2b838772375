"""Leave-one-GPU-out (LOGO) models, trained once and cached outside git.

The k-shot calibration evaluation (``pipeweave.calibration_eval``) needs, per operator and held-out GPU,
a base model that never saw that GPU, and its predictions on every row of that GPU. Training them all
takes minutes of CPU per operator, so each member's model directory and predictions are cached under
``<cache>/<op>/<GPU>/seed<S>/`` together with a fingerprint of the dataset files and the training setup: a
rebuilt dataset or a changed recipe retrains, anything else is read back.

The setup is the accuracy report's (``pipeweave.accuracy``: same recipe, row cap and epochs), so the
k = 0 column of the evaluation is the report's LOGO column. An operator that ships as a seed ensemble
(:data:`pipeweave.ensemble.SHIPPED_SEEDS`) is evaluated as one: a LOGO member per seed, combined as the shipped
model combines them (median log-efficiency), so the column measures the recipe that ships, not one draw.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.registry import get_operator
from pipeweave.cli import write_atomically
from pipeweave.ensemble import SHIPPED_SEEDS, median_of_members
from pipeweave.mlp import LOG1P
from pipeweave.modeling import (dataset_paths, fixed_time_us, input_transform, load_splits, train_and_evaluate,
                                write_model_dir)
from pipeweave.paths import REPO_ROOT
from pipeweave.training import TrainConfig

DEFAULT_CACHE = REPO_ROOT / ".cache" / "logo"
LOGO_MAX_ROWS_PER_GPU = 8000
LOGO_EPOCHS = 100


def logo_config() -> TrainConfig:
    return TrainConfig(epochs=LOGO_EPOCHS, max_rows_per_gpu=LOGO_MAX_ROWS_PER_GPU, progress=False)


def logo_seeds(op: str) -> tuple[int, ...]:
    """The seeds of ``op``'s LOGO members: the shipped ensemble's, else the single model's."""
    return SHIPPED_SEEDS.get(op, (logo_config().seed,))


def _fingerprint(op: str, dataset_dir: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for path in dataset_paths(op, dataset_dir):
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    digest.update(json.dumps(logo_config().as_dict(), sort_keys=True).encode())
    transform = input_transform(op, logo_config())
    if transform != LOG1P:  # caches of log1p models predate the transform's choice and stay valid
        digest.update(transform.encode())
    fixed = fixed_time_us(op, logo_config())
    if fixed:  # likewise caches of models without a fixed time
        digest.update(f"fixed_time_us={fixed!r}".encode())
    discrete = get_operator(op).discrete_inputs
    if discrete:  # their metadata records the combinations the extrapolation flag reads (caches before it lack them)
        digest.update(f"discrete_inputs={discrete!r}".encode())
    return digest.hexdigest()


def gpus_with_data(op: str, dataset_dir: Path) -> list[str]:
    train_path, test_path = dataset_paths(op, dataset_dir)
    columns = ["hardware"]
    return sorted(set(pd.read_csv(train_path, usecols=columns)["hardware"])
                  | set(pd.read_csv(test_path, usecols=columns)["hardware"]))


def cache_directory(cache: Path, op: str, gpu: str) -> Path:
    """Where the LOGO members of ``op`` without ``gpu`` live (``seed<S>/model/``, ``seed<S>/predicted.npy``)."""
    return cache / op / gpu.replace(" ", "_").replace("/", "_")


def member_model_dirs(op: str, gpu: str, cache: Path = DEFAULT_CACHE) -> list[Path]:
    """The model directories of the LOGO members of ``op`` without ``gpu``, in :func:`logo_seeds` order."""
    directory = cache_directory(Path(cache), op, gpu)
    return [directory / f"seed{seed}" / "model" for seed in logo_seeds(op)]


def logo_predictions(op: str, gpu: str, dataset_dir: Path, cache: Path = DEFAULT_CACHE,
                     fingerprint: str | None = None, log=print
                     ) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray, dict]:
    """(the other GPUs' training rows, every row of ``gpu``, the LOGO model's predicted efficiency on them,
    training history of its first member).

    One member per seed of :func:`logo_seeds`, combined by the median of their log-efficiencies; each member is
    trained (and cached) on the other GPUs' training rows when its cache is missing or stale.
    """
    fingerprint = fingerprint or _fingerprint(op, Path(dataset_dir))
    train, test = load_splits(op, dataset_dir, [gpu])
    members = [_member_predictions(op, gpu, seed, train, test, cache_directory(Path(cache), op, gpu) / f"seed{seed}",
                                   f"{fingerprint}-seed{seed}", log) for seed in logo_seeds(op)]
    predicted = median_of_members([efficiency for efficiency, _ in members])
    return train, test, predicted, members[0][1]


def _member_predictions(op: str, gpu: str, seed: int, train: pd.DataFrame, test: pd.DataFrame, directory: Path,
                        fingerprint: str, log) -> tuple[np.ndarray, dict]:
    info_path = directory / "logo.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        if info["fingerprint"] == fingerprint and info["rows"] == len(test):
            note = other_machine_note(op, gpu, seed, directory)
            if note:
                log(note)
            return np.load(directory / "predicted.npy"), info["history"]
    log(f"  training LOGO {op} without {gpu} (seed {seed}) ...")
    config = replace(logo_config(), seed=seed)
    model, history, predicted, _ = train_and_evaluate(op, train, test, config)
    history = {k: v for k, v in history.items() if k not in ("train_loss", "val_loss")}
    write_model_dir(directory / "model", op, model, history, config, train, None, None,
                    {"holdout_hardware": gpu})
    np.save(directory / "predicted.npy", predicted)
    info = {"op": op, "gpu": gpu, "seed": seed, "fingerprint": fingerprint, "rows": int(len(test)),
            "history": history}
    write_atomically(info_path, lambda tmp: tmp.write_text(json.dumps(info, indent=2)))
    return predicted, history


def other_machine_note(op: str, gpu: str, seed: int, directory: Path) -> str | None:
    """The line said when a cached member was trained on another processor or torch build than this one: the
    fingerprint holds the data, the recipe and MKL's float path, not the machine, and the same setup trained
    different models on an Intel and an AMD machine (README, "Deterministic across machines": up to 3.5 points), so
    a table scored from cached members of two machines is no one machine's."""
    from pipeweave.torch_mlp import training_machine

    metadata_path = directory / "model" / "metadata.json"
    metadata = json.loads(metadata_path.read_text()) if metadata_path.is_file() else {}
    machine = metadata.get("training", {}).get("machine")
    here = training_machine()
    if machine == here:
        return None
    trained = "an unrecorded machine" if not machine else f"{machine.get('cpu')} ({machine.get('cpu_capability')}, " \
                                                        f"torch {machine.get('torch')})"
    return (f"  note: cached LOGO {op} without {gpu} (seed {seed}) was trained on {trained}, not on this machine "
            f"({here['cpu']}, {here['cpu_capability']}, torch {here['torch']}); it is reused as it is")


def _train_held_out(op: str, gpu: str, dataset_dir: Path, cache: Path, fingerprint: str) -> str:
    logo_predictions(op, gpu, dataset_dir, cache, fingerprint, log=lambda m: print(m, flush=True))
    return f"{op} without {gpu}"


def train_all(ops, dataset_dir: Path, cache: Path = DEFAULT_CACHE, log=print, workers: int = 1) -> None:
    """Train (or verify) every LOGO member of ``ops``. With ``workers`` > 1 the held-out GPUs are trained in that
    many processes at once; each member trains single-threaded with its own seed, so the cache is the same."""
    jobs = []
    for op in ops:
        gpus = gpus_with_data(op, dataset_dir)
        if len(gpus) >= 2:
            fingerprint = _fingerprint(op, Path(dataset_dir))
            jobs += [(op, gpu, Path(dataset_dir), Path(cache), fingerprint) for gpu in gpus]
    if workers < 2 or len(jobs) < 2:
        for op, gpu, dataset, root, fingerprint in jobs:
            logo_predictions(op, gpu, dataset, root, fingerprint, log)
        return
    from pipeweave.cli import process_pool

    with process_pool(workers, "train the held-out models") as pool:
        for done in pool.map(_train_held_out, *zip(*jobs)):
            log(f"  done: {done}")


def main(argv=None) -> int:
    from analytical_model.registry import operator_keys
    from pipeweave.cli import ArgumentParser, positive_int, trainable_operator_list
    from pipeweave.paths import DATASET_DIR

    parser = ArgumentParser(prog="python3 -m pipeweave.logo_cache",
                            description="Train (or verify) the cached leave-one-GPU-out models.")
    parser.add_argument("--ops", type=trainable_operator_list, default=list(operator_keys(trainable=True)),
                        help="comma list of operator classes (default: every trainable one)")
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR,
                        help="the built datasets (default: dataset)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="where the held-out models are cached (default: .cache/logo, git-ignored)")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="held-out GPUs trained at once, one process each (default 1; the cache is the same)")
    args = parser.parse_args(argv)
    train_all(args.ops, args.dataset_dir, args.cache, log=lambda m: print(m, flush=True), workers=args.workers)
    return 0


if __name__ == "__main__":
    import sys

    from pipeweave.cli import run_cli

    sys.exit(run_cli(main))
