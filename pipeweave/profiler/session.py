"""Measure a grid into the per-operator CSVs, skipping rows already done.

:func:`measure_grid` is independent of torch: it takes a ``prepare(op, row)`` callable (the runners, or a
fake in tests), a timer and a :class:`~pipeweave.profiler.device.DeviceInfo`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from .csvio import MeasurementCsv, measurement_record, row_key
from .device import DeviceInfo
from .launch import Prepared, Unsupported, first_line, kernel_label


@dataclass
class OpSummary:
    planned: int = 0
    already_done: int = 0
    measured: int = 0
    unsupported: int = 0
    failed: int = 0
    left: int = 0
    messages: list[str] = field(default_factory=list)


@dataclass
class RunSummary:
    ops: dict[str, OpSummary]
    stopped_early: bool = False

    @property
    def measured(self) -> int:
        return sum(s.measured for s in self.ops.values())

    def lines(self) -> list[str]:
        out = []
        for op, s in self.ops.items():
            parts = [f"{s.measured} measured", f"{s.already_done} already done"]
            if s.unsupported:
                parts.append(f"{s.unsupported} unsupported")
            if s.failed:
                parts.append(f"{s.failed} failed")
            if s.left:
                parts.append(f"{s.left} left")
            out.append(f"  {op:<11} {s.planned:>6} rows: " + ", ".join(parts))
        return out


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="row", dynamic_ncols=True, file=sys.stderr)


def measure_grid(
    rows: dict[str, list[dict]],
    *,
    out_dir: str | Path,
    device: DeviceInfo,
    prepare: Callable[[str, dict], Prepared],
    timer,
    repeats: int,
    warmup: int,
    kernel_names: Callable[[Callable], list[str] | None] | None = None,
    after_error: Callable[[], None] | None = None,
    deadline: float | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
) -> RunSummary:
    """Measure every row not yet in ``<out_dir>/<op>.csv``; append each result as soon as it exists.

    ``deadline`` is a ``time.monotonic()`` value after which no new row is started. Rows the backend
    cannot run (:class:`Unsupported`) and rows that fail (e.g. out of memory) are reported, not written,
    so a later run tries them again.
    """
    summaries, pending, writers = _open_outputs(rows, Path(out_dir), device.name, log)
    record = partial(_measured_record, timer=timer, repeats=repeats, warmup=warmup, kernel_names=kernel_names,
                     device=device)
    total = sum(len(v) for v in pending.values())
    bar = _progress(total, progress)
    say = bar.write if bar is not None else log
    stopped = False
    try:
        for op, todo in pending.items():
            summary = summaries[op]
            if not todo:
                continue
            if bar is not None:
                bar.set_description(op)
            for index, row in enumerate(todo):
                if deadline is not None and time.monotonic() >= deadline:
                    summary.left += len(todo) - index
                    stopped = True
                    break
                try:
                    failed = _measure_row(op, row, prepare, record, writers[op], summary, say)
                finally:
                    if bar is not None:
                        bar.update(1)
                if failed and after_error is not None:
                    after_error()  # after _measure_row returned: nothing pins the failed shape's inputs any more
            if stopped:
                # Count what the remaining operators still have to do.
                later = list(pending)[list(pending).index(op) + 1:]
                for other in later:
                    summaries[other].left += len(pending[other])
                break
    finally:
        if bar is not None:
            bar.close()
        for writer in writers.values():
            writer.close()
    return RunSummary(ops=summaries, stopped_early=stopped)


def _open_outputs(rows: dict[str, list[dict]], out_dir: Path, hardware: str, log):
    """Per operator: its summary, the rows not yet in ``<out_dir>/<op>.csv``, and the open writer."""
    summaries: dict[str, OpSummary] = {}
    pending: dict[str, list[dict]] = {}
    writers: dict[str, MeasurementCsv] = {}
    for op, op_rows in rows.items():
        writer = MeasurementCsv(out_dir / f"{op}.csv", op)
        done = writer.done_keys()
        if writer.repaired_bytes:
            log(f"{writer.path}: dropped a partly written last row ({writer.repaired_bytes} bytes)")
        todo = [r for r in op_rows if row_key(op, r, hardware) not in done]
        summaries[op] = OpSummary(planned=len(op_rows), already_done=len(op_rows) - len(todo))
        pending[op] = todo
        writers[op] = writer
    return summaries, pending, writers


def _measure_row(op: str, row: dict, prepare, record, writer: MeasurementCsv, summary: OpSummary, say) -> bool:
    """Prepare, time and append one row, counting the outcome in ``summary``; True if it failed.

    The prepared inputs live only in this frame, so they are freed before the next shape allocates its own.
    """
    try:
        prepared = prepare(op, row)
        writer.append(record(op, row, prepared))
        summary.measured += 1
    except Unsupported as exc:
        summary.unsupported += 1
        if len(summary.messages) < 3:
            summary.messages.append(f"{op} unsupported: {exc}")
            say(f"{op} {_row_text(row)}: unsupported: {exc}")
    except Exception as exc:  # noqa: BLE001 - one bad shape must not end a long run
        summary.failed += 1
        say(f"{op} {_row_text(row)}: {first_line(exc)}")
        return True
    return False


def _measured_record(op: str, row: dict, prepared: Prepared, timer, repeats: int, warmup: int, kernel_names,
                     device: DeviceInfo) -> dict:
    """Time one prepared shape and return its CSV record (shape, device fields, statistics, kernel label)."""
    durations = timer.measure(prepared.fn, repeats, warmup)
    names = kernel_names(prepared.fn) if kernel_names is not None else None
    return measurement_record(op, row, device, durations, prepared.dtype, kernel_label(prepared, names))


def _row_text(row: dict) -> str:
    text = " ".join(f"{k}={v}" for k, v in row.items())
    return text if len(text) <= 120 else text[:119] + "…"
