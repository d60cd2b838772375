"""python3 -m pipeweave.accuracy: generate docs/ACCURACY.md from the shipped models and the datasets.

Two evaluations, both on data the evaluated model never trained on, both as the error of the
**duration** |t̂ − t| / t:

* shape-held-out: the shipped model (mlp_models/<op>/<latest>/, trained on dataset/<op>_train.csv)
  on dataset/<op>_test.csv, whose shapes are absent from training on every GPU;
* leave-one-GPU-out: for each GPU with data, a model trained with the same recipe on the other GPUs'
  training rows (capped per GPU, see pipeweave.logo_cache), evaluated on every row of the held-out GPU.
  These models are not shipped: they are cached under .cache/logo/ (git-ignored; retrained when the
  dataset changes) and their results per operator in docs/accuracy_logo/<op>.json (``--retrain_logo``
  recomputes them; ``--logo_only`` computes the cache without rendering, so operators can be run in
  parallel processes). The few-shot calibration evaluation (pipeweave.calibration_eval) uses the same models.

Beside them: the feature roofline (max of compute time at the spec peak and DRAM time at the spec
bandwidth, from the same analytical features) and the artifact's own per-GPU figures from its
metadata (errors of overall_perf on its own data, which the artifact reports; they cannot be turned
into duration errors without its per-row predictions, so they are shown as published).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import get_operator, operator_keys
from pipeweave.cli import ArgumentParser, keep_marked_sections, run_cli, write_atomically
from pipeweave.logo_cache import LOGO_EPOCHS, LOGO_MAX_ROWS_PER_GPU, gpus_with_data, logo_predictions
from pipeweave.modeling import dataset_paths, duration_errors, read_dataset
from pipeweave.paths import DATASET_DIR, DOCS_DIR, REPO_ROOT
from pipeweave.moe import pass_choice_errors, render_pass_choice
from pipeweave.predictor import DEFAULT_MODEL_DIR, KernelPredictor

OPS = operator_keys(trainable=True)
ARTIFACT_METADATA = "pipeweave/mlp_models_metadata"


def feature_roofline_us(frame: pd.DataFrame, op: str) -> np.ndarray:
    """The feature roofline (:meth:`OperatorClass.feature_roofline_cycles`: the analytical ideal-cycle and DRAM-cycle
    features at spec peaks) in µs. Not the shape roofline of the end-to-end comparison (:mod:`pipeweave.baselines`)."""
    return get_operator(op).feature_roofline_cycles(frame) / frame["sm_freq"].to_numpy(np.float64)


def error_summary(errors: np.ndarray) -> dict:
    return {"mean": float(np.mean(errors) * 100), "median": float(np.median(errors) * 100), "n": int(len(errors))}


def shape_holdout_results(op: str, predictor: KernelPredictor, dataset_dir: Path) -> dict:
    _, test_path = dataset_paths(op, dataset_dir)
    test = read_dataset(test_path)
    _, metadata, directory = predictor.model(op)
    predicted = predictor.efficiency_from_frame(op, test)
    measured = test["overall_perf"].to_numpy(np.float64)
    model_err = duration_errors(measured, predicted)
    roof_err = np.abs(feature_roofline_us(test, op) / test["avg_duration"].to_numpy(np.float64) - 1)
    out = {"model_dir": str(directory.relative_to(REPO_ROOT)) if directory.is_relative_to(REPO_ROOT) else str(directory), "by_gpu": {}}
    for gpu in sorted(pd.unique(test["hardware"])):
        rows = (test["hardware"] == gpu).to_numpy()
        out["by_gpu"][gpu] = {"model": error_summary(model_err[rows]), "roofline": error_summary(roof_err[rows])}
    out["overall"] = {"model": error_summary(model_err), "roofline": error_summary(roof_err)}
    return out


def logo_results(op: str, dataset_dir: Path, log=print) -> dict:
    """Leave-one-GPU-out errors per GPU, from the cached LOGO models (pipeweave.logo_cache trains missing ones)."""
    out = {}
    gpus = gpus_with_data(op, dataset_dir)
    if len(gpus) < 2:
        return out
    for gpu in gpus:
        test, predicted, history = logo_predictions(op, gpu, dataset_dir, log=log)
        err = duration_errors(test["overall_perf"].to_numpy(np.float64), predicted)
        roof = np.abs(feature_roofline_us(test, op) / test["avg_duration"].to_numpy(np.float64) - 1)
        out[gpu] = {"model": error_summary(err), "roofline": error_summary(roof), "train_rows": history["train_rows"]}
        log(f"  LOGO {op} / {gpu}: mean {out[gpu]['model']['mean']:.2f} %")
    return out


def artifact_figures(shared: Path | None) -> dict:
    """{op: {canonical GPU name: "<mean relative error of overall_perf> %" (* if unseen in its training)}}."""
    if shared is None:
        return {}
    registry = hardware_registry(DEFAULT_HARDWARE_DIR)
    out = {}
    for op in OPS:
        path = shared / ARTIFACT_METADATA / f"{op}.json"
        if not path.is_file():
            continue
        metadata = json.loads(path.read_text())
        by_hw = metadata.get("evaluation_results", {}).get("by_hardware", {})
        trained = set(metadata.get("data_info", {}).get("train_hardware_distribution", {}))
        out[op] = {registry.get(k).name if k in registry else k:
                   f"{v['mean_relative_error'] * 100:.1f}{'' if k in trained else '*'}" for k, v in by_hw.items()}
    return out


def fmt(summary: dict | None) -> str:
    return "—" if not summary else f"{summary['mean']:.1f} / {summary['median']:.1f}"


def render(results: dict, logo: dict, artifact: dict, notes: dict | None = None) -> str:
    """The report; ``notes`` maps an operator to extra markdown lines placed after its table."""
    lines = [
        "# Kernel-level accuracy",
        "",
        "Generated by `python3 -m pipeweave.accuracy` — do not edit by hand.",
        "",
        "Cells are **duration** errors |t̂ − t| / t in %, `mean / median`, on rows the evaluated model never",
        "trained on. *Shape-held-out*: the shipped model on `dataset/<op>_test.csv` (no shape of it is in training,",
        "on any GPU). *LOGO*: leave-one-GPU-out, a model trained with the same recipe on the other GPUs",
        f"(at most {LOGO_MAX_ROWS_PER_GPU} training rows per GPU, {LOGO_EPOCHS} epochs) and tested on every row of",
        "the held-out GPU. *Roofline*: max(compute at spec peak, DRAM traffic at spec bandwidth) from the same",
        "analytical features. *Artifact*: PipeWeave's published per-GPU mean relative error of `overall_perf`",
        "on its own (unpublished) data, as reported in its metadata — an efficiency error on different data,",
        "shown for orientation only (`*` = GPU unseen in its training).",
        "",
    ]
    for op, res in results.items():
        artifact_op = artifact.get(op, {})
        lines += [f"## {op}", "", f"Model: `{res['model_dir']}`", "",
                  "| GPU | n test | shape-held-out | roofline (same rows) | LOGO | LOGO roofline | artifact (efficiency) |",
                  "|---|---|---|---|---|---|---|"]
        for gpu, cell in res["by_gpu"].items():
            lo = logo.get(op, {}).get(gpu, {})
            art = artifact_op.get(gpu)
            lines.append(
                f"| {gpu} | {cell['model']['n']} | {fmt(cell['model'])} | {fmt(cell['roofline'])} | "
                f"{fmt(lo.get('model'))} | {fmt(lo.get('roofline'))} | {art or '—'} |"
            )
        lines.append(f"| **all** | {res['overall']['model']['n']} | {fmt(res['overall']['model'])} | "
                     f"{fmt(res['overall']['roofline'])} | | | |")
        lines.append("")
        lines += (notes or {}).get(op, [])
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python3 -m pipeweave.accuracy", description="Generate docs/ACCURACY.md.")
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"comma list of operator classes to report (default: {','.join(OPS)})")
    parser.add_argument("--model_dir", type=Path, default=DEFAULT_MODEL_DIR,
                        help="root of the shipped models scored on held-out shapes (default: mlp_models)")
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR,
                        help="folder of <op>_{train,test}.csv (default: dataset)")
    parser.add_argument("--output", type=Path, default=DOCS_DIR / "ACCURACY.md",
                        help="markdown report to write (default: docs/ACCURACY.md)")
    parser.add_argument("--logo_cache", type=Path, default=DOCS_DIR / "accuracy_logo",
                        help="directory of per-operator leave-one-GPU-out results (default: docs/accuracy_logo)")
    parser.add_argument("--retrain_logo", action="store_true", help="recompute leave-one-GPU-out models")
    parser.add_argument("--logo_only", action="store_true", help="only compute the leave-one-GPU-out cache")
    args = parser.parse_args(argv)
    from pipeweave.paths import existing_shared_data_dir

    ops = [o for o in args.ops.split(",") if o]
    logo = {}
    for op in ops:
        cache = args.logo_cache / f"{op}.json"
        if args.retrain_logo or not cache.is_file():
            print(f"leave-one-GPU-out for {op} ...")
            result = logo_results(op, args.dataset_dir)
            write_atomically(cache, lambda tmp: tmp.write_text(json.dumps(result, indent=2)))
        logo[op] = json.loads(cache.read_text())
    if args.logo_only:
        return 0
    predictor = KernelPredictor(args.model_dir)
    results = {op: shape_holdout_results(op, predictor, args.dataset_dir) for op in ops}
    notes = {}
    if "moe" in ops:
        test = read_dataset(dataset_paths("moe", args.dataset_dir)[1])
        notes["moe"] = render_pass_choice(pass_choice_errors(test, predictor))
    text = render(results, logo, artifact_figures(existing_shared_data_dir()), notes)
    text = keep_marked_sections(text, args.output)  # e.g. the k-shot section (pipeweave.calibration_eval)
    write_atomically(args.output, lambda tmp: tmp.write_text(text + "\n"))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
