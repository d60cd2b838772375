"""All-reduce as a serving engine runs it: device time, vLLM's custom all-reduce for small messages.

The e2e runs this project predicts (and serving engines in general) replay decode steps from CUDA graphs and
reduce tensor-parallel activations with vLLM's ``tensor_model_parallel_all_reduce``. Two things follow for the
all-reduce models (``train_collective_rf.py``); both are learned from collective measurements only, never from
end-to-end runs:

1. **Host-timed sweeps are converted to device time.** PipeWeave's collective sweeps (source A) time each call
   from the host, so they include the PyTorch dispatch and synchronisation that a CUDA-graph replay does not pay
   (20-55 us at small sizes). On every (GPU, worker count) that has both a host-timed sweep and a device-timed
   nccl-tests sweep (aiconfigurator-core: A100 2/4/8, H100 2/4, RTX PRO 6000 S 2/4) we take the log ratio
   device / host per message size; the conversion multiplies a host-timed curve by the median of those ratios at
   that size (held constant beyond the sizes measured). Why a size-dependent ratio and not a constant overhead:
   leave-one-GPU-out over the three GPUs, the ratio gives 13.6 / 78.8 / 16.0 % mean error (A100 / H100 /
   RTX PRO 6000 S, against the device-timed sweep), a constant per-worker-count overhead 23.0 / 86.0 / 31.2 %,
   no conversion 67.9 / 149.0 / 61.1 % (``serving.json``; H100's 2-GPU host sweep is 2.7x slower than
   nccl-tests even at 256 MiB, which neither model can know); the
   ratio also never turns a time negative, which an overhead does on H20, whose host-timed small messages
   (20 us for 8 GPUs) are faster than A100's nccl-tests. Only all-reduce is converted (the relation was measured
   on all-reduce).

2. **vLLM custom all-reduce below 8 MiB on NVLink.** vLLM's ``CustomAllreduce`` (vllm/distributed/device_communicators/
   custom_all_reduce.py and csrc/custom_all_reduce.cuh) handles messages below ``max_size`` = 8 MiB when the GPUs
   are fully NVLink-connected (or exactly two): a one-stage kernel (every rank reads the whole buffer of every
   peer: (n - 1) x bytes over its links) for n = 2, or n <= 4 and < 512 KiB, or n <= 8 and < 256 KiB, else a
   two-stage reduce-scatter + all-gather (2 (n - 1) / n x bytes). Model::

       t = L_stage + traffic / (eta x linkGbps)

   with ``linkGbps`` from the GPU's hardware JSON and (L_1stage, L_2stage, eta) fitted per NVLink generation
   (``linkType``) in log space on aiconfigurator-core's measured vLLM custom all-reduce (CUDA-graph replay) of the
   GPUs of that generation (nvlink3: A100; nvlink4: H100, H200; nvlink5: B200, B300, GB200, GB300). Where a GPU
   has such a measurement for a worker count, the measurement itself is the model (all sizes; above 8 MiB vLLM calls NCCL
   and the table has that too). Otherwise (H20, H800: NVLink 4, no custom all-reduce data) the sizes below
   8 MiB of the NCCL curve are replaced by the fitted model of its generation. PCIe GPUs keep NCCL (vLLM
   disables the custom kernel on more than two PCIe GPUs; the two-GPU gain in the data is < 1 us).
   Within NVLink 4, fitting on H100 and predicting H200 (and back) gives the errors in ``serving.json``.

3. **Measured ring efficiency of the analytical estimate.** Where no measurement covers a GPU or worker count,
   the textbook ring estimate at the spec link rate is optimistic (measured transfers of 32 MiB and up take
   0.9-1.8x its bandwidth term on NVLink, GB200 with 2 GPUs 4.7x, and 1.7-16x on PCIe). Its bandwidth term is
   scaled by the median of what other GPUs of the same link measured at the same worker count
   (:func:`ring_factor`), scored leave-one-GPU-out in ``serving.json`` (``ring_efficiency``).

The fitted constants and the conversion curve are written to ``collective_models/serving.json``; the predictor's
analytical fallback (a GPU or worker count without measurements) uses the same custom-all-reduce model and ring
efficiency.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pandas only for training; prediction reads serving.json with the json module
    import pandas as pd

import numpy as np

SERVING_FILE = "serving.json"
HOST_TIMED_PREFIX = "pipeweave"  # PipeWeave's sweeps: timed from the host
DEVICE_TIMED_PREFIX = "aiconfigurator-core"  # nccl-tests: device time
CUSTOM_AR_MARK = "custom_allreduce"  # aiconfigurator's vLLM custom all-reduce table (source path contains it)
CUSTOM_AR_MAX_BYTES = 8 * 2**20  # vLLM CustomAllreduce max_size default
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
SMOOTH_WINDOW = 5

Log = Callable[[str], None]


def is_host_timed(source: str) -> bool:
    return source.startswith(HOST_TIMED_PREFIX)


def is_custom_allreduce(source: str) -> bool:
    return CUSTOM_AR_MARK in source


# ------------------------------------------------------------------------------------------------------------
# 1. host-timed -> device time
# ------------------------------------------------------------------------------------------------------------

def _log_curve(group: pd.DataFrame, smooth: bool) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    g = group.groupby("size_bytes", sort=True)["time_ms"].mean()
    log_t = np.log(g.to_numpy(np.float64))
    if smooth:
        log_t = pd.Series(log_t).rolling(SMOOTH_WINDOW, center=True, min_periods=1).median().to_numpy()
    return np.log2(g.index.to_numpy(np.float64)), log_t


def _host_device_pairs(frame: pd.DataFrame) -> dict:
    """{(stem, workers): (log2 sizes, log host time, log device time)} at the device sweep's sizes."""
    ar = frame[frame["collective"] == "all_reduce"]
    pairs = {}
    for (stem, workers), g in ar.groupby(["stem", "num_workers"], sort=True):
        host = g[g["source"].map(is_host_timed)]
        device = g[g["source"].str.startswith(DEVICE_TIMED_PREFIX) & ~g["source"].map(is_custom_allreduce)]
        if not len(host) or not len(device):
            continue
        hx, hy = _log_curve(host, smooth=True)
        dx, dy = _log_curve(device, smooth=False)
        inside = (dx >= hx[0]) & (dx <= hx[-1])
        pairs[(stem, int(workers))] = (dx[inside], np.interp(dx[inside], hx, hy), dy[inside])
    return pairs


def _ratio_curve(pairs: dict) -> dict:
    import pandas as pd

    table = pd.concat([pd.Series(dy - hy, index=x) for x, hy, dy in pairs.values()], axis=1)
    ratio = table.median(axis=1, skipna=True).dropna().sort_index()
    return {"log2_size": ratio.index.tolist(), "log_ratio": ratio.round(6).tolist()}


def _logo_errors(pairs: dict) -> dict:
    """Leave-one-GPU-out mean |converted / device - 1| in %: this ratio, a constant overhead, no conversion."""
    out = {}
    for gpu in sorted({stem for stem, _ in pairs}):
        train = {k: v for k, v in pairs.items() if k[0] != gpu}
        test = {k: v for k, v in pairs.items() if k[0] == gpu}
        if not train:
            continue
        curve = _ratio_curve(train)
        errors = {"ratio": [], "overhead": [], "none": []}
        for (_, workers), (x, hy, dy) in test.items():
            same = [v for k, v in train.items() if k[1] == workers] or list(train.values())
            overhead = np.median(np.concatenate([np.exp(h) - np.exp(d) for _, h, d in same]))
            device, host = np.exp(dy), np.exp(hy)
            errors["ratio"].append(to_device_time(curve, 2.0 ** x, host) / device - 1)
            errors["overhead"].append(np.maximum(host - overhead, 1e-6) / device - 1)
            errors["none"].append(host / device - 1)
        out[gpu] = {k: round(float(np.mean(np.abs(np.concatenate(v)))) * 100, 1) for k, v in errors.items()}
    return out


def fit_host_to_device(frame: pd.DataFrame) -> dict | None:
    """Median log(device / host) per log2 size over the (GPU, workers) pairs that have both kinds of sweep."""
    pairs = _host_device_pairs(frame)
    if not pairs:
        return None
    return {**_ratio_curve(pairs), "pairs": [f"{stem} x{w}" for stem, w in pairs],
            "rule": "device_ms = host_ms x exp(median log ratio at that size; end values held)",
            "leave_one_gpu_out_mean_abs_pct_error": _logo_errors(pairs)}


def to_device_time(curve: dict, size_bytes: np.ndarray, time_ms: np.ndarray) -> np.ndarray:
    shift = np.interp(np.log2(size_bytes), curve["log2_size"], curve["log_ratio"])
    return np.asarray(time_ms, dtype=np.float64) * np.exp(shift)


# ------------------------------------------------------------------------------------------------------------
# 2. vLLM custom all-reduce
# ------------------------------------------------------------------------------------------------------------

ONE_STAGE_MAX_BYTES = {4: 512 * 1024, 8: 256 * 1024}  # vLLM's one-stage limit up to that many GPUs (2: always)
#: the message sizes at which the modelled all-reduce changes algorithm (above them: two-stage, then NCCL)
ALGORITHM_SWITCH_BYTES = (*sorted(ONE_STAGE_MAX_BYTES.values()), CUSTOM_AR_MAX_BYTES)


def one_stage(size_bytes, workers) -> np.ndarray:
    """vLLM's choice of the one-stage kernel (custom_all_reduce.cuh)."""
    s, n = np.asarray(size_bytes, dtype=np.float64), np.asarray(workers)
    return (n == 2) | ((n <= 4) & (s < ONE_STAGE_MAX_BYTES[4])) | ((n <= 8) & (s < ONE_STAGE_MAX_BYTES[8]))


def custom_allreduce_ms(params: dict, size_bytes, workers, link_gbps: float) -> np.ndarray:
    s, n = np.broadcast_arrays(np.asarray(size_bytes, dtype=np.float64), np.asarray(workers, dtype=np.float64))
    one = one_stage(s, n)
    traffic = np.where(one, (n - 1) * s, 2 * (n - 1) / n * s)
    latency_us = np.where(one, params["latency_1stage_us"], params["latency_2stage_us"])
    return latency_us * 1e-3 + traffic / (params["bandwidth_efficiency"] * link_gbps * 1e9) * 1e3


def _fit_params(rows: pd.DataFrame) -> dict:
    from scipy.optimize import least_squares

    s, n = rows["size_bytes"].to_numpy(np.float64), rows["num_workers"].to_numpy(np.float64)
    link, log_t = rows["link_gbps"].to_numpy(np.float64), np.log(rows["time_ms"].to_numpy(np.float64))

    def residual(p):
        params = {"latency_1stage_us": p[0], "latency_2stage_us": p[1], "bandwidth_efficiency": p[2]}
        return np.log(custom_allreduce_ms(params, s, n, link)) - log_t

    fit = least_squares(residual, [5.0, 10.0, 0.5], bounds=([0.1, 0.1, 0.01], [100.0, 100.0, 2.0]))
    return {"latency_1stage_us": round(float(fit.x[0]), 4), "latency_2stage_us": round(float(fit.x[1]), 4),
            "bandwidth_efficiency": round(float(fit.x[2]), 4)}


def _ape(params: dict, rows: pd.DataFrame) -> float:
    pred = custom_allreduce_ms(params, rows["size_bytes"], rows["num_workers"], rows["link_gbps"].to_numpy())
    return round(float(np.mean(np.abs(pred / rows["time_ms"].to_numpy() - 1)) * 100), 2)


def fit_custom_allreduce(frame: pd.DataFrame, links: dict[str, tuple[str, float, float]]) -> dict:
    """{linkType: params + provenance} from the custom all-reduce rows (< 8 MiB) of NVLink GPUs."""
    if frame.empty:  # (an empty string column maps to strings, not booleans)
        return {}
    rows = frame[frame["source"].map(is_custom_allreduce) & (frame["size_bytes"] < CUSTOM_AR_MAX_BYTES)].copy()
    rows = rows[rows["stem"].map(lambda s: links[s][0].startswith("nvlink")).astype(bool)]
    if rows.empty:
        return {}
    rows["link_type"] = rows["stem"].map(lambda s: links[s][0])
    rows["link_gbps"] = rows["stem"].map(lambda s: links[s][1])
    out = {}
    for link_type, g in rows.groupby("link_type", sort=True):
        params = _fit_params(g)
        gpus = sorted(g["stem"].unique())
        logo = {gpu: _ape(_fit_params(g[g["stem"] != gpu]), g[g["stem"] == gpu]) for gpu in gpus if len(gpus) > 1}
        out[link_type] = {**params, "fitted_on": gpus, "rows": int(len(g)), "in_sample_mean_abs_pct_error": _ape(params, g),
                          "leave_one_gpu_out_mean_abs_pct_error": logo}
    return out


def custom_allreduce_params(fits: dict, link_type: str) -> dict | None:
    """The fit of ``link_type``'s generation, else of the nearest NVLink generation that has one."""
    if not link_type.startswith("nvlink") or not fits:
        return None
    if link_type in fits:
        return fits[link_type]
    gen = int(link_type.removeprefix("nvlink"))
    return fits[min(fits, key=lambda t: (abs(int(t.removeprefix("nvlink")) - gen), t))]


# ------------------------------------------------------------------------------------------------------------
# 3. measured ring efficiency of the analytical estimate
# ------------------------------------------------------------------------------------------------------------

RING_FIT_MIN_BYTES = 32 * 2**20  # bandwidth-bound: the latency term is < 1 % of the time from here on
RING_MIN_GPUS = 2  # a factor stands for a link only if more than one GPU measured it


def link_family(link_type: str) -> str:
    """"nvlink" or "pcie": the generation's digits dropped."""
    return link_type.rstrip("0123456789")


def measured_ring_factors(data: pd.DataFrame, links: dict[str, tuple[str, float, float]]) -> list[dict]:
    """Per (GPU, kind, worker count) of the training rows: how much longer than the textbook ring estimate's
    bandwidth term the measured transfers take, exp(median log((t - latency term) / bandwidth term)) over the
    sizes from :data:`RING_FIT_MIN_BYTES` (``links``: stem -> (linkType, linkGbps, linkLatencyUs))."""
    from .collectives import analytical_collective_terms

    out = []
    for (stem, kind, workers), g in data.groupby(["stem", "collective", "num_workers"], sort=True):
        big = g[g["size_bytes"] >= RING_FIT_MIN_BYTES]
        if big.empty:
            continue
        link_type, gbps, latency_us = links[stem]
        latency, transfer = analytical_collective_terms(kind, big["size_bytes"].to_numpy(np.float64), int(workers),
                                                        gbps, latency_us)
        spent = np.maximum(big["time_ms"].to_numpy(np.float64) - latency, 1e-12)
        out.append({"gpu": stem, "link_type": link_type, "kind": kind, "workers": int(workers),
                    "factor": round(float(np.exp(np.median(np.log(spent / transfer)))), 4), "sizes": int(len(big))})
    return out


def ring_factor(measured: list[dict], link_type: str, kind: str, workers: int, exclude: str | None = None
                ) -> tuple[float, str]:
    """(factor on the ring estimate's bandwidth term, what it rests on) for a GPU on ``link_type``.

    The median over the GPUs of :func:`measured_ring_factors` (``exclude`` left out) that share the link and the
    worker count, taking the first of: the same generation, the same family (NVLink or PCIe), then the same two
    at the nearest measured worker count (log2 distance; at equal distance the same generation first, then the
    larger count); each only where at least :data:`RING_MIN_GPUS` GPUs measured it. The worker count comes before
    the generation because the factor moves far more with it (NVLink: ~1.7 at 2 GPUs, 0.9-1.4 at 8) than between
    generations. Without such GPUs: 1 (the textbook estimate)."""
    rows = [m for m in measured if m["kind"] == kind and m["gpu"] != exclude]
    levels = ((lambda m: m["link_type"] == link_type, link_type),
              (lambda m: link_family(m["link_type"]) == link_family(link_type), link_family(link_type)))
    candidates = []  # (log2 distance of the worker count, level, count)
    for level, (same, _) in enumerate(levels):
        counts = {m["workers"] for m in rows if same(m)}
        for count in counts:
            if len({m["gpu"] for m in rows if same(m) and m["workers"] == count}) >= RING_MIN_GPUS:
                candidates.append((abs(float(np.log2(count)) - float(np.log2(workers))), level, -count))
    if candidates:
        exact = [c for c in candidates if c[0] == 0]
        _, level, count = min(exact) if exact else min(candidates)
        same, label = levels[level]
        chosen = [m for m in rows if same(m) and m["workers"] == -count]
        factor = float(np.exp(np.median(np.log([m["factor"] for m in chosen]))))
        return factor, f"median of {', '.join(sorted(m['gpu'] for m in chosen))} ({label}, {-count} workers)"
    return 1.0, "none measured on this link: textbook ring"


def _logo_estimates(data: pd.DataFrame, links: dict[str, tuple[str, float, float]], frame: pd.DataFrame,
                    modelled_small: set, measured: list[dict]) -> list[dict]:
    """Every measured (GPU, kind, worker count) estimated analytically with the GPU left out of everything fitted
    (its ring factor and its NVLink generation's custom all-reduce fit), as
    :meth:`pipeweave.collectives.CollectivePredictor.analytical_ms` gives it. Per case: the measured sizes and
    times, the textbook terms, the factor and the whole estimate; ``ring`` marks the sizes the ring estimate serves
    (NVLink all-reduce from vLLM's custom all-reduce limit up, every size otherwise), ``scored`` the sizes that
    are measurements (``modelled_small``: (GPU, workers) whose sizes below that limit are the custom all-reduce
    model's)."""
    from .collectives import analytical_collective_terms

    custom_fits: dict[str, dict] = {}
    cases = []
    for (stem, kind, workers), g in data.groupby(["stem", "collective", "num_workers"], sort=True):
        link_type, gbps, latency_us = links[stem]
        workers = int(workers)
        size, time = g["size_bytes"].to_numpy(np.float64), g["time_ms"].to_numpy(np.float64)
        factor, basis = ring_factor(measured, link_type, kind, workers, exclude=stem)
        latency, transfer = analytical_collective_terms(kind, size, workers, gbps, latency_us)
        estimate = latency + factor * transfer
        custom = kind == "all_reduce" and link_type.startswith("nvlink") and workers in CUSTOM_AR_WORLD_SIZES
        if custom:
            if stem not in custom_fits:
                custom_fits[stem] = fit_custom_allreduce(frame[frame["stem"] != stem], links)
            params = custom_allreduce_params(custom_fits[stem], link_type)
            small = size < CUSTOM_AR_MAX_BYTES
            if params is not None and small.any():
                estimate[small] = custom_allreduce_ms(params, size[small], workers, gbps)
        modelled = kind == "all_reduce" and (stem, workers) in modelled_small
        cases.append({"gpu": stem, "kind": kind, "workers": workers, "factor": factor, "basis": basis,
                      "time": time, "textbook": latency + transfer, "with_factor": latency + factor * transfer,
                      "estimate": estimate, "ring": size >= CUSTOM_AR_MAX_BYTES if custom else np.ones(len(size), bool),
                      "scored": size >= CUSTOM_AR_MAX_BYTES if modelled else np.ones(len(size), bool)})
    return cases


def _ring_logo(cases: list[dict]) -> dict:
    """Leave-one-GPU-out score of the ring factor: textbook against measured factor, at the ring's sizes."""
    out = []
    for case in cases:
        ring, time = case["ring"], case["time"]
        if not ring.any():
            continue
        log_error = {k: np.abs(np.log(case[column][ring] / time[ring]))
                     for k, column in (("textbook", "textbook"), ("measured_factor", "with_factor"))}
        out.append({"gpu": case["gpu"], "kind": case["kind"], "workers": case["workers"],
                    "factor": round(case["factor"], 4), "basis": case["basis"], "sizes": int(ring.sum()),
                    **{f"mean_abs_log_error_{k}": round(float(v.mean()), 4) for k, v in log_error.items()}})
    pooled = {k: round(float(np.mean([c[f"mean_abs_log_error_{k}"] for c in out])), 4) if out else None
              for k in ("textbook", "measured_factor")}
    return {"cases": out, "mean_over_cases": pooled}


def _interval_entry(units: dict[tuple, np.ndarray]) -> dict:
    """The 80 % interval of log(measured / analytical estimate) on a GPU among none of ``units`` (a unit is one GPU,
    kind and worker count), computed as the kernels' intervals are
    (:func:`pipeweave.interval_eval.predictive_quantiles`), and its coverage leave-one-GPU-out: each GPU's sizes
    against the interval of the other GPUs' units, where at least two remain."""
    from .interval_eval import coverage_cell, predictive_quantiles

    def named(keep) -> dict[str, np.ndarray]:
        return {f"{stem} {kind} x{workers}": r for (stem, kind, workers), r in units.items() if keep(stem)}

    every = named(lambda stem: True)
    low, high = predictive_quantiles(every)
    coverage = {}
    for gpu in sorted({stem for stem, _, _ in units}):
        others = named(lambda stem: stem != gpu)
        if len(others) >= 2:
            coverage[gpu] = round(coverage_cell(np.concatenate(list(named(lambda s: s == gpu).values())),
                                                others)["coverage"], 3)
    return {"low": round(low, 4), "high": round(high, 4), "units": sorted(every),
            "coverage_leave_one_gpu_out": coverage,
            "mean_coverage": round(float(np.mean(list(coverage.values()))), 3) if coverage else None}


def _estimate_interval(residuals: dict[tuple, np.ndarray], links: dict[str, tuple[str, float, float]]) -> dict:
    """Per link family, the estimate's interval for each kind and worker count that enough GPUs measured (its error
    depends on the worker count as its factor does: two PCIe GPUs share one switch, eight may cross sockets
    without P2P), and pooled over the family for the others. Enough is the kernels' intervals' minimum,
    :data:`pipeweave.interval_eval.MIN_GPUS` (3): with two, the spread of their biases rests on one difference."""
    from .interval_eval import MIN_GPUS

    out = {}
    for family in sorted({link_family(links[stem][0]) for stem, _, _ in residuals}):
        units = {key: r for key, r in residuals.items() if link_family(links[key[0]][0]) == family}
        by_count = {}
        for kind, workers in sorted({(kind, workers) for _, kind, workers in units}):
            same = {key: r for key, r in units.items() if key[1:] == (kind, workers)}
            if len(same) >= MIN_GPUS:
                by_count[f"{kind} x{workers}"] = _interval_entry(same)
        out[family] = {"pooled": _interval_entry(units), "by_count": by_count}
    return out


def fit_ring_efficiency(data: pd.DataFrame, links: dict[str, tuple[str, float, float]], frame: pd.DataFrame,
                        modelled_small: set) -> dict:
    """``serving.json``'s ``ring_efficiency``: the measured factors, their leave-one-GPU-out score and the interval
    of the whole analytical estimate (``frame``: every collective row, for the custom all-reduce fits)."""
    measured = measured_ring_factors(data, links)
    cases = _logo_estimates(data, links, frame, modelled_small, measured)
    residuals = {(c["gpu"], c["kind"], c["workers"]): np.log(c["time"][c["scored"]] / c["estimate"][c["scored"]])
                 for c in cases if c["scored"].any()}
    return {"rule": "analytical time = latency term + factor x bandwidth term; factor: "
                    "pipeweave.collective_serving.ring_factor over 'measured'",
            "fit_min_size_bytes": RING_FIT_MIN_BYTES, "min_gpus": RING_MIN_GPUS, "measured": measured,
            "leave_one_gpu_out": _ring_logo(cases),
            "interval": _estimate_interval(residuals, links)}


# ------------------------------------------------------------------------------------------------------------
# applied to the selected training rows
# ------------------------------------------------------------------------------------------------------------

def serving_adjust(data: pd.DataFrame, choice: dict, frame: pd.DataFrame, log: Log) -> tuple[pd.DataFrame, dict]:
    """Apply 1. and 2. to the rows select_training_data kept and measure 3. on them; returns (rows, serving.json
    content)."""
    import pandas as pd
    from analytical_model.hardware import load_hardware

    frame = frame.assign(stem=frame["hardware"].map({h: load_hardware(h).stem for h in frame["hardware"].unique()}))
    specs = {stem: load_hardware(stem) for stem in frame["stem"].unique()}
    links = {stem: (spec.link_type, spec.link_gbps, spec.link_latency_us) for stem, spec in specs.items()}
    curve = fit_host_to_device(frame)
    fits = fit_custom_allreduce(frame, links)
    serving = {"host_to_device": curve, "custom_allreduce": fits, "custom_allreduce_max_bytes": CUSTOM_AR_MAX_BYTES,
               "custom_allreduce_world_sizes": list(CUSTOM_AR_WORLD_SIZES)}
    parts = []
    for (stem, kind, workers), g in data.groupby(["stem", "collective", "num_workers"], sort=True):
        info = choice[(stem, kind)][int(workers)]
        source = info["source"]
        if kind != "all_reduce" or is_custom_allreduce(source):
            parts.append(g)
            continue
        g = g.copy()
        if is_host_timed(source) and curve is not None:
            g["time_ms"] = to_device_time(curve, g["size_bytes"].to_numpy(np.float64), g["time_ms"])
            info["converted"] = "host-timed, converted to device time (collective_models/serving.json)"
        params = custom_allreduce_params(fits, links[stem][0])
        if params is not None and int(workers) in CUSTOM_AR_WORLD_SIZES:
            small = g["size_bytes"] < CUSTOM_AR_MAX_BYTES
            g.loc[small, "time_ms"] = custom_allreduce_ms(params, g.loc[small, "size_bytes"], int(workers),
                                                          links[stem][1])
            info["custom_allreduce"] = (f"sizes < {CUSTOM_AR_MAX_BYTES} B: vLLM custom all-reduce model "
                                        f"({'/'.join(params['fitted_on'])} fit, {links[stem][0]})")
            log(f"[collectives] {stem} all_reduce x{int(workers)}: {info['custom_allreduce']}")
        parts.append(g)
    adjusted = pd.concat(parts).reset_index(drop=True)
    modelled_small = {(stem, workers) for (stem, kind), counts in choice.items() if kind == "all_reduce"
                      for workers, info in counts.items() if "custom_allreduce" in info}
    # an all-gather's analytical estimate is its all-reduce's (pipeweave.collectives.fallback_kind): no own factors
    ring_rows = adjusted[adjusted["collective"] != "all_gather"]
    serving["ring_efficiency"] = fit_ring_efficiency(ring_rows, links, frame, modelled_small)
    return adjusted, serving


def write_serving(serving: dict, output_dir: Path) -> None:
    from .cli import write_atomically

    path = Path(output_dir) / SERVING_FILE
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(serving, indent=2) + "\n"))
    path.chmod(0o644)


def read_serving(model_dir: Path) -> dict:
    """The serving fits ``train_collective_rf.py`` writes beside the per-GPU folders; a folder without them is
    refused rather than read as "nothing fitted", which would silently change the analytical estimate."""
    path = Path(model_dir) / SERVING_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the analytical collective estimate needs the custom all-reduce and ring efficiency "
            f"fits that `python3 train_collective_rf.py --output_dir {model_dir}` writes there")
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): rewrite it with `python3 train_collective_rf.py "
                         f"--output_dir {model_dir}`") from None
