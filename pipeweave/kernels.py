"""Per-kernel duration prediction for a CSV of shapes: the logic behind ``predict_kernels.py``.

    python3 predict_kernels.py --op gemm --input shapes.csv --output predicted.csv

The input needs the operator's shape columns (see ``analytical_model.registry``: gemm M,N,K [+ optional tile_M, tile_N,
tile_K, is_split_k, cta_count]; attn attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd with lists written "[a,b]";
rmsnorm/siluandmul seq,dim; ...) and ``hardware`` (any GPU name the hardware loader accepts). The output holds every
input column unchanged (extra columns pass through, text as read) plus ``predicted_us``: C_ideal / (predicted efficiency
× SM clock) (docs/METHOD.md §4.3), from one batched MLP pass, with the efficiency kept inside its physical band
(:mod:`pipeweave.bounds`); ``low_us`` and ``high_us``: the interval that held-out kernel errors of the prediction's
state put around it (:mod:`pipeweave.intervals`); ``extrapolation``: empty where the model's training data covers the
kernel, else the set reasons joined by ``+``: ``architecture`` (no training GPU has the GPU's SM design, its compute
capability), ``range`` (a model input lies outside its training range), ``members`` (the ensemble's members disagree
beyond its threshold), ``shares`` (a pipe share the network reads lies outside its training range:
:mod:`pipeweave.edges`), e.g. ``range+members``."""
from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import numpy as np

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, UnknownHardwareError
from analytical_model.pipes import HardwareSpec
from analytical_model.registry import OPERATORS, get_operator, shape_columns_help
from pipeweave.cli import (STANDARD_STREAM, ArgumentParser, UserError, check_output_path, refuse_overwriting_inputs,
                           require_file, write_atomically)
from pipeweave.intervals import other_model_warning, physical_interval, row_factors
from pipeweave.predictor import DEFAULT_MODEL_DIR, KernelPredictor, extrapolation_label
from pipeweave.paths import command
from pipeweave.siblings import die_note, sibling_note
from pipeweave.validation import (attention_warnings, check_shape_table, line_labels, load_model_checked,
                                  row_label)


def _csv_lines(handle, path) -> list[tuple[int, list[str]]]:
    """(the line a row starts on, its cells) per row of a CSV. A cell running over lines is refused, naming the line
    it starts on: shape cells never hold a line break, and an unclosed quote swallowed every row after it."""
    reader, out, start = csv.reader(handle), [], 1
    for row in reader:
        if any("\n" in cell or "\r" in cell for cell in row):
            raise UserError(f"{path}: line {start}: a quoted cell runs over several lines (an unclosed quote?)")
        out.append((start, row))
        start = reader.line_num + 1
    return out


def read_shapes(path: str | Path, expected: str = "expected a header row"
                ) -> tuple[list[str], list[list[str]], list[int]]:
    """(header, rows, the CSV line of each row) of a CSV (``-``: standard input), as text (so that pass-through
    columns are written back exactly as read); the header's names are stripped ("M, N, K, hardware" names the
    columns M, N, K and hardware); blank lines are skipped, so errors name a row by its line (:func:`line_labels`);
    an empty file's error says what was ``expected``; a column named twice is an error."""
    try:
        if str(path) == STANDARD_STREAM:  # the bytes, so that invalid UTF-8 is refused as it is in a file
            path = "standard input"
            lines = _csv_lines(io.StringIO(sys.stdin.buffer.read().decode("utf-8-sig")), path)
        else:
            path = require_file(path, "input CSV")
            with open(path, newline="", encoding="utf-8-sig") as handle:  # a byte-order mark is not a column name
                lines = _csv_lines(handle, path)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: not a readable CSV ({exc})") from None
    if not lines:
        raise UserError(f"{path}: empty file ({expected})")
    header = [name.strip() for name in lines[0][1]]
    numbered = [(number, row) for number, row in lines[1:] if row]  # blank lines are skipped
    rows, line_numbers = [row for _, row in numbered], [number for number, _ in numbered]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:  # which of the two holds the shape would be a guess
        raise UserError(f"{path}: repeated column(s) {', '.join(repeated)}")
    label = line_labels(line_numbers)
    for position, row in enumerate(rows):
        if len(row) != len(header):
            raise UserError(f"{path}: {label(position)} has {len(row)} fields, the header {len(header)}")
    return header, rows, line_numbers


def predict_shapes(header: list[str], rows: list[list[str]], op: str, predictor: KernelPredictor,
                   calibration=None, source: str = "input", label=row_label
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(``predicted_us``, extrapolation bits, the fastest µs physics allows) per row of a table read by
    :func:`read_shapes`; unknown GPUs and missing columns are errors naming the row/column. A ``calibration``
    (pipeweave.calibration) corrects the rows on its GPU and is refused if no row is on it."""
    operator = get_operator(op)
    missing = [c for c in (*operator.shape_columns, "hardware") if c not in header]
    if missing:
        raise UserError(f"input lacks column(s) {', '.join(missing)} needed by --op {op} "
                        f"(shape columns: {', '.join(operator.shape_columns)}, plus hardware)")
    index = {name: i for i, name in enumerate(header)}
    try:
        check_shape_table({name: [row[i] for row in rows] for name, i in index.items()}, operator, label)
    except ValueError as exc:
        raise UserError(f"{source}: {exc}") from None
    hardware = [row[index["hardware"]].strip() for row in rows]
    for position, name in enumerate(hardware):
        if name not in predictor.hardware:
            try:  # the registry's message: "did you mean" and the folder, as every other command says it
                predictor.hardware.get(name)
            except UnknownHardwareError as exc:
                raise UserError(f"{source}: {label(position)}: {exc}") from None
    used = [c for c in (*operator.shape_columns, *operator.optional_columns) if c in index]
    columns = {c: [row[index[c]] or None for row in rows] for c in used}  # an empty cell is a missing value
    if not rows:
        return np.zeros(0), np.zeros(0, dtype=np.int8), np.zeros(0)
    if calibration is not None:
        calibration.check_hardware([predictor.hardware.get(name).stem for name in hardware])
    try:
        return predictor.predict_columns_bounded(op, columns, hardware, calibration)
    except ValueError as exc:
        raise UserError(f"--op {op}: {exc.args[0] if exc.args else exc}") from None


def interval_us(op: str, predictor: KernelPredictor, gpu_names: list[str], predicted_us: np.ndarray,
                extrapolation: np.ndarray, fastest_us: np.ndarray, calibration=None, attention_types=None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) ends of each row's measured interval (:mod:`pipeweave.intervals`) around ``predicted_us``, the
    low end no faster than ``fastest_us`` (:meth:`KernelPredictor.predict_columns_bounded`); attention rows need
    their ``attention_types``."""
    low, high = row_factors(op, predictor.trained_on(op), [predictor.hardware.get(name) for name in gpu_names],
                            extrapolation, calibration, attention_types)
    return physical_interval(predicted_us, low, high, fastest_us)


def prediction_warnings(op: str, predictor: KernelPredictor, directory, calibration=None, named: str | None = None,
                        intervals: bool = True) -> list[str]:
    """The WARNING lines of predicting ``op`` with the model in ``directory``: with ``intervals``, that they were
    measured for another model; the aggregator's for a ``calibration`` fitted against another model or another spec
    of its GPU (``named``: the calibration as the caller gave it, default ``--calibration PATH``)."""
    lines = [other_model_warning(op, directory) if intervals else None]
    lines += [predictor.respecified_warning(spec) for spec in predictor.hardware.specs.values()]
    if calibration is not None:
        lines += calibration.stale_models({op: directory}, named)
        if calibration.hardware in predictor.hardware:
            lines.append(calibration.stale_spec(predictor.hardware.get(calibration.hardware), named))
    return [line for line in lines if line]


#: the columns predict_kernels.py adds (and ``calibration`` with a calibration)
OUTPUT_COLUMNS = ("predicted_us", "low_us", "high_us", "extrapolation")


def write_predictions(path: Path, header: list[str], rows: list[list[str]], predicted_us: np.ndarray,
                      interval: tuple[np.ndarray, np.ndarray], extrapolation: np.ndarray,
                      calibrated: list[str] | None = None) -> None:
    """The input rows unchanged plus the ``predicted_us``, ``low_us``, ``high_us`` (the measured interval) and
    ``extrapolation`` columns (and, with a calibration, a ``calibration`` column naming its file on the rows it
    corrected)."""
    labels = [extrapolation_label(code) for code in extrapolation]
    marks = [] if calibrated is None else [calibrated]

    def write(handle) -> None:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([*header, *OUTPUT_COLUMNS, *(["calibration"] if marks else [])])
        writer.writerows([*row, repr(float(us)), repr(float(low)), repr(float(high)), label, *extra]
                         for row, us, low, high, label, *extra in zip(rows, predicted_us, *interval, labels, *marks))

    if path == STANDARD_STREAM:
        write(sys.stdout)
        return
    with open(path, "w", newline="", encoding="utf-8") as handle:
        write(handle)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="predict_kernels.py",
        description="Predict kernel durations (µs) for a CSV of operator shapes with the trained MLPs.",
    )
    parser.add_argument("--op", required=True, choices=list(OPERATORS),
                        help="operator class, with its shape columns: " + shape_columns_help())
    parser.add_argument("--input", required=True,
                        help="CSV with the operator's shape columns and 'hardware' (a GPU name such as H100, or the "
                             "path of a GPU's JSON file); '-': standard input")
    parser.add_argument("--output", required=True,
                        help="output CSV: the input columns plus predicted_us, low_us, high_us and extrapolation "
                             "('-': standard output)")
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR),
                        help="root of the trained MLPs (default: mlp_models)")
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR),
                        help="directory of GPU spec JSONs (default: hardware)")
    parser.add_argument("--calibration", default=None, metavar="JSON",
                        help="a calibration written by calibrate.py: corrects the rows of its GPU (column "
                             "'calibration' names the file); refused if no row is on that GPU (default: none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    to_stdout = args.output == STANDARD_STREAM
    if not to_stdout:
        check_output_path(args.output, hardware_dir=args.hardware_dir)  # a JSON there would break every later run
        refuse_overwriting_inputs(args.output, {"the --input file": args.input,
                                                "the --calibration file": args.calibration})
    say = (lambda line: print(line, file=sys.stderr)) if to_stdout else print
    header, rows, line_numbers = read_shapes(args.input)
    source = "standard input" if args.input == STANDARD_STREAM else args.input  # what errors name
    written = [name for name in (*OUTPUT_COLUMNS, "calibration") if name in header]
    if written:  # a second set of them would follow the first
        raise UserError(f"{source}: has column(s) {', '.join(written)}, which {command('predict_kernels.py')} "
                        f"writes: give the shapes without them (this looks like an output of "
                        f"{command('predict_kernels.py')})")
    predictor = KernelPredictor(args.model_dir, args.hardware_dir)
    directory = load_model_checked(predictor, args.op)[2]
    calibration, calibrated = None, None
    if args.calibration:
        from pipeweave.calibration import load_calibration

        calibration = load_calibration(args.calibration)
    for line in prediction_warnings(args.op, predictor, directory, calibration):
        say(line)
    predicted, extrapolation, fastest = predict_shapes(header, rows, args.op, predictor, calibration, source,
                                                       line_labels(line_numbers))
    index = header.index("hardware")
    if calibration is not None:
        calibrated = [str(calibration.path) if predictor.hardware.get(row[index].strip()).stem == calibration.hardware
                      else "" for row in rows]
    kinds = [row[header.index("attention_type")].strip() for row in rows] if args.op == "attn" else None
    interval = interval_us(args.op, predictor, [row[index].strip() for row in rows], predicted, extrapolation,
                           fastest, calibration, kinds)
    if to_stdout:
        write_predictions(STANDARD_STREAM, header, rows, predicted, interval, extrapolation, calibrated)
    else:
        refuse_overwriting_inputs(args.output, {f"the hardware file {path} of column hardware": path
                                                for path in predictor.hardware.added_files.values()})
        write_atomically(args.output, lambda tmp: write_predictions(tmp, header, rows, predicted, interval,
                                                                    extrapolation, calibrated))
    say(f"Predicted {len(rows)} {args.op} kernels -> {'standard output' if to_stdout else args.output}")
    gpus = list({spec.stem: spec for spec in (predictor.hardware.get(name) for name in
                                              dict.fromkeys(row[index].strip() for row in rows))}.values())
    with predictor.fine_tuned_by(calibration):
        siblings = [(hw, predictor.sibling(args.op, hw), predictor.die_sibling(args.op, hw)) for hw in gpus]
    for hw, sibling, die in siblings:
        if sibling is not None:
            say(sibling_note(args.op, hw.name, sibling.name))
        if die is not None:
            say(die_note(args.op, hw.name, die.name))
    for line in unmeasured_notes(args.op, predictor, gpus, calibration):
        say(line)
    if args.op == "attn":  # the aggregator's warnings: FA3 where it cannot run, attention types nothing measured
        kind_column = header.index("attention_type")
        for line in row_attention_warnings(source, [(row[kind_column].strip(),
                                                     predictor.hardware.get(row[index].strip())) for row in rows]):
            say(line)
    return 0


def unmeasured_notes(op: str, predictor: KernelPredictor, gpus: list[HardwareSpec], calibration=None) -> list[str]:
    """The aggregator's zero-shot note for each of ``gpus`` whose kernels ``op``'s model has no measurement of (in its
    training data, or from the ``calibration``'s fine-tuning) and that the calibration measured none of either."""
    from pipeweave.engine import uncalibrated, unmeasured_note
    from pipeweave.flatten import KERNEL_CATEGORIES

    category = next((name for name, key in KERNEL_CATEGORIES.items() if key == op), op)
    with predictor.fine_tuned_by(calibration):
        unmeasured = [hw for hw in gpus if not predictor.measured_on(op, hw)]
    lines = []
    for hw in unmeasured:
        zero_shot, calibrated = uncalibrated([category], calibration.record(hw) if calibration is not None else None)
        if zero_shot:
            lines.append(unmeasured_note(hw.name, zero_shot, calibrated=calibrated))
    return lines


def row_attention_warnings(source: str, kinds_on: list[tuple[str, HardwareSpec]]) -> list[str]:
    """The WARNING lines of attention rows ((attention_type, GPU) each) that the aggregator would give a workload:
    FlashAttention-3 on a GPU that cannot run it, and attention types no GPU's measurements hold."""
    by_gpu: dict[str, tuple[HardwareSpec, set]] = {}
    for kind, hw in kinds_on:
        by_gpu.setdefault(hw.stem, (hw, set()))[1].add(kind)
    # an unmeasured type's line names no GPU: once, however many GPUs' rows use it
    return list(dict.fromkeys(line for hw, kinds in by_gpu.values()
                              for _, line in attention_warnings(source, sorted(kinds), hw)))
