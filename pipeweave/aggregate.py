"""The command line of ``aggregator.py``: workload JSON(s) × GPU(s) → prediction JSON(s) (docs/METHOD.md §7).

The work is done by :mod:`pipeweave.engine` (prediction), :mod:`pipeweave.schema` (the workload format) and
:mod:`pipeweave.report` (the output object); this module parses flags, builds the (workload, GPU) jobs, writes
one JSON per job and prints the summaries. The names below are re-exported for code written against the
earlier single-module layout.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, UnknownHardwareError, hardware_registry
from analytical_model.pipes import HardwareSpec
from pipeweave.calibration import load_calibration
from pipeweave.cli import (STANDARD_STREAM, UserError, check_output_path, refuse_overwriting_inputs, require_file,
                           write_atomically)
from pipeweave.engine import (COLLECTIVE_ESTIMATES, Aggregator, Engine, Job, Prediction, uncalibrated,
                              unmeasured_note)
from pipeweave.flatten import CATEGORIES, KERNEL_CATEGORIES, FlatWorkload, load_workload, parse_workload
from pipeweave.paths import DEFAULT_MODEL_DIR, DEFAULT_QUANTILE_DIR
from pipeweave.report import (SUMMARY_KEYS, build_result, describe, dumps_result, extrapolated_note, output_name,
                              summarize)
from pipeweave.schema import WorkloadFormatError
from pipeweave.siblings import die_note, sibling_note

__all__ = [  # the CLI, and the names code written against the single-module layout imports from here
    "main", "build_parser", "expand_hardware", "read_pairs", "Aggregator", "Engine", "Job", "Prediction",
    "FlatWorkload", "load_workload", "parse_workload", "WorkloadFormatError", "CATEGORIES", "KERNEL_CATEGORIES",
    "SUMMARY_KEYS", "build_result", "dumps_result", "output_name", "summarize",
]


def build_parser():
    from pipeweave.cli import ArgumentParser

    parser = ArgumentParser(
        prog="aggregator.py",
        description="Predict the end-to-end latency of LLM inference workloads on GPUs (docs/METHOD.md §7).",
        epilog="Several workloads and/or GPUs (or --pairs) predict every pair in one process with the models loaded "
               "once; --output is then a directory that receives <workload stem>_<GPU stem>.json per pair.",
    )
    parser.add_argument("--workload", nargs="+", action="extend", default=[], metavar="JSON",
                        help="workload JSON file(s) (docs/METHOD.md §6.4), or stems of files in workload/; repeatable")
    parser.add_argument("--hardware", action="append", default=[], metavar="GPU",
                        help="GPU name (hardware file stem such as 'H100' or 'RTX 6000 Ada', or the device name) or "
                             "the path of a GPU's JSON file (one of your own, beside the shipped ones), a "
                             "comma-separated list, or 'all' (every GPU in --hardware_dir); repeatable")
    parser.add_argument("--pairs", metavar="CSV",
                        help="sweep matrix instead of --workload x --hardware: CSV with header "
                             "'workload,hardware[,collective_hardware]', one pair per line ('#' lines ignored; "
                             "'-' reads standard input)")
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR),
                        help="root of the trained MLPs: <model_dir>/<op>/<timestamp>/ (default: mlp_models)")
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR),
                        help="directory of GPU spec JSONs (default: hardware)")
    parser.add_argument("--dataset_dir", default=None,
                        help="accepted for compatibility with the reference CLI and ignored: pipeweave needs no "
                             "dataset at inference (GEMM tiles come from the tile rule, collective models from "
                             "--collective_dir)")
    parser.add_argument("--output", default=None,
                        help="output JSON for one pair (default predictions.json; '-': standard output, the other "
                             "lines on standard error); a directory when several pairs (for one pair too: an "
                             "existing folder, or a path ending in /)")
    parser.add_argument("--collective_hardware", default=None, metavar="GPU",
                        help="GPU whose collective models predict the communication (default: the prediction GPU, "
                             "if it has collective models; otherwise the warned analytical estimate, see --collective_estimate)")
    parser.add_argument("--collective_dir", default=None,
                        help="root of the collective models (default: collective_models)")
    parser.add_argument("--collective_estimate", choices=COLLECTIVE_ESTIMATES, default="analytical",
                        help="'analytical' (default): where no measured model covers a collective (GPU, kind or "
                             "worker count), use the documented analytical estimate from the GPU's hardware JSON "
                             "link (pipeweave.collectives.CollectivePredictor.analytical_ms: the ring estimate scaled "
                             "by the ring efficiency other GPUs of the link measured, vLLM custom all-reduce model "
                             "for small NVLink messages) and print a WARNING line naming it; 'model': measured "
                             "collective models only, a missing one is an error")
    parser.add_argument("--ignore_memory", action="store_true",
                        help="predict even when the workload does not fit in GPU memory (weights + KV cache + "
                             "activations, pipeweave.memory); the output then carries memory_check.fits = false")
    parser.add_argument("--quantiles", action="store_true",
                        help="also load quantile (upper-efficiency) models from --quantile_dir and report optimistic "
                             "latencies (summary.optimistic_*) beside the point prediction")
    parser.add_argument("--quantile_dir", default=str(DEFAULT_QUANTILE_DIR),
                        help="root of the quantile models (default: mlp_models_quantile)")
    parser.add_argument("--calibration", default=None, metavar="JSON",
                        help="a calibration written by calibrate.py: corrects the predictions of its GPU (only); "
                             "refused if no requested GPU is that GPU")
    return parser


def workload_memory(workload: FlatWorkload, spec: HardwareSpec):
    """The memory check (pipeweave.memory.MemoryCheck) of a workload's static batch on ``spec``; None for a
    workload without ``model_params``."""
    from pipeweave.memory import check_memory, config_from_model_params
    from pipeweave.workload import WorkloadError

    if workload.model_params is None:
        return None
    try:
        cfg = config_from_model_params(workload.model_params, workload.model)
        return check_memory(cfg, spec, workload.prompt_lengths, len(workload.phases), tp=workload.tp_size,
                            pp=workload.pp_size, ep=workload.ep_size, dtype=workload.dtype,
                            forward_lengths=workload.peak_q_lengths)
    except WorkloadError as exc:
        raise WorkloadFormatError(f"{workload.stem}: memory check: {exc}") from None


def memory_check(job: Job, ignore: bool, log=print, option: str = "--ignore_memory") -> dict | None:
    """Whether the job's workload fits in GPU memory (pipeweave.memory): an error if it does not, unless
    ``ignore`` (then a WARNING and the returned record for the output). None when it fits. ``log`` takes the
    notes and warnings; ``option`` names the caller's way to ignore a misfit. An FP8 workload on a GPU without an
    FP8 tensor rate is refused first, with that reason alone: no TP would make it run, so a TP hint would mislead."""
    from analytical_model.gemm_fp8 import missing_rate

    workload, where = job.workload, f"{job.workload.stem} on {job.hardware.stem}"
    missing = missing_rate(job.hardware) if "gemm_fp8" in workload.ops() else None
    if missing:
        raise UserError(f"{where}: {missing}")
    check = workload_memory(workload, job.hardware)
    if check is None:
        log(f"Note: {where}: the workload has no model_params, so GPU memory was not checked")
        return None
    if check.fits:
        return None
    if not ignore:
        raise UserError(f"{where}: {check.message(workload.tp_size)} ({option} predicts anyway)")
    log(f"WARNING: {where}: {check.message(workload.tp_size)}; predicted anyway ({option})")
    return {"fits": False, "ignored": True, "required_gb": round(check.required_gb, 3),
            "available_gb": round(check.available_gb, 3), "smallest_tp": check.smallest_tp}


def expand_hardware(values: Sequence[str], registry) -> list[HardwareSpec]:
    specs: list[HardwareSpec] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            if name.lower() == "all":
                specs.extend(registry.specs[stem] for stem in registry.known())
            else:
                specs.append(registry.get(name))
    unique = list(dict.fromkeys(specs))
    if not unique:
        raise UserError("--hardware names no GPU")
    return unique


def read_pairs(path: str) -> list[tuple[int, str, str, str | None]]:
    """(line number in the file, workload, GPU, collective GPU or None) per pair; blank and # lines are skipped."""
    text = sys.stdin.read() if path == "-" else _read_text(path)
    # comment lines become empty ones, so a quote in a comment opens no field and the line numbers stay the file's
    kept = "\n".join("" if line.lstrip().startswith("#") else line for line in text.splitlines())
    reader = csv.reader(io.StringIO(kept), skipinitialspace=True)
    rows = []
    for row in reader:  # reader.line_num: the file's line where the row ends (a quoted cell may span lines)
        if any(cell.strip() for cell in row):
            rows.append((reader.line_num, [cell.strip() for cell in row]))
    if not rows:
        raise UserError(f"--pairs {path}: no pairs")
    header = rows[0][1]
    if len(rows) == 1:
        raise UserError(f"--pairs {path}: no pairs after the header line")
    if header[:2] != ["workload", "hardware"] or any(h not in ("workload", "hardware", "collective_hardware")
                                                     for h in header):
        raise UserError(f"--pairs {path}: header must be 'workload,hardware[,collective_hardware]', "
                        f"got {','.join(header)!r}")
    pairs = []
    for line_no, row in rows[1:]:
        if len(row) < 2 or len(row) > len(header):
            raise UserError(f"--pairs {path}: line {line_no} needs {len(header)} fields, got {len(row)}")
        if any("\n" in cell or "\r" in cell for cell in row):
            raise UserError(f"--pairs {path}: line {line_no}: a field spans lines (a stray quote?)")
        values = dict(zip(header, row))
        pairs.append((line_no, values["workload"], values["hardware"], values.get("collective_hardware") or None))
    return pairs


def _read_text(path: str) -> str:
    p = require_file(path, "--pairs file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"--pairs {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def output_targets(jobs: Sequence[Job], output: str | None) -> list[Path]:
    """The file each job writes: ``output`` (default predictions.json) for one pair, else one file per pair in
    the directory ``output``; errors before any work when that is impossible."""
    if output == STANDARD_STREAM and len(jobs) > 1:
        raise UserError(f"--output - writes one prediction to standard output; with {len(jobs)} (workload, GPU) pairs "
                        f"give --output DIRECTORY")
    if len(jobs) == 1:
        target = Path(output or "predictions.json")
        if target.is_dir() or (output or "").endswith(("/", os.sep)):  # a trailing slash names a folder
            target = target / output_name(jobs[0].workload.stem, jobs[0].hardware)
        return [target]
    if not output:
        raise UserError(f"{len(jobs)} (workload, GPU) pairs: give --output DIRECTORY for one file per pair")
    out_dir = Path(output)
    if out_dir.suffix == ".json" or out_dir.is_file():
        raise UserError(f"--output {out_dir}: with {len(jobs)} pairs --output must be a directory")
    targets = [out_dir / output_name(job.workload.stem, job.hardware) for job in jobs]
    duplicates = {t for t in targets if targets.count(t) > 1}
    if duplicates:
        raise UserError(f"two pairs would write the same file {sorted(duplicates)[0]}")
    return targets


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.output != STANDARD_STREAM:
        return predict_and_write(args, sys.stdout)
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        return predict_and_write(args, stdout)


def predict_and_write(args, stdout) -> int:
    """The aggregator's work for parsed flags; ``stdout`` receives a prediction whose target is ``-``."""
    registry = hardware_registry(Path(args.hardware_dir))
    workload_cache: dict[str, FlatWorkload] = {}

    def workload(name: str) -> FlatWorkload:
        if name not in workload_cache:
            workload_cache[name] = load_workload(name)
        return workload_cache[name]

    jobs: list[Job] = []
    if args.pairs:
        if args.workload or args.hardware:
            raise UserError("--pairs replaces --workload and --hardware; give one or the other")
        for line_no, wname, hname, cname in read_pairs(args.pairs):
            try:
                jobs.append(Job(workload(wname), registry.get(hname), cname or args.collective_hardware))
            except (UnknownHardwareError, ValueError, FileNotFoundError) as exc:
                raise UserError(f"--pairs {args.pairs}: line {line_no}: {exc.args[0] if exc.args else exc}") from None
    else:
        if not args.workload:
            raise UserError("the following arguments are required: --workload (or --pairs)")
        if not args.hardware:
            raise UserError("the following arguments are required: --hardware (or --pairs)")
        gpus = expand_hardware(args.hardware, registry)
        for wname in dict.fromkeys(args.workload):
            for spec in gpus:
                jobs.append(Job(workload(wname), spec, args.collective_hardware))
    if args.collective_hardware:
        registry.get(args.collective_hardware)  # unknown name: error listing the known GPUs

    several = len(jobs) > 1
    targets = output_targets(jobs, args.output)
    inputs = {f"the workload {job.workload.path}": job.workload.path for job in jobs}
    inputs.update({"the --pairs file": None if args.pairs in (None, "-") else args.pairs,
                   "the --calibration file": args.calibration})
    inputs.update({f"the hardware file {path}": path for path in registry.added_files.values()})
    for target in targets:
        if str(target) != STANDARD_STREAM:
            check_output_path(target, hardware_dir=args.hardware_dir)
            refuse_overwriting_inputs(target, inputs)

    if args.quantiles and not Path(args.quantile_dir).is_dir():
        raise FileNotFoundError(f"--quantiles: quantile model directory not found: {args.quantile_dir} "
                                f"(train with: python3 train_mlp_quantile.py --op OP)")
    if args.dataset_dir:
        print(f"Note: --dataset_dir {args.dataset_dir} is ignored (pipeweave needs no dataset at inference)")
    calibration = load_calibration(args.calibration) if args.calibration else None
    if calibration is not None:
        calibration.check_hardware([job.hardware.stem for job in jobs])
        print(f"Calibration: {args.calibration} ({calibration.hardware})")
    engine = Engine(
        model_dir=args.model_dir,
        hardware_dir=args.hardware_dir,
        collective_dir=args.collective_dir,
        collective_estimate=args.collective_estimate,
        quantile_dir=args.quantile_dir if args.quantiles else None,
        calibration=calibration,
    )
    for workload in {id(job.workload): job.workload for job in jobs}.values():
        warning = workload.parallelism_warning()  # a file's, not the serving simulator's synthetic workloads
        if warning:
            print(warning)
    memory, failures = {}, []
    for job in jobs:  # in a sweep a pair that does not fit is one failure, not the end of the sweep
        try:
            memory[id(job)] = memory_check(job, args.ignore_memory)
        except UserError as exc:
            if not several:
                raise
            failures.append((job, failure_reason(job, exc)))
    runnable = [job for job in jobs if id(job) in memory]
    started = time.perf_counter()
    made, not_made = predict_all(engine, runnable)
    elapsed = time.perf_counter() - started
    by_job = {id(job): prediction for job, prediction in zip(runnable, made)}
    predictions = [by_job.get(id(job)) for job in jobs]
    failures += not_made
    if calibration is not None:
        calibrated = [job for job in jobs if job.hardware.stem == calibration.hardware]
        collectives_of = [engine.gpu(job.collective_hardware).stem if job.collective_hardware else job.hardware.stem
                          for job in calibrated if job.workload.has_communication]
        for warning in engine.calibration_warnings([op for job in calibrated for op in job.workload.ops()],
                                                   collectives_of):
            print(warning)
    for prediction in predictions:
        if prediction is not None and memory[id(prediction.job)] is not None:
            prediction.result["memory_check"] = memory[id(prediction.job)]
    written = write_predictions(predictions, targets, several, stdout)
    if several:
        print(f"Predicted {written}{f' of {len(jobs)}' if failures else ''} pairs in {elapsed * 1000:.1f} ms "
              f"(models loaded once)")
    if failures:
        for job, message in failures:
            print(f"not predicted: {job.workload.stem} on {job.hardware.stem}: {message}", file=sys.stderr)
        raise UserError(f"{len(failures)} of {len(jobs)} pairs could not be predicted (listed above); "
                        f"the other {written} were written")
    return 0


def write_predictions(predictions: list[Prediction | None], targets: list[Path], several: bool,
                      stdout=None) -> int:
    """Write every prediction made (a target ``-`` to ``stdout``) and print its summary; returns how many were
    written. An interrupt says how far the sweep got, so a partial output folder is never mistaken for a complete
    one."""
    written = 0
    try:
        for prediction, target in zip(predictions, targets):
            if prediction is None:
                continue
            text = dumps_result(prediction.result)
            if str(target) == STANDARD_STREAM:
                stdout.write(text)
            else:
                write_atomically(target, lambda tmp, text=text: tmp.write_text(text))
            written += 1
            print_summary(prediction, target, several)
    except KeyboardInterrupt:
        print(f"interrupted: wrote {written} of {len(targets)} predictions; the sweep is incomplete", file=sys.stderr)
        raise
    return written


def predict_all(engine: Engine, jobs: list[Job]) -> tuple[list[Prediction | None], list[tuple[Job, str]]]:
    """Every prediction that can be made, in job order (None where it cannot), and (job, reason) of the others.
    One batch when all succeed; after a failure each job is predicted alone (models stay loaded)."""
    if not jobs:
        return [], []
    # ValueError: what a calculator refuses for one GPU (an FP8 workload on a GPU without an FP8 rate)
    try:
        return engine.predict(jobs), []
    except (UserError, ValueError):
        if len(jobs) == 1:
            raise
    predictions: list[Prediction | None] = []
    failures = []
    for job in jobs:
        try:
            predictions.append(engine.predict([job])[0])
        except (UserError, ValueError) as exc:
            predictions.append(None)
            failures.append((job, failure_reason(job, exc)))
    return predictions, failures


def failure_reason(job: Job, exc: Exception) -> str:
    """The error of one pair of a sweep, without the pair's name (the listing puts it in front)."""
    message = exc.args[0] if exc.args else str(exc)
    for prefix in (f"{job.workload.stem} on {job.hardware.stem}: ", f"{job.workload.stem}: "):
        message = message.removeprefix(prefix)
    return message


def print_summary(prediction: Prediction, target: Path, several: bool) -> None:
    summary = prediction.result["summary"]
    job = prediction.job
    if several:
        print(f"== {job.workload.stem} on {job.hardware.stem}")
    print(f"Predicted: {describe(job.workload)} on {job.hardware.name}")
    if prediction.collective_source:
        print(f"Communication: {prediction.collective_source}")
    print(f"Prefill duration: {summary['prefill_duration_ms']:.3f} ms")
    if "decode" in job.workload.phases:
        print(f"Decode avg duration: {summary['decode_avg_duration_ms']:.3f} ms")
    else:
        print("Decode avg duration: none (the workload has no decode iteration; decode_* fields are 0)")
    print(f"Total duration: {summary['total_duration_ms']:.3f} ms")
    if "optimistic_total_duration_ms" in summary:
        print(f"Optimistic (quantile models) prefill / decode avg / total: "
              f"{summary['optimistic_prefill_duration_ms']:.3f} / "
              f"{summary['optimistic_decode_avg_duration_ms']:.3f} / "
              f"{summary['optimistic_total_duration_ms']:.3f} ms")
    interval = prediction.result.get("interval")
    if interval:
        low, high = interval["low"], interval["high"]
        decode = (f", decode avg {low['decode_avg_duration_ms']:.3f}–{high['decode_avg_duration_ms']:.3f}"
                  if "decode" in job.workload.phases else "")
        print(f"{round((interval['levels'][1] - interval['levels'][0]) * 100)} % interval (held-out kernel errors): "
              f"prefill {low['prefill_duration_ms']:.3f}–{high['prefill_duration_ms']:.3f}{decode}, total "
              f"{low['total_duration_ms']:.3f}–{high['total_duration_ms']:.3f} ms"
              + (" (some collectives at their point value: interval.note)" if "note" in interval else ""))
    extrapolation = prediction.result.get("extrapolation", {})
    note = extrapolated_note(extrapolation)
    if note:
        print(note)
    zero_shot, calibrated = uncalibrated(extrapolation.get("unmeasured_gpu", []), prediction.result.get("calibration"))
    if zero_shot:
        print(unmeasured_note(job.hardware.name, zero_shot, calibrated=calibrated))
    for category, sibling in extrapolation.get("sibling", {}).items():
        print(sibling_note(category, job.hardware.name, sibling))
    for category, sibling in extrapolation.get("same_die", {}).items():
        print(die_note(category, job.hardware.name, sibling))
    print(f"Predictions saved to {'standard output' if str(target) == STANDARD_STREAM else target}")
