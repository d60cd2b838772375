#!/usr/bin/env bash
# Qwen3-32B, TP2 (docs/METHOD.md §9, tp2.sh): arxiv_16, arxiv_12, splitwise_64, splitwise_48 on A100 (FA2), H100 (FA3)
# and RTX PRO 6000 S (FA2); arxiv_12 and splitwise_48 on RTX 6000 Ada (FA2) — 14 runs, as in the artifact.
# Collectives (2-worker all-reduce): every GPU here uses its OWN collective models (collective_models/<GPU>/:
# A100, H100 and RTX PRO 6000 S and RTX 6000 Ada all have measured 2-GPU all-reduce), given explicitly below.
# Writes e2e/pipeweave_pred/<workload stem>_<GPU, spaces as _>.json; extra flags pass through to aggregator.py.
set -euo pipefail
start="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")"
# workload_dir, pred_dir (PIPEWEAVE_WORKLOAD_DIR / PIPEWEAVE_PRED_DIR: other folders) and need_workloads
source e2e/batch_dirs.sh

need_workloads Qwen3-32B_arxiv_16_fa2_tp2_pp1 Qwen3-32B_arxiv_16_fa3_tp2_pp1 Qwen3-32B_arxiv_12_fa2_tp2_pp1 \
  Qwen3-32B_arxiv_12_fa3_tp2_pp1 Qwen3-32B_splitwise_64_fa2_tp2_pp1 Qwen3-32B_splitwise_64_fa3_tp2_pp1 \
  Qwen3-32B_splitwise_48_fa2_tp2_pp1 Qwen3-32B_splitwise_48_fa3_tp2_pp1

python3 aggregator.py --pairs - --output "$pred_dir" --model_dir mlp_models --hardware_dir hardware \
  "$@" <<EOF
workload,hardware,collective_hardware
$workload_dir/Qwen3-32B_arxiv_16_fa2_tp2_pp1.json,A100,A100
$workload_dir/Qwen3-32B_arxiv_12_fa2_tp2_pp1.json,A100,A100
$workload_dir/Qwen3-32B_splitwise_64_fa2_tp2_pp1.json,A100,A100
$workload_dir/Qwen3-32B_splitwise_48_fa2_tp2_pp1.json,A100,A100
$workload_dir/Qwen3-32B_arxiv_16_fa3_tp2_pp1.json,H100,H100
$workload_dir/Qwen3-32B_arxiv_12_fa3_tp2_pp1.json,H100,H100
$workload_dir/Qwen3-32B_splitwise_64_fa3_tp2_pp1.json,H100,H100
$workload_dir/Qwen3-32B_splitwise_48_fa3_tp2_pp1.json,H100,H100
$workload_dir/Qwen3-32B_arxiv_16_fa2_tp2_pp1.json,RTX PRO 6000 S,RTX PRO 6000 S
$workload_dir/Qwen3-32B_arxiv_12_fa2_tp2_pp1.json,RTX PRO 6000 S,RTX PRO 6000 S
$workload_dir/Qwen3-32B_splitwise_64_fa2_tp2_pp1.json,RTX PRO 6000 S,RTX PRO 6000 S
$workload_dir/Qwen3-32B_splitwise_48_fa2_tp2_pp1.json,RTX PRO 6000 S,RTX PRO 6000 S
$workload_dir/Qwen3-32B_arxiv_12_fa2_tp2_pp1.json,RTX 6000 Ada,RTX 6000 Ada
$workload_dir/Qwen3-32B_splitwise_48_fa2_tp2_pp1.json,RTX 6000 Ada,RTX 6000 Ada
EOF
