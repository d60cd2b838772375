"""Requests of a serving simulation and their arrival times.

Requests are drawn from a trace in order, cycling, up to ``num_requests``. Arrivals: all at t = 0 (no rate),
a seeded Poisson process of rate ``qps`` (exponential inter-arrival gaps), or the trace's own ``arrival_time_s``
column, replayed as recorded. A request's output length is the trace's ``output_tokens`` (the run's length, the
same on every row, as in the static workloads) or, with ``per_request_outputs``, its own ``decode_tokens``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeweave.workload import DEFAULT_TRACE_DIR, Trace, WorkloadError, load_trace
from pipeweave.workload_inputs import one_edit_apart, resolve_named_file, trace_table

ARRIVAL_COLUMN = "arrival_time_s"
#: the engine rounds step durations to 10⁻⁶ ms (pipeweave.report.round6): at an arrival time where doubles are
#: spaced wider than that (from 2³³ ms, about 99 days), a step's duration added to the clock is partly or wholly lost
TIME_RESOLUTION_MS = 1e-6
#: every request's state and metrics stay in memory to the end (about 1 KiB each) and the exact simulation takes
#: about 0.8 ms of CPU per request (README "Serving simulation"): a million requests is ~1 GiB and ~13 min
MAX_NUM_REQUESTS = 1_000_000


@dataclass(eq=False, slots=True)
class Request:
    """One request and its progress; times in ms."""

    rid: int
    arrival_ms: float
    prompt_tokens: int
    output_tokens: int
    num_computed: int = 0  # tokens whose KV is (or is being) computed, advanced when scheduled (as vLLM V1)
    num_output: int = 0  # tokens generated so far
    blocks: int = 0  # KV-cache blocks held
    epoch: int = 0  # incremented on preemption: results of steps scheduled before it are discarded
    preemptions: int = 0
    first_token_ms: float | None = None
    finish_ms: float | None = None

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_output

    @property
    def finished(self) -> bool:
        return self.num_output >= self.output_tokens

    def copy(self) -> "Request":
        return Request(*map(self.__getattribute__, self.__slots__))


@dataclass(frozen=True)
class ServingTrace:
    """A trace plus the optional recorded arrival times (seconds) of its rows."""

    trace: Trace
    arrivals_s: tuple[float, ...] | None = None


def load_serving_trace(name: str | Path, trace_dir: str | Path = DEFAULT_TRACE_DIR) -> ServingTrace:
    """A trace by path or stem (``workload/traces/<stem>.csv``), with its ``arrival_time_s`` column if present."""
    path = resolve_named_file(name, Path(trace_dir), ".csv", "trace")
    trace = load_trace(path)
    # the rows parse_trace read (so that arrival i is request i's), with the file's line numbers
    header, rows = trace_table(path.read_text(encoding="utf-8"))
    if ARRIVAL_COLUMN not in header:
        # a column meant as the arrival times but named otherwise would be ignored, every request arriving at t = 0
        meant = [cell for cell in header if cell.lower().startswith("arrival") or one_edit_apart(cell, ARRIVAL_COLUMN)]
        if meant:
            raise WorkloadError(f"trace {path.stem}: column {meant[0]!r} is not read: recorded arrival times go in a "
                                f"column named {ARRIVAL_COLUMN} (seconds); rename it, or drop it for arrivals at t = 0 "
                                f"or --qps")
        return ServingTrace(trace)
    column = header.index(ARRIVAL_COLUMN)
    arrivals = []
    for line_no, row in rows:
        cell = row[column].strip()
        try:
            value = float(cell)
        except ValueError:
            raise WorkloadError(f"trace {path.stem}: line {line_no}: {ARRIVAL_COLUMN} is not a number: "
                                f"{cell!r}") from None
        if not (math.isfinite(value) and value >= 0):
            raise WorkloadError(f"trace {path.stem}: line {line_no}: {ARRIVAL_COLUMN} must be a finite number >= 0, "
                                f"got {value}")
        arrivals.append(value)
    if any(b < a for a, b in zip(arrivals, arrivals[1:])):
        raise WorkloadError(f"trace {path.stem}: {ARRIVAL_COLUMN} must not decrease from row to row")
    return ServingTrace(trace, tuple(arrivals))


def make_requests(source: ServingTrace | Trace, num_requests: int | None = None, qps: float | None = None,
                  seed: int = 0, per_request_outputs: bool = False) -> list[Request]:
    """Requests drawn from the trace in order, cycling; arrivals as described in the module docstring."""
    serving = source if isinstance(source, ServingTrace) else ServingTrace(source)
    trace = serving.trace
    n = trace.num_requests if num_requests is None else num_requests
    if not 1 <= n <= MAX_NUM_REQUESTS:
        given = f"{n:,}" if num_requests is not None else f"the trace's {n:,} rows"
        raise WorkloadError(f"num_requests must be between 1 and {MAX_NUM_REQUESTS:,} (the simulator holds every "
                            f"request in memory), got {given}")
    if qps is not None and not (math.isfinite(qps) and qps > 0):
        raise WorkloadError(f"qps must be a finite number > 0, got {qps}")
    rows = np.arange(n) % trace.num_requests
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is reported below, as one error
        if qps is not None:
            gaps = np.random.default_rng(seed).exponential(1000.0 / qps, size=n)
            arrivals = np.cumsum(gaps) - gaps[0]  # the first request arrives at t = 0
        elif serving.arrivals_s is not None:
            recorded = np.asarray(serving.arrivals_s) * 1000.0
            span = recorded[-1] - recorded[0]
            # cycling through a recorded trace repeats it after its own span (plus its mean gap)
            period = span + (span / (len(recorded) - 1) if len(recorded) > 1 else 0.0)
            arrivals = recorded[rows] - recorded[0] + (np.arange(n) // trace.num_requests) * period
        else:
            arrivals = np.zeros(n)
    if not np.isfinite(arrivals).all():  # the event loop would never reach an infinite arrival
        source = f"qps {qps}" if qps is not None else f"the trace's {ARRIVAL_COLUMN}"
        raise WorkloadError(f"the arrival times of {n} requests overflow (beyond 1.8e308 ms): {source} is too extreme")
    coarse = np.flatnonzero(np.spacing(arrivals) > TIME_RESOLUTION_MS)
    if coarse.size:
        i = int(coarse[0])
        fix = ("use a larger --qps" if qps is not None
               else f"keep --num_requests <= {i} or rescale the trace's {ARRIVAL_COLUMN}")
        raise WorkloadError(f"request {i} would arrive at {arrivals[i]:.6g} ms, where float times are "
                            f"{np.spacing(arrivals[i]):.3g} ms apart, coarser than the engine's {TIME_RESOLUTION_MS:g} "
                            f"ms rounding of step times (they would be lost): {fix}")
    outputs = (np.maximum(np.asarray(trace.decode_tokens)[rows], 1) if per_request_outputs
               else np.full(n, trace.output_tokens))
    prompts = np.asarray(trace.prompt_tokens)[rows]
    return [Request(i, float(a), int(p), int(o)) for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]
