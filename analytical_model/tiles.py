"""Deterministic GEMM tile choice, replacing the artifact's nearest-neighbour lookup (docs/METHOD.md §7.2, §11.3.16).

``choose_gemm_tiles(M, N, K, hw, dtype)`` imitates how cuBLAS/CUTLASS heuristics pick a kernel, using
only the shape and the spec sheet, so training and inference see the same rule and no dataset is
needed at inference time.

Rule, per architecture:

* **FP8** (any GPU): CUTLASS scaled-mm 128×128×128 tiles, one CTA per output tile, no split-K
  (this is exactly what the artifact's FP8 features imply: all 25,228 rows reproduce with it).
* **SM80-class** (Ampere, Ada, RTX Blackwell; mma.sync kernels): candidate CTA tiles
  256×128, 128×256, 128×128, 128×64, 64×128 (tile_k 32), 64×64 (tile_k 64), 32×128, 32×64 and
  16×128, 16×64 (tile_k 128, the skinny decode kernels). Each candidate is costed with a per-CTA
  roofline — time of one CTA = max(MMA work at the SM's tensor rate, operand bytes at the SM's
  share of L2 bandwidth) — times the number of waves ``ceil(CTAs / SMs)``; padding waste is in the
  cost because tiles cover padded extents. Then split-K: when the output has fewer tiles than SMs,
  K is split into s ∈ {1, 2, 3, 4, 6, 8, 12, 16} slices (each slice at least 2 k-tiles), charging each
  extra slice a reduction of the fp32 partial tile through L2, and the cheapest s wins.
  ``cta_count`` = tiles·s and ``is_split_k`` = s > 1.
* **Hopper-style** (Hopper, datacenter Blackwell; TMA + warpgroup MMA): candidate tiles 64/128/256 ×
  64/128/256 with tile_k 64, plus swap-AB skinny tiles 8/16/32 × 64/128/256 for small M (cuBLAS's
  small-M Hopper kernels). Persistent data-parallel regime by default: ``cta_count`` = min(tiles, SMs),
  ``is_split_k`` false. When the output has at most SMs/2 tiles and K ≥ 2048, the split-K regime
  (one wave, cta_count = tiles·s ≤ SMs, is_split_k true) is used if the same cost model says it is
  faster. Ties go to the larger tile (fewer CTAs), then to the order listed.

The rule is a model of a library heuristic, not a reading of one (no public data names the kernels cuBLAS
picked); for FP8 it reproduces the artifact's implied tiles. How it compares with a uniform-tile rule (kernel and
end-to-end accuracy) is measured in the README, "GEMM tiles without a dataset".
"""
from __future__ import annotations

import numpy as np

from .pipes import HardwareSpec, ceil_div, positive_int_array

SM80_TILES = (
    (256, 128, 32),
    (128, 256, 32),
    (128, 128, 32),
    (128, 64, 32),
    (64, 128, 32),
    (64, 64, 64),
    (32, 128, 64),
    (32, 64, 64),
    (16, 128, 128),
    (16, 64, 128),
)
SM90_TILES = tuple((tm, tn, 64) for tm in (256, 128, 64) for tn in (256, 128, 64)) + tuple(
    (tm, tn, 64) for tm in (32, 16, 8) for tn in (256, 128, 64)
)
SPLIT_FACTORS = (1, 2, 3, 4, 6, 8, 12, 16)
FP8_TILE = (128, 128, 128)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1}


def _candidate_grid(candidates) -> np.ndarray:
    """(tile_m, tile_n, tile_k, splits) for every candidate × split factor, in preference order."""
    return np.array([(tm, tn, tk, s) for tm, tn, tk in candidates for s in SPLIT_FACTORS], dtype=np.int64)


ROW_CHUNK = 4096  # rows costed at once: bounds the (rows × candidates) temporaries to a few MB


def _pick(m, n, k, grid: np.ndarray, hw: HardwareSpec, ds: int, sm90: bool) -> np.ndarray:
    """Columns tile_M, tile_N, tile_K, cta_count, is_split_k of the cheapest ``grid`` entry per row."""
    tm, tn, tk, splits = (grid[:, i][None, :] for i in range(4))
    l2_bytes_per_cycle = hw.l2_cache_bandwidth * 1e9 / (hw.sm_freq * 1e6) / hw.num_sms
    out = np.empty(m.shape + (5,), dtype=np.int64)
    for start in range(0, len(m), ROW_CHUNK):
        rows = slice(start, start + ROW_CHUNK)
        mm, nn, kk = m[rows, None], n[rows, None], k[rows, None]
        tiles = ceil_div(mm, tm) * ceil_div(nn, tn)
        k_slice = ceil_div(ceil_div(ceil_div(kk, tk) * tk, splits), tk) * tk
        ctas = tiles * splits
        split = splits > 1
        valid = ~split | ((k_slice >= 2 * tk) & (tiles < hw.num_sms))
        if sm90:
            valid &= ~split | ((2 * tiles <= hw.num_sms) & (kk >= 2048) & (ctas <= hw.num_sms))
        per_cta = np.maximum(2.0 * tm * tn / hw.tc_bf16, ds * (tm + tn) / l2_bytes_per_cycle) * k_slice
        reduction = np.where(split, 8.0 * tm * tn * splits / l2_bytes_per_cycle, 0.0)
        cost = np.where(valid, ceil_div(ctas, hw.num_sms) * per_cta + reduction, np.inf)
        best = np.argmax(cost <= cost.min(axis=1, keepdims=True) * (1 + 1e-9), axis=1)
        pick = np.arange(len(best))
        chosen_tiles = tiles[pick, best]
        chosen_split = splits[0, best]
        cta_count = np.where((chosen_split == 1) & sm90, np.minimum(chosen_tiles, hw.num_sms), ctas[pick, best])
        out[rows] = np.stack([tm[0, best], tn[0, best], tk[0, best], cta_count, chosen_split > 1], axis=-1)
    return out


def _best_tiles(m, n, k, hw: HardwareSpec, candidates, ds: int, sm90: bool) -> np.ndarray:
    """Cheapest candidate per row (see ``_pick``). Cost = waves × per-CTA cycles (max of MMA work at the
    SM's tensor rate and operand bytes at its share of L2 bandwidth) + the fp32 split-K reduction through
    L2; the first candidate in listed order (larger tiles, then fewer splits) within 1e-9 of the minimum wins.

    Rows whose output has at least one tile per SM even with the largest tile can never split K, so
    they are costed on the unsplit candidates only (same choice, a fraction of the work)."""
    grid = _candidate_grid(candidates)
    largest_m, largest_n = grid[:, 0].max(), grid[:, 1].max()
    may_split = ceil_div(m, largest_m) * ceil_div(n, largest_n) < hw.num_sms
    out = np.empty(m.shape + (5,), dtype=np.int64)
    out[may_split] = _pick(m[may_split], n[may_split], k[may_split], grid, hw, ds, sm90)
    unsplit = grid[grid[:, 3] == 1]
    out[~may_split] = _pick(m[~may_split], n[~may_split], k[~may_split], unsplit, hw, ds, sm90)
    return out


def choose_gemm_tiles(M, N, K, hw: HardwareSpec, dtype: str = "bfloat16") -> dict[str, np.ndarray]:
    """Tile sizes, launched CTAs and split-K flag for each (M, N, K); see the module docstring."""
    m = positive_int_array("M", M)
    n = positive_int_array("N", N)
    k = positive_int_array("K", K)
    m, n, k = np.broadcast_arrays(np.atleast_1d(m), np.atleast_1d(n), np.atleast_1d(k))
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if dtype == "fp8":
        tm, tn, tk = FP8_TILE
        ctas = ceil_div(m, tm) * ceil_div(n, tn)
        ones = np.ones_like(m)
        return {
            "tile_M": tm * ones,
            "tile_N": tn * ones,
            "tile_K": tk * ones,
            "cta_count": ctas,
            "is_split_k": np.zeros(m.shape, dtype=bool),
        }
    sm90 = hw.uses_sm90_gemm
    choice = _best_tiles(m, n, k, hw, SM90_TILES if sm90 else SM80_TILES, DTYPE_BYTES[dtype], sm90)
    return {
        "tile_M": choice[..., 0],
        "tile_N": choice[..., 1],
        "tile_K": choice[..., 2],
        "cta_count": choice[..., 3],
        "is_split_k": choice[..., 4].astype(bool),
    }
