#!/usr/bin/env bash
# Reproduce the paper's operator-level evidence on our data: shipped-model metrics in the paper's terms, feature
# ablations (also leave-one-GPU-out), kernel-level baselines -> docs/PAPER.md + figures (pipeweave/paper/).
# Builds the datasets first if they are absent. Flags pass through: --quick (a few minutes), --output PATH, ...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export OMP_NUM_THREADS=1  # one thread: the budget is quoted for one core, and results do not depend on it
for op in gemm gemm_fp8 attn rmsnorm siluandmul moe; do
  if [[ ! -f "dataset/${op}_test.csv" ]]; then python3 -m dataset.build; break; fi
done
python3 -m pipeweave.paper "$@"
