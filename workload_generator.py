"""Generate workload JSON files (docs/METHOD.md section 6) from a model config and a request trace.

The logic lives in pipeweave/generate_cli.py, pipeweave/generate.py and pipeweave/workload.py.

Examples (from the repository root):

    python3 workload_generator.py --paper_set
    python3 workload_generator.py --model_config Llama-3.1-70B --trace arxiv_16 --tp 4
    python3 workload_generator.py --model_config Mixtral-8x7B --trace arxiv_16 --tp 4 --ep 4
    python3 workload_generator.py --model_config Llama-3.1-70B --trace arxiv_16 --tp 4 --dtype fp8
    python3 workload_generator.py --model_config Qwen2.5-14B --trace splitwise_32 --single_sequence \\
        --prompt_tokens 32720 --name vllm_s32
"""
from __future__ import annotations

import sys

from pipeweave.cli import run_cli
from pipeweave.generate_cli import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
