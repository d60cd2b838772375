from __future__ import annotations

from pathlib import Path

import pytest

from pipeweave.paths import REPO_ROOT as REPO
from pipeweave.paths import shared_data_dir  # the location the code reads


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "pipeweave").is_dir():
        pytest.skip(f"shared measurement data not found at {path} (set PIPEWEAVE_SHARED_DATA)")
    return path
