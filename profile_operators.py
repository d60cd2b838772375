#!/usr/bin/env python3
"""Measure the operators the predictor models on the local CUDA GPU.

Writes ``<output_dir>/<gpu>/<op>.csv`` (one row per shape, appended as it finishes; a rerun skips rows
already there). ``--dry_run`` prints the grid sizes (works without a GPU); ``--hardware_json PATH`` writes
a hardware JSON skeleton for this GPU and exits.

    python3 profile_operators.py --quick                 # < 5 min on one GPU
    python3 profile_operators.py --max_minutes 120       # full grid, resumable
    python3 profile_operators.py --hardware_json "hardware/My GPU.json"
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from analytical_model.registry import operator_keys
from pipeweave.cli import ArgumentParser, UserError, run_cli, write_atomically
from pipeweave.profiler import grids
from pipeweave.profiler.device import NO_CUDA_MESSAGE, cuda_device_count

REPO = Path(__file__).resolve().parent
SINGLE_GPU_OPS = operator_keys(profiled=True)


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag}: expected a comma-separated list of integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"{flag}: expected positive integers, got {text!r}")
    return list(dict.fromkeys(values))


def _name_list(text: str) -> list[str]:
    return list(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))


def parse_args(argv):
    parser = ArgumentParser(prog="profile_operators.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="all",
                        help=f"comma list of operators (default all: {','.join(grids.OPS)})")
    parser.add_argument("--quick", action="store_true", help="small grid that finishes in minutes")
    parser.add_argument("--configs", default=",".join(grids.DEFAULT_CONFIGS),
                        help="model config stems under --config_dir (default: the paper's three)")
    parser.add_argument("--config_dir", default=str(REPO / "config"), help="folder of HF-style config JSONs")
    parser.add_argument("--trace_dir", default=str(REPO / "workload" / "traces"),
                        help="trace CSVs whose batches join the full attention grid (skipped if absent)")
    parser.add_argument("--tp", default=",".join(str(t) for t in grids.DEFAULT_TP),
                        help="tensor-parallel sizes (default 1,2,4,8; sizes that do not divide a model are left out)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per shape (default 50, quick 20)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs per shape (default 5, quick 3)")
    parser.add_argument("--max_row_seconds", type=float, default=None,
                        help="GPU time budget per shape; long kernels get fewer repeats, at least 5 "
                             "(default 1, quick 0.25)")
    parser.add_argument("--output_dir", default=str(REPO / "dataset" / "measured"),
                        help="root of the measured dataset (default dataset/measured)")
    parser.add_argument("--hardware_json", metavar="PATH", default=None,
                        help="write a hardware JSON skeleton for this GPU to PATH and exit")
    parser.add_argument("--dry_run", action="store_true", help="print the grid sizes and exit (no GPU needed)")
    parser.add_argument("--max_minutes", type=float, default=None,
                        help="start no new shape after this many minutes (rerun to resume)")
    parser.add_argument("--attn_backend", choices=("auto", "fa3", "fa2", "sdpa"), default="auto",
                        help="attention kernels (default auto: FA3 prefill on Hopper if installed, else flash-attn 2, "
                             "else torch SDPA's flash backend)")
    parser.add_argument("--elementwise_backend", choices=("auto", "flashinfer", "torch"), default="auto",
                        help="RMSNorm / SiLU*Mul kernels (default auto: FlashInfer if installed, else torch)")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    parser.add_argument("--no_kernel_names", action="store_true",
                        help="do not run the profiler once per shape to record kernel names")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    ops = list(grids.OPS) if args.ops.strip() in ("", "all") else _name_list(args.ops)
    unknown = [op for op in ops if op not in grids.OPS]
    if unknown:
        raise UserError(f"--ops: unknown operator(s) {', '.join(unknown)}; choose from {', '.join(grids.OPS)}")
    args.ops = ops
    args.configs = _name_list(args.configs)
    if not args.configs:
        raise UserError("--configs: give at least one model config stem")
    args.tp = _int_list(args.tp, "--tp")
    if args.repeats is None:
        args.repeats = 20 if args.quick else 50
    if args.warmup is None:
        args.warmup = 3 if args.quick else 5
    if args.max_row_seconds is None:
        args.max_row_seconds = 0.25 if args.quick else 1.0
    if args.repeats < 1:
        raise UserError("--repeats must be at least 1")
    if args.warmup < 0:
        raise UserError("--warmup must be 0 or more")
    if args.max_row_seconds <= 0:
        raise UserError("--max_row_seconds must be positive")
    if args.max_minutes is not None and args.max_minutes <= 0:
        raise UserError("--max_minutes must be positive")
    return args


def write_hardware_json(path: Path, device: int) -> int:
    from analytical_model.hardware import DEFAULT_HARDWARE_DIR, HardwareRegistry
    from pipeweave.profiler.device import local_hardware_skeleton

    if path.exists():
        raise UserError(f"--hardware_json: {path} already exists; move it away or choose another path")
    data = local_hardware_skeleton(device)
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2) + "\n"))
    try:
        registry = HardwareRegistry(DEFAULT_HARDWARE_DIR)
        if data["name"] in registry:
            print(f"note: {data['name']!r} is already described by "
                  f"{DEFAULT_HARDWARE_DIR / (registry.get(data['name']).stem + '.json')}")
    except Exception:
        pass
    print(f"wrote {path}: hardware JSON skeleton for {data['name']!r}.")
    print(f"  fill these fields from the vendor datasheet: {', '.join(data['TODO'])}")
    print(f"  check these derived values: {', '.join(data['CHECK'])}")
    print("  until the TODO fields are numbers, analytical_model.hardware.parse_hardware rejects the file; "
          "then delete the TODO and CHECK lists.")
    return 0


def print_grid(grid: grids.Grid, header: str) -> None:
    print(header)
    for op, rows in grid.rows.items():
        print(f"  {op:<11} {len(rows):>6} rows")
    print(f"  {'total':<11} {grid.total:>6} rows")
    for note in grid.notes:
        print(f"  note: {note}")


def main(argv=None) -> int:
    args = parse_args(argv)
    num_gpus = cuda_device_count()

    if args.hardware_json:
        if num_gpus == 0:
            raise UserError("no CUDA GPU visible: --hardware_json reads the properties of the local GPU")
        return write_hardware_json(Path(args.hardware_json), args.device)

    models = grids.load_models(args.configs, args.config_dir)
    problems: list[str] = []
    traces = {} if args.quick else grids.load_trace_prompts(args.trace_dir, problems)
    for problem in problems:
        print(f"note: {problem}", file=sys.stderr)
    mode = "quick" if args.quick else "full"

    if args.dry_run:
        grid = grids.build_grid(models, args.tp, quick=args.quick, ops=args.ops, num_gpus=num_gpus, traces=traces)
        print_grid(grid,
                   f"{mode} grid for {', '.join(m.stem for m in models)} at TP {','.join(map(str, args.tp))}"
                   f" ({num_gpus} CUDA GPU{'s' if num_gpus != 1 else ''} visible"
                   + (f", {len(traces)} traces" if traces else "") + "):")
        if "attn" in args.ops:
            print("  note: attention_type strings assume FlashAttention-2; with FA3 on Hopper prefill rows "
                  "are fa3_ragged")
        return 0

    if num_gpus == 0:
        raise UserError(NO_CUDA_MESSAGE)
    if args.device >= num_gpus:
        raise UserError(f"--device {args.device}: only {num_gpus} CUDA GPU(s) visible")
    return measure(args, models, traces, num_gpus)


def measure(args, models, traces, num_gpus: int) -> int:
    import torch

    from pipeweave.profiler.csvio import MeasurementCsv, row_key
    from pipeweave.profiler.device import gpu_dir_name, library_versions, local_device_info
    from pipeweave.profiler.runners import TorchRunners
    from pipeweave.profiler.session import measure_grid
    from pipeweave.profiler.timing import CudaEventTimer

    start = time.monotonic()
    deadline = start + 60 * args.max_minutes if args.max_minutes else None
    torch.cuda.set_device(args.device)
    device = torch.device("cuda", args.device)
    info = local_device_info(args.device)
    out_dir = Path(args.output_dir) / gpu_dir_name(info.name)
    print(f"GPU {args.device}: {info.name} → {out_dir}")

    runners = TorchRunners(device, attn_backend=args.attn_backend, elementwise_backend=args.elementwise_backend)
    ops = []
    for op in args.ops:
        if op == "all_reduce":
            if num_gpus < 2:
                print("all_reduce: skipped, needs at least 2 visible GPUs")
                continue
            ops.append(op)
            continue
        reason = runners.check_op(op)
        if reason:
            print(f"{op}: skipped, cannot run on this GPU ({reason})")
        else:
            ops.append(op)
    for note in runners.notes:
        print(f"note: {note}")
    print(runners.describe_backends())
    grid = grids.build_grid(models, args.tp, quick=args.quick, ops=ops, num_gpus=num_gpus, traces=traces,
                            prefill_attention_type=runners.prefill_attention_type,
                            decode_attention_type=runners.decode_attention_type)
    print_grid(grid, f"{'quick' if args.quick else 'full'} grid:")

    _warm_up_gpu(torch, device)
    timer = CudaEventTimer(device, max_row_seconds=args.max_row_seconds)
    print(f"timing: CUDA events, L2 flush of {timer.flush_bytes / 2**20:.0f} MiB before each repeat, "
          f"{args.warmup} warm-up + up to {args.repeats} repeats per shape")

    def after_error():
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()

    single = {op: rows for op, rows in grid.rows.items() if op in SINGLE_GPU_OPS}
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
    print(f"measured {summary.measured} rows into {out_dir}:")
    for line in summary.lines():
        print(line)

    stopped = summary.stopped_early
    if "all_reduce" in grid.rows and grid.rows["all_reduce"] and not stopped:
        from pipeweave.profiler.collective import AllReduceOptions, measure_allreduce

        names = {torch.cuda.get_device_name(i) for i in range(num_gpus)}
        if len(names) > 1:
            print(f"warning: the visible GPUs differ ({', '.join(sorted(names))}); all_reduce rows are "
                  f"labelled {info.name!r}")
        path = out_dir / "all_reduce.csv"
        done = MeasurementCsv(path, "all_reduce").done_keys()
        rows = [r for r in grid.rows["all_reduce"] if row_key("all_reduce", r, info.name) not in done]
        print(f"all_reduce: {len(rows)} of {len(grid.rows['all_reduce'])} rows to measure")
        if rows:
            del timer
            torch.cuda.empty_cache()
            options = AllReduceOptions(repeats=args.repeats, warmup=args.warmup,
                                       max_row_seconds=args.max_row_seconds,
                                       deadline_epoch=(time.time() + deadline - time.monotonic()) if deadline else None)
            try:
                measure_allreduce(rows, csv_path=path, hardware=info.name, versions=library_versions(),
                                  options=options)
            except Exception as exc:  # noqa: BLE001 - a worker's NCCL error arrives here; keep what was written
                text = str(exc).strip().splitlines()
                print(f"all_reduce: failed ({type(exc).__name__}: {text[-1] if text else ''})", file=sys.stderr)
            done = MeasurementCsv(path, "all_reduce").done_keys()
            left = sum(row_key("all_reduce", r, info.name) not in done for r in grid.rows["all_reduce"])
            print(f"all_reduce: {left} rows left")
            if left and deadline is not None and time.monotonic() >= deadline:
                stopped = True
    if stopped:
        print(f"stopped after --max_minutes {args.max_minutes:g}; run the same command again to resume")
    minutes = (time.monotonic() - start) / 60
    print(f"finished in {minutes:.1f} min")
    failed = sum(s.failed for s in summary.ops.values())
    return 1 if summary.measured == 0 and failed else 0


def _warm_up_gpu(torch, device, seconds: float = 1.0) -> None:
    """Raise the clocks before the first measurement (a second of large BF16 GEMMs)."""
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            for _ in range(10):
                a @ a
            torch.cuda.synchronize(device)
    del a


if __name__ == "__main__":
    sys.exit(run_cli(main))
