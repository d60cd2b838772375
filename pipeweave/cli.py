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


def keep_marked_sections(text: str, path: str | Path) -> str:
    """``text`` plus the sections of the existing document at ``path`` that another generator owns.

    A section runs from ``<!-- NAME:begin -->`` to ``<!-- NAME:end -->`` (e.g. the calibration evaluations in
    docs/ACCURACY.md and docs/E2E.md); regenerating the rest of the document keeps it, at the end.
    """
    import re

    path = Path(path)
    if not path.is_file():
        return text
    old = path.read_text()
    kept = [m.group(0) for m in re.finditer(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", old, flags=re.S)
            if f"<!-- {m.group(1)}:begin -->" not in text]
    return text.rstrip("\n") + "".join(f"\n\n{section}" for section in kept) if kept else text


def write_marked_section(path: str | Path, name: str, section: str) -> None:
    """Replace the section ``name`` of a generated document (see keep_marked_sections), or append it."""
    path = Path(path)
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    section = f"{begin}\n{section.strip()}\n{end}"
    text = path.read_text() if path.is_file() else ""
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    write_atomically(path, lambda tmp: tmp.write_text(text))
