"""``search_config.py``: which (GPU, TP, PP, EP, max_num_seqs, weight dtype) serves a model within TTFT/TPOT
targets, most cheaply.

Every candidate with TP × PP within the GPU budget is simulated with the vLLM scheduler on the same request
stream; candidates the model cannot run on (TP not dividing the heads, weights not fitting, no collective model)
are kept in the table as infeasible with the reason. Feasible ones are ranked by output tokens/s per GPU among
those meeting the targets (then the rest, by the same measure): at one offered load (``--qps``), the candidates that
serve it with the fewest GPUs come first. With ``--capacity`` each candidate's *capacity* is searched instead, the
highest request rate at which it meets the targets (:func:`capacity`), and candidates are ranked by capacity per GPU:
which serves the most load per GPU.

Parallelism: ``--workers N`` starts a Dask ``LocalCluster`` of N single-threaded worker processes; ``--scheduler
ADDRESS`` submits to an existing Dask cluster (``dask scheduler`` + ``dask worker`` on several machines) for sweeps
larger than one machine; ``--workers 1`` runs in this process. Dask distributed rather than Ray: it is pure
Python and pip-installable with no native server, its ``LocalCluster`` runs in CI on two cores, and
``client.map`` over picklable settings is all a sweep of independent simulations needs. Each worker loads the
models once and keeps them for its later candidates.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import UnknownHardwareError
from pipeweave.cli import ArgumentParser, UserError, positive_float, require_png, write_atomically
from pipeweave.engine import INTERVAL_ENDS, uncalibrated
from pipeweave.moe import EP_NOTE
from pipeweave.paths import command
from pipeweave.report import EXTRAPOLATED_NOTE_SHARE
from pipeweave.serving.cli import (add_engine_arguments, add_scheduler_arguments, arrivals_note, check_paths,
                                  config_from_args, engine_from_settings)
from pipeweave.serving.run import ServingConfig, check_model_and_requests, weight_dtype
from pipeweave.serving.step_cost import default_prefill_attention
from pipeweave.validation import attention_warnings
from pipeweave.workload import DTYPES

DEFAULT_MAX_NUM_SEQS = (32, 128, 512)
#: capacity search: the request rate doubles from --qps (default CAPACITY_START_QPS) while the targets are met, or
#: halves while they are missed, at most CAPACITY_MAX_STEPS times (4,096x either way), then the bracket is bisected
#: (geometric midpoint) until its ends are within CAPACITY_PRECISION of each other
CAPACITY_START_QPS = 1.0
CAPACITY_MAX_STEPS = 12
CAPACITY_PRECISION = 0.05
#: columns of a feasible candidate's simulation (NaN on infeasible rows); ``qps``: the request rate they are at
#: (--qps, or the capacity), blank for a stream of recorded or simultaneous arrivals
METRICS = ("qps", "qps_per_gpu", "ttft_ms", "tpot_ms", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
           "makespan_ms", "kv_cache_tokens", "preemptions", "max_num_batched_tokens", "unmeasured_gpu",
           "extrapolated_share")
#: the counts among :data:`METRICS`: whole numbers, blank on infeasible rows (not floats in the CSV)
COUNT_METRICS = ("kv_cache_tokens", "preemptions", "max_num_batched_tokens")
#: the table's columns in order (whichever candidate comes first)
COLUMNS = ("rank", "hardware", "dtype", "tp", "pp", "ep", "gpus", "max_num_seqs", "feasible", "meets_targets",
           "reason", *METRICS)
#: columns added with --gpu_cost: the replica's price and that of its output (at the rate of its metrics)
COST_COLUMNS = ("usd_per_hour", "usd_per_million_output_tokens")
_ENGINES: dict[tuple, object] = {}  # per worker process: the prediction engine by its settings


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{flag} must be a comma-separated list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} must list integers >= 1, got {text!r}")
    return list(dict.fromkeys(values))  # a repeated value would simulate the same candidate twice


def _dtype_list(text: str | None) -> list[str | None]:
    """``--dtype``: weight dtypes to try (None: the checkpoint's, else BF16)."""
    if text is None:
        return [None]
    values = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [value for value in values if value not in DTYPES]
    if not values or unknown:
        raise UserError(f"--dtype must list dtypes among {', '.join(DTYPES)}, got {text!r}")
    return list(dict.fromkeys(values))


#: the --pp and --ep lists tried when not given
DEFAULT_PP, DEFAULT_EP = "1,2", "1"


def candidates(base: ServingConfig, gpus: list[str], gpu_budget: int, tps: list[int], pps: list[int],
               max_num_seqs: list[int], dtypes: list[str | None] = (None,), eps: list[int] = (1,)
               ) -> list[ServingConfig]:
    """Every combination within the GPU budget whose EP divides its TP (the expert groups are made of the TP
    group's GPUs)."""
    return [replace(base, hardware=gpu, tp=tp, pp=pp, max_num_seqs=seqs, dtype=dtype, ep=ep)
            for gpu in gpus for dtype in dtypes for tp in tps for ep in eps if tp % ep == 0
            for pp in pps if tp * pp <= gpu_budget for seqs in max_num_seqs]


def unused_values_notes(configs: list[ServingConfig], tps: list[int], pps: list[int], eps: list[int],
                        gpu_budget: int, given=("tp", "pp", "ep")) -> list[str]:
    """A note per value of --tp, --pp or --ep that no candidate takes, saying why (nothing asked for is dropped
    unsaid); only for the flags in ``given`` (a default list, such as --pp 1,2 on one GPU, is not the user's ask)."""
    used = {key: {getattr(config, key) for config in configs} for key in ("tp", "pp", "ep")}
    unused = {key: [value for value in values if value not in used[key] and key in given]
              for key, values in (("tp", tps), ("pp", pps), ("ep", eps))}
    notes = []
    for tp in unused["tp"]:
        why = (f"above --gpu_budget {gpu_budget} with every --pp" if tp * min(pps) > gpu_budget
               else f"no --ep divides it ({', '.join(map(str, eps))})")
        notes.append(f"Note: --tp {tp}: {why}, not simulated")
    divided = "" if eps == [1] else " that an --ep divides"
    for pp in unused["pp"]:
        notes.append(f"Note: --pp {pp}: TP x PP is above --gpu_budget {gpu_budget} with every --tp{divided}, not "
                     f"simulated")
    for ep in unused["ep"]:
        notes.append(f"Note: --ep {ep}: it divides no --tp within --gpu_budget {gpu_budget} "
                     f"({', '.join(map(str, tps))}), not simulated")
    return notes


def _percentile(simulation, key: str, q: float) -> float | None:
    from pipeweave.serving.simulator import request_metrics

    values = request_metrics(simulation.requests)[key]
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if values.size else None


def judge(run, targets: dict) -> tuple[bool, float | None, float | None]:
    """(whether ``run`` meets the targets, its TTFT and TPOT at the targets' percentiles). A stream whose requests
    all stop at their first token has no TPOT, so no TPOT target to miss (the row says so)."""
    ttft = _percentile(run.simulation, "ttft_ms", targets["ttft_percentile"])
    tpot = _percentile(run.simulation, "tpot_ms", targets["tpot_percentile"])
    meets = ((targets["ttft_ms"] is None or ttft <= targets["ttft_ms"])
             and (targets["tpot_ms"] is None or tpot is None or tpot <= targets["tpot_ms"]))
    return bool(meets), ttft, tpot


def capacity(config: ServingConfig, engine, targets: dict) -> tuple[object, str]:
    """(the run at the highest request rate found to meet the targets, or at the lowest rate tried when none does;
    a note where the search hit its bounds). Poisson arrivals with the same seed at every rate (the same stream,
    time-scaled), so the runs differ only in load."""
    from pipeweave.serving.run import simulate_config

    def attempt(qps: float):
        run = simulate_config(replace(config, qps=qps), engine, interval_end=targets.get("interval_end", "point"))
        return judge(run, targets)[0], run

    rate = config.qps or CAPACITY_START_QPS
    meets, run = attempt(rate)
    best = run if meets else None
    low, high = (rate, None) if meets else (None, rate)
    for _ in range(CAPACITY_MAX_STEPS):
        if low is not None and high is not None:
            break
        rate = rate * 2 if meets else rate / 2
        meets, run = attempt(rate)
        if meets:
            low, best = rate, run
        else:
            high = rate
    if low is None:
        return run, f"misses the targets even at {rate:.4g} requests/s"
    if high is None:
        return best, f"meets the targets up to the highest rate tried, {low:.4g} requests/s: its capacity is higher"
    while high / low > 1 + CAPACITY_PRECISION:
        rate = math.sqrt(low * high)
        meets, run = attempt(rate)
        if meets:
            low, best = rate, run
        else:
            high = rate
    return best, ""


def evaluate(config: ServingConfig, engine: tuple, targets: dict) -> dict:
    """Simulate one candidate (run on a Dask worker), at the offered rate or, with ``targets["capacity"]``, at its
    capacity (:func:`capacity`); an infeasible candidate returns its reason."""
    from pipeweave.serving.run import simulate_config
    from pipeweave.serving.simulator import summarize
    from pipeweave.workload import load_model_config

    if engine not in _ENGINES:
        _ENGINES[engine] = engine_from_settings(engine)
    row = {"hardware": config.hardware, "dtype": config.dtype, "tp": config.tp, "pp": config.pp, "ep": config.ep,
           "gpus": config.tp * config.pp, "max_num_seqs": config.max_num_seqs}
    try:
        # the checkpoint's dtype where --dtype was not given
        row["dtype"] = weight_dtype(load_model_config(config.model_config), config.dtype)
        if targets.get("capacity"):
            run, note = capacity(config, _ENGINES[engine], targets)
        else:
            run, note = simulate_config(config, _ENGINES[engine], interval_end=targets.get("interval_end", "point")), ""
    except (UserError, ValueError, FileNotFoundError) as exc:
        return row | {"feasible": False, "meets_targets": False, "reason": str(exc.args[0] if exc.args else exc)}
    summary = summarize(run.simulation)
    meets, ttft, tpot = judge(run, targets)
    if targets["tpot_ms"] is not None and tpot is None:
        note = "; ".join(filter(None, [note, "TPOT undefined (no request has a second output token): --tpot_ms not "
                                             "checked"]))
    qps = run.config.qps
    return row | {
        "feasible": True, "meets_targets": meets, "reason": note,
        "qps": qps, "qps_per_gpu": None if qps is None else qps / (config.tp * config.pp),
        "ttft_ms": ttft, "tpot_ms": tpot,
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "output_tokens_per_s_per_gpu": summary["output_tokens_per_s"] / (config.tp * config.pp),
        "makespan_ms": summary["makespan_ms"], "kv_cache_tokens": run.settings["kv_cache_tokens"],
        "preemptions": summary["preemptions"], "max_num_batched_tokens": run.settings["max_num_batched_tokens"],
        "unmeasured_gpu": ";".join(run.unmeasured_gpu), "extrapolated_share": run.extrapolation["share"],
    }


def run_sweep(configs: list[ServingConfig], engine: tuple, targets: dict, workers: int = 1,
              scheduler_address: str | None = None, progress=None, prices: dict[str, float] | None = None
              ) -> pd.DataFrame:
    """Evaluate every candidate: in this process, on a local Dask cluster, or on an existing one; ranked
    (:func:`rank`)."""
    if scheduler_address is None and workers <= 1:
        rows = []
        for config in configs:
            rows.append(evaluate(config, engine, targets))
            if progress is not None:
                progress(1)
        return rank(pd.DataFrame(rows), targets.get("capacity", False), prices)
    from distributed import Client, LocalCluster, as_completed

    if scheduler_address is not None:
        client, cluster = Client(scheduler_address), None
    else:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        futures = client.map(evaluate, configs, engine=engine, targets=targets, pure=False)
        for _ in as_completed(futures):
            if progress is not None:
                progress(1)
        return rank(pd.DataFrame(client.gather(futures)), targets.get("capacity", False), prices)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def rank(table: pd.DataFrame, by_capacity: bool = False, prices: dict[str, float] | None = None) -> pd.DataFrame:
    """Candidates meeting the targets first, then feasible ones, each by output tokens/s per GPU (``by_capacity``:
    by requests/s per GPU at their capacity, then output tokens/s per GPU), descending; with ``prices`` (USD per
    GPU-hour by GPU stem), by the cost of a million output tokens, ascending (:data:`COST_COLUMNS`)."""
    for column in METRICS:  # absent when no candidate is feasible
        if column not in table:
            table[column] = np.nan
    for column in COUNT_METRICS:
        table[column] = table[column].astype("Int64")
    measures = ["qps_per_gpu", "output_tokens_per_s_per_gpu"] if by_capacity else ["output_tokens_per_s_per_gpu"]
    ascending = [False] * len(measures)
    columns = list(COLUMNS)
    if prices is not None:
        per_hour = table["hardware"].map(prices) * table["gpus"]
        table["usd_per_hour"] = per_hour
        table["usd_per_million_output_tokens"] = per_hour / (table["output_tokens_per_s"] * 3600) * 1e6
        measures, ascending, columns = ["usd_per_million_output_tokens"], [True], columns + list(COST_COLUMNS)
    table = table.sort_values(["meets_targets", "feasible", *measures], ascending=[False, False, *ascending],
                              kind="stable").reset_index(drop=True)
    table.insert(0, "rank", np.where(table["meets_targets"], np.arange(1, len(table) + 1), 0))
    return table[columns]


def gpu_prices(text: str, registry, gpus: list[str]) -> dict[str, float]:
    """``--gpu_cost GPU=USD,...``: USD per GPU-hour by GPU stem, one for each of ``gpus`` at least (a price sheet
    may list more)."""
    prices = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.rpartition("=")
        if not sep or not name.strip():
            raise UserError(f"--gpu_cost must list GPU=USD_PER_HOUR pairs, comma-separated, got {part!r}")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not (math.isfinite(price) and price > 0):
            raise UserError(f"--gpu_cost {part}: the price per GPU-hour must be a finite number > 0, got {value!r}")
        try:
            stem = registry.get(name.strip()).stem
        except UnknownHardwareError as exc:  # the error lists the known GPUs
            raise UserError(f"--gpu_cost {part}: {exc}") from None
        if prices.get(stem, price) != price:
            raise UserError(f"--gpu_cost prices {stem} twice ({prices[stem]:g} and {price:g}); give one")
        prices[stem] = price
    missing = [gpu for gpu in gpus if gpu not in prices]
    if missing:
        raise UserError(f"--gpu_cost has no price for {', '.join(missing)}: every --hardware GPU needs one, or "
                        f"none (rank per GPU)")
    return prices


def zero_shot_gpus(table: pd.DataFrame, engine) -> list[str]:
    """The GPUs of feasible rows with step times that no training data and no calibration measured (column
    ``unmeasured_gpu``, less what the engine's calibration of that GPU measured:
    :func:`pipeweave.engine.uncalibrated`)."""
    found = set()
    for row in table[table["feasible"]].itertuples():
        categories = [c for c in (row.unmeasured_gpu if isinstance(row.unmeasured_gpu, str) else "").split(";") if c]
        if uncalibrated(categories, engine.calibration_record(engine.gpu(row.hardware)))[0]:
            found.add(row.hardware)
    return sorted(found)


def mostly_extrapolated_gpus(table: pd.DataFrame) -> list[str]:
    """The GPUs of feasible rows more than :data:`EXTRAPOLATED_NOTE_SHARE` of whose simulated kernel time is
    extrapolated (column ``extrapolated_share``), as the aggregator and serve_sim note it."""
    feasible = table[table["feasible"]]
    return sorted(set(feasible.loc[feasible["extrapolated_share"] > EXTRAPOLATED_NOTE_SHARE, "hardware"]))


def fp8_slower_than_bf16(table: pd.DataFrame) -> list[str]:
    """The GPUs on which a feasible FP8 row has a longer TPOT than the BF16 row of the same (TP, PP, EP,
    max_num_seqs): against the physics of halved weight bytes, so worth a word."""
    keys = ["hardware", "tp", "pp", "ep", "max_num_seqs"]
    feasible = table[table["feasible"]]
    pairs = feasible[feasible["dtype"] == "fp8"].merge(feasible[feasible["dtype"] == "bf16"], on=keys,
                                                       suffixes=("_fp8", "_bf16"))
    return sorted(set(pairs.loc[pairs["tpot_ms_fp8"] > pairs["tpot_ms_bf16"], "hardware"]))


def pareto_front(table: pd.DataFrame) -> pd.DataFrame:
    """Feasible candidates no other beats on both TPOT (lower) and output tokens/s per GPU (higher)."""
    feasible = table[table["feasible"] & table["tpot_ms"].notna()].sort_values(
        ["tpot_ms", "output_tokens_per_s_per_gpu"], ascending=[True, False])
    best, keep = -math.inf, []
    for index, value in feasible["output_tokens_per_s_per_gpu"].items():
        if value > best:
            keep.append(index)
            best = value
    return feasible.loc[keep]


def plot_pareto(table: pd.DataFrame, path: Path, targets: dict) -> None:
    from pipeweave.serving.cli import new_figure, save_figure

    fig, ax = new_figure(figsize=(7, 5))
    feasible = table[table["feasible"]]
    for meets, colour, label in ((True, "tab:green", "meets targets"), (False, "tab:grey", "misses targets")):
        part = feasible[feasible["meets_targets"] == meets]
        ax.scatter(part["tpot_ms"], part["output_tokens_per_s_per_gpu"], c=colour, label=label, s=25)
    front = pareto_front(table)
    ax.plot(front["tpot_ms"], front["output_tokens_per_s_per_gpu"], "k--", lw=1, label="Pareto front")
    for _, row in front.iterrows():
        ax.annotate(f"{row['hardware']} {row['dtype'].upper()} TP{row['tp']}PP{row['pp']}"
                    f"{f'EP{row.ep}' if row.ep > 1 else ''} s{row['max_num_seqs']}",
                    (row["tpot_ms"], row["output_tokens_per_s_per_gpu"]), fontsize=7)
    if targets["tpot_ms"] is not None:
        ax.axvline(targets["tpot_ms"], color="tab:red", lw=1, label=f"TPOT target (p{targets['tpot_percentile']})")
    ax.set_xlabel(f"TPOT p{targets['tpot_percentile']} (ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def build_parser():
    parser = ArgumentParser(
        prog="search_config.py",
        description="Simulate every (GPU, weight dtype, TP, PP, EP, max_num_seqs) within a GPU budget on a request "
                    "stream and rank those meeting TTFT/TPOT targets by output tokens/s per GPU.")
    parser.add_argument("--hardware", required=True,
                        help="candidate GPUs, comma-separated (names, or paths of GPU JSON files)")
    parser.add_argument("--gpu_budget", type=int, required=True, help="most GPUs per replica (TP x PP)")
    parser.add_argument("--tp", default=None, help="TP sizes to try (default: powers of two up to the budget)")
    parser.add_argument("--pp", default=DEFAULT_PP, help=f"PP sizes to try (default {DEFAULT_PP})")
    parser.add_argument("--max_num_seqs", default=",".join(map(str, DEFAULT_MAX_NUM_SEQS)),
                        help="max_num_seqs values to try (default %(default)s)")
    parser.add_argument("--ep", default=DEFAULT_EP,
                        help="expert-parallel sizes of an MoE model to try, each with the TP sizes it divides (default 1)")
    parser.add_argument("--dtype", default=None, metavar="LIST",
                        help="weight dtypes of the linear layers to try, comma-separated among "
                             f"{', '.join(DTYPES)} (default: the checkpoint's quantization_config, else bf16); a GPU "
                             "without an FP8 tensor rate stays in the table as infeasible for fp8")
    parser.add_argument("--ttft_ms", type=positive_float, default=None, help="TTFT target (ms) at --ttft_percentile")
    parser.add_argument("--ttft_percentile", type=float, default=90, help="default 90")
    parser.add_argument("--tpot_ms", type=positive_float, default=None, help="TPOT target (ms) at --tpot_percentile")
    parser.add_argument("--tpot_percentile", type=float, default=90, help="default 90")
    parser.add_argument("--capacity", action="store_true",
                        help="search each candidate's capacity, the highest request rate (Poisson arrivals of the "
                             "--num_requests requests) at which it meets the targets, starting from --qps (default "
                             f"{CAPACITY_START_QPS:g}) to within {CAPACITY_PRECISION * 100:g} %%, and rank by capacity per "
                             "GPU (needs --ttft_ms: without it, requests may queue without limit)")
    parser.add_argument("--interval_end", choices=INTERVAL_ENDS, default="point",
                        help="simulate every candidate with each kernel at its point prediction (default) or at the "
                             "low or high end of its measured 80 %% interval; high: conservative sizing, the ranking "
                             "and capacities if every kernel runs as slowly as the held-out errors allow")
    parser.add_argument("--gpu_cost", default=None, metavar="GPU=USD,...",
                        help="price of each --hardware GPU per hour (e.g. H100=2.5,L40S=0.9): rank by the cost of a "
                             "million output tokens instead of per GPU (GPUs of different kinds cost differently)")
    add_scheduler_arguments(parser)
    add_engine_arguments(parser)
    parser.add_argument("--workers", type=int, default=1,
                        help="local Dask worker processes (default 1: run in this process)")
    parser.add_argument("--scheduler", dest="scheduler_address", default=None, metavar="ADDRESS",
                        help="address of an existing Dask scheduler (tcp://host:8786) to run the sweep on")
    parser.add_argument("--output", required=True, help="output CSV (.csv), one row per candidate, ranked")
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="write the Pareto plot (output tokens/s per GPU vs TPOT) as a PNG (default: none)")
    return parser


@dataclass
class SweepPlan:
    """What :func:`plan` checked and built from the flags: the candidates, the targets they are judged by, the
    engine settings the workers load, the prices (None without --gpu_cost) and this process's engine."""

    configs: list[ServingConfig]
    targets: dict
    engine: tuple
    prices: dict[str, float] | None
    local: object


def plan(args, say=print, log=None) -> SweepPlan:
    """Check the parsed flags of search_config.py (everything but the output paths) and list the candidates;
    ``say`` receives the notes, ``log`` the engine's lines (default: standard error)."""
    gpus = [g.strip() for g in args.hardware.split(",") if g.strip()]
    if not gpus:
        raise UserError("--hardware lists no GPU")
    if args.gpu_budget < 1:
        raise UserError(f"--gpu_budget must be >= 1, got {args.gpu_budget}")
    tps = _int_list(args.tp, "--tp") if args.tp else [2 ** k for k in range(int(math.log2(args.gpu_budget)) + 1)]
    pps = _int_list(args.pp, "--pp")
    seqs = _int_list(args.max_num_seqs, "--max_num_seqs")
    requested_dtypes = _dtype_list(args.dtype)
    eps = _int_list(args.ep, "--ep")
    for q, flag in ((args.ttft_percentile, "--ttft_percentile"), (args.tpot_percentile, "--tpot_percentile")):
        if not 0 < q <= 100:
            raise UserError(f"{flag} must be in (0, 100], got {q}")
    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    if args.capacity and args.ttft_ms is None:
        raise UserError("--capacity needs --ttft_ms: a TTFT target is what bounds queueing (without one, a stream "
                        "queues without limit and every rate meets a TPOT target)")
    if args.scheduler_address is not None and ":" not in args.scheduler_address:
        raise UserError(f"--scheduler {args.scheduler_address}: here it is the address of a Dask scheduler to run the "
                        f"sweep on (tcp://host:8786); every candidate is simulated with vLLM's scheduler "
                        f"({command('serve_sim.py')} --scheduler static simulates the static batch)")
    from pipeweave.serving.cli import check_calibration, engine_settings, make_engine, qk_norm_note
    from pipeweave.serving.requests import load_serving_trace, make_requests
    from pipeweave.workload import load_model_config, rmsnorm_launches

    local = make_engine(args, log)
    gpus = list(dict.fromkeys(local.registry.get(g).stem for g in gpus))  # unknown GPU: error listing the known ones
    if args.collective_hardware is not None:
        local.gpu(args.collective_hardware)
    prices = None if args.gpu_cost is None else gpu_prices(args.gpu_cost, local.registry, gpus)
    if prices is not None and set(prices) - set(gpus):
        say(f"Note: --gpu_cost also prices {', '.join(sorted(set(prices) - set(gpus)))}, not among --hardware: not "
            f"used")
        prices = {gpu: prices[gpu] for gpu in gpus}
    check_calibration(local, gpus, args.model_config, any(tp * pp > 1 for tp in tps for pp in pps),
                      args.collective_hardware, requested_dtypes, say)
    # a flag every candidate shares is checked once here (the smallest PP bounds --max_concurrent_batches), and model
    # and requests are built once: their errors would otherwise only mark every candidate infeasible
    if args.max_concurrent_batches is not None and args.max_concurrent_batches > min(pps):
        raise UserError(f"--max_concurrent_batches must be between 1 and the smallest --pp ({min(pps)}), got "
                        f"{args.max_concurrent_batches}: vLLM's batch queue holds one micro-batch per pipeline stage")
    base = config_from_args(args, hardware=gpus[0], tp=1, pp=min(pps), max_num_seqs=None, scheduler="vllm",
                            dtype=None, ep=1)
    cfg = load_model_config(base.model_config)
    rmsnorm_launches(cfg, base.qk_norm_rmsnorm)  # a flag the model refuses: one error, not every row infeasible
    qk_norm_note(args, say)
    arrivals_note(base.trace, base.qps, args.capacity, say)
    requests = make_requests(load_serving_trace(base.trace), base.num_requests, base.qps or CAPACITY_START_QPS,
                             base.seed, base.per_request_outputs)
    # one candidate per weight dtype, kept as asked (None: the checkpoint's), so that errors name what was given; a
    # dtype the model cannot run in stays in the table as infeasible, unless it is the only one
    dtypes, refused = {}, []
    for dtype in requested_dtypes:
        try:
            check_model_and_requests(cfg, requests, dtype, base.max_model_len)
        except UserError as exc:
            refused.append(exc)
            if dtype is None or len(requested_dtypes) == 1:
                raise
            dtypes.setdefault(dtype, dtype)
        else:
            dtypes.setdefault(weight_dtype(cfg, dtype), dtype)
    if len(refused) == len(requested_dtypes):
        raise refused[0]
    dtypes = list(dtypes.values())
    if cfg.moe is None and eps != [1]:
        raise UserError(f"--ep {args.ep}: {cfg.stem} is dense: expert parallelism needs a mixture-of-experts model")
    if any(ep > 1 for ep in eps):
        say(EP_NOTE)
    for gpu in gpus:  # the workers' engines log nothing: an attention kernel a GPU cannot run is said here
        spec = local.gpu(gpu)
        backends = [args.prefill_attn or default_prefill_attention(spec), args.decode_attn]
        for _, warning in attention_warnings(f"{cfg.stem} search", backends, spec):
            local.log(warning)
    configs = candidates(base, gpus, args.gpu_budget, tps, pps, seqs, dtypes, eps)
    if not configs:
        raise UserError(f"no candidate has TP x PP <= --gpu_budget {args.gpu_budget} and a TP that --ep divides")
    given = [key for key, default in (("tp", None), ("pp", DEFAULT_PP), ("ep", DEFAULT_EP))
             if getattr(args, key) != default]
    for note in unused_values_notes(configs, tps, pps, eps, args.gpu_budget, given):
        say(note)
    if args.ttft_ms is None and args.tpot_ms is None:
        say("Note: no --ttft_ms or --tpot_ms: every feasible candidate counts as meeting the targets, ranked by "
            "output tokens/s per GPU at the offered load")
    targets = {"ttft_ms": args.ttft_ms, "ttft_percentile": args.ttft_percentile, "tpot_ms": args.tpot_ms,
               "tpot_percentile": args.tpot_percentile, "capacity": args.capacity, "interval_end": args.interval_end}
    return SweepPlan(configs, targets, engine_settings(args), prices, local)


def execute(sweep: SweepPlan, workers: int = 1, scheduler_address: str | None = None, progress=None
            ) -> pd.DataFrame:
    """Simulate every candidate of ``sweep`` (:func:`run_sweep`) and rank them; with a calibration, its
    ``calibration`` column names the file on the rows it corrected, and with kernels at an end of their interval
    (``--interval_end``), an ``interval_end`` column says which."""
    table = run_sweep(sweep.configs, sweep.engine, sweep.targets, workers, scheduler_address, progress, sweep.prices)
    if sweep.targets["interval_end"] != "point":
        table["interval_end"] = sweep.targets["interval_end"]
    calibration = sweep.local.calibration
    if calibration is not None:  # the rows it corrected: its GPU's feasible ones
        table["calibration"] = [str(calibration.path) if gpu == calibration.hardware and feasible else ""
                                for gpu, feasible in zip(table["hardware"], table["feasible"])]
    return table


def main(argv: list[str] | None = None) -> int:
    import sys

    from tqdm import tqdm

    args = build_parser().parse_args(argv)
    output = Path(args.output)
    if output.suffix != ".csv":
        raise UserError(f"--output {output}: expected a .csv file")
    plot = Path(args.plot) if args.plot else None
    record = output.with_suffix(".json")  # the sweep's settings, so that the table can be reproduced
    check_paths(args, {"--output": output, "the settings JSON of --output": record}
                | ({"--plot": plot} if plot else {}))
    if plot:
        require_png(plot)
    sweep = plan(args)
    with tqdm(total=len(sweep.configs), desc="candidates", disable=None, file=sys.stderr) as bar:
        table = execute(sweep, args.workers, args.scheduler_address, bar.update)
    write_atomically(output, lambda tmp: table.to_csv(tmp, index=False, float_format="%.6g"))
    model_dir, hardware_dir, files, estimate, calibration = sweep.engine
    settings = {"config": {name: value for name, value in vars(args).items() if name not in ("output", "plot")},
                "engine": {"model_dir": model_dir, "hardware_dir": hardware_dir, "hardware_files": list(files),
                           "collective_estimate": estimate,
                           "calibration": None if calibration is None else {"file": calibration[0],
                                                                            "digest": calibration[1]}},
                "candidates": len(sweep.configs)}
    write_atomically(record, lambda tmp: tmp.write_text(json.dumps(settings, indent=2) + "\n"))
    written = [output, record]
    if plot and not table["feasible"].any():
        print(f"No candidate is feasible: {plot} not written")
    elif plot:
        plot_pareto(table, plot, sweep.targets)
        written.append(plot)
    best = table[table["meets_targets"]]
    print(f"{len(table)} candidates, {int(table['feasible'].sum())} feasible, {len(best)} meet the targets"
          + ("" if args.interval_end == "point" else f", every kernel at the {args.interval_end} end of its measured "
                                                     f"80 % interval (--interval_end)"))
    zero_shot = zero_shot_gpus(table, sweep.local)
    if zero_shot:
        print(f"Note: {', '.join(zero_shot)}: some step times are zero-shot, no kernel of the GPU being in those "
              f"operators' training data (column unmeasured_gpu; docs/ACCURACY.md for their leave-one-GPU-out errors)")
    extrapolated = mostly_extrapolated_gpus(table)
    if extrapolated:
        print(f"Note: {', '.join(extrapolated)}: more than {EXTRAPOLATED_NOTE_SHARE * 100:.0f} % of some rows' "
              f"simulated kernel time is extrapolated (column extrapolated_share: GPU architecture or shapes outside "
              f"the models' training data, or ensemble members that disagree); treat those rows as rough estimates")
    slower = fp8_slower_than_bf16(table)
    if slower:
        print(f"Note: {', '.join(slower)}: FP8 rows have a longer TPOT than the BF16 rows of the same setup; the FP8 "
              f"GEMM model follows its training measurements, whose FP8 kernels can be slow at decode sizes"
              f"{' (H20: ~13 % of its DRAM bandwidth)' if 'H20' in slower else ''}, and an engine's FP8 kernels may "
              f"be faster")
    for _, row in best.head(5).iterrows():
        load = (f"capacity {row['qps']:.3g} requests/s ({row['qps_per_gpu']:.3g} per GPU), " if args.capacity
                else "")
        if sweep.prices is not None:
            load += f"${row['usd_per_million_output_tokens']:.3g} per million output tokens, "
        print(f"  {int(row['rank'])}. {row['hardware']} {row['dtype'].upper()} TP{row['tp']} PP{row['pp']}"
              f"{f' EP{row.ep}' if row.ep > 1 else ''} max_num_seqs "
              f"{row['max_num_seqs']}: {load}{row['output_tokens_per_s_per_gpu']:.1f} output tokens/s per GPU, "
              f"TTFT {row['ttft_ms']:.1f} ms, TPOT "
              + ("undefined (no second token)" if pd.isna(row["tpot_ms"]) else f"{row['tpot_ms']:.2f} ms"))
    print(f"Results saved to {' and '.join(map(str, written))}")
    return 0
