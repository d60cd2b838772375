"""Attention feature dispatch (docs/METHOD.md §3.5–§3.9, §4.1).

``attention_type`` strings come from the workloads and datasets ("fa2_paged", "fa2_ragged", "fa3_ragged",
…).  The calculator is chosen by substring: "fa2" → FA2, "fa3" → FA3, "ck" → FA-CK, "cutlass" →
FA-CUTLASS.  The layout is "paged" if the string contains "paged", "ragged" if it contains "ragged"; FA2 and
FA3 types must name one (docs/METHOD.md §3.5), FA-CK and FA-CUTLASS ignore it (default "ragged").
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from . import fa2, fa3, fa_ck, fa_cutlass
from .pipes import AttentionProblem, HardwareSpec

ATTENTION_CALCULATORS: dict[str, Callable[[AttentionProblem, HardwareSpec], np.ndarray]] = {
    "fa2": fa2.features,
    "fa3": fa3.features,
    "ck": fa_ck.features,
    "cutlass": fa_cutlass.features,
}


def resolve_attention_type(attention_type: str) -> tuple[str, str]:
    """(calculator key, layout) of an attention type string; ValueError for unknown types."""
    if not isinstance(attention_type, str):
        raise ValueError(f"attention_type must be a string, got {attention_type!r}")
    kind = attention_type.lower()
    for key in ("fa2", "fa3", "cutlass", "ck"):
        if key in kind:
            break
    else:
        raise ValueError(
            f"unknown attention_type {attention_type!r}; expected one containing fa2, fa3, ck or cutlass"
        )
    if "paged" in kind and "ragged" in kind:
        raise ValueError(f"attention_type {attention_type!r} names both the paged and the ragged layout")
    if key in ("fa2", "fa3") and "paged" not in kind and "ragged" not in kind:
        # FA2 and FA3 depend on the layout (docs/METHOD.md §3.5: else an error); a typo such as "fa2_page" was
        # computed as ragged without a word
        raise ValueError(f"attention_type {attention_type!r} names no layout; expected one containing 'paged' or "
                         f"'ragged' (e.g. {key}_paged, {key}_ragged)")
    return key, "paged" if "paged" in kind else "ragged"


def attention_problem(
    attention_type: str,
    bs: int,
    q_lengths: Sequence[int],
    kv_lengths: Sequence[int],
    nh: int,
    nkv: int,
    hd: int,
    causal: bool = True,
    *,
    data_size_q: int = 2,
    data_size_kv: int = 2,
    data_size_o: int = 2,
) -> tuple[str, AttentionProblem]:
    key, layout = resolve_attention_type(attention_type)
    for name, field, value in (("bs", "batch_size", bs), ("nh", "num_qo_heads", nh),
                               ("nkv", "num_kv_heads", nkv), ("hd", "head_dim", hd)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} ({field}) must be a positive integer, got {getattr(value, 'item', lambda: value)()!r}")
    lengths = {}
    for name, values in (("q_lengths", q_lengths), ("kv_lengths", kv_lengths)):
        try:
            lengths[name] = tuple(values)
        except TypeError:
            raise ValueError(f"{name} must be a list of integers, got {values!r}") from None
    problem = AttentionProblem(
        batch_size=bs,
        q_lengths=lengths["q_lengths"],
        kv_lengths=lengths["kv_lengths"],
        num_qo_heads=nh,
        num_kv_heads=nkv,
        head_dim=hd,
        layout=layout,
        causal=bool(causal),
        data_size_q=data_size_q,
        data_size_kv=data_size_kv,
        data_size_o=data_size_o,
    )
    return key, problem


def attention_features(attention_type: str, bs: int, q_lengths: Sequence[int], kv_lengths: Sequence[int], nh: int,
                       nkv: int, hd: int, hw: HardwareSpec, causal: bool = True, **data_sizes: int) -> np.ndarray:
    """The 15 attention features (float64, docs/METHOD.md §4.1 order) of one kernel launch."""
    key, problem = attention_problem(attention_type, bs, q_lengths, kv_lengths, nh, nkv, hd, causal, **data_sizes)
    return ATTENTION_CALCULATORS[key](problem, hw)
