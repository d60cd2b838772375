"""python3 -m pipeweave.interval_eval [--write]: estimate the prediction intervals of :mod:`pipeweave.intervals`
from held-out kernel errors, and measure how often they hold on GPUs they were not estimated from.

Errors, as log(measured / predicted duration), each from a model that never trained on the kernel:

* ``trained``: the shipped model on the test split (held-out shapes) of each of its training GPUs, as the
  predictor gives them, inside the physical band of the training split (the shipped band was fitted on both splits:
  the held-out shapes' own durations would shape the band that keeps their predictions);
* ``unseen_gpu`` / ``unseen_architecture``: the leave-one-GPU-out models of ``pipeweave.logo_cache`` on every row
  of the held-out GPU, as the predictor gives a GPU outside training (``pipeweave.accuracy.logo_as_predicted``);
  the state is ``unseen_architecture`` when no other GPU with data shares the held-out GPU's SM design. A GPU
  whose model inputs another GPU of the data shares (one chip under two names: FP8 GEMM's H100 and H800,
  :func:`pipeweave.accuracy.input_twins`) is left out of both and of the calibrated states: its leave-one-GPU-out
  model trained on the other's rows.

The table (``pipeweave/error_intervals.json``) holds the 10th and 90th percentiles per operator and state, every
GPU weighing equally. **Coverage** is measured leave-one-GPU-out a second time: each GPU's rows are scored against
the percentiles of the *other* GPUs of its state (the other unseen state where it is alone, as the predictor
falls back), so a GPU never sets its own interval. ``--write`` writes the table and the docs/ACCURACY.md section
``intervals``; without it the coverage is printed only. Needs the datasets and the leave-one-GPU-out cache
(``python3 -m pipeweave.logo_cache --workers 2``, ~40 min on two cores); a missing or stale member is trained
first, with a log line, as ``pipeweave.accuracy`` does. ``--write_trained`` rewrites only the ``trained`` entries
and their coverage, which depend on the shipped models alone (after retraining one, without the cache), keeps
the rest of the table and renders the section from it; with ``--with_unseen`` also the two unseen states of the
operators asked for, which need only those operators' leave-one-GPU-out models (the calibrated states pool every
operator's, so they need ``--write``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import get_operator, operator_keys
from pipeweave.accuracy import input_twins
from pipeweave.bounds import frame_band_table
from pipeweave.calibration_eval import (DRAWS, SEED, SHOTS, HeldOut, drawn_spread, held_out_and_priors,
                                        held_out_rows, kshot_log_errors)
from pipeweave.cli import (ArgumentParser, positive_int, run_cli, trainable_operator_list, write_atomically,
                           write_marked_section)
from pipeweave.intervals import DEFAULT_PATH, FORMAT, LEVELS, STATES, TRAINED, UNSEEN_ARCHITECTURE, UNSEEN_GPU
from pipeweave.finetune import FINE_TUNABLE, MAX_DEFAULT_WORKERS, default_workers, fine_tuning_pool
from pipeweave.logo_cache import DEFAULT_CACHE, gpus_with_data
from pipeweave.modeling import dataset_paths, log_duration_ratio, read_dataset
from pipeweave.paths import DATASET_DIR, DEFAULT_MODEL_DIR, DOCS_DIR
from pipeweave.predictor import KernelPredictor

OPS = operator_keys(trainable=True)
#: an unseen state needs this many GPUs for a spread of their biases; with fewer the other unseen state's join
MIN_GPUS = 3
PREDICTIVE_SEED = 0
PREDICTIVE_DRAWS = 400_000
#: calibrations evaluated (kernels of the GPU drawn): the k-shot evaluation's
CALIBRATED_SHOTS = tuple(k for k in SHOTS if k > 0)
#: suffix of a calibrated state's coverage by the table's interval alone, without the calibration's own spread
WITHOUT_SPREAD = "_without_spread"


def trained_ratios(op: str, predictor: KernelPredictor, dataset_dir: Path) -> dict[str, np.ndarray]:
    """{training GPU: log ratios of its held-out shapes} under the shipped model, as predicted, inside the band of
    the training split (:func:`pipeweave.bounds.frame_band_table`): the shipped band was fitted on the test split
    too (attention's shortest measured duration, the band's launch ceiling, is a test row's), and a held-out shape
    must not shape the band its prediction is kept in."""
    operator = get_operator(op)
    train_path, test_path = dataset_paths(op, dataset_dir)
    test = read_dataset(test_path)
    band = frame_band_table(op, read_dataset(train_path))
    out = {}
    for gpu in sorted(predictor.trained_on(op) & set(test["hardware"])):
        rows = test[test["hardware"] == gpu]
        efficiency = predictor.kernel_efficiency(op, rows[list(operator.feature_names)].to_numpy(np.float64),
                                                 rows[list(operator.descriptor_names)].to_numpy(np.float64),
                                                 predictor.hardware.get(gpu), band)
        out[gpu] = log_duration_ratio(rows["overall_perf"].to_numpy(np.float64), efficiency)
    return out


def unseen_ratios(op: str, rows: list[HeldOut]) -> dict[int, dict[str, np.ndarray]]:
    """{UNSEEN_GPU / UNSEEN_ARCHITECTURE: {held-out GPU: log ratios of all its rows}} under leave-one-GPU-out:
    the ``y`` of ``op``'s :class:`pipeweave.calibration_eval.HeldOut` rows, the prediction of a GPU outside
    training (``pipeweave.accuracy.logo_as_predicted``, in the other GPUs' band); GPUs with an
    :func:`pipeweave.accuracy.input_twins` twin left out."""
    hardware = hardware_registry(DEFAULT_HARDWARE_DIR)
    held = [h for h in rows if h.op == op]
    twins = input_twins([h.gpu for h in held])
    out: dict[int, dict[str, np.ndarray]] = {UNSEEN_GPU: {}, UNSEEN_ARCHITECTURE: {}}
    for h in held:
        if h.gpu in twins:
            continue
        design = hardware.get(h.gpu).compute_capability
        shared = any(hardware.get(other.gpu).compute_capability == design for other in held if other is not h)
        out[UNSEEN_GPU if shared else UNSEEN_ARCHITECTURE][h.gpu] = h.y
    return out


def pooled_quantiles(by_gpu: dict[str, np.ndarray], levels=LEVELS) -> list[float]:
    """Quantiles of the GPUs' log ratios pooled with equal weight per GPU (a GPU with many rows does not set the
    interval of the others)."""
    values = np.concatenate(list(by_gpu.values()))
    weights = np.concatenate([np.full(len(v), 1.0 / len(v)) for v in by_gpu.values()])
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order]) / len(by_gpu)
    return [float(values[order][min(np.searchsorted(cumulative, level), len(values) - 1)]) for level in levels]


def predictive_quantiles(by_gpu: dict[str, np.ndarray], levels=LEVELS) -> list[float]:
    """Quantiles of the log ratio on a GPU not among ``by_gpu``: its bias (median log ratio) drawn from the
    predictive distribution of a new GPU's bias, a Student t with n − 1 degrees of freedom, centre the mean of
    the n GPUs' biases and scale their standard deviation × sqrt(1 + 1/n) (one-way random effects, normal
    biases), plus a residual around the bias drawn from the GPUs' residuals, each GPU weighing equally. With one
    GPU there is no spread of biases to estimate: its own quantiles. Monte Carlo with a fixed seed."""
    names = list(by_gpu)
    if len(names) < 2:
        return pooled_quantiles(by_gpu, levels)
    rng = np.random.default_rng(PREDICTIVE_SEED)
    biases = np.array([np.median(by_gpu[name]) for name in names])
    residuals = np.concatenate([by_gpu[name] - bias for name, bias in zip(names, biases)])
    weights = np.concatenate([np.full(len(by_gpu[name]), 1.0 / len(by_gpu[name])) for name in names])
    scale = biases.std(ddof=1) * np.sqrt(1.0 + 1.0 / len(names))
    draws = (biases.mean() + scale * rng.standard_t(len(names) - 1, PREDICTIVE_DRAWS)
             + rng.choice(residuals, PREDICTIVE_DRAWS, p=weights / weights.sum()))
    return [float(q) for q in np.quantile(draws, levels)]


def donors(ratios: dict[int, dict[str, np.ndarray]], state: int, exclude: str | None = None
           ) -> tuple[list[int], dict[str, np.ndarray]]:
    """(states the interval is taken from, their GPUs' log ratios without ``exclude``): the state's own GPUs; an
    unseen state with fewer than MIN_GPUS of them adds the other unseen state's, so that a spread of GPU biases
    can be estimated (as :class:`pipeweave.intervals.IntervalTable` is written)."""
    own = {gpu: r for gpu, r in ratios[state].items() if gpu != exclude}
    if len(own) >= MIN_GPUS or state == TRAINED:
        return [state], own
    other = UNSEEN_ARCHITECTURE if state == UNSEEN_GPU else UNSEEN_GPU
    return [state, other], {**own, **{gpu: r for gpu, r in ratios[other].items() if gpu != exclude}}


def coverage_cell(values: np.ndarray, others: dict[str, np.ndarray]) -> dict:
    """One GPU's log ratios ``values`` against the interval estimated from ``others``."""
    low, high = predictive_quantiles(others)
    return {"coverage": float(np.mean((values >= low) & (values <= high))), "low": low, "high": high,
            "n": int(len(values))}


def coverage(ratios: dict[int, dict[str, np.ndarray]]) -> dict[str, dict[str, dict]]:
    """{state: {GPU: {coverage, low, high}}}: each GPU's rows against the interval of the other GPUs."""
    out = {}
    for state in range(len(STATES)):
        cells = {}
        for gpu, values in ratios[state].items():
            _, others = donors(ratios, state, exclude=gpu)
            if others:
                cells[gpu] = coverage_cell(values, others)
        out[STATES[state]] = cells
    return out


def calibrated_ratios(rows: list[HeldOut], priors: dict, ops, pool=None) -> dict[str, dict[int, dict[str, list]]]:
    """{op: {k: {held-out GPU: [(log ratios of its kernels not drawn, the spread the calibration records) per
    draw]}}} after calibrating its leave-one-GPU-out prediction on k drawn kernels, exactly the k-shot evaluation
    of :mod:`pipeweave.calibration_eval` (its ``rows`` and per-GPU ``priors`` estimated without the GPU, draws,
    seeds and fine-tuning rule; ``pool``: :func:`pipeweave.finetune.fine_tuning_pool`'s, or None); each
    operator's GPUs with an :func:`pipeweave.accuracy.input_twins` twin left out."""
    out: dict[str, dict[int, dict[str, list]]] = {}
    twins = {op: input_twins([held.gpu for held in rows if held.op == op]) for op in ops}
    for held in (held for held in rows if held.op in ops and held.gpu not in twins[held.op]):
        x = held.design(priors[held.gpu].standardisation)
        for k in CALIBRATED_SHOTS:
            if k < len(held.y):
                draws = [(-kshot_log_errors(held, x, priors[held.gpu], k, SEED + d, pool)[0],
                          drawn_spread(held, x, priors[held.gpu], k, SEED + d)) for d in range(DRAWS)]
                out.setdefault(held.op, {}).setdefault(k, {})[held.gpu] = draws
        print(f"  calibrated {held.op} / {held.gpu}", flush=True)
    return out


def interval_entry(by_gpu: dict[str, np.ndarray]) -> dict:
    """The table cell of one state: its percentiles (:func:`predictive_quantiles`), GPUs and rows."""
    low, high = predictive_quantiles(by_gpu)
    return {"log_low": low, "log_high": high, "gpus": sorted(by_gpu),
            "rows": int(sum(len(v) for v in by_gpu.values()))}


def calibrated_entry(by_shots: dict[int, dict[str, list]]) -> tuple[dict, dict]:
    """(the JSON entry ``calibrated`` of one operator: per k its percentiles over all GPUs' draws, {k: {GPU:
    coverage cell}} with each GPU's draws scored against the others' interval, each widened to that draw's own
    spread as the predictor widens it: ``pooled_coverage`` is the share inside the others' interval alone)."""
    entry, covered = {}, {}
    for k, by_gpu in sorted(by_shots.items()):
        ratios = {gpu: np.concatenate([values for values, _ in draws]) for gpu, draws in by_gpu.items()}
        entry[str(k)] = interval_entry(ratios)
        covered[str(k)] = {gpu: spread_coverage_cell(draws, {g: v for g, v in ratios.items() if g != gpu})
                           for gpu, draws in by_gpu.items() if len(by_gpu) > 1}
    return entry, covered


def spread_coverage_cell(draws: list, others: dict[str, np.ndarray]) -> dict:
    """One GPU's calibrated draws against the interval estimated from ``others``, each draw's widened to its own
    spread (pipeweave.intervals.IntervalTable.factors), kernels weighing equally."""
    cell = coverage_cell(np.concatenate([values for values, _ in draws]), others)
    inside = [((values >= min(cell["low"], low)) & (values <= max(cell["high"], high)))
              for values, (low, high) in draws]
    return {**cell, "pooled_coverage": cell["coverage"], "coverage": float(np.mean(np.concatenate(inside)))}


def operator_ratios(op: str, predictor: KernelPredictor, dataset_dir: Path, rows: list[HeldOut]
                    ) -> dict[int, dict[str, np.ndarray]]:
    """{state: {GPU: log ratios}} of one operator: trained from the shipped model, unseen from ``rows``."""
    ratios = unseen_ratios(op, rows)
    ratios[TRAINED] = trained_ratios(op, predictor, dataset_dir)
    return ratios


def table_entry(ratios: dict[int, dict[str, np.ndarray]]) -> dict:
    """The JSON entry of one operator: per state its percentiles, GPUs and rows (``from``: the states whose GPUs
    they were estimated from, where another state's were added)."""
    entry = {}
    for state, name in enumerate(STATES):
        sources, by_gpu = donors(ratios, state)
        if not by_gpu:
            raise ValueError(f"no held-out errors for state {name!r} nor a state to take its place")
        entry[name] = interval_entry(by_gpu)
        if sources != [state]:
            entry[name]["from"] = [STATES[source] for source in sources]
    return entry


def render(entries: dict, covered: dict) -> str:
    low, high = (f"{level * 100:g}" for level in LEVELS)
    lines = [
        "## Prediction intervals: how often they hold",
        "",
        "Generated by `python3 -m pipeweave.interval_eval --write` (table `pipeweave/error_intervals.json`;",
        "docs/METHOD.md §4.4). Every prediction comes with an interval [t̂ · e^q_low, t̂ · e^q_high]: the",
        f"{low}th and {high}th percentiles of log(measured / predicted duration) on a GPU outside the evaluated",
        "ones, from the errors of its operator and state on kernels the predicting model never trained on: a",
        "new GPU's bias drawn from the spread of the evaluated GPUs' biases (Student t), plus their residuals",
        "around them, every GPU weighing equally. States: `trained` (the GPU is in the model's training data: the",
        "shipped model on held-out shapes), `unseen_gpu` (outside training, a training GPU shares its SM design:",
        "leave-one-GPU-out errors of such GPUs), `unseen_architecture` (none does); an unseen state with fewer",
        f"than {MIN_GPUS} GPUs adds the other's (*with*); a GPU whose model inputs another GPU of the data shares",
        "(one chip under two names: FP8 GEMM's H100 and H800) is in neither, nor in the calibrated states, since its",
        "leave-one-GPU-out model trained on the other's rows. **Coverage** is the share of a GPU's kernels inside the",
        "interval estimated *without* that GPU, by the same rule: the target is",
        f"{round((LEVELS[1] - LEVELS[0]) * 100)} %. A GPU far below it has a bias the other GPUs do not share (its",
        "interval is too narrow); far above, the other GPUs disagree more than it does.",
        "`calibrated, k = …`: a GPU outside training calibrated on k of its kernels (`calibrate.py --kernels`),",
        "from the errors on its other kernels in the k-shot evaluation above (same priors without the GPU, draws",
        "and fine-tuning rule), every GPU with data of the operator pooled; a calibration with at least k kernels",
        "of an operator takes the interval of the largest such k, widened where its own kernels scatter more: the",
        "10th and 90th percentiles of their errors, each predicted by the calibration fitted without its fold (four",
        "folds; the corrections, and what they leave on the other folds interpolated to it, without fine-tuning),",
        "bound it from outside (the `spread` of the calibration file). Its coverage counts that widening, each draw",
        "with its own spread; in brackets, the same by the table's interval alone.",
        "",
        "| operator | state | GPUs | rows | interval (× prediction) | coverage, mean over GPUs | lowest (GPU) |",
        "|---|---|---|---|---|---|---|",
    ]
    for op, entry in entries.items():
        rows = [(name, entry[name], covered[op].get(name, {})) for name in STATES]
        rows += [(f"calibrated, k = {k}", cell, covered[op].get(f"calibrated_{k}", {}))
                 for k, cell in entry.get("calibrated", {}).items()]
        for name, cell, cells in rows:
            taken = f" (with {' and '.join(cell['from'][1:])})" if "from" in cell else ""
            alone = covered[op].get(f"{name.replace(', k = ', '_')}{WITHOUT_SPREAD}", {})
            if cells:
                worst = min(cells, key=lambda gpu: cells[gpu]["coverage"])
                mean = (f"{np.mean([c['coverage'] for c in cells.values()]) * 100:.0f} % "
                        f"({len(cells)} GPU{'s' if len(cells) != 1 else ''})")
                lowest = f"{cells[worst]['coverage'] * 100:.0f} % ({worst.replace('NVIDIA ', '')})"
                if alone:
                    worst_alone = min(alone, key=lambda gpu: alone[gpu]["coverage"])
                    mean += f" [{np.mean([c['coverage'] for c in alone.values()]) * 100:.0f} %]"
                    lowest += f" [{alone[worst_alone]['coverage'] * 100:.0f} % ({worst_alone.replace('NVIDIA ', '')})]"
            else:
                mean, lowest = "—", "—"
            lines.append(f"| {op} | {name}{taken} | {len(cell['gpus'])} | {cell['rows']:,} | "
                         f"{np.exp(cell['log_low']):.2f}–{np.exp(cell['log_high']):.2f} | {mean} | {lowest} |")
    return "\n".join(lines)


def measured_models(predictor: KernelPredictor, ops) -> dict[str, str]:
    """{op: folder name of the shipped model whose errors the table measures} (pipeweave.intervals warns when another
    model predicts)."""
    return {op: Path(predictor.model(op)[2]).name for op in ops}


def write_trained(args, predictor: KernelPredictor) -> None:
    """Rewrite the ``trained`` entries of ``args.table`` (and their coverage) for ``args.ops`` from the shipped
    models, with ``args.with_unseen`` also their unseen states from the leave-one-GPU-out cache, keep every other
    entry, and write the report's section from the table."""
    try:
        table = json.loads(args.table.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{args.table}: not a JSON interval table ({exc})") from None
    for op in args.ops:
        if op not in table["operators"]:
            raise ValueError(f"{args.table} has no entry for {op}: write the whole table (--write)")
        held = []
        if args.with_unseen:
            test_split = read_dataset(dataset_paths(op, args.dataset_dir)[1]) if op in FINE_TUNABLE else None
            held = [held_out_rows(op, gpu, args.dataset_dir, args.cache, test_split)
                    for gpu in gpus_with_data(op, args.dataset_dir)]
        ratios = operator_ratios(op, predictor, args.dataset_dir, held)
        entry = table_entry(ratios) if args.with_unseen else {STATES[TRAINED]: interval_entry(ratios[TRAINED])}
        covered = coverage(ratios)
        for name in entry:
            table["operators"][op][name] = entry[name]
            table["coverage"][op][name] = {gpu: round(c["coverage"], 4) for gpu, c in covered[name].items()}
            if covered[name]:
                print(f"{op} {name}: coverage {np.mean([c['coverage'] for c in covered[name].values()]) * 100:.0f} "
                      f"% over {len(covered[name])} GPUs")
    table["models"] = {**table.get("models", {}), **measured_models(predictor, args.ops)}
    stored = {op: {name: {gpu: {"coverage": value} for gpu, value in cells.items()}
                   for name, cells in states.items()} for op, states in table["coverage"].items()}
    write_atomically(args.table, lambda tmp: tmp.write_text(json.dumps(table, indent=2) + "\n"))
    write_marked_section(args.report, "intervals", render(table["operators"], stored))
    rewritten = "trained and unseen" if args.with_unseen else "trained"
    print(f"rewrote the {rewritten} entries of {args.table} ({', '.join(args.ops)}) and the section 'intervals' of "
          f"{args.report}")


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python3 -m pipeweave.interval_eval",
                            description="Estimate the prediction intervals from held-out kernel errors and "
                                        "measure their coverage leave-one-GPU-out.")
    parser.add_argument("--ops", type=trainable_operator_list, default=list(OPS),
                        help=f"comma list of operator classes (default: {','.join(OPS)})")
    parser.add_argument("--model_dir", type=Path, default=DEFAULT_MODEL_DIR,
                        help="root of the shipped models (default: mlp_models)")
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR,
                        help="folder of <op>_{train,test}.csv (default: dataset)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="leave-one-GPU-out cache (default: .cache/logo; pipeweave.logo_cache trains it)")
    parser.add_argument("--write", action="store_true",
                        help="write the table and the docs/ACCURACY.md section (default: print the coverage)")
    parser.add_argument("--table", type=Path, default=DEFAULT_PATH,
                        help="table to write (default: pipeweave/error_intervals.json)")
    parser.add_argument("--report", type=Path, default=DOCS_DIR / "ACCURACY.md",
                        help="markdown report whose section 'intervals' is written (default: docs/ACCURACY.md)")
    parser.add_argument("--write_trained", action="store_true",
                        help="rewrite only the trained entries of the table and their coverage (they need the "
                             "shipped models alone, no leave-one-GPU-out cache), keep the others, and write the "
                             "section from the table")
    parser.add_argument("--with_unseen", action="store_true",
                        help="with --write_trained: also rewrite the unseen states of --ops, from their leave-one-GPU-"
                             "out models (--cache; trained when missing)")
    parser.add_argument("--without_calibrated", action="store_true",
                        help="skip the calibrated states (the k-shot calibrations with their fine-tuning: 45 min on "
                             "two cores with --workers 2, 78 min of CPU, 2026-12-06); only without --write (default: "
                             "evaluate them)")
    parser.add_argument("--workers", type=positive_int, default=default_workers(),
                        help="processes that fine-tune ensemble members at once in the calibrated states (default: "
                             f"the usable cores, at most {MAX_DEFAULT_WORKERS}; any number gives the same table)")
    args = parser.parse_args(argv)
    if args.with_unseen and not args.write_trained:
        parser.error("--with_unseen goes with --write_trained")
    if args.write and args.write_trained:
        parser.error("--write rewrites the whole table, --write_trained its trained entries: choose one")
    if args.write and (set(args.ops) != set(OPS) or args.without_calibrated):
        parser.error("--write needs every operator class and the calibrated states (the table is written whole)")
    predictor = KernelPredictor(args.model_dir)
    if args.write_trained:
        write_trained(args, predictor)
        return 0
    entries, covered = {}, {}
    # every operator's held-out rows, once: the unseen states' errors, and the priors pool every operator, as a
    # calibration's does
    rows, _, priors = held_out_and_priors(args.dataset_dir, args.cache)
    if args.without_calibrated:
        calibrated = {}
    else:
        with fine_tuning_pool(args.workers) as pool:
            calibrated = calibrated_ratios(rows, priors, args.ops, pool)
    for op in args.ops:
        ratios = operator_ratios(op, predictor, args.dataset_dir, rows)
        entries[op], covered[op] = table_entry(ratios), coverage(ratios)
        if op in calibrated:
            entries[op]["calibrated"], by_shots = calibrated_entry(calibrated[op])
            covered[op].update({f"calibrated_{k}": cells for k, cells in by_shots.items()})
            covered[op].update({f"calibrated_{k}{WITHOUT_SPREAD}": {gpu: {"coverage": c["pooled_coverage"]}
                                                                     for gpu, c in cells.items()}
                                for k, cells in by_shots.items()})
        for name, cells in covered[op].items():
            if cells:
                print(f"{op} {name}: coverage {np.mean([c['coverage'] for c in cells.values()]) * 100:.0f} % "
                      f"over {len(cells)} GPUs")
    text = render(entries, covered)
    if not args.write:
        print(text)
        return 0
    table = {"format": FORMAT, "levels": list(LEVELS), "models": measured_models(predictor, OPS), "operators": entries,
             "coverage": {op: {name: {gpu: round(c["coverage"], 4) for gpu, c in cells.items()}
                               for name, cells in states.items()} for op, states in covered.items()}}
    write_atomically(args.table, lambda tmp: tmp.write_text(json.dumps(table, indent=2) + "\n"))
    write_marked_section(args.report, "intervals", text)
    print(f"wrote {args.table} and the section 'intervals' of {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
