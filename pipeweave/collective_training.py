"""Training the collective-communication time models (``train_collective_rf.py``): one source per GPU, kind and
worker count, fitting, held-out scoring and the model files that :mod:`pipeweave.collectives` reads at prediction
time (the model, sources and precedence are described there).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from pipeweave.paths import DEFAULT_COLLECTIVE_DIR, require_shared_data

from .collective_serving import is_custom_allreduce, serving_adjust, write_serving
from .collectives import (KINDS, METADATA_FILE, MODEL_FORMAT, REGRESSORS, _features, analytical_collective_ms,
                          model_file, model_predict_ms)

CUSTOM_ALLREDUCE_KIND = "custom_all_reduce"  # load_collectives' label of vLLM's custom all-reduce rows
MAX_MODEL_BYTES = 2 * 1024 * 1024

# source precedence (prefix of the ``source`` column of load_collectives) - lower is preferred; aiconfigurator's
# vLLM custom all-reduce table ranks before all of them (collective_serving.is_custom_allreduce)
SOURCE_PRECEDENCE = ("aiconfigurator-core", "vidur", "pipeweave")
SMOOTH_MIN_SIZES = 100  # rolling-median smoothing only for dense sweeps
SMOOTH_WINDOW = 5
EXTRAPOLATION_FIT_FRACTION = 4  # fit the extrapolation slope on sizes in [s_max / 4, s_max]
SMALL_RF_PARAMS = {"n_estimators": 30, "max_depth": 12, "min_samples_leaf": 3}
REFERENCE_RF_PARAMS = {"n_estimators": 100, "max_depth": 20, "min_samples_split": 5, "min_samples_leaf": 2}


def _stem(hardware: str) -> str:
    from analytical_model.hardware import load_hardware
    return load_hardware(hardware).stem


def _device_name(stem: str) -> str:
    from analytical_model.hardware import load_hardware
    return load_hardware(stem).name


Log = Callable[[str], None]


def source_rank(source: str) -> int:
    if is_custom_allreduce(source):
        return -1
    for i, prefix in enumerate(SOURCE_PRECEDENCE):
        if source.startswith(prefix):
            return i
    return len(SOURCE_PRECEDENCE)


def select_training_data(df, log: Log = print):
    """Keep NCCL all_reduce / send_recv rows, add ``stem``, and keep one source per (stem, kind, num_workers).

    Returns (selected rows, {(stem, kind): {workers: {"source":..., "skipped": [...]}}}).
    """
    import pandas as pd
    from analytical_model.hardware import load_hardware

    df = df.assign(collective=df["collective"].replace(CUSTOM_ALLREDUCE_KIND, "all_reduce"))
    df = df[df["collective"].isin(KINDS)].copy()
    stems = {h: load_hardware(h).stem for h in df["hardware"].unique()}
    df["stem"] = df["hardware"].map(stems)
    df["rank"] = df["source"].map(source_rank)
    choice: dict[tuple[str, str], dict[int, dict]] = {}
    keep = []
    for (stem, kind, workers), g in df.groupby(["stem", "collective", "num_workers"], sort=True):
        ranked = sorted(g["source"].unique(), key=lambda s: (source_rank(s), s))
        chosen = ranked[0]
        keep.append(g[g["source"] == chosen])
        choice.setdefault((stem, kind), {})[int(workers)] = {"source": chosen, "skipped": ranked[1:]}
    if not keep:
        return df.iloc[:0], choice
    out = pd.concat(keep).sort_values(["stem", "collective", "num_workers", "size_bytes"], kind="mergesort")
    out = out.groupby(["stem", "collective", "num_workers", "size_bytes"], as_index=False, sort=True)["time_ms"].mean()
    return out.reset_index(drop=True), choice


def heldout_mask(group) -> np.ndarray:
    """Every 5th size of each worker count (positions 2, 7, 12, ... in size order: the extremes stay in training)."""
    order = group.sort_values(["num_workers", "size_bytes"], kind="mergesort")
    position = order.groupby("num_workers").cumcount()
    mask = (position % 5 == 2).reindex(group.index)
    return mask.to_numpy(dtype=bool)


def _symmetric_rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    """Centred rolling median whose window shrinks symmetrically at the ends (the end points stay unbiased)."""
    half = window // 2
    n = len(values)
    out = np.empty(n)
    for i in range(n):
        h = min(half, i, n - 1 - i)
        out[i] = np.median(values[i - h:i + h + 1])
    return out


def padded_envelope(log_time: np.ndarray) -> np.ndarray:
    """Times (in size order) lowered to the least time of any larger message: a message is never slower than a
    larger one, since it could be sent padded to it. A sweep of few sizes is not smoothed, and one slow call
    (A100's 8-GPU custom all-reduce: 14.8 µs at 4 KiB between 5.6 µs at 2 KiB and 6.3 µs at 8 KiB) made a decode
    step of one request slower than of two; a dip (B200, 8 GPUs: 26 µs at 512 KiB, 17 µs at 1 MiB) made 64
    sequences faster than 32."""
    return np.minimum.accumulate(np.asarray(log_time, dtype=np.float64)[::-1])[::-1]


def fit_model(group, kind: str, hardware: str, regressor: str = "interp", seed: int = 42,
              n_estimators: int | None = None, max_depth: int | None = None, min_samples_leaf: int | None = None,
              n_jobs: int = 1) -> dict:
    """Fit one (GPU, kind) model on rows with columns num_workers, size_bytes, time_ms."""
    if regressor not in REGRESSORS:
        raise ValueError(f"unknown regressor {regressor!r}; expected one of {', '.join(REGRESSORS)}")
    g = group.groupby(["num_workers", "size_bytes"], as_index=False, sort=True)["time_ms"].mean()
    model: dict = {"format": MODEL_FORMAT, "kind": kind, "hardware": hardware, "regressor": regressor,
                   "range": {}, "params": {}}
    smoothed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for w, gw in g.groupby("num_workers", sort=True):
        size = gw["size_bytes"].to_numpy(np.float64)
        log_t = np.log(gw["time_ms"].to_numpy(np.float64))
        if len(size) >= SMOOTH_MIN_SIZES:
            log_t = _symmetric_rolling_median(log_t, SMOOTH_WINDOW)
        smoothed[int(w)] = (size, padded_envelope(log_t), gw["time_ms"].to_numpy(np.float64))
    if regressor == "interp":
        model["curves"] = {w: {"log2_size": np.log2(s), "log_time_ms": lt} for w, (s, lt, _) in smoothed.items()}
        model["params"] = {"smoothing": f"centred rolling median of log(time) over {SMOOTH_WINDOW} sizes (shrinking "
                                        f"symmetrically at the ends) when a worker count has >= {SMOOTH_MIN_SIZES} "
                                        f"sizes, then each time lowered to the least time of any larger size",
                           "interpolation": "piecewise linear in (log2 size, log time) per worker count"}
    else:
        from sklearn.ensemble import RandomForestRegressor
        if regressor == "reference_rf":
            params = dict(REFERENCE_RF_PARAMS)
            target = "ms"
        else:
            params = dict(SMALL_RF_PARAMS)
            target = "log_ms"
        if regressor == "rf":  # the reference forest is always the artifact's exact configuration
            for key, value in (("n_estimators", n_estimators), ("max_depth", max_depth),
                               ("min_samples_leaf", min_samples_leaf)):
                if value is not None:
                    params[key] = value
        size = g["size_bytes"].to_numpy(np.float64)
        workers = g["num_workers"].to_numpy(np.int64)
        y = g["time_ms"].to_numpy(np.float64)
        estimator = RandomForestRegressor(random_state=seed, n_jobs=n_jobs, **params)
        estimator.fit(_features(regressor, size, workers), np.log(y) if target == "log_ms" else y)
        estimator.n_jobs = 1
        model["estimator"] = estimator
        model["target"] = target
        features = "[size_bytes, num_workers]" if regressor == "reference_rf" else "[log2(size_bytes), num_workers]"
        model["params"] = {**params, "random_state": seed, "features": features,
                           "target": "time_ms" if target == "ms" else "log(time_ms)"}
    for w, (size, log_t, time_ms) in smoothed.items():
        s_max = float(size[-1])
        top = size >= s_max / EXTRAPOLATION_FIT_FRACTION
        slope = 0.0
        if top.sum() >= 2:  # least squares on the measured (unsmoothed) times
            slope = float(np.polyfit(size[top], time_ms[top], 1)[0])
        t_max = float(np.exp(log_t[-1]))
        if not np.isfinite(slope) or slope <= 0:
            slope = t_max / s_max
        model["range"][w] = {"min_size_bytes": float(size[0]), "max_size_bytes": s_max, "ms_per_byte": slope}
    return model


def _analytical_ratio(stem: str, kind: str, group) -> float | None:
    """Analytical estimate (hardware JSON link) / measured time at the largest measured size, for the record."""
    from analytical_model.hardware import load_hardware
    spec = load_hardware(stem)
    top = group.loc[group["size_bytes"].idxmax()]
    est = analytical_collective_ms(kind, float(top["size_bytes"]), int(top["num_workers"]), spec.link_gbps,
                                   spec.link_latency_us)
    return round(float(est) / float(top["time_ms"]), 3)


def _errors(pred: np.ndarray, true: np.ndarray) -> dict:
    ape = np.abs(pred / true - 1.0) * 100.0
    return {"mean_abs_pct_error": round(float(ape.mean()), 3), "median_abs_pct_error": round(float(np.median(ape)), 3),
            "max_abs_pct_error": round(float(ape.max()), 3), "n": int(len(ape))}


def heldout_errors(group, kind: str, hardware: str, regressor: str, **fit_kwargs) -> dict:
    mask = heldout_mask(group)
    train, test = group[~mask], group[mask]
    model = fit_model(train, kind, hardware, regressor, **fit_kwargs)
    pred = model_predict_ms(model, test["size_bytes"].to_numpy(), test["num_workers"].to_numpy())
    return _errors(pred, test["time_ms"].to_numpy(np.float64))


def _model_to_json(model: dict) -> dict:
    """The interpolation model as JSON: worker counts become string keys, arrays lists (floats round-trip)."""
    if model["regressor"] != "interp":
        raise ValueError(f"only the interp model is written as JSON, not {model['regressor']!r}")
    return {**model, "range": {str(w): ext for w, ext in model["range"].items()},
            "curves": {str(w): {name: np.asarray(values).tolist() for name, values in curve.items()}
                       for w, curve in model["curves"].items()}}




def save_model(model: dict, path: Path) -> int:
    """Write ``model`` as JSON (``.json``, interp only) or with joblib (``.joblib``); returns the file size."""
    from .cli import write_atomically
    path = Path(path)
    if path.suffix == ".json":
        text = json.dumps(_model_to_json(model), separators=(",", ":")) + "\n"
        write_atomically(path, lambda tmp: tmp.write_text(text))
    else:
        import joblib
        write_atomically(path, lambda tmp: joblib.dump(model, tmp, compress=3))
    path.chmod(0o644)
    return path.stat().st_size


def train_collectives(hardware: Iterable[str] | None = None, output_dir: str | Path = DEFAULT_COLLECTIVE_DIR,
                      regressor: str = "interp", seed: int = 42, n_estimators: int | None = None,
                      max_depth: int | None = None, compare: bool = True, n_jobs: int = 1, log: Log = print,
                      frame=None, serving: bool = True) -> list[dict]:
    """Train and save models for every (GPU, kind) with data; returns one summary row per GPU x kind.

    ``serving`` applies the corrections of :mod:`pipeweave.collective_serving` (device time, vLLM custom
    all-reduce) and writes their fitted constants to ``<output_dir>/serving.json``.
    """
    from dataset.sources import load_collectives
    from .cli import UserError, check_output_folder, write_atomically

    if frame is None:
        require_shared_data("train_collective_rf.py")
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():  # before the work, not after it
        raise UserError(f"--output_dir {output_dir} exists and is not a folder")
    check_output_folder(output_dir, f"--output_dir {output_dir}")  # serving.json among the GPU specs stops them all
    df = load_collectives(log=log) if frame is None else frame
    data, choice = select_training_data(df, log)
    serving_record = None
    if serving and len(data):
        data, serving_record = serving_adjust(data, choice, df, log)
    if not len(data):
        raise UserError("no collective measurements found (set PIPEWEAVE_SHARED_DATA to the shared data folder "
                        "and/or install aiconfigurator-core==0.12.0)")
    have = sorted(data["stem"].unique())
    if hardware:
        wanted = []
        for name in hardware:
            stem = _stem(name)
            if stem not in have:
                raise UserError(f"no collective measurements for {stem}; GPUs with data: {', '.join(have)}")
            wanted.append(stem)
        stems = sorted(set(wanted))
    else:
        stems = have
    if serving_record is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_serving(serving_record, output_dir)
    fit_kwargs = {"seed": seed, "n_estimators": n_estimators, "max_depth": max_depth, "n_jobs": n_jobs}
    rows = []
    for stem in stems:
        gpu_dir = output_dir / stem
        gpu_dir.mkdir(parents=True, exist_ok=True)
        meta = {"format": MODEL_FORMAT, "hardware": stem, "device_name": _device_name(stem),
                "created_by": "train_collective_rf.py",
                "regressor": regressor, "seed": seed,
                "heldout_protocol": "every 5th size of each worker count (positions 2, 7, 12, ... in size order) "
                                    "held out; model refit on the rest; errors are |pred/true - 1| in %",
                "source_precedence": ["aiconfigurator-core vLLM custom_allreduce (all_reduce only)",
                                      *SOURCE_PRECEDENCE],
                "serving_corrections": serving, "kinds": {}}
        for kind in KINDS:
            path = model_file(gpu_dir, kind, regressor)
            group = data[(data["stem"] == stem) & (data["collective"] == kind)].reset_index(drop=True)
            for stale in {model_file(gpu_dir, kind, other) for other in REGRESSORS} - {path}:
                stale.unlink(missing_ok=True)  # so that find_model_file cannot pick up a previous regressor's file
            if not len(group):
                path.unlink(missing_ok=True)
                continue
            model = fit_model(group, kind, stem, regressor, **fit_kwargs)
            file_bytes = save_model(model, path)
            heldout = {"model": heldout_errors(group, kind, stem, regressor, **fit_kwargs)}
            if compare:
                for other in REGRESSORS:
                    if other != regressor:
                        heldout[other] = heldout_errors(group, kind, stem, other, seed=seed, n_jobs=n_jobs)
            by_workers = {}
            for w, gw in group.groupby("num_workers", sort=True):
                ext = model["range"][int(w)]
                by_workers[str(int(w))] = {
                    "source": choice[(stem, kind)][int(w)]["source"],
                    "skipped_lower_precedence": choice[(stem, kind)][int(w)]["skipped"],
                    **{key: choice[(stem, kind)][int(w)][key] for key in ("converted", "custom_allreduce")
                       if key in choice[(stem, kind)][int(w)]},
                    "rows": int(len(gw)), "min_size_bytes": int(ext["min_size_bytes"]),
                    "max_size_bytes": int(ext["max_size_bytes"]),
                    "extrapolation_algbw_GBps": round(1.0 / ext["ms_per_byte"] * 1e3 / 1e9, 3),
                    "analytical_over_measured_at_max_size": _analytical_ratio(stem, kind, gw)}
            meta["kinds"][kind] = {"file": path.name, "file_bytes": file_bytes, "rows": int(len(group)),
                                   "worker_counts": sorted(int(w) for w in group["num_workers"].unique()),
                                   "params": model["params"], "by_workers": by_workers, "heldout": heldout}
            if file_bytes > MAX_MODEL_BYTES:
                log(f"[collectives] warning: {path} is {file_bytes / 2**20:.1f} MiB (> 2 MiB; do not commit it)")
            rows.append({"hardware": stem, "kind": kind, "rows": int(len(group)),
                         "workers": meta["kinds"][kind]["worker_counts"], "file_bytes": file_bytes,
                         "heldout": heldout})
        meta["data_citation"] = [
            "A PipeWeave github.com/zksainx/pipeweave @ 55e0317 dataset/collective (Apache-2.0)",
            "B Vidur github.com/microsoft/vidur @ 7d47513 data/profiling/network (MIT)",
            "C aiconfigurator-core 0.12.0 systems/data/<system>/comm/nccl (NVIDIA, Apache-2.0)"]
        write_atomically(gpu_dir / METADATA_FILE,
                         lambda tmp: tmp.write_text(json.dumps(meta, indent=2, default=_json_default) + "\n"))
        (gpu_dir / METADATA_FILE).chmod(0o644)
    return rows


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def format_table(rows: list[dict]) -> str:
    """Held-out error table (mean / median abs % error) per GPU x kind."""
    regressors = []
    for r in rows:
        for name in r["heldout"]:
            if name not in regressors:
                regressors.append(name)
    header = ["GPU", "kind", "workers", "rows", "file kB"] + [f"{n} mean/median %" for n in regressors]
    lines = [header]
    for r in rows:
        cells = [r["hardware"], r["kind"], ",".join(map(str, r["workers"])), str(r["rows"]),
                 f"{r['file_bytes'] / 1024:.1f}"]
        for n in regressors:
            e = r["heldout"].get(n)
            cells.append(f"{e['mean_abs_pct_error']:.2f} / {e['median_abs_pct_error']:.2f}" if e else "-")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)

