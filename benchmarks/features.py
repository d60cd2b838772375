"""Feature throughput per operator class (rows/s on this machine, one process).

    python3 -m benchmarks.features [--rows 200000]

GEMM, FP8 GEMM, RMSNorm, SiLU*Mul and MoE are vectorised; attention loops per row (FA2 vectorised
per CTA, FA3 with its min-heap scheduler). GEMM is timed twice: with the tile rule choosing tiles
(the aggregator's path) and with tiles given (the artifact dataset's path).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd

os.environ.setdefault("OMP_NUM_THREADS", "1")

from analytical_model.registry import compute_features  # noqa: E402


def shapes(op: str, rows: int, rng: np.random.Generator) -> pd.DataFrame:
    if op in ("gemm", "gemm_fp8", "gemm (tiles given)"):
        frame = pd.DataFrame({c: rng.integers(1, 16384, rows) for c in "MNK"})
        if op == "gemm (tiles given)":
            frame = frame.assign(tile_M=128, tile_N=128, tile_K=32, is_split_k=0, cta_count=256)
    elif op in ("rmsnorm", "siluandmul"):
        frame = pd.DataFrame({"seq": rng.integers(1, 32768, rows), "dim": 8 * rng.integers(1, 4096, rows)})
    elif op == "moe":
        frame = pd.DataFrame({"weight_type": "layer", "M": rng.integers(1, 8192, rows), "E": 64, "topk": 8,
                              "H": 4096, "N": 1408})
    else:  # attention: half decode (paged), half prefill (ragged)
        frames = []
        for i in range(rows):
            bs = int(rng.integers(1, 64))
            if i % 2:
                kv = rng.integers(16, 8192, bs)
                frames.append(("fa2_paged", bs, [1] * bs, kv.tolist()))
            else:
                q = rng.integers(16, 4096, bs)
                frames.append(("fa3_ragged" if i % 4 == 0 else "fa2_ragged", bs, q.tolist(), q.tolist()))
        frame = pd.DataFrame(frames, columns=["attention_type", "bs", "q_lengths", "kv_lengths"])
        frame = frame.assign(nh=32, nkv=8, hd=128)
    gpus = np.array(["H100", "H20"] if op == "gemm_fp8" else ["H100", "A100"])
    return frame.assign(hardware=gpus[np.arange(len(frame)) % 2])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.features",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--attention_rows", type=int, default=400)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| operator | rows | seconds | rows/s |")
    print("|---|---|---|---|")
    for op in ("gemm", "gemm (tiles given)", "gemm_fp8", "rmsnorm", "siluandmul", "moe", "attn"):
        rows = args.attention_rows if op == "attn" else args.rows
        frame = shapes(op, rows, rng)
        key = "gemm" if op.startswith("gemm (") else op
        compute_features(key, frame.head(10))  # warm caches (hardware registry)
        start = time.perf_counter()
        compute_features(key, frame)
        elapsed = time.perf_counter() - start
        print(f"| {op} | {rows} | {elapsed:.3f} | {rows / elapsed:,.0f} |")


if __name__ == "__main__":
    main()
