"""Predicted vs measured end-to-end latency (docs/METHOD.md §8), with the shape-roofline baseline and the
artifact's published predictions side by side: the logic behind ``compare_pred_real.py`` and
``compare_vllm_pred_real.py``.

Measured runs are read by :mod:`pipeweave.measured_runs`, the baselines computed or read by
:mod:`pipeweave.baselines`, the outputs rendered by :mod:`pipeweave.e2e_report`.

Metrics (fix of docs/METHOD.md §11.4 item 25)
----------------------------------------
The reference compared each prediction with the repetition closest to it (best of 5), which biases the error down
and gives every method a different "measured" value. Here the reference value is the **median over the
repetitions**, the same for every method:

* error = |pred − median(real)| / median(real), per metric: prefill, decode per step (the prediction's mean decode
  step vs the measured median step latency, §11.4 item 26), total; ``mean`` = mean of the three (of those measured);
* vLLM: total vs the median of the 5 ``latencies``.
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
from pipeweave.baselines import ARTIFACT_METHODS, artifact_baselines_dir, read_artifact_baselines, shape_roofline_prediction
from pipeweave.cli import (ArgumentParser, UserError, check_output_path, keep_marked_sections, program_name,
                           require_png, write_atomically)
from pipeweave.e2e_report import (document, markdown_static, markdown_summary, markdown_vllm, non_default_flags, plot,
                                   table_csv)
from pipeweave.measured_runs import (DEFAULT_REAL_DIR, METRICS, REAL_SUMMARY_NAME, SOURCE_CITATION, ape,
                                     artifact_real_dir, error_summary, first_repeated, format_summary_csv, gpu_stem,
                                     load_real, read_artifact_repeats, summarize_repeats)
from pipeweave.paths import DEFAULT_CONFIG_DIR, DEFAULT_MODEL_DIR, DEFAULT_WORKLOAD_DIR, E2E_DIR, WORK_ROOT

DEFAULT_PRED_DIR = E2E_DIR / "pipeweave_pred"


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
#: the generator's suffixes of an expert-parallel or FP8 workload after ``_pp<P>``: no measured run is of one
_VARIANT = re.compile(r"(?:ep\d+|fp8)_.+")


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


def lm_head_layout(prediction_text: str) -> str:
    """How the predicted workload laid out ``lm_head``, from its aggregator output's text: "vocab_parallel" where it
    has the logits' all-gather (vLLM's layout, the generator's default), else "replicated" (the paper's files)."""
    return "vocab_parallel" if '"logits_all_gather"' in prediction_text else "replicated"


def load_predictions(pred_dir: str | Path, hardware_dir: Path = DEFAULT_HARDWARE_DIR,
                     config_dir: Path = DEFAULT_CONFIG_DIR) -> pd.DataFrame:
    """Summaries of every prediction JSON in ``pred_dir`` whose name follows the aggregator's naming."""
    pred_dir = Path(pred_dir)
    if not pred_dir.is_dir():
        raise UserError(f"--pred_dir {pred_dir}: not a directory (the aggregator's outputs, e.g. e2e/pipeweave_pred)")
    names, registry = config_model_names(config_dir), hardware_registry(Path(hardware_dir))
    rows, variants = [], []
    for path in sorted(pred_dir.glob("*.json")):
        parsed = parse_prediction_name(path.stem, names)
        if parsed is None:
            continue
        if _VARIANT.fullmatch(parsed.gpu_tag):
            variants.append(path.name)
            continue
        try:
            text = path.read_text()
            output = json.loads(text)
            summary = output["summary"]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
            raise UserError(f"{path}: not an aggregator output (no summary)") from None
        interval = output.get("interval") if isinstance(output, dict) else None
        gpu = gpu_stem(parsed.gpu_tag, hardware_dir)
        predicted_on = output.get("hardware") if isinstance(output, dict) else None
        if isinstance(predicted_on, str) and predicted_on in registry and registry.get(predicted_on).stem != gpu:
            raise UserError(f"{path}: named for {gpu} but predicted on {predicted_on} (its 'hardware'); rerun the "
                            f"aggregator for {gpu} or rename the file")
        for key in ("prefill_duration_ms", "decode_avg_duration_ms", "total_duration_ms"):
            value = summary.get(key) if isinstance(summary, dict) else None
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value) or value < 0:
                raise UserError(f"{path}: summary.{key} is {value!r}, not a finite duration; "
                                f"rerun the aggregator for this workload")
        rows.append({
            "gpu": gpu, "tp": parsed.tp, "pp": parsed.pp, "model": parsed.model,
            "trace": parsed.trace, "fa": parsed.fa, "workload": parsed.workload_stem, "path": str(path),
            "lm_head_layout": lm_head_layout(text),
            "pred_prefill_ms": float(summary.get("prefill_duration_ms", np.nan)),
            "pred_decode_ms": float(summary.get("decode_avg_duration_ms", np.nan)),
            "pred_total_ms": float(summary.get("total_duration_ms", np.nan)),
            **interval_ends(interval),
        })
    if variants:
        print(f"Note: {len(variants)} prediction(s) of expert-parallel or FP8 workloads left out (no measured run is "
              f"of one): {', '.join(variants[:3])}{', ...' if len(variants) > 3 else ''}")
    preds = pd.DataFrame(rows, columns=["gpu", "tp", "pp", "model", "trace", "fa", "workload", "path",
                                        "lm_head_layout", "pred_prefill_ms", "pred_decode_ms", "pred_total_ms",
                                        *INTERVAL_COLUMNS])
    key = ["gpu", "workload"]
    twice = first_repeated(preds, key)
    if len(twice):  # two names of one GPU (A100, NVIDIA_A100-SXM4-80GB): the comparison would take one silently
        first = twice.iloc[0]
        files = twice["path"].map(lambda p: Path(p).name)
        raise UserError(f"--pred_dir {pred_dir}: {first['workload']} is predicted more than once for {first['gpu']} "
                        f"({', '.join(files)}); keep one prediction per workload and GPU")
    return preds


SUMMARY_KEY = {"prefill": "prefill_duration_ms", "decode": "decode_avg_duration_ms", "total": "total_duration_ms"}
INTERVAL_COLUMNS = tuple(f"pred_{metric}_{end}_ms" for metric in METRICS for end in ("low", "high"))


def interval_ends(interval) -> dict:
    """The ``interval`` block of an output (docs/METHOD.md §7.5) as ``pred_<metric>_{low,high}_ms``; NaN for an
    output written before intervals existed."""
    out = {}
    for metric in METRICS:
        for end in ("low", "high"):
            value = interval.get(end, {}).get(SUMMARY_KEY[metric]) if isinstance(interval, dict) else None
            out[f"pred_{metric}_{end}_ms"] = float(value) if isinstance(value, (int, float)) else np.nan
    return out


# ==================================================================================================
# comparison tables
# ==================================================================================================

def _roofline_for_row(run, pred_row, workload_dir: Path, hardware_dir: Path) -> dict | None:
    """Roofline summary of a measured run: on the predicted workload file (communication copied from the
    prediction), or — without a prediction — on the workload the batch scripts use for it (FA3 prefill on Hopper,
    FA2 elsewhere), with the GPU's own collective models."""
    if pred_row is not None:
        workload_path = Path(workload_dir) / f"{pred_row['workload']}.json"
        if not workload_path.is_file():
            return None
        prediction = json.loads(Path(pred_row["path"]).read_text())
        return shape_roofline_prediction(workload_path, pred_row["gpu"], prediction, hardware_dir)["summary"]
    hopper = hardware_registry(Path(hardware_dir)).get(run["gpu"]).architecture == "hopper"
    fa = "fa3" if hopper or run["kind"] == "vllm" else "fa2"
    stem = f"{run['model']}_{run['trace']}_{fa}_tp{run['tp']}_pp{run['pp']}"
    workload_path = Path(workload_dir) / f"{stem}.json"
    if not workload_path.is_file():
        return None
    return shape_roofline_prediction(workload_path, run["gpu"], None, hardware_dir, own_collectives=True)["summary"]


def mean_error(errors: Sequence[float]) -> float:
    """A run's mean error over the metrics that have one (a metric not measured, or without a prediction, has
    none; NaN if no metric has): a run measured without its decode step is scored on prefill and total, as
    ``compare runs`` scores a user's runs, not left out of the method's mean."""
    finite = [e for e in errors if np.isfinite(e)]
    return float(np.mean(finite)) if finite else np.nan


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
            low, high = ((pred[f"pred_{metric}_low_ms"], pred[f"pred_{metric}_high_ms"]) if pred is not None
                         else (np.nan, np.nan))
            row[f"pred_{metric}_low_ms"], row[f"pred_{metric}_high_ms"] = low, high
            measured = run[f"{metric}_ms_median"]
            # 1 inside, 0 outside, NaN without an interval (or a measurement)
            row[f"in_interval_{metric}"] = (float(low <= measured <= high)
                                            if np.isfinite([low, high, measured]).all() else np.nan)
        row["err_mean_pct"] = mean_error([row[f"err_{m}_pct"] for m in metrics])
        if roofline:
            summary = _roofline_for_row(run, pred, workload_dir, hardware_dir)
            keys = {"prefill": "prefill_duration_ms", "decode": "decode_avg_duration_ms", "total": "total_duration_ms"}
            for metric in metrics:
                value = summary[keys[metric]] if summary else np.nan
                row[f"roofline_{metric}_ms"] = value
                row[f"roofline_err_{metric}_pct"] = float(ape(value, run[f"{metric}_ms_median"]))
            row["roofline_err_mean_pct"] = mean_error([row[f"roofline_err_{m}_pct"] for m in metrics])
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
                row[f"artifact_{method}_err_mean_pct"] = mean_error(errors)
        rows.append(row)
    return pd.DataFrame(rows)


def _prog(command: str, script_flag: str = "") -> str:
    """The command as the user typed it: the script (compare_pred_real.py [--summarize_real]), or the module or
    console script with its subcommand (pipeweave-compare static)."""
    name = program_name()
    return f"{name} {script_flag}".strip() if name.endswith(".py") else f"{name} {command}"


def _common_parser(prog: str, description: str) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=description)
    parser.add_argument("--pred_dir", default=str(DEFAULT_PRED_DIR),
                        help="folder of aggregator outputs <workload>_<GPU>.json (default: e2e/pipeweave_pred)")
    parser.add_argument("--real_dir", default=str(DEFAULT_REAL_DIR),
                        help="folder of the measured runs: our summary measured_runs.csv (e2e/real) or the "
                             "artifact's e2e_*.jsonl / vllm_*.json files (default e2e/real)")
    parser.add_argument("--baselines_dir", default=None,
                        help="the artifact's *_comparison.csv (default: $PIPEWEAVE_SHARED_DATA/pipeweave/e2e/"
                             "baselines; skipped with a note when absent)")
    parser.add_argument("--workload_dir", default=str(DEFAULT_WORKLOAD_DIR), help="workload JSONs, for the roofline (default: workload)")
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR),
                        help="directory of GPU spec JSONs (default: hardware)")
    parser.add_argument("--no_roofline", action="store_true", help="skip the roofline baseline")
    return parser


def check_outputs(args) -> None:
    """Every output path is checked before anything is read or written, so a bad --plot or --markdown never
    follows a written CSV."""
    for flag in ("output", "vllm_output", "plot", "markdown"):
        if getattr(args, flag, None):
            check_output_path(getattr(args, flag), f"--{flag}")
    if getattr(args, "plot", None):
        require_png(args.plot)


def _inputs(args, kind: str):
    hardware_dir = Path(args.hardware_dir)
    if not args.no_roofline and not Path(args.workload_dir).is_dir():  # the roofline columns would all be empty
        raise UserError(f"--workload_dir {args.workload_dir}: not a directory (the roofline needs the workload JSONs; "
                        f"--no_roofline skips it)")
    real = load_real(args.real_dir, hardware_dir)
    preds = load_predictions(args.pred_dir, hardware_dir)
    baselines_dir = Path(args.baselines_dir) if args.baselines_dir else artifact_baselines_dir()
    static_base, vllm_base, notes = read_artifact_baselines(baselines_dir, hardware_dir)
    if not len(preds):
        raise UserError(f"--pred_dir {args.pred_dir}: no prediction files named <workload>_<GPU>.json; run the batch "
                        "scripts (./tp1.sh, ./tp2.sh, ./tp4.sh, ./tp8.sh, ./vllm_tp4_pp2.sh) first")
    return real, preds, static_base, vllm_base, notes, hardware_dir


def _real_source(real_dir: str) -> str:
    path = Path(real_dir)
    if list(path.glob("e2e_*.jsonl")) or list(path.glob("vllm_*.json")):
        return f"the artifact's files in `{path}` ({SOURCE_CITATION})"
    return f"`{os.path.relpath(path, WORK_ROOT)}/{REAL_SUMMARY_NAME}` (this project's summary of the {SOURCE_CITATION})"


def main_static(argv: list[str] | None = None) -> int:
    parser = _common_parser(_prog("static"), "Compare static-batch predictions with measured runs "
                                             "(median of the repetitions), roofline and artifact baselines. "
                                             "With --summarize_real instead: rebuild the measured-run summary "
                                             "e2e/real/measured_runs.csv (compare_pred_real.py "
                                             "--summarize_real --help).")
    parser.add_argument("--output", default=str(E2E_DIR / "pipeweave_comparison.csv"),
                        help="output CSV (default: e2e/pipeweave_comparison.csv)")
    parser.add_argument("--plot", default=str(E2E_DIR / "pipeweave_comparison.png"),
                        help="output PNG (default: e2e/pipeweave_comparison.png)")
    parser.add_argument("--vllm_output", default=str(E2E_DIR / "vllm_comparison.csv"),
                        help="output CSV of the vLLM runs, the table the report shows (default: "
                             "e2e/vllm_comparison.csv, as compare_vllm_pred_real.py writes it)")
    parser.add_argument("--markdown", default=None,
                        help="also write the full report (static and vLLM tables, summary, plot, notes), e.g. "
                             "docs/E2E.md")
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR),
                        help="only used to name the kernel models in the report (default: mlp_models)")
    args = parser.parse_args(argv)
    check_outputs(args)
    real, preds, static_base, vllm_base, notes, hardware_dir = _inputs(args, "static")
    roofline = not args.no_roofline
    static = compare(real, preds, "static", roofline=roofline, baselines=static_base,
                     workload_dir=Path(args.workload_dir), hardware_dir=hardware_dir)
    vllm = compare(real, preds, "vllm", roofline=roofline, baselines=vllm_base,
                   workload_dir=Path(args.workload_dir), hardware_dir=hardware_dir)
    if not len(static):
        raise UserError(f"no static-batch measured runs in {args.real_dir}")
    write_atomically(args.output, lambda tmp: tmp.write_text(table_csv(static)))
    # the report shows this table: its CSV (docs/PAPER.md reads it) must be of the same predictions
    vllm_predicted = bool(len(vllm)) and bool(np.isfinite(vllm["pred_total_ms"].to_numpy(np.float64)).any())
    if vllm_predicted:
        write_atomically(args.vllm_output, lambda tmp: tmp.write_text(table_csv(vllm)))
    plot_path = plot(static, vllm, args.plot)
    print(markdown_summary(error_summary(static)))
    print()
    print(markdown_static(static))
    missing = static[~np.isfinite(static["pred_total_ms"].to_numpy(np.float64))]
    for _, r in missing.iterrows():
        notes.append(f"no prediction for measured run {r['gpu']} TP{r['tp']} {r['model']} {r['trace']}")
    for note in notes:
        print(f"note: {note}")
    print(f"\nWrote {args.output}{f', {args.vllm_output}' if vllm_predicted else ''} and {plot_path}")
    if args.markdown:
        md_path = Path(args.markdown)
        # a TP1 workload has no lm_head collective in either layout, so only TP > 1 ones tell the layout
        layouts = set(preds.loc[preds["tp"] > 1, "lm_head_layout"]) or {"replicated"}
        text = document(static, vllm, plot_path, md_path.resolve(), notes, _real_source(args.real_dir),
                        Path(args.pred_dir), Path(args.model_dir), layouts.pop() if len(layouts) == 1 else "mixed",
                        non_default_flags(parser, args))
        text = keep_marked_sections(text, md_path)  # e.g. the calibration section (pipeweave.calibration_e2e)
        write_atomically(md_path, lambda tmp: tmp.write_text(text))
        print(f"Wrote {md_path}")
    return 0


def main_vllm(argv: list[str] | None = None) -> int:
    parser = _common_parser(_prog("vllm"), "Compare the vLLM TP4xPP2 predictions (total latency) with "
                                           "the median of the measured latencies.")
    parser.add_argument("--output", default=str(E2E_DIR / "vllm_comparison.csv"),
                        help="output CSV (default: e2e/vllm_comparison.csv)")
    parser.add_argument("--plot", default=str(E2E_DIR / "vllm_comparison.png"),
                        help="output PNG (default: e2e/vllm_comparison.png)")
    parser.add_argument("--markdown", default=None, help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    check_outputs(args)
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
    parser = ArgumentParser(prog=_prog("summarize-real", "--summarize_real"),
                            description="Summarise the artifact's measured runs into this project's CSV "
                                        "(median, min, max over the repetitions).")
    parser.add_argument("--source", default=None,
                        help="directory with e2e_*.jsonl / vllm_*.json (default $PIPEWEAVE_SHARED_DATA/pipeweave/"
                             "e2e/real)")
    parser.add_argument("--output", default=str(DEFAULT_REAL_DIR / REAL_SUMMARY_NAME),
                        help=f"summary CSV to write (default: e2e/real/{REAL_SUMMARY_NAME})")
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR),
                        help="directory of GPU spec JSONs (default: hardware)")
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


def main_pred_real(argv: list[str] | None = None) -> int:
    """``compare_pred_real.py``: the static comparison, or with ``--summarize_real`` the measured-run summary."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--summarize_real" in argv:
        argv.remove("--summarize_real")
        return main_summarize(argv)
    return main_static(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from pipeweave.run_scores import main as main_runs

    commands = {"summarize-real": main_summarize, "static": main_static, "vllm": main_vllm, "runs": main_runs}
    usage = f"usage: {program_name()} {{{','.join(commands)}}} [options] (each command has --help)"
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    if not argv or argv[0] not in commands:
        raise UserError(usage)
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    from pipeweave.cli import run_cli

    sys.exit(run_cli(main))
