"""The common schema of the measurement loaders (one DataFrame per operator class) and the helpers they share:
cleaning and logging dropped rows, list columns, dtype names, hardware names, parquet reading.

docs/DATA.md, "Common schema and cleaning", says what each rule drops and why.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from analytical_model.hardware import hardware_registry
from analytical_model.registry import get_operator, operator_keys

Log = Callable[[str], None]

PIPEWEAVE_COMMIT = "55e0317"
VIDUR_COMMIT = "7d47513"

OPS = operator_keys(trainable=True)
SHAPE_COLUMNS: dict[str, list[str]] = {op: list(get_operator(op).shape_columns) for op in OPS}
STRING_SHAPE_COLUMNS = {c for op in OPS for c in get_operator(op).text_columns}
INT_COLUMNS = {op: list(get_operator(op).int_columns) for op in OPS}
COLUMNS = {op: [*cols, "hardware", "dtype", "avg_duration", "source"] for op, cols in SHAPE_COLUMNS.items()}
DEFAULT_DTYPE = {op: get_operator(op).dtype for op in OPS}
OP_ALIASES = {"attention": "attn", "silu_and_mul": "siluandmul", "siluandmul": "siluandmul", "fp8_gemm": "gemm_fp8"}

COLLECTIVE_COLUMNS = ["collective", "hardware", "num_workers", "devices_per_node", "size_bytes", "time_ms", "source"]
DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "fp16": "float16", "half": "float16", "float16": "float16", "torch.float16": "float16",
    "fp8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "torch.float8_e4m3fn": "fp8", "e4m3": "fp8",
}


def empty_frame(op: str) -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in INT_COLUMNS[op]})
    for c in SHAPE_COLUMNS[op]:
        if c in STRING_SHAPE_COLUMNS:
            frame[c] = pd.Series(dtype="str")
    frame["hardware"] = pd.Series(dtype="str")
    frame["dtype"] = pd.Series(dtype="str")
    frame["avg_duration"] = pd.Series(dtype="float64")
    frame["source"] = pd.Series(dtype="str")
    return frame[COLUMNS[op]]


def list_string(value: int, count: int) -> str:
    return "[" + ",".join([str(int(value))] * int(count)) + "]"


def uniform_lists(bs: pd.Series, value: pd.Series) -> pd.Series:
    """"[v,v,...]" (bs entries) per row, built once per distinct (bs, v) pair."""
    cache: dict[tuple[int, int], str] = {}
    out = []
    for b, v in zip(bs.to_numpy(), value.to_numpy()):
        key = (int(b), int(v))
        text = cache.get(key)
        if text is None:
            text = cache[key] = list_string(key[1], key[0])
        out.append(text)
    return pd.Series(out, index=bs.index, dtype="str")


def normalise_list_string(text) -> str | None:
    if not isinstance(text, str):
        return None
    return re.sub(r"\s+", "", text)


def parse_list(text: str) -> list[int] | None:
    if not (text.startswith("[") and text.endswith("]")):
        return None
    body = text[1:-1]
    if not body:
        return []
    try:
        return [int(x) for x in body.split(",")]
    except ValueError:
        return None


def normalise_dtype(value, default: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return default
    text = str(value).strip()
    if not text:
        return default
    low = text.lower()
    if low in DTYPE_ALIASES:
        return DTYPE_ALIASES[low]
    if low.startswith("float8") or low.startswith("fp8"):
        return "fp8"
    return low


def finalize(op: str, frame: pd.DataFrame, log: Log, label: str, check_lists: bool = False) -> pd.DataFrame:
    """Validate, drop invalid rows (logged), average repeated keys, cast and sort one op frame."""
    missing = [c for c in COLUMNS[op] if c not in frame.columns]
    if missing:
        raise ValueError(f"{label}: {op} frame lacks columns {missing}")
    if frame.empty:
        return empty_frame(op)
    df = frame[COLUMNS[op]].copy()
    n_in = len(df)
    reasons: dict[str, int] = {}

    def drop(mask, reason: str) -> None:
        nonlocal df
        mask = np.asarray(mask, dtype=bool)
        count = int(mask.sum())
        if count:
            reasons[reason] = reasons.get(reason, 0) + count
            df = df.loc[~mask]

    ints = INT_COLUMNS[op]
    for c in [*ints, "avg_duration"]:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    strings = [c for c in SHAPE_COLUMNS[op] if c in STRING_SHAPE_COLUMNS] + ["hardware", "dtype", "source"]
    na = df[[*ints, "avg_duration"]].isna().any(axis=1).to_numpy().copy()
    for c in strings:
        na |= df[c].isna().to_numpy() | (df[c].astype("str").str.len() == 0).to_numpy()
    drop(na, "missing value")
    lat = df["avg_duration"].to_numpy()
    drop(~np.isfinite(lat) | (lat <= 0), "zero, negative or non-finite latency")
    values = df[ints].to_numpy()
    drop(~np.isfinite(values).all(axis=1) | (values <= 0).any(axis=1), "non-positive shape value")
    values = df[ints].to_numpy()
    drop((values != np.round(values)).any(axis=1), "non-integer shape value")
    for c in ints:
        df[c] = df[c].astype("int64")
    if op == "attn":
        drop((df["nh"] % df["nkv"]).to_numpy() != 0, "nh % nkv != 0")
        if check_lists:
            df["q_lengths"] = df["q_lengths"].map(normalise_list_string)
            df["kv_lengths"] = df["kv_lengths"].map(normalise_list_string)
            bad = []
            for b, q, kv in zip(df["bs"].to_numpy(), df["q_lengths"], df["kv_lengths"]):
                ql, kl = parse_list(q or ""), parse_list(kv or "")
                ok = (ql is not None and kl is not None and len(ql) == b == len(kl)
                      and all(x > 0 for x in ql) and all(k >= x for x, k in zip(ql, kl)))
                bad.append(not ok)
            drop(bad, "q/kv lists malformed, not of length bs, or kv < q")
    for c in strings:
        df[c] = df[c].astype("str")

    key = [*SHAPE_COLUMNS[op], "hardware", "dtype", "source"]
    repeated = int(df.duplicated(key).sum())
    if repeated:
        df = df.groupby(key, sort=False, as_index=False)["avg_duration"].mean()
        reasons["repeated key averaged into its first row"] = repeated
    df = df[COLUMNS[op]].sort_values(["hardware", "source", *SHAPE_COLUMNS[op], "dtype"], kind="mergesort")
    df = df.reset_index(drop=True)
    df["avg_duration"] = df["avg_duration"].astype("float64")
    detail = "; ".join(f"{n} {r}" for r, n in reasons.items()) if reasons else "nothing dropped"
    log(f"[{label}] {op}: {n_in} rows in, {len(df)} kept ({detail})")
    return df


def concat_frames(op: str, frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and not f.empty]
    if not frames:
        return empty_frame(op)
    df = pd.concat(frames, ignore_index=True)
    return df.sort_values(["hardware", "source", *SHAPE_COLUMNS[op], "dtype"], kind="mergesort").reset_index(drop=True)


def wanted_ops(ops) -> tuple[str, ...]:
    if ops is None:
        return OPS
    if isinstance(ops, str):
        ops = [ops]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise ValueError(f"unknown operator classes {unknown}; known: {', '.join(OPS)}")
    return tuple(o for o in OPS if o in ops)


def hardware_name(stem_or_name: str) -> str:
    """The device name of a hardware stem or name; names no hardware JSON knows are returned unchanged."""
    registry = hardware_registry()
    return registry.get(stem_or_name).name if stem_or_name in registry else stem_or_name


def version_key(text: str) -> tuple:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.\-+]", text))


def read_parquet(path: Path, columns: list[str]) -> pd.DataFrame:
    present = set(pq.read_schema(path).names)
    return pq.read_table(path, columns=[c for c in columns if c in present]).to_pandas()


def collective_frame(collective, hardware, num_workers, devices_per_node, size_bytes, time_ms, source) -> pd.DataFrame:
    """A frame in the collective schema (COLLECTIVE_COLUMNS order)."""
    return pd.DataFrame({"collective": collective, "hardware": hardware, "num_workers": num_workers,
                         "devices_per_node": devices_per_node, "size_bytes": size_bytes, "time_ms": time_ms,
                         "source": source})
