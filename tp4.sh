#!/usr/bin/env bash
# Llama-3.1-70B, TP4 (docs/METHOD.md §9, tp4.sh): arxiv_16 and splitwise_64 on A100 (FA2) and H100 (FA3) — 4 runs.
# Collectives (4-worker all-reduce): each GPU uses its OWN measured collective models (A100: PipeWeave 2/4/8
# workers; H100: PipeWeave 2/4 workers), given explicitly below.
# Writes e2e/pipeweave_pred/<workload stem>_<GPU>.json; extra flags pass through to aggregator.py.
set -euo pipefail
start="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")"
# workload_dir, pred_dir (PIPEWEAVE_WORKLOAD_DIR / PIPEWEAVE_PRED_DIR: other folders) and need_workloads
source e2e/batch_dirs.sh

need_workloads Llama-3.1-70B_arxiv_16_fa2_tp4_pp1 Llama-3.1-70B_arxiv_16_fa3_tp4_pp1 \
  Llama-3.1-70B_splitwise_64_fa2_tp4_pp1 Llama-3.1-70B_splitwise_64_fa3_tp4_pp1

python3 aggregator.py --pairs - --output "$pred_dir" --model_dir mlp_models --hardware_dir hardware \
  "$@" <<EOF
workload,hardware,collective_hardware
$workload_dir/Llama-3.1-70B_arxiv_16_fa2_tp4_pp1.json,A100,A100
$workload_dir/Llama-3.1-70B_splitwise_64_fa2_tp4_pp1.json,A100,A100
$workload_dir/Llama-3.1-70B_arxiv_16_fa3_tp4_pp1.json,H100,H100
$workload_dir/Llama-3.1-70B_splitwise_64_fa3_tp4_pp1.json,H100,H100
EOF
