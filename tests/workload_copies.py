"""Test helper: small copies of shipped workloads (pytest puts this folder on sys.path for the test modules)."""
from __future__ import annotations

import json
from pathlib import Path


def first_iterations(path: Path, folder: Path, iterations: int, edit=None, name: str | None = None) -> Path:
    """A copy of the workload JSON ``path`` with only its first ``iterations`` iterations, optionally edited in place
    by ``edit(data)``, written into ``folder`` (as ``name``, default the original file name)."""
    data = json.loads(Path(path).read_text())
    data["iterations"] = data["iterations"][:iterations]
    if edit:
        edit(data)
    out = Path(folder) / (name or Path(path).name)
    out.write_text(json.dumps(data))
    return out
