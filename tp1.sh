#!/usr/bin/env bash
# Qwen2.5-14B, TP1 (docs/METHOD.md §9, tp1.sh): traces arxiv_8 and splitwise_32 on all eleven artifact GPUs —
# FA3 prefill files on the Hopper GPUs (H100, H20, H200, H800), FA2 files on the others (22 runs).
# TP1 has no communication, so no collective models are involved.
# Writes e2e/pipeweave_pred/<workload stem>_<GPU, spaces as _>.json; extra flags (e.g. --model_dir DIR) pass
# through to aggregator.py. One process: the models are loaded once (sweep mode, --pairs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# PIPEWEAVE_WORKLOAD_DIR / PIPEWEAVE_PRED_DIR: other workload and output folders, e.g. the paper set with vLLM's
# lm_head layout (README "Workloads": workload_generator.py --paper_set --lm_head vocab_parallel --output_dir DIR)
workload_dir="${PIPEWEAVE_WORKLOAD_DIR:-workload}"
pred_dir="${PIPEWEAVE_PRED_DIR:-e2e/pipeweave_pred}"

workloads=(Qwen2.5-14B_arxiv_8_fa2_tp1_pp1 Qwen2.5-14B_arxiv_8_fa3_tp1_pp1
           Qwen2.5-14B_splitwise_32_fa2_tp1_pp1 Qwen2.5-14B_splitwise_32_fa3_tp1_pp1)
for w in "${workloads[@]}"; do
  if [[ -f "$workload_dir/$w.json" ]]; then continue; fi
  if [[ "$workload_dir" != workload ]]; then
    echo "$0: $workload_dir/$w.json is missing; write the paper set there with" \
         "python3 workload_generator.py --paper_set --lm_head LAYOUT --output_dir $workload_dir" >&2
    exit 2
  fi
  python3 workload_generator.py --paper_set; break
done

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
