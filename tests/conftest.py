from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from pipeweave.cli import usable_cores
from pipeweave.paths import REPO_ROOT as REPO
from pipeweave.paths import shared_data_dir  # the location the code reads


# the same examples on every run: a property test that found a failure once finds it again (deterministic suite)
settings.register_profile("pipeweave", derandomize=True, database=None)
settings.load_profile("pipeweave")


MAX_TEST_PROCESSES = 4  # each holds torch and a dataset or two (up to 1.5 GB); more gain little, files are long


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int | None:
    """`-n auto`: the usable cores, at most MAX_TEST_PROCESSES (xdist's own count takes psutil's physical cores,
    half of them where a core runs two hardware threads); with PYTEST_XDIST_AUTO_NUM_WORKERS set, xdist reads it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return max(1, min(MAX_TEST_PROCESSES, usable_cores()))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    """Untrained models in the shipped layout (``<root>/<op>/<stamp>/``), written once for the whole session;
    tests that damage a model copy this folder first."""
    from benchmarks.aggregator import write_untrained_models

    return write_untrained_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "pipeweave").is_dir():
        pytest.skip(f"shared measurement data not found at {path} (set PIPEWEAVE_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def built_datasets(shared_data) -> Path:
    """The built operator datasets (dataset/<op>_{train,test}.csv); a test that reads them skips where they are not
    built (the shared data without aiconfigurator-core, whose tables are one of their sources), as it does without
    the shared data."""
    from analytical_model.registry import operator_keys
    from pipeweave.paths import DATASET_DIR

    missing = [f"{op}_{part}.csv" for op in operator_keys(trainable=True) for part in ("train", "test")
               if not (DATASET_DIR / f"{op}_{part}.csv").is_file()]
    if missing:
        pytest.skip(f"dataset/{missing[0]} not built (python3 -m dataset.build; needs the shared data and "
                    f"aiconfigurator-core)")
    return DATASET_DIR


def pytest_sessionstart(session):
    """Build the operator datasets once when the shared measurements are here and the CSVs are not, so that the
    data tests run (CI, a developer's checkout) instead of skipping; without the shared data they skip with a
    reason, as on a user's machine."""
    from analytical_model.registry import operator_keys
    from pipeweave.paths import DATASET_DIR

    missing = [op for op in operator_keys(trainable=True)
               if not all((DATASET_DIR / f"{op}_{part}.csv").is_file() for part in ("train", "test"))]
    if not missing or not (shared_data_dir() / "pipeweave").is_dir():
        return
    from dataset.aiconfigurator import aiconfigurator_data_dir
    from dataset.build import main as build_datasets

    if aiconfigurator_data_dir() is None:  # its installed tables are one of the sources
        return

    print(f"\nbuilding the datasets the data tests read ({', '.join(missing)}): python3 -m dataset.build")
    build_datasets(["--ops", ",".join(missing), "--no_collectives"])
