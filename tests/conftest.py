from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    return Path(os.environ.get("PIPEWEAVE_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "pipeweave").is_dir():
        pytest.skip(f"shared measurement data not found at {path} (set PIPEWEAVE_SHARED_DATA)")
    return path
