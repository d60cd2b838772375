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


def _worker(rank: int, world: int, rows: list[dict], csv_path: str, hardware: str, versions: dict,
            options: AllReduceOptions, port: int) -> None:
    import torch
    import torch.distributed as dist

    from .csvio import MeasurementCsv
    from .device import ClockReader, DeviceInfo
    from .timing import summarize

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    cuda = options.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group(options.backend, rank=rank, world_size=world, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(options.backend, rank=rank, world_size=world)
    try:
        max_elems = max(int(r["size_bytes"]) for r in rows) // 2
        buffer = torch.zeros(max(max_elems, 1), dtype=torch.bfloat16, device=device)
        flush = None
        cycles_per_us = 0.0
        if cuda:
            l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
            flush = torch.empty(max(2 * l2, 64 * 2 ** 20), dtype=torch.int8, device=device)
            if hasattr(torch.cuda, "_sleep"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(1000)
                start.record()
                torch.cuda._sleep(1_000_000)
                end.record()
                torch.cuda.synchronize()
                elapsed = start.elapsed_time(end) * 1000.0
                cycles_per_us = 1_000_000 / elapsed if elapsed > 0 else 0.0
        writer = MeasurementCsv(csv_path, "all_reduce") if rank == 0 else None
        info = None
        if rank == 0:
            clocks = ClockReader(0).read if cuda else (lambda: ("", ""))
            info = DeviceInfo(name=hardware, versions=versions, clocks=clocks)
        if cuda:
            kernel = f"torch.distributed.all_reduce(nccl {_nccl_version(torch)})".replace(" )", ")")
        else:
            kernel = f"torch.distributed.all_reduce({options.backend})"

        def sync():
            if cuda:
                torch.cuda.synchronize(device)

        def barrier():
            if cuda:
                dist.barrier(device_ids=[rank])
            else:
                dist.barrier()

        for row in rows:
            # Every rank must take the same decision, so rank 0's clock decides for all.
            stop = torch.tensor([1 if (rank == 0 and options.deadline_epoch is not None
                                       and time.time() >= options.deadline_epoch) else 0],
                                device=device, dtype=torch.int32)
            dist.broadcast(stop, src=0)
            if int(stop.item()):
                break
            n = max(1, int(row["size_bytes"]) // 2)
            tensor = buffer[:n]
            for _ in range(max(0, options.warmup)):
                dist.all_reduce(tensor)
            sync()
            durations = []
            budget_us = options.max_row_seconds * 1e6
            spent = 0.0
            for i in range(max(1, options.repeats)):
                if flush is not None:
                    flush.zero_()
                barrier()
                sync()
                if cuda:
                    if cycles_per_us:
                        torch.cuda._sleep(int(50 * cycles_per_us))  # host enqueues the events + kernel meanwhile
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    dist.all_reduce(tensor)
                    end.record()
                    sync()
                    us = start.elapsed_time(end) * 1000.0
                else:
                    t0 = time.perf_counter()
                    dist.all_reduce(tensor)
                    us = (time.perf_counter() - t0) * 1e6
                durations.append(us)
                spent += us
                # Same repeat count on every rank: decide from rank 0's timings only.
                more = torch.tensor([1 if (i + 1 < 5 or spent < budget_us) else 0], device=device, dtype=torch.int32)
                dist.broadcast(more, src=0)
                if not int(more.item()):
                    break
            if writer is not None:
                stats = summarize(durations)
                record = {"op": "all_reduce", **row, **info.row_fields()}
                record.update(avg_duration=stats.mean_us, median_us=stats.median_us, min_us=stats.min_us,
                              std_us=stats.std_us, repeats=stats.repeats, dtype="bfloat16", kernel=kernel)
                writer.append(record)
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

