"""End-to-end latency prediction (docs/METHOD.md §7): workload JSON(s) × GPU(s) → prediction JSON(s).

    python3 aggregator.py --workload workload/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json --hardware A100 \
        --output e2e/pipeweave_pred/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_A100.json
    python3 aggregator.py --workload W1.json W2.json --hardware A100,H100 --output out_dir/   # sweep
    python3 aggregator.py --pairs matrix.csv --output e2e/pipeweave_pred                      # explicit matrix

The command line is pipeweave/aggregate.py (the engine pipeweave/engine.py, the workload schema
pipeweave/schema.py, the output pipeweave/report.py); see ``--help`` for every flag.
"""
from __future__ import annotations

import sys

from pipeweave.aggregate import main
from pipeweave.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
