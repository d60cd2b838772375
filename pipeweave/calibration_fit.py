"""Reading a user's measurements and fitting a calibration: the logic behind ``calibrate.py``.

    python3 calibrate.py --hardware L40 --e2e measured.csv [--kernels dataset/measured/L40/gemm.csv ...] \
        --output L40_calibration.json

``--e2e`` is a CSV ``workload,prefill_ms,decode_step_ms,total_ms``: a workload JSON (path, relative to the
working directory or to the CSV, or a stem of ``workload/``), its measured prefill latency, median per-step
decode latency and total latency in ms. A metric that was not measured may be left empty (at least one per
row). ``--kernels`` takes the profiler's CSVs (``dataset/measured/<gpu>/<op>.csv``: ``op``, the shape columns,
``avg_duration`` in µs, ...); ``all_reduce.csv`` informs the communication factors (latency and bandwidth).

Each measured number becomes one equation of :mod:`pipeweave.calibration`: the zero-shot prediction of the
same quantity, written as a sum over kernel and collective instances, with each instance's design row.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_files, hardware_registry
from analytical_model.pipes import HardwareSpec
from analytical_model.registry import get_operator
from pipeweave.bounds import fastest_us, l2_cycles
from pipeweave.calibration import (DEFAULT_PRIOR_PATH, MIN_SPREAD_KERNELS, Calibration, Equations, Prior,
                                   collective_models_record, cross_validated_log_residuals, file_digest, fit_map,
                                   load_prior, refitted_without, spec_record, spread_entry)
from pipeweave.calibration_design import PARAMS, attention_types, communication_design, design, kernel_classes
from pipeweave.cli import (ArgumentParser, UserError, check_output_path, positive_int, refuse_overwriting_inputs,
                           require_file)
from pipeweave.collectives import collective_workers
from pipeweave.finetune import MAX_DEFAULT_WORKERS, TRIGGER_BITS, default_workers, fine_tuning_pool
from pipeweave.residual_kernel import (RESIDUAL_INPUTS, fit_interpolations, interpolator, residual_groups,
                                       residual_inputs)
from pipeweave.schema import COLLECTIVE_KINDS

if TYPE_CHECKING:  # the kernel CSVs are read with pandas (training extras); the end-to-end runs without it
    import pandas as pd

E2E_COLUMNS = ("workload", "prefill_ms", "decode_step_ms", "total_ms")
METRICS = ("prefill_ms", "decode_step_ms", "total_ms")


# ------------------------------------------------------------------------------------------------
# end-to-end runs


def csv_text_rows(path: Path, flag: str, expected: str) -> tuple[list[str], list[list[str]], list[int]]:
    """(header, rows, the CSV line of each row) of a CSV, every cell as text, header cells stripped; a row with more
    or fewer fields than the header, a repeated column or an empty file is a one-line error naming ``flag``, the file
    and the row."""
    from pipeweave.kernels import read_shapes

    try:
        header, rows, lines = read_shapes(path, expected)
    except UserError as exc:
        raise UserError(f"{flag} {exc}") from None
    return header, rows, lines


def csv_text_frame(path: Path, flag: str, expected: str) -> pd.DataFrame:
    """:func:`csv_text_rows` as a DataFrame of text (for the kernel CSVs; the end-to-end runs, which the base install
    calibrates from, are read without pandas)."""
    import pandas as pd

    header, rows, lines = csv_text_rows(path, flag, expected)
    # indexed by each row's CSV line - 2 (blank lines skipped, rows later left out keep theirs)
    return pd.DataFrame(rows, columns=header, dtype=str, index=[line - 2 for line in lines])


def not_a_positive_number(values: pd.Series) -> pd.Series:
    """Where a parsed column is not a finite positive number (non-numeric text parses to NaN, 1e400 to inf)."""
    return ~(np.isfinite(values) & (values > 0))


#: the range of a measured time in ms: beyond it a cell is a unit error or garbage (1e308 ms overflowed the median)
MEASURED_MS_RANGE = (1e-6, 1e9)


def positive_ms(text: str) -> float | None:
    """A cell's positive number of ms within :data:`MEASURED_MS_RANGE`, None for anything else (text, 0, inf,
    nan, 1e308)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if MEASURED_MS_RANGE[0] <= value <= MEASURED_MS_RANGE[1] else None


def read_e2e_csv(path: str | Path, flag: str = "--e2e") -> list[tuple[int, str, dict[str, float]]]:
    """The measured runs: (CSV line, workload, {metric: ms} of the metrics measured) per row; every problem is a
    one-line error naming ``flag``, the file (and line)."""
    path = require_file(path, f"{flag} file")
    header, rows, lines = csv_text_rows(path, flag, f"expected the header {','.join(E2E_COLUMNS)}")
    unknown = [c for c in header if c not in E2E_COLUMNS]
    missing = [c for c in E2E_COLUMNS if c not in header]
    if unknown or missing:
        problem = f"unknown column(s) {', '.join(unknown)}" if unknown else f"missing column(s) {', '.join(missing)}"
        raise UserError(f"{flag} {path}: {problem}; expected {','.join(E2E_COLUMNS)}")
    if not rows:
        raise UserError(f"{flag} {path}: no runs (only a header)")
    runs = []
    for position, row in enumerate(rows):
        cells = dict(zip(header, row))
        measured = {}
        for metric in METRICS:
            text = cells[metric].strip()
            if not text:
                continue
            value = positive_ms(text)
            if value is None:
                raise UserError(f"{flag} {path}: line {lines[position]}: {metric} must be a positive number of ms "
                                f"from {MEASURED_MS_RANGE[0]:g} to {MEASURED_MS_RANGE[1]:g}, got {cells[metric]!r}")
            measured[metric] = value
        workload = cells["workload"].strip()
        if not workload or not measured:
            raise UserError(f"{flag} {path}: line {lines[position]}: needs a workload and at least one measured "
                            f"metric")
        runs.append((lines[position], workload, measured))
    return runs


def resolve_run_workload(name: str, csv_path: Path) -> Path:
    """The workload file a run names: relative to the working directory or to the CSV's folder (a path that names
    two different files there is an error: the fit would take one silently), else a shipped workload's stem."""
    from pipeweave.flatten import resolve_workload_path

    here, beside = Path(name), csv_path.parent / name
    if here.is_file() and beside.is_file() and not here.samefile(beside):
        raise UserError(f"workload {name} names both {here.resolve()} (from the working directory) and "
                        f"{beside.resolve()} (beside the CSV); give an absolute path")
    if not here.is_file() and beside.is_file():
        return beside
    return resolve_workload_path(name)


def run_lines(e2e: str) -> dict[Path, list[int]]:
    """The CSV lines of each run's workload file (a run's repeats are several lines), to name them in errors."""
    lines: dict[Path, list[int]] = {}
    for line, name, _ in read_e2e_csv(e2e):
        lines.setdefault(resolve_run_workload(name, Path(e2e)).resolve(), []).append(line)
    return lines


def run_workloads(e2e: str | None) -> list[Path]:
    """The workload files the runs of ``e2e`` name (:func:`run_lines`), for the output check before the fit; a
    problem with the CSV or a workload gives none here, and the fit's own error (naming its line) instead."""
    if e2e is None:
        return []
    try:
        return list(run_lines(e2e))
    except (UserError, FileNotFoundError, ValueError):
        return []


def check_fits(workload, spec: HardwareSpec, where: str) -> None:
    """Refuse a measured run whose weights and KV cache alone (pipeweave.memory: per pipeline stage, MoE experts
    and the workload's dtype included) exceed the GPU's memory: it cannot have run there. Activations and vLLM's
    memory share are left out, unlike the aggregator's check: the run was measured, so it did fit with the
    settings it ran under."""
    from analytical_model.gemm_fp8 import missing_rate
    from pipeweave.aggregate import workload_memory
    from pipeweave.schema import WorkloadFormatError
    from pipeweave.validation import fa3_mismatches

    missing = missing_rate(spec) if "gemm_fp8" in workload.ops() else None
    if missing:
        raise UserError(f"{where}: {workload.stem} has FP8 GEMMs: {missing}")
    try:
        check = workload_memory(workload, spec)
    except WorkloadFormatError as exc:
        raise UserError(f"{where}: {exc}") from None
    if check is None:
        print(f"Note: {where}: {workload.stem} has no model_params, so GPU memory was not checked")
        return
    needed = check.weights + check.kv_cache
    if spec.total_global_mem and needed > spec.total_global_mem:
        raise UserError(f"{where}: {workload.stem} ({workload.model}, TP{workload.tp_size} PP{workload.pp_size}) "
                        f"needs {needed / 1e9:.1f} GB of weights and KV cache per GPU, more than {spec.stem}'s "
                        f"{spec.total_global_mem / 1e9:.1f} GB: it cannot have run on this GPU")
    fa3 = fa3_mismatches([shape[0] for shape in workload.shapes.get("attn", [])], spec.architecture)
    if fa3:  # calibrated against a kernel that does not exist there, the attention correction would be meaningless
        raise UserError(f"{where}: {workload.stem} uses {', '.join(fa3)} (FlashAttention-3, Hopper only), which "
                        f"cannot run on {spec.stem} ({spec.architecture}): it cannot be a run measured there; "
                        f"generate the workload with --hardware {spec.stem} (FA2 kernels)")


def check_consistent(workload, measured: dict, where: str) -> None:
    """A WARNING when a run's total is far from its prefill plus its decode steps (a median step times their number;
    a factor 1.5 either way leaves room for the median against the mean and for what the total adds): a cell in
    the wrong unit or column would calibrate the GPU to it."""
    if not {"prefill_ms", "decode_step_ms", "total_ms"} <= set(measured):
        return
    steps = sum(phase != "prefill" for phase in workload.phases)
    parts = measured["prefill_ms"] + steps * measured["decode_step_ms"]
    if not parts / 1.5 <= measured["total_ms"] <= parts * 1.5:
        print(f"WARNING: {where}: total_ms {measured['total_ms']:g} is far from prefill_ms + {steps} decode steps x "
              f"decode_step_ms = {parts:g}; check the cells' units and order")


def read_runs(path: str | Path, spec: HardwareSpec, flag: str = "--e2e") -> list[tuple[object, list[dict]]]:
    """(workload, its repeats) per run of a measured-run CSV on the GPU ``spec``: rows of one workload file are the
    repeats of one run. Each row is checked: its workload exists, fits the GPU and runs there (:func:`check_fits`),
    its total agrees with its parts (:func:`check_consistent`), a decode time has decode steps to predict it."""
    from pipeweave.flatten import load_workload

    grouped: dict = {}
    for line, name, measured in read_e2e_csv(path, flag):
        where = f"{flag} {path}: line {line}"
        try:
            workload = load_workload(resolve_run_workload(name, Path(path)))
        except (FileNotFoundError, UserError) as exc:
            raise UserError(f"{where}: {exc.args[0]}") from None
        check_fits(workload, spec, where)
        check_consistent(workload, measured, where)
        has_phase = {"prefill": "prefill" in workload.phases,
                     "decode": any(phase != "prefill" for phase in workload.phases)}
        for metric, phase in (("decode_step_ms", "decode"), ("prefill_ms", "prefill")):
            if metric in measured and not has_phase[phase]:
                raise UserError(f"{where}: {metric} was given, but the workload has no {phase} iteration to predict "
                                f"it from; leave that cell empty")
        run = grouped.setdefault(Path(workload.path).resolve(), (workload, [], []))
        run[1].append(measured)
        run[2].append(line)
    runs = []
    for workload, repeats, lines in grouped.values():
        if len(repeats) > 1:  # repeats split over rows: their medians must agree as one row's cells must
            check_consistent(workload, median_metrics(repeats),
                             f"{flag} {path}: lines {', '.join(map(str, lines))} (medians)")
        runs.append((workload, repeats))
    return runs


def median_metrics(repeats: list[dict]) -> dict[str, float]:
    """{metric: the median of the repeats that measured it} of one run's repeats."""
    metrics = dict.fromkeys(metric for measured in repeats for metric in measured)
    return {metric: float(np.median([m[metric] for m in repeats if metric in m])) for metric in metrics}


def merged_repeats(runs: list) -> list:
    """(workload, {metric: ms}) per run of :func:`read_runs`: each metric the median of the run's repeats, as
    docs/E2E.md scores a run (counted as separate runs, repeats would outweigh the prior without adding information
    about the model)."""
    merged = []
    for workload, repeats in runs:
        merged.append((workload, median_metrics(repeats)))
        if len(repeats) > 1:
            counts = ", ".join(f"{metric} {sum(metric in m for m in repeats)}" for metric in merged[-1][1])
            print(f"Note: {len(repeats)} rows of {workload.stem}: calibrated on the median of each metric "
                  f"(repeats: {counts})")
    return merged


def instance_terms(aggregator, workload, spec: HardwareSpec, standardisation: dict
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(single duration in ms, design row, fastest ms) of every operator instance of ``workload`` on ``spec``: a
    kernel's duration as the model gives it before the clamp to its fastest time, which the engine applies after a
    calibration and so the fit does too (:class:`pipeweave.calibration.Equations`); a collective's zero-shot
    prediction, with no fastest time (0)."""
    from pipeweave.engine import Job
    from pipeweave.flatten import CATEGORY_CODE, COMMUNICATION_CODE, KERNEL_CATEGORIES

    result = aggregator.predict([Job(workload, spec)])[0].result
    single = np.zeros(len(workload.inst_code))
    for position, entries in enumerate(workload.layout):
        durations = result["iterations"][position]["operator_durations"]
        for category, name, i in entries:
            entry = durations[category][name] if name is not None else durations[category]
            single[i] = entry["single_duration_ms"]
    x, fastest = np.zeros((len(single), len(PARAMS))), np.zeros(len(single))
    for kind in COLLECTIVE_KINDS:
        rows = np.flatnonzero((workload.inst_code == COMMUNICATION_CODE)
                              & np.isin(workload.inst_local, [i for i, (k, _) in enumerate(workload.collectives)
                                                              if k == kind]))
        if rows.size:
            sizes = np.array([workload.collectives[i][1] for i in workload.inst_local[rows]], dtype=np.float64)
            x[rows] = communication_design(kind, sizes, collective_workers(kind, workload.tp_size), spec)
    for category, op in KERNEL_CATEGORIES.items():
        rows = np.flatnonzero(workload.inst_code == CATEGORY_CODE[category])
        if not rows.size:
            continue
        shapes = workload.shapes[op]
        keys = [(spec.stem, shape) for shape in shapes]
        features, described = aggregator.kernel_features(op, keys)
        model, unique_fastest = aggregator.model_ms(op, keys, features, described)
        local = workload.inst_local[rows]
        single[rows], fastest[rows] = model[local], unique_fastest[local]
        x[rows] = design(op, features, shapes, standardisation)[local]
    return single, x, fastest


def run_equations(aggregator, workload, spec: HardwareSpec, measured: dict, prior: Prior, label: str) -> Equations:
    """Equations of one measured run: prefill (Σ prefill iterations), decode step (mean decode iteration), total."""
    single, x, fastest = instance_terms(aggregator, workload, spec, prior.standardisation)
    phases = np.array(workload.phases)[workload.inst_iter]
    weighted, weighted_fastest = single * workload.inst_count, fastest * workload.inst_count
    n_decode = sum(phase != "prefill" for phase in workload.phases)
    masks = {"prefill_ms": (phases == "prefill", 1.0), "decode_step_ms": (phases != "prefill", 1.0 / max(n_decode, 1)),
             "total_ms": (np.ones(len(phases), bool), 1.0)}
    eq, base, floor, rows, values, labels = [], [], [], [], [], []
    for metric in METRICS:
        value = measured.get(metric)
        mask, scale = masks[metric]
        keep = np.flatnonzero(mask & (weighted > 0))
        if value is None or not np.isfinite(value):
            continue
        if not keep.size:
            raise UserError(f"--e2e: {label}: {metric} was given, but the workload has no "
                            f"{'decode' if metric == 'decode_step_ms' else 'prefill'} iteration to predict it "
                            f"from; leave that cell empty")
        eq.append(np.full(keep.size, len(values)))
        base.append(weighted[keep] * scale)
        floor.append(weighted_fastest[keep] * scale)
        rows.append(x[keep])
        values.append(value)
        labels.append(f"{label} {metric}")
    if not values:
        return Equations.empty()
    return Equations(np.concatenate(eq), np.concatenate(base), np.vstack(rows), np.array(values),
                     np.full(len(values), prior.sigma_e2e), labels, np.concatenate(floor))


# ------------------------------------------------------------------------------------------------
# measured kernels


def kernel_shape_columns() -> dict[str, tuple[str, ...]]:
    """{operator: shape columns} of the kernels a calibration reads: the profiler's, and whole fused-MoE layers
    (the registry's ``moe`` columns), which the profiler does not measure but other benchmarks do."""
    from pipeweave.profiler.grids import SHAPE_COLUMNS

    return {**SHAPE_COLUMNS, "moe": get_operator("moe").shape_columns}


class NothingModelled(UserError):
    """Every row of a kernel CSV timed another kernel than the one pipeweave models: :func:`read_kernel_csvs`
    leaves such a file out while other measurements remain."""


def modelled_rows(frame: pd.DataFrame, reasons: list, path: Path) -> pd.DataFrame:
    """The rows that timed the kernel pipeweave models (``reasons``: pipeweave.profiler.csvio.unmodelled_reasons and
    :func:`custom_allreduce_reasons`); the others are left out with a WARNING (:class:`NothingModelled` if none is
    left): an eager or contiguous-cache stand-in would calibrate the GPU with another kernel's time."""
    left_out = [reason for reason in reasons if reason]
    if not left_out:
        return frame
    counts = ", ".join(f"{left_out.count(r)} {r}" for r in dict.fromkeys(left_out))
    if len(left_out) == len(frame):
        raise NothingModelled(f"--kernels {path}: every row timed another kernel than the one pipeweave models: "
                              f"{counts}")
    print(f"WARNING: --kernels {path}: {len(left_out)} of {len(frame)} rows left out: {counts}")
    return frame[[reason is None for reason in reasons]]  # the index keeps each row's position in the file


def fa2_prefill_reasons(frame: pd.DataFrame, spec: HardwareSpec) -> list[str | None]:
    """Why each FlashAttention-2 prefill row (flash-attn 2, or torch SDPA's flash backend where flash-attn is not
    installed) cannot calibrate a GPU on which vLLM's prefill is FlashAttention-3 (Hopper): the corrections have one
    prefill class, so those rows would correct its FA3 prefill with another kernel's speed (on an H100, 92 SDPA rows
    put H100's measured runs 8.2 % off instead of 2.8 %)."""
    from pipeweave.validation import fa3_mismatch

    if fa3_mismatch("fa3_ragged", spec.architecture):  # vLLM runs FA2 prefill here: the rows are its kernel
        return [None] * len(frame)
    return ["prefill ran FlashAttention-2 (or torch SDPA), where vLLM runs FlashAttention-3 on this GPU (install "
            "flash-attn 3 and rerun profile_operators.py)" if str(kind).strip() == "fa2_ragged" else None
            for kind in frame["attention_type"]]


def custom_allreduce_reasons(frame: pd.DataFrame, spec: HardwareSpec) -> list[str | None]:
    """Per all-reduce row, why it times another collective than the one pipeweave predicts: the profiler times
    NCCL, but below vLLM's custom all-reduce limit on an NVLink GPU, at the worker counts it runs at, vLLM (and so
    pipeweave, pipeweave.collective_serving) runs its custom all-reduce: fitted, NCCL's time there would set the
    communication factors by another collective."""
    import pandas as pd

    from pipeweave.collective_serving import CUSTOM_AR_MAX_BYTES, CUSTOM_AR_WORLD_SIZES

    if not str(spec.link_type or "").startswith("nvlink"):
        return [None] * len(frame)
    sizes, workers = (pd.to_numeric(frame[column].str.strip()).to_numpy() for column in ("size_bytes", "num_workers"))
    counts = f"{', '.join(map(str, CUSTOM_AR_WORLD_SIZES[:-1]))} or {CUSTOM_AR_WORLD_SIZES[-1]}"
    reason = (f"timed NCCL below {CUSTOM_AR_MAX_BYTES // 2**20} MiB, where vLLM on {spec.link_type} runs its custom "
              f"all-reduce over {counts} GPUs (what pipeweave predicts there)")
    return [reason if size < CUSTOM_AR_MAX_BYTES and count in CUSTOM_AR_WORLD_SIZES else None
            for size, count in zip(sizes, workers)]


def read_kernel_csvs(paths: list[str], spec: HardwareSpec, registry, runs: bool = False
                     ) -> tuple[list[str], list[tuple[str, pd.DataFrame]]]:
    """(paths, (operator, rows) of each) of the kernel CSVs that keep rows (:func:`read_kernel_csv`): a file whose
    rows all timed another kernel is left out with a WARNING, as its rows would be one by one, so that the
    documented ``dataset/measured/<gpu>/*.csv`` takes the files worth calibrating from; an error only if no
    measured quantity is left (``runs``: measured end-to-end runs remain). A shape two files measure counts once
    (:func:`newest_measurements`), and rows of the profiler's flush timing that calibrate are warned of."""
    files, left_out = [], []
    for path in paths:
        try:
            files.append((path, *read_kernel_csv(path, spec, registry)))
        except NothingModelled as exc:
            left_out.append(str(exc))
            print(f"WARNING: {exc}; file left out")
    if left_out and not files and not runs:
        raise UserError(f"no measured kernel is left: {'; '.join(left_out)}")
    files = newest_measurements(files)
    for path, _, frame, flushed, _ in files:
        warn_of_flush_timing(path, int(flushed.sum()))
    return [path for path, *_ in files], [(op, frame) for _, op, frame, _, _ in files]


def newest_measurements(files: list) -> list:
    """``files`` ((path, operator, rows, flush-timed mask, timestamps) each) with every shape that several files of
    one operator measure kept once, with a WARNING: from the newest measurement where the rows carry the profiler's
    timestamps (a quick grid and a full grid, or two timings, given in any order), else from the later file;
    counted twice, a kernel would weigh double, as a file given twice would."""
    shape_columns = kernel_shape_columns()
    winner: dict[tuple, tuple] = {}  # (op, shape) -> (timestamp, file position, row position)
    keys = []
    for position, (_, op, frame, _, stamps) in enumerate(files):
        shapes = same_cells(frame, list(shape_columns[op])).apply(tuple, axis=1)
        keys.append([(op, shape) for shape in shapes])
        for row, (key, stamp) in enumerate(zip(keys[-1], stamps)):
            winner[key] = max(winner.get(key, ("", -1, -1)), (stamp, position, row))
    out = []
    for position, (path, op, frame, flushed, stamps) in enumerate(files):
        kept = np.array([winner[key][1:] == (position, row) for row, key in enumerate(keys[position])], dtype=bool)
        if not kept.all():
            others = sorted({str(files[winner[key][1]][0]) for key, keep in zip(keys[position], kept) if not keep})
            print(f"WARNING: --kernels {path}: {int((~kept).sum())} of its {len(frame)} row(s) measure shapes "
                  f"{', '.join(others)} measures too, newer or given later; those rows are taken")
        if kept.any():
            out.append((path, op, frame[kept], flushed[kept], stamps[kept]))
    return out


def warn_of_flush_timing(path, rows: int) -> None:
    from pipeweave.profiler.csvio import FLUSH_TIMING_GAP

    if rows:
        print(f"WARNING: --kernels {path}: {rows} row(s) timed with profile_operators.py --timing flush, "
              f"{FLUSH_TIMING_GAP}; calibrated on such rows, H100's measured end-to-end runs were predicted 13.0 % off "
              f"instead of 2.8 % (README, 'Measuring a new GPU'): measure again with the default --timing rotate")


def distinct_files(paths: list[str]) -> list[str]:
    """``paths`` without a file whose content an earlier one has (the same file twice, or overlapping globs such as
    ``*.csv gemm.csv``), with a WARNING: counted twice, each kernel would weigh double in the fit and the spread of
    the measured kernels would be cross-validated with each kernel's twin in its training folds."""
    seen: dict[str, str] = {}
    kept = []
    for path in paths:
        digest = file_digest(require_file(path, "--kernels file"))
        if digest in seen:
            same = Path(path).resolve() == Path(seen[digest]).resolve()
            print(f"WARNING: --kernels {path}: {'given twice' if same else f'the same measurements as {seen[digest]}'}"
                  f"; counted once")
            continue
        seen[digest] = path
        kept.append(path)
    return kept


def check_kernel_shapes(op: str, frame: pd.DataFrame, path: Path) -> None:
    """The shape limits ``predict_kernels.py`` applies (pipeweave.validation), and for all-reduce rows a positive
    integer message size over at least two workers: a row no prediction can be made for is an error naming it."""
    import pandas as pd

    from pipeweave.validation import MAX_PARALLEL, MAX_VOLUME_BYTES, check_shape_table, line_labels

    in_file = line_labels([int(index) + 2 for index in frame.index])  # the index: each row's line in its file - 2

    if op != "all_reduce":
        try:
            check_shape_table({c: frame[c].tolist() for c in frame.columns}, get_operator(op), in_file)
        except ValueError as exc:
            raise UserError(f"--kernels {path}: {exc}") from None
        return
    for column, least, most in (("size_bytes", 1, MAX_VOLUME_BYTES), ("num_workers", 2, MAX_PARALLEL)):
        values = pd.to_numeric(frame[column].str.strip(), errors="coerce")
        bad = ~(np.isfinite(values) & (values >= least) & (values <= most) & (values == values.round()))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise UserError(f"--kernels {path}: {in_file(row)}: {column} must be an integer from {least} to "
                            f"{most:,} (pipeweave.validation), got {frame[column].iloc[row]!r}")


def same_cells(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``frame``'s ``columns`` as keys (:func:`same_cell`): a shape is the same however its numbers are written."""
    return frame[columns].apply(lambda column: column.map(same_cell))


def same_cell(text: str) -> str:
    """A cell as a key: stripped, an integral number written as an integer ("16.0", " 16" and "16" alike)."""
    text = str(text).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if math.isfinite(number) and number == int(number) else text


def read_kernel_csv(path: str | Path, spec: HardwareSpec, registry
                    ) -> tuple[str, pd.DataFrame, np.ndarray, np.ndarray]:
    """(operator, rows, per row whether the profiler's flush timing timed it (:func:`flush_timed`), per row its
    ``timestamp`` ("" without one)) of a kernel CSV in the profiler's format of ``spec``'s GPU; unknown columns,
    another GPU's rows or MoE rows that are not whole layers are errors. Rows that timed another kernel than the one
    pipeweave predicts are left out (:func:`modelled_rows`)."""
    import pandas as pd

    from pipeweave.profiler.csvio import MEASUREMENT_COLUMNS, unmodelled_reasons

    shape_columns = kernel_shape_columns()
    path = require_file(path, "--kernels file")
    frame = csv_text_frame(path, "--kernels", "expected the profiler's header")
    if frame.empty:
        raise UserError(f"--kernels {path}: no measured kernels (only a header)")
    ops = set(frame["op"].str.strip()) if "op" in frame.columns else {path.stem}
    op = next(iter(ops)) if len(ops) == 1 else None
    if op not in shape_columns:
        raise UserError(f"--kernels {path}: one operator per file expected (op column or file name), got "
                        f"{', '.join(sorted(ops)) or 'none'}; known: {', '.join(shape_columns)}")
    allowed = ("op", *shape_columns[op], *MEASUREMENT_COLUMNS)
    unknown = [c for c in frame.columns if c not in allowed]
    missing = [c for c in (*shape_columns[op], "avg_duration") if c not in frame.columns]
    if unknown or missing:
        problem = f"unknown column(s) {', '.join(unknown)}" if unknown else f"missing column(s) {', '.join(missing)}"
        raise UserError(f"--kernels {path}: {problem}; expected the profiler's {op} columns {','.join(allowed)}")
    check_kernel_shapes(op, frame, path)
    if "hardware" not in frame.columns:  # a hand-made file: no row could be checked to be of this GPU
        raise UserError(f"--kernels {path}: no hardware column; the profiler writes the GPU of every row: add it "
                        f"({spec.name}) so that rows of another GPU cannot pass unseen")
    names = frame["hardware"].str.strip()  # before the re-measured rows are dropped, which could hide one
    for name in pd.unique(names):
        try:
            measured_on = registry.get(name)
        except ValueError as exc:
            line = int(frame.index[np.flatnonzero((names == name).to_numpy())[0]]) + 2
            raise UserError(f"--kernels {path}: line {line}: column hardware: {exc}; a spec JSON's 'aliases' "
                            f"can hold the name the driver reports") from None
        if measured_on.stem != spec.stem:
            raise UserError(f"--kernels {path}: rows measured on {name}, not on {spec.stem} ({spec.name})")
    if op == "attn":  # as for runs: a kernel the GPU cannot run was not measured there
        from pipeweave.validation import fa3_mismatch

        kinds = frame["attention_type"].str.strip()
        cannot = kinds.map(lambda kind: fa3_mismatch(kind, spec.architecture)).to_numpy(bool)
        if cannot.any():
            row = int(np.flatnonzero(cannot)[0])
            raise UserError(f"--kernels {path}: line {int(frame.index[row]) + 2}: {kinds.iloc[row]} is "
                            f"FlashAttention-3 (Hopper only), which {spec.stem} ({spec.architecture}) cannot run: "
                            f"not a kernel measured there")
    keys = [column for column in ("op", *shape_columns[op]) if column in frame.columns]
    # a re-measured row supersedes the older one (every row is of this GPU, however its name is spelt; 16 and 16.0
    # are one size)
    superseded = same_cells(frame, keys).duplicated(keep="last")
    if superseded.any():  # said: two runs appended to one file with different times would otherwise pass unseen
        print(f"WARNING: --kernels {path}: {int(superseded.sum())} row(s) measure a shape a later row measures again "
              f"(the first: line {int(frame.index[np.flatnonzero(superseded.to_numpy())[0]]) + 2}); the later row of "
              f"each shape is taken as its re-measurement")
    frame = frame[~superseded]
    reasons = unmodelled_reasons(op, frame)
    if op == "all_reduce":
        reasons = [a or b for a, b in zip(reasons, custom_allreduce_reasons(frame, spec))]
    if op == "attn":
        reasons = [a or b for a, b in zip(reasons, fa2_prefill_reasons(frame, spec))]
    duration = pd.to_numeric(frame["avg_duration"].str.strip(), errors="coerce")
    bad = not_a_positive_number(duration)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise UserError(f"--kernels {path}: line {frame.index[row] + 2}: avg_duration must be a positive number "
                        f"of µs, got {frame['avg_duration'].iloc[row]!r}")
    if op == "moe":
        not_layer = (~frame["weight_type"].str.strip().eq("layer")).to_numpy()
        if not_layer.any():
            row = int(np.flatnonzero(not_layer)[0])
            raise UserError(f"--kernels {path}: line {frame.index[row] + 2}: weight_type must be 'layer' (a whole "
                            f"fused-MoE layer, what the MoE model predicts), got {frame['weight_type'].iloc[row]!r}")
    flushed = flush_timed(op, frame)
    stamps = (frame["timestamp"].str.strip() if "timestamp" in frame.columns
              else pd.Series("", index=frame.index)).to_numpy(dtype=object)
    frame = frame[[c for c in shape_columns[op]]].copy()
    frame["avg_duration"] = duration.to_numpy(np.float64)
    modelled = np.array([reason is None for reason in reasons], dtype=bool)
    return op, modelled_rows(frame, reasons, path), flushed[modelled], stamps[modelled]


def flush_timed(op: str, frame: pd.DataFrame) -> np.ndarray:
    """Per row, whether the profiler timed it with its flush timing: its ``timing`` cell says so, or the file has
    the profiler's columns but no ``timing`` (written before the column, when flush was the only timing).
    All-reduce rows have only that one timing, and calibrate as measured collectives do."""
    from pipeweave.profiler.csvio import MEASUREMENT_COLUMNS, columns_before_timing
    from pipeweave.profiler.timing import CudaEventTimer

    if op == "all_reduce":
        return np.zeros(len(frame), dtype=bool)
    if "timing" in frame.columns:
        return frame["timing"].str.strip().eq(CudaEventTimer.name).to_numpy()
    return np.full(len(frame), set(columns_before_timing(MEASUREMENT_COLUMNS)) <= set(frame.columns))


def kernel_predictions(op: str, frame: pd.DataFrame, spec: HardwareSpec, predictor
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple]]:
    """(predicted µs before any correction, features, the physical fastest µs, shape tuples) of measured kernels of
    ``op`` (a kernel operator)."""
    shapes = frame.drop(columns=["avg_duration"]).replace("", np.nan).assign(hardware=spec.stem)
    predicted = predictor.predict_frame(op, shapes.reset_index(drop=True))
    operator = get_operator(op)
    features = predicted[list(operator.feature_names)].to_numpy(np.float64)
    # predict_kernels keeps a calibrated kernel at its physical fastest time, so the fit holds it there too
    floor = fastest_us(op, features, predicted[list(operator.descriptor_names)].to_numpy(np.float64),
                       spec.sm_freq, l2=l2_cycles(spec))
    shape_rows = list(frame[list(operator.shape_columns)].itertuples(index=False, name=None))
    return predicted["predicted_us"].to_numpy(np.float64), features, floor, shape_rows


def residual_interpolations(kernel_frames: list[tuple[str, pd.DataFrame]], spec: HardwareSpec, predictor,
                            calibration: Calibration, prior: Prior) -> dict:
    """{group: interpolation} of what ``calibration`` (its corrections and fine-tuned models) leaves on the measured
    kernels of ``kernel_frames``, as predict_kernels.py predicts them with it (pipeweave.residual_kernel): per group
    with a covariance in ``prior``, from all its operator's measured kernels."""
    frames = {}
    for op, frame in kernel_frames:
        frames.setdefault(op, []).append(frame)
    out = {}
    for op, parts in frames.items():
        import pandas as pd  # kernels are read with it; runs alone need no interpolation, nor pandas

        frame = pd.concat(parts, ignore_index=True)
        with predictor.fine_tuned_by(calibration):
            base, features, floor, shape_rows = kernel_predictions(op, frame, spec, predictor)
        calibrated = np.maximum(base * calibration.factors(op, features, shape_rows), floor)
        residuals = np.log(frame["avg_duration"].to_numpy(np.float64) / calibrated)
        out.update(fit_interpolations(prior.residual_kernels, op, shape_rows, residuals))
    return out


def kernel_equations(op: str, frame: pd.DataFrame, spec: HardwareSpec, predictor, prior: Prior, label: str,
                     collective_dir=None) -> Equations:
    """One equation per measured kernel: log(measured) = log(zero-shot) + x θ."""
    import pandas as pd

    measured = frame["avg_duration"].to_numpy(np.float64)
    if op == "all_reduce":
        from pipeweave.collectives import DEFAULT_COLLECTIVE_DIR, CollectivePredictor

        collective = CollectivePredictor(spec, collective_dir or DEFAULT_COLLECTIVE_DIR, allow_analytical=True)
        sizes = pd.to_numeric(frame["size_bytes"]).to_numpy(np.float64)
        workers = pd.to_numeric(frame["num_workers"]).to_numpy()
        base = collective.predict_ms("all_reduce", sizes, workers) * 1000.0
        x = communication_design("all_reduce", sizes, workers, spec)
        sigma = np.full(len(frame), prior.sigma_kernel["communication"])
        floor = None  # a collective has no physical fastest time in the band
    else:
        base, features, floor, shape_rows = kernel_predictions(op, frame, spec, predictor)
        x = design(op, features, shape_rows, prior.standardisation)
        classes = kernel_classes(op, len(frame), attention_types(op, shape_rows))
        sigma = np.array([prior.sigma_kernel[c] for c in classes])
    positions = frame.index.to_numpy()  # each row's position in its file (rows left out leave gaps)
    unpredicted = np.flatnonzero(~(np.isfinite(base) & (base > 0)))
    if unpredicted.size:
        from pipeweave.validation import line_labels

        in_file = line_labels([int(index) + 2 for index in positions])
        raise UserError(f"--kernels {label}: {in_file(int(unpredicted[0]))}: pipeweave predicts "
                        f"{base[unpredicted[0]]!r} µs for this {op} row, so it cannot calibrate anything")
    return Equations(np.arange(len(base)), base, x, measured, sigma,
                     [f"--kernels {label}: line {i + 2}" for i in positions], floor)


# ------------------------------------------------------------------------------------------------
# the command


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="calibrate.py", description=(
        "Fit a calibration of pipeweave's predictions for one GPU from measured end-to-end runs and/or measured "
        "kernels; apply it with aggregator.py / predict_kernels.py --calibration FILE."))
    parser.add_argument("--hardware", required=True,
                        help="the GPU the measurements are from (a name, or the path of its JSON file)")
    parser.add_argument("--e2e", metavar="CSV", help="measured runs: workload,prefill_ms,decode_step_ms,total_ms")
    parser.add_argument("--kernels", nargs="+", action="extend", default=[], metavar="CSV",
                        help="measured kernels in the profiler's format (dataset/measured/<gpu>/<op>.csv)")
    parser.add_argument("--output", required=True, help="calibration JSON to write")
    parser.add_argument("--model_dir", default=None, help="root of the trained MLPs (default: mlp_models)")
    parser.add_argument("--collective_dir", default=None,
                        help="root of the collective models the runs' collectives are predicted with (default: "
                             "collective_models; give the one the calibrated predictions will use)")
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR),
                        help="directory of GPU spec JSONs (default: hardware)")
    parser.add_argument("--prior", default=str(DEFAULT_PRIOR_PATH),
                        help="prior scales (default: pipeweave/calibration_prior.json)")
    parser.add_argument("--no_fine_tune", action="store_true",
                        help="fit the corrections only (by default a GEMM or FP8 GEMM model is also fine-tuned on "
                             "the measured kernels where it extrapolates on them and cross-validation on them prefers "
                             "it, and from 200 kernels of a GEMM, FP8 GEMM, attention or MoE class on, where a "
                             "held-out fifth of them prefers it; needs torch)")
    parser.add_argument("--workers", type=positive_int, default=default_workers(),
                        help="processes that fine-tune the ensemble members at once (default: the usable cores, at "
                             f"most {MAX_DEFAULT_WORKERS}; any number gives the same calibration, bit for bit)")
    return parser


def fine_tune_inputs(op: str, frame: pd.DataFrame, spec: HardwareSpec, predictor, corrections: Calibration
                     ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """(share of the measured kernels of ``op`` the shipped model extrapolates on, by the fine-tune trigger's
    flags, their raw model inputs, the efficiency the model must give them so that its duration under
    ``corrections`` is the measured one, the efficiency the shipped model gives them)."""
    operator = get_operator(op)
    shapes = frame.drop(columns=["avg_duration"]).replace("", np.nan).assign(hardware=spec.stem)
    predicted = predictor.predict_frame(op, shapes.reset_index(drop=True))
    inputs = predicted[predictor.model(op)[1]["model_info"]["features"]].to_numpy(np.float64)
    factors = corrections.factors(op, predicted[list(operator.feature_names)].to_numpy(np.float64),
                                  list(frame[list(operator.shape_columns)].itertuples(index=False, name=None)))
    measured_us = frame["avg_duration"].to_numpy(np.float64) / factors
    extrapolated = float(np.mean((predicted["extrapolation"].to_numpy() & TRIGGER_BITS) > 0))
    ideal = predicted["ideal_cycles"].to_numpy(np.float64)
    return (extrapolated, inputs, ideal / (measured_us * spec.sm_freq),
            ideal / (predicted["predicted_us"].to_numpy(np.float64) * spec.sm_freq))


def fine_tune_models(kernel_frames: list[tuple[str, pd.DataFrame]], spec: HardwareSpec, predictor, registry,
                     corrections: Calibration, equations: Equations, prior: Prior, log=print, pool=None) -> dict:
    """{op: calibration-file entry} for every class of :data:`pipeweave.finetune.FINE_TUNABLE` that
    :func:`pipeweave.finetune.considers_fine_tuning` and whose held-out measured kernels (with enough of them) do
    not prefer the corrections alone: its members fine-tuned on what ``corrections`` (the fitted calibration)
    leaves unexplained (:mod:`pipeweave.finetune`). ``equations`` (the kernel files' in ``kernel_frames`` order,
    then the runs') and ``prior`` are what ``corrections`` was fitted from: the choice refits it without the
    kernels it holds out. ``pool``: :func:`pipeweave.finetune.fine_tuning_pool`'s, or None."""
    import pandas as pd

    from pipeweave.finetune import (FINE_TUNABLE, MIN_EXTRAPOLATED_SHARE, MIN_KERNELS, MIN_SELECTION_KERNELS,
                                    SELECTION_ONLY, considers_fine_tuning, encode_arrays)

    kinds = np.concatenate([np.full(len(frame), kind, dtype=object) for kind, frame in kernel_frames])
    entries = {}
    for op in FINE_TUNABLE:
        frames = [frame for kind, frame in kernel_frames if kind == op]
        if not frames:
            continue
        frame = pd.concat(frames, ignore_index=True)
        share, inputs, efficiency, base = fine_tune_inputs(op, frame, spec, predictor, corrections)
        said = (f"{op}, {len(frame)} measured kernels (the shipped model extrapolates on {share:.0%} of them: flags "
                f"architecture, range or members; 'shares' alone does not count)")
        if not considers_fine_tuning(op, len(frame), share):
            needs = (f"at least {MIN_EXTRAPOLATED_SHARE:.0%} of at least {MIN_KERNELS}, or "
                     if op not in SELECTION_ONLY else "")
            log(f"{said}: corrections only (fine-tuning needs {needs}at least {MIN_SELECTION_KERNELS} kernels)")
            continue
        if importlib.util.find_spec("torch") is None:
            if share < MIN_EXTRAPOLATED_SHARE:
                log(f"{said}: corrections only (whether fine-tuning on them helps is tested only with torch: "
                    f"pip install '.[train]')")
                continue
            raise UserError(f"{said}; fine-tuning it on them needs torch (pip install '.[train]'), or pass "
                            f"--no_fine_tune to fit the corrections only")
        from pipeweave.ensemble import member_dirs
        from pipeweave.finetune import above_fixed_time, compared_fine_tunings, fine_tune_selected, selection_method

        model, metadata, directory = predictor.model(op)
        above = above_fixed_time(op, inputs, efficiency, spec.sm_freq, model.fixed_time_us)
        if not above.all():
            log(f"{op}: {int((~above).sum())} of {len(frame)} measured kernels take, after the corrections, no "
                f"longer than the model's fixed {model.fixed_time_us} us; fine-tuning leaves them out")
            if above.sum() < MIN_KERNELS:
                log(f"{said}: corrections only (fine-tuning needs at least {MIN_KERNELS} kernels)")
                continue
        members = member_dirs(directory) if "ensemble" in metadata else [directory]
        rows = np.flatnonzero(kinds == op)  # the equations of these kernels, in their order
        log(f"{op}, {len(frame)} measured kernels: choosing whether to fine-tune its {len(members)} member(s) on them "
            f"({compared_fine_tunings(len(inputs))} fine-tunings to compare, then the chosen one on all the kernels: "
            f"minutes of CPU; --workers sets how many members train at once)")
        arrays, log_change, recipe, errors = fine_tune_selected(
            op, members, registry, inputs, efficiency, spec.sm_freq, base,
            refitted_without(equations, prior, rows, corrections.theta, efficiency), pool=pool)
        chosen = (f" chosen {selection_method(len(inputs))}, mean |log error| "
                  + ", ".join(f"{name} {error:.3f}" for name, error in errors.items()) if errors else "")
        if arrays is None:
            log(f"{said}: corrections only ({chosen.strip()})")
            continue
        described = recipe.as_dict()
        log(f"{said}: fine-tuned its {len(members)} member(s) on {int(above.sum())} of them ({recipe.name} recipe: "
            f"{recipe.epochs} epochs at learning rate {described['learning_rate']:g}, "
            f"{described['learning_rate_schedule']}{';' if chosen else ''}{chosen}); its change of the shipped "
            f"model's efficiency is kept within x{np.exp(log_change[0]):.3g} to x{np.exp(log_change[1]):.3g}, "
            f"its range on them")
        entries[op] = {"kernels": int(len(frame)), "extrapolated_share": round(share, 4), "base_model": str(directory),
                       **described, "validation_errors": errors, "trusted_log_change": list(log_change),
                       "weights": encode_arrays(arrays)}
    return entries


#: the standard normal quantile of the interval's upper level (0.9): its half-width in log over this is a sigma
INTERVAL_Z = 1.2816


def analytical_communication_scale(aggregator, spec: HardwareSpec, workloads) -> float | None:
    """The prior scale (log) of the communication factors when every collective of the runs takes the analytical
    estimate: the widest of the estimate's 80 % intervals for the runs' kinds and worker counts, as a standard
    deviation. Measured collectives keep the prior's scales, set by how far measured sources disagree; an estimate
    whose interval says ×0.8–1.3 cannot soak up a run's error as a factor of 2.5 (which a uniformly slower H800 TP4
    run gave). None where a run has a measured collective, or an estimate without an evaluated interval."""
    from pipeweave.engine import Job

    spreads = []
    for workload in workloads:
        if not workload.has_communication:
            continue
        block = aggregator.predict([Job(workload, spec)])[0].result["extrapolation"].get("analytical_collectives")
        kinds = {kind for kind, _ in workload.collectives}
        if block is None or set(block["kinds"]) != kinds or any(block["interval"][k] is None for k in kinds):
            return None
        spreads += [np.log(high / low) / (2 * INTERVAL_Z) for low, high in (block["interval"][k] for k in kinds)]
    return max(spreads) if spreads else None


def runs_prior(aggregator, spec: HardwareSpec, workloads, prior: Prior, log=None) -> Prior:
    """The prior a calibration from measured runs (no measured all-reduce kernels) fits with: where every
    collective of the runs takes the analytical estimate, the communication factors' scales are that estimate's
    own spread (:func:`analytical_communication_scale`)."""
    scale = analytical_communication_scale(aggregator, spec, workloads)
    if scale is None:
        return prior
    if log is not None:
        log(f"Note: every collective of the runs takes the analytical estimate, so the communication factors' "
            f"prior scale is that estimate's own leave-one-GPU-out spread ({scale:.3f} in log), not the measured "
            f"sources' disagreement")
    return dataclasses.replace(prior, tau_comm_latency=scale, tau_comm_bandwidth=scale)


#: the farthest a measurement may be from the zero-shot prediction: beyond the worst held-out kernel ever seen
#: (19.9x, GEMM on L40S left out: docs/ACCURACY.md), so that what is refused is a unit mix-up (µs typed as ms is
#: 1000x), not a GPU the models miss
MAX_ZERO_SHOT_FACTOR = 30.0
#: how much further (mean |log error|) the measured runs may end from their predictions after a calibration from runs
#: and kernels before a WARNING that the kernels pull the corrections away from them: 1 %, about the spread of a
#: run's repeats (the real H100's runs with its flush-timed GEMMs went 0.029 -> 0.057)
RUNS_WORSENED_BY = 0.01
#: mean |log error| a fitted calibration may leave on its own data before a WARNING that the measurements look like
#: another GPU's (or another unit's), per kind of measurement: calibrated on any one of the 28 measured runs, the
#: corrections leave at most 0.079 on that run (H20 arxiv_8), and fitted on all of a GPU's kernels at most 20.7 % mean
#: relative error (FP8 GEMM on L40S: docs/ACCURACY.md, the k-shot table's last column; about 0.19 in log); a run of
#: H100 given as A100's leaves 0.21
MAX_CALIBRATED_LOG_ERROR = {"runs": 0.15, "kernels": float(np.log(1.3))}


def check_plausible(equations: Equations, zero_shot_log_error: np.ndarray) -> None:
    """Refuse, naming it, a measured quantity more than :data:`MAX_ZERO_SHOT_FACTOR` times from its zero-shot
    prediction (``zero_shot_log_error``: log(zero-shot / measured) per equation): fitting it would turn the
    corrections into a unit conversion (a calibration of factors 10^5)."""
    worst = int(np.argmax(np.abs(zero_shot_log_error)))
    if abs(zero_shot_log_error[worst]) > np.log(MAX_ZERO_SHOT_FACTOR):
        measured = equations.measured[worst]
        raise UserError(f"{equations.labels[worst]}: measured {measured:.6g} is "
                        f"{np.exp(-zero_shot_log_error[worst]):.3g} times the zero-shot prediction "
                        f"{measured * np.exp(zero_shot_log_error[worst]):.6g} (same unit: ms for runs, µs for "
                        f"kernels); more than {MAX_ZERO_SHOT_FACTOR:.0f}x is beyond any held-out error pipeweave has "
                        f"shown, so check the unit and the row")


def calibrate(hardware: str, e2e: str | None, kernels: list[str], *, model_dir=None,
              hardware_dir=DEFAULT_HARDWARE_DIR, prior: Prior | None = None, fine_tune: bool = True,
              collective_dir=None, workers: int = 1, log=print) -> Calibration:
    """Validate every input, build the equations and fit; nothing is written here. ``workers``: processes that
    fine-tune ensemble members at once (:func:`pipeweave.finetune.fine_tuning_pool`; the same weights for any
    number)."""
    from pipeweave.engine import Engine
    from pipeweave.paths import DEFAULT_MODEL_DIR

    registry = hardware_registry(Path(hardware_dir))
    spec = registry.get(hardware)
    prior = prior or load_prior()
    if not e2e and not kernels:
        raise UserError("give measurements: --e2e CSV and/or --kernels CSV ...")
    model_dir = Path(model_dir or DEFAULT_MODEL_DIR)
    # the analytical collective estimate where no measured model covers a run's collectives, with its WARNING
    aggregator = Engine(model_dir=model_dir, hardware_dir=hardware_dir, collective_dir=collective_dir,
                        collective_estimate="analytical",
                        log=lambda message: print(message) if message.startswith("WARNING") else None)
    runs, parts, fitted_from = [], [], {"hardware_spec": spec_record(spec)}
    if e2e:
        runs = merged_repeats(read_runs(e2e, spec))
        fitted_from["e2e"] = {"file": str(e2e), "digest": file_digest(e2e),
                              "runs": [str(Path(w.path).resolve()) for w, _ in runs],
                              # by content too: a copy of a run's workload elsewhere is the same run
                              "run_digests": [file_digest(w.path) for w, _ in runs],
                              # the operators the runs executed: a run says nothing of an operator it did not hold
                              "ops": sorted({op for workload, _ in runs for op in workload.ops()})}
    kernels, kernel_frames = read_kernel_csvs(distinct_files(kernels or []), spec, registry, runs=bool(runs))
    measured_all_reduce = any(op == "all_reduce" for op, _ in kernel_frames)
    if not measured_all_reduce:
        prior = runs_prior(aggregator, spec, [workload for workload, _ in runs], prior, log)
    part_models = []  # the model of each part's kernels ("all_reduce": a measured sweep; None: end-to-end runs)
    for path, (op, frame) in zip(kernels, kernel_frames):
        try:
            parts.append(kernel_equations(op, frame, spec, aggregator.predictor, prior, str(path),
                                          collective_dir))
            part_models.append(op if op == "all_reduce" else get_operator(op).model_op)
        except ValueError as exc:  # a shape the operator cannot take (the predictor's own checks)
            raise UserError(f"--kernels {path}: {exc}") from None
        entry = {"file": str(path), "op": op, "rows": len(frame), "digest": file_digest(path)}
        if op != "all_reduce":  # the rows of each class: their interval is calibrated where their class was measured
            classes = kernel_classes(op, len(frame), frame["attention_type"].tolist() if op == "attn" else None)
            entry["classes"] = {cls: int(n) for cls, n in zip(*np.unique(classes.astype(str), return_counts=True))}
        fitted_from.setdefault("kernels", []).append(entry)
    kernel_count = sum(len(part.measured) for part in parts)
    lines = run_lines(e2e) if e2e else {}
    for workload, measured in runs:
        where = lines.get(Path(workload.path).resolve())
        label = f"--e2e {e2e}: line{'s' if len(where) > 1 else ''} {', '.join(map(str, where))}: " if where else ""
        parts.append(run_equations(aggregator, workload, spec, measured, prior, label + workload.stem))
    if runs or measured_all_reduce:  # the communication factors were fitted
        fitted_from["collective_models"] = collective_models_record(aggregator.collective_dir, spec.stem)
    equations = Equations.concat(parts)
    if not len(equations.measured):
        raise UserError("no measured quantity to calibrate from (give --e2e runs and/or --kernels CSVs)")
    before = np.log(equations.predict(np.zeros(len(PARAMS)))[0] / equations.measured)
    check_plausible(equations, before)
    theta, std = fit_map(equations, prior)
    after = np.log(equations.predict(theta)[0] / equations.measured)
    log(f"Calibration of {spec.stem} from {len(equations.measured)} measured quantities: "
        f"mean |log error| {np.mean(np.abs(before)):.3f} -> {np.mean(np.abs(after)):.3f} on the calibration data "
        f"with the corrections")
    sources = (("kernels", slice(0, kernel_count)), ("runs", slice(kernel_count, None)))
    if kernel_count and runs:  # thousands of kernel equations can outweigh a few runs: each is said apart
        log("  " + "; ".join(f"{kind}: {np.mean(np.abs(before[part])):.3f} -> {np.mean(np.abs(after[part])):.3f}"
                             for kind, part in sources))
        # by more than a measured run's own noise: kernels that agree with the runs move them a little too
        if np.mean(np.abs(after[kernel_count:])) > np.mean(np.abs(before[kernel_count:])) + RUNS_WORSENED_BY:
            log("WARNING: the measured runs are further from their predictions after the calibration than before it: "
                "the kernels pull the corrections another way than the runs, as kernels timed by another harness "
                "than the one the models learned from do (python3 -m pipeweave.profiler.crosscheck compares them on "
                "a GPU aiconfigurator-core measured; profile_operators.py --timing flush rows are one such harness); "
                "calibrate from the runs alone, or from kernels that agree with them")
    # the classes and collectives the measurements move directly; the others move through the prior's correlations
    fitted_from["measured_terms"] = [name for name, used in zip(PARAMS, np.abs(equations.x).sum(axis=0) > 0) if used]
    for kind, part in sources:
        left = after[part]
        if len(left) and np.mean(np.abs(left)) > MAX_CALIBRATED_LOG_ERROR[kind]:
            log(f"WARNING: after calibration the measured {kind} are still {np.exp(np.mean(np.abs(left))):.2f}x from "
                f"their predictions on average (geometric), more than the corrections leave on any GPU's own "
                f"{kind}; check that they were measured on {spec.name} ({spec.stem}), in the unit asked (ms for "
                f"runs, µs for kernels), and with the workloads given")
    base_models = {}
    for op in sorted(aggregator.predictor._models):
        base_models[op] = str(aggregator.predictor._models[op][2])
    models = np.concatenate([np.full(len(part.measured), model, dtype=object)
                             for part, model in zip(parts, part_models + [None] * len(runs))])
    # interpolated last, where the GPU is outside the operator's training data. The prior's covariance describes the
    # residuals of a GPU the model never measured; on one it trained on they are its held-out-shape error, with
    # little structure to interpolate (L40S, 239 GEMMs of the test split calibrating 3,000 others: 6.46 % with the
    # corrections alone, 6.61 % interpolated)
    interpolable = {op for op, _ in kernel_frames if op in RESIDUAL_INPUTS}
    trained = sorted(op for op in interpolable if spec.name in aggregator.predictor.trained_on(op))
    interpolated = interpolable - set(trained) if prior.residual_kernels else set()
    spread = kernel_spread(equations, prior, models,
                           spread_interpolators(kernel_frames, part_models, interpolated, prior))
    if "all_reduce" in spread:  # the worker counts its sweep measured, which its interval stands for
        spread["all_reduce"]["workers"] = sorted({int(w) for op, frame in kernel_frames if op == "all_reduce"
                                                  for w in map(float, frame["num_workers"])})
    calibration = Calibration(spec.stem, spec.name, theta, std, fitted_from, base_models, prior.summary(),
                              prior.standardisation, spread=spread)
    # on the measured kernels (end-to-end runs alone fine-tune nothing): what the corrections leave unexplained,
    # where the shipped model extrapolates
    if fine_tune and kernel_frames:
        with fine_tuning_pool(workers) as pool:
            calibration.fine_tuned = fine_tune_models(kernel_frames, spec, aggregator.predictor, registry,
                                                      calibration, equations, prior, log, pool)
    # last: what all of the above leaves on the kernels of the operators interpolated
    calibration.residuals = residual_interpolations([(op, frame) for op, frame in kernel_frames
                                                     if op in interpolated], spec, aggregator.predictor, calibration,
                                                    prior)
    if len(trained) < len(interpolable) and not prior.residual_kernels:
        log("The prior has no covariance of the kernels' residuals (written before 2026-12-07): what the calibration "
            "leaves on the measured kernels is not interpolated over their shapes; regenerate it with "
            "python3 -m pipeweave.calibration_eval")
    if trained:
        log(f"Not interpolated over their shapes: the residuals of the measured {', '.join(trained)} kernels "
            f"({spec.name} is in the training data of that model: what is left there is its held-out-shape error, "
            f"with little structure to interpolate)")
    if calibration.residuals:
        log("Interpolated what the calibration leaves on the measured kernels over their shapes: "
            + ", ".join(f"{group} ({len(interpolation.inputs)} kernels)"
                        for group, interpolation in sorted(calibration.residuals.items())))
    return calibration


def kernel_spread(equations: Equations, prior: Prior, models: np.ndarray, interpolators: dict | None = None
                  ) -> dict:
    """{model op: spread entry} of every model with at least MIN_SPREAD_KERNELS measured kernels (and of a
    measured all-reduce sweep, "all_reduce"): how far its kernels lie from the calibration fitted without them
    (cross-validated), with what the refitted corrections leave on the other folds interpolated to each fold where
    ``interpolators`` (:func:`spread_interpolators`) has the model; without its fine-tuning, so where a model is
    fine-tuned the spread is overstated, not understated."""
    out = {}
    for model in sorted({m for m in models if m is not None}):
        rows = np.flatnonzero(models == model)
        if len(rows) >= MIN_SPREAD_KERNELS:
            out[model] = spread_entry(cross_validated_log_residuals(equations, prior, rows,
                                                                    (interpolators or {}).get(model)))
    return out


def spread_interpolators(kernel_frames: list[tuple[str, pd.DataFrame]], part_models: list[str],
                         interpolated: set[str], prior: Prior) -> dict:
    """{model op: pipeweave.residual_kernel.interpolator over its measured kernels, in equation order} of every model
    with kernels of an operator in ``interpolated`` (a kernel of another operator it predicts, as quantisation by
    RMSNorm's model, is in no group: not interpolated)."""
    parts = {}
    for (op, frame), model in zip(kernel_frames, part_models):
        if model == "all_reduce":
            continue
        shapes = list(frame[list(get_operator(op).shape_columns)].itertuples(index=False, name=None))
        if op in interpolated:
            parts.setdefault(model, []).append((residual_groups(op, shapes), residual_inputs(op, shapes)))
        else:
            parts.setdefault(model, []).append((np.full(len(frame), ""),
                                                np.zeros((len(frame), len(RESIDUAL_INPUTS.get(model, ()))))))
    return {model: interpolator(prior.residual_kernels, np.concatenate([groups for groups, _ in blocks]),
                                np.vstack([inputs for _, inputs in blocks]))
            for model, blocks in parts.items() if any((groups != "").any() for groups, _ in blocks)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_output_path(args.output, hardware_dir=args.hardware_dir)  # before minutes of fitting, not after
    refuse_overwriting_inputs(args.output, {"the --e2e file": args.e2e, "the --prior file": args.prior,
                                            **{"the --hardware file": path for path in hardware_files(args.hardware)},
                                            **{f"the --kernels file {path}": path for path in args.kernels or ()},
                                            **{f"the workload {path} of a run": path
                                               for path in run_workloads(args.e2e)}})
    prior = load_prior(args.prior)
    calibration = calibrate(args.hardware, args.e2e, args.kernels, model_dir=args.model_dir,
                            hardware_dir=args.hardware_dir, prior=prior, fine_tune=not args.no_fine_tune,
                            collective_dir=args.collective_dir, workers=args.workers)
    calibration.save(args.output)
    summary = calibration.summary()
    measured = set(calibration.fitted_from.get("measured_terms", PARAMS))
    for name, value in summary["factors"].items():
        print(f"  {name}: x{value:.3f}" + ("" if name in measured else
                                          " (nothing of it measured: moved through the prior's correlations)"))
    for name, value in summary["slopes_per_sd"].items():
        if round(value, 3):  # slopes of classes without data move only through the prior's correlations
            print(f"  {name}: {value:+.3f} log per standard deviation")
    for op, entry in calibration.spread.items():
        print(f"  {op}: its {entry['kernels']} measured kernels lie x{np.exp(entry['log_low']):.3f}-"
              f"x{np.exp(entry['log_high']):.3f} around the calibration fitted without them (10th-90th percentile, "
              f"{entry['folds']}-fold); its prediction interval is at least that wide")
    print(f"Calibration for {calibration.hardware} written to {args.output}")
    return 0
