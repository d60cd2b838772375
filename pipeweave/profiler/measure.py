"""Measuring the profiler's grid on the local CUDA GPU(s): the work behind ``profile_operators.py``.

:func:`measure` resolves which operators can run here, builds the grid, times the single-GPU operators with CUDA
events (:mod:`pipeweave.profiler.session`) and then, with two or more GPUs, the all-reduce sweep
(:mod:`pipeweave.profiler.collective`); every row is appended to ``<output_dir>/<gpu>/<op>.csv`` as soon as it is
measured, so a rerun resumes. :func:`write_hardware_json` is ``--hardware_json``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from analytical_model.registry import operator_keys
from pipeweave.cli import UserError, write_atomically
from pipeweave.profiler import grids

#: the operators timed one GPU at a time (the registry's profiled kernels); all_reduce needs several GPUs
SINGLE_GPU_OPS = operator_keys(profiled=True)


def print_grid(grid: grids.Grid, header: str) -> None:
    print(header)
    for op, rows in grid.rows.items():
        print(f"  {op:<11} {len(rows):>6} rows")
    print(f"  {'total':<11} {grid.total:>6} rows")
    for note in grid.notes:
        print(f"  note: {note}")


def designed_grid(grid: grids.Grid, kernels: int, gpu: str) -> tuple[grids.Grid, str]:
    """(``grid`` cut to the ``kernels`` shapes per operator that teach a calibration of ``gpu`` most, the grid's label
    for :func:`print_grid`): ``--kernels``. An unknown GPU is an error that says how to add it."""
    from analytical_model.hardware import hardware_registry

    try:
        spec = hardware_registry().get(gpu)
    except ValueError as exc:
        raise UserError(f"--kernels reads the GPU's hardware JSON: {exc}. For a new GPU, write one with "
                        f"--hardware_json PATH, fill it in and move it into hardware/") from None
    return grids.informative_grid(grid, spec, kernels), f"designed ({kernels} per operator)"


def measure(args, models, traces, num_gpus: int) -> int:
    """Measure the grid of the parsed ``profile_operators.py`` flags; 0, or 1 when this run measured nothing and rows
    failed. A run after which no row of the grid is in the CSVs (every operator skipped, every row unsupported or
    failed) is an error naming why: status 0 would pass for a measured GPU in a script."""
    import torch

    from pipeweave.profiler.device import local_device_info, measured_dir
    from pipeweave.profiler.runners import TorchRunners
    from pipeweave.profiler.session import ContextBroken, measure_grid
    from pipeweave.profiler.timing import TIMERS

    start = time.monotonic()
    deadline = start + 60 * args.max_minutes if args.max_minutes else None
    torch.cuda.set_device(args.device)
    device = torch.device("cuda", args.device)
    info = local_device_info(args.device)
    out_dir = measured_dir(args.output_dir, info.name)
    print(f"GPU {args.device}: {info.name} → {out_dir}")

    runners = TorchRunners(device, attn_backend=args.attn_backend, elementwise_backend=args.elementwise_backend)
    ops, skipped = runnable_ops(args.ops, runners, num_gpus)
    for note in runners.notes:
        print(f"note: {note}")
    print(runners.describe_backends())
    grid = grids.build_grid(models, args.tp, quick=args.quick, ops=ops, num_gpus=num_gpus, traces=traces,
                            prefill_attention_type=runners.prefill_attention_type,
                            decode_attention_type=runners.decode_attention_type)
    mode = "quick" if args.quick else "full"
    if args.kernels:
        grid, mode = designed_grid(grid, args.kernels, args.hardware or info.name)
    print_grid(grid, f"{mode} grid:")
    if not grid.total:
        raise UserError(f"nothing could be measured on {info.name}: "
                        + "; ".join(skipped or [f"the grid is empty ({'; '.join(grid.notes) or 'no rows'})"]))

    warm_up_gpu(torch, device)
    timer = TIMERS[args.timing](device, max_row_seconds=args.max_row_seconds)
    if args.timing == "rotate":
        how = (f"back-to-back launches over copies of each shape's inputs (together at least "
               f"{timer.cold_bytes / 2**20:.0f} MiB, so that every launch reads them from DRAM), timed in blocks "
               f"of whole passes over the copies lasting at least {timer.BLOCK_US:.0f} µs")
    else:
        how = f"L2 flush of {timer.cold_bytes / 2**20:.0f} MiB before each repeat, one launch per pair of events"
    print(f"timing ({args.timing}): CUDA events, {how}; {args.warmup} warm-up + up to {args.repeats} repeats per "
          f"shape")

    def after_error():
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()

    single = {op: rows for op, rows in grid.rows.items() if op in SINGLE_GPU_OPS}
    try:
        summary = measure_grid(
            single,
            out_dir=out_dir,
            device=info,
            prepare=runners.prepare,
            timer=timer,
            repeats=args.repeats,
            warmup=args.warmup,
            kernel_names=None if args.no_kernel_names else runners.kernel_names,
            after_error=after_error,
            deadline=deadline,
            progress=not args.no_progress,
        )
    except ContextBroken as exc:
        raise UserError(str(exc)) from None
    print(f"measured {summary.measured} rows into {out_dir}:")
    for line in summary.lines():
        print(line)

    stopped, collective_rows = summary.stopped_early, 0
    if "all_reduce" in grid.rows and grid.rows["all_reduce"] and not stopped:
        del timer
        stopped, collective_rows = measure_allreduce_rows(args, grid.rows["all_reduce"], out_dir, info, num_gpus,
                                                          deadline)
    if stopped:
        print(f"stopped after --max_minutes {args.max_minutes:g}; run the same command again to resume")
    minutes = (time.monotonic() - start) / 60
    print(f"finished in {minutes:.1f} min")
    present = summary.measured + sum(s.already_done for s in summary.ops.values()) + collective_rows
    if not present and not stopped:
        raise UserError(f"nothing could be measured on {info.name}: " + "; ".join(
            skipped + [m for s in summary.ops.values() for m in s.messages]
            + [f"{s.failed} {op} rows failed (the lines above say why)" for op, s in summary.ops.items() if s.failed]
            or ["no row of the grid was measured"]))
    failed = sum(s.failed for s in summary.ops.values())
    return 1 if summary.measured == 0 and failed else 0


def runnable_ops(wanted: list[str], runners, num_gpus: int) -> tuple[list[str], list[str]]:
    """(the operators of ``wanted`` that can run here, ``"ops: why not"`` of the others, one per reason), each skip
    printed: the reasons are also what an empty run reports, so that it does not end with status 0 and nothing
    measured."""
    ops, skipped = [], []
    for op in wanted:
        if op == "all_reduce":
            reason = "needs at least 2 visible GPUs" if num_gpus < 2 else None
        else:
            reason = runners.check_op(op)
            reason = reason and f"cannot run on this GPU ({reason})"
        if reason:
            print(f"{op}: skipped, {reason}")
            skipped.append((op, reason))
        else:
            ops.append(op)
    by_reason: dict[str, list[str]] = {}
    for op, reason in skipped:
        by_reason.setdefault(reason, []).append(op)
    return ops, [f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()]


def measure_allreduce_rows(args, grid_rows: list[dict], out_dir: Path, info, num_gpus: int,
                           deadline: float | None) -> tuple[bool, int]:
    """Measure the all-reduce rows not yet in ``<out_dir>/all_reduce.csv`` over all visible GPUs; (whether
    --max_minutes stopped it with rows left, how many of ``grid_rows`` the file holds now)."""
    import torch

    from pipeweave.profiler.collective import AllReduceOptions, measure_allreduce
    from pipeweave.profiler.csvio import MeasurementCsv, row_key
    from pipeweave.profiler.device import library_versions

    names = {torch.cuda.get_device_name(i) for i in range(num_gpus)}
    if len(names) > 1:
        print(f"warning: the visible GPUs differ ({', '.join(sorted(names))}); all_reduce rows are "
              f"labelled {info.name!r}")
    path = out_dir / "all_reduce.csv"
    done = MeasurementCsv(path, "all_reduce").done_keys()
    rows = [r for r in grid_rows if row_key("all_reduce", r, info.name) not in done]
    print(f"all_reduce: {len(rows)} of {len(grid_rows)} rows to measure")
    if not rows:
        return False, len(grid_rows)
    torch.cuda.empty_cache()
    options = AllReduceOptions(repeats=args.repeats, warmup=args.warmup, max_row_seconds=args.max_row_seconds,
                               deadline_epoch=(time.time() + deadline - time.monotonic()) if deadline else None)
    try:
        measure_allreduce(rows, csv_path=path, hardware=info.name, versions=library_versions(), options=options)
    except Exception as exc:  # noqa: BLE001 - a worker's NCCL error arrives here; keep what was written
        text = str(exc).strip().splitlines()
        print(f"all_reduce: failed ({type(exc).__name__}: {text[-1] if text else ''})", file=sys.stderr)
    done = MeasurementCsv(path, "all_reduce").done_keys()
    left = sum(row_key("all_reduce", r, info.name) not in done for r in grid_rows)
    print(f"all_reduce: {left} rows left")
    return bool(left and deadline is not None and time.monotonic() >= deadline), len(grid_rows) - left


def warm_up_gpu(torch, device, seconds: float = 1.0) -> None:
    """Raise the clocks before the first measurement (a second of large BF16 GEMMs)."""
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            for _ in range(10):
                a @ a
            torch.cuda.synchronize(device)
    del a


def write_hardware_json(path: Path, device: int) -> int:
    """``--hardware_json PATH``: write the hardware-JSON skeleton of GPU ``device`` and say what to fill in."""
    from analytical_model.hardware import DEFAULT_HARDWARE_DIR, HardwareRegistry
    from pipeweave.profiler.device import capability_refusal, local_hardware_skeleton

    if path.exists():
        raise UserError(f"--hardware_json: {path} already exists; move it away or choose another path")
    if path.resolve().parent == Path(DEFAULT_HARDWARE_DIR).resolve():
        raise UserError(f"--hardware_json: write the skeleton outside {DEFAULT_HARDWARE_DIR} (e.g. my_gpu.json) and "
                        f"move it there once filled in: every command loads every file of that folder, and an "
                        f"unfinished one stops them all")
    data = local_hardware_skeleton(device)
    refusal = capability_refusal(data["computeMajor"], data["computeMinor"])
    if refusal:  # no value the user could fill in would make the file load
        raise UserError(f"--hardware_json: {data['name']}: {refusal}; the hardware loader refuses such a file "
                        f"whatever is filled in, so none was written")
    try:  # before writing: the shipped folder alone, which loads
        registry = HardwareRegistry(DEFAULT_HARDWARE_DIR)
        if data["name"] in registry:
            print(f"note: {data['name']!r} is already described by "
                  f"{DEFAULT_HARDWARE_DIR / (registry.get(data['name']).stem + '.json')}")
    except (OSError, ValueError) as exc:  # the note is a courtesy: a broken hardware/ folder must not stop the write
        print(f"note: {DEFAULT_HARDWARE_DIR} does not load ({exc}), so the skeleton was not compared with it")
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2) + "\n"))
    print(f"wrote {path}: hardware JSON skeleton for {data['name']!r}.")
    print(f"  fill these fields from the vendor datasheet: {', '.join(data['TODO'])}")
    print(f"  check these derived values: {', '.join(data['CHECK'])}")
    for line in skeleton_advice(data, DEFAULT_HARDWARE_DIR):
        print(f"  {line}")
    return 0


def skeleton_advice(data: dict, hardware_dir: Path) -> list[str]:
    """What the user must do besides filling the TODO fields, each a rule the loader cannot check or a value the
    driver cannot give (README "Measuring a new GPU")."""
    clock = data.get("smFreq")
    boost = f"{clock} MHz here, the maximum SM clock the driver reports" if isinstance(clock, int) else "from NVML"
    return [
        'in "provenance", replace every "TODO: ..." entry by the source of its field (datasheet, whitepaper, '
        'measurement)',
        "tcBf16 is the dense rate with FP32 accumulate: half the FP16-accumulate rate on GeForce and Ada workstation "
        'parts (L20, L40, RTX 6000 Ada; README "Hardware audit")',
        'a GeForce board has no GPU peer-to-peer: add "p2p": false (as hardware/RTX 4090.json does)',
        f'add "boostClock", with its provenance: the NVML maximum SM clock (nvmlDeviceGetMaxClockInfo; {boost})',
        "until the TODO fields are numbers and the TODO and CHECK lists are deleted, "
        f"analytical_model.hardware.parse_hardware rejects the file; then move it into {hardware_dir}.",
    ]
