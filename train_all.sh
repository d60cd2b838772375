#!/usr/bin/env bash
# Rebuild the datasets and retrain every shipped model (mlp_models/, mlp_models_quantile/, collective_models/),
# then regenerate docs/ACCURACY.md. Two chains run in parallel, one per CPU core; each prints its timings.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m dataset.build
rm -rf mlp_models mlp_models_quantile
chain_a() {
  for op in gemm rmsnorm siluandmul moe; do /usr/bin/time -f "train_mlp $op: %e s" python3 train_mlp.py --op "$op" --no_progress; done
  for op in gemm moe; do /usr/bin/time -f "train_mlp_quantile $op: %e s" python3 train_mlp_quantile.py --op "$op" --topk 100 --no_progress; done
}
chain_b() {
  for op in attn gemm_fp8; do /usr/bin/time -f "train_mlp $op: %e s" python3 train_mlp.py --op "$op" --no_progress; done
  for op in attn gemm_fp8; do /usr/bin/time -f "train_mlp_quantile $op: %e s" python3 train_mlp_quantile.py --op "$op" --topk 100 --no_progress; done
  /usr/bin/time -f "train_collective_rf: %e s" python3 train_collective_rf.py
}
chain_a & a=$!
chain_b & b=$!
wait "$a" "$b"
python3 -m pipeweave.accuracy --retrain_logo
