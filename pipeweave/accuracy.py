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
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import REFERENCE_HARNESS, get_operator, operator_keys, source_family
from dataset.aiconfigurator import expert_parallel_moe_rows, routing_proxy_errors, unseen_moe_rows
from pipeweave import memory_model
from pipeweave.bounds import (FLOOR_PERCENTILE, INTENSITY_EDGES, LATENCY_BOUND_ROOF_US, MIN_BIN_ROWS, SIZE_EDGES,
                              clip_efficiency, frame_band_table, frame_l2_cycles, l2_cycles, regime_efficiency)
from pipeweave.cli import (ArgumentParser, keep_marked_sections, run_cli, trainable_operator_list, write_atomically,
                           write_marked_section)
from pipeweave.ensemble import held_out_shapes_of_training_gpus, median_of_members, member_spread_entry
from pipeweave.logo_cache import (DEFAULT_CACHE, LOGO_EPOCHS, LOGO_MAX_ROWS_PER_GPU, gpus_with_data, logo_config,
                                  logo_predictions, logo_seeds, member_model_dirs)
from pipeweave.edges import frame_edges
from pipeweave.mlp import PIPE_SHARES, NumpyMLP, total_efficiency, weights_path, work_efficiency
from pipeweave.modeling import (cap_rows_per_gpu, dataset_paths, duration_errors, fixed_time_us, frame_ideal_us,
                                hold_out, input_names, input_transform, load_splits, network_inputs, read_dataset,
                                train_and_evaluate)
from pipeweave.paths import DATASET_DIR, DOCS_DIR, REPO_ROOT
from pipeweave.moe import (expert_parallel_errors, pass_choice_errors, render_expert_parallel, render_pass_choice,
                           render_unseen_gpu, unseen_gpu_errors)
from pipeweave.predictor import (BEYOND_SHARES, DEFAULT_MODEL_DIR, EXTRAPOLATION_BITS, KernelPredictor,
                                 coverage_codes, disagreement_codes, training_coverage)
from pipeweave.siblings import ModelEfficiency, die_band, die_rows, die_sibling, sibling_band, sibling_scale
from pipeweave.torch_mlp import predict_efficiency
from pipeweave.training import TrainConfig

OPS = operator_keys(trainable=True)
ARTIFACT_METADATA = "pipeweave/mlp_models_metadata"
#: test shapes per operator (fixed seed) predicted on every GPU of hardware/ for the band-binding table
BAND_SAMPLE_ROWS = 1000
BAND_SEED = 0


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


def held_out_groups(gpus: list[str], by: str) -> dict[str, list[str]]:
    """{label: GPUs held out together}: one GPU each (``by="gpu"``) or one architecture each (``"architecture"``;
    only with two or more architectures)."""
    if by == "gpu":
        return {gpu: [gpu] for gpu in gpus} if len(gpus) >= 2 else {}
    registry = hardware_registry(DEFAULT_HARDWARE_DIR)
    groups: dict[str, list[str]] = {}
    for gpu in gpus:
        groups.setdefault(registry.get(gpu).architecture, []).append(gpu)
    return dict(sorted(groups.items())) if len(groups) >= 2 else {}


def other_gpus_band(op: str, dataset_dir: Path, held_out: list[str]) -> dict:
    """The band table (:func:`pipeweave.bounds.band_table`) of every measured row of the GPUs not held out: the
    held-out GPUs' rows never shape the band their predictions are kept in."""
    frame = pd.concat([read_dataset(path) for path in dataset_paths(op, dataset_dir)], ignore_index=True)
    return frame_band_table(op, frame[~frame["hardware"].isin(held_out)])


def as_predicted(op: str, train: pd.DataFrame, test: pd.DataFrame, mlp_efficiency: np.ndarray | None,
                 config: TrainConfig, band: dict, model_efficiency: ModelEfficiency | None = None,
                 model_at: Callable[[float], ModelEfficiency] | None = None) -> np.ndarray:
    """The efficiency the predictor gives rows of GPUs outside the training data: a memory-bound operator takes
    the bandwidth model fitted on ``train`` (capped as the MLP's), an MLP trained on one GPU the median of the
    kernel's regime (``band``), the others their MLP's, kept inside the band of a trained sibling
    (:mod:`pipeweave.siblings`; ``model_efficiency``: the MLP as a function of features and descriptors; ``model_at``:
    the same on a GPU of a given SM clock, for the bound of a trained GPU of the same die); all inside the physical
    band ``band``, which must be derived without the held-out GPUs (:func:`other_gpus_band`): there is no default,
    since the shipped band was fitted on every GPU's rows, the held-out ones' too (RMSNorm with A100 held out scored
    13.9 % inside it, 15.9 % inside the other GPUs'). A memory-bound operator's bandwidth model takes no die bound
    here: no held-out GPU of their data has a trained GPU of its die.
    """
    operator = get_operator(op)
    features = test[list(operator.feature_names)].to_numpy(np.float64)
    described = test[list(operator.descriptor_names)].to_numpy(np.float64)
    sm_freq = test["sm_freq"].to_numpy(np.float64)
    if operator.dram_bound:
        parameters = memory_model.fit_frame(op, cap_rows_per_gpu(train, config.max_rows_per_gpu, config.seed))
        ideal = operator.ideal_cycles(features.astype(np.float32)).astype(np.float64)
        mlp_efficiency = ideal / (memory_model.frame_duration_us(parameters, op, test) * sm_freq)
    elif train["hardware"].nunique() == 1:
        mlp_efficiency = regime_efficiency(op, features, sm_freq, band)
    else:
        mlp_efficiency = sibling_bounded(op, train, test, mlp_efficiency, features, described, model_efficiency,
                                         model_at)
    return clip_efficiency(op, mlp_efficiency, features, described, sm_freq, band, l2=frame_l2_cycles(test))[0]


def sibling_bounded(op: str, train: pd.DataFrame, test: pd.DataFrame, efficiency: np.ndarray, features: np.ndarray,
                    described: np.ndarray, model_efficiency: ModelEfficiency | None,
                    model_at: Callable[[float], ModelEfficiency] | None = None) -> np.ndarray:
    """``efficiency`` of each held-out GPU's rows of ``test`` kept inside the band of its trained sibling, then within
    the pipe-rate ratios of a trained GPU of its die, as :class:`pipeweave.predictor.KernelPredictor` keeps it
    (:func:`pipeweave.siblings.sibling_band`, :func:`pipeweave.siblings.die_band`; ``model_at(sm_freq)``: the model on
    a GPU of that SM clock)."""
    hardware = hardware_registry(DEFAULT_HARDWARE_DIR)
    trained = [hardware.get(name) for name in sorted(train["hardware"].unique())]
    names = test["hardware"].to_numpy()
    efficiency = np.array(efficiency, dtype=np.float64)
    for name in pd.unique(names):
        hw = hardware.get(name)
        rows, scale = np.flatnonzero(names == name), sibling_scale(op, hw, trained)
        if scale is not None:
            if model_efficiency is None:
                raise ValueError(f"{op}: {name} has a trained sibling, so its bound needs the model itself")
            efficiency[rows] = np.clip(efficiency[rows], *sibling_band(op, features[rows], described[rows], scale,
                                                                       model_efficiency))
        die = die_sibling(op, hw, trained)
        if die is not None:
            if model_at is None:
                raise ValueError(f"{op}: {name} has a trained GPU of its die ({die.name}), so its bound needs the "
                                 f"model itself")
            efficiency[rows] = np.clip(efficiency[rows], *die_band(
                op, features[rows], described[rows], hw, die, model_at(die.sm_freq),
                die_rows(op, features[rows], described[rows], hw, die)))
    return efficiency


def logo_mlp(op: str, gpu: str, cache: Path = DEFAULT_CACHE, train: pd.DataFrame | None = None) -> NumpyMLP:
    """The cached LOGO members of ``op`` without ``gpu`` as one model (their median); given its training rows
    ``train``, a pipe-share model is kept inside the monotone bounds of their edges (:mod:`pipeweave.edges`), as
    the predictor keeps the shipped models."""
    members = member_model_dirs(op, gpu, cache)
    model = NumpyMLP.from_members([weights_path(member, op) for member in members], str(members[0].parent.parent))
    if train is not None and model.input_transform == PIPE_SHARES:
        model.edges = frame_edges(op, model.features, train)
    return model


def model_efficiency(op: str, model: NumpyMLP, sm_freq: float) -> ModelEfficiency:
    """``model`` as a function of features and descriptors, on a GPU of SM clock ``sm_freq`` (MHz)."""
    operator = get_operator(op)
    return lambda features, described: model.efficiency(
        operator.input_rows(features, described, model.input_dim, model.source), sm_freq)


def held_out_cell(op: str, test: pd.DataFrame, predicted: np.ndarray, train_rows: int, gpus: list[str]) -> dict:
    """Errors of held-out rows, the roofline's on the same rows, and the worst predicted/measured factor (overall
    and where the roofline is within 1.5x of the measurement)."""
    measured = test["avg_duration"].to_numpy(np.float64)
    err = duration_errors(test["overall_perf"].to_numpy(np.float64), predicted)
    roof_ratio = feature_roofline_us(test, op) / measured
    ratio = test["overall_perf"].to_numpy(np.float64) / predicted  # predicted / measured duration
    worst = np.maximum(ratio, 1 / ratio)
    near = (roof_ratio >= 1 / 1.5) & (roof_ratio <= 1.5)
    return {"model": error_summary(err), "roofline": error_summary(np.abs(roof_ratio - 1)), "train_rows": train_rows,
            "max": float(np.max(err) * 100), "worst_ratio": float(worst.max()),
            "worst_ratio_near_roofline": float(worst[near].max()) if near.any() else None, "gpus": gpus}


def unseen_gpu_results(op: str, gpus: list[str], predictor: KernelPredictor, dataset_dir: Path) -> dict:
    """Zero-shot check of a model that never saw ``gpus`` (e.g. GPUs whose hardware JSON was added after it was
    trained): every row of each GPU (train and test files), as the predictor gives it, inside the band of the
    other GPUs' rows; ``outside_range``: share of rows with an input outside the model's training range."""
    seen = [gpu for gpu in gpus if gpu in predictor.trained_on(op)]
    if seen:
        raise ValueError(f"the {op} model was trained on {', '.join(seen)}: not a zero-shot check")
    frame = pd.concat([read_dataset(path) for path in dataset_paths(op, dataset_dir)], ignore_index=True)
    operator, band, out = get_operator(op), other_gpus_band(op, dataset_dir, gpus), {}
    for gpu in gpus:
        rows = frame[frame["hardware"] == gpu].reset_index(drop=True)
        if rows.empty:
            continue
        hw = predictor.hardware.get(gpu)
        features = rows[list(operator.feature_names)].to_numpy(np.float64)
        described = rows[list(operator.descriptor_names)].to_numpy(np.float64)
        efficiency = predictor.kernel_efficiency(op, features, described, hw, band)
        out[gpu] = held_out_cell(op, rows, efficiency, 0, [gpu])
        codes = predictor.extrapolation(op, features, described, hw.compute_capability)
        out[gpu]["outside_range"] = float(np.mean(codes != 0))
    return out


def logo_as_predicted(op: str, gpu: str, dataset_dir: Path, cache: Path = DEFAULT_CACHE,
                      log=print, band: dict | None = None) -> tuple[pd.DataFrame, np.ndarray, dict]:
    """(every row of ``gpu``, the efficiency the predictor gives them when ``gpu`` is outside training, the LOGO
    model's training history): the cached LOGO model (pipeweave.logo_cache trains a missing one) through
    :func:`as_predicted`, inside the band of the other GPUs' rows (``band``: that table when the caller has it,
    :func:`other_gpus_band`)."""
    train, test, predicted, history = logo_predictions(op, gpu, dataset_dir, cache, log=log)
    if band is None:
        band = other_gpus_band(op, dataset_dir, [gpu])
    operator, efficiency, model_at = get_operator(op), None, None
    if operator.tensor_rate and train["hardware"].nunique() > 1:  # the MLP is used (as_predicted)
        model = logo_mlp(op, gpu, cache, train)
        predicted = model.within_edges(test[model.features].to_numpy(np.float64), predicted,
                                       test["sm_freq"].to_numpy(np.float64))
        efficiency = model_efficiency(op, model, hardware_registry(DEFAULT_HARDWARE_DIR).get(gpu).sm_freq)

        def model_at(sm_freq: float) -> ModelEfficiency:  # on a trained GPU of the held-out GPU's die
            return model_efficiency(op, model, sm_freq)

    return test, as_predicted(op, train, test, predicted, logo_config(), band, efficiency, model_at), history


def logo_results(op: str, dataset_dir: Path, log=print) -> dict:
    """Leave-one-GPU-out errors per GPU, as the predictor gives them on a GPU outside training
    (:func:`logo_as_predicted`)."""
    out = {}
    gpus = gpus_with_data(op, dataset_dir)
    if len(gpus) < 2:
        return out
    for gpu in gpus:
        test, predicted, history = logo_as_predicted(op, gpu, dataset_dir, log=log)
        out[gpu] = held_out_cell(op, test, predicted, history["train_rows"], [gpu])
        log(f"  LOGO {op} / {gpu}: mean {out[gpu]['model']['mean']:.2f} %")
    return out


def loao_results(op: str, dataset_dir: Path, log=print) -> dict:
    """Leave-one-architecture-out errors at the leave-one-GPU-out budget (:func:`pipeweave.logo_cache.logo_config`: an
    architecture of one GPU is that GPU's LOGO split), one model per held-out architecture: for an
    operator that ships as an ensemble, the median of the same seeds' members, as the predictor combines them."""
    config = logo_config()
    out = {}
    for label, held_out in held_out_groups(gpus_with_data(op, dataset_dir), "architecture").items():
        started = time.perf_counter()
        train, test = load_splits(op, dataset_dir, held_out)
        if get_operator(op).dram_bound or train["hardware"].nunique() == 1:  # the MLP is not used (as_predicted)
            predicted, rows = None, len(cap_rows_per_gpu(train, config.max_rows_per_gpu, config.seed))
        else:
            members = [train_and_evaluate(op, train, test, replace(config, seed=seed)) for seed in logo_seeds(op)]
            predicted = median_of_members([member[2] for member in members])
            if input_transform(op, config) == PIPE_SHARES:  # bound in the members' terms (pipeweave.mlp)
                fixed, ideal_us = fixed_time_us(op, config), frame_ideal_us(op, test)
                predicted = total_efficiency(frame_edges(op, input_names(op, config), train).bound(
                    network_inputs(test, op, config), work_efficiency(predicted, ideal_us, fixed),
                    lambda rows: median_of_members([predict_efficiency(member[0], rows) for member in members])),
                    ideal_us, fixed)
            rows = members[0][1]["train_rows"]
        band = other_gpus_band(op, dataset_dir, held_out)
        out[label] = held_out_cell(op, test, as_predicted(op, train, test, predicted, config, band), rows, held_out)
        log(f"  held out {op} / {label}: mean {out[label]['model']['mean']:.2f} % "
            f"({time.perf_counter() - started:.0f} s)")
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


def harness_note() -> list[str]:
    """The header's line on the operators whose model reads the measurement harness (registry ``harness_families``)."""
    reading = [op for op in operator_keys(trainable=True) if get_operator(op).harness_families]
    if not reading:
        return []
    return [f"Rows of {', '.join(reading)} are predicted with their own measurement harness as a model input",
            "(docs/METHOD.md §4.1, harness inputs) in the shape-held-out and LOGO columns; a prediction for a user",
            f"takes {REFERENCE_HARNESS}'s."]


def input_twins(gpus) -> dict[str, list[str]]:
    """{GPU: the other GPUs of ``gpus`` whose model inputs equal its own} (every hardware input of the models,
    ``HARDWARE_SPEC_COLUMNS``: H800 and H100 are one chip), only for GPUs that have one: such a GPU's
    leave-one-GPU-out model trains on its twin's rows, features and all, so its cell is no unseen GPU."""
    from analytical_model.pipes import HARDWARE_SPEC_COLUMNS

    registry = hardware_registry(DEFAULT_HARDWARE_DIR)
    specs = {gpu: tuple(registry.get(gpu).spec_columns()[column] for column in HARDWARE_SPEC_COLUMNS) for gpu in gpus}
    twins = {gpu: sorted(other for other in specs if other != gpu and specs[other] == spec)
             for gpu, spec in specs.items()}
    return {gpu: others for gpu, others in twins.items() if others}


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
        f"(at most {LOGO_MAX_ROWS_PER_GPU} training rows per GPU, {LOGO_EPOCHS} epochs; GEMM, FP8 GEMM, attention and",
        "MoE, which ship as five-seed ensembles, as the same five seeds' median) and tested on every row of",
        "the held-out GPU, scored as the predictor gives it: within the bound of a trained GPU of its SM design (the",
        "tensor-rate sibling) or of its die (the same compute capability and SM count: H100 and H200, B200 and GB200,",
        "B300 and GB300), inside the physical band, and for RMSNorm and SiLU*Mul the bandwidth model fitted on the",
        "other GPUs (their MLP is not used on a GPU outside its training;",
        "docs/METHOD.md §4.3); a cache written before the band (no `worst_ratio` key) is scored without it.",
        *harness_note(),
        "*Roofline*: max(compute at spec peak, DRAM traffic at spec bandwidth) from the same",
        "analytical features. *Artifact*: PipeWeave's published per-GPU mean relative error of `overall_perf`",
        "on its own (unpublished) data, as reported in its metadata — an efficiency error on different data,",
        "shown for orientation only (`*` = GPU unseen in its training). *LOGO worst factor*: the largest factor",
        "between the LOGO-predicted and the measured duration (either way), over all rows of the held-out GPU and",
        "over its rows where the roofline is within 1.5x of the measured duration (— : no such row); the targets",
        "ask for at most 3x on the latter.",
        "",
    ]
    for op, res in results.items():
        artifact_op = artifact.get(op, {})
        lines += [f"## {op}", "", f"Model: `{res['model_dir']}`", "",
                  ("| GPU | n test | shape-held-out | roofline (same rows) | LOGO | LOGO roofline | LOGO worst factor "
                   "(all / roofline ≤ 1.5x) | artifact (efficiency) |"),
                  "|---|---|---|---|---|---|---|---|"]
        twins = input_twins(res["by_gpu"])
        for gpu, cell in res["by_gpu"].items():
            lo = logo.get(op, {}).get(gpu, {})
            art = artifact_op.get(gpu)
            mark = " †" if gpu in twins and lo.get("model") else ""
            lines.append(
                f"| {gpu} | {cell['model']['n']} | {fmt(cell['model'])} | {fmt(cell['roofline'])} | "
                f"{fmt(lo.get('model'))}{mark} | {fmt(lo.get('roofline'))} | {worst_factors(lo)} | {art or '—'} |"
            )
        lines.append(f"| **all** | {res['overall']['model']['n']} | {fmt(res['overall']['model'])} | "
                     f"{fmt(res['overall']['roofline'])} | | | | |")
        marked = [gpu for gpu in twins if logo.get(op, {}).get(gpu, {}).get("model")]
        if marked:
            lines += ["", "† Not an unseen GPU: " + "; ".join(
                f"{gpu}'s model inputs equal {' and '.join(twins[gpu])}'s (the same chip), whose rows its "
                f"leave-one-GPU-out model trained on" for gpu in marked)
                + ". Leave-one-architecture-out holds them out together."]
        lines.append("")
        lines += (notes or {}).get(op, [])
    return "\n".join(lines)


def band_binding(op: str, predictor: KernelPredictor, dataset_dir: Path) -> dict:
    """{GPU: (% of the sampled test shapes whose unbounded predicted efficiency the floor binds, % the ceiling
    binds, % the trained sibling's band binds or None without a sibling)} on every GPU of the hardware directory,
    measured or not (the bands matter most where the model extrapolates)."""
    from analytical_model.registry import compute_features

    operator = get_operator(op)
    test = read_dataset(dataset_paths(op, dataset_dir)[1])
    shapes = test[list(operator.shape_columns)].drop_duplicates()
    shapes = shapes.sample(n=min(BAND_SAMPLE_ROWS, len(shapes)), random_state=BAND_SEED).reset_index(drop=True)
    out = {}
    for stem in predictor.hardware.known():
        hw = predictor.hardware.get(stem)
        frame = shapes.assign(hardware=stem)
        try:
            features = compute_features(op, frame, predictor.hardware_dir)
        except ValueError:  # no calculator for this GPU's architecture (e.g. FP8 GEMM before Ada)
            continue
        pipes = features[list(operator.feature_names)].to_numpy(np.float64)
        described = features[list(operator.descriptor_names)].to_numpy(np.float64)
        raw = predictor.unbounded_efficiency(op, pipes, described, hw)
        _, side = clip_efficiency(op, raw, pipes, described, hw.sm_freq, l2=l2_cycles(hw))
        sibling = None
        if predictor.sibling_scale(op, hw) is not None:  # the tensor-rate band alone, not the same-die bound after it
            banded = predictor._untuned(op, pipes, described, hw)[0]
            sibling = float(np.mean(banded != predictor.efficiency_from_features(op, pipes, described, hw.sm_freq))
                            * 100)
        out[hw.name] = (float(np.mean(side < 0) * 100), float(np.mean(side > 0) * 100), sibling)
    return out


def render_band(binding: dict, trained: dict) -> str:
    ops = list(binding)
    gpus = sorted({gpu for cells in binding.values() for gpu in cells})
    lines = [
        "## Physical band: how often it binds",
        "",
        "Generated by `python3 -m pipeweave.accuracy` (section `bounds`). Every predicted efficiency is kept inside",
        "the band of `pipeweave.bounds` (docs/METHOD.md §4.3): ceiling = the unpadded work at spec peak, the bytes at",
        "spec DRAM bandwidth where they spill the L2 (RMSNorm and SiLU*Mul: their reads always), for GEMM,",
        "attention and MoE the fastest speed measured at their bytes' share of the L2, and the shortest measured",
        "duration; floor = conditional on the kernel's",
        "regime: t ≤ L + R / floor, with R the feature roofline time, L the operator's latency allowance (the",
        f"{100 - FLOOR_PERCENTILE:g}th percentile of t − R over its kernels with R < {LATENCY_BOUND_ROOF_US:g} µs)",
        f"and floor the {FLOOR_PERCENTILE}th percentile of the measured R / (t − L) over all GPUs in the same",
        f"bin of log10(R / µs) (edges {', '.join(f'{e:g}' for e in SIZE_EDGES)}) and log10(C_ideal / C_dram) (edges",
        f"{', '.join(f'{e:g}' for e in INTENSITY_EDGES)}); a bin under {MIN_BIN_ROWS} rows takes its size row's",
        "percentile, a size row under it the nearest measured row's; R / floor is interpolated between the bins'",
        "centres and made non-decreasing in R and intensity, and never below the fastest time physics allows",
        "(`pipeweave/efficiency_band.json`, docs/METHOD.md §4.3).",
        f"Cells: % of {BAND_SAMPLE_ROWS} test shapes per operator (fixed sample) where the predicted efficiency (the",
        "shipped MLP's, or on a GPU outside its training the bandwidth model's for RMSNorm and SiLU*Mul)",
        "fell below the floor / above the ceiling, on every GPU spec we ship; `*` = a GPU in that model's training;",
        "`(s x)`: on a GPU outside training with a trained sibling of its compute capability at another tensor",
        "rate, the % of shapes whose MLP efficiency the sibling's band moved first (`pipeweave.siblings`; not",
        "counting the bound of a trained GPU of the same die, applied after it and before the band).",
        "",
        "| GPU | " + " | ".join(ops) + " |",
        "|---|" + "---|" * len(ops),
    ]
    for gpu in gpus:
        cells = []
        for op in ops:
            cell = binding[op].get(gpu)
            mark = "*" if gpu in trained.get(op, ()) else ""
            sibling = "" if cell is None or cell[2] is None else f" (s {cell[2]:.1f})"
            cells.append("—" if cell is None else f"{cell[0]:.1f} / {cell[1]:.1f}{mark}{sibling}")
        lines.append(f"| {gpu} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cached(path: Path, recompute: bool, title: str, compute) -> dict:
    """The JSON cache at ``path``, computed (and written) first if missing or ``recompute``."""
    if recompute or not path.is_file():
        print(f"{title} ...")
        result = compute()
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(result, indent=2)))
    return json.loads(path.read_text())


def worst_factors(cell: dict) -> str:
    return "—" if "worst_ratio" not in cell else f"{cell['worst_ratio']:.2f}x / {near_roofline(cell)}"


def near_roofline(cell: dict) -> str:
    worst = cell.get("worst_ratio_near_roofline")
    return "—" if worst is None else f"{worst:.2f}x"


def logo_flag_codes(op: str, gpu: str, test: pd.DataFrame, every_test: pd.DataFrame, cache: Path = DEFAULT_CACHE,
                    hardware=None, train: pd.DataFrame | None = None) -> np.ndarray:
    """Extrapolation bits of the rows ``test`` of ``gpu`` under its LOGO model, each bit as the predictor sets it:
    architecture and input ranges of that model's training data, for an ensemble the members' disagreement above
    its threshold (:func:`pipeweave.ensemble.member_spread_entry` on the other GPUs' held-out shapes,
    ``every_test``: the operator's test split), and given its training rows ``train``, for a pipe-share model the
    pipe shares outside their training ranges."""
    hardware = hardware or hardware_registry(DEFAULT_HARDWARE_DIR)
    operator = get_operator(op)
    members = member_model_dirs(op, gpu, cache)
    metadata = json.loads((members[0] / "metadata.json").read_text())
    codes = coverage_codes(training_coverage(metadata, hardware, f"{members[0]}/metadata.json", op),
                           test[list(operator.feature_names)].to_numpy(np.float64),
                           test[list(operator.descriptor_names)].to_numpy(np.float64),
                           hardware.get(gpu).compute_capability)
    model = logo_mlp(op, gpu, cache, train)
    rows = test[model.features].to_numpy(np.float64)
    if len(members) > 1:
        others = held_out_shapes_of_training_gpus(every_test, metadata)
        threshold = member_spread_entry(model, others[model.features].to_numpy(np.float64))["threshold"]
        codes |= disagreement_codes(model.spread(rows), threshold)
    if model.edges is not None:
        codes |= np.where(model.edges.beyond(model.inputs(rows)), BEYOND_SHARES, 0).astype(np.int8)
    return codes


def flag_results(op: str, dataset_dir: Path, cache: Path = DEFAULT_CACHE, log=print) -> dict:
    """What the extrapolation flag says under leave-one-GPU-out: per held-out GPU, the share of its rows the LOGO
    model flags (:func:`logo_flag_codes`) and the duration error of the flagged and the unflagged rows, as
    predicted."""
    gpus = gpus_with_data(op, dataset_dir)
    if len(gpus) < 2:
        return {}
    hardware = hardware_registry(DEFAULT_HARDWARE_DIR)
    every_train, every_test = load_splits(op, dataset_dir)
    out = {}
    for gpu in gpus:
        test, predicted, _ = logo_as_predicted(op, gpu, dataset_dir, cache, log=log)
        others = hold_out(op, every_train, every_test, [gpu])[0]
        codes = logo_flag_codes(op, gpu, test, every_test, cache, hardware, others)
        err = duration_errors(test["overall_perf"].to_numpy(np.float64), predicted) * 100
        flagged = codes > 0
        out[gpu] = {"n": len(codes), "flagged": float(flagged.mean()),
                    **{name: float(np.mean(codes & bit > 0)) for bit, name in EXTRAPOLATION_BITS.items()},
                    "error_flagged": float(err[flagged].mean()) if flagged.any() else None,
                    "error_unflagged": float(err[~flagged].mean()) if (~flagged).any() else None}
        log(f"  flags {op} / {gpu}: {out[gpu]['flagged'] * 100:.1f} % flagged")
    return out


#: the held-out cell that shows a bias every member shares: (operator, GPU, its name in the prose)
SHARED_BIAS_EXAMPLE = ("attn", "NVIDIA A100-SXM4-80GB", "A100's attention")


def shared_bias_example(flags: dict) -> str:
    """The sentence of :func:`render_flags` on a bias no `members` bit sees, with the figures of its example cell
    (empty when that cell is not in ``flags``)."""
    op, gpu, name = SHARED_BIAS_EXAMPLE
    cell = flags.get(op, {}).get(gpu)
    if cell is None or "shares" not in cell:
        return ""
    parts = [(share, error) for share, error in ((cell["flagged"], cell["error_flagged"]),
                                                   (1 - cell["flagged"], cell["error_unflagged"])) if error is not None]
    error = sum(share * error for share, error in parts) / sum(share for share, _ in parts)
    return (f" A per-GPU bias that all members share raises no `members` bit ({name}, {error:.0f} % off: its "
            f"members disagree on {cell['members'] * 100:.0f} % of its rows); where it comes with a balance of pipes "
            f"no training GPU has, the `shares` bit sees it ({cell['shares'] * 100:.0f} % of {name} rows).")


def render_flags(flags: dict) -> str:
    def pct(value):
        return "—" if value is None else f"{value:.1f}"

    lines = [
        "## What the extrapolation flag means",
        "",
        "Generated by `python3 -m pipeweave.accuracy` (section `flags`). Each prediction carries an `extrapolation`",
        "flag (docs/METHOD.md §4.3): `architecture` (no GPU of its SM design, the compute capability, in the model's",
        "training data: A40's 8.6 is not A100's 8.0),",
        "`range` (a model input outside its training range), `members` (the five members of an ensemble: GEMM,",
        "FP8 GEMM, attention, MoE; they disagree more than on 99 % of held-out shapes of their training GPUs: the",
        "inputs are each inside their range but their combination is unlike the training rows), `shares` (BF16 GEMM,",
        "attention and MoE, which read pipe shares: a share outside its training range, where the edge bounds of",
        "docs/METHOD.md §4.3 act). Here every GPU is",
        "held out in turn and flagged by its leave-one-GPU-out model as the predictor flags a GPU outside training;",
        "the error columns are the duration errors (mean %) of its flagged and unflagged rows. A flag that means",
        "something has the larger error on the flagged rows." + shared_bias_example(flags),
        "",
        "| operator | held-out GPU | n | flagged % | range % | architecture % | members % | shares % "
        "| error flagged | error not flagged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for op, gpus in flags.items():
        for gpu, cell in gpus.items():
            shares = "—" if "shares" not in cell else f"{cell['shares'] * 100:.1f}"
            lines.append(f"| {op} | {gpu} | {cell['n']} | {cell['flagged'] * 100:.1f} | {cell['range'] * 100:.1f} "
                         f"| {cell['architecture'] * 100:.1f} | {cell['members'] * 100:.1f} | {shares} "
                         f"| {pct(cell['error_flagged'])} | {pct(cell['error_unflagged'])} |")
    return "\n".join(lines)


DURATION_DECADES_US = (10.0, 100.0, 1000.0)  # edges of the reference-duration bins of :func:`harness_ratios`


def duration_bin_labels() -> list[str]:
    edges = [f"{edge:g}" for edge in DURATION_DECADES_US]
    return ([f"< {edges[0]} µs"] + [f"{low}–{high} µs" for low, high in zip(edges, edges[1:])]
            + [f"≥ {edges[-1]} µs"])


def harness_ratios(rows: pd.DataFrame, keys: list[str]) -> dict:
    """For each pair of harnesses among ``rows`` (one GPU's), their measured duration ratio (each harness's median
    per shape ``keys``) on the shapes both measured: median and quartiles; the median weighted by the shape's
    duration (the geometric mean of the two), which is where a workload's time goes; and the median per bin of
    that duration (:data:`DURATION_DECADES_US`), since two harnesses can agree on small kernels and not on large
    ones."""
    family = rows["source"].map(source_family)
    medians = {name: part.groupby(keys)["avg_duration"].median() for name, part in rows.groupby(family)}
    names, out = sorted(medians), {}
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            both = pd.concat([medians[first].rename("a"), medians[second].rename("b")], axis=1).dropna()
            if not len(both):
                continue
            ratio = (both["a"] / both["b"]).to_numpy(np.float64)
            duration = np.sqrt(both["a"].to_numpy(np.float64) * both["b"].to_numpy(np.float64))
            bins = np.searchsorted(DURATION_DECADES_US, duration, side="right")
            out[f"{first} / {second}"] = {
                "shapes": len(both), "median": float(np.median(ratio)),
                "q25": float(np.quantile(ratio, 0.25)), "q75": float(np.quantile(ratio, 0.75)),
                "time_weighted_median": weighted_median(ratio, duration),
                "by_duration": [{"shapes": int((bins == b).sum()),
                                 "median": float(np.median(ratio[bins == b])) if (bins == b).any() else None}
                                for b in range(len(DURATION_DECADES_US) + 1)]}
    return out


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value below which half of the total weight lies."""
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, 0.5 * cumulative[-1])])


def multi_harness_gpus(frame: pd.DataFrame) -> list[str]:
    """The GPUs of ``frame`` whose rows come from more than one harness."""
    families = frame["source"].map(source_family)
    return [gpu for gpu in sorted(frame["hardware"].unique()) if families[frame["hardware"] == gpu].nunique() > 1]


def harness_pairs(op: str, dataset_dir: Path) -> dict:
    """Per GPU measured by more than one harness, :func:`harness_ratios` over all its rows (training and test
    split). Measured data only, no model: computed afresh on every report."""
    frame = pd.concat([read_dataset(path) for path in dataset_paths(op, dataset_dir)], ignore_index=True)
    keys = list(get_operator(op).shape_columns)  # not the dtype: Vidur timed FP16 GEMMs, aiconfigurator BF16
    return {gpu: harness_ratios(frame[frame["hardware"] == gpu], keys) for gpu in multi_harness_gpus(frame)}


def source_results(op: str, dataset_dir: Path, cache: Path = DEFAULT_CACHE, log=print) -> dict:
    """Per GPU measured by more than one harness: per harness its rows, the leave-one-GPU-out duration error and
    the median predicted/measured duration (as :func:`logo_as_predicted` gives them)."""
    frame = pd.concat([read_dataset(path) for path in dataset_paths(op, dataset_dir)], ignore_index=True)
    out = {}
    for gpu in multi_harness_gpus(frame):
        test, predicted, _ = logo_as_predicted(op, gpu, dataset_dir, cache, log=log)
        family = test["source"].map(source_family).to_numpy()
        measured = test["overall_perf"].to_numpy(np.float64)
        err, ratio = duration_errors(measured, predicted) * 100, measured / predicted
        cell = {"sources": {}}
        for name in sorted(set(family)):
            rows = family == name
            cell["sources"][name] = {"n": int(rows.sum()), "error": float(err[rows].mean()),
                                     "predicted_over_measured": float(np.median(ratio[rows]))}
        out[gpu] = cell
        log(f"  sources {op} / {gpu}: {', '.join(cell['sources'])}")
    return out


def render_sources(sources: dict, pairs: dict) -> str:
    bins = duration_bin_labels()
    lines = [
        "## Where measurement sources disagree",
        "",
        "Generated by `python3 -m pipeweave.accuracy` (section `sources`). Some GPUs were measured by more than one",
        "harness (docs/DATA.md): Vidur's profiler, aiconfigurator-core's collector, the PipeWeave artifact's",
        "(`pipeweave`). The leave-one-GPU-out error of such a GPU mixes the model's error with the harnesses'",
        "disagreement: one prediction per shape cannot match two measurements that differ. First, per harness, the",
        "held-out GPU's rows, their leave-one-GPU-out error (mean %) and the median of predicted over measured",
        "duration (above 1: predicted too slow); then, for each pair of harnesses, their measured duration ratio on",
        "the shapes both measured: median and quartiles over the shapes, the median weighted by each shape's",
        "duration (the geometric mean of the two measurements: where a workload's time goes), and the median per",
        "duration bin with its number of shapes. A model that reads the harness (docs/METHOD.md §4.1) predicts each",
        f"row with its own; every prediction for a user takes {REFERENCE_HARNESS}'s, and which harness an",
        "end-to-end run resembles is not known from kernels alone.",
        "",
        "| operator | held-out GPU | harness | rows | LOGO error | predicted / measured |",
        "|---|---|---|---|---|---|",
    ]
    for op, gpus in sources.items():
        for gpu, cell in gpus.items():
            for name, entry in cell["sources"].items():
                lines.append(f"| {op} | {gpu} | {name} | {entry['n']} | {entry['error']:.1f} "
                             f"| {entry['predicted_over_measured']:.2f} |")
    lines += ["", "| operator | GPU | harnesses a / b | shapes both measured | measured a / b: median (quartiles) "
                  "| time-weighted median | " + " | ".join(bins) + " |",
              "|---|---|---|---|---|---|" + "---|" * len(bins)]
    for op, gpus in pairs.items():
        for gpu, by_pair in gpus.items():
            for pair, entry in by_pair.items():
                cells = ["—" if part["median"] is None else f"{part['median']:.2f} ({part['shapes']})"
                         for part in entry["by_duration"]]
                lines.append(f"| {op} | {gpu} | {pair} | {entry['shapes']} | {entry['median']:.2f} "
                             f"({entry['q25']:.2f}–{entry['q75']:.2f}) | {entry['time_weighted_median']:.2f} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_architecture(by_arch: dict) -> str:
    lines = [
        "## Leave-one-architecture-out",
        "",
        "Generated by `python3 -m pipeweave.accuracy` (section `architecture`). Every GPU of one architecture",
        "(Ampere, Ada, Hopper, Blackwell) leaves training; the model of the other architectures' GPUs is tested on",
        "every row of the held-out ones, beside the feature roofline on the same rows. The leave-one-GPU-out",
        f"budget (at most {LOGO_MAX_ROWS_PER_GPU} rows per GPU, {LOGO_EPOCHS} epochs, so an architecture of one GPU",
        "is that GPU's leave-one-GPU-out split, trained afresh); the operators that ship as",
        "five-seed ensembles (GEMM, FP8 GEMM, attention, MoE) as the same five seeds' median. RMSNorm and SiLU*Mul",
        "on a GPU outside training take the bandwidth model (docs/METHOD.md §4.3), fitted on the remaining GPUs; all",
        "predictions are kept inside the physical band. Cells: duration error `mean / median` (%), its max, and the",
        "worst factor between predicted and measured duration (either way), over all rows and over the rows where",
        "the roofline is within 1.5x of the measured duration (— : no such row).",
        "",
        "| operator | held out | GPUs | n | model | max | worst factor | worst, roofline ≤ 1.5x | roofline |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for op, groups in by_arch.items():
        for arch, cell in groups.items():
            lines.append(f"| {op} | {arch} | {', '.join(cell['gpus'])} | {cell['model']['n']} | {fmt(cell['model'])} "
                         f"| {cell['max']:.0f} | {cell['worst_ratio']:.2f}x | {near_roofline(cell)} | {fmt(cell['roofline'])} |")
    skipped = [op for op, groups in by_arch.items() if not groups]
    if skipped:
        lines += ["", f"Data on one architecture only (no table): {', '.join(skipped)}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python3 -m pipeweave.accuracy", description="Generate docs/ACCURACY.md.")
    parser.add_argument("--ops", type=trainable_operator_list, default=list(OPS),
                        help=f"comma list of operator classes to report (default: {','.join(OPS)})")
    parser.add_argument("--model_dir", type=Path, default=DEFAULT_MODEL_DIR,
                        help="root of the shipped models scored on held-out shapes (default: mlp_models)")
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR,
                        help="folder of <op>_{train,test}.csv (default: dataset)")
    parser.add_argument("--output", type=Path, default=DOCS_DIR / "ACCURACY.md",
                        help="markdown report to write (default: docs/ACCURACY.md)")
    parser.add_argument("--logo_cache", type=Path, default=DOCS_DIR / "accuracy_logo",
                        help="directory of per-operator leave-one-GPU-out and leave-one-architecture-out results "
                             "(default: docs/accuracy_logo)")
    parser.add_argument("--retrain_logo", action="store_true", help="recompute the held-out results")
    parser.add_argument("--logo_only", action="store_true", help="only compute the held-out results")
    args = parser.parse_args(argv)
    from pipeweave.paths import existing_shared_data_dir

    ops = args.ops
    logo, by_arch, flags, sources = {}, {}, {}, {}
    for op in ops:
        logo[op] = cached(args.logo_cache / f"{op}.json", args.retrain_logo, f"leave-one-GPU-out for {op}",
                          lambda: logo_results(op, args.dataset_dir))
        by_arch[op] = cached(args.logo_cache / f"{op}_architecture.json", args.retrain_logo,
                             f"leave-one-architecture-out for {op}", lambda: loao_results(op, args.dataset_dir))
        flags[op] = cached(args.logo_cache / f"{op}_flags.json", args.retrain_logo,
                           f"extrapolation flags under leave-one-GPU-out for {op}",
                           lambda: flag_results(op, args.dataset_dir))
        sources[op] = cached(args.logo_cache / f"{op}_sources.json", args.retrain_logo,
                             f"measurement sources under leave-one-GPU-out for {op}",
                             lambda: source_results(op, args.dataset_dir))
    if args.logo_only:
        return 0
    pairs = {op: harness_pairs(op, args.dataset_dir) for op in ops}
    predictor = KernelPredictor(args.model_dir)
    results = {op: shape_holdout_results(op, predictor, args.dataset_dir) for op in ops}
    notes = {}
    if "moe" in ops:
        test = read_dataset(dataset_paths("moe", args.dataset_dir)[1])
        notes["moe"] = render_pass_choice(pass_choice_errors(test, predictor))
        expert_parallel = expert_parallel_moe_rows(log=lambda line: None)
        if not expert_parallel.empty:
            notes["moe"] += render_expert_parallel(expert_parallel_errors(expert_parallel, predictor))
        unseen = unseen_moe_rows(log=lambda line: None)
        if not unseen.empty:
            tables = sorted(unseen["source"].str.replace("aiconfigurator-core ", "", regex=False).unique())
            notes["moe"] += render_unseen_gpu(unseen_gpu_errors(unseen, args.model_dir), tables,
                                              routing_proxy_errors())
    text = render(results, logo, artifact_figures(existing_shared_data_dir()), notes)
    text = keep_marked_sections(text, args.output)  # e.g. the k-shot section (pipeweave.calibration_eval)
    write_atomically(args.output, lambda tmp: tmp.write_text(text + "\n"))
    binding = {op: band_binding(op, predictor, args.dataset_dir) for op in ops}
    trained = {op: set(predictor.model(op)[1]["data_info"]["train_hardware_distribution"]) for op in ops}
    write_marked_section(args.output, "bounds", render_band(binding, trained))
    write_marked_section(args.output, "architecture", render_architecture(by_arch))
    write_marked_section(args.output, "flags", render_flags(flags))
    write_marked_section(args.output, "sources", render_sources(sources, pairs))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
