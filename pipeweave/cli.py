"""Shared command-line conventions: user errors print one line and exit with status 2."""
from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import signal
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable


class UserError(Exception):
    """A problem with the user's flags or input files; reported without a traceback."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports bad flags as one line (usage is still available with --help)."""

    def __init__(self, *args, prog: str | None = None, **kwargs):
        typed = program_name()
        if prog is not None and prog.endswith(".py") and typed.startswith("pipeweave-"):
            prog = typed  # a console script runs its checkout script's parser: usage names what the user typed
        super().__init__(*args, prog=prog, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(message)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform has one, as in a container)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def process_pool(workers: int, task: str):
    """A context giving a pool of ``workers`` processes for ``task`` (a verb phrase, for messages), or None where
    ``workers`` < 2 (the work then runs in this process). Started by spawn, not fork: a forked child inherits
    torch's thread pools in an undefined state. A machine that cannot start them (no POSIX semaphores: some
    sandboxes and serverless runtimes) is one :class:`UserError` naming ``--workers 1``."""
    if workers < 2:
        return contextlib.nullcontext(None)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    try:
        return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    except (OSError, ImportError) as exc:
        raise UserError(f"cannot start {workers} worker processes to {task} in ({exc}); pass --workers 1 to "
                        f"{task} in this process") from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _bounded_int(text, 1)


def batch_size(text: str) -> int:
    """argparse type: rows per optimiser step, at least 2 (BatchNorm needs two rows; one-row batches are skipped)."""
    return _bounded_int(text, 2)


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _bounded_int(text, 0)


def seed_list(text: str) -> list[int]:
    """argparse type: at least two distinct non-negative integers, comma separated."""
    seeds = [_bounded_int(part.strip(), 0) for part in text.split(",") if part.strip()]
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected at least two distinct seeds such as 42,1,2, got {text!r}")
    return seeds


def trainable_operator_list(text: str) -> list[str]:
    """argparse type: a comma list of trainable operator classes (the registry's), at least one."""
    from analytical_model.registry import operator_keys

    known = operator_keys(trainable=True)
    ops = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [op for op in ops if op not in known]
    if unknown or not ops:
        raise argparse.ArgumentTypeError(f"unknown operator class {unknown[0] if unknown else '(none)'!r}; known: "
                                         f"{', '.join(known)}")
    return ops


def _bounded_int(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def finite_float(text: str) -> float:
    """argparse type: a finite number (nan and inf are refused: they would compare false everywhere)."""
    value = _number(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def check_device(device: str) -> str:
    """``device`` if it is cpu or an available CUDA device, else a UserError saying what to use instead."""
    name = str(device).strip().lower()
    if name == "cpu":
        return name
    if name != "cuda" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise UserError(f"--device {device}: unknown device; use cpu or cuda (cuda:N for one GPU)")
    import torch

    if not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is visible to torch; use --device cpu")
    if ":" in name and int(name[5:]) >= torch.cuda.device_count():
        raise UserError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return name


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) during a run: unwinds like Ctrl-C so that temporary files are removed."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler API
    raise Interrupted(signum)


def program_name() -> str:
    """The name the user typed: ``python3 -m analytical_model`` rather than ``__main__.py``, ``python3 -m
    pipeweave.bounds`` rather than ``bounds.py`` (a module of a package: run with -m)."""
    if not (sys.argv and sys.argv[0]):
        return "pipeweave"
    path = Path(sys.argv[0])
    if path.suffix != ".py" or not (path.parent / "__init__.py").is_file():
        return path.name
    parts = [] if path.name == "__main__.py" else [path.stem]
    package = path.parent
    while (package / "__init__.py").is_file():
        parts.insert(0, package.name)
        package = package.parent
    return f"python3 -m {'.'.join(parts)}"



@contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for the block (restored as it was): where the block allocates many
    objects, none of them cyclic, or where a pause would land inside a timed interval."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _LogThatOutlivesItsReader:
    """Standard output that, once its reader has gone (``aggregator.py ... | head -1``), drops what is printed instead
    of failing: the log is a view of the work, and the work (the files it writes) must not stop with it."""

    def __init__(self, stream):
        self._stream = stream
        self._reader_gone = False

    def write(self, text: str) -> int:
        if not self._reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop_the_rest()
        return len(text)

    def flush(self) -> None:
        if not self._reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop_the_rest()

    def _drop_the_rest(self) -> None:
        self._reader_gone = True
        try:  # the interpreter flushes standard output at exit: the descriptor must not fail then either
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # a stream without a descriptor (a test's capture)
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def run_cli(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> int:
    """Run ``main``; turn user errors, unreadable files and bad values into ``<prog>: error: ...`` + exit 2.

    SIGTERM unwinds like Ctrl-C (temporary files are removed) and exits 128 + signal number. Printing to a pipe
    whose reader has gone drops the rest of the log and lets the work finish."""
    prog = program_name()
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread (e.g. a test runner's worker): leave signals alone
        previous = None
    stdout = sys.stdout
    sys.stdout = _LogThatOutlivesItsReader(stdout)
    try:
        code = main(argv)
    except UnicodeDecodeError as exc:  # a binary or mis-encoded input read somewhere without its own check
        print(f"{prog}: error: an input file is not UTF-8 text ({exc.reason} at byte {exc.start}); check the files "
              f"given on the command line", file=sys.stderr)
        return 2
    except KeyError as exc:  # a JSON/CSV input without a field the code needs
        print(f"{prog}: error: an input lacks the field {exc.args[0]!r} (check the files given on the command line)",
              file=sys.stderr)
        return 2
    except (UserError, FileNotFoundError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.filename is not None:  # raised by open(): args[0] is the errno
            message = f"{exc.filename}: {exc.strerror}"
        else:
            message = exc.args[0] if exc.args else str(exc)
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    except OSError as exc:  # unreadable input, read-only folder, a file where a folder is expected, disk full...
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{prog}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"{prog}: error: an input is nested too deeply to read (a JSON file with thousands of levels?)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"{prog}: interrupted ({signal.Signals(signum).name}); outputs not reported as written are "
              f"incomplete", file=sys.stderr)
        return 128 + int(signum)
    finally:
        sys.stdout = stdout
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return int(code or 0)


#: the file name that means standard input or output (``--input -``, ``--output -``)
STANDARD_STREAM = "-"


def require_file(path: str | Path, what: str) -> Path:
    """``path`` as a Path if it is a file; else FileNotFoundError "<what> not found: path", or, for a folder, that it
    is one (a folder was reported as "not found")."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"{what} {path} is a directory, not a file")
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def require_png(path: str | Path, flag: str = "--plot") -> None:
    """A figure is written as PNG whatever its name (through a temporary file, so matplotlib cannot take the format
    from the name): under another suffix (``--plot cdf.pdf``) the file would hold PNG bytes."""
    if Path(path).suffix.lower() != ".png":
        raise UserError(f"{flag} {path}: the figure is written as PNG; give a .png file name")


def check_output_path(path: str | Path, flag: str = "--output", hardware_dir: str | Path | None = None) -> Path:
    """``path`` if a file can be written there, else a UserError naming the flag (checked before any work, so that
    a bad second output never follows a written first one). A JSON file is refused among the GPU specs
    (:func:`check_output_folder`)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a directory; give a file name")
    if path.suffix.lower() == ".json":
        check_output_folder(path.parent, f"{flag} {path}", hardware_dir)
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK) and not (path.exists() and os.access(path, os.W_OK)):
        raise UserError(f"{flag} {path}: the folder {parent} is not writable")
    return path


def check_output_folder(folder: str | Path, flag: str, hardware_dir: str | Path | None = None,
                        config_dir: str | Path | None = None) -> None:
    """A UserError if JSON outputs would land in a folder every command reads each JSON of as one input: the shipped
    hardware folder and ``hardware_dir`` (GPU specs), ``config_dir`` (model configs). One output there stopped every
    command for every GPU."""
    from pipeweave.paths import DEFAULT_HARDWARE_DIR

    folder = Path(folder).resolve()
    reserved_folders = ((DEFAULT_HARDWARE_DIR, "GPU spec"), (hardware_dir, "GPU spec"), (config_dir, "model config"))
    for reserved, holds in reserved_folders:
        if reserved is not None and folder == Path(reserved).resolve():
            raise UserError(f"{flag}: {reserved} holds the {holds} JSONs, and every command reads each JSON there "
                            f"as one; write to another folder")


def refuse_overwriting_inputs(path: str | Path, inputs: dict, flag: str = "--output") -> None:
    """A UserError if the output ``path`` is one of the ``inputs`` (what names it -> its path, or None), checked
    before any work: calibrate.py --output m.csv replaced the measurements it was fitted from."""
    where = Path(path).resolve()
    for what, given in inputs.items():
        if given is not None and Path(given).resolve() == where:
            raise UserError(f"{flag} {path} would overwrite {what}; choose another path")


def save_png(fig, path: str | Path, dpi: int) -> None:
    """Write a matplotlib figure as PNG, atomically, without the "Software" text chunk: matplotlib writes its own
    version there, so a committed figure's bytes would change with the installed matplotlib, not with its data."""
    write_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": None}))


def write_atomically(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(file)`` so that a failure leaves no partial output.

    A regular file (or a new path) is written to a temporary file beside it and renamed into place, with the mode
    the umask gives a new file (an existing file keeps its mode). A symlink is written through (the link stays);
    a special file such as /dev/null is written directly, since renaming onto it would replace the device."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    if target.exists() and not target.is_file():
        if target.is_dir():
            raise UserError(f"cannot write {path}: it is a directory")
        write(target)
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.chmod(tmp_path, mode)
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def print_report(text: str, output: str | Path | None) -> None:
    """Print a generated report and, with ``output``, also write it there (atomically)."""
    print(text, end="")
    if output:
        write_atomically(output, lambda tmp: tmp.write_text(text))


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


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
