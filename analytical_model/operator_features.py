"""Feature and descriptor functions of the registered operator classes (one pair per operator family).

``compute(operator, columns, hw)`` maps the shape columns of the rows (a column mapping, see
:mod:`analytical_model.columns`) to the calculator's input problem and calls the calculator the operator
registers (``operator.calculator(name)``); ``describe(columns, hw)`` gives the shape descriptors.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import descriptors, fa2, fa2_batch, siluandmul
from .attention import attention_problem, resolve_attention_type
from .columns import Columns, bool_column, column_values, int_column, length_lists, present, take
from .pipes import ElementwiseProblem, GemmProblem, HardwareSpec, MoeProblem
from .tiles import choose_gemm_tiles

TILE_COLUMNS = ("tile_M", "tile_N", "tile_K", "is_split_k", "cta_count")
MOE_WEIGHT_TYPES = ("w13", "w2", "layer")



def gemm_problem(columns: Columns, hw: HardwareSpec, dtype: str = "bfloat16") -> GemmProblem:
    """GEMM problems for the rows: tile columns where given, the tile rule elsewhere."""
    m, n, k = (int_column(columns, c) for c in ("M", "N", "K"))
    given = np.zeros(len(m), dtype=bool)
    named = [c for c in TILE_COLUMNS if c in columns]
    if named:  # a tile is all five together: part of one would otherwise be dropped for the tile rule's
        missing = [c for c in TILE_COLUMNS if c not in columns]
        if missing:
            raise ValueError(f"tile column(s) {', '.join(named)} without {', '.join(missing)}: the tile columns "
                             f"override the tile rule together (give all of {', '.join(TILE_COLUMNS)}, or none)")
        cells = np.array([present(columns, c) for c in TILE_COLUMNS])
        given = cells.all(axis=0)
        partial = np.flatnonzero(cells.any(axis=0) & ~given)
        if partial.size:
            row = cells[:, partial[0]]
            raise ValueError(f"the GEMM M={m[partial[0]]}, N={n[partial[0]]}, K={k[partial[0]]} has "
                             f"{', '.join(c for c, p in zip(TILE_COLUMNS, row) if p)} but not "
                             f"{', '.join(c for c, p in zip(TILE_COLUMNS, row) if not p)}: a row overrides the tile "
                             f"rule with all five tile columns, or leaves them all empty")
    tiles = {}
    if given.any():
        given_rows = take(columns, TILE_COLUMNS, given)
        tiles = {c: int_column(given_rows, c) for c in TILE_COLUMNS if c != "is_split_k"}
        tiles["is_split_k"] = bool_column(given_rows, "is_split_k")
    if not given.all():
        chosen = choose_gemm_tiles(m[~given], n[~given], k[~given], hw, dtype)
        if given.any():
            for column in TILE_COLUMNS:
                merged = np.empty(len(m), dtype=chosen[column].dtype)
                merged[given], merged[~given] = tiles[column], chosen[column]
                tiles[column] = merged
        else:
            tiles = chosen
    return GemmProblem.create(
        m, n, k, tiles["tile_M"], tiles["tile_N"], tiles["tile_K"], tiles["cta_count"], tiles["is_split_k"],
        data_size_bytes=1 if dtype == "fp8" else 2,
    )


def gemm(operator, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    calculator = operator.calculator("sm90" if hw.uses_sm90_gemm else "sm80")
    return calculator(gemm_problem(columns, hw), hw)


def gemm_fp8_features(operator, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    """Always the FP8 rule's 128x128x128 tiles (docs/METHOD.md §3.4): the tile columns override BF16 GEMM's rule only,
    as the predictor reads them (an input's tile columns gave ``features --op gemm_fp8`` other features than
    ``predict_kernels.py`` predicts from, unchecked)."""
    shape = {column: columns[column] for column in operator.shape_columns}
    return operator.calculator("fp8")(gemm_problem(shape, hw, dtype=operator.dtype), hw)


def _attention_arrays(columns: Columns, label: Callable[[int], str] | None = None):
    """(kinds, bs, q lists, kv lists, nh, nkv, hd) of attention rows, validated as AttentionProblem would; an error
    names its row by ``label(position)`` where given."""
    bs, nh, nkv, hd = (int_column(columns, c) for c in ("bs", "nh", "nkv", "hd"))
    raw_kinds = column_values(columns, "attention_type")
    kinds = [str(v) for v in raw_kinds]
    if label is not None:  # an unknown type was refused later, where the row's position is no longer known
        for i, (raw, kind) in enumerate(zip(raw_kinds, kinds)):
            if raw is None or raw != raw or not kind.strip():
                raise ValueError(f"{label(i)}: the attention_type cell is empty (e.g. fa2_ragged, fa2_paged)")
            try:
                resolve_attention_type(kind)
            except ValueError as exc:
                raise ValueError(f"{label(i)}: {exc}") from None
    q, kv = length_lists(columns, "q_lengths"), length_lists(columns, "kv_lengths")
    q_count = np.fromiter(map(len, q), dtype=np.int64, count=len(q))
    kv_count = np.fromiter(map(len, kv), dtype=np.int64, count=len(kv))
    ok = (bs > 0) & (nh > 0) & (nkv > 0) & (hd > 0) & (q_count == bs) & (kv_count == bs)
    if ok.all():
        ok = (nh % nkv == 0)
        row, q_flat, kv_flat = descriptors.per_request(q, kv)
        bad_request = (q_flat <= 0) | (q_flat > kv_flat)
        ok &= np.bincount(row[bad_request], minlength=len(bs)) == 0
    for i in np.flatnonzero(~ok):  # the per-row constructor raises the precise error
        try:
            attention_problem(kinds[i], int(bs[i]), q[i], kv[i], int(nh[i]), int(nkv[i]), int(hd[i]))
        except ValueError as exc:
            if label is None:
                raise
            raise ValueError(f"{label(int(i))}: {exc}") from None
    return kinds, bs, q, kv, nh, nkv, hd


def check_rows(key: str, columns: Columns, label: Callable[[int], str]) -> None:
    """The checks of a row's whole shape that the operator's calculator makes (attention: one q and kv length per
    request, q <= kv, nh divisible by nkv; fused MoE: the weight type, topk <= E), before any feature is computed,
    each error naming its row by ``label(position)``: the predictor computes features per GPU, where a row's
    position in its group is not its position in the input."""
    if key == "attn":
        _attention_arrays(columns, label)
    elif key in ("gemm", "gemm_fp8") and "is_split_k" in columns:  # empty cells: the tile rule chooses
        values = column_values(columns, "is_split_k")
        given = np.flatnonzero(present(columns, "is_split_k") & (np.char.strip(values.astype(str)) != ""))
        bool_column({"is_split_k": values[given]}, "is_split_k",
                    lambda position: label(int(given[position])))
    elif key == "siluandmul":
        dim = int_column(columns, "dim")
        small = np.flatnonzero(dim < siluandmul.VEC)
        if small.size:
            row = int(small[0])
            raise ValueError(f"{label(row)}: dim = {dim[row]} is below {siluandmul.VEC}, the values SiLU*Mul's "
                             f"kernel reads at a time")
    elif key == "moe":
        _moe_kinds(columns, label)
        experts, topk = int_column(columns, "E"), int_column(columns, "topk")
        over = np.flatnonzero(topk > experts)
        if over.size:
            row = int(over[0])
            raise ValueError(f"{label(row)}: topk = {topk[row]} exceeds E = {experts[row]} (each token goes to topk "
                             f"of the E experts)")


def attention(operator, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    """FA2 rows in one vectorised pass (fa2_batch, bit-identical to the per-launch calculator), others per row."""
    kinds, bs, q, kv, nh, nkv, hd = _attention_arrays(columns)
    resolved = {kind: resolve_attention_type(kind) for kind in set(kinds)}
    out = np.zeros((len(kinds), len(operator.feature_names)))
    fa2_rows = np.array([resolved[kind][0] == "fa2" for kind in kinds], dtype=bool)
    if fa2_rows.any():
        sel = np.flatnonzero(fa2_rows)
        _, q_flat, kv_flat = descriptors.per_request([q[i] for i in sel], [kv[i] for i in sel])
        paged = np.array([resolved[kinds[i]][1] == "paged" for i in sel], dtype=bool)
        out[sel] = fa2_batch.features_from_arrays(bs[sel], q_flat, kv_flat, nh[sel], nkv[sel], hd[sel], paged, hw)
    for i in np.flatnonzero(~fa2_rows):
        key, problem = attention_problem(kinds[i], int(bs[i]), q[i], kv[i], int(nh[i]), int(nkv[i]), int(hd[i]))
        out[i] = operator.calculator(key)(problem, hw)
    return out


def describe_gemm(operand_bytes: int, fp8: bool):
    def describe(columns: Columns, hw: HardwareSpec) -> np.ndarray:
        m, n, k = (int_column(columns, c) for c in ("M", "N", "K"))
        return descriptors.gemm(m, n, k, hw, operand_bytes, hw.tc_fp8 if fp8 else hw.tc_bf16)

    return describe


def describe_attention(columns: Columns, hw: HardwareSpec) -> np.ndarray:
    """The problem's descriptors, the auxiliary kernels of the FA2 rows' launch (fa2.varlen_auxiliary_launches;
    0 for the other calculators), then the query tiles' latency (descriptors.attention_tile_latency_cycles)."""
    kinds, bs, q, kv, nh, nkv, hd = _attention_arrays(columns)
    calculator = {kind: resolve_attention_type(kind)[0] for kind in set(kinds)}
    fa2_rows = np.array([calculator[kind] == "fa2" for kind in kinds], dtype=bool)
    max_q = np.fromiter(map(max, q), dtype=np.int64, count=len(q))
    max_kv = np.fromiter(map(max, kv), dtype=np.int64, count=len(kv))
    launches = fa2.varlen_auxiliary_launches(bs, max_q, max_kv, nh, nkv, hd, hw) * fa2_rows[:, None]
    rows, q_flat, kv_flat = descriptors.per_request(q, kv)
    latency = descriptors.attention_tile_latency_cycles(rows, q_flat, nh, nkv, hw)
    return np.concatenate([descriptors.attention(bs, rows, q_flat, kv_flat, nh, nkv, hd, hw), launches,
                           latency[:, None]], axis=1)


def describe_elementwise(output_fraction: float):
    def describe(columns: Columns, hw: HardwareSpec) -> np.ndarray:
        return descriptors.elementwise(int_column(columns, "seq"), int_column(columns, "dim"), hw, output_fraction)

    return describe


def _moe_kinds(columns: Columns, label: Callable[[int], str] | None = None) -> np.ndarray:
    kinds = column_values(columns, "weight_type").astype(str)
    unknown = np.flatnonzero(~np.isin(kinds, MOE_WEIGHT_TYPES))
    if unknown.size:
        where = "" if label is None else f"{label(int(unknown[0]))}: "
        raise ValueError(f"{where}weight_type must be one of {', '.join(MOE_WEIGHT_TYPES)}, got {str(kinds[unknown[0]])!r}")
    return kinds


def _moe_passes(columns: Columns) -> np.ndarray:
    """Per row, how many times each of (w13, w2) runs: a pass once, a layer both."""
    kinds = _moe_kinds(columns)
    return np.stack([(kinds == "w13") | (kinds == "layer"), (kinds == "w2") | (kinds == "layer")],
                    axis=-1).astype(float)


def describe_moe(columns: Columns, hw: HardwareSpec) -> np.ndarray:
    return descriptors.moe(*(int_column(columns, c) for c in ("M", "E", "topk", "H", "N")), hw, _moe_passes(columns))


def gemm_cold_bytes(operand_bytes: int):
    def cold_bytes(columns: Columns) -> np.ndarray:
        return descriptors.gemm_weight_bytes(int_column(columns, "N"), int_column(columns, "K"), operand_bytes)

    return cold_bytes


def attention_cold_bytes(columns: Columns) -> np.ndarray:
    return descriptors.attention_cached_kv_bytes(length_lists(columns, "q_lengths"), length_lists(columns, "kv_lengths"),
                                                 int_column(columns, "nkv"), int_column(columns, "hd"))


def moe_cold_bytes(columns: Columns) -> np.ndarray:
    return descriptors.moe_expert_weight_bytes(*(int_column(columns, c) for c in ("M", "E", "topk", "H", "N")),
                                               _moe_passes(columns))


def elementwise(operator, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    problem = ElementwiseProblem.create(int_column(columns, "seq"), int_column(columns, "dim"))
    return operator.calculator(operator.key)(problem, hw)


def moe(operator, columns: Columns, hw: HardwareSpec) -> np.ndarray:
    """``weight_type`` w13 / w2 is one pass; ``layer`` (a whole MoE layer) is the sum of both passes."""
    dims = [int_column(columns, c) for c in ("M", "E", "topk", "H", "N")]
    kinds = _moe_kinds(columns)
    out = np.zeros((len(kinds), len(operator.feature_names)))
    for pass_type in ("w13", "w2"):
        rows = (kinds == pass_type) | (kinds == "layer")
        if rows.any():
            problem = MoeProblem.create(*(d[rows] for d in dims), pass_type=pass_type)
            out[rows] += operator.calculator("triton_moe")(problem, hw)
    return out
