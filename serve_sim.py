"""Serving simulation with continuous batching on pipeweave's per-iteration predictions.

    python3 serve_sim.py --model_config Llama-3.1-8B --trace splitwise_48 --hardware H100 --tp 1 --pp 1 \\
        [--scheduler static|vllm] [--qps 20 --num_requests 2000 --seed 0] [--max_num_seqs S] \\
        [--max_num_batched_tokens B] --output out.json [--plot cdf.png]

Logic in pipeweave/serving/ (README "Serving simulation").
"""
from __future__ import annotations

import sys

from pipeweave.cli import run_cli
from pipeweave.serving.cli import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
