"""Measure a grid into the per-operator CSVs, skipping rows already done.

:func:`measure_grid` is independent of torch: it takes a ``prepare(op, row)`` callable (the runners, or a
fake in tests), a timer and a :class:`~pipeweave.profiler.device.DeviceInfo`.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from .csvio import MeasurementCsv, measurement_record, row_key, unmodelled_kernel
from .device import DeviceInfo
from .launch import Prepared, Unsupported, first_line, kernel_label


#: rows after whose failure the GPU could not run anything more (a CUDA error that breaks the context, such as an
#: illegal memory access): one JSON object per line, the op, the row and the device; the next run skips them, so that
#: one such shape cannot stop every rerun at the same place (delete a line to try that shape again)
BROKEN_ROWS_FILE = "broke_context.jsonl"


class ContextBroken(RuntimeError):
    """The GPU could not run anything more after a row failed; the row is in :data:`BROKEN_ROWS_FILE`."""


@dataclass
class OpSummary:
    planned: int = 0
    already_done: int = 0
    measured: int = 0
    replaced: int = 0  # rows of a stand-in kernel measured again with the modelled one (counted in measured)
    still_unmodelled: int = 0  # rows of a stand-in kernel this run has no other kernel for (kept, or re-timed)
    retimed: int = 0  # rows of another timing measured again with this run's (counted in measured)
    kept_timing: int = 0  # rows of another timing kept: this run has only a stand-in kernel for them
    unsupported: int = 0
    failed: int = 0
    broke_context: int = 0  # skipped: they broke the CUDA context in an earlier run (BROKEN_ROWS_FILE)
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
            if s.replaced:
                parts.append(f"{s.replaced} of them replacing rows of another kernel")
            if s.still_unmodelled:
                parts.append(f"{s.still_unmodelled} still of a stand-in kernel: this run has no other kernel for them")
            if s.retimed:
                parts.append(f"{s.retimed} of them replacing rows of the other timing")
            if s.kept_timing:
                parts.append(f"{s.kept_timing} kept at the other timing: this run has only a stand-in kernel for them")
            if s.unsupported:
                parts.append(f"{s.unsupported} unsupported")
            if s.failed:
                parts.append(f"{s.failed} failed")
            if s.broke_context:
                parts.append(f"{s.broke_context} skipped: they broke the CUDA context in an earlier run "
                             f"({BROKEN_ROWS_FILE})")
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
    so a later run tries them again, unless ``after_error`` fails after them: then the GPU can run nothing more,
    the row goes to :data:`BROKEN_ROWS_FILE` (the next run skips it) and :class:`ContextBroken` ends the run.
    """
    summaries, pending, writers, stale = _open_outputs(rows, Path(out_dir), device.name, timer.name, log)
    record = partial(_measured_record, prepare=prepare, timer=timer, repeats=repeats, warmup=warmup,
                     kernel_names=kernel_names, device=device)
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
                    failed = _measure_row(op, row, prepare, record, writers[op], summary, say,
                                          stale=stale[op].get(row_key(op, row, device.name)))
                finally:
                    if bar is not None:
                        bar.update(1)
                if failed and after_error is not None:
                    try:
                        after_error()  # after _measure_row returned: nothing pins the failed shape's inputs any more
                    except Exception as exc:  # noqa: BLE001 - whatever the GPU raised, nothing more runs on it
                        broken = _remember_broken(Path(out_dir), op, row, device.name, exc)
                        raise ContextBroken(
                            f"{op} {_row_text(row)} failed and left the GPU unable to run anything more "
                            f"({first_line(exc)}); it is recorded in {broken}, which the next run skips: rerun to "
                            f"measure the other rows") from None
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


def _open_outputs(rows: dict[str, list[dict]], out_dir: Path, hardware: str, timing: str, log):
    """Per operator: its summary, the rows not yet in ``<out_dir>/<op>.csv``, the open writer, and the keys present
    only as rows of a stand-in kernel or of another ``timing``, with why (:meth:`MeasurementCsv.rows_by_kind`: tried
    again, replaced if measured)."""
    summaries: dict[str, OpSummary] = {}
    pending: dict[str, list[dict]] = {}
    writers: dict[str, MeasurementCsv] = {}
    stale: dict[str, dict] = {}
    broken = _broken_keys(out_dir)
    for op, op_rows in rows.items():
        writer = MeasurementCsv(out_dir / f"{op}.csv", op, timing)
        done, again = writer.rows_by_kind()
        if writer.repaired_bytes:
            log(f"{writer.path}: dropped a partly written last row ({writer.repaired_bytes} bytes)")
        todo = [r for r in op_rows if row_key(op, r, hardware) not in done]
        runnable = [r for r in todo if row_key(op, r, hardware) not in broken]
        summaries[op] = OpSummary(planned=len(op_rows), already_done=len(op_rows) - len(todo),
                                  broke_context=len(todo) - len(runnable))
        pending[op] = runnable
        writers[op] = writer
        stale[op] = again
    return summaries, pending, writers, stale


def _remember_broken(out_dir: Path, op: str, row: dict, hardware: str, exc: Exception) -> Path:
    path = out_dir / BROKEN_ROWS_FILE
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"op": op, "row": row, "hardware": hardware, "error": first_line(exc)}) + "\n")
    return path


def _broken_keys(out_dir: Path) -> set:
    """The row keys of :data:`BROKEN_ROWS_FILE`, device included (a line that does not parse, e.g. cut short, is
    ignored)."""
    path = out_dir / BROKEN_ROWS_FILE
    keys = set()
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                keys.add(row_key(entry["op"], entry["row"], entry["hardware"]))
            except (ValueError, KeyError, TypeError):
                continue
    return keys


def _same_stand_in(op: str, row: dict, prepared: Prepared) -> bool:
    """Whether ``prepared`` would again time a stand-in kernel, as far as its label says before timing (eager
    SiLU*Mul, SDPA decode): re-measuring a stale row with it would replace one stand-in by the same."""
    return unmodelled_kernel(op, row.get("attention_type"), kernel_label(prepared, None)) is not None


def _measure_row(op: str, row: dict, prepare, record, writer: MeasurementCsv, summary: OpSummary, say,
                 stale: str | None = None) -> bool:
    """Prepare, time and append one row, counting the outcome in ``summary``; True if it failed. A ``stale`` row (in
    the file as a stand-in kernel's, "kernel", or as the modelled kernel's at another timing, "timing") is timed only
    if this run has another kernel for it, and a stand-in never supersedes a modelled row of the other timing.

    The prepared inputs live only in this frame, so they are freed before the next shape allocates its own.
    """
    try:
        prepared = prepare(op, row)
        if stale and _same_stand_in(op, row, prepared):
            summary.already_done += 1
            if stale == "kernel":
                summary.still_unmodelled += 1
            else:
                summary.kept_timing += 1
            return False
        measured = record(op, row, prepared)
        # the label before timing may not tell (F.rms_norm): the timed row's does
        modelled = unmodelled_kernel(op, row.get("attention_type"), measured["kernel"]) is None
        if stale == "timing" and not modelled:  # the readers keep a key's last row: never a stand-in over a modelled
            summary.already_done += 1
            summary.kept_timing += 1
            return False
        writer.append(measured)
        summary.measured += 1
        if stale == "kernel":
            summary.replaced += int(modelled)
            summary.still_unmodelled += int(not modelled)
        elif stale == "timing":
            summary.retimed += 1
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


def input_bytes(prepared: Prepared) -> int:
    """Bytes of the tensors a prepared shape holds (its inputs, and an output it writes in place)."""
    return sum(int(t.numel()) * int(t.element_size()) for t in prepared.keep
               if hasattr(t, "numel") and hasattr(t, "element_size"))


def _measured_record(op: str, row: dict, prepared: Prepared, prepare, timer, repeats: int, warmup: int,
                     kernel_names, device: DeviceInfo) -> dict:
    """Time one prepared shape, with as many more copies of its inputs as the timer launches in turn
    (:meth:`pipeweave.profiler.timing.Timer.copies`), and return its CSV record (shape, device fields, statistics,
    kernel label, timing)."""
    copies = [prepared, *(prepare(op, row) for _ in range(timer.copies(input_bytes(prepared)) - 1))]
    durations = timer.measure([copy.fn for copy in copies], repeats, warmup)
    del copies[1:]
    names = kernel_names(prepared.fn) if kernel_names is not None else None
    return measurement_record(op, row, device, durations, prepared.dtype, kernel_label(prepared, names), timer.name)


def _row_text(row: dict) -> str:
    text = " ".join(f"{k}={v}" for k, v in row.items())
    return text if len(text) <= 120 else text[:119] + "…"
