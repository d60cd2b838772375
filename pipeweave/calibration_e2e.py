"""python3 -m pipeweave.calibration_e2e: leave-one-run-out onboarding on the measured end-to-end runs.

For every visible GPU with at least two measured runs (``e2e/real/measured_runs.csv``), every ordered pair
(calibrating run, scored run) of that GPU: the calibration is fitted on the calibrating run alone (its
measured medians, exactly what ``calibrate.py --e2e`` gets from a one-row CSV) and the scored run is predicted
with it through the aggregator's ``--calibration`` path. The calibrating run is never scored. Errors are
|pred − median(measured)| / median(measured) for prefill, decode step and total (vLLM runs: total only) and
their mean, beside the zero-shot prediction of the same run. Writes ``e2e/calibration_loro.csv`` (every pair)
and a section of docs/E2E.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from pipeweave.calibration import Calibration, Equations, fit_map, load_prior
from pipeweave.calibration_fit import run_equations, runs_prior
from pipeweave.cli import ArgumentParser, run_cli, write_atomically, write_marked_section
from pipeweave.measured_runs import DEFAULT_REAL_DIR, load_real
from pipeweave.paths import DEFAULT_WORKLOAD_DIR, DOCS_DIR, E2E_DIR

METRICS = {"prefill": "prefill_duration_ms", "decode": "decode_avg_duration_ms", "total": "total_duration_ms"}
EQUATION_KEYS = {"prefill": "prefill_ms", "decode": "decode_step_ms", "total": "total_ms"}
SECTION = "calibration-e2e"


def workload_stem(run, hardware_dir: Path) -> str:
    """The workload the batch scripts predict a run with: FA3 prefill on Hopper and for vLLM runs, else FA2."""
    hopper = hardware_registry(hardware_dir).get(run["gpu"]).architecture == "hopper"
    fa = "fa3" if hopper or run["kind"] == "vllm" else "fa2"
    return f"{run['model']}_{run['trace']}_{fa}_tp{run['tp']}_pp{run['pp']}"


def measured(run) -> dict:
    return {m: float(run[f"{m}_ms_median"]) for m in METRICS if np.isfinite(float(run[f"{m}_ms_median"]))}


def errors(summary: dict, truth: dict) -> dict:
    out = {m: abs(summary[METRICS[m]] / truth[m] - 1) * 100 for m in truth}
    out["mean"] = float(np.mean(list(out.values())))
    return out


def evaluate(real_dir: Path, workload_dir: Path, hardware_dir: Path, log=print) -> pd.DataFrame:
    from pipeweave.engine import Engine, Job
    from pipeweave.flatten import load_workload

    prior = load_prior()
    registry = hardware_registry(hardware_dir)
    aggregator = Engine(hardware_dir=hardware_dir, collective_estimate="analytical", log=None)
    real = load_real(real_dir, hardware_dir)
    rows = []
    for (gpu, kind), runs in real.groupby(["gpu", "kind"], sort=True):
        runs = [run for _, run in runs.iterrows()
                if (Path(workload_dir) / f"{workload_stem(run, hardware_dir)}.json").is_file()]
        if len(runs) < 2:
            continue
        spec = registry.get(gpu)
        workloads = [load_workload(Path(workload_dir) / f"{workload_stem(run, hardware_dir)}.json") for run in runs]
        aggregator.calibration = None
        zero = [aggregator.predict([Job(w, spec)])[0].result["summary"] for w in workloads]
        for a, (calibrating, source) in enumerate(zip(runs, workloads)):
            truth = {EQUATION_KEYS[m]: v for m, v in measured(calibrating).items()}
            aggregator.calibration = None
            fit_prior = runs_prior(aggregator, spec, [source], prior)  # as calibrate.py --e2e fits one run
            equations = Equations.concat([run_equations(aggregator, source, spec, truth, fit_prior, source.stem)])
            theta, std = fit_map(equations, fit_prior)
            aggregator.calibration = Calibration(spec.stem, spec.name, theta, std, {"e2e": source.stem}, {}, {},
                                                 prior.standardisation)
            for b, (scored, target) in enumerate(zip(runs, workloads)):
                if a == b:
                    continue
                summary = aggregator.predict([Job(target, spec)])[0].result["summary"]
                truth_b = measured(scored)
                before, after = errors(zero[b], truth_b), errors(summary, truth_b)
                rows.append({"gpu": gpu, "kind": kind, "calibrated_on": source.stem, "scored": target.stem,
                             "tp": int(scored["tp"]),
                             **{f"zero_shot_err_{m}_pct": before.get(m, np.nan) for m in (*METRICS, "mean")},
                             **{f"calibrated_err_{m}_pct": after.get(m, np.nan) for m in (*METRICS, "mean")}})
        log(f"  {gpu} ({kind}): {len(runs)} runs, {len(runs) * (len(runs) - 1)} ordered pairs")
    aggregator.calibration = None
    return pd.DataFrame(rows)


def render(pairs: pd.DataFrame) -> str:
    per_run = pairs.groupby(["gpu", "kind", "scored"], sort=False).agg(
        tp=("tp", "first"), zero=("zero_shot_err_mean_pct", "first"), calibrators=("calibrated_on", "count"),
        mean=("calibrated_err_mean_pct", "mean"), worst=("calibrated_err_mean_pct", "max")).reset_index()
    per_gpu = pairs.groupby(["gpu", "kind"], sort=False).agg(
        pairs=("scored", "count"), zero=("zero_shot_err_mean_pct", "mean"),
        mean=("calibrated_err_mean_pct", "mean"), worst=("calibrated_err_mean_pct", "max")).reset_index()
    worst = pairs.loc[pairs["calibrated_err_mean_pct"].idxmax()]
    lines = ["## One-run onboarding (calibrate.py), leave-one-run-out", "",
             "Generated by `python3 -m pipeweave.calibration_e2e` — do not edit by hand.", "",
             "For every GPU with at least two measured runs of one kind, each run in turn is the only data given to "
             "`calibrate.py --e2e` (its measured medians) and every *other* run of that GPU is predicted with the "
             "calibration (`aggregator.py --calibration`); the calibrating run is never scored. The calibration "
             "never sees the scored run, but the prior scales come from kernel data only "
             "(`pipeweave/calibration_prior.json`, `python3 -m pipeweave.calibration_eval`). Errors against the "
             "median of the repeats, mean of prefill / decode step / total (vLLM: total only). "
             "Every pair: `e2e/calibration_loro.csv`.", "",
             "**Disclosed:** two choices were made after looking at this evaluation, each for a reason independent "
             "of it. (1) The prior scale of the communication factor was raised from 0.5 to log 3 (collective sources "
             "of one GPU differ by up to ~3× at small messages, `pipeweave/collectives.py`); it did not help here when "
             "it was chosen (before the collective models followed vLLM's custom all-reduce): with 0.5 the mean was "
             "3.2 %, with log 3 3.3 %. (2) That one factor was then split into a latency and a bandwidth factor, "
             "weighted by the latency share of each collective's analytical estimate, as the kernels' intercepts are "
             "by their compute share (`pipeweave/calibration_design.py`). The worst pair (H20, a TP1 run calibrated "
             "on a TP8 run) showed why: the TP8 decode error raised the one factor, which also lengthened the "
             "prefill's large transfers, and the kernels were made faster to compensate. The latency factor keeps "
             "log 3 and the bandwidth factor takes 0.5, from how far the sources disagree at 64 MiB and up "
             "(1.01–1.14×, one pair 2.65×). With one factor the mean was 3.0 % and the worst pair 14.2 % (4 pairs "
             "above 12 %). Nothing else here was chosen by looking at these runs.", "",
             f"**Over all {len(pairs)} ordered pairs:** zero-shot mean {pairs['zero_shot_err_mean_pct'].mean():.1f} %, "
             f"calibrated on one other run mean **{pairs['calibrated_err_mean_pct'].mean():.1f} %**, worst pair "
             f"{worst['calibrated_err_mean_pct']:.1f} % ({worst['gpu']}: {worst['scored']} calibrated on "
             f"{worst['calibrated_on']}); pairs above 12 %: {int((pairs['calibrated_err_mean_pct'] > 12).sum())}.", "",
             "| GPU | kind | ordered pairs | zero-shot mean err % | calibrated mean err % | worst pair % |",
             "|---|---|---|---|---|---|"]
    for _, r in per_gpu.iterrows():
        lines.append(f"| {r['gpu']} | {r['kind']} | {r['pairs']} | {r['zero']:.1f} | **{r['mean']:.1f}** | "
                     f"{r['worst']:.1f} |")
    lines += ["", "Per scored run (calibrated: mean and worst over the calibrating runs of the same GPU):", "",
              "| GPU | scored run | TP | zero-shot err % | calibrated mean err % | worst % |",
              "|---|---|---|---|---|---|"]
    for _, r in per_run.iterrows():
        lines.append(f"| {r['gpu']} | {r['scored']} | {r['tp']} | {r['zero']:.1f} | **{r['mean']:.1f}** | "
                     f"{r['worst']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python3 -m pipeweave.calibration_e2e", description=__doc__.split("\n")[0])
    parser.add_argument("--real_dir", type=Path, default=DEFAULT_REAL_DIR,
                        help="measured end-to-end runs (default: e2e/real, its measured_runs.csv)")
    parser.add_argument("--workload_dir", type=Path, default=DEFAULT_WORKLOAD_DIR,
                        help="the runs' workload JSONs (default: workload)")
    parser.add_argument("--hardware_dir", type=Path, default=DEFAULT_HARDWARE_DIR,
                        help="GPU spec JSONs (default: hardware)")
    parser.add_argument("--csv", type=Path, default=E2E_DIR / "calibration_loro.csv",
                        help="output CSV, one row per (calibrating run, scored run) pair "
                             "(default: e2e/calibration_loro.csv)")
    parser.add_argument("--markdown", type=Path, default=DOCS_DIR / "E2E.md",
                        help="report whose onboarding section is rewritten (default: docs/E2E.md)")
    args = parser.parse_args(argv)
    pairs = evaluate(args.real_dir, args.workload_dir, args.hardware_dir, log=lambda m: print(m, flush=True))
    write_atomically(args.csv, lambda tmp: pairs.to_csv(tmp, index=False, float_format="%.3f"))
    write_marked_section(args.markdown, SECTION, render(pairs))
    print(f"wrote {args.csv} and the onboarding section of {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
