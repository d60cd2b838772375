#!/usr/bin/env bash
# Qwen2.5-14B, TP1 (docs/METHOD.md §9, tp1.sh): traces arxiv_8 and splitwise_32 on all eleven artifact GPUs —
# FA3 prefill files on the Hopper GPUs (H100, H20, H200, H800), FA2 files on the others (22 runs).
# TP1 has no communication, so no collective models are involved.
# Writes e2e/pipeweave_pred/<workload stem>_<GPU, spaces as _>.json; extra flags (e.g. --model_dir DIR) pass
# through to aggregator.py. One process: the models are loaded once (sweep mode, --pairs).
set -euo pipefail
start="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")"
# workload_dir, pred_dir (PIPEWEAVE_WORKLOAD_DIR / PIPEWEAVE_PRED_DIR: other folders) and need_workloads
source e2e/batch_dirs.sh

need_workloads Qwen2.5-14B_arxiv_8_fa2_tp1_pp1 Qwen2.5-14B_arxiv_8_fa3_tp1_pp1 \
  Qwen2.5-14B_splitwise_32_fa2_tp1_pp1 Qwen2.5-14B_splitwise_32_fa3_tp1_pp1

python3 aggregator.py --pairs - --output "$pred_dir" --model_dir mlp_models --hardware_dir hardware \
  "$@" <<EOF
workload,hardware
# Hopper: FA3 prefill
$workload_dir/Qwen2.5-14B_arxiv_8_fa3_tp1_pp1.json,H100
$workload_dir/Qwen2.5-14B_arxiv_8_fa3_tp1_pp1.json,H20
$workload_dir/Qwen2.5-14B_arxiv_8_fa3_tp1_pp1.json,H200
$workload_dir/Qwen2.5-14B_arxiv_8_fa3_tp1_pp1.json,H800
$workload_dir/Qwen2.5-14B_splitwise_32_fa3_tp1_pp1.json,H100
$workload_dir/Qwen2.5-14B_splitwise_32_fa3_tp1_pp1.json,H20
$workload_dir/Qwen2.5-14B_splitwise_32_fa3_tp1_pp1.json,H200
$workload_dir/Qwen2.5-14B_splitwise_32_fa3_tp1_pp1.json,H800
# Ampere, Ada, Blackwell workstation: FA2 prefill
$workload_dir/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json,A100
$workload_dir/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json,A40
$workload_dir/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json,RTX A6000
$workload_dir/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json,L20
$workload_dir/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json,L40
$workload_dir/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json,RTX 6000 Ada
$workload_dir/Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json,RTX PRO 6000 S
$workload_dir/Qwen2.5-14B_splitwise_32_fa2_tp1_pp1.json,A100
$workload_dir/Qwen2.5-14B_splitwise_32_fa2_tp1_pp1.json,A40
$workload_dir/Qwen2.5-14B_splitwise_32_fa2_tp1_pp1.json,RTX A6000
$workload_dir/Qwen2.5-14B_splitwise_32_fa2_tp1_pp1.json,L20
$workload_dir/Qwen2.5-14B_splitwise_32_fa2_tp1_pp1.json,L40
$workload_dir/Qwen2.5-14B_splitwise_32_fa2_tp1_pp1.json,RTX 6000 Ada
$workload_dir/Qwen2.5-14B_splitwise_32_fa2_tp1_pp1.json,RTX PRO 6000 S
EOF
