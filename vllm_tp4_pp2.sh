#!/usr/bin/env bash
# Llama-3.1-70B, TP4 x PP2, FA3 (docs/METHOD.md §9, vllm_tp4_pp2.sh): vllm_arxiv16 and vllm_splitwise64 on H800 and
# H20 — 4 runs. Compared with the vLLM measurements by compare_vllm_pred_real.py.
# Collectives: 4-worker all-reduce (TP) and a 2-party send/recv (PP stage boundary).
#   * H20 uses its OWN measured models for both (PipeWeave all-reduce 4/8 workers, send/recv 2).
#   * H800 uses its OWN measured send/recv, but its only all-reduce sweep is 8 workers (PipeWeave) and no other
#     source covers H800. Rather than borrow another GPU's all-reduce (H100's NVLink is 2.25x faster than H800's
#     export-reduced one), --collective_estimate analytical is given: the 4-worker H800 all-reduce uses the
#     documented analytical estimate (a ring all-reduce over H800's NVLink bandwidth and latency from its hardware
#     JSON, times the ring efficiency measured on the NVLink GPUs; below 8 MiB vLLM's custom all-reduce model:
#     pipeweave.collectives, pipeweave.collective_serving), and aggregator.py prints a WARNING line naming it.
#     Nothing else falls back: the flag only applies where no measured model covers a collective.
# Writes e2e/pipeweave_pred/<workload stem>_<GPU>.json; extra flags pass through to aggregator.py.
set -euo pipefail
start="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")"
# workload_dir, pred_dir (PIPEWEAVE_WORKLOAD_DIR / PIPEWEAVE_PRED_DIR: other folders) and need_workloads
source e2e/batch_dirs.sh

need_workloads Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2 Llama-3.1-70B_vllm_splitwise64_fa3_tp4_pp2

python3 aggregator.py --pairs - --output "$pred_dir" --model_dir mlp_models --hardware_dir hardware \
  --collective_estimate analytical "$@" <<EOF
workload,hardware,collective_hardware
$workload_dir/Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2.json,H800,H800
$workload_dir/Llama-3.1-70B_vllm_splitwise64_fa3_tp4_pp2.json,H800,H800
$workload_dir/Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2.json,H20,H20
$workload_dir/Llama-3.1-70B_vllm_splitwise64_fa3_tp4_pp2.json,H20,H20
EOF
