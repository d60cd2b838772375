"""Console scripts of the installed package (``[project.scripts]`` in pyproject.toml).

Each runs an existing command's ``main`` under :func:`pipeweave.cli.run_cli` (one ``error:`` line and exit
status 2 on a bad flag or input). The command's module is imported only when it runs, so that ``--help`` of a
prediction command never imports the training stack.
"""
from __future__ import annotations

import sys
from importlib import import_module
from pathlib import Path

from pipeweave.cli import run_cli

#: top-level modules that only an extra installs: the extra to name when one is missing
OPTIONAL_MODULES = {"torch": "train", "sklearn": "train", "joblib": "train", "aiconfigurator_core": "train",
                    "pandas": "train", "tqdm": "train", "matplotlib": "train", "dask": "serve", "distributed": "serve"}
EXTRA_NAMES = {"train": "training", "serve": "serving"}


def _run(module: str, extra: str = "train") -> int:
    """Run ``module.main`` as a command; a module of a missing extra is one error line naming the extra to install
    (``extra``: the one the command itself needs, e.g. serve; the module's own extra where it is another)."""
    try:
        return run_cli(import_module(module).main)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in OPTIONAL_MODULES:
            raise
        needed = extra if extra != "train" else OPTIONAL_MODULES[top]
        print(f"{Path(sys.argv[0]).name}: error: this command needs the {EXTRA_NAMES[needed]} extras "
              f"(pip install 'pipeweave[{needed}]'; module {exc.name!r} is missing)", file=sys.stderr)
        return 2


def aggregate() -> int:
    """pipeweave-aggregate: end-to-end latency of workloads on GPUs (aggregator.py)."""
    return _run("pipeweave.aggregate")


def predict_kernels() -> int:
    """pipeweave-predict-kernels: kernel durations for a CSV of shapes (predict_kernels.py)."""
    return _run("pipeweave.kernels")


def generate_workload() -> int:
    """pipeweave-generate-workload: workload JSON from a model config and a trace (workload_generator.py)."""
    return _run("pipeweave.generate_cli")


def features() -> int:
    """pipeweave-features: analytical features of a CSV of shapes (python3 -m analytical_model features)."""
    return _run("analytical_model.__main__")


def export_mlp() -> int:
    """pipeweave-export-mlp: numpy weight files beside torch checkpoints (training extras)."""
    return _run("pipeweave.torch_mlp")


def compare() -> int:
    """pipeweave-compare {summarize-real,static,vllm,runs}: predictions against measured runs (training extras;
    ``runs``, your own runs, on the base install as calibrate.py --e2e)."""
    if sys.argv[1:2] == ["runs"]:
        return run_cli(lambda argv: import_module("pipeweave.run_scores").main(sys.argv[2:] if argv is None else argv))
    if sys.argv[1:2] in (["-h"], ["--help"]):  # answered without the training extras, which only some commands need
        print("usage: pipeweave-compare {summarize-real,static,vllm,runs} [options] (each command has --help; runs "
              "works on the base install, the others need the training extras)")
        return 0
    return _run("pipeweave.compare")


def calibrate() -> int:
    """pipeweave-calibrate: a per-GPU calibration from measured runs or kernels (calibrate.py)."""
    return _run("pipeweave.calibration_fit")


def serve_sim() -> int:
    """pipeweave-serve-sim: serving simulation with continuous batching (serve_sim.py; serve extras)."""
    return _run("pipeweave.serving.cli", extra="serve")


def search_config() -> int:
    """pipeweave-search-config: GPU / TP / PP / max_num_seqs search under latency targets (search_config.py; serve
    extras)."""
    return _run("pipeweave.serving.search", extra="serve")
