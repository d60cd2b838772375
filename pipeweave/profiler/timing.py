"""Timers: turn a zero-argument callable (one kernel launch, inputs preallocated) into durations in µs.

:class:`CudaEventTimer` is the real one. Per repeat it (1) overwrites a buffer at least twice the
L2 size, so every repeat starts from a cold L2 like the layer-after-layer execution it models,
(2) records a CUDA event, launches the kernel, records a second event. Only the GPU time between the
two events is kept. To keep host (Python/launch) overhead out of that interval, the whole batch of
repeats is queued behind a GPU spin (``torch.cuda._sleep``) long enough for the host to enqueue all of
it, so the GPU never waits for the host between a start event and its kernel. The spin is twice the probed
enqueue time plus a millisecond (it is not timed), and Python's garbage collector is paused while the host enqueues:
a host pause longer than the spin's margin would land inside one repeat and, through the mean, in ``avg_duration``.

:class:`FakeTimer` is deterministic and needs no GPU (tests, ``--dry_run``-style plumbing).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from pipeweave.cli import gc_paused


@dataclass(frozen=True)
class Stats:
    mean_us: float
    median_us: float
    min_us: float
    std_us: float
    repeats: int


def summarize(durations_us: Sequence[float]) -> Stats:
    """Mean, median, min and sample standard deviation (0 for a single repeat)."""
    values = [float(v) for v in durations_us]
    if not values:
        raise ValueError("no durations to summarize")
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"invalid durations: {values}")
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return Stats(
        mean_us=statistics.fmean(values),
        median_us=statistics.median(values),
        min_us=min(values),
        std_us=std,
        repeats=len(values),
    )


class Timer(Protocol):
    def measure(self, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
        """Run ``fn`` ``warmup`` times untimed, then return ``repeats`` (or fewer, see the timer) durations in µs."""


class FakeTimer:
    """Deterministic timer for tests: durations come from ``duration_us`` (default 10 µs + 0.1 µs per repeat).

    ``call`` (default False) also runs ``fn`` once per measurement, to smoke-test runners on the CPU.
    ``calls`` counts measurements, so tests can check that a resumed run measured nothing new.
    """

    def __init__(self, duration_us: float | Callable[[int], float] = 10.0, call: bool = False):
        self.duration_us = duration_us
        self.call = call
        self.calls = 0

    def measure(self, fn, repeats, warmup):
        self.calls += 1
        if self.call:
            fn()
        base = self.duration_us(self.calls) if callable(self.duration_us) else float(self.duration_us)
        return [base + 0.1 * i for i in range(repeats)]


def spin_cycles_per_us(torch, device) -> float:
    """``torch.cuda._sleep`` cycles per µs on ``device`` (0.0 when torch has no ``_sleep``: no spin then)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return 0.0
    with torch.cuda.device(device):
        sleep(1000)  # the first launch pays module loading
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        start.record()
        sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        elapsed_us = start.elapsed_time(end) * 1000.0
    return cycles / elapsed_us if elapsed_us > 0 else 0.0


class CudaEventTimer:
    """CUDA-event timer with an L2 flush before every repeat (see the module docstring).

    ``max_row_seconds`` bounds the GPU time spent on one shape: long kernels get fewer repeats
    (never fewer than ``min_repeats``); the number actually used is what ``measure`` returns.
    """

    def __init__(self, device=None, l2_bytes: int | None = None, *, max_row_seconds: float = 1.0,
                 min_repeats: int = 5, flush_factor: int = 2):
        import torch

        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if l2_bytes is None:
            l2_bytes = int(getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0) or 0)
        # At least twice the L2 (and never less than 64 MiB, should the driver report no L2 size).
        self.flush_bytes = max(flush_factor * l2_bytes, 64 * 2 ** 20)
        self.flush_buffer = torch.empty(self.flush_bytes, dtype=torch.int8, device=self.device)
        self.max_row_seconds = max_row_seconds
        self.min_repeats = max(1, min_repeats)
        self._sleep = getattr(torch.cuda, "_sleep", None)
        self.cycles_per_us = spin_cycles_per_us(torch, self.device)

    # -- helpers -------------------------------------------------------------------------------

    def _event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def _spin(self, microseconds: float) -> None:
        if self.cycles_per_us > 0 and microseconds > 0:
            self._sleep(int(min(microseconds, 2_000_000) * self.cycles_per_us))

    def _flush(self) -> None:
        self.flush_buffer.zero_()  # a write of 2×L2 bytes evicts whatever the previous repeat left in L2

    # -- measurement ---------------------------------------------------------------------------

    def measure(self, fn, repeats, warmup):
        torch = self.torch
        with torch.no_grad(), torch.cuda.device(self.device):
            torch.cuda.synchronize()
            for _ in range(max(0, warmup)):
                self._flush()
                fn()
            torch.cuda.synchronize()

            # One timed probe: kernel duration (to size the repeat count) and host enqueue cost.
            start, end = self._event(), self._event()
            self._spin(2000)
            with gc_paused():
                t0 = time.perf_counter()
                self._flush()
                start.record()
                fn()
                end.record()
                host_us = (time.perf_counter() - t0) * 1e6
            torch.cuda.synchronize()
            probe_us = start.elapsed_time(end) * 1000.0

            n = max(1, int(repeats))
            if probe_us > 0 and self.max_row_seconds > 0:
                affordable = int(self.max_row_seconds * 1e6 / probe_us)
                n = max(min(n, self.min_repeats), min(n, affordable))

            starts = [self._event() for _ in range(n)]
            ends = [self._event() for _ in range(n)]
            # Hold the GPU while the host enqueues every repeat: no host gaps inside the timed intervals.
            with gc_paused():
                self._spin(2.0 * n * host_us + 1000.0)
                for i in range(n):
                    self._flush()
                    starts[i].record()
                    fn()
                    ends[i].record()
            torch.cuda.synchronize()
            return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]
