"""How far pipeweave is from your own measured runs: ``python3 -m pipeweave.compare runs``.

    python3 -m pipeweave.compare runs --hardware L40S --runs my_runs.csv [--calibration CAL.json] [--output T.csv]

``--runs`` is the measured-run CSV of ``calibrate.py --e2e``: ``workload,prefill_ms,decode_step_ms,total_ms``, one
row per repeat, a metric that was not measured left empty. The workload file names the run (a path, relative to the
working directory or to the CSV, or a shipped workload's stem), so nothing is matched by file-name parsing, and
the runs are checked as ``calibrate.py`` checks them (positive times, a workload that fits the GPU, kernels that
run on it, a total consistent with its parts). Rows of one workload file are the repeats of one run: each metric
is scored against the median of its repeats, as docs/E2E.md scores the project's runs, error = |predicted −
median| / median, and a run's error is the mean over its measured metrics.

With ``--calibration`` the calibrated prediction is scored; a calibration fitted from these very runs is scored
in-sample, which says nothing about other runs, so it gets a WARNING, its rows are marked ``in_sample`` and the
summary gives the mean of the other runs apart (``calibrate.py`` one run at a time and this command on the others
is the honest test: docs/E2E.md, leave-one-run-out). A run is the calibration's own when its file is one the
calibration recorded, by path or, for files written since 2026-12-05, by content (a copy elsewhere is the same run).
"""
from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import numpy as np

from analytical_model.hardware import hardware_files
from pipeweave.calibration_fit import read_runs
from pipeweave.cli import (STANDARD_STREAM, ArgumentParser, check_output_path, refuse_overwriting_inputs,
                           write_atomically)
from pipeweave.paths import DEFAULT_COLLECTIVE_DIR, DEFAULT_MODEL_DIR

#: metric of the runs CSV -> the aggregator's summary field it is scored against
SCORED = {"prefill_ms": "prefill_duration_ms", "decode_step_ms": "decode_avg_duration_ms",
          "total_ms": "total_duration_ms"}
COLUMNS = ("workload", "repeats", *(f"repeats_{metric}" for metric in SCORED),
           *(f"{kind}_{metric}" for metric in SCORED for kind in ("measured", "predicted")),
           *(f"error_{metric}_pct" for metric in SCORED), "mean_error_pct", "calibration", "in_sample")


def score(runs: list, engine, spec, calibration=None, in_sample: frozenset = frozenset()) -> list[dict]:
    """One row per run: repeats (rows, and per metric), the median of each measured metric, the prediction, the
    errors (%), the calibration applied and whether the run is one it was fitted from (a path of ``in_sample``).
    A run is named by its file's stem, or by its path where two scored files share a stem."""
    from collections import Counter

    from pipeweave.engine import Job

    stems = Counter(workload.stem for workload, _ in runs)
    rows = []
    for workload, repeats in runs:
        summary = engine.predict([Job(workload, spec)])[0].result["summary"]
        name = workload.stem if stems[workload.stem] == 1 else str(workload.path)
        row = {"workload": name, "repeats": len(repeats),
               "calibration": "" if calibration is None else str(calibration.path),
               "in_sample": "" if calibration is None else ("yes" if run_key(workload) in in_sample else "no")}
        errors = []
        for metric, field in SCORED.items():
            values = [measured[metric] for measured in repeats if metric in measured]
            median = float(np.median(values)) if values else None
            predicted = float(summary[field])
            error = abs(predicted - median) / median * 100 if median is not None else None
            row |= {f"repeats_{metric}": len(values), f"measured_{metric}": median,
                    f"predicted_{metric}": predicted, f"error_{metric}_pct": error}
            if error is not None:
                errors.append(error)
        row["mean_error_pct"] = float(np.mean(errors))
        rows.append(row)
    return rows


def run_key(workload) -> str:
    return str(Path(workload.path).resolve())


def in_sample_runs(calibration, runs_csv: str | Path, runs: list) -> tuple[bool, frozenset]:
    """(whether ``calibration`` was fitted from ``runs_csv`` itself, the :func:`run_key` of the scored runs it was
    fitted from): by the recorded paths (resolved; an older file's paths as given or stems, compared by stem) and by
    the recorded contents of the runs' workload files (a copy elsewhere is the same run)."""
    from pipeweave.calibration import file_digest

    fitted = calibration.fitted_from.get("e2e") or {}
    same_file = fitted.get("digest") == file_digest(runs_csv)
    recorded = [p for p in fitted.get("runs", []) if isinstance(p, str)]
    paths = {Path(p) for p in recorded if Path(p).is_absolute()}
    stems = {Path(p).stem for p in recorded if not Path(p).is_absolute()}
    digests = set(fitted.get("run_digests", []))
    shared = frozenset(run_key(w) for w, _ in runs if w.path is not None
                       and (Path(w.path).resolve() in paths or w.stem in stems or file_digest(w.path) in digests))
    return same_file, shared


def in_sample_warning(calibration, runs_csv: str | Path, runs: list, same_file: bool, shared: frozenset
                      ) -> str | None:
    """A WARNING when ``calibration`` was fitted from ``runs_csv`` itself or from one of the scored workloads
    (:func:`in_sample_runs`: ``same_file``, ``shared``)."""
    if not same_file and not shared:
        return None
    names = sorted(w.stem for w, _ in runs if run_key(w) in shared)
    what = f"this file {runs_csv}" if same_file else f"the run(s) {', '.join(names)}"
    return (f"WARNING: --calibration {calibration.path} was fitted from {what}: these errors are in-sample and say "
            f"nothing about other runs (calibrate on one run, score the others)")


def table_text(rows: list[dict]) -> str:
    """The rows as CSV text (empty cells for metrics that were not measured)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if row[c] is None else (f"{row[c]:.3f}" if isinstance(row[c], float) else row[c])
                         for c in COLUMNS])
    return out.getvalue()


def markdown(rows: list[dict], gpu: str) -> str:
    def cell(value, digits: int) -> str:
        return "—" if value is None else f"{value:,.{digits}f}"

    calibrated = rows and rows[0]["calibration"]
    lines = [f"| run on {gpu}{' (calibrated)' if calibrated else ''} | repeats | measured prefill / decode step / "
             f"total ms (median) | predicted ms | error prefill / decode / total % | **mean error %** |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        measured = " / ".join(cell(row[f"measured_{m}"], 2) for m in SCORED)
        predicted = " / ".join(cell(row[f"predicted_{m}"], 2) for m in SCORED)
        errors = " / ".join(cell(row[f"error_{m}_pct"], 1) for m in SCORED)
        fewer = [f"{m.removesuffix('_ms')} {row[f'repeats_{m}']}" for m in SCORED
                 if 0 < row[f"repeats_{m}"] < row["repeats"]]
        repeats = f"{row['repeats']}" + (f" ({', '.join(fewer)})" if fewer else "")
        mark = " (in-sample)" if row["in_sample"] == "yes" else ""
        lines.append(f"| {row['workload']}{mark} | {repeats} | {measured} | {predicted} | {errors} | "
                     f"**{row['mean_error_pct']:.1f}** |")
    means = [row["mean_error_pct"] for row in rows]
    worst = max(rows, key=lambda row: row["mean_error_pct"])
    lines.append("")
    summary = (f"{len(rows)} run(s): mean error {np.mean(means):.1f} %, worst {worst['mean_error_pct']:.1f} % "
               f"({worst['workload']})")
    if calibrated:
        others = [row["mean_error_pct"] for row in rows if row["in_sample"] == "no"]
        summary += (f"; calibrated with {rows[0]['calibration']}: "
                    + (f"the {len(others)} run(s) it was not fitted from {np.mean(others):.1f} %" if others
                       else "every run is one it was fitted from (in-sample)"))
    lines.append(summary)
    return "\n".join(lines)


def build_parser() -> ArgumentParser:
    from pipeweave.engine import COLLECTIVE_ESTIMATES

    parser = ArgumentParser(prog="python3 -m pipeweave.compare runs",
                            description="Score pipeweave's predictions on your own measured runs (calibrate.py's "
                                        "--e2e CSV; the median of each run's repeats is the reference).")
    parser.add_argument("--hardware", required=True, help="the GPU the runs were measured on")
    parser.add_argument("--runs", required=True, metavar="CSV",
                        help="workload,prefill_ms,decode_step_ms,total_ms: one row per repeat (calibrate.py --e2e)")
    parser.add_argument("--calibration", default=None, metavar="JSON",
                        help="score the calibrated prediction (a calibration written by calibrate.py for this GPU)")
    parser.add_argument("--output", default=None, metavar="CSV",
                        help="also write the table as CSV ('-': to standard output, the rest to standard error)")
    parser.add_argument("--collective_estimate", choices=COLLECTIVE_ESTIMATES, default="analytical",
                        help="'analytical' (default, as aggregator.py) uses the documented analytical collective "
                             "estimate where no measured model covers a collective, with a WARNING")
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR), help="trained MLPs (default: mlp_models)")
    parser.add_argument("--hardware_dir", default=None, help="directory of GPU spec JSONs (default: hardware)")
    parser.add_argument("--collective_dir", default=str(DEFAULT_COLLECTIVE_DIR),
                        help="collective models (default: collective_models)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from analytical_model.hardware import DEFAULT_HARDWARE_DIR
    from pipeweave.calibration import load_calibration
    from pipeweave.engine import Engine

    args = build_parser().parse_args(argv)
    to_stdout = args.output == STANDARD_STREAM
    say = (lambda line: print(line, file=sys.stderr)) if to_stdout else print
    if args.output and not to_stdout:
        check_output_path(args.output)
        refuse_overwriting_inputs(args.output, {"the --runs file": args.runs, "the --calibration file":
                                                args.calibration, **{"the --hardware file": path
                                                                     for path in hardware_files(args.hardware)}})
    calibration = load_calibration(args.calibration) if args.calibration else None
    engine = Engine(model_dir=args.model_dir, hardware_dir=args.hardware_dir or DEFAULT_HARDWARE_DIR,
                    collective_dir=args.collective_dir, collective_estimate=args.collective_estimate,
                    calibration=calibration, log=lambda line: say(line) if line.startswith("WARNING") else None)
    spec = engine.gpu(args.hardware)
    if calibration is not None:
        calibration.check_hardware([spec.stem])
    runs = read_runs(args.runs, spec, "--runs")
    if args.output and not to_stdout:
        refuse_overwriting_inputs(args.output, {f"the workload {w.path} of a run": w.path for w, _ in runs})
    in_sample = frozenset()
    if calibration is not None:  # the aggregator's WARNINGs, and one for scoring the runs it was fitted from
        communicates = any(workload.has_communication for workload, _ in runs)
        warnings = engine.calibration_warnings([op for workload, _ in runs for op in workload.ops()],
                                               [spec.stem] if communicates else [])
        same_file, in_sample = in_sample_runs(calibration, args.runs, runs)
        for warning in filter(None, [*warnings, in_sample_warning(calibration, args.runs, runs, same_file,
                                                                  in_sample)]):
            say(warning)
        if same_file:
            in_sample = frozenset(run_key(workload) for workload, _ in runs)
    rows = score(runs, engine, spec, calibration, in_sample)
    say(markdown(rows, spec.stem))
    single = [row["workload"] for row in rows if any(row[f"repeats_{m}"] == 1 for m in SCORED)]
    if single:
        say(f"note: a metric measured once, scored as measured (no median): {', '.join(single)}")
    if to_stdout:
        sys.stdout.write(table_text(rows))
    elif args.output:
        write_atomically(args.output, lambda tmp: tmp.write_text(table_text(rows)))
        say(f"Wrote {args.output}")
    return 0
