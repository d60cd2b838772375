#!/usr/bin/env bash
# Llama-3.1-70B, TP8, FA3 (docs/METHOD.md §9, tp8.sh): arxiv_16 and splitwise_64 on H800 and H20 (the artifact's
# active runs), plus arxiv_32 and splitwise_72 on H800 (commented out in the artifact's script, but their H800
# outputs are part of its stored comparison) — 6 runs.
# Collectives (8-worker all-reduce): each GPU uses its OWN measured collective models (H800 and H20: PipeWeave
# 8-worker sweeps), given explicitly below.
# Writes e2e/pipeweave_pred/<workload stem>_<GPU>.json; extra flags pass through to aggregator.py.
set -euo pipefail
start="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")"
# workload_dir, pred_dir (PIPEWEAVE_WORKLOAD_DIR / PIPEWEAVE_PRED_DIR: other folders) and need_workloads
source e2e/batch_dirs.sh

need_workloads Llama-3.1-70B_arxiv_16_fa3_tp8_pp1 Llama-3.1-70B_splitwise_64_fa3_tp8_pp1 \
  Llama-3.1-70B_arxiv_32_fa3_tp8_pp1 Llama-3.1-70B_splitwise_72_fa3_tp8_pp1

python3 aggregator.py --pairs - --output "$pred_dir" --model_dir mlp_models --hardware_dir hardware \
  "$@" <<EOF
workload,hardware,collective_hardware
$workload_dir/Llama-3.1-70B_arxiv_16_fa3_tp8_pp1.json,H800,H800
$workload_dir/Llama-3.1-70B_splitwise_64_fa3_tp8_pp1.json,H800,H800
$workload_dir/Llama-3.1-70B_arxiv_32_fa3_tp8_pp1.json,H800,H800
$workload_dir/Llama-3.1-70B_splitwise_72_fa3_tp8_pp1.json,H800,H800
$workload_dir/Llama-3.1-70B_arxiv_16_fa3_tp8_pp1.json,H20,H20
$workload_dir/Llama-3.1-70B_splitwise_64_fa3_tp8_pp1.json,H20,H20
EOF
