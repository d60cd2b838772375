"""Static-batch predictions vs measured runs (docs/METHOD.md §8.1, with the fixes described in pipeweave/compare.py).

    python3 compare_pred_real.py                        # e2e/pipeweave_comparison.csv + .png, table on stdout
    python3 compare_pred_real.py --markdown docs/E2E.md # also the full report (static + vLLM tables)
    python3 compare_pred_real.py --summarize_real       # rebuild e2e/real/measured_runs.csv from the shared data

Errors are against the median of the measured repetitions; a roofline baseline and the artifact's published
predictions are shown beside PipeWeave.
"""
from __future__ import annotations

import sys

from pipeweave.cli import run_cli
from pipeweave.compare import main_pred_real

if __name__ == "__main__":
    sys.exit(run_cli(main_pred_real))
