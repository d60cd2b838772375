"""Write this project's request traces from the PipeWeave artifact's trace CSVs.

Usage (from the repository root):

    python3 workload/traces/make_traces.py [--source DIR] [--dest DIR]

``--source`` defaults to ``$PIPEWEAVE_SHARED_DATA/pipeweave/workload/traces`` (``PIPEWEAVE_SHARED_DATA``
defaults to a ``shared/data`` folder beside the checkout); ``--dest`` defaults to this folder. Each source file may be in the
artifact's format (``num_prefill_tokens,num_decode_tokens,output_tokens``, CRLF line ends) or in ours; the output
is ``request,prompt_tokens,decode_tokens,output_tokens`` with LF line ends, requests numbered from 1.
Only the standard library is used, so the script runs without installing anything.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
TRACE_NAMES = ("arxiv_8", "arxiv_12", "arxiv_16", "arxiv_32", "splitwise_32", "splitwise_48", "splitwise_64",
               "splitwise_72", "vllm_arxiv16", "vllm_splitwise64")
HEADER = ("request", "prompt_tokens", "decode_tokens", "output_tokens")
FORMATS = (("prompt_tokens", "decode_tokens", "output_tokens"),
           ("num_prefill_tokens", "num_decode_tokens", "output_tokens"))


def shared_traces_dir() -> Path:
    root = Path(os.environ.get("PIPEWEAVE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
    return root / "pipeweave" / "workload" / "traces"


def convert(text: str, name: str) -> str:
    """Trace CSV text (either format) -> this project's format."""
    rows = [r for r in csv.reader(io.StringIO(text.lstrip("\ufeff"))) if any(c.strip() for c in r)]
    if not rows:
        raise ValueError(f"{name}: empty file")
    header = [c.strip() for c in rows[0]]
    columns = next((f for f in FORMATS if set(f) <= set(header)), None)
    if columns is None:
        raise ValueError(f"{name}: unrecognised header {','.join(header)!r}")
    idx = [header.index(c) for c in columns]
    out = [",".join(HEADER)]
    outputs = set()
    for n, row in enumerate(rows[1:], start=1):
        prompt, decode, output = (int(row[i]) for i in idx)
        if prompt < 1 or decode < 0 or output < 1:
            raise ValueError(f"{name}: request {n}: invalid lengths {prompt},{decode},{output}")
        outputs.add(output)
        out.append(f"{n},{prompt},{decode},{output}")
    if len(out) == 1:
        raise ValueError(f"{name}: no requests")
    if len(outputs) != 1:
        raise ValueError(f"{name}: output_tokens differs between rows: {sorted(outputs)}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=None,
                   help="folder with the artifact's <name>.csv traces (default: $PIPEWEAVE_SHARED_DATA/pipeweave/"
                        "workload/traces, the shared data beside the checkout without it)")
    p.add_argument("--dest", type=Path, default=HERE, help="output folder (default: workload/traces/)")
    args = p.parse_args(argv)
    source = args.source or shared_traces_dir()
    if not source.is_dir():
        print(f"make_traces.py: error: no trace folder {source}: the artifact's traces come with the shared data "
              f"(set PIPEWEAVE_SHARED_DATA to its folder, or pass --source)", file=sys.stderr)
        return 2
    try:
        converted = {name: convert((source / f"{name}.csv").read_text(encoding="utf-8"), name) for name in TRACE_NAMES}
    except (OSError, ValueError) as exc:
        print(f"make_traces.py: error: {exc}", file=sys.stderr)
        return 2
    args.dest.mkdir(parents=True, exist_ok=True)
    for name, text in converted.items():
        tmp = args.dest / f".{name}.csv.tmp"
        tmp.write_text(text, encoding="ascii", newline="\n")
        os.replace(tmp, args.dest / f"{name}.csv")
        print(args.dest / f"{name}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
