"""Training one operator's model from the dataset CSVs, evaluating it, and writing its directory.

Used by train_mlp.py, train_mlp_quantile.py and the accuracy report. Metrics on efficiency follow
docs/METHOD.md §5.2; pipeweave adds the duration error |pred − measured| / measured, which is what users
read (for efficiency p and prediction p̂ it is p / p̂ − 1).
"""
from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from analytical_model.registry import get_operator, operator_keys
from analytical_model.hardware import hardware_registry, DEFAULT_HARDWARE_DIR
from pipeweave import edges, memory_model
from pipeweave.calibration import file_digest
from pipeweave.cli import batch_size, nonnegative_int, positive_float, positive_int
from pipeweave.mlp import (DISCRETE_INPUTS_KEY, LOG1P, PIPE_SHARES, checkpoint_path, discrete_inputs_entry,
                           model_inputs, total_efficiency, transformed_names, weights_path, work_efficiency)
from pipeweave.paths import DATASET_DIR
from pipeweave.torch_mlp import HIDDEN_DIMS, count_parameters, export_weights, predict_efficiency, training_machine
from pipeweave.splits import shape_keys
from pipeweave.training import TrainConfig, fit


def dataset_paths(op: str, dataset_dir: str | Path = DATASET_DIR) -> tuple[Path, Path]:
    dataset_dir = Path(dataset_dir)
    return dataset_dir / f"{op}_train.csv", dataset_dir / f"{op}_test.csv"


def read_dataset(path: Path) -> pd.DataFrame:
    """A dataset split, checked: rows present, and the operator's features and target numeric and finite (a
    damaged file failed deep inside training with "No objects to concatenate" or "could not convert string to
    float", naming neither the file nor the remedy)."""
    from pipeweave.validation import row_label

    op = path.stem.rsplit("_", 1)[0]
    rebuild = f"rebuild it with: python3 -m dataset.build --ops {op}"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; build it with: python3 -m dataset.build --ops {op}")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]}); {rebuild}") from None
    if frame.empty:
        raise ValueError(f"{path}: no rows; {rebuild}")
    # every column training reads as a number: the features, the shape descriptors the pipeweave recipe adds to
    # them, the SM clock of the fixed time and the target
    columns = [*get_operator(op).input_names(), "sm_freq", "overall_perf"] if op in operator_keys() else []
    missing = [column for column in columns if column not in frame]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r}; {rebuild}")
    for column in columns:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            cell = frame[column].iloc[bad[0]]
            what = "is empty" if pd.isna(cell) else f"{cell!r} is not a finite number"
            raise ValueError(f"{path}: {row_label(int(bad[0]))}, column {column!r}: {what}; {rebuild}")
        frame[column] = values
    return frame


def canonical_hardware(names) -> list[str]:
    registry = hardware_registry(DEFAULT_HARDWARE_DIR)
    return [registry.get(n).name for n in names]


def load_splits(
    op: str, dataset_dir: str | Path = DATASET_DIR, holdout_hardware: list[str] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test). With ``holdout_hardware``, those GPUs leave training entirely and the test set is
    every row of theirs (train and test shapes): leave-one-GPU-out."""
    train_path, test_path = dataset_paths(op, dataset_dir)
    train, test = read_dataset(train_path), read_dataset(test_path)
    return hold_out(op, train, test, holdout_hardware) if holdout_hardware else (train, test)


def hold_out(op: str, train: pd.DataFrame, test: pd.DataFrame,
             holdout_hardware: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`load_splits`'s leave-one-GPU-out split of splits already read."""
    held = set(canonical_hardware(holdout_hardware))
    present = set(train["hardware"].unique()) | set(test["hardware"].unique())
    missing = held - present
    if missing:
        raise ValueError(f"--holdout_hardware {sorted(missing)[0]!r} has no {op} rows; GPUs with data: {', '.join(sorted(present))}")
    if held >= set(train["hardware"].unique()):
        raise ValueError(f"--holdout_hardware holds out every GPU with {op} training rows ({', '.join(sorted(held))}); "
                         f"leave at least one to train on")
    both = pd.concat([train, test], ignore_index=True)
    return train[~train["hardware"].isin(held)].reset_index(drop=True), both[both["hardware"].isin(held)].reset_index(drop=True)


def feature_matrix(frame: pd.DataFrame, op: str, config: TrainConfig) -> np.ndarray:
    return frame[list(input_names(op, config))].to_numpy(np.float64)


def input_transform(op: str, config: TrainConfig) -> str:
    """How the model reads its inputs (:func:`pipeweave.mlp.model_inputs`): the pipeweave recipe on its own inputs
    as the registry says (``pipe_share_inputs``); the reference and quantile recipes, and an input subset (an
    ablation of docs/METHOD.md's inputs, ``config.features``), read them as docs/METHOD.md does: log1p."""
    ablation = config.features is not None
    own_inputs = config.recipe == "pipeweave" and not ablation
    return PIPE_SHARES if own_inputs and get_operator(op).pipe_share_inputs else LOG1P


def fixed_time_us(op: str, config: TrainConfig) -> float:
    """The time the model takes out of every kernel before it learns the efficiency of the rest: the registry's
    (``fixed_time_us``) for the pipeweave recipe; the reference and quantile recipes follow docs/METHOD.md: none."""
    return get_operator(op).fixed_time_us if config.recipe == "pipeweave" else 0.0


def frame_ideal_us(op: str, frame: pd.DataFrame) -> np.ndarray:
    """C_ideal / f of each row of a frame with the feature columns and ``sm_freq`` (MHz): microseconds."""
    operator = get_operator(op)
    return operator.ideal_us(frame[list(operator.feature_names)].to_numpy(np.float64), frame["sm_freq"].to_numpy())


def network_inputs(frame: pd.DataFrame, op: str, config: TrainConfig) -> np.ndarray:
    """The network's input rows for a frame with the input columns (:func:`input_names`, :func:`input_transform`)."""
    return model_inputs(feature_matrix(frame, op, config), input_names(op, config), input_transform(op, config))


def input_names(op: str, config: TrainConfig) -> tuple[str, ...]:
    """``config.features`` if set (a subset, for ablations); else the pipeweave recipe adds the shape
    descriptors and the reference and quantile recipes use docs/METHOD.md's features."""
    operator = get_operator(op)
    if config.features is None:
        return operator.input_names(with_descriptors=config.recipe == "pipeweave")
    unknown = [name for name in config.features if name not in operator.input_names()]
    if unknown or not config.features:
        raise ValueError(f"{op}: feature subset must name some of {', '.join(operator.input_names())}; got {unknown or 'none'}")
    return tuple(config.features)


def log_duration_ratio(measured_perf: np.ndarray, predicted_perf: np.ndarray) -> np.ndarray:
    """log(t / t̂) for durations implied by efficiencies on the same ideal cycles and clock: log(p̂ / p)."""
    return np.log(np.asarray(predicted_perf, dtype=np.float64) / np.asarray(measured_perf, dtype=np.float64))


def duration_errors(measured_perf: np.ndarray, predicted_perf: np.ndarray) -> np.ndarray:
    """|t̂ − t| / t for durations implied by efficiencies (same C_ideal and clock): |p / p̂ − 1|."""
    return np.abs(np.asarray(measured_perf) / np.asarray(predicted_perf) - 1.0)


def efficiency_metrics(y: np.ndarray, pred: np.ndarray) -> dict:
    pred = np.maximum(pred, 1e-9)
    rel = np.abs(pred - y) / (y + 1e-8)
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    dur = duration_errors(y, pred)
    return {
        "mae": float(np.mean(np.abs(pred - y))),
        "rmse": float(np.sqrt(np.mean((pred - y) ** 2))),
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        "mean_relative_error": float(rel.mean()),
        "median_relative_error": float(np.median(rel)),
        "accuracy_10_percent": float(np.mean(rel < 0.1) * 100),
        "accuracy_20_percent": float(np.mean(rel < 0.2) * 100),
        "accuracy_50_percent": float(np.mean(rel < 0.5) * 100),
        "duration_mean_abs_pct_error": float(dur.mean() * 100),
        "duration_median_abs_pct_error": float(np.median(dur) * 100),
        "duration_within_10_percent": float(np.mean(dur < 0.1) * 100),
        "duration_within_20_percent": float(np.mean(dur < 0.2) * 100),
    }


def evaluate(frame: pd.DataFrame, predicted: np.ndarray) -> dict:
    y = frame["overall_perf"].to_numpy(np.float64)
    result = {"overall": efficiency_metrics(y, predicted), "by_hardware": {}}
    for hw in pd.unique(frame["hardware"]):
        rows = (frame["hardware"] == hw).to_numpy()
        result["by_hardware"][hw] = {**efficiency_metrics(y[rows], predicted[rows]), "test_samples": int(rows.sum())}
    return result


def feature_ranges(frame: pd.DataFrame, names) -> dict:
    out = {}
    for name in names:
        values = frame[name].to_numpy(np.float64)
        out[name] = {"min": float(values.min()), "max": float(values.max()), "mean": float(values.mean()), "std": float(values.std())}
    return out


def hardware_distribution(frame: pd.DataFrame) -> dict:
    return {k: int(v) for k, v in frame["hardware"].value_counts().items()}


def cap_rows_per_gpu(frame: pd.DataFrame, cap: int | None, seed: int) -> pd.DataFrame:
    """At most ``cap`` rows per GPU, drawn with a fixed seed (keeps training time bounded)."""
    if cap is None:
        return frame
    # the rows DataFrame.sample(cap, random_state=seed) draws from each GPU's rows in sorted GPU order, chosen by
    # position: splitting the whole frame by GPU first cost seconds per call on the big datasets
    codes, _ = pd.factorize(frame["hardware"], sort=True)
    positions = []
    for code in range(codes.max() + 1 if len(codes) else 0):
        rows = np.flatnonzero(codes == code)
        positions.append(rows if len(rows) <= cap else
                         rows[np.random.RandomState(seed).choice(len(rows), size=cap, replace=False)])
    return frame.iloc[np.concatenate(positions) if positions else []].sort_index()


def train_and_evaluate(op: str, train: pd.DataFrame, test: pd.DataFrame, config: TrainConfig):
    """Fit on ``train`` (capped per GPU if configured); return (model, history, test predictions, evaluation)."""
    train = cap_rows_per_gpu(train, config.max_rows_per_gpu, config.seed)
    if len(train) < 10:
        raise ValueError(f"{op}: only {len(train)} training rows; build the dataset first (python3 -m dataset.build)")
    started = time.perf_counter()
    fixed = fixed_time_us(op, config)
    target = train["overall_perf"].to_numpy(np.float64)
    if fixed:
        target = work_efficiency(target, frame_ideal_us(op, train), fixed)
    model, history = fit(network_inputs(train, op, config), target, config, group_keys=shape_keys(train, op))
    history["train_seconds"] = round(time.perf_counter() - started, 1)
    predicted = np.zeros(0)
    if len(test):
        predicted = predict_efficiency(model, network_inputs(test, op, config))
        if fixed:
            predicted = total_efficiency(predicted, frame_ideal_us(op, test), fixed)
    evaluation = evaluate(test, predicted) if len(test) else {}
    return model, history, predicted, evaluation


def write_model_dir(
    out_dir: Path,
    op: str,
    model: torch.nn.Module,
    history: dict,
    config: TrainConfig,
    train: pd.DataFrame,
    test: pd.DataFrame | None,
    evaluation: dict | None,
    paths: dict,
    extra: dict | None = None,
) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    quantile = config.recipe == "quantile"
    state = {"model_state_dict": model.state_dict(), "epoch": history["best_epoch"], "train_loss": history["best_train_loss"]}
    if not quantile:
        state["val_loss"] = history["best_val_loss"]
    torch.save(state, checkpoint_path(out_dir, op))
    names = list(input_names(op, config))
    transform = input_transform(op, config)
    fixed = fixed_time_us(op, config)
    # what prediction reads, without torch
    export_weights(model, names, transform, weights_path(out_dir, op), fixed, get_operator(op).ideal_cycle_features)
    metadata = {
        "timestamp": datetime.now().isoformat(timespec="seconds"),
        "model_info": {
            "model_type": f"{op.upper()}_MLP" + ("_QUANTILE" if quantile else ""),
            "operator_type": op,
            "architecture": config.architecture,
            "target_transform": model.target_transform,
            "features": names,
            "input_transform": transform,
            "target": "overall_perf",
            "num_features": len(names),
            "model_parameters": {
                "input_dim": len(transformed_names(names, transform)),
                "hidden_dims": list(HIDDEN_DIMS),
                "dropout_rate": config.dropout,
                "total_parameters": count_parameters(model),
            },
            "batch_norm_position": "post_activation",
            **({"fixed_time_us": fixed} if fixed else {}),
        },
        "training": {**config.as_dict(), **{k: v for k, v in history.items() if k not in ("train_loss", "val_loss")},
                     "machine": training_machine()},
        "data_info": {
            "train_samples": int(len(train)),
            **({"test_samples": int(len(test))} if test is not None else {}),
            **paths,
            # which data, exactly: a path says where it was, not what it held (blake2b, as calibrations record)
            "digest": {key: file_digest(value) for key, value in paths.items()
                       if key.endswith("_path") and value and Path(value).is_file()},
            "train_hardware_distribution": hardware_distribution(train),
            **({"test_hardware_distribution": hardware_distribution(test)} if test is not None and len(test) else {}),
            "train_sources": sorted(pd.unique(train["source"]).tolist()) if "source" in train else [],
        },
        "feature_ranges": feature_ranges(train, names),
        "preprocessing": {"transformation": f"{transform} (no standardization; pipeweave.mlp.model_inputs)",
                          "note": "This model does not use StandardScaler"},
    }
    if transform == PIPE_SHARES and len(train):
        metadata[edges.METADATA_KEY] = edges.ranges_entry(names, train[names].to_numpy(np.float64))
    discrete = list(get_operator(op).discrete_inputs)
    if discrete and len(train):
        metadata[DISCRETE_INPUTS_KEY] = discrete_inputs_entry(discrete, train[discrete].to_numpy(np.float64))
    if quantile:
        metadata["model_info"].update(
            loss_function=f"Quantile Loss (q={config.quantile})",
            quantile=config.quantile,
            purpose=f"Upper bound prediction ({int(round(config.quantile * 100))}th percentile)",
        )
    if get_operator(op).dram_bound and not quantile and "avg_duration" in train:  # not for untrained test models
        metadata["memory_model"] = memory_model.fit_frame(op, cap_rows_per_gpu(train, config.max_rows_per_gpu,
                                                                               config.seed))
    if evaluation:
        metadata["evaluation_results"] = evaluation
    if extra:
        metadata.update(extra)
    write_metadata(out_dir, metadata)
    return metadata


def write_metadata(model_dir: Path, metadata: dict) -> None:
    """``metadata.json``, written last and atomically: a model folder is complete once it exists
    (:func:`pipeweave.mlp.latest_model_dir` passes over a folder whose training was interrupted before it)."""
    from pipeweave.cli import write_atomically

    write_atomically(Path(model_dir) / "metadata.json",
                     lambda tmp: tmp.write_text(json.dumps(metadata, indent=2, ensure_ascii=False)))


def worst_cases(test: pd.DataFrame, predicted: np.ndarray, top: int = 100) -> pd.DataFrame:
    y = test["overall_perf"].to_numpy()
    pred = np.maximum(predicted, 1e-9)
    rel = np.abs(pred - y) / (y + 1e-8)
    out = test.copy()
    out["predicted"] = pred
    out["rel_error"] = rel
    return out.sort_values("rel_error", ascending=False, kind="stable").head(top)


def timestamp_dir(root: Path, op: str) -> Path:
    """A new folder ``<root>/<op>/<timestamp>``, created here: a second run started in the same second gets a
    ``_2`` (``_3``, ...) suffix instead of writing into the first one's folder."""
    stem = Path(root) / op / datetime.now().strftime("%Y%m%d_%H%M%S")
    try:
        stem.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission: say which flag, not only the errno
        raise OSError(f"--output_dir {root}: cannot hold model folders ({exc.strerror or exc})") from None
    for attempt in range(1, 1000):
        path = stem if attempt == 1 else stem.with_name(f"{stem.name}_{attempt}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{stem}: 999 model folders of this second already exist")


@contextmanager
def removed_on_failure(out_dir: Path):
    """A training run's model folder, removed if the run fails or is interrupted: none is left that looks like a
    model (a half-written one could become the newest, the one every prediction from its folder loads)."""
    try:
        yield out_dir
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise


def saved_note(out_dir: Path, op: str, flag: str = "--model_dir") -> str:
    """The line a training script ends with: where the model went and, when it is now the newest exported model of
    its folder, that every prediction from that folder uses it (the shipped one is replaced without another step);
    ``flag``: the option that names such a folder (``--quantile_dir`` for the quantile models)."""
    from pipeweave.mlp import latest_model_dir

    root = out_dir.parent.parent
    try:
        newest = latest_model_dir(root, op)
    except FileNotFoundError:
        newest = None
    if newest is None:
        return f"saved {out_dir}"
    if newest != out_dir:
        return (f"saved {out_dir}, but predictions reading {root} do NOT use it: {newest.name} sorts after it; "
                f"remove that folder, or predict with --model_dir pointing at a folder holding only this model")
    from pipeweave.paths import DEFAULT_MODEL_DIR, DEFAULT_QUANTILE_DIR

    default = DEFAULT_QUANTILE_DIR if flag == "--quantile_dir" else DEFAULT_MODEL_DIR
    if root.resolve() != Path(default).resolve():  # runs/ of --holdout_hardware, or the user's own folder
        return (f"saved {out_dir}: the newest {op} model under {root}, which predictions read only with {flag} "
                f"{root} (the default {default} is unchanged)")
    return (f"saved {out_dir}: the newest {op} model under {root}, so every prediction reading that folder now uses "
            f"it (delete the folder to go back, or train into another --output_dir)")


def add_training_arguments(parser, *, output_dir: Path | None, output_help: str, epochs_default: int | None,
                           epochs_help: str, rows_help: str) -> None:
    """The flags train_mlp.py and train_mlp_quantile.py share (defined once, so they stay the same); counts must be
    at least 1 (0 epochs, threads or rows per batch is an error, not a crash)."""
    parser.add_argument("--epochs", type=positive_int, default=epochs_default, help=epochs_help)
    parser.add_argument("--batch_size", type=batch_size, default=1024,
                        help="rows per optimiser step, at least 2 (BatchNorm needs two; default 1024)")
    parser.add_argument("--lr", type=positive_float, default=1e-3, help="AdamW learning rate (default 0.001)")
    parser.add_argument("--seed", type=nonnegative_int, default=42,
                        help="seed of the row sample, split and initialisation (default 42)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu (default) or cuda")
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR,
                        help="folder of <op>_{train,test}.csv (default: dataset, built by python3 -m dataset.build)")
    parser.add_argument("--output_dir", type=Path, default=output_dir,
                        help=f"root under which <op>/<timestamp>/ is created ({output_help})")
    parser.add_argument("--max_rows_per_gpu", type=nonnegative_int, default=20000, help=rows_help)
    parser.add_argument("--threads", type=positive_int, default=1, help="PyTorch CPU threads (default 1)")
    parser.add_argument("--no_progress", action="store_true", help="do not print per-epoch progress")


def kernel_reports(op: str, train: pd.DataFrame, predicted: np.ndarray, threshold: float, topk: int | None,
                   out_dir: Path) -> list[str]:
    """Per GPU, the kernels whose measured efficiency is more than ``threshold`` below the quantile model's
    predicted upper bound (``topk_underperforming_<GPU>.csv``, worst first) and ``summary.csv``; returns the
    file names written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = train.copy()
    frame["pred_perf"] = np.maximum(predicted, 1e-9)
    frame["perf_diff"] = frame["overall_perf"] - frame["pred_perf"]
    frame["rel_gap"] = frame["perf_diff"] / (frame["pred_perf"] + 1e-9)
    columns = list(get_operator(op).shape_columns) + ["avg_duration", "overall_perf", "pred_perf", "perf_diff", "rel_gap"]
    files, summary = [], []
    for hw, rows in frame.groupby("hardware", sort=True):
        under = rows[rows["perf_diff"] < threshold].sort_values("perf_diff", kind="stable")
        top = under if topk is None else under.head(topk)
        name = f"topk_underperforming_{hw}.csv"
        top[columns].to_csv(out_dir / name, index=False)
        files.append(name)
        summary.append({
            "hardware": hw, "total_underperforming": len(under),
            "avg_perf_diff": under["perf_diff"].mean() if len(under) else 0.0,
            "min_perf_diff": under["perf_diff"].min() if len(under) else 0.0,
            "avg_rel_gap": under["rel_gap"].mean() if len(under) else 0.0,
            "min_rel_gap": under["rel_gap"].min() if len(under) else 0.0,
            "topk_count": len(top),
        })
    pd.DataFrame(summary).to_csv(out_dir / "summary.csv", index=False)
    return files + ["summary.csv"]
