#!/usr/bin/env bash
# Llama-3.1-70B, TP4 (docs/METHOD.md §9, tp4.sh): arxiv_16 and splitwise_64 on A100 (FA2) and H100 (FA3) — 4 runs.
# Collectives (4-worker all-reduce): each GPU uses its OWN measured collective models (A100: PipeWeave 2/4/8
# workers; H100: PipeWeave 2/4 workers), given explicitly below.
# Writes e2e/pipeweave_pred/<workload stem>_<GPU>.json; extra flags pass through to aggregator.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# PIPEWEAVE_WORKLOAD_DIR / PIPEWEAVE_PRED_DIR: other workload and output folders, e.g. the paper set with vLLM's
# lm_head layout (README "Workloads": workload_generator.py --paper_set --lm_head vocab_parallel --output_dir DIR)
workload_dir="${PIPEWEAVE_WORKLOAD_DIR:-workload}"
pred_dir="${PIPEWEAVE_PRED_DIR:-e2e/pipeweave_pred}"

workloads=(Llama-3.1-70B_arxiv_16_fa2_tp4_pp1 Llama-3.1-70B_arxiv_16_fa3_tp4_pp1
           Llama-3.1-70B_splitwise_64_fa2_tp4_pp1 Llama-3.1-70B_splitwise_64_fa3_tp4_pp1)
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
$workload_dir/Llama-3.1-70B_arxiv_16_fa2_tp4_pp1.json,A100,A100
$workload_dir/Llama-3.1-70B_splitwise_64_fa2_tp4_pp1.json,A100,A100
$workload_dir/Llama-3.1-70B_arxiv_16_fa3_tp4_pp1.json,H100,H100
$workload_dir/Llama-3.1-70B_splitwise_64_fa3_tp4_pp1.json,H100,H100
EOF
