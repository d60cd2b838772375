"""Predicted vs measured end-to-end latency (METHOD.md §8), with a roofline baseline and the artifact's published
predictions side by side. Logic behind ``compare_pred_real.py`` and ``compare_vllm_pred_real.py``.

Measured runs
-------------
The PipeWeave artifact (source A: github.com/zksainx/pipeweave @ 55e0317, Apache-2.0, ``e2e/real/``) measured each
static-batch configuration 5 times (``e2e_<GPU>.jsonl``, ``e2e_tp<T>_<GPU>.jsonl``: prefill latency, median decode
step latency and total latency per repetition, in seconds) and the vLLM TP4×PP2 runs 5 times
(``vllm_<trace>_<GPU>_llama70B.json``: ``latencies`` in seconds). This project keeps **its own summary figures** of
those runs in ``e2e/real/measured_runs.csv`` (one row per run: GPU, TP, PP, model, trace; median, min and max over
the repetitions of prefill ms, decode ms per step and total ms), built by

    python3 -m pipeweave.compare summarize-real [--source DIR] [--output e2e/real/measured_runs.csv]

(``--source`` defaults to ``$PIPEWEAVE_SHARED_DATA/pipeweave/e2e/real``, i.e. ``../shared/data`` next to the
repository). ``--real_dir`` of the comparison scripts reads either that CSV or the artifact's jsonl/json files
directly.

Metrics (fix of METHOD.md §11.4 item 25)
----------------------------------------
The reference compared each prediction with the repetition closest to it (best of 5), which biases the error down
and gives every method a different "measured" value. Here the reference value is the **median over the
repetitions**, the same for every method:

* error = |pred − median(real)| / median(real), per metric: prefill, decode per step (the prediction's mean decode
  step vs the measured median step latency, §11.4 item 26), total; ``mean`` = mean of the three;
* vLLM: total vs the median of the 5 ``latencies``.

Baselines
---------
* **Roofline (this project)**, computed here on the same workload files: every kernel takes
  max(FLOPs / peak BF16 tensor FLOP/s, bytes / peak DRAM bandwidth) with the hardware JSON peaks
  (``tcBf16 × numSms × smFreq``; ``memBandwidth`` in GB/s = 10⁹ B/s) and this project's FLOP/byte counts (below);
  communication takes exactly the durations of the PipeWeave prediction it is compared beside (same collective
  models), so the two differ only in the kernel model. Counts (BF16, 2 bytes per element):
  GEMM 2MNK FLOPs, 2(MK + KN + MN) bytes; attention 4·hd·nh·Σ causal (query, key) pairs FLOPs
  (pairs = q(kv − q) + q(q + 1)/2 per request), bytes 2·hd·(2·nh·Σq + 2·nkv·Σkv) (Q read, O written, K, V
  read);
  RMSNorm 4·seq·dim FLOPs (non-tensor, ignored by the tensor roof) and 2·(2·seq·dim + dim) bytes; SiLU*Mul on input
  width dim: 2·(seq·dim + seq·dim/2) bytes.
* **Artifact predictions** (source A, ``e2e/<method>_comparison.csv``, the shared copies in
  ``$PIPEWEAVE_SHARED_DATA/pipeweave/e2e/baselines/``, read in place): only their prediction columns are used and
  their errors are recomputed against the same medians; our outputs keep those errors, not the artifact's
  prediction values. The artifact's roofline files carry no decode prediction
  (its decode column is 0, a schema mismatch, METHOD.md §8.1), so that column is left empty.
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import workload_operators
from pipeweave.cli import ArgumentParser, UserError, write_atomically

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PRED_DIR = REPO_ROOT / "e2e" / "pipeweave_pred"
DEFAULT_REAL_DIR = REPO_ROOT / "e2e" / "real"
REAL_SUMMARY_NAME = "measured_runs.csv"
DEFAULT_WORKLOAD_DIR = REPO_ROOT / "workload"
DEFAULT_CONFIG_DIR = REPO_ROOT / "config"
ARTIFACT_METHODS = ("pipeweave", "roofline", "neusight", "habitat", "linear")
METRICS = ("prefill", "decode", "total")
#: vLLM result files name the model by a short tag
MODEL_ALIASES = {"llama70B": "Llama-3.1-70B"}
#: parallelism of the artifact's vLLM runs (METHOD.md §6.5, §9)
VLLM_TP, VLLM_PP = 4, 2
SOURCE_CITATION = ("PipeWeave artifact (source A), github.com/zksainx/pipeweave @ 55e03178, Apache-2.0, "
                   "e2e/real/ (shared copy: pipeweave/e2e/real/)")

SUMMARY_COLUMNS = [
    "gpu", "tp", "pp", "model", "trace", "kind", "repeats",
    "prefill_ms_median", "prefill_ms_min", "prefill_ms_max",
    "decode_ms_median", "decode_ms_min", "decode_ms_max",
    "total_ms_median", "total_ms_min", "total_ms_max",
    "source",
]


def shared_data_dir() -> Path:
    return Path(os.environ.get("PIPEWEAVE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def artifact_real_dir() -> Path:
    return shared_data_dir() / "pipeweave" / "e2e" / "real"


def artifact_baselines_dir() -> Path:
    return shared_data_dir() / "pipeweave" / "e2e" / "baselines"


def gpu_stem(tag: str, hardware_dir: Path = DEFAULT_HARDWARE_DIR) -> str:
    """Hardware stem of a GPU tag ("RTX_A6000" → "RTX A6000"); unknown tags are returned unchanged."""
    registry = hardware_registry(Path(hardware_dir))
    return registry.get(tag).stem if tag in registry else tag


# ==================================================================================================
# measured runs
# ==================================================================================================

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
                    "prefill_ms": 1000.0 * float(record["prefill_latency"]),
                    "decode_ms": 1000.0 * float(record["median_decode_latency"]),
                    "total_ms": 1000.0 * float(record["total_latency"]),
                    "source": f"e2e/real/{path.name}",
                })
            except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
                raise UserError(f"{path}:{line_no}: not a measured-run record ({exc})") from None
    for path in sorted(real_dir.glob("vllm_*.json")):
        match = re.fullmatch(r"vllm_([^_]+)_(.+)_([^_]+)\.json", path.name)
        if not match:
            continue
        trace, tag, model_tag = match.groups()
        data = json.loads(path.read_text())
        latencies = data.get("latencies") or ([data["avg_latency"]] if "avg_latency" in data else [])
        if not latencies:
            raise UserError(f"{path}: no 'latencies' (or 'avg_latency') field")
        for i, seconds in enumerate(latencies):
            rows.append({
                "gpu": gpu_stem(tag, hardware_dir), "tp": VLLM_TP, "pp": VLLM_PP,
                "model": MODEL_ALIASES.get(model_tag, model_tag), "trace": f"vllm_{trace}", "kind": "vllm",
                "repeat": i, "prefill_ms": np.nan, "decode_ms": np.nan, "total_ms": 1000.0 * float(seconds),
                "source": f"e2e/real/{path.name}",
            })
    return pd.DataFrame(rows, columns=["gpu", "tp", "pp", "model", "trace", "kind", "repeat", "prefill_ms",
                                       "decode_ms", "total_ms", "source"])


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
        raise FileNotFoundError(f"--real_dir not found: {real_dir}")
    repeats = read_artifact_repeats(real_dir, hardware_dir)
    if len(repeats):
        return summarize_repeats(repeats)
    frames = []
    for path in sorted(real_dir.glob("*.csv")):
        frame = pd.read_csv(path)
        missing = [c for c in SUMMARY_COLUMNS if c not in frame.columns]
        if missing:
            raise UserError(f"{path}: not a measured-run summary (missing {', '.join(missing)}); build one with "
                            f"python3 -m pipeweave.compare summarize-real")
        frames.append(frame[SUMMARY_COLUMNS])
    if not frames:
        raise FileNotFoundError(f"no measured runs in {real_dir} (expected {REAL_SUMMARY_NAME}, or the artifact's "
                                f"e2e_*.jsonl / vllm_*.json files); build the summary with "
                                f"python3 -m pipeweave.compare summarize-real")
    return pd.concat(frames, ignore_index=True)


def format_summary_csv(summary: pd.DataFrame) -> str:
    out = summary.copy()
    for column in SUMMARY_COLUMNS:
        if column.endswith(("_median", "_min", "_max")):
            out[column] = out[column].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    return out.to_csv(index=False, lineterminator="\n")


# ==================================================================================================
# predictions
# ==================================================================================================

@dataclass(frozen=True)
class PredictionName:
    model: str
    trace: str
    fa: str
    tp: int
    pp: int
    gpu_tag: str

    @property
    def workload_stem(self) -> str:
        return f"{self.model}_{self.trace}_{self.fa}_tp{self.tp}_pp{self.pp}"


_NAME = re.compile(r"(?P<head>.+)_(?P<fa>fa\d)_tp(?P<tp>\d+)_pp(?P<pp>\d+)_(?P<gpu>.+)")


def parse_prediction_name(stem: str, model_names: Sequence[str] = ()) -> PredictionName | None:
    """``<model>_<trace>_<fa>_tp<T>_pp<P>_<GPU>`` (the aggregator's naming); None if it does not fit.

    The model is the longest known model name (config stems) that prefixes ``<model>_<trace>``, else the
    part before the first underscore.
    """
    match = _NAME.fullmatch(stem)
    if not match:
        return None
    head = match.group("head")
    model = next((m for m in sorted(model_names, key=len, reverse=True) if head.startswith(m + "_")), None)
    if model is None:
        if "_" not in head:
            return None
        model = head.split("_", 1)[0]
    trace = head[len(model) + 1:]
    if not trace:
        return None
    return PredictionName(model, trace, match.group("fa"), int(match.group("tp")), int(match.group("pp")),
                          match.group("gpu"))


def config_model_names(config_dir: Path = DEFAULT_CONFIG_DIR) -> list[str]:
    return sorted(p.stem for p in Path(config_dir).glob("*.json"))


def load_predictions(pred_dir: str | Path, hardware_dir: Path = DEFAULT_HARDWARE_DIR,
                     config_dir: Path = DEFAULT_CONFIG_DIR) -> pd.DataFrame:
    """Summaries of every prediction JSON in ``pred_dir`` whose name follows the aggregator's naming."""
    pred_dir = Path(pred_dir)
    names = config_model_names(config_dir)
    rows = []
    for path in sorted(pred_dir.glob("*.json")):
        parsed = parse_prediction_name(path.stem, names)
        if parsed is None:
            continue
        try:
            summary = json.loads(path.read_text())["summary"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{path}: not an aggregator output (no summary)") from None
        rows.append({
            "gpu": gpu_stem(parsed.gpu_tag, hardware_dir), "tp": parsed.tp, "pp": parsed.pp, "model": parsed.model,
            "trace": parsed.trace, "fa": parsed.fa, "workload": parsed.workload_stem, "path": str(path),
            "pred_prefill_ms": float(summary.get("prefill_duration_ms", np.nan)),
            "pred_decode_ms": float(summary.get("decode_avg_duration_ms", np.nan)),
            "pred_total_ms": float(summary.get("total_duration_ms", np.nan)),
        })
    return pd.DataFrame(rows, columns=["gpu", "tp", "pp", "model", "trace", "fa", "workload", "path",
                                       "pred_prefill_ms", "pred_decode_ms", "pred_total_ms"])


# ==================================================================================================
# roofline baseline
# ==================================================================================================

def roofline_kernel_ms(op: str, shapes: list[tuple], hw) -> np.ndarray:
    """Roofline duration (ms) of unique kernel shapes of one registry operator class on one GPU."""
    peak_flops = float(hw.tc_bf16) * hw.num_sms * hw.sm_freq * 1e6
    bandwidth = float(hw.mem_bandwidth) * 1e9
    if not shapes:
        return np.zeros(0)
    if op == "gemm":
        m, n, k = (np.array([s[i] for s in shapes], dtype=np.float64) for i in range(3))
        flops = 2.0 * m * n * k
        nbytes = 2.0 * (m * k + k * n + m * n)
    elif op == "attn":
        flops = np.empty(len(shapes))
        nbytes = np.empty(len(shapes))
        for i, (_, _, q, kv, nh, nkv, hd) in enumerate(shapes):
            pairs = sum(a * (b - a) + a * (a + 1) // 2 for a, b in zip(q, kv))
            flops[i] = 4.0 * hd * nh * pairs
            nbytes[i] = 2.0 * hd * (2.0 * nh * sum(q) + 2.0 * nkv * sum(kv))
    elif op == "rmsnorm":
        seq, dim = (np.array([s[i] for s in shapes], dtype=np.float64) for i in range(2))
        flops = np.zeros(len(shapes))  # non-tensor work: below the tensor roof's reach, memory-bound anyway
        nbytes = 2.0 * (2.0 * seq * dim + dim)
    elif op == "siluandmul":
        seq, dim = (np.array([s[i] for s in shapes], dtype=np.float64) for i in range(2))
        flops = np.zeros(len(shapes))
        nbytes = 2.0 * (seq * dim + seq * dim / 2.0)
    else:
        raise ValueError(f"no roofline for operator class {op!r}")
    return np.maximum(flops / peak_flops, nbytes / bandwidth) * 1000.0


def roofline_prediction(workload_path: str | Path, hardware: str, prediction: dict | None = None,
                        hardware_dir: Path = DEFAULT_HARDWARE_DIR, own_collectives: bool = False) -> dict:
    """The aggregator's output object with roofline kernel durations.

    Communication durations are copied from ``prediction`` (a PipeWeave aggregator output for the same workload
    and GPU), so that both use the same collective models. Without a prediction, ``own_collectives`` predicts
    them as the batch scripts do (the GPU's own collective models, the analytical estimate where none covers a
    collective); otherwise a workload with communication is an error.
    """
    from pipeweave.engine import Job
    from pipeweave.flatten import CATEGORY_CODE, COMMUNICATION_CODE, KERNEL_CATEGORIES, load_workload
    from pipeweave.report import build_result

    workload = load_workload(workload_path)
    hw = hardware_registry(Path(hardware_dir)).get(hardware)
    single = np.zeros(len(workload.inst_code))
    for category, op in KERNEL_CATEGORIES.items():
        rows = np.flatnonzero(workload.inst_code == CATEGORY_CODE[category])
        if rows.size:
            unique = roofline_kernel_ms(op, workload.shapes[op], hw)
            single[rows] = unique[workload.inst_local[rows]]
    comm = np.flatnonzero(workload.inst_code == COMMUNICATION_CODE)
    if comm.size and prediction is None:
        if not own_collectives:
            raise UserError(f"{workload.stem}: roofline needs the PipeWeave prediction's communication durations")
        from pipeweave.engine import Engine

        engine = Engine(hardware_dir=hardware_dir, collective_estimate="analytical", log=None)
        job = Job(workload, hw)
        ms, _ = engine.collective_durations(job, engine.collective_predictor(job))
        single[comm] = ms[workload.inst_local[comm]]
    elif comm.size:
        iterations = prediction["iterations"]
        if len(iterations) != len(workload.numbers):
            raise UserError(f"{workload.stem}: the prediction has {len(iterations)} iterations, the workload "
                            f"{len(workload.numbers)}")
        for position, entries in enumerate(workload.layout):
            durations = iterations[position]["operator_durations"].get("communication", {})
            for category, name, i in entries:
                if category == "communication":
                    if name not in durations:
                        raise UserError(f"{workload.stem}: iteration {position + 1}: the prediction lacks "
                                        f"communication {name!r}")
                    single[i] = float(durations[name]["single_duration_ms"])
    return build_result(Job(workload, hw), single)


# ==================================================================================================
# comparison tables
# ==================================================================================================

def ape(pred, real) -> np.ndarray:
    """|pred − real| / real in % (NaN where either is missing or real is not positive)."""
    pred = np.asarray(pred, dtype=np.float64)
    real = np.asarray(real, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.abs(pred - real) / real * 100.0
    return np.where(np.isfinite(out) & (real > 0), out, np.nan)


def read_artifact_baselines(baselines_dir: Path | None, hardware_dir: Path = DEFAULT_HARDWARE_DIR
                            ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(static predictions, vLLM predictions, notes) from the artifact's *_comparison.csv (prediction columns only)."""
    notes = []
    static_rows, vllm_rows = [], []
    if baselines_dir is None or not Path(baselines_dir).is_dir():
        notes.append(f"artifact baseline predictions not found ({baselines_dir}); those columns are omitted")
        return pd.DataFrame(), pd.DataFrame(), notes
    baselines_dir = Path(baselines_dir)
    for method in ARTIFACT_METHODS:
        path = baselines_dir / f"{method}_comparison.csv"
        if not path.is_file():
            notes.append(f"{path.name} absent: no artifact {method} column")
            continue
        frame = pd.read_csv(path)
        for _, row in frame.iterrows():
            static_rows.append({
                "method": method, "gpu": gpu_stem(str(row["Hardware"]), hardware_dir), "tp": int(row["TP"]),
                "pp": int(row["PP"]), "model": row["Model"], "trace": row["Workload"],
                "pred_prefill_ms": float(row["pred_prefill_ms"]),
                # the artifact's roofline files have no decode prediction (read as 0: METHOD.md §8.1)
                "pred_decode_ms": np.nan if method == "roofline" else float(row["pred_decode_ms"]),
                "pred_total_ms": float(row["pred_total_ms"]),
            })
    path = baselines_dir / "vllm_comparison.csv"
    if path.is_file():
        for _, row in pd.read_csv(path).iterrows():
            vllm_rows.append({"method": row["Method"], "gpu": gpu_stem(str(row["Hardware"]), hardware_dir),
                              "model": row["Model"], "trace": f"vllm_{row['Workload']}",
                              "pred_total_ms": float(row["pred_e2e_ms"])})
    else:
        notes.append("vllm_comparison.csv absent: no artifact vLLM columns")
    return pd.DataFrame(static_rows), pd.DataFrame(vllm_rows), notes


def _roofline_for_row(run, pred_row, workload_dir: Path, hardware_dir: Path) -> dict | None:
    """Roofline summary of a measured run: on the predicted workload file (communication copied from the
    prediction), or — without a prediction — on the workload the batch scripts use for it (FA3 prefill on Hopper,
    FA2 elsewhere), with the GPU's own collective models."""
    if pred_row is not None:
        workload_path = Path(workload_dir) / f"{pred_row['workload']}.json"
        if not workload_path.is_file():
            return None
        prediction = json.loads(Path(pred_row["path"]).read_text())
        return roofline_prediction(workload_path, pred_row["gpu"], prediction, hardware_dir)["summary"]
    hopper = hardware_registry(Path(hardware_dir)).get(run["gpu"]).architecture == "hopper"
    fa = "fa3" if hopper or run["kind"] == "vllm" else "fa2"
    stem = f"{run['model']}_{run['trace']}_{fa}_tp{run['tp']}_pp{run['pp']}"
    workload_path = Path(workload_dir) / f"{stem}.json"
    if not workload_path.is_file():
        return None
    return roofline_prediction(workload_path, run["gpu"], None, hardware_dir, own_collectives=True)["summary"]


def compare(real: pd.DataFrame, preds: pd.DataFrame, kind: str = "static", *, roofline: bool = True,
            baselines: pd.DataFrame | None = None, workload_dir: Path = DEFAULT_WORKLOAD_DIR,
            hardware_dir: Path = DEFAULT_HARDWARE_DIR) -> pd.DataFrame:
    """One row per measured run of ``kind``, with this project's prediction (if any), roofline and artifact columns.

    Predictions are matched on (GPU, TP, PP, model, trace). ``err_*`` are |pred − median| / median in %.
    """
    runs = real[real["kind"] == kind].sort_values(["gpu", "tp", "model", "trace"], kind="stable")
    metrics = METRICS if kind == "static" else ("total",)
    rows = []
    for _, run in runs.iterrows():
        row = {k: run[k] for k in ("gpu", "tp", "pp", "model", "trace", "repeats")}
        for metric in metrics:
            for stat in ("median", "min", "max"):
                row[f"real_{metric}_{stat}_ms"] = run[f"{metric}_ms_{stat}"]
        match = preds[(preds["gpu"] == run["gpu"]) & (preds["tp"] == run["tp"]) & (preds["pp"] == run["pp"])
                      & (preds["model"] == run["model"]) & (preds["trace"] == run["trace"])] if len(preds) else preds
        if len(match) > 1:  # both attention families predicted: keep the one of this GPU's family
            hopper = hardware_registry(Path(hardware_dir)).get(run["gpu"]).architecture == "hopper"
            preferred = match[match["fa"] == ("fa3" if hopper else "fa2")]
            match = preferred if len(preferred) else match
        pred = match.iloc[0] if len(match) else None
        row["fa"] = pred["fa"] if pred is not None else ""
        for metric in metrics:
            value = pred[f"pred_{metric}_ms"] if pred is not None else np.nan
            row[f"pred_{metric}_ms"] = value
            row[f"err_{metric}_pct"] = float(ape(value, run[f"{metric}_ms_median"]))
        row["err_mean_pct"] = float(np.mean([row[f"err_{m}_pct"] for m in metrics]))
        if roofline:
            summary = _roofline_for_row(run, pred, workload_dir, hardware_dir)
            keys = {"prefill": "prefill_duration_ms", "decode": "decode_avg_duration_ms", "total": "total_duration_ms"}
            for metric in metrics:
                value = summary[keys[metric]] if summary else np.nan
                row[f"roofline_{metric}_ms"] = value
                row[f"roofline_err_{metric}_pct"] = float(ape(value, run[f"{metric}_ms_median"]))
            row["roofline_err_mean_pct"] = float(np.mean([row[f"roofline_err_{m}_pct"] for m in metrics]))
        if baselines is not None and len(baselines):
            for method in sorted(set(baselines["method"]), key=lambda m: (ARTIFACT_METHODS + (m,)).index(m)):
                sel = baselines[(baselines["method"] == method) & (baselines["gpu"] == run["gpu"])
                                & (baselines["model"] == run["model"]) & (baselines["trace"] == run["trace"])]
                if kind == "static":
                    sel = sel[(sel["tp"] == run["tp"]) & (sel["pp"] == run["pp"])]
                errors = []
                for metric in metrics:
                    # only the re-scored errors are kept: the artifact's prediction values themselves are not
                    # copied into our outputs (shared-data usage rule: derived figures only)
                    value = float(sel.iloc[0][f"pred_{metric}_ms"]) if len(sel) else np.nan
                    error = float(ape(value, run[f"{metric}_ms_median"]))
                    row[f"artifact_{method}_err_{metric}_pct"] = error
                    errors.append(error)
                finite = [e for e in errors if np.isfinite(e)]
                row[f"artifact_{method}_err_mean_pct"] = float(np.mean(finite)) if finite else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


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


# ==================================================================================================
# rendering
# ==================================================================================================

def _fmt(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "—"
    return f"{value:,.{digits}f}"


def markdown_static(table: pd.DataFrame) -> str:
    lines = ["| GPU | TP | model | trace | n | measured prefill / decode / total ms (median) | PipeWeave pred "
             "prefill / decode / total ms | err prefill / decode / total % | **mean err %** | roofline mean err % | "
             "artifact PipeWeave mean err % |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(
            f"| {r['gpu']} | {r['tp']} | {r['model']} | {r['trace']} | {r['repeats']} | "
            f"{_fmt(r['real_prefill_median_ms'])} / {_fmt(r['real_decode_median_ms'], 2)} / "
            f"{_fmt(r['real_total_median_ms'])} | "
            f"{_fmt(r['pred_prefill_ms'])} / {_fmt(r['pred_decode_ms'], 2)} / {_fmt(r['pred_total_ms'])} | "
            f"{_fmt(r['err_prefill_pct'])} / {_fmt(r['err_decode_pct'])} / {_fmt(r['err_total_pct'])} | "
            f"**{_fmt(r['err_mean_pct'])}** | {_fmt(r.get('roofline_err_mean_pct', np.nan))} | "
            f"{_fmt(r.get('artifact_pipeweave_err_mean_pct', np.nan))} |")
    return "\n".join(lines)


def markdown_methods(table: pd.DataFrame) -> str:
    """Per-run mean error of every method side by side."""
    methods = [("PipeWeave", "err_mean_pct"), ("roofline", "roofline_err_mean_pct")]
    methods += [(f"artifact {m}", f"artifact_{m}_err_mean_pct") for m in ARTIFACT_METHODS
                if f"artifact_{m}_err_mean_pct" in table]
    methods = [(label, col) for label, col in methods if col in table]
    lines = ["| GPU | TP | model | trace | " + " | ".join(label for label, _ in methods) + " |",
             "|---|---|---|---|" + "---|" * len(methods)]
    for _, r in table.iterrows():
        lines.append(f"| {r['gpu']} | {r['tp']} | {r['model']} | {r['trace']} | "
                     + " | ".join(_fmt(r[col]) for _, col in methods) + " |")
    return "\n".join(lines)


def markdown_vllm(table: pd.DataFrame) -> str:
    ours = [(label, col) for label, col in (("PipeWeave", "pred_total_ms"), ("roofline", "roofline_total_ms"))
            if col in table]
    artifact = [(f"artifact {m} err %", f"artifact_{m}_err_total_pct") for m in ARTIFACT_METHODS
                if f"artifact_{m}_err_total_pct" in table]
    lines = ["| GPU | TP×PP | model | trace | n | measured total ms (median) | "
             + " | ".join(f"{label} ms (err %)" for label, _ in ours)
             + "".join(f" | {label}" for label, _ in artifact) + " |",
             "|---|---|---|---|---|---|" + "---|" * (len(ours) + len(artifact))]
    for _, r in table.iterrows():
        cells = []
        for _, col in ours:
            err = float(ape(r[col], r["real_total_median_ms"]))
            cells.append(f"{_fmt(r[col])} ({_fmt(err)})")
        cells += [_fmt(r[col]) for _, col in artifact]
        lines.append(f"| {r['gpu']} | {r['tp']}×{r['pp']} | {r['model']} | {r['trace']} | {r['repeats']} | "
                     f"{_fmt(r['real_total_median_ms'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_summary(summary: list[dict], metrics: Sequence[str] = METRICS) -> str:
    cols = [m for m in metrics]
    lines = ["| method | runs | " + " | ".join(f"mean {m} err %" for m in cols) + " | **mean err %** | worst err % "
             "(run) |", "|---|---|" + "---|" * len(cols) + "---|---|"]
    for s in summary:
        lines.append(f"| {s['method']} | {s['runs']} | " + " | ".join(_fmt(s.get(m, np.nan)) for m in cols)
                     + f" | **{_fmt(s['mean'])}** | {_fmt(s['worst'])} ({s['worst_run']}) |")
    return "\n".join(lines)


def plot(static: pd.DataFrame | None, vllm: pd.DataFrame | None, path: str | Path) -> Path:
    """Predicted vs measured (median) for every metric, log-log, one colour per GPU; PipeWeave filled markers,
    this project's roofline hollow ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = [t for t in (static, vllm) if t is not None and len(t)]
    gpus = sorted({g for t in frames for g in t["gpu"]})
    colours = {g: plt.get_cmap("tab10" if len(gpus) <= 10 else "tab20")(i) for i, g in enumerate(gpus)}
    markers = {"prefill": "o", "decode": "s", "total": "^"}
    fig, ax = plt.subplots(figsize=(7, 6))
    values = []
    for table, metrics, suffix in ((static, METRICS, ""), (vllm, ("total",), " (vLLM)")):
        if table is None or not len(table):
            continue
        for metric in metrics:
            real = table[f"real_{metric}_median_ms"].to_numpy(np.float64)
            for prefix, filled in (("pred", True), ("roofline", False)):
                if f"{prefix}_{metric}_ms" not in table:
                    continue
                pred = table[f"{prefix}_{metric}_ms"].to_numpy(np.float64)
                ok = np.isfinite(pred) & np.isfinite(real) & (pred > 0) & (real > 0)
                for gpu in gpus:
                    sel = ok & (table["gpu"].to_numpy() == gpu)
                    if not sel.any():
                        continue
                    style = ({"color": colours[gpu], "edgecolors": "black", "linewidths": 0.3} if filled else
                             {"facecolors": "none", "edgecolors": colours[gpu], "linewidths": 0.9})
                    ax.scatter(real[sel], pred[sel], marker="*" if suffix else markers[metric],
                               s=(70 if suffix else 36) * (1 if filled else 0.7), **style)
                    values.extend(real[sel].tolist() + pred[sel].tolist())
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1)
        ax.plot([lo, hi], [lo * 1.2, hi * 1.2], color="grey", lw=0.6, ls="--")
        ax.plot([lo, hi], [lo / 1.2, hi / 1.2], color="grey", lw=0.6, ls="--")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured latency, median of repetitions (ms)")
    ax.set_ylabel("predicted latency (ms): PipeWeave filled, roofline hollow")
    ax.set_title("End-to-end latency: predicted vs measured")
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], marker="o", ls="", color=colours[g], label=g) for g in gpus]
    handles += [Line2D([], [], marker=m, ls="", color="black", markerfacecolor="white", label=k)
                for k, m in markers.items()]
    if vllm is not None and len(vllm):
        handles.append(Line2D([], [], marker="*", ls="", color="black", markerfacecolor="white", label="total (vLLM)"))
    handles.append(Line2D([], [], color="grey", ls="--", label="±20 %"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", ncol=2)
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return path


def table_csv(table: pd.DataFrame) -> str:
    out = table.copy()
    for column in out.columns:
        if column.endswith("_ms"):
            out[column] = out[column].map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
        elif column.endswith("_pct"):
            out[column] = out[column].map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    return out.to_csv(index=False, lineterminator="\n")


def latest_model_dirs(model_dir: Path) -> dict[str, str]:
    """The model directory the aggregator uses per kernel operator (those that have one)."""
    from pipeweave.mlp import latest_model_dir

    out = {}
    for op in (operator.key for operator in workload_operators().values()):
        try:
            directory = latest_model_dir(model_dir, op)
        except FileNotFoundError:
            continue
        out[op] = str(directory.relative_to(REPO_ROOT) if directory.is_relative_to(REPO_ROOT) else directory)
    return out


def document(static: pd.DataFrame, vllm: pd.DataFrame | None, plot_path: Path | None, markdown_path: Path,
             notes: list[str], real_source: str, pred_dir: Path, model_dir: Path) -> str:
    """docs/E2E.md: the tables, mean/worst errors, baselines, plot and what was fitted on what."""
    rel = lambda p: os.path.relpath(p, markdown_path.parent)  # noqa: E731
    models = latest_model_dirs(model_dir)
    measured_static = int(len(static))
    predicted_static = int(np.isfinite(static["pred_total_ms"].to_numpy(np.float64)).sum()) if len(static) else 0
    parts = [
        "# End-to-end latency: predicted vs measured",
        "",
        "Generated by `python3 compare_pred_real.py --markdown docs/E2E.md` (do not edit by hand). Predictions: "
        f"`{os.path.relpath(pred_dir, REPO_ROOT)}/` (written by `./tp1.sh`, `./tp2.sh`, `./tp4.sh`, `./tp8.sh`, "
        "`./vllm_tp4_pp2.sh`). Measured runs: "
        f"{real_source}.",
        "",
        "**Error metric.** |predicted − median(measured)| / median(measured), per metric: prefill, decode per step "
        "(predicted mean decode step vs measured median step latency) and total; *mean err* is the mean of the "
        "three. The reference value is the median over the repetitions for every method — not the repetition "
        "closest to each prediction, as the artifact's scripts did (METHOD.md §11.4 item 25); the artifact's "
        "published predictions are therefore re-scored here and their errors differ from those in its CSVs.",
        "",
        "**What was fitted on what.** Nothing in these predictions was fitted on end-to-end measurements: the only "
        "learned parts are the per-operator efficiency MLPs (trained on operator benchmark data, `train_mlp.py`) "
        "and the collective-communication models (trained on collective sweeps, `train_collective_rf.py`). No "
        "per-iteration overhead, launch latency or calibration factor is fitted, so every run below is an "
        "out-of-sample evaluation of the end-to-end path. Kernel models in `mlp_models/` at generation time: "
        + (", ".join(f"{op} `{path}`" for op, path in models.items()) if models else "**none**") + ".",
        "",
        "**Choices made after seeing these runs (disclosed, not fitted).** Two data choices were revised after a "
        "first comparison on these same runs, each for a reason that does not depend on them: (1) collective "
        "models prefer GPU-time sweeps (nccl-tests, Vidur's kineto times) over PipeWeave's host-timed sweeps, whose "
        "20-55 µs per-call host overhead overlaps GPU work under CUDA graphs (`pipeweave/collectives.py`); (2) the BF16 GEMM dataset "
        "includes the FP8 GEMM measurements of GPUs that have no BF16 data (H20, H800) in cycle space "
        "(`dataset/build.py`). Before both changes the static-batch mean error was 13.5 % (H100 TP2 decode "
        "20-38 % too slow, H20 prefill 36-54 % too slow). No number was tuned against these runs.",
        "",
        "**Baselines.** *Roofline (this project)*: every kernel at max(FLOPs / peak BF16 tensor rate, bytes / peak "
        "DRAM bandwidth) from the hardware JSON peaks and this project's FLOP/byte counts, communication identical "
        "to the PipeWeave prediction beside it (for a run without a prediction: the GPU's own collective models, "
        "as the batch scripts use them; see `pipeweave/compare.py`). *Artifact* columns: the published "
        "predictions of the PipeWeave artifact (github.com/zksainx/pipeweave @ 55e0317, Apache-2.0, "
        "`e2e/<method>_comparison.csv`, prediction columns only; shared copies filtered to the GPUs with "
        "measurements), errors recomputed against the same medians. The artifact's roofline has no decode "
        "prediction (schema mismatch, METHOD.md §8.1): its mean is over prefill and total only.",
        "",
    ]
    if predicted_static < measured_static:
        parts += [f"**Coverage.** {predicted_static} of {measured_static} measured static-batch runs have a "
                  "prediction in the prediction directory; runs without one show — and are left out of the "
                  "means.", ""]
    parts += ["## Static batches (prefill + lock-step decode)", "", "### Summary", "",
              markdown_summary(error_summary(static)) if len(static) else "(no measured runs)", "",
              "### Per run", "", markdown_static(static) if len(static) else "", "",
              "### Mean error per run, all methods (%)", "", markdown_methods(static) if len(static) else "", ""]
    if vllm is not None and len(vllm):
        parts += ["## vLLM, Llama-3.1-70B TP4 × PP2 (total latency)", "",
                  "Compared on total latency only (the vLLM benchmark reports end-to-end latency). The workloads are "
                  "static batches that run all 80 layers serially plus one stage-boundary transfer (METHOD.md "
                  "§6.5). H800's 4-GPU all-reduce has no measurement (its only sweep is 8 GPUs), so "
                  "`vllm_tp4_pp2.sh` uses the documented analytical estimate for it (`--collective_estimate "
                  "analytical`); its send/recv is measured.", "",
                  markdown_summary(error_summary(vllm), ("total",)), "", markdown_vllm(vllm), ""]
    if plot_path is not None:
        parts += ["## Plot", "", f"![predicted vs measured]({rel(plot_path)})", "",
                  f"`{rel(plot_path)}`: predicted vs measured (median), log axes, one colour per GPU; filled markers "
                  "PipeWeave, hollow markers the roofline baseline; circles prefill, squares decode step, triangles "
                  "total, stars vLLM total; dashed lines ±20 %.", ""]
    if notes:
        parts += ["## Notes", ""] + [f"* {n}" for n in notes] + [""]
    return "\n".join(parts)


# ==================================================================================================
# command lines
# ==================================================================================================

def _common_parser(prog: str, description: str) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=description)
    parser.add_argument("--pred_dir", default=str(DEFAULT_PRED_DIR), help="aggregator outputs (e2e/pipeweave_pred)")
    parser.add_argument("--real_dir", default=str(DEFAULT_REAL_DIR),
                        help="measured runs: our summary CSV (e2e/real/measured_runs.csv) or a directory with the "
                             "artifact's e2e_*.jsonl / vllm_*.json files (default e2e/real)")
    parser.add_argument("--baselines_dir", default=None,
                        help="the artifact's *_comparison.csv (default: $PIPEWEAVE_SHARED_DATA/pipeweave/e2e/"
                             "baselines; skipped with a note when absent)")
    parser.add_argument("--workload_dir", default=str(DEFAULT_WORKLOAD_DIR), help="workload JSONs (for the roofline)")
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR))
    parser.add_argument("--no_roofline", action="store_true", help="skip the roofline baseline")
    return parser


def _inputs(args, kind: str):
    hardware_dir = Path(args.hardware_dir)
    real = load_real(args.real_dir, hardware_dir)
    preds = load_predictions(args.pred_dir, hardware_dir)
    baselines_dir = Path(args.baselines_dir) if args.baselines_dir else artifact_baselines_dir()
    static_base, vllm_base, notes = read_artifact_baselines(baselines_dir, hardware_dir)
    if not len(preds):
        shown = os.path.relpath(args.pred_dir, REPO_ROOT) if Path(args.pred_dir).resolve().is_relative_to(
            REPO_ROOT) else args.pred_dir
        notes.insert(0, f"no PipeWeave predictions in {shown}: run the batch scripts (./tp1.sh, ./tp2.sh, "
                        "./tp4.sh, ./tp8.sh, ./vllm_tp4_pp2.sh) once trained models are in mlp_models/; only the "
                        "baselines are shown")
    return real, preds, static_base, vllm_base, notes, hardware_dir


def _real_source(real_dir: str) -> str:
    path = Path(real_dir)
    if list(path.glob("e2e_*.jsonl")) or list(path.glob("vllm_*.json")):
        return f"the artifact's files in `{path}` ({SOURCE_CITATION})"
    return f"`{os.path.relpath(path, REPO_ROOT)}/{REAL_SUMMARY_NAME}` (this project's summary of the {SOURCE_CITATION})"


def main_static(argv: list[str] | None = None) -> int:
    parser = _common_parser("compare_pred_real.py", "Compare static-batch predictions with measured runs "
                                                    "(median of the repetitions), roofline and artifact baselines.")
    parser.add_argument("--output", default=str(REPO_ROOT / "e2e" / "pipeweave_comparison.csv"), help="output CSV")
    parser.add_argument("--plot", default=str(REPO_ROOT / "e2e" / "pipeweave_comparison.png"), help="output PNG")
    parser.add_argument("--markdown", default=None,
                        help="also write the full report (static and vLLM tables, summary, plot, notes), e.g. "
                             "docs/E2E.md")
    parser.add_argument("--model_dir", default=str(REPO_ROOT / "mlp_models"),
                        help="only used to name the kernel models in the report")
    args = parser.parse_args(argv)
    real, preds, static_base, vllm_base, notes, hardware_dir = _inputs(args, "static")
    roofline = not args.no_roofline
    static = compare(real, preds, "static", roofline=roofline, baselines=static_base,
                     workload_dir=Path(args.workload_dir), hardware_dir=hardware_dir)
    vllm = compare(real, preds, "vllm", roofline=roofline, baselines=vllm_base,
                   workload_dir=Path(args.workload_dir), hardware_dir=hardware_dir)
    if not len(static):
        raise UserError(f"no static-batch measured runs in {args.real_dir}")
    write_atomically(args.output, lambda tmp: tmp.write_text(table_csv(static)))
    plot_path = plot(static, vllm, args.plot)
    print(markdown_summary(error_summary(static)))
    print()
    print(markdown_static(static))
    missing = static[~np.isfinite(static["pred_total_ms"].to_numpy(np.float64))]
    if len(preds):  # (with no predictions at all, _inputs already says so once)
        for _, r in missing.iterrows():
            notes.append(f"no prediction for measured run {r['gpu']} TP{r['tp']} {r['model']} {r['trace']}")
    for note in notes:
        print(f"note: {note}")
    print(f"\nWrote {args.output} and {plot_path}")
    if args.markdown:
        md_path = Path(args.markdown)
        text = document(static, vllm, plot_path, md_path.resolve(), notes, _real_source(args.real_dir),
                        Path(args.pred_dir), Path(args.model_dir))
        write_atomically(md_path, lambda tmp: tmp.write_text(text))
        print(f"Wrote {md_path}")
    return 0


def main_vllm(argv: list[str] | None = None) -> int:
    parser = _common_parser("compare_vllm_pred_real.py", "Compare the vLLM TP4xPP2 predictions (total latency) with "
                                                         "the median of the measured latencies.")
    parser.add_argument("--output", default=str(REPO_ROOT / "e2e" / "vllm_comparison.csv"), help="output CSV")
    parser.add_argument("--plot", default=str(REPO_ROOT / "e2e" / "vllm_comparison.png"), help="output PNG")
    parser.add_argument("--markdown", default=None, help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    real, preds, _, vllm_base, notes, hardware_dir = _inputs(args, "vllm")
    vllm = compare(real, preds, "vllm", roofline=not args.no_roofline, baselines=vllm_base,
                   workload_dir=Path(args.workload_dir), hardware_dir=hardware_dir)
    if not len(vllm):
        raise UserError(f"no vLLM measured runs in {args.real_dir}")
    write_atomically(args.output, lambda tmp: tmp.write_text(table_csv(vllm)))
    plot_path = plot(None, vllm, args.plot)
    text = markdown_summary(error_summary(vllm), ("total",)) + "\n\n" + markdown_vllm(vllm)
    print(text)
    for note in notes:
        print(f"note: {note}")
    print(f"\nWrote {args.output} and {plot_path}")
    if args.markdown:
        write_atomically(args.markdown, lambda tmp: tmp.write_text(text + "\n"))
        print(f"Wrote {args.markdown}")
    return 0


def main_summarize(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python3 -m pipeweave.compare summarize-real",
                            description="Summarise the artifact's measured runs into this project's CSV "
                                        "(median, min, max over the repetitions).")
    parser.add_argument("--source", default=None,
                        help="directory with e2e_*.jsonl / vllm_*.json (default $PIPEWEAVE_SHARED_DATA/pipeweave/"
                             "e2e/real)")
    parser.add_argument("--output", default=str(DEFAULT_REAL_DIR / REAL_SUMMARY_NAME))
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR))
    args = parser.parse_args(argv)
    source = Path(args.source) if args.source else artifact_real_dir()
    if not source.is_dir():
        raise FileNotFoundError(f"measured-run directory not found: {source} (set PIPEWEAVE_SHARED_DATA or --source)")
    repeats = read_artifact_repeats(source, Path(args.hardware_dir))
    if not len(repeats):
        raise UserError(f"no e2e_*.jsonl or vllm_*.json files in {source}")
    summary = summarize_repeats(repeats)
    write_atomically(args.output, lambda tmp: tmp.write_text(format_summary_csv(summary)))
    print(f"Summarised {len(repeats)} repetitions of {len(summary)} runs from {source} -> {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"summarize-real": main_summarize, "static": main_static, "vllm": main_vllm}
    if not argv or argv[0] not in commands:
        raise UserError(f"usage: python3 -m pipeweave.compare {{{','.join(commands)}}} [options]")
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    from pipeweave.cli import run_cli

    sys.exit(run_cli(main))
