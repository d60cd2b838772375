"""python3 -m analytical_model features --op OP --input IN.csv --output OUT.csv
python3 -m analytical_model list [--trainable | --quantile | --profiled] [--keys]

Reads the operator's shape columns and ``hardware`` from IN.csv (as predict_kernels.py reads it: header names
stripped, every row with the header's number of fields) and writes every input column, as read, plus
the feature columns (docs/METHOD.md §4.1 names and order) and ``ideal_cycles`` (``--descriptors`` adds the
shape descriptors of analytical_model/descriptors.py before ``ideal_cycles``). For gemm, optional
columns tile_M, tile_N, tile_K, is_split_k, cta_count override the tile rule row by row.

``list`` prints the operator registry (one line per operator class: key, description, shape columns, where it is
used); ``--keys`` prints only the keys, one per line, for shell loops such as train_all.sh.
"""
from __future__ import annotations

import sys
from pathlib import Path

from pipeweave.cli import (STANDARD_STREAM, ArgumentParser, UserError, check_output_path, program_name, run_cli,
                           write_atomically)
from pipeweave.kernels import read_shapes
from pipeweave.validation import check_shape_table, line_labels

from .hardware import DEFAULT_HARDWARE_DIR
from .registry import OPERATORS, compute_features, get_operator, operator_keys, shape_columns_help


def list_operators(args) -> None:
    keys = operator_keys(trainable=args.trainable or None, quantile=args.quantile or None,
                         profiled=args.profiled or None)
    if args.keys:
        print("\n".join(keys))
        return
    for key in keys:
        op = get_operator(key)
        uses = [name for name, flag in (("trained", op.trainable), ("quantile model", op.quantile),
                                        ("profiled", op.profiled)) if flag]
        if op.workload_key:
            uses.append(f"workload key {op.workload_key!r}")
        print(f"{key:11} {op.description}; shape columns {','.join(op.shape_columns)}; {', '.join(uses)}")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=program_name(), description="Analytical pipe features of GPU kernels.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    features = sub.add_parser("features", help="compute analytical features for a CSV of shapes")
    features.add_argument("--op", required=True, choices=list(OPERATORS),
                          help="operator class, with its shape columns: " + shape_columns_help())
    features.add_argument("--input", required=True, type=Path,
                          help="CSV with the operator's shape columns and 'hardware' (a GPU name such as H100); '-': "
                               "standard input")
    features.add_argument("--output", required=True, type=Path,
                          help="output CSV: the input columns plus the features and ideal_cycles ('-': standard "
                               "output)")
    features.add_argument("--hardware_dir", type=Path, default=DEFAULT_HARDWARE_DIR,
                          help="directory of GPU spec JSONs (default: hardware)")
    features.add_argument("--descriptors", action="store_true",
                          help="also write the shape descriptors the pipeweave models take (after the features)")
    listing = sub.add_parser("list", help="list the registered operator classes")
    for flag, what in (("trainable", "with a trained efficiency model"), ("quantile", "with a quantile model"),
                       ("profiled", "that profile_operators.py measures")):
        listing.add_argument(f"--{flag}", action="store_true", help=f"only operators {what}")
    listing.add_argument("--keys", action="store_true", help="print only the keys, one per line")
    args = parser.parse_args(argv)
    if args.command == "list":
        list_operators(args)
        return 0

    try:  # `list` runs on the base install; only reading and writing the CSV needs pandas
        import pandas as pd
    except ImportError:
        raise UserError("python3 -m analytical_model features needs pandas (pip install '.[train]')") from None
    from_stdin, to_stdout = str(args.input) == STANDARD_STREAM, str(args.output) == STANDARD_STREAM
    if not from_stdin and not args.input.is_file():
        raise UserError(f"input file not found: {args.input}")
    if not to_stdout:
        check_output_path(args.output)
    # read as predict_kernels.py reads it: header names stripped, a row with more or fewer fields than the header
    # refused (pandas took a first column without a name as the index, shifting every shape column), a repeated
    # column refused, and the cells kept as text, so that the input columns are written back as they were read
    header, rows, line_numbers = read_shapes(args.input, "expected a header row with the shape columns and hardware")
    source = "standard input" if from_stdin else args.input  # what errors name
    operator = get_operator(args.op)
    written = [*operator.feature_names, *(operator.descriptor_names if args.descriptors else ()), "ideal_cycles"]
    already = [name for name in written if name in header]
    if already:  # a second column of each name would follow the first, and a reader takes the first, the input's
        raise UserError(f"{source}: has column(s) {', '.join(already)}, which this command writes: give the shapes "
                        f"without them (a dataset CSV or an output of this command?)")
    cells = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    frame = pd.DataFrame({name: [cell or None for cell in values] for name, values in cells.items()},
                         columns=header, dtype=object)  # an empty cell is a missing value
    try:
        check_shape_table(cells, operator, line_labels(line_numbers))
        result = compute_features(args.op, frame, args.hardware_dir)
    except ValueError as exc:
        raise UserError(f"{source}: {exc}") from None
    if not args.descriptors:
        result = result.drop(columns=list(operator.descriptor_names))
    output = pd.concat([frame, result], axis=1)
    if to_stdout:  # as predict_kernels.py: the CSV on standard output, the note on standard error
        output.to_csv(sys.stdout, index=False)
        print(f"wrote {len(output)} rows to standard output", file=sys.stderr)
        return 0
    write_atomically(args.output, lambda tmp: output.to_csv(tmp, index=False))
    print(f"wrote {len(output)} rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
