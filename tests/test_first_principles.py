"""First-principles sanity checks of shipped-model predictions (no measurement needed to know the direction).

FP8 against BF16 on Hopper: an FP8 GEMM does the same work at twice the tensor-core rate and reads half the
weight bytes, so the Llama-3.1-70B TP4 projections must be faster in FP8, by at most ~2x: in the compute-bound
prefill (16 x 2197 tokens) and in the memory-bound decode step (16 tokens).
"""
from __future__ import annotations

import pandas as pd
import pytest

from pipeweave.workload import RankShapes, load_model_config

LLAMA_70B_TP4 = RankShapes.of(load_model_config("Llama-3.1-70B"), 4)
HIDDEN = 8192
#: (N, K) of qkv_proj, o_proj, gate_up_proj and down_proj on one TP4 rank
PROJECTIONS = ((LLAMA_70B_TP4.qkv_n, HIDDEN), (HIDDEN, LLAMA_70B_TP4.o_k), (LLAMA_70B_TP4.gate_up_n, HIDDEN),
               (HIDDEN, LLAMA_70B_TP4.down_k))


@pytest.fixture(scope="module")
def predictor():
    from pipeweave.predictor import KernelPredictor

    return KernelPredictor()


def _layer_us(predictor, op: str, tokens: int, gpu: str) -> float:
    frame = pd.DataFrame([{"M": tokens, "N": n, "K": k, "hardware": gpu} for n, k in PROJECTIONS])
    return float(predictor.predict_frame(op, frame)["predicted_us"].sum())


@pytest.mark.parametrize("gpu, tokens", [
    ("H100", 16 * 2197), ("H200", 16 * 2197), ("H800", 16 * 2197), ("H20", 16 * 2197),
    ("H100", 16), ("H200", 16), ("H800", 16),
    pytest.param("H20", 16, marks=pytest.mark.xfail(
        strict=True, reason="known defect: H20 has FP8 but no BF16 GEMM measurements, and its measured decode-sized "
                            "FP8 GEMMs (PipeWeave's kernels) reach only ~13 % of spec DRAM bandwidth, so they are "
                            "predicted slower than BF16, which the model transfers from other GPUs")),
])
def test_fp8_linear_layers_are_faster_than_bf16_by_at_most_2x(predictor, gpu, tokens):
    ratio = _layer_us(predictor, "gemm", tokens, gpu) / _layer_us(predictor, "gemm_fp8", tokens, gpu)
    assert 1.1 < ratio < 2.1
