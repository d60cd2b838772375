"""Shared command-line conventions: user errors print one line and exit with status 2."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable


class UserError(Exception):
    """A problem with the user's flags or input files; reported without a traceback."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad flags as one line (usage is still available with --help)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(message)


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run ``main``; turn UserError, missing files and bad values into ``<prog>: error: ...`` + exit 2."""
    prog = Path(sys.argv[0]).name
    try:
        code = main(argv)
    except (UserError, FileNotFoundError, ValueError, KeyError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


def write_atomically(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` and move the result into place, so a failure leaves no partial file."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()
