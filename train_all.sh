#!/usr/bin/env bash
# Rebuild the datasets and retrain every shipped model (mlp_models/, mlp_models_quantile/, collective_models/),
# then regenerate docs/ACCURACY.md. The operator lists come from the registry (python3 -m analytical_model list);
# the training jobs run two at a time, one per CPU core, and each prints its timing.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m dataset.build
rm -rf mlp_models mlp_models_quantile
training_jobs() {
  # GEMM, FP8 GEMM, attention and MoE ship as five-seed ensembles (docs/METHOD.md §5.2: their seeds disagree on GPUs
  # without data)
  for op in $(python3 -m analytical_model list --trainable --keys); do
    if [[ $op == gemm || $op == gemm_fp8 || $op == attn || $op == moe ]]; then echo "train_mlp.py --op $op --ensemble_seeds 42,1,2,3,4 --no_progress"
    else echo "train_mlp.py --op $op --no_progress"; fi
  done
  for op in $(python3 -m analytical_model list --quantile --keys); do
    echo "train_mlp_quantile.py --op $op --topk 100 --no_progress"
  done
  echo "train_collective_rf.py"
}
training_jobs | xargs -P 2 -I{} sh -c '/usr/bin/time -f "{}: %e s" python3 {}'
python3 -m pipeweave.accuracy --retrain_logo
