"""The Python API for other tools: predict a workload, or a batch of kernels, on a GPU.

Both functions need only the base install (numpy; no torch) and the shipped models. Models are loaded on the
first call and kept for later calls with the same directories.

>>> import pipeweave
>>> result = pipeweave.predict_workload("Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2", "H100")
>>> sorted(result["summary"])
['decode_avg_duration_ms', 'decode_total_duration_ms', 'prefill_duration_ms', 'total_duration_ms']
>>> result["tp_size"], result["pp_size"], len(result["iterations"])
(4, 2, 403)

>>> us = pipeweave.predict_kernels("gemm", {"M": [1, 4096], "N": [8192, 8192], "K": [8192, 8192]}, "H100")
>>> us.shape, bool(us[0] < us[1])
((2,), True)
>>> us, low, high = pipeweave.predict_kernels("gemm", {"M": [4096], "N": [8192], "K": [8192]}, "H100", interval=True)
>>> bool(low[0] < us[0] < high[0])
True
"""
from __future__ import annotations

import functools
import json
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pipeweave import paths


def _folder(path) -> tuple[str, tuple]:
    """A model or hardware folder as a cache key: its absolute path (a relative one names another folder after
    ``os.chdir``) and the name, size and modification time of every file in it (a spec JSON or a model edited in
    place is read again)."""
    if not isinstance(path, (str, Path)):
        raise ValueError(f"a folder must be a path, got {type(path).__name__}")
    folder = Path(path).resolve()
    state = []
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:  # removed while listed: the next call sees the folder as it is then
                continue
            state.append((os.path.relpath(os.path.join(root, name), folder), stat.st_size, stat.st_mtime_ns))
    return str(folder), tuple(sorted(state))


@lru_cache(maxsize=8)
def _engine(model_dir: tuple[str, tuple], hardware_dir: tuple[str, tuple], collective_dir: tuple[str, tuple],
            collective_estimate: str, quantile_dir: tuple[str, tuple] | None,
            calibration: tuple[str, str] | None = None):
    from analytical_model.hardware import hardware_registry
    from pipeweave.engine import Engine

    hardware_registry.cache_clear()  # a folder whose files changed since is read again (_folder)
    return Engine(model_dir=model_dir[0], hardware_dir=hardware_dir[0], collective_dir=collective_dir[0],
                  collective_estimate=collective_estimate, quantile_dir=quantile_dir and quantile_dir[0],
                  log=_warn_of_warnings, keyword_options=True, calibration=_calibration(calibration))


def _warnings_at_caller(function):
    """Every warning a call issues, from pipeweave's code at any depth, re-issued at the caller's line (filters
    keyed on the caller's module or line, and the default once-per-location rule, then act on the caller's code);
    also when the call raises."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        caught: list = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                return function(*args, **kwargs)
        finally:
            for warning in caught:
                warnings.warn(warning.message, warning.category, stacklevel=2)
    return call


def _flag(name: str, value) -> bool:
    """A true/false option: a bool (numpy's too); "no" or 1 would have switched it on."""
    if isinstance(value, np.bool_):
        return bool(value)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _collective_estimate(value) -> str:
    """``collective_estimate`` checked before it keys the engine cache (a list there was lru_cache's TypeError,
    "unhashable type: 'list'")."""
    from pipeweave.engine import COLLECTIVE_ESTIMATES

    if not isinstance(value, str) or value not in COLLECTIVE_ESTIMATES:
        raise ValueError(f"collective_estimate must be one of {', '.join(COLLECTIVE_ESTIMATES)}, got {value!r}")
    return value


def _gpu_name(value, what: str = "hardware") -> str:
    """One GPU name; the command line's comma-separated lists and ``all`` are the command line's."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a GPU name (a file stem such as 'H100', a driver name, an aiconfigurator "
                         f"key or the path of a GPU's JSON file), got {value!r}")
    return value


def _calibration_key(path) -> tuple[str, str] | None:
    """:func:`pipeweave.calibration.calibration_key` of a file (None without one): one rewritten by calibrate.py is
    read again."""
    from pipeweave.calibration import calibration_key

    if path is None:
        return None
    if not isinstance(path, (str, Path)):  # pathlib's TypeError would not say what is accepted
        raise ValueError(f"calibration must be the path of a file written by {paths.command('calibrate.py')}, got "
                         f"{type(path).__name__}")
    return calibration_key(path)


@lru_cache(maxsize=8)
def _calibration(key: tuple[str, str] | None):
    if key is None:
        return None
    from pipeweave.calibration import load_calibration
    from pipeweave.cli import UserError

    try:
        return load_calibration(key[0])
    except UserError as exc:
        raise ValueError(str(exc)) from None


def _check_calibration(calibration, stems: list[str]) -> None:
    """A calibration for none of the GPUs predicted is refused (it would silently do nothing; no kernel at all is
    no GPU to refuse)."""
    if calibration is not None and stems:
        calibration.check_hardware(stems, option="calibration=")


def _warn_of_warnings(line: str) -> None:
    """The engine's log as the API gives it: its WARNING lines (a FlashAttention-3 kernel on a GPU that cannot run
    it, intervals measured for another model...) as Python warnings (at the caller's line:
    :func:`_warnings_at_caller`), its notes of loaded models not at all."""
    if line.startswith("WARNING"):
        warnings.warn(line, UserWarning)


def _plain_number(value):
    """A numpy number of a workload dict as the JSON number it stands for."""
    if isinstance(value, np.generic):
        return value.item()
    raise ValueError(f"workload: a {type(value).__name__} value is not JSON (numbers, strings, lists and objects)")


@lru_cache(maxsize=8)
def _kernel_predictor(model_dir: tuple[str, tuple], hardware_dir: tuple[str, tuple]):
    from analytical_model.hardware import hardware_registry
    from pipeweave.predictor import KernelPredictor

    hardware_registry.cache_clear()  # a folder whose files changed since is read again (_folder)
    return KernelPredictor(model_dir[0], hardware_dir[0])


@_warnings_at_caller
def predict_workload(
    workload,
    hardware: str,
    *,
    collective_hardware: str | None = None,
    collective_estimate: str = "model",
    quantiles: bool = False,
    ignore_memory: bool = False,
    calibration: str | Path | None = None,
    model_dir: str | Path = paths.DEFAULT_MODEL_DIR,
    quantile_dir: str | Path = paths.DEFAULT_QUANTILE_DIR,
    hardware_dir: str | Path = paths.DEFAULT_HARDWARE_DIR,
    collective_dir: str | Path = paths.DEFAULT_COLLECTIVE_DIR,
) -> dict:
    """End-to-end latency of one workload on one GPU: the object ``pipeweave-aggregate`` writes (docs/METHOD.md §7.5).

    ``workload`` is a workload JSON file, the stem of a shipped workload (``workload/<stem>.json``), the parsed JSON
    object (a dict) or a :class:`pipeweave.schema.Workload`. ``hardware`` is a GPU name (file stem such as
    ``"H100"``, driver name, or aiconfigurator key) or the path of a GPU's JSON file (one of your own, beside the
    shipped GPUs). ``collective_hardware``, ``collective_estimate`` (``"model"``
    or ``"analytical"``) and ``quantiles`` (adds ``summary.optimistic_*``) are the aggregator's flags of the same
    names. Unlike the command line, which prints a WARNING and uses the analytical estimate where no collective
    model covers a worker count, the API defaults to ``"model"``: a library call has no console for the warning,
    so an uncovered collective is an error until the caller opts in. The result's ``summary`` holds ``prefill_duration_ms``, ``decode_avg_duration_ms``,
    ``decode_total_duration_ms`` and ``total_duration_ms``. For many calls on in-memory iterations (a serving
    simulator), :class:`pipeweave.engine.Engine` offers ``iteration_ms`` and calibration.

    A workload that does not fit in the GPU's memory (the aggregator's check, :mod:`pipeweave.memory`) is an error
    unless ``ignore_memory``; then the result holds the aggregator's ``memory_check`` record (``fits: false,
    ignored: true``, the GB figures and the smallest TP that fits). What the aggregator prints about the check (its
    WARNING for an ignored misfit, its note that a workload without ``model_params`` was not checked) is issued as a
    Python warning (:mod:`warnings`, ``UserWarning``).

    Raises ``FileNotFoundError`` / ``ValueError`` (an unknown GPU lists the known ones; a malformed workload names
    the iteration and field; a missing model names the file; a workload that does not fit says how much it needs).
    """
    from pipeweave.aggregate import memory_check
    from pipeweave.cli import UserError
    from pipeweave.engine import Job, as_flat_workload
    from pipeweave.flatten import parse_workload

    from pipeweave.schema import Workload

    if not isinstance(workload, (str, Path, Mapping, Workload)) or (isinstance(workload, str) and not workload.strip()):
        raise ValueError(f"workload must be a workload file, the stem of a shipped workload, its parsed JSON object or "
                         f"a pipeweave.schema.Workload, got {workload!r}"[:300])
    _gpu_name(hardware)
    if collective_hardware is not None:
        _gpu_name(collective_hardware, "collective_hardware")
    quantiles, ignore_memory = _flag("quantiles", quantiles), _flag("ignore_memory", ignore_memory)
    _collective_estimate(collective_estimate)
    try:
        engine = _engine(_folder(model_dir), _folder(hardware_dir), _folder(collective_dir), collective_estimate,
                         _folder(quantile_dir) if quantiles else None, _calibration_key(calibration))
        if isinstance(workload, Mapping):  # a private copy, numpy numbers as plain ones
            workload = parse_workload(json.loads(json.dumps(workload, default=_plain_number)), "workload")
        try:
            flat = as_flat_workload(workload)
        except FileNotFoundError:
            raise
        except OSError as exc:  # not a file name at all (a JSON text, a name too long for the file system)
            raise ValueError(f"workload {str(workload)[:80]!r}: not a workload file or the stem of a shipped "
                             f"workload ({exc.strerror or exc})") from None
        engine.forget_warnings()
        split = flat.parallelism_warning()  # the aggregator's WARNING of a split without its communication
        if split:
            warnings.warn(split, UserWarning)
        job = Job(flat, engine.gpu(hardware), collective_hardware)
        _check_calibration(engine.calibration, [job.hardware.stem])
        record = memory_check(job, ignore_memory, log=lambda line: warnings.warn(line, UserWarning),
                              option="ignore_memory=True")
        result = engine.predict([job])[0].result
        collectives = engine.gpu(collective_hardware).stem if collective_hardware else job.hardware.stem
        for line in engine.calibration_warnings(flat.ops(), [collectives] if flat.has_communication else []):
            warnings.warn(line, UserWarning)  # the aggregator's, for a calibration of other models
    except UserError as exc:  # the command line's error class; a library caller catches ValueError
        raise ValueError(str(exc)) from None
    if record is not None:
        result["memory_check"] = record
    return result


@_warnings_at_caller
def predict_kernels(
    op: str,
    shapes: Mapping[str, Sequence],
    hardware: str | Sequence[str],
    *,
    model_dir: str | Path = paths.DEFAULT_MODEL_DIR,
    hardware_dir: str | Path = paths.DEFAULT_HARDWARE_DIR,
    interval: bool = False,
    extrapolation: bool = False,
    calibration: str | Path | None = None,
) -> np.ndarray | tuple:
    """Predicted duration in µs of each kernel (row) of ``shapes`` on ``hardware`` (one name, or one per row).

    ``op`` is a registry operator (``python3 -m analytical_model list``: ``gemm``, ``gemm_fp8``, ``attn``,
    ``rmsnorm``, ``siluandmul``, ``moe``, ``quantize``); ``shapes`` maps its shape columns to equal-length sequences,
    as the ``predict_kernels`` CSV does (gemm: ``M, N, K``; attn: ``attention_type, bs, q_lengths, kv_lengths, nh,
    nkv, hd`` with per-request lists; ...): a dict or a pandas DataFrame, read by position; a single value applies to
    every kernel; other columns are ignored, as the CSV's are. No pandas needed. With ``interval``, (µs, low µs,
    high µs): the measured 80 % interval of each prediction's state, the ``low_us`` / ``high_us`` columns of
    ``predict_kernels.py`` (:mod:`pipeweave.intervals`). With ``extrapolation``, one more item at the end: per kernel
    the ``extrapolation`` column of ``predict_kernels.py``, ``""`` where the model's training data covers it, else
    the reasons joined by ``+`` (``architecture``, ``range``, ``members``, ``shares``; docs/ACCURACY.md, "What the
    extrapolation flag means").

    >>> us, flags = predict_kernels("gemm", {"M": [4096], "N": [8192], "K": [8192]}, "H100", extrapolation=True)
    >>> flags
    ['']
    """
    from analytical_model.registry import get_operator
    from pipeweave.cli import UserError
    from pipeweave.validation import check_shape_table, load_model_checked

    operator = get_operator(op)
    if not hasattr(shapes, "keys"):  # a dict, a pandas DataFrame...
        raise ValueError(f"shapes must map {op}'s shape columns ({', '.join(operator.shape_columns)}) to one value per "
                         f"kernel each, got {type(shapes).__name__}")
    missing = [c for c in operator.shape_columns if c not in shapes]
    if missing:
        optional = ", ".join(operator.optional_columns) or "none"
        raise ValueError(f"shapes lacks column(s) {', '.join(missing)} needed by {op} (shape columns: "
                         f"{', '.join(operator.shape_columns)}; optional: {optional})")
    # only the columns predict_kernels.py reads (others, such as a dataset's source, pass it by), by position
    columns = {name: _per_kernel(shapes[name], name) for name in (*operator.shape_columns, *operator.optional_columns)
               if name in shapes}
    if all(values is None for name, values in columns.items() if name not in LENGTH_LIST_COLUMNS) and \
            "bs" in columns and all(values is None or len(values) == shapes["bs"] for name, values in columns.items()
                                    if name in LENGTH_LIST_COLUMNS):
        # one kernel of bs requests given by single values: flat length lists of bs entries are its per-request
        # lengths (with bs 1 they are one length per kernel, as before)
        columns = {name: [values] if name in LENGTH_LIST_COLUMNS and values is not None and
                   all(np.ndim(value) == 0 and not isinstance(value, str) for value in values) else values
                   for name, values in columns.items()}
    lengths = {name: len(values) for name, values in columns.items() if values is not None}
    rows = max(lengths.values(), default=1)
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the shape columns must have one value per kernel each, got lengths "
                         f"{', '.join(f'{name} {n}' for name, n in lengths.items())}")
    columns = {name: [shapes[name]] * rows if values is None else values for name, values in columns.items()}
    interval, extrapolation = _flag("interval", interval), _flag("extrapolation", extrapolation)
    if isinstance(hardware, str):
        names = [_gpu_name(hardware)] * rows
    elif hardware is None or _per_kernel(hardware, "hardware") is None:
        raise ValueError(f"hardware must be a GPU name or one per kernel, got {hardware!r}")
    else:
        names = [str(name) for name in _per_kernel(hardware, "hardware")]
    if len(names) != rows:
        raise ValueError(f"hardware: {len(names)} GPU names for {rows} kernels (give one name, or one per kernel)")
    # the limits predict_kernels.py applies, and each kernel's whole shape, naming the kernel by its index
    check_shape_table(columns, operator, label=lambda position: f"kernel {position}")
    predictor = _kernel_predictor(_folder(model_dir), _folder(hardware_dir))
    corrections = _calibration(_calibration_key(calibration))
    try:
        _check_calibration(corrections, [predictor.hardware.get(name).stem for name in names])
        directory = load_model_checked(predictor, operator.model_op)[2]
        from pipeweave.kernels import prediction_warnings

        # predict_kernels.py's WARNINGs (intervals measured for another model, where they are asked for; a
        # calibration fitted against another model or spec)
        named = None if corrections is None else f"calibration={str(corrections.path)!r}"
        for line in prediction_warnings(op, predictor, directory, corrections, named, intervals=interval):
            warnings.warn(line, UserWarning)
        us, codes, fastest = predictor.predict_columns_bounded(op, columns, names, corrections)
        if op == "attn":  # predict_kernels.py's warnings (FA3 where it cannot run, attention types nothing measured),
            # once the types are known to be valid
            from pipeweave.kernels import row_attention_warnings

            for line in row_attention_warnings("predict_kernels", list(zip(
                    (str(kind).strip() for kind in columns["attention_type"]),
                    (predictor.hardware.get(name) for name in names)))):
                warnings.warn(line, UserWarning)
        out = [us]
        if interval:
            from pipeweave.kernels import interval_us

            kinds = [str(kind).strip() for kind in columns["attention_type"]] if op == "attn" else None
            out += interval_us(op, predictor, names, us, codes, fastest, corrections, kinds)
        if extrapolation:
            from pipeweave.predictor import extrapolation_label

            out.append([extrapolation_label(code) for code in codes])
    except UserError as exc:  # the command line's error class; a library caller catches ValueError
        raise ValueError(str(exc)) from None
    return out[0] if len(out) == 1 else tuple(out)


#: shape columns whose value for one kernel is itself a list (one length per request of an attention batch)
LENGTH_LIST_COLUMNS = ("q_lengths", "kv_lengths")


def _per_kernel(values, name: str) -> list | None:
    """A column's values by position (a pandas Series by position, not by its index labels); None for one value
    (a number or a string), which every kernel takes. An unordered container (a set: its order changes between
    interpreter runs) or an array of more than one dimension is refused, naming the column."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or getattr(values, "ndim", None) == 0:
        return None
    if isinstance(values, (set, frozenset, Mapping)):
        raise ValueError(f"{name}: a {type(values).__name__} has no order, so its values cannot be matched to the "
                         f"kernels; give a list (one value per kernel)")
    if getattr(values, "ndim", 1) > 1:
        raise ValueError(f"{name}: an array of {values.ndim} dimensions; give one value per kernel (1-D)")
    return list(values)


@_warnings_at_caller
def simulate_serving(
    model_config: str | Path,
    trace: str | Path,
    hardware: str,
    *,
    requests: bool = False,
    interval: bool = False,
    collective_estimate: str = "model",
    calibration: str | Path | None = None,
    model_dir: str | Path | None = None,
    hardware_dir: str | Path | None = None,
    collective_dir: str | Path = paths.DEFAULT_COLLECTIVE_DIR,
    **settings,
) -> dict:
    """``serve_sim.py`` as a function: the object it writes (``config``, ``settings``, ``unmeasured_gpu``,
    ``extrapolation``, ``summary`` with ``ttft_ms`` / ``tpot_ms`` / ``e2e_ms`` percentiles and throughputs; README
    "Serving simulation"), with ``requests`` also its per-request table (``requests``: column -> list, the CSV's
    columns), with ``interval`` its ``interval`` block (serve_sim.py ``--interval``: the summaries with every kernel
    at the low and at the high end of its measured 80 % interval; three simulations instead of one).

    ``model_config`` and ``trace`` are paths or shipped stems, ``hardware`` a GPU name. ``settings`` are
    serve_sim.py's options under their own names (``tp``, ``pp``, ``ep``, ``dtype``, ``scheduler``, ``qps``,
    ``num_requests``, ``seed``, ``max_num_seqs``, ``max_num_batched_tokens``, ``usage``, ``gpu_memory_utilization``,
    ``per_request_outputs``, ``max_concurrent_batches``, ``collective_hardware``...: the fields of
    :class:`pipeweave.serving.run.ServingConfig`); an error names an option as serve_sim.py's flag of that name.
    ``model_dir`` and ``hardware_dir`` default to the shipped folders and are recorded as given (None: the default),
    as serve_sim.py records its flags. Raises ``FileNotFoundError`` / ``ValueError``.

    >>> result = simulate_serving("Llama-3.1-8B", "splitwise_48", "H100", qps=20, num_requests=8)
    >>> result["settings"]["dtype"], result["summary"]["num_requests"], result["unmeasured_gpu"]
    ('bf16', 8, [])
    """
    from dataclasses import fields

    from pipeweave.cli import UserError
    from pipeweave.serving.cli import calibration_warnings
    from pipeweave.serving.run import ServingConfig, serving_interval, simulate_config
    from pipeweave.serving.simulator import request_metrics, summarize
    from pipeweave.workload import ATTENTION_BACKENDS

    known = [field.name for field in fields(ServingConfig)][3:]  # after model_config, trace and hardware
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}; {paths.command('serve_sim.py')}'s are "
                         f"{', '.join(known)}")
    _gpu_name(hardware)
    for name, value in (("model_config", model_config), ("trace", trace)):
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise ValueError(f"{name} must be a path or the stem of a shipped one, got {value!r}")
    if settings.get("collective_hardware") is not None:
        _gpu_name(settings["collective_hardware"], "collective_hardware")
    requests = _flag("requests", requests)
    interval = _flag("interval", interval)
    _collective_estimate(collective_estimate)
    settings = {name: _setting(name, value) for name, value in settings.items()}
    for name in ("prefill_attn", "decode_attn"):
        if settings.get(name) is not None and settings[name] not in ATTENTION_BACKENDS:
            raise ValueError(f"{name} must be one of {', '.join(ATTENTION_BACKENDS)}, got {settings[name]!r}")
    try:
        calibration_used = _calibration_key(calibration)
        engine = _engine(_folder(paths.DEFAULT_MODEL_DIR if model_dir is None else model_dir),
                         _folder(paths.DEFAULT_HARDWARE_DIR if hardware_dir is None else hardware_dir),
                         _folder(collective_dir), collective_estimate, None, calibration_used)
        engine.forget_warnings()
        spec = engine.gpu(hardware)
        _check_calibration(engine.calibration, [spec.stem])
        config = ServingConfig(str(model_config), str(trace), spec.stem, **settings)
        run = simulate_config(config, engine)
        interval_block = serving_interval(config, engine) if interval else None
        if engine.calibration is not None:  # serve_sim's WARNINGs, for a calibration of other models
            for line in calibration_warnings(engine, config.model_config, config.tp * config.pp > 1,
                                             config.collective_hardware, [config.dtype]):
                warnings.warn(line, UserWarning)
    except UserError as exc:  # the command line's error class; a library caller catches ValueError
        raise ValueError(str(exc)) from None
    result = {"config": config.as_dict() | {"model_dir": model_dir and str(model_dir),
                                            "hardware_dir": hardware_dir and str(hardware_dir),
                                            "collective_estimate": collective_estimate,
                                            "calibration": None if calibration is None else str(calibration),
                                            "calibration_digest": calibration_used and calibration_used[1],
                                            "interval": interval},
              "settings": run.settings, "unmeasured_gpu": run.unmeasured_gpu, "extrapolation": run.extrapolation,
              "summary": summarize(run.simulation)}
    if interval_block is not None:
        result["interval"] = interval_block
    record = engine.calibration_record(spec)
    if record:
        result["calibration"] = record
    if requests:
        result["requests"] = {column: values.tolist() for column, values in request_metrics(run.simulation.requests)
                              .items()}
    return result


#: search_config.py's comma-separated list flags (a Python list, or one value, in :func:`search_configurations`)
LIST_OPTIONS = ("tp", "pp", "max_num_seqs", "ep", "dtype")


@_warnings_at_caller
def search_configurations(
    model_config: str | Path,
    trace: str | Path,
    hardware: str | Sequence[str],
    gpu_budget: int,
    *,
    calibration: str | Path | None = None,
    model_dir: str | Path | None = None,
    hardware_dir: str | Path | None = None,
    **options,
):
    """``search_config.py`` as a function: its ranked table (a pandas DataFrame, the CSV's columns and rows).

    ``hardware`` is one GPU name or a list of them, ``gpu_budget`` the most GPUs per replica. ``options`` are
    search_config.py's flags under their own names, a flag not given (or None) taking its command-line default:
    lists as Python lists, tuples or arrays (``tp=[1, 2]``, ``pp``, ``max_num_seqs``, ``ep``, ``dtype=["bf16",
    "fp8"]``), ``gpu_cost`` as a dict (GPU name -> USD per GPU-hour), targets (``ttft_ms``, ``ttft_percentile``,
    ``tpot_ms``, ``tpot_percentile``), ``capacity``, ``interval_end``, ``workers``, ``scheduler`` (the address of a
    Dask scheduler), ``collective_estimate`` and serve_sim.py's request-stream and scheduler settings (``qps``,
    ``num_requests``, ``per_request_outputs``...). An error names the option as search_config.py's flag. The
    console's notes are not repeated; its WARNING lines are Python warnings. With ``workers`` above 1, Dask starts
    worker processes that import the calling script again: call it under ``if __name__ == "__main__":``. Raises
    ``FileNotFoundError`` / ``ValueError``.

    >>> table = search_configurations("Llama-3.1-8B", "splitwise_48", ["H100", "A100"], 1, pp=[1], max_num_seqs=[32],
    ...                               num_requests=8, ttft_ms=1000)
    >>> list(table["hardware"]), bool(table["meets_targets"].all())
    (['H100', 'A100'], True)
    """
    from pipeweave.cli import UserError, positive_float
    from pipeweave.serving import search

    parser = search.build_parser()
    # argparse lists its flags only in ``_actions``; each option is keyed by its flag's name (--scheduler: scheduler)
    flags = {option[2:]: action for action in parser._actions for option in action.option_strings
             if option.startswith("--")}
    excluded = {"help", "model_config", "trace", "hardware", "gpu_budget", "calibration", "model_dir", "hardware_dir",
                "output", "plot"}
    known = sorted(set(flags) - excluded)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; {paths.command('search_config.py')}'s are "
                         f"{', '.join(known)}")
    for name, value in (("model_config", model_config), ("trace", trace)):
        if not isinstance(value, (str, Path)) or not str(value).strip():
            raise ValueError(f"{name} must be a path or the stem of a shipped one, got {value!r}")
    gpus = [hardware] if isinstance(hardware, str) else _option_list("hardware", hardware)
    argv = [f"--model_config={model_config}", f"--trace={trace}",
            "--hardware=" + ",".join(_list_item("hardware", _gpu_name(gpu)) for gpu in gpus),
            f"--gpu_budget={_setting_value('gpu_budget', gpu_budget, int)}", "--output=unwritten.csv"]
    for name, value in (("calibration", calibration), ("model_dir", model_dir), ("hardware_dir", hardware_dir)):
        if value is not None:
            if not isinstance(value, (str, Path)):
                raise ValueError(f"{name} must be a path, got {type(value).__name__}")
            argv.append(f"--{name}={value}")
    for name, value in options.items():
        action = flags[name]
        if value is None:
            continue
        if action.nargs == 0:  # a true/false flag
            if _flag(name, value):
                argv.append(f"--{name}")
            continue
        if name == "gpu_cost":
            if not isinstance(value, Mapping):
                raise ValueError(f"gpu_cost must be a dict of GPU name -> USD per GPU-hour, got {value!r}")
            text = ",".join(f"{_list_item('gpu_cost', _gpu_name(gpu, 'a gpu_cost key'))}="
                            f"{float(_setting_value('gpu_cost', price, float))!r}" for gpu, price in value.items())
        elif name in LIST_OPTIONS:
            kind = str if name == "dtype" else int
            text = ",".join(_list_item(name, str(_setting_value(name, item, kind)))
                            for item in _option_list(name, value))
        else:
            kind = int if action.type is int else float if action.type in (float, positive_float) else str
            checked = _setting_value(name, value, kind)
            text = repr(float(checked)) if kind is float else str(checked)
        argv.append(f"--{name}={text}")  # with "=": a value beginning with "-" is not read as a flag
    try:
        args = parser.parse_args(argv)
        search._ENGINES.clear()  # a folder edited since an earlier call is read again
        sweep = search.plan(args, say=_warn_of_warnings, log=_warn_of_warnings)
        return search.execute(sweep, args.workers, args.scheduler_address)
    except UserError as exc:  # the command line's error class; a library caller catches ValueError
        raise ValueError(str(exc)) from None


def _option_list(name: str, value) -> list:
    """A list option of :func:`search_configurations`: one value, or a non-empty list, tuple, range or 1-D array (a
    set has no order, and the table's order follows the list's)."""
    if isinstance(value, (str, int, float, np.generic)):
        return [value]
    if not isinstance(value, (list, tuple, range, np.ndarray)) or np.ndim(value) != 1:
        raise ValueError(f"{name} must be a value or a list of values, got {value!r}")
    if len(value) == 0:
        raise ValueError(f"{name} must list at least one value, got an empty {type(value).__name__}")
    return list(value)


def _list_item(name: str, text: str) -> str:
    """One item of a comma-separated flag: a comma (or an equals sign) in it would be read as more than one."""
    if "," in text or "=" in text:
        raise ValueError(f"{name}: give a list instead of the command line's comma-separated text, got {text!r}")
    return text


def _setting_value(name: str, value, kind: type):
    """``value`` checked as ``kind`` (int, float or str) would be typed on the command line, numpy scalars as plain
    ones: no bool for a number, no float for an integer."""
    if isinstance(value, np.generic):
        value = value.item()
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if kind is str and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


#: serve_sim.py's integer, number and true/false options (argparse types them on the command line; a caller may not)
INTEGER_SETTINGS = ("tp", "pp", "ep", "num_requests", "seed", "max_num_seqs", "max_num_batched_tokens",
                    "max_concurrent_batches", "decode_bucket", "max_model_len")
NUMBER_SETTINGS = ("qps", "gpu_memory_utilization")
FLAG_SETTINGS = ("per_request_outputs", "qk_norm_rmsnorm")


def _setting(name: str, value):
    """A serving option as serve_sim.py would have parsed it: integers and numbers checked (numpy ones as plain
    ones), so that "2" or 2.5 is one clear error instead of a TypeError inside the simulation."""
    if name in FLAG_SETTINGS:
        return _flag(name, value)
    if value is None or (name not in INTEGER_SETTINGS and name not in NUMBER_SETTINGS):
        return value
    return _setting_value(name, value, int if name in INTEGER_SETTINGS else float)
