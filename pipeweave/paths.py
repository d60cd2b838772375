"""Where things are: the shipped data, the repository's folders and the shared measurement data (one definition
each).

**Shipped data** (GPU spec sheets, model configs, traces, workloads, trained models): in a repository checkout the
checkout's folders (``hardware/``, ``config/``, ``mlp_models/``, ...); an installed copy (``pip install .``)
carries the same folders as package data under ``pipeweave/_data/`` (see ``pyproject.toml``), which is used when
present. ``PIPEWEAVE_DATA_ROOT`` overrides both, e.g. to point an installed copy at a checkout with retrained
models.

**Checkout-only folders** (datasets, docs, end-to-end results, evaluation runs) are under the repository root; for
an installed copy, which has no repository, under the working directory (never inside the installed package). So are
the workloads the generator writes there, which a workload stem also names (:func:`workload_stem_dirs`).

The shared data folder is ``$PIPEWEAVE_SHARED_DATA`` if set, else ``shared/data`` beside the repository (for an
installed copy: beside the working directory); it holds the public measurements the dataset builder, the collective
models and the end-to-end comparison read in place (see docs/DATA.md).
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
INSTALLED_DATA_ROOT = PACKAGE_DIR / "_data"
#: whether this code runs from a repository checkout (an editable install included) rather than an installed copy
CHECKOUT = not INSTALLED_DATA_ROOT.is_dir()
#: where the checkout-only folders are: the repository root, or for an installed copy the working directory
WORK_ROOT = REPO_ROOT if CHECKOUT else Path(".")
DATA_ROOT_ENV = "PIPEWEAVE_DATA_ROOT"


def data_root() -> Path:
    override = os.environ.get(DATA_ROOT_ENV)
    if override:
        return Path(override)
    return REPO_ROOT if CHECKOUT else INSTALLED_DATA_ROOT


DATA_ROOT = data_root()
DEFAULT_HARDWARE_DIR = DATA_ROOT / "hardware"
DEFAULT_CONFIG_DIR = DATA_ROOT / "config"
DEFAULT_WORKLOAD_DIR = DATA_ROOT / "workload"
DEFAULT_TRACE_DIR = DEFAULT_WORKLOAD_DIR / "traces"
DEFAULT_MODEL_DIR = DATA_ROOT / "mlp_models"
DEFAULT_QUANTILE_DIR = DATA_ROOT / "mlp_models_quantile"
DEFAULT_COLLECTIVE_DIR = DATA_ROOT / "collective_models"
# the generator writes beside the shipped workloads in a checkout; never into an installed package
DEFAULT_WORKLOAD_OUTPUT_DIR = DEFAULT_WORKLOAD_DIR if CHECKOUT else WORK_ROOT / "workload"

DATASET_DIR = WORK_ROOT / "dataset"
DEFAULT_MEASURED_DIR = DATASET_DIR / "measured"
#: evaluation runs (leave-one-GPU-out models): never read by the predictor, so they cannot replace a shipped model
DEFAULT_RUNS_DIR = WORK_ROOT / "runs"
DOCS_DIR = WORK_ROOT / "docs"
E2E_DIR = WORK_ROOT / "e2e"
SHARED_DATA_ENV = "PIPEWEAVE_SHARED_DATA"


#: the console script of each top-level script (pyproject.toml [project.scripts]), which an installed copy runs instead
CONSOLE_SCRIPTS = {"aggregator.py": "pipeweave-aggregate", "predict_kernels.py": "pipeweave-predict-kernels",
                   "workload_generator.py": "pipeweave-generate-workload", "calibrate.py": "pipeweave-calibrate",
                   "serve_sim.py": "pipeweave-serve-sim", "search_config.py": "pipeweave-search-config"}


def command(script: str) -> str:
    """How the user runs ``script`` (e.g. calibrate.py), for messages: the script in a checkout, its console script in
    an installed copy, which has no scripts."""
    return script if CHECKOUT else CONSOLE_SCRIPTS[script]


def data_root_note(path: str | Path) -> str:
    """For an error about a missing ``path`` of the shipped data: that ``PIPEWEAVE_DATA_ROOT`` chose it, when it did."""
    override = os.environ.get(DATA_ROOT_ENV)
    if override and Path(path).is_relative_to(DATA_ROOT):
        return f" ({DATA_ROOT_ENV} is {override})"
    return ""


def workload_stem_dirs(workload_dir: Path) -> list[Path]:
    """The folders a workload stem is looked up in, in order: ``workload_dir``; for the default folder of an
    installed copy, first the folder the generator writes to (``./workload``), so that a generated workload is found
    by the stem it was written under, as in a checkout."""
    if Path(workload_dir) == DEFAULT_WORKLOAD_DIR and DEFAULT_WORKLOAD_OUTPUT_DIR != DEFAULT_WORKLOAD_DIR:
        return [DEFAULT_WORKLOAD_OUTPUT_DIR, DEFAULT_WORKLOAD_DIR]
    return [Path(workload_dir)]


def shared_data_dir() -> Path:
    """The configured shared data folder (it may not exist: see :func:`existing_shared_data_dir`)."""
    env = os.environ.get(SHARED_DATA_ENV)
    return Path(env) if env else WORK_ROOT.resolve().parent / "shared" / "data"


def existing_shared_data_dir() -> Path | None:
    """The shared data folder, or None when it is absent."""
    path = shared_data_dir()
    return path if path.is_dir() else None


#: the shared data's source folders the dataset build and the collective training read
SHARED_SOURCES = ("pipeweave", "vidur")


def require_shared_data(command: str) -> Path:
    """The shared data folder, or a UserError: a dataset or model built from aiconfigurator-core's tables alone
    would silently replace the existing ones with fewer GPUs. The folder must hold every source folder
    (:data:`SHARED_SOURCES`): an unrelated existing folder named by the environment variable built a dataset without
    A40 and H20 rows."""
    from pipeweave.cli import UserError

    path = existing_shared_data_dir()
    if path is None:
        raise UserError(f"{command} needs the shared measurement data, not found at {shared_data_dir()}; set "
                        f"{SHARED_DATA_ENV} to its folder (without it the output would hold aiconfigurator-core's "
                        f"GPUs only and replace the existing one)")
    missing = [f"{name}/" for name in SHARED_SOURCES if not (path / name).is_dir()]
    if missing:
        raise UserError(f"{command} needs the shared measurement data: {path} was found but lacks "
                        f"{' and '.join(missing)}; set {SHARED_DATA_ENV} to the folder that holds "
                        f"{' and '.join(f'{name}/' for name in SHARED_SOURCES)} (without them the output would lack "
                        f"their GPUs and replace the existing one)")
    return path
