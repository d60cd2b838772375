#!/usr/bin/env bash
# Qwen3-32B, TP2 (docs/METHOD.md §9, tp2.sh): arxiv_16, arxiv_12, splitwise_64, splitwise_48 on A100 (FA2), H100 (FA3)
# and RTX PRO 6000 S (FA2); arxiv_12 and splitwise_48 on RTX 6000 Ada (FA2) — 14 runs, as in the artifact.
# Collectives (2-worker all-reduce): every GPU here uses its OWN collective models (collective_models/<GPU>/:
# A100, H100 and RTX PRO 6000 S and RTX 6000 Ada all have measured 2-GPU all-reduce), given explicitly below.
# Writes e2e/pipeweave_pred/<workload stem>_<GPU, spaces as _>.json; extra flags pass through to aggregator.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# PIPEWEAVE_WORKLOAD_DIR / PIPEWEAVE_PRED_DIR: other workload and output folders, e.g. the paper set with vLLM's
# lm_head layout (README "Workloads": workload_generator.py --paper_set --lm_head vocab_parallel --output_dir DIR)
workload_dir="${PIPEWEAVE_WORKLOAD_DIR:-workload}"
pred_dir="${PIPEWEAVE_PRED_DIR:-e2e/pipeweave_pred}"

workloads=(Qwen3-32B_arxiv_16_fa2_tp2_pp1 Qwen3-32B_arxiv_16_fa3_tp2_pp1 Qwen3-32B_arxiv_12_fa2_tp2_pp1
           Qwen3-32B_arxiv_12_fa3_tp2_pp1 Qwen3-32B_splitwise_64_fa2_tp2_pp1 Qwen3-32B_splitwise_64_fa3_tp2_pp1
           Qwen3-32B_splitwise_48_fa2_tp2_pp1 Qwen3-32B_splitwise_48_fa3_tp2_pp1)
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
