"""vLLM TP4xPP2 predictions vs measured total latency (docs/METHOD.md §8.2; median of the 5 measured latencies).

    python3 compare_vllm_pred_real.py [--pred_dir e2e/pipeweave_pred] [--real_dir e2e/real] [--markdown FILE]

Writes e2e/vllm_comparison.csv and e2e/vllm_comparison.png; logic in pipeweave/compare.py.
"""
from __future__ import annotations

import sys

from pipeweave.cli import run_cli
from pipeweave.compare import main_vllm

if __name__ == "__main__":
    sys.exit(run_cli(main_vllm))
