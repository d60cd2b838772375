"""All-reduce across the local GPUs with torch.distributed (NCCL), one process per GPU.

For each worker count, ``num_workers`` processes are spawned; every process runs the same sequence of
all-reduces on a BF16 buffer (the tensor-parallel all-reduce of hidden states), and rank 0 times them
with CUDA events and appends the rows to ``all_reduce.csv`` (so an interrupted sweep resumes like the
other operators). Per repeat: L2 flush, barrier, a short GPU spin while the host enqueues the timed
all-reduce (so no host latency lands inside the events), then start event, all-reduce, end event.
The time therefore includes the skew between ranks' arrival, as a real tensor-parallel all-reduce does.

``backend="gloo"`` with ``device="cpu"`` runs the same plumbing without GPUs (tests only).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class AllReduceOptions:
    repeats: int
    warmup: int
    backend: str = "nccl"        # "gloo" (CPU) in tests
    device: str = "cuda"
    max_row_seconds: float = 1.0
    deadline_epoch: float | None = None  # time.time() after which no new row starts


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _nccl_version(torch) -> str:
    try:
        version = torch.cuda.nccl.version()
    except Exception:
        return ""
    if isinstance(version, int):  # old torch: 21903 = 2.19.3
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return ".".join(str(v) for v in version if str(v))


def _init_process_group(torch, dist, rank: int, world: int, options: AllReduceOptions, port: int):
    """Join the group of ``world`` processes on this host; returns this rank's device."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if options.device != "cuda":
        dist.init_process_group(options.backend, rank=rank, world_size=world)
        return torch.device("cpu")
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(options.backend, rank=rank, world_size=world, device_id=device)
    return device


#: GPU spin (µs) before each timed all-reduce, while the host records the start event and launches the collective:
#: that takes 30-60 µs, more with eight processes sharing the CPU, and a spin shorter than it would put the GPU's
#: wait for the host inside the timed interval; the spin itself is not timed
ALLREDUCE_SPIN_US = 1000


class _Rank:
    """One process of the sweep: times all-reduces on its device and shares rank 0's decisions."""

    def __init__(self, torch, dist, rank: int, device, options: AllReduceOptions):
        self.torch, self.dist, self.rank, self.device, self.options = torch, dist, rank, device, options
        self.cuda = options.device == "cuda"
        self.flush = None
        self.cycles_per_us = 0.0
        if self.cuda:
            from .measure import warm_up_gpu
            from .timing import cold_bytes, spin_cycles_per_us

            self.flush = torch.empty(cold_bytes(torch, device), dtype=torch.int8, device=device)
            warm_up_gpu(torch, device)  # the spin calibrated at idle clocks would run short once they rise
            self.cycles_per_us = spin_cycles_per_us(torch, device)

    def rank0_decides(self, decision: bool) -> bool:
        """Rank 0's ``decision``, broadcast, so that every rank takes the same branch."""
        flag = self.torch.tensor([1 if decision else 0], device=self.device, dtype=self.torch.int32)
        self.dist.broadcast(flag, src=0)
        return bool(int(flag.item()))

    def deadline_passed(self) -> bool:
        deadline = self.options.deadline_epoch
        return self.rank0_decides(self.rank == 0 and deadline is not None and time.time() >= deadline)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        if self.cuda:
            self.dist.barrier(device_ids=[self.rank])
        else:
            self.dist.barrier()

    def measure(self, tensor) -> list[float]:
        """Warm-up, then timed repeats (at least 5, then until ``max_row_seconds`` of rank 0's time)."""
        for _ in range(max(0, self.options.warmup)):
            self.dist.all_reduce(tensor)
        self.sync()
        durations = []
        budget_us = self.options.max_row_seconds * 1e6
        spent = 0.0
        for i in range(max(1, self.options.repeats)):
            us = self.time_one(tensor)
            durations.append(us)
            spent += us
            # Same repeat count on every rank: decide from rank 0's timings only.
            if not self.rank0_decides(i + 1 < 5 or spent < budget_us):
                break
        return durations

    def time_one(self, tensor) -> float:
        """One repeat in µs: L2 flush, barrier, spin while the host enqueues, then the timed all-reduce."""
        torch = self.torch
        if self.flush is not None:
            self.flush.zero_()
        self.barrier()
        self.sync()
        if not self.cuda:
            t0 = time.perf_counter()
            self.dist.all_reduce(tensor)
            return (time.perf_counter() - t0) * 1e6
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if self.cycles_per_us:  # the host enqueues the events and the collective meanwhile, outside the events
            torch.cuda._sleep(int(ALLREDUCE_SPIN_US * self.cycles_per_us))
        start.record()
        self.dist.all_reduce(tensor)
        end.record()
        self.sync()
        return start.elapsed_time(end) * 1000.0


def _worker(rank: int, world: int, rows: list[dict], csv_path: str, hardware: str, versions: dict,
            options: AllReduceOptions, port: int) -> None:
    import torch
    import torch.distributed as dist

    from .csvio import MeasurementCsv, measurement_record
    from .device import ClockReader, DeviceInfo

    device = _init_process_group(torch, dist, rank, world, options, port)
    try:
        max_elems = max(int(r["size_bytes"]) for r in rows) // 2
        buffer = torch.zeros(max(max_elems, 1), dtype=torch.bfloat16, device=device)
        me = _Rank(torch, dist, rank, device, options)
        writer = info = None
        if rank == 0:
            writer = MeasurementCsv(csv_path, "all_reduce")
            clocks = ClockReader(0).read if me.cuda else (lambda: ("", ""))
            info = DeviceInfo(name=hardware, versions=versions, clocks=clocks)
        if me.cuda:
            kernel = f"torch.distributed.all_reduce(nccl {_nccl_version(torch)})".replace(" )", ")")
        else:
            kernel = f"torch.distributed.all_reduce({options.backend})"
        for row in rows:
            if me.deadline_passed():  # rank 0's clock decides for all
                break
            durations = me.measure(buffer[:max(1, int(row["size_bytes"]) // 2)])
            if writer is not None:
                writer.append(measurement_record("all_reduce", row, info, durations, "bfloat16", kernel,
                                                 "flush" if me.cuda else "host"))
        if writer is not None:
            writer.close()
    finally:
        dist.destroy_process_group()


def measure_allreduce(rows: list[dict], *, csv_path: str | Path, hardware: str, versions: dict,
                      options: AllReduceOptions) -> int:
    """Spawn one process group per worker count and measure ``rows`` (already filtered for resume).

    Returns the number of worker counts run; rank 0 of each group appends its rows to ``csv_path``.
    """
    import torch.multiprocessing as mp

    counts = sorted({int(r["num_workers"]) for r in rows})
    for world in counts:
        subset = [r for r in rows if int(r["num_workers"]) == world]
        mp.spawn(_worker, args=(world, subset, str(csv_path), hardware, versions, options, _free_port()),
                 nprocs=world, join=True)
    return len(counts)

