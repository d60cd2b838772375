#!/usr/bin/env bash
# Rebuild the datasets and retrain every shipped model (mlp_models/, mlp_models_quantile/, collective_models/),
# then regenerate docs/ACCURACY.md. The operator lists come from the registry (python3 -m analytical_model list);
# the training jobs run two at a time, one per CPU core, and each prints its timing. The models are trained into a
# staging folder and replace the shipped ones only when every job has finished: a failed job or a Ctrl-C leaves the
# checkout's models as they were.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m dataset.build
python3 -m pipeweave.bounds --write   # the band's measured floors come from the rebuilt datasets
stage=$(mktemp -d .train_all.XXXXXX)   # relative: the job lines below are split on spaces
trap 'rm -rf "$stage"' EXIT
training_jobs() {
  # GEMM, FP8 GEMM, attention and MoE ship as five-seed ensembles (docs/METHOD.md §5.2: their seeds disagree on GPUs
  # without data)
  for op in $(python3 -m analytical_model list --trainable --keys); do
    if [[ $op == gemm || $op == gemm_fp8 || $op == attn || $op == moe ]]; then
      echo "train_mlp.py --op $op --ensemble_seeds 42,1,2,3,4 --no_progress --output_dir $stage/mlp_models"
    else echo "train_mlp.py --op $op --no_progress --output_dir $stage/mlp_models"; fi
  done
  for op in $(python3 -m analytical_model list --quantile --keys); do
    echo "train_mlp_quantile.py --op $op --topk 100 --no_progress --output_dir $stage/mlp_models_quantile"
  done
  echo "train_collective_rf.py --output_dir $stage/collective_models"
}
# each job exits with its python's status, so that xargs (and set -e) stop the script before the swap
training_jobs | xargs -P 2 -I{} sh -c 'start=$(date +%s); python3 {}; rc=$?; echo "{}: $(( $(date +%s) - start )) s"; exit $rc'
for models in mlp_models mlp_models_quantile collective_models; do
  [[ -d "$stage/$models" ]] || { echo "train_all.sh: $stage/$models was not written; shipped models kept" >&2; exit 1; }
done
for models in mlp_models mlp_models_quantile collective_models; do
  rm -rf "$models" && mv "$stage/$models" "$models"
done
python3 -m pipeweave.accuracy --retrain_logo
# then, as the README says after any model or data change: python3 -m pipeweave.interval_eval --write (~40 min)
