"""Configuration search under latency targets: every feasible (GPU, TP, PP, max_num_seqs) simulated and ranked.

    python3 search_config.py --model_config Llama-3.1-8B --hardware H100,A100 --gpu_budget 4 \\
        --trace splitwise_48 --qps 20 --num_requests 500 --ttft_ms 200 --tpot_ms 30 \\
        --output search.csv [--plot pareto.png] [--workers 2 | --scheduler tcp://host:8786]

Logic in pipeweave/serving/search.py (README "Configuration search").
"""
from __future__ import annotations

import sys

from pipeweave.cli import run_cli
from pipeweave.serving.search import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
