"""Timers: turn zero-argument callables (kernel launches, inputs preallocated) into durations in µs.

Two real timers, chosen by ``profile_operators.py --timing``:

* :class:`RotatingTimer` (``rotate``, the default since 2026-12-05): the kernel runs back to back, as in a serving
  engine's forward pass, over copies of its inputs (:meth:`RotatingTimer.copies`: together at least twice the L2
  size), so each launch finds its operands in DRAM, as a layer finds its weights after the other layers', without
  a flush between launches. One pair of CUDA events times a block of launches, and a repeat is the block's time per
  launch, so the events' own cost and the gap they put before a kernel are spread over the block.
* :class:`CudaEventTimer` (``flush``): per repeat it (1) overwrites a buffer of at least twice the L2 size,
  (2) records a CUDA event, launches the kernel, records a second event. Measured on an H100 (2026-12-05) it timed
  BF16 GEMMs a median 1.44x aiconfigurator-core's rows of the same shapes (1.76x under 10 µs, 1.00x above 1 ms:
  a few µs added per kernel, from the events and from the flush's dirty L2 lines written back during the timed
  kernel), and a calibration on those rows made H100's end-to-end predictions 13.0 % off where they were 2.8 %
  (README, "Measuring a new GPU").

Both keep host (Python/launch) overhead out of the timed intervals: the whole batch of repeats is queued behind a
GPU spin (``torch.cuda._sleep``) long enough for the host to enqueue all of it, so the GPU never waits for the host
inside a timed interval. The spin is twice the probed enqueue time plus a millisecond (it is not timed), and
Python's garbage collector is paused while the host enqueues: a host pause longer than the spin's margin would land
inside a repeat and, through the mean, in ``avg_duration``.

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
    name: str  # the ``timing`` cell of its rows

    def copies(self, input_bytes: int) -> int:
        """How many copies of a shape's inputs (``input_bytes`` each) the timer launches in turn."""

    def measure(self, fns: Sequence[Callable[[], object]], repeats: int, warmup: int) -> list[float]:
        """Launch the copies ``fns`` (each the same kernel on its own inputs) untimed ``warmup`` times, then return
        ``repeats`` (or fewer, see the timer) durations per launch in µs."""


class FakeTimer:
    """Deterministic timer for tests: durations come from ``duration_us`` (default 10 µs + 0.1 µs per repeat).

    ``call`` (default False) also runs ``fn`` once per measurement, to smoke-test runners on the CPU.
    ``calls`` counts measurements, so tests can check that a resumed run measured nothing new.
    """

    name = "fake"

    def __init__(self, duration_us: float | Callable[[int], float] = 10.0, call: bool = False):
        self.duration_us = duration_us
        self.call = call
        self.calls = 0

    def copies(self, input_bytes: int) -> int:
        return 1

    def measure(self, fns, repeats, warmup):
        self.calls += 1
        if self.call:
            fns[0]()
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


def cold_bytes(torch, device, l2_bytes: int | None = None) -> int:
    """Bytes that leave nothing of what ran before in the L2 of ``device`` (``l2_bytes``, or what the driver
    reports): at least twice the L2, and never less than 64 MiB, should the driver report no L2 size."""
    if l2_bytes is None:
        l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    return max(2 * l2_bytes, 64 * 2 ** 20)


class _EventTimer:
    """What both CUDA-event timers share: the device, the L2 size, the spin and the per-shape budget."""

    def __init__(self, device=None, l2_bytes: int | None = None, *, max_row_seconds: float = 1.0,
                 min_repeats: int = 5, torch=None):
        if torch is None:
            import torch
        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self.cold_bytes = cold_bytes(torch, self.device, l2_bytes)
        self.max_row_seconds = max_row_seconds
        self.min_repeats = max(1, min_repeats)
        self._sleep = getattr(torch.cuda, "_sleep", None)
        self.cycles_per_us = spin_cycles_per_us(torch, self.device)

    def _event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def _spin(self, microseconds: float) -> None:
        if self.cycles_per_us > 0 and microseconds > 0:
            self._sleep(int(min(microseconds, 2_000_000) * self.cycles_per_us))

    def _rounds(self, repeats: int, round_us: float, most: int | None = None) -> int:
        """Timed repeats: ``repeats``, fewer where a repeat of ``round_us`` would overrun ``max_row_seconds`` (or
        beyond ``most``), but never fewer than ``min_repeats``."""
        n = max(1, int(repeats))
        affordable = n
        if round_us > 0 and self.max_row_seconds > 0:
            affordable = int(self.max_row_seconds * 1e6 / round_us)
        if most is not None:
            affordable = min(affordable, most)
        return max(min(n, self.min_repeats), min(n, affordable))


class RotatingTimer(_EventTimer):
    """Back-to-back launches over copies of the inputs, timed in blocks (see the module docstring)."""

    name = "rotate"
    #: copies of one shape's inputs at the most (a tiny kernel's copies then stay in a large L2 together: such a
    #: kernel's time is its fixed cost, which warm operands hardly change)
    MAX_COPIES = 256
    #: a timed block is whole passes over the copies lasting at least this long (µs), so that the events' own cost
    #: (a few µs) is spread over it; a kernel at least this long is one launch a block
    BLOCK_US = 200.0
    #: launches per shape at the most, blocks of all repeats together
    MAX_LAUNCHES = 4000
    #: launches queued behind one spin at the most: a stream's queue of pending work is finite (about a thousand
    #: entries), and a host blocked on a full queue would enqueue the rest inside the timed blocks
    MAX_QUEUED = 512
    #: spins of a group of blocks, each four times longer and over half as many blocks, before a shape is given up
    ATTEMPTS = 3

    def copies(self, input_bytes: int) -> int:
        if input_bytes <= 0:  # nothing to rotate (a runner that holds no tensors)
            return 1
        if input_bytes >= self.cold_bytes:
            return 1
        return int(min(self.MAX_COPIES, math.ceil(self.cold_bytes / int(input_bytes))))

    def measure(self, fns, repeats, warmup):
        torch = self.torch
        fns = list(fns)
        with torch.no_grad(), torch.cuda.device(self.device):
            torch.cuda.synchronize()
            for i in range(max(len(fns), int(warmup))):  # every copy at least once
                fns[i % len(fns)]()
            torch.cuda.synchronize()
            # One timed pass over the copies: the kernel's time (to size the blocks) and the host's enqueue cost.
            (pass_us,), host_us = self._blocks(fns, 1, len(fns), None)
            launch_us = max(pass_us / len(fns), 1e-3)
            passes = max(1, math.ceil(self.BLOCK_US / (launch_us * len(fns))))
            block = len(fns) * max(1, min(passes, self.MAX_QUEUED // len(fns)))  # a block fits behind one spin
            n = self._rounds(repeats, launch_us * block, max(1, self.MAX_LAUNCHES // block))
            per_group = max(1, self.MAX_QUEUED // block)
            durations = []
            while len(durations) < n:
                times, _ = self._blocks(fns, min(per_group, n - len(durations)), block, host_us)
                per_group = min(per_group, len(times))  # a group _blocks had to shrink: the next ones as small
                durations += [t / block for t in times]
            return durations

    def _blocks(self, fns, count: int, block: int, host_us: float | None) -> tuple[list[float], float]:
        """(µs of each of at most ``count`` timed blocks of ``block`` launches, the host's µs per launch), queued
        behind one spin long enough for the host to enqueue them (``host_us`` per launch; a probe's guess where None);
        a group the spin did not cover (its first event had run before the host had queued it all) is timed again
        behind a longer spin with half as many blocks: a host that met the stream's full queue waited for the GPU
        whatever the spin, and a launch may take several entries of it (cuBLAS's split-K GEMM and its reduction
        kernel, an eager op's kernels), so the number of launches alone does not say that a group fits."""
        torch = self.torch
        spin_us = 2000.0 + 20.0 * block if host_us is None else 2.0 * count * block * host_us + 1000.0
        for attempt in range(self.ATTEMPTS):
            if attempt:
                spin_us *= 4
                count = max(1, count // 2)
            starts = [self._event() for _ in range(count)]
            ends = [self._event() for _ in range(count)]
            with gc_paused():
                self._spin(spin_us)
                t0 = time.perf_counter()
                for r in range(count):
                    starts[r].record()
                    for i in range(block):  # the rotation goes on across blocks: copy 0 follows the last copy
                        fns[i % len(fns)]()
                    ends[r].record()
                queued_us = (time.perf_counter() - t0) * 1e6 / (count * block)
                # the GPU reached the first block: host gaps may be inside the blocks (without a spin, no check)
                late = self.cycles_per_us > 0 and starts[0].query()
            torch.cuda.synchronize()
            if not late:
                return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)], queued_us
        raise RuntimeError(f"the host could not queue {count * block} launches while the GPU waited "
                           f"({self.ATTEMPTS} spins, the last {spin_us / 1000:.0f} ms): the timing would include "
                           f"host time")


class CudaEventTimer(_EventTimer):
    """CUDA-event timer with an L2 flush before every repeat (see the module docstring).

    ``max_row_seconds`` bounds the GPU time spent on one shape: long kernels get fewer repeats
    (never fewer than ``min_repeats``); the number actually used is what ``measure`` returns.
    """

    name = "flush"

    def __init__(self, device=None, l2_bytes: int | None = None, *, max_row_seconds: float = 1.0,
                 min_repeats: int = 5, torch=None):
        super().__init__(device, l2_bytes, max_row_seconds=max_row_seconds, min_repeats=min_repeats, torch=torch)
        self.flush_buffer = self.torch.empty(self.cold_bytes, dtype=self.torch.int8, device=self.device)

    def copies(self, input_bytes: int) -> int:
        return 1

    def _flush(self) -> None:
        self.flush_buffer.zero_()  # a write of 2×L2 bytes evicts whatever the previous repeat left in L2

    def measure(self, fns, repeats, warmup):
        torch = self.torch
        fn = fns[0]
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

            n = self._rounds(repeats, probe_us)
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


#: ``--timing`` choices: the timer classes by name
TIMERS = {timer.name: timer for timer in (RotatingTimer, CudaEventTimer)}
