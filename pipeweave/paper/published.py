"""The paper's published figures, quoted beside ours in docs/PAPER.md.

Source: PipeWeave, "Synergizing Analytical and Learning Models for Unified GPU Performance Prediction"
(ISCA 2026, arXiv 2601.14910), as stored in its artifact's model metadata and comparison CSVs
(github.com/zksainx/pipeweave @ 55e0317; docs/METHOD.md §10). They were measured on the paper's own
kernel datasets, which are not published: other GPUs, shapes, kernel libraries and row counts than ours.
"""
from __future__ import annotations

CITATION = "PipeWeave (ISCA 2026, arXiv 2601.14910)"
SOURCE = ("figures as stored in the paper's artifact (github.com/zksainx/pipeweave @ 55e0317; "
          "docs/METHOD.md §10), measured on the paper's unpublished kernel datasets")

# Operator-level test metrics on overall_perf (docs/METHOD.md §10.1): MAE, R², mean and median relative error
# (%), share of rows within 10 / 20 / 50 % (%), and the test rows.
_KEYS = ("mae", "r2", "mean_relative_error", "median_relative_error",
         "accuracy_10_percent", "accuracy_20_percent", "accuracy_50_percent", "test_samples")


def _row(*values) -> dict:
    out = dict(zip(_KEYS, values))
    out["mean_relative_error"] /= 100  # stored as a fraction, like our metrics
    out["median_relative_error"] /= 100
    return out


OVERALL = {
    "gemm": _row(0.0341, 0.962, 8.39, 4.12, 75.6, 89.9, 98.2, 118800),
    "attn": _row(0.0335, 0.951, 15.54, 10.12, 49.7, 73.0, 94.6, 32989),
    "rmsnorm": _row(0.0002, 0.975, 6.60, 3.20, 78.3, 94.1, 99.4, 20444),
    "siluandmul": _row(0.0031, 0.968, 8.12, 4.63, 72.4, 91.2, 99.2, 32966),
    "gemm_fp8": _row(0.0145, 0.986, 3.89, 2.04, 92.7, 98.2, 99.6, 8410),
}

# Feature ablations (same data, feature subsets), keyed like pipeweave.paper.experiments.feature_sets.
ABLATION = {
    "gemm": {
        "paper_full": OVERALL["gemm"],
        "no_math": _row(0.0949, 0.708, 22.92, 10.21, 49.6, 61.3, 87.4, 118800),
        "no_mio": _row(0.1065, 0.650, 26.58, 12.72, 46.2, 58.0, 88.0, 118800),
    },
    "attn": {
        "paper_full": OVERALL["attn"],
        "no_math": _row(0.0770, 0.710, 28.70, 17.89, 35.5, 53.5, 77.7, 32989),
        "no_mio": _row(0.0415, 0.918, 17.78, 11.53, 46.0, 69.1, 92.3, 32989),
    },
}

# Per-GPU test results of the paper's latest models, for the GPUs we also have: (mean relative error %,
# % within 10 %, % within 20 %, rows, GPU unseen in the paper's training).
_GPU = ("NVIDIA A100-SXM4-80GB", "NVIDIA A40", "NVIDIA H20", "NVIDIA H800", "NVIDIA H100", "NVIDIA H200",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition")
_UNSEEN = {"NVIDIA H100", "NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Server Edition"}


def _per_gpu(cells, unseen=_UNSEEN) -> dict:
    return {gpu: {"mean_relative_error": c[0] / 100, "accuracy_10_percent": c[1], "accuracy_20_percent": c[2],
                  "test_samples": c[3], "unseen": gpu in unseen}
            for gpu, c in zip(_GPU, cells) if c is not None}


BY_GPU = {
    "gemm": _per_gpu([(5.6, 84, 97, 10800), (6.4, 84, 93, 10800), (3.1, 93, 98, 10800), (6.1, 83, 95, 10800),
                      (7.0, 78, 93, 10800), (8.9, 74, 89, 10800), (23.4, 44, 65, 10800)]),
    "attn": _per_gpu([(12.9, 53, 79, 2999), (11.8, 69, 84, 2999), (10.2, 69, 82, 2999), (18.0, 40, 62, 2999),
                      (16.2, 43, 73, 2999), (17.5, 33, 69, 2999), (14.9, 51, 72, 2999)]),
    "rmsnorm": _per_gpu([(4.3, 90, 96, 1859), (3.2, 92, 99, 1859), (3.9, 95, 99, 1859), (2.3, 98, 100, 1859),
                         (2.3, 98, 100, 1858), (12.3, 38, 92, 1858), (18.4, 54, 64, 1858)]),
    "siluandmul": _per_gpu([(4.5, 88, 97, 3021), (4.0, 92, 99, 2968), (6.1, 83, 96, 3021), (4.4, 93, 98, 3021),
                            (4.6, 93, 98, 3021), (11.4, 57, 86, 3021), (18.3, 43, 61, 3021)]),
    "gemm_fp8": _per_gpu([None, None, (1.9, 98, 99, 2103), (4.1, 92, 98, 2103), (4.2, 91, 98, 2102),
                          (5.2, 90, 98, 2102), None]),
}

# End-to-end static-batch comparison (docs/METHOD.md §10.2): mean over 40 rows of the per-row error, %
# (prefill, decode per step, total, mean of the three). The roofline's decode is a schema artifact.
E2E = {
    "PipeWeave": (8.20, 13.36, 8.17, 9.91),
    "NeuSight": (52.32, 21.62, 30.58, 34.84),
    "Habitat": (83.29, 16.14, 58.66, 52.69),
    "Linear": (56.25, 70.49, 48.24, 58.33),
    "Roofline": (48.71, 100.00, 44.01, 64.24),
}
E2E_ROWS = 40

# Our own earlier claim (README "Differences from the reference"): duration error on held-out shapes with
# and without the shape descriptors, 8,000 training rows per GPU, 100 epochs.
README_DESCRIPTOR_CLAIM = {"gemm": (10.0, 7.0), "attn": (15.7, 6.6)}

# vLLM TP4×PP2 end to end (docs/METHOD.md §10.2): mean error of the total latency over 4 runs (H20, H800), %.
E2E_VLLM = {"PipeWeave": 3.95, "NeuSight": 15.06, "Habitat": 43.69, "Roofline": 54.24, "Linear": 59.44}
E2E_VLLM_ROWS = 4
