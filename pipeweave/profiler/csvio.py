"""Raw measurement CSVs: schema, resumable append-only writer, reader for the dataset builder.

One file per operator, ``dataset/measured/<gpu>/<op>.csv``. A row is written (and flushed) as soon as
its measurement finishes, so an interrupted run loses at most the row in flight; the next run reads
the keys already present (op + shape columns + hardware) and measures only what is missing. A row
cut off mid-write (no final newline) is dropped when the file is reopened. A row that timed another
kernel than the one pipeweave models (:func:`unmodelled_kernel`) does not count as present: a rerun
after installing the missing library measures it again and appends the new row, which supersedes it: every
reader keeps the last row of a key (the file is never rewritten, so two runs may append to it at once).
"""
from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Iterator, Sequence

from .grids import OPS, SHAPE_COLUMNS
from .timing import CudaEventTimer, summarize

MEASUREMENT_COLUMNS = (
    "hardware",
    "avg_duration",
    "median_us",
    "min_us",
    "std_us",
    "repeats",
    "dtype",
    "kernel",
    "torch_version",
    "cuda_version",
    "flash_attn_version",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "timestamp",
    "timing",
)
#: the ``timing`` of a row written before the column existed (2026-12-05): CudaEventTimer's flush timing
TIMING_BEFORE_COLUMN = CudaEventTimer.name
#: what the flush timing does to short kernels (measured on an H100, README "Measuring a new GPU"): said wherever
#: such rows are read to train or calibrate
FLUSH_TIMING_GAP = ("which on an H100 timed BF16 GEMMs a median 1.44x (under 10 µs 1.76x) the harness of the data "
                    "pipeweave is trained on")


def columns_before_timing(columns: Sequence[str]) -> tuple[str, ...]:
    """A file's columns as the profiler wrote them before the ``timing`` column (2026-12-05)."""
    return tuple(column for column in columns if column != "timing")


def unmodelled_kernel(op: str, attention_type, kernel) -> str | None:
    """Why a measured row timed another kernel than the one pipeweave models (vLLM's), from its ``kernel`` cell
    (:func:`pipeweave.profiler.launch.kernel_label`); None for a row of the modelled kernel. Such rows neither train
    nor calibrate anything: their time is that of another kernel, not of the GPU."""
    text = str(kernel or "")
    if "[eager" in text:
        return "ran as several eager torch kernels, where vLLM runs one fused kernel (install flashinfer)"
    if op == "siluandmul" and "[fused or eager: unknown" in text:  # only torch's silu(gate)*up was left unlabelled
        return ("ran torch's silu(gate)*up, two eager kernels (labelled unknown without the profiler), where vLLM "
                "runs one fused kernel (install flashinfer)")
    if op == "attn" and str(attention_type).strip().endswith("_paged") and text.startswith("torch.sdpa"):
        return ("decode ran torch SDPA on a contiguous KV cache, not vLLM's paged decode kernel "
                "(install flash-attn)")
    return None


def unmodelled_reasons(op: str, frame) -> list[str | None]:
    """:func:`unmodelled_kernel` of every row of a measured frame (all None without a ``kernel`` column)."""
    if "kernel" not in frame.columns:
        return [None] * len(frame)
    types = frame["attention_type"] if "attention_type" in frame.columns else [None] * len(frame)
    return [unmodelled_kernel(op, kind, cell) for kind, cell in zip(types, frame["kernel"])]


def columns_for(op: str) -> tuple[str, ...]:
    """Column order of ``<op>.csv``: op, shape columns, then :data:`MEASUREMENT_COLUMNS`."""
    if op not in SHAPE_COLUMNS:
        raise ValueError(f"unknown operator {op!r}; choose from {', '.join(OPS)}")
    return ("op", *SHAPE_COLUMNS[op], *MEASUREMENT_COLUMNS)


def key_columns(op: str) -> tuple[str, ...]:
    return ("op", *SHAPE_COLUMNS[op], "hardware")


def measurement_record(op: str, row: dict, device, durations_us: Sequence[float], dtype: str, kernel: str,
                       timing: str) -> dict:
    """One CSV record: the shape ``row``, ``device.row_fields()`` (a :class:`~.device.DeviceInfo`, read now),
    the statistics of ``durations_us``, ``dtype``, the ``kernel`` label and the ``timing`` (the timer's name)."""
    stats = summarize(durations_us)
    record = {"op": op, **row, **device.row_fields()}
    record.update(avg_duration=stats.mean_us, median_us=stats.median_us, min_us=stats.min_us, std_us=stats.std_us,
                  repeats=stats.repeats, dtype=dtype, kernel=kernel, timing=timing)
    return record


def format_value(value) -> str:
    """Canonical text of a cell (the resume key compares text)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) >= 1e-3 or value == 0 else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)


def row_key(op: str, shape: dict, hardware: str) -> tuple[str, ...]:
    return (op, *(format_value(shape[c]) for c in SHAPE_COLUMNS[op]), hardware)


def _repair_tail(path: Path) -> int:
    """Cut a trailing partial line (interrupted write); returns the number of bytes removed."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return 0
        # Walk back to the last newline.
        chunk = 65536
        pos = size
        cut = 0
        while pos > 0:
            start = max(0, pos - chunk)
            handle.seek(start)
            data = handle.read(pos - start)
            idx = data.rfind(b"\n")
            if idx >= 0:
                cut = start + idx + 1
                break
            pos = start
        handle.truncate(cut)
        return size - cut


class MeasurementCsv:
    """Append-only CSV of one operator with resume support."""

    def __init__(self, path: str | Path, op: str, timing: str | None = None):
        """``timing``: the timer of this run; rows of another timing count as stale (measured again, superseded)."""
        self.path = Path(path)
        self.op = op
        self.timing = timing
        self.columns = columns_for(op)
        self.keys = key_columns(op)
        self._key_index = [self.columns.index(c) for c in self.keys]
        self._kind_index = self.columns.index("attention_type") if "attention_type" in self.columns else None
        self._kernel_index = self.columns.index("kernel")
        self._timing_index = self.columns.index("timing")
        self._handle = None
        self.repaired_bytes = 0

    def _check_header(self) -> bool:
        """True when the file exists with our header; False when it is absent or empty."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return False
        self.repaired_bytes = _repair_tail(self.path)
        with self.path.open(newline="") as handle:
            header = next(csv.reader(handle), None)
        if header is None:
            return False
        if tuple(header) == columns_before_timing(self.columns):
            raise ValueError(f"{self.path}: written before the timing column (2026-12-05), so this run cannot append "
                             f"to it; measure into another --output_dir (the file stays readable: its rows are of "
                             f"the '{TIMING_BEFORE_COLUMN}' timing)")
        if tuple(header) != self.columns:
            raise ValueError(
                f"{self.path}: unexpected columns (written by another version?); move the file away to start over.\n"
                f"  found:    {','.join(header)}\n  expected: {','.join(self.columns)}"
            )
        return True

    def _complete_rows(self) -> Iterator[list[str]]:
        """The cells of every complete row (the right number of fields), header left out."""
        with self.path.open(newline="") as handle:
            reader = csv.reader(handle)
            next(reader, None)
            yield from (cells for cells in reader if len(cells) == len(self.columns))

    def _key(self, cells: Sequence[str]) -> tuple[str, ...]:
        return tuple(cells[i] for i in self._key_index)

    def _unmodelled(self, cells: Sequence[str]) -> bool:
        """Whether a row timed another kernel than the one pipeweave models (calibrate's and dataset.build's test)."""
        kind = None if self._kind_index is None else cells[self._kind_index]
        return unmodelled_kernel(self.op, kind, cells[self._kernel_index]) is not None

    def done_keys(self) -> set[tuple[str, ...]]:
        """Keys whose last complete row timed the modelled kernel with this run's timing. A damaged row, a row of a
        stand-in kernel (eager SiLU*Mul, SDPA decode) and one of another timing are measured again: the library
        the WARNING asks for may have been installed since, and the readers keep a key's last row."""
        return self.rows_by_kind()[0]

    def rows_by_kind(self) -> tuple[set[tuple[str, ...]], dict[tuple[str, ...], str]]:
        """(keys done, {key: why it is measured again}) by the last complete row of each key in the file, the row
        every reader keeps: "kernel" for a stand-in kernel's row, "timing" for a modelled row of another timing."""
        if not self._check_header():
            return set(), {}
        last = {self._key(cells): cells for cells in self._complete_rows()}
        done, stale = set(), {}
        for key, cells in last.items():
            if self._unmodelled(cells):
                stale[key] = "kernel"
            elif self.timing is not None and cells[self._timing_index] != self.timing:
                stale[key] = "timing"
            else:
                done.add(key)
        return done, stale

    def open(self) -> "MeasurementCsv":
        if self._handle is None:
            has_header = self._check_header()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a", newline="")
            if not has_header:
                if self.path.stat().st_size:  # header-less garbage (e.g. a cut-off header line)
                    self._handle.truncate(0)
                self._write_cells(self.columns)
        return self

    def _write_cells(self, cells: Sequence[str]) -> None:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(cells)
        self._handle.write(buffer.getvalue())  # one write per row
        self._handle.flush()

    def append(self, record: dict) -> None:
        missing = [c for c in self.columns if c not in record]
        if missing:
            raise ValueError(f"{self.op} row lacks columns {missing}")
        self.open()
        self._write_cells([format_value(record[c]) for c in self.columns])

    def close(self) -> None:
        if self._handle is not None:
            self._handle.flush()
            try:
                os.fsync(self._handle.fileno())
            except OSError:
                pass
            self._handle.close()
            self._handle = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()


# ----------------------------------------------------------------------------------------------
# Reading, for the dataset builder


def iter_measured_files(root: str | Path = "dataset/measured") -> Iterator[tuple[str, str, Path]]:
    """``(gpu directory name, op, path)`` for every ``<root>/<gpu>/<op>.csv`` with a known op, sorted."""
    root = Path(root)
    if not root.is_dir():
        return
    for gpu_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(gpu_dir.glob("*.csv")):
            if path.stem in SHAPE_COLUMNS:
                yield gpu_dir.name, path.stem, path


def read_measured(path: str | Path, op: str | None = None):
    """One measured CSV as a pandas DataFrame in the raw schema; a repeated key keeps its last row."""
    import pandas as pd

    path = Path(path)
    op = op or path.stem
    expected = columns_for(op)
    frame = pd.read_csv(path, dtype={"attention_type": str, "q_lengths": str, "kv_lengths": str, "kernel": str,
                                     "flash_attn_version": str, "hardware": str},
                        keep_default_na=False, na_values={"avg_duration": [""], "sm_clock_mhz": [""],
                                                           "mem_clock_mhz": [""]})
    if tuple(frame.columns) == columns_before_timing(expected):
        frame = frame.assign(timing=TIMING_BEFORE_COLUMN)
    if tuple(frame.columns) != expected:
        raise ValueError(f"{path}: columns {list(frame.columns)} differ from the raw schema {list(expected)}")
    return frame.drop_duplicates(subset=list(key_columns(op)), keep="last").reset_index(drop=True)


def read_all_measured(root: str | Path = "dataset/measured") -> dict[str, "object"]:
    """``{op: DataFrame}`` concatenating every GPU's ``<op>.csv`` under ``root`` (empty dict if none)."""
    import pandas as pd

    frames: dict[str, list] = {}
    for _gpu, op, path in iter_measured_files(root):
        frames.setdefault(op, []).append(read_measured(path, op))
    return {op: pd.concat(parts, ignore_index=True) for op, parts in frames.items()}
