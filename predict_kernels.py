"""Per-kernel duration prediction for a CSV of operator shapes.

    python3 predict_kernels.py --op attn --input shapes.csv --output predicted.csv [--model_dir mlp_models]

Every input column is kept and ``predicted_us`` is appended; logic in pipeweave/kernels.py.
"""
from __future__ import annotations

import sys

from pipeweave.cli import run_cli
from pipeweave.kernels import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
