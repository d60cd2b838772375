#!/usr/bin/env python3
"""Measure the operators the predictor models on the local CUDA GPU.

Writes ``<output_dir>/<gpu>/<op>.csv`` (one row per shape, appended as it finishes; a rerun skips rows
already there). ``--dry_run`` prints the grid sizes (works without a GPU); ``--hardware_json PATH`` writes
a hardware JSON skeleton for this GPU and exits.

    python3 profile_operators.py --quick                 # < 5 min on one GPU
    python3 profile_operators.py --max_minutes 120       # full grid, resumable
    python3 profile_operators.py --kernels 32            # per operator the 32 shapes that teach calibrate.py most
    python3 profile_operators.py --hardware_json "My GPU.json"    # fill it in, then move it into hardware/
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from pipeweave.cli import ArgumentParser, UserError, positive_int, run_cli
from pipeweave.paths import DEFAULT_CONFIG_DIR, DEFAULT_MEASURED_DIR, DEFAULT_TRACE_DIR
from pipeweave.profiler import grids
from pipeweave.profiler.device import cuda_device_count, no_cuda_message, no_cuda_reason
from pipeweave.profiler.measure import designed_grid, print_grid, write_hardware_json
from pipeweave.profiler.timing import TIMERS, RotatingTimer


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
    parser.add_argument("--kernels", type=positive_int, default=None, metavar="K",
                        help="of every kernel operator's full grid, measure only the K shapes that teach "
                             "calibrate.py --kernels most on this GPU, most informative first "
                             "(pipeweave.kernel_design; it reads the GPU's hardware JSON)")
    parser.add_argument("--hardware", default=None, metavar="GPU",
                        help="the GPU whose hardware JSON --kernels reads (default: the local GPU's; needed with "
                             "--dry_run where no GPU is visible)")
    parser.add_argument("--configs", default=",".join(grids.DEFAULT_CONFIGS),
                        help="model config stems under --config_dir (default: the paper's three)")
    parser.add_argument("--config_dir", default=str(DEFAULT_CONFIG_DIR),
                        help="folder of HF-style config JSONs (default: config)")
    parser.add_argument("--trace_dir", default=str(DEFAULT_TRACE_DIR),
                        help="trace CSVs whose batches join the full attention grid (skipped if absent; "
                             "default: workload/traces)")
    parser.add_argument("--tp", default=",".join(str(t) for t in grids.DEFAULT_TP),
                        help="tensor-parallel sizes (default 1,2,4,8; sizes that do not divide a model are left out)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per shape (default 50, quick 20)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs per shape (default 5, quick 3)")
    parser.add_argument("--max_row_seconds", type=float, default=None,
                        help="GPU time budget per shape; long kernels get fewer repeats, at least 5 "
                             "(default 1, quick 0.25)")
    parser.add_argument("--timing", choices=tuple(TIMERS), default=RotatingTimer.name,
                        help="rotate (default): the kernel back to back over copies of its inputs that together "
                             "exceed twice the L2, timed in blocks, as a forward pass runs layer after layer; flush: "
                             "an L2 flush and a pair of CUDA events around every launch (on an H100 it timed small "
                             "GEMMs up to 1.8x the training data's harness; README, 'Measuring a new GPU'). A rerun "
                             "with the other timing measures every row again")
    parser.add_argument("--output_dir", default=str(DEFAULT_MEASURED_DIR),
                        help="root of the measured dataset (default dataset/measured)")
    parser.add_argument("--hardware_json", metavar="PATH", default=None,
                        help="write a hardware JSON skeleton for this GPU to PATH and exit")
    parser.add_argument("--dry_run", action="store_true", help="print the grid sizes and exit (no GPU needed)")
    parser.add_argument("--max_minutes", type=float, default=None,
                        help="start no new shape after this many minutes (rerun to resume)")
    parser.add_argument("--attn_backend", choices=("auto", "fa3", "fa2", "sdpa"), default="auto",
                        help="attention kernels (default auto: FA3 on Hopper if installed, else flash-attn 2, "
                             "else torch SDPA's flash backend)")
    parser.add_argument("--elementwise_backend", choices=("auto", "flashinfer", "torch"), default="auto",
                        help="RMSNorm / SiLU*Mul kernels (default auto: FlashInfer if installed, else torch)")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    parser.add_argument("--no_kernel_names", action="store_true",
                        help="do not run the profiler once per shape to record kernel names")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    if not args.ops.strip():
        raise UserError(f"--ops is empty; give a comma list of {', '.join(grids.OPS)}, or all")
    ops = list(grids.OPS) if args.ops.strip() == "all" else _name_list(args.ops)
    unknown = [op for op in ops if op not in grids.OPS]
    if unknown:
        raise UserError(f"--ops: unknown operator(s) {', '.join(unknown)}; choose from {', '.join(grids.OPS)}")
    args.ops = ops
    args.configs = _name_list(args.configs)
    if not args.configs:
        raise UserError("--configs: give at least one model config stem")
    args.tp = _int_list(args.tp, "--tp")
    if args.kernels and args.quick:
        raise UserError("--kernels chooses from the full grid; drop --quick")
    if args.hardware and not args.kernels:
        raise UserError("--hardware names the GPU whose spec sheet --kernels reads; give --kernels K too")
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
    # not (x > 0): NaN fails it too, and a NaN limit would never be reached
    if not (0 < args.max_row_seconds < math.inf):
        raise UserError(f"--max_row_seconds must be a positive finite number, got {args.max_row_seconds}")
    if args.max_minutes is not None and not (0 < args.max_minutes < math.inf):
        raise UserError(f"--max_minutes must be a positive finite number, got {args.max_minutes}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    num_gpus = cuda_device_count()

    if args.hardware_json:
        if num_gpus == 0:
            raise UserError(f"--hardware_json reads the properties of the local GPU: {no_cuda_reason()}")
        return write_hardware_json(Path(args.hardware_json), args.device)

    models = grids.load_models(args.configs, args.config_dir)
    problems: list[str] = []
    traces = {} if args.quick else grids.load_trace_prompts(args.trace_dir, problems)
    for problem in problems:
        print(f"note: {problem}", file=sys.stderr)
    mode = "quick" if args.quick else "full"

    if args.dry_run:
        grid = grids.build_grid(models, args.tp, quick=args.quick, ops=args.ops, num_gpus=num_gpus, traces=traces)
        if args.kernels:
            if not args.hardware and num_gpus == 0:
                raise UserError(f"--kernels with --dry_run: name the GPU with --hardware ({no_cuda_reason()})")
            if not args.hardware:
                if args.device >= num_gpus:
                    raise UserError(f"--device {args.device}: only {num_gpus} CUDA GPU(s) visible")
                import torch

                args.hardware = torch.cuda.get_device_name(args.device)
            grid, mode = designed_grid(grid, args.kernels, args.hardware)
        print_grid(grid,
                   f"{mode} grid for {', '.join(m.stem for m in models)} at TP {','.join(map(str, args.tp))}"
                   f" ({num_gpus} CUDA GPU{'s' if num_gpus != 1 else ''} visible"
                   + (f", {len(traces)} traces" if traces else "") + "):")
        if "attn" in args.ops:
            print("  note: attention_type strings assume FlashAttention-2; with FA3 on Hopper prefill rows "
                  "are fa3_ragged")
        return 0

    if num_gpus == 0:
        raise UserError(no_cuda_message())
    if args.device >= num_gpus:
        raise UserError(f"--device {args.device}: only {num_gpus} CUDA GPU(s) visible")
    from pipeweave.profiler.measure import measure

    return measure(args, models, traces, num_gpus)


if __name__ == "__main__":
    sys.exit(run_cli(main))
