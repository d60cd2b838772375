"""Where things are: the repository's folders and the shared measurement data (one definition each).

The shared data folder is ``$PIPEWEAVE_SHARED_DATA`` if set, else ``shared/data`` beside the repository; it holds
the public measurements the dataset builder, the collective models and the end-to-end comparison read in place
(see docs/DATA.md).
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HARDWARE_DIR = REPO_ROOT / "hardware"
DEFAULT_CONFIG_DIR = REPO_ROOT / "config"
DEFAULT_WORKLOAD_DIR = REPO_ROOT / "workload"
DEFAULT_TRACE_DIR = DEFAULT_WORKLOAD_DIR / "traces"
DATASET_DIR = REPO_ROOT / "dataset"
DEFAULT_MEASURED_DIR = DATASET_DIR / "measured"
DEFAULT_MODEL_DIR = REPO_ROOT / "mlp_models"
DEFAULT_QUANTILE_DIR = REPO_ROOT / "mlp_models_quantile"
DEFAULT_COLLECTIVE_DIR = REPO_ROOT / "collective_models"
DOCS_DIR = REPO_ROOT / "docs"
E2E_DIR = REPO_ROOT / "e2e"
SHARED_DATA_ENV = "PIPEWEAVE_SHARED_DATA"


def shared_data_dir() -> Path:
    """The configured shared data folder (it may not exist: see :func:`existing_shared_data_dir`)."""
    env = os.environ.get(SHARED_DATA_ENV)
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def existing_shared_data_dir() -> Path | None:
    """The shared data folder, or None when it is absent."""
    path = shared_data_dir()
    return path if path.is_dir() else None
