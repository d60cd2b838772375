"""Measured end-to-end runs: reading the artifact's repetitions and this project's summary of them.

The PipeWeave artifact (source A: github.com/zksainx/pipeweave @ 55e0317, Apache-2.0, ``e2e/real/``) measured each
static-batch configuration 5 times (``e2e_<GPU>.jsonl``, ``e2e_tp<T>_<GPU>.jsonl``: prefill latency, median decode
step latency and total latency per repetition, in seconds) and the vLLM TP4×PP2 runs 5 times
(``vllm_<trace>_<GPU>_llama70B.json``: ``latencies`` in seconds). This project keeps **its own summary figures** of
those runs in ``e2e/real/measured_runs.csv`` (one row per run: GPU, TP, PP, model, trace; median, min and max over
the repetitions of prefill ms, decode ms per step and total ms), built by

    python3 -m pipeweave.compare summarize-real [--source DIR] [--output e2e/real/measured_runs.csv]

(``--source`` defaults to ``$PIPEWEAVE_SHARED_DATA/pipeweave/e2e/real``, the shared measurement folder of
docs/DATA.md). ``--real_dir`` of the comparison scripts reads either that CSV or the artifact's jsonl/json files
directly.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from pipeweave.cli import UserError
from pipeweave.validation import row_label
from pipeweave.paths import E2E_DIR, shared_data_dir

DEFAULT_REAL_DIR = E2E_DIR / "real"
REAL_SUMMARY_NAME = "measured_runs.csv"
METRICS = ("prefill", "decode", "total")
#: vLLM result files name the model by a short tag
MODEL_ALIASES = {"llama70B": "Llama-3.1-70B"}
#: parallelism of the artifact's vLLM runs (docs/METHOD.md §6.5, §9)
VLLM_TP, VLLM_PP = 4, 2
SOURCE_CITATION = ("PipeWeave artifact (source A), github.com/zksainx/pipeweave @ 55e03178, Apache-2.0, "
                   "e2e/real/ (in the shared measurement folder: $PIPEWEAVE_SHARED_DATA/pipeweave/e2e/real/)")

#: a measured run is a static batch (the aggregator's workload) or a vLLM latency benchmark
RUN_KINDS = ("static", "vllm")
SUMMARY_COLUMNS = [
    "gpu", "tp", "pp", "model", "trace", "kind", "repeats",
    "prefill_ms_median", "prefill_ms_min", "prefill_ms_max",
    "decode_ms_median", "decode_ms_min", "decode_ms_max",
    "total_ms_median", "total_ms_min", "total_ms_max",
    "source",
]


def artifact_real_dir() -> Path:
    return shared_data_dir() / "pipeweave" / "e2e" / "real"


def gpu_stem(tag: str, hardware_dir: Path = DEFAULT_HARDWARE_DIR) -> str:
    """Hardware stem of a GPU tag ("RTX_A6000" → "RTX A6000"); unknown tags are returned unchanged."""
    registry = hardware_registry(Path(hardware_dir))
    return registry.get(tag).stem if tag in registry else tag


# ==================================================================================================
# measured runs
# ==================================================================================================

def first_repeated(frame: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """The rows of the first value of ``key`` that ``frame`` holds more than once (empty if none): what an error
    about a run, a repetition or a prediction read twice names."""
    repeated = frame[frame.duplicated(subset=key, keep=False)]
    if not len(repeated):
        return repeated
    return repeated[(repeated[key] == repeated.iloc[0][key]).all(axis=1)]


def measured_ms(seconds, where: str) -> float:
    """A measured time in seconds as ms; anything but a finite positive number (NaN, a negative or zero time, text)
    is an error naming ``where``: the median of the other repetitions would hide it."""
    try:
        value = float(seconds) if not isinstance(seconds, bool) else np.nan
    except (TypeError, ValueError):
        value = np.nan
    if not (np.isfinite(value) and value > 0):
        raise UserError(f"{where} is {seconds!r}, not a positive number of seconds")
    return 1000.0 * value


def read_artifact_repeats(real_dir: str | Path, hardware_dir: Path = DEFAULT_HARDWARE_DIR) -> pd.DataFrame:
    """One row per repetition from the artifact's ``e2e_*.jsonl`` and ``vllm_*.json`` files (ms)."""
    real_dir = Path(real_dir)
    rows = []
    for path in sorted(real_dir.glob("e2e_*.jsonl")):
        match = re.fullmatch(r"e2e_(?:tp(\d+)_)?(.+)\.jsonl", path.name)
        if not match:
            continue
        tp = int(match.group(1) or 1)
        gpu = gpu_stem(match.group(2), hardware_dir)
        for line_no, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                model, trace = str(record["run_name"]).rsplit("-", 1)
                rows.append({
                    "gpu": gpu, "tp": tp, "pp": 1, "model": model, "trace": trace, "kind": "static",
                    "repeat": record.get("iteration", record.get("iterations", line_no - 1)),
                    **{f"{metric}_ms": measured_ms(record[field], f"{path}:{line_no}: {field}")
                       for metric, field in (("prefill", "prefill_latency"), ("decode", "median_decode_latency"),
                                             ("total", "total_latency"))},
                    "source": f"e2e/real/{path.name}",
                })
            except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
                raise UserError(f"{path}:{line_no}: not a measured-run record ({exc})") from None
    for path in sorted(real_dir.glob("vllm_*.json")):
        match = re.fullmatch(r"vllm_([^_]+)_(.+)_([^_]+)\.json", path.name)
        if not match:
            continue
        trace, tag, model_tag = match.groups()
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: not a JSON file ({exc})") from None
        data = data if isinstance(data, dict) else {}
        latencies = data.get("latencies") or ([data["avg_latency"]] if "avg_latency" in data else [])
        if not isinstance(latencies, list) or not latencies:
            raise UserError(f"{path}: no 'latencies' list (or 'avg_latency' field) of a vLLM latency benchmark")
        for i, seconds in enumerate(latencies):
            rows.append({
                "gpu": gpu_stem(tag, hardware_dir), "tp": VLLM_TP, "pp": VLLM_PP,
                "model": MODEL_ALIASES.get(model_tag, model_tag), "trace": f"vllm_{trace}", "kind": "vllm",
                "repeat": i, "prefill_ms": np.nan, "decode_ms": np.nan,
                "total_ms": measured_ms(seconds, f"{path}: latency {i + 1}"),
                "source": f"e2e/real/{path.name}",
            })
    repeats = pd.DataFrame(rows, columns=["gpu", "tp", "pp", "model", "trace", "kind", "repeat", "prefill_ms",
                                          "decode_ms", "total_ms", "source"])
    key = ["gpu", "tp", "pp", "model", "trace", "kind", "repeat"]
    twice = first_repeated(repeats, key)
    if len(twice):  # a line pasted twice, or a copy of a file under another name of its GPU, would count it twice
        first = twice.iloc[0]
        files = sorted(set(twice["source"].str.removeprefix("e2e/real/")))
        raise UserError(f"{real_dir}: repetition {first['repeat']} of the run {first['gpu']} TP{first['tp']} "
                        f"PP{first['pp']} {first['model']} {first['trace']} ({first['kind']}) is read more than once "
                        f"(in {', '.join(files)}); keep one record per repetition")
    return repeats


def summarize_repeats(repeats: pd.DataFrame) -> pd.DataFrame:
    """Median, min and max over the repetitions of every run (NaN-only metrics stay NaN)."""
    rows = []
    keys = ["gpu", "tp", "pp", "model", "trace", "kind"]
    for key, group in repeats.groupby(keys, sort=True):
        row = dict(zip(keys, key))
        row["repeats"] = int(len(group))
        for metric in METRICS:
            values = group[f"{metric}_ms"].to_numpy(np.float64)
            values = values[np.isfinite(values)]
            for stat, fn in (("median", np.median), ("min", np.min), ("max", np.max)):
                row[f"{metric}_ms_{stat}"] = float(fn(values)) if values.size else np.nan
        row["source"] = ";".join(sorted(set(group["source"])))
        rows.append(row)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def load_real(real_dir: str | Path = DEFAULT_REAL_DIR, hardware_dir: Path = DEFAULT_HARDWARE_DIR) -> pd.DataFrame:
    """Run summaries from ``real_dir``: the artifact's jsonl/json files if present, else our summary CSV(s)."""
    real_dir = Path(real_dir)
    if not real_dir.is_dir():
        raise FileNotFoundError(f"--real_dir {real_dir}: not a directory (expected e2e/real or the artifact's "
                                f"e2e folder)")
    repeats = read_artifact_repeats(real_dir, hardware_dir)
    if len(repeats):
        return summarize_repeats(repeats)
    frames = []
    for path in sorted(real_dir.glob("*.csv")):
        frames.append(read_summary_csv(path, hardware_dir).assign(file=path.name))
    if not frames:
        raise FileNotFoundError(f"no measured runs in {real_dir} (expected {REAL_SUMMARY_NAME}, or the artifact's "
                                f"e2e_*.jsonl / vllm_*.json files); build the summary with "
                                f"python3 -m pipeweave.compare summarize-real")
    runs = pd.concat(frames, ignore_index=True)
    key = ["gpu", "tp", "pp", "model", "trace", "kind"]
    repeated = first_repeated(runs, key)
    if len(repeated):  # a backup copy beside the summary, or a row pasted twice, would count the run twice
        first = repeated.iloc[0]
        raise UserError(f"{real_dir}: the run {first['gpu']} TP{first['tp']} PP{first['pp']} {first['model']} "
                        f"{first['trace']} ({first['kind']}) is summarised more than once (in "
                        f"{', '.join(sorted(set(repeated['file'])))}); keep one summary per run")
    return runs[SUMMARY_COLUMNS]


def read_summary_csv(path: Path, hardware_dir: Path = DEFAULT_HARDWARE_DIR) -> pd.DataFrame:
    """One measured-run summary CSV, checked: the columns, integer parallelism and repeats, positive durations;
    errors name the file, the row and the column. GPU names are read as the hardware loader reads them ("NVIDIA
    L40S" is L40S, as in the jsonl file names)."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a readable CSV ({type(exc).__name__}: {str(exc).splitlines()[0]}); build it "
                        f"with python3 -m pipeweave.compare summarize-real") from None
    missing = [c for c in SUMMARY_COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: not a measured-run summary (missing {', '.join(missing)}); build one with "
                        f"python3 -m pipeweave.compare summarize-real")
    for column in SUMMARY_COLUMNS:
        if column in ("gpu", "model", "trace", "kind", "source"):
            continue
        values = pd.to_numeric(frame[column], errors="coerce")
        duration = column.endswith(("_median", "_min", "_max"))
        bad = (frame[column].notna() & ~(np.isfinite(values) & (values > 0)) if duration else
               (values.isna() | (values < 1) | (values != values.round())))
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise UserError(f"{path}: {row_label(row)}: column {column} has {frame[column].iloc[row]!r}, expected "
                            f"{'a positive number of ms' if duration else 'a positive integer'}")
    medians = frame[[f"{metric}_ms_median" for metric in ("prefill", "decode", "total")]]
    unmeasured = medians.isna().all(axis=1)
    if unmeasured.any():  # it would be listed as "— / — / —" and scored nowhere, without a word
        row = int(unmeasured.to_numpy().nonzero()[0][0])
        raise UserError(f"{path}: {row_label(row)}: no measured median (prefill, decode or total); a run needs at "
                        f"least one")
    for metric in ("prefill", "decode", "total"):
        low, mid, high = (pd.to_numeric(frame[f"{metric}_ms_{stat}"]) for stat in ("min", "median", "max"))
        disordered = (low > mid) | (mid > high)  # NaN compares false: a cell left empty is not checked
        if disordered.any():
            row = int(disordered.to_numpy().nonzero()[0][0])
            raise UserError(f"{path}: {row_label(row)}: {metric} min {low.iloc[row]:g}, median {mid.iloc[row]:g} and "
                            f"max {high.iloc[row]:g} ms are not in order")
    kinds = frame["kind"].astype(str).str.strip()
    unknown = ~kinds.isin(RUN_KINDS)
    if unknown.any():
        row = int(unknown.to_numpy().nonzero()[0][0])
        raise UserError(f"{path}: {row_label(row)}: kind {frame['kind'].iloc[row]!r} is not one of "
                        f"{', '.join(RUN_KINDS)}")
    frame = frame.assign(gpu=[gpu_stem(str(name).strip(), hardware_dir) for name in frame["gpu"]], kind=kinds)
    return frame[SUMMARY_COLUMNS]


def format_summary_csv(summary: pd.DataFrame) -> str:
    out = summary.copy()
    for column in SUMMARY_COLUMNS:
        if column.endswith(("_median", "_min", "_max")):
            out[column] = out[column].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    return out.to_csv(index=False, lineterminator="\n")


def ape(pred, real) -> np.ndarray:
    """|pred − real| / real in % (NaN where either is missing or real is not positive)."""
    pred = np.asarray(pred, dtype=np.float64)
    real = np.asarray(real, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.abs(pred - real) / real * 100.0
    return np.where(np.isfinite(out) & (real > 0), out, np.nan)


def error_summary(table: pd.DataFrame) -> list[dict]:
    """Mean and worst error per method (over the runs that have that method's prediction)."""
    out = []
    methods = [("PipeWeave (this project)", "err_mean_pct", "err")]
    if "roofline_err_mean_pct" in table:
        methods.append(("Roofline (this project)", "roofline_err_mean_pct", "roofline_err"))
    for column in table.columns:
        match = re.fullmatch(r"artifact_(\w+?)_err_mean_pct", column)
        if match:
            methods.append((f"artifact {match.group(1)} (published)", column, f"artifact_{match.group(1)}_err"))
    for label, column, prefix in methods:
        values = table[column].to_numpy(np.float64)
        ok = np.isfinite(values)
        if not ok.any():
            continue
        worst = int(np.nanargmax(np.where(ok, values, -np.inf)))
        entry = {"method": label, "runs": int(ok.sum()), "mean": float(values[ok].mean()),
                 "worst": float(values[worst]),
                 "worst_run": f"{table.iloc[worst]['gpu']} TP{table.iloc[worst]['tp']} {table.iloc[worst]['model']} "
                              f"{table.iloc[worst]['trace']}"}
        for metric in METRICS:
            col = f"{prefix}_{metric}_pct"
            if col in table:
                v = table[col].to_numpy(np.float64)
                entry[metric] = float(np.nanmean(v)) if np.isfinite(v).any() else np.nan
        out.append(entry)
    return out
