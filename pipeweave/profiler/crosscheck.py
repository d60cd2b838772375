"""python3 -m pipeweave.profiler.crosscheck: this project's kernel measurements beside another source's rows of the
same GPU, shape and dtype.

    python3 -m pipeweave.profiler.crosscheck [--measured_dir dataset/measured] [--dataset_dir dataset]
        [--reference aiconfigurator-core] [--output REPORT.md]

Why. Before the profiler's rows (``profile_operators.py``) train or calibrate anything, they should agree with
what another harness measured on the same GPU: a systematic ratio means the harnesses differ (timing, L2 flush,
kernel choice, clocks), not the GPU, and a calibration fitted on one would carry that into every prediction. For
every operator, the measured rows (``<measured_dir>/<gpu>/<op>.csv``, read as ``python3 -m dataset.build`` reads
them) are joined with the rows of ``dataset/<op>_{train,test}.csv`` whose source starts with ``--reference``
(default aiconfigurator-core: vLLM's kernels as aiconfigurator timed them) on GPU, shape columns and dtype. Per
operator and GPU the report gives the ratio measured / reference: median, interquartile range and extremes over
all matched rows, the median per reference duration bin (launch-bound kernels differ in other ways than
long ones), and the rows that differ most. Nothing is fitted.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import hardware_registry
from analytical_model.registry import get_operator
from pipeweave.cli import ArgumentParser, UserError, check_output_path, print_report, run_cli
from pipeweave.paths import CHECKOUT, DATASET_DIR

DEFAULT_MEASURED_DIR = DATASET_DIR / "measured"
DEFAULT_REFERENCE = "aiconfigurator-core"
#: reference duration bins (µs) of the per-regime medians: the harness gaps measured on an H100 lie below 100 µs
DURATION_EDGES = (0.0, 10.0, 30.0, 100.0, 1000.0, np.inf)
WORST_ROWS = 5


def matched_rows(op: str, measured: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """Rows measured in both frames (same GPU, shape, dtype): the shape columns, hardware, dtype, ``measured_us``,
    ``reference_us`` and ``ratio`` = measured / reference. Both frames have their GPU names canonical."""
    key = [*get_operator(op).shape_columns, "hardware", "dtype"]
    left, right = (frame.groupby(key, as_index=False)["avg_duration"].median().rename(columns={"avg_duration": name})
                   for frame, name in ((measured, "measured_us"), (reference, "reference_us")))
    joined = left.merge(right, on=key, how="inner")
    return joined.assign(ratio=joined["measured_us"] / joined["reference_us"])


def summary(op: str, joined: pd.DataFrame) -> list[dict]:
    """One entry per GPU: matched rows, ratio quantiles, medians per duration bin and the most different rows."""
    out = []
    shape_columns = list(get_operator(op).shape_columns)
    for gpu, rows in joined.groupby("hardware", sort=True):
        ratio = rows["ratio"].to_numpy()
        decades = pd.cut(rows["reference_us"], DURATION_EDGES, right=False)
        per_decade = {str(interval): (int(len(group)), float(group["ratio"].median()))
                      for interval, group in rows.groupby(decades, observed=True)}
        distance = np.abs(np.log(ratio))
        worst = rows.iloc[np.argsort(-distance)[:WORST_ROWS]]
        out.append({"op": op, "hardware": gpu, "rows": int(len(rows)), "median": float(np.median(ratio)),
                    "q25": float(np.quantile(ratio, 0.25)), "q75": float(np.quantile(ratio, 0.75)),
                    "min": float(ratio.min()), "max": float(ratio.max()), "per_decade": per_decade,
                    "worst": [{**{c: row[c] for c in shape_columns}, "measured_us": float(row["measured_us"]),
                               "reference_us": float(row["reference_us"]), "ratio": float(row["ratio"])}
                              for _, row in worst.iterrows()]})
    return out


#: how a GPU without a hardware JSON gets one (the reference rows are found by the JSON's canonical name)
ADD_HARDWARE_JSON = ("write one with python3 profile_operators.py --hardware_json PATH on that GPU, fill it in and "
                     "move it into hardware/")


def canonical_hardware(frame: pd.DataFrame, registry) -> tuple[pd.DataFrame, set[str]]:
    """(the rows of GPUs a hardware JSON describes, with its canonical name; the driver names of the others)."""
    unknown = {name for name in frame["hardware"].unique() if name not in registry}
    frame = frame[~frame["hardware"].isin(unknown)]
    names = {name: registry.get(name).name for name in frame["hardware"].unique()}
    return frame.assign(hardware=frame["hardware"].map(names)), unknown


def crosscheck(measured_dir: Path, dataset_dir: Path, reference: str) -> list[dict]:
    """:func:`summary` entries of every operator and GPU with measured rows (``rows`` 0: no shape in common). A GPU
    without a hardware JSON is skipped with a note (one GPU just measured must not stop the report of the others);
    an error only if no GPU is left."""
    if not CHECKOUT:  # the dataset builder's reader and the built datasets stay in the repository
        raise UserError("the crosscheck runs from a checkout of the repository: it reads the built datasets "
                        "(python3 -m dataset.build), which an installed copy does not have")
    from dataset.sources import load_measured

    measured = load_measured(measured_dir, log=lambda message: print(message, file=sys.stderr))
    if not measured:
        from pipeweave.profiler.grids import SHAPE_COLUMNS

        if any((Path(measured_dir) / f"{op}.csv").is_file() for op in SHAPE_COLUMNS):  # one GPU's folder
            raise UserError(f"no measured kernels under {measured_dir}/<gpu>/<op>.csv: {measured_dir} holds one "
                            f"GPU's <op>.csv; give the folder above it, --measured_dir {Path(measured_dir).parent}")
        raise UserError(f"no measured kernels under {measured_dir}/<gpu>/<op>.csv: measure them with "
                        f"python3 profile_operators.py --quick")
    registry, out, skipped = hardware_registry(), [], set()
    for op, frame in measured.items():
        frame, unknown = canonical_hardware(frame, registry)
        skipped |= unknown
        if frame.empty:
            continue
        paths = [path for path in (dataset_dir / f"{op}_{split}.csv" for split in ("train", "test")) if path.is_file()]
        if not paths:
            raise UserError(f"no {op}_train.csv or {op}_test.csv under {dataset_dir} to compare the measured {op} "
                            f"rows with; build them with python3 -m dataset.build")
        known = pd.concat([pd.read_csv(path, low_memory=False) for path in paths], ignore_index=True)
        known = known[known["source"].astype(str).str.startswith(reference)
                      & known["hardware"].isin(frame["hardware"].unique())]
        entries = summary(op, matched_rows(op, frame, known)) if len(known) else []
        matched = {entry["hardware"] for entry in entries}
        for gpu in sorted(set(frame["hardware"]) - matched):
            why = ("no shape in common" if (known["hardware"] == gpu).any()
                   else f"{reference} has no {op} rows of this GPU")
            entries.append({"op": op, "hardware": gpu, "rows": 0,
                            "measured_rows": int((frame["hardware"] == gpu).sum()), "why": why})
        out += entries
    for name in sorted(skipped):
        print(f"note: measured rows of {name!r} skipped: no hardware JSON describes it; {ADD_HARDWARE_JSON}",
              file=sys.stderr)
    if not out:
        raise UserError(f"no measured GPU under {measured_dir} has a hardware JSON ({', '.join(sorted(skipped))}); "
                        f"{ADD_HARDWARE_JSON}")
    return out


def render(entries: list[dict], reference: str) -> str:
    lines = [f"# Measured kernels beside {reference}", "",
             "Generated by `python3 -m pipeweave.profiler.crosscheck`. Ratio = this project's measured duration / "
             f"{reference}'s, same GPU, shape and dtype (median of repeats on each side).", "",
             "| operator | GPU | matched rows | median ratio | IQR | min – max | median per reference duration |",
             "|---|---|---|---|---|---|---|"]
    for e in entries:
        if not e["rows"]:
            lines.append(f"| {e['op']} | {e['hardware']} | 0 of {e['measured_rows']} ({e['why']}) | — | — | — | — |")
            continue
        decades = "; ".join(f"{interval} µs: {ratio:.3f} ({n})" for interval, (n, ratio) in e["per_decade"].items())
        lines.append(f"| {e['op']} | {e['hardware']} | {e['rows']} | {e['median']:.3f} "
                     f"| {e['q25']:.3f}–{e['q75']:.3f} | {e['min']:.3f} – {e['max']:.3f} | {decades} |")
    for e in entries:
        if e["rows"]:
            lines += ["", f"Most different {e['op']} rows on {e['hardware']}:", "",
                      "| " + " | ".join([*e["worst"][0]]) + " |", "|" + "---|" * len(e["worst"][0])]
            lines += ["| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()) + " |"
                      for row in e["worst"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python3 -m pipeweave.profiler.crosscheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured_dir", type=Path, default=DEFAULT_MEASURED_DIR,
                        help="root of the profiler's <gpu>/<op>.csv (default: dataset/measured)")
    parser.add_argument("--dataset_dir", type=Path, default=DATASET_DIR,
                        help="folder of <op>_{train,test}.csv holding the reference rows (default: dataset)")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE,
                        help=f"source prefix of the reference rows (default: {DEFAULT_REFERENCE})")
    parser.add_argument("--output", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    if args.output:
        check_output_path(args.output)
    text = render(crosscheck(args.measured_dir, args.dataset_dir, args.reference), args.reference)
    print_report(text, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
