"""Real kernel and collective measurements, read in place and returned in one common schema.

Sources: A the PipeWeave artifact (FP8 GEMM CSVs, collective sweeps), B Vidur (FP16 per-layer operator times,
network sweeps), C aiconfigurator-core 0.12.0 (vLLM tables of the installed package, located, never imported),
and the project's own ``dataset/measured/<gpu>/*.csv``. Nothing is copied into the repository.

Every loader returns one DataFrame per operator class with the registry's shape columns plus ``hardware`` (the
device name as in the data), ``dtype``, ``avg_duration`` [µs] and ``source``; rows are cleaned (each drop logged
with its count and reason), repeated keys averaged and sorted stably by (hardware, source, shape, dtype).
Collectives come from :func:`load_collectives` in their own schema.

docs/DATA.md says, per source, what is read, how each measurement becomes an operator shape and why (kernel
choices, units, the decode labelling, MoE widths, Vidur's layer mapping) and which oddities are kept.
"""
from __future__ import annotations

import importlib.util
import re
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from analytical_model.registry import get_operator, operator_keys
from pipeweave.paths import DEFAULT_MEASURED_DIR, REPO_ROOT, existing_shared_data_dir

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

# --- aiconfigurator ---------------------------------------------------------------------------------------------
AIC_FRAMEWORK = "vllm"
AIC_DEFAULT_VERSIONS = {"default": "0.24.0", "a100_sxm": "0.14.0"}  # used only if query_versions.yaml is unreadable
AIC_FALLBACK_SYSTEMS = ("a100_sxm", "b200_sxm", "h100_sxm", "h200_sxm", "l40s", "rtx_pro_6000_server")
# kernel_source -> (attention_type of context rows, attention_type of generation rows)
AIC_ATTENTION_KERNELS: dict[str, tuple[str, str]] = {
    "vllm_flash_attn": ("fa2_ragged", "fa2_paged"),  # a100_sxm, vLLM 0.14: vllm-flash-attn FA2 (Ampere)
    "vllm_flash_attn_fa2": ("fa2_ragged", "fa2_paged"),  # l40s, rtx_pro_6000_server
    "vllm_flash_attn_fa3": ("fa3_ragged", "fa2_paged"),  # h100_sxm, h200_sxm; decode labelled as the workloads do
}
AIC_GEMM_FP8_KERNELS = ("CutlassFP8ScaledMMLinearKernel",)
AIC_MOE_KERNELS = ("vllm_unquantizedfusedmoe_triton_tritonexperts", "vllm_fused_moe")
AIC_MOE_DISTRIBUTIONS = ("balanced",)
AIC_CUSTOM_ALLREDUCE_BACKEND = "vllm_graph"
AIC_ELEMENT_BYTES = {"half": 2, "bfloat16": 2, "float16": 2, "int8": 1, "float": 4, "float32": 4}

# --- Vidur ------------------------------------------------------------------------------------------------------
VIDUR_GPUS = {"a100": "NVIDIA A100-SXM4-80GB", "a40": "NVIDIA A40", "h100": "NVIDIA H100"}
# model folder -> (norm, activation), from Vidur's model configs
VIDUR_MODEL_NORM_ACT = {
    "Llama-2-7b-hf": ("rms_norm", "silu"),
    "Llama-2-70b-hf": ("rms_norm", "silu"),
    "Meta-Llama-3-8B": ("rms_norm", "silu"),
    "Meta-Llama-3-70B": ("rms_norm", "silu"),
    "CodeLlama-34b-Instruct-hf": ("rms_norm", "silu"),
    "Qwen-72B": ("rms_norm", "silu"),
    "internlm-20b": ("rms_norm", "silu"),
    "phi-2": ("layer_norm", "gelu"),
}
VIDUR_STATISTIC = "median"
# network node -> device name; nodes whose GPUs we do not model are listed with None (and skipped)
VIDUR_NETWORK_NODES = {
    "a100_dgx": "NVIDIA A100-SXM4-80GB",  # DGX A100, 8x A100 SXM4 80 GB, NVSwitch
    "h100_dgx": "NVIDIA H100",  # DGX H100, 8x H100 SXM5, NVSwitch
    "a40_pairwise_nvlink": "NVIDIA A40",  # 8x A40 with pairwise NVLink bridges (send_recv only)
    "a100_pairwise_nvlink": None,  # A100 80GB PCIe: a different product from our A100 SXM4
    "h100_pairwise_nvlink": None,  # H100 NVL: a different product from our H100 SXM5
}
PIPEWEAVE_COLLECTIVE_HARDWARE = {  # fallback when the hardware registry cannot be imported
    "A100": "NVIDIA A100-SXM4-80GB", "H100": "NVIDIA H100", "H20": "NVIDIA H20", "H800": "NVIDIA H800",
    "RTX 6000 Ada": "NVIDIA RTX 6000 Ada Generation", "RTX PRO 6000 S": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}

_DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "fp16": "float16", "half": "float16", "float16": "float16", "torch.float16": "float16",
    "fp8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "torch.float8_e4m3fn": "fp8", "e4m3": "fp8",
}


# ================================================================================================================
# locations
# ================================================================================================================

def aiconfigurator_data_dir() -> Path | None:
    """``systems/data`` of the installed aiconfigurator-core package (found without importing it); None if absent."""
    try:
        spec = importlib.util.find_spec("aiconfigurator_core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"
    return path if path.is_dir() else None


def aiconfigurator_version() -> str:
    try:
        return metadata.version("aiconfigurator-core")
    except metadata.PackageNotFoundError:
        return "unknown"


# ================================================================================================================
# shared helpers
# ================================================================================================================

def _empty(op: str) -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in INT_COLUMNS[op]})
    for c in SHAPE_COLUMNS[op]:
        if c in STRING_SHAPE_COLUMNS:
            frame[c] = pd.Series(dtype="str")
    frame["hardware"] = pd.Series(dtype="str")
    frame["dtype"] = pd.Series(dtype="str")
    frame["avg_duration"] = pd.Series(dtype="float64")
    frame["source"] = pd.Series(dtype="str")
    return frame[COLUMNS[op]]


def _list_string(value: int, count: int) -> str:
    return "[" + ",".join([str(int(value))] * int(count)) + "]"


def _uniform_lists(bs: pd.Series, value: pd.Series) -> pd.Series:
    """"[v,v,...]" (bs entries) per row, built once per distinct (bs, v) pair."""
    cache: dict[tuple[int, int], str] = {}
    out = []
    for b, v in zip(bs.to_numpy(), value.to_numpy()):
        key = (int(b), int(v))
        text = cache.get(key)
        if text is None:
            text = cache[key] = _list_string(key[1], key[0])
        out.append(text)
    return pd.Series(out, index=bs.index, dtype="str")


def _normalise_list_string(text) -> str | None:
    if not isinstance(text, str):
        return None
    return re.sub(r"\s+", "", text)


def _parse_list(text: str) -> list[int] | None:
    if not (text.startswith("[") and text.endswith("]")):
        return None
    body = text[1:-1]
    if not body:
        return []
    try:
        return [int(x) for x in body.split(",")]
    except ValueError:
        return None


def _normalise_dtype(value, default: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return default
    text = str(value).strip()
    if not text:
        return default
    low = text.lower()
    if low in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[low]
    if low.startswith("float8") or low.startswith("fp8"):
        return "fp8"
    return low


def _finalize(op: str, frame: pd.DataFrame, log: Log, label: str, check_lists: bool = False) -> pd.DataFrame:
    """Validate, drop invalid rows (logged), average repeated keys, cast and sort one op frame."""
    missing = [c for c in COLUMNS[op] if c not in frame.columns]
    if missing:
        raise ValueError(f"{label}: {op} frame lacks columns {missing}")
    if frame.empty:
        return _empty(op)
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
            df["q_lengths"] = df["q_lengths"].map(_normalise_list_string)
            df["kv_lengths"] = df["kv_lengths"].map(_normalise_list_string)
            bad = []
            for b, q, kv in zip(df["bs"].to_numpy(), df["q_lengths"], df["kv_lengths"]):
                ql, kl = _parse_list(q or ""), _parse_list(kv or "")
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


def _concat(op: str, frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and not f.empty]
    if not frames:
        return _empty(op)
    df = pd.concat(frames, ignore_index=True)
    return df.sort_values(["hardware", "source", *SHAPE_COLUMNS[op], "dtype"], kind="mergesort").reset_index(drop=True)


def _wanted(ops) -> tuple[str, ...]:
    if ops is None:
        return OPS
    if isinstance(ops, str):
        ops = [ops]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise ValueError(f"unknown operator classes {unknown}; known: {', '.join(OPS)}")
    return tuple(o for o in OPS if o in ops)


def _registry():
    try:
        from analytical_model.hardware import hardware_registry
        return hardware_registry()
    except Exception:  # noqa: BLE001 - the loaders must work without the analytical package
        return None


def _hardware_name(stem_or_name: str, fallback: dict[str, str] | None = None) -> str:
    registry = _registry()
    if registry is not None and stem_or_name in registry:
        return registry.get(stem_or_name).name
    if fallback and stem_or_name in fallback:
        return fallback[stem_or_name]
    return stem_or_name


def _version_key(text: str) -> tuple:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.\-+]", text))


def _read_parquet(path: Path, columns: list[str]) -> pd.DataFrame:
    present = set(pq.read_schema(path).names)
    return pq.read_table(path, columns=[c for c in columns if c in present]).to_pandas()


# ================================================================================================================
# aiconfigurator
# ================================================================================================================

def _aic_query_versions(root: Path) -> dict[str, str]:
    """{system or "default": vllm version} from systems/query_versions.yaml (hard-coded defaults if unreadable)."""
    path = root.parent / "query_versions.yaml"
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
        out = {"default": str(data["defaults"][AIC_FRAMEWORK]["current"])}
        for system, frameworks in (data.get("overrides") or {}).items():
            if AIC_FRAMEWORK in (frameworks or {}):
                out[system] = str(frameworks[AIC_FRAMEWORK]["current"])
        return out
    except Exception:  # noqa: BLE001
        return dict(AIC_DEFAULT_VERSIONS)


def aiconfigurator_systems() -> tuple[str, ...]:
    """aiconfigurator systems that some hardware JSON maps to (``aiconfiguratorSystem``)."""
    registry = _registry()
    if registry is None:
        return AIC_FALLBACK_SYSTEMS
    return tuple(sorted({s.aiconfigurator_system for s in registry.specs.values() if s.aiconfigurator_system}))


def _aic_table(root: Path, system: str, family: str, framework: str, table: str, preferred: str | None,
               log: Log) -> Path | None:
    base = root / system / family / framework
    if preferred and (base / preferred / f"{table}.parquet").is_file():
        return base / preferred / f"{table}.parquet"
    if not base.is_dir():
        return None
    versions = sorted((p.name for p in base.iterdir() if (p / f"{table}.parquet").is_file()), key=_version_key)
    if not versions:
        return None
    log(f"[aiconfigurator] {system}: {family}/{framework}/{preferred} has no {table}; using newest {versions[-1]}")
    return base / versions[-1] / f"{table}.parquet"


def _aic_source(root: Path, path: Path) -> str:
    return f"aiconfigurator-core {aiconfigurator_version()} {path.relative_to(root).as_posix()}"


def _log_kept(log: Log, label: str, op: str, total: int, reasons: dict[str, int]) -> None:
    detail = "; ".join(f"{n} {r}" for r, n in reasons.items() if n)
    if detail:
        log(f"[{label}] {op}: of {total} rows, filtered out {detail}")


def _filter(df: pd.DataFrame, mask, reason: str, reasons: dict[str, int]) -> pd.DataFrame:
    mask = np.asarray(mask, dtype=bool)
    reasons[reason] = reasons.get(reason, 0) + int((~mask).sum())
    return df.loc[mask]


def _aic_gemm(root: Path, system: str, version: str, ops: tuple[str, ...], log: Log) -> dict[str, pd.DataFrame]:
    path = _aic_table(root, system, "gemm", AIC_FRAMEWORK, "gemm_perf", version, log)
    if path is None:
        return {}
    raw = _read_parquet(path, ["device", "kernel_source", "gemm_dtype", "m", "n", "k", "latency"])
    source, label = _aic_source(root, path), f"aiconfigurator {system}"
    out = {}
    for op, dtype in (("gemm", "bfloat16"), ("gemm_fp8", "fp8")):
        if op not in ops:
            continue
        reasons: dict[str, int] = {}
        df = _filter(raw, raw["gemm_dtype"] == dtype, "other gemm_dtype", reasons)
        if op == "gemm_fp8":
            df = _filter(df, df["kernel_source"].isin(AIC_GEMM_FP8_KERNELS), "other fp8 kernel", reasons)
        _log_kept(log, label, op, len(raw), reasons)
        if df.empty:
            continue
        frame = pd.DataFrame({"M": df["m"], "N": df["n"], "K": df["k"], "hardware": df["device"], "dtype": dtype,
                              "avg_duration": df["latency"] * 1000.0, "source": source})
        out[op] = _finalize(op, frame, log, label)
    return out


def _aic_attention(root: Path, system: str, version: str, log: Log) -> pd.DataFrame | None:
    frames = []
    label = f"aiconfigurator {system}"
    for phase, table in ((0, "context_attention_perf"), (1, "generation_attention_perf")):
        path = _aic_table(root, system, "attention", AIC_FRAMEWORK, table, version, log)
        if path is None:
            continue
        raw = _read_parquet(path, ["device", "kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads",
                                   "head_dim", "beam_width", "attn_dtype", "kv_cache_dtype", "step", "window_size",
                                   "latency"])
        reasons: dict[str, int] = {}
        df = _filter(raw, raw["kernel_source"].isin(list(AIC_ATTENTION_KERNELS)),
                     "kernel not FA2/FA3 (" + ",".join(sorted(set(raw["kernel_source"]) - set(AIC_ATTENTION_KERNELS)))
                     + ")", reasons)
        df = _filter(df, df["attn_dtype"] == "bfloat16", "attn_dtype not bfloat16", reasons)
        df = _filter(df, df["kv_cache_dtype"] == "bfloat16", "fp8 KV cache", reasons)
        if "window_size" in df.columns:
            df = _filter(df, df["window_size"].fillna(0) == 0, "sliding window", reasons)
        df = _filter(df, df["beam_width"].fillna(1) == 1, "beam_width != 1", reasons)
        df = _filter(df, (df["head_dim"] % 16 == 0) & (df["head_dim"] <= 256), "head_dim unsupported", reasons)
        _log_kept(log, label, f"attn ({table})", len(raw), reasons)
        if df.empty:
            continue
        bs = df["batch_size"].astype("int64")
        q = df["isl"].astype("int64")
        kv = q + df["step"].astype("int64")
        frames.append(pd.DataFrame({
            "attention_type": df["kernel_source"].map(lambda k: AIC_ATTENTION_KERNELS[k][phase]),
            "bs": bs, "q_lengths": _uniform_lists(bs, q), "kv_lengths": _uniform_lists(bs, kv),
            "nh": df["num_heads"], "nkv": df["num_key_value_heads"], "hd": df["head_dim"],
            "hardware": df["device"], "dtype": "bfloat16", "avg_duration": df["latency"] * 1000.0,
            "source": _aic_source(root, path)}))
    if not frames:
        return None
    return _finalize("attn", pd.concat(frames, ignore_index=True), log, label)


def _aic_moe(root: Path, system: str, version: str, log: Log, distributions: tuple[str, ...]) -> pd.DataFrame | None:
    path = _aic_table(root, system, "moe", AIC_FRAMEWORK, "moe_perf", version, log)
    if path is None:
        return None
    raw = _read_parquet(path, ["device", "kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size",
                               "topk", "num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency"])
    label = f"aiconfigurator {system}"
    reasons: dict[str, int] = {}
    df = _filter(raw, raw["moe_dtype"] == "bfloat16", "moe_dtype not bfloat16", reasons)
    df = _filter(df, df["kernel_source"].isin(AIC_MOE_KERNELS), "kernel not Triton fused-MoE", reasons)
    df = _filter(df, df["moe_ep_size"] == 1, "expert parallel (moe_ep_size > 1)", reasons)
    df = _filter(df, df["distribution"].isin(distributions),
                 "routing distribution not in " + ",".join(distributions), reasons)
    df = _filter(df, df["inter_size"] % df["moe_tp_size"] == 0, "inter_size not divisible by moe_tp_size", reasons)
    _log_kept(log, label, "moe", len(raw), reasons)
    if df.empty:
        return None
    frame = pd.DataFrame({"weight_type": "layer", "M": df["num_tokens"], "E": df["num_experts"], "topk": df["topk"],
                          "H": df["hidden_size"], "N": df["inter_size"] // df["moe_tp_size"],
                          "hardware": df["device"], "dtype": "bfloat16", "avg_duration": df["latency"] * 1000.0,
                          "source": _aic_source(root, path)})
    return _finalize("moe", frame, log, label)


def load_aiconfigurator(ops=None, log: Log = print, systems: Iterable[str] | None = None,
                        moe_distributions: Iterable[str] = AIC_MOE_DISTRIBUTIONS,
                        root: Path | None = None) -> dict[str, pd.DataFrame]:
    """aiconfigurator-core vLLM kernel tables in the common schema (see the module docstring for the choices).

    Returns {op: frame} for the ops that have rows; {} (logged) when the package is not installed.
    """
    ops = _wanted(ops)
    root = root or aiconfigurator_data_dir()
    if root is None:
        log("[aiconfigurator] aiconfigurator-core is not installed; skipped")
        return {}
    versions = _aic_query_versions(root)
    systems = tuple(systems) if systems is not None else aiconfigurator_systems()
    parts: dict[str, list[pd.DataFrame]] = {op: [] for op in ops}
    for system in systems:
        if not (root / system).is_dir():
            log(f"[aiconfigurator] no data folder for system {system}; skipped")
            continue
        version = versions.get(system, versions["default"])
        if "gemm" in ops or "gemm_fp8" in ops:
            for op, frame in _aic_gemm(root, system, version, ops, log).items():
                parts[op].append(frame)
        if "attn" in ops:
            parts["attn"].append(_aic_attention(root, system, version, log))
        if "moe" in ops:
            parts["moe"].append(_aic_moe(root, system, version, log, tuple(moe_distributions)))
    out = {op: _concat(op, frames) for op, frames in parts.items()}
    return {op: frame for op, frame in out.items() if not frame.empty}


# ================================================================================================================
# Vidur
# ================================================================================================================

def _vidur_model_rows(path: Path, gpu: str, rel: str, stat: str, ops: tuple[str, ...], log: Log
                      ) -> dict[str, pd.DataFrame]:
    model = path.parent.name
    layer_ops = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "input_layernorm",
                 "post_attention_layernorm", "mlp_act"]
    header = pd.read_csv(path, nrows=0).columns
    usecols = [c for c in header if c in {f"time_stats.{o}.{stat}" for o in layer_ops}]
    usecols += ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
                "num_tensor_parallel_workers"]
    d = pd.read_csv(path, usecols=usecols)
    hardware = VIDUR_GPUS[gpu]
    source = f"vidur {VIDUR_COMMIT} {rel}"
    label = f"vidur {gpu}/{model}"
    T = d["num_tokens"].astype("int64")
    tp = d["num_tensor_parallel_workers"].astype("int64")
    nh, nkv, h, inter = (d[c].astype("int64") for c in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd"))
    gated = d["use_gated_mlp"].astype(str).str.lower().isin(["true", "1"])
    hd = h // nh
    kvh = np.where(nkv >= tp, nkv // tp, nkv)
    ok_heads = (h % nh == 0) & (nh % tp == 0) & ((nkv < tp) | (nkv % tp == 0))
    ok_inter = inter % tp == 0

    def col(o: str) -> pd.Series | None:
        name = f"time_stats.{o}.{stat}"
        return d[name] * 1000.0 if name in d.columns else None

    gemm_specs = [
        ("attn_pre_proj", (nh // tp + 2 * kvh) * hd, h, ok_heads),
        ("attn_post_proj", h, nh * hd // tp, ok_heads),
        ("mlp_up_proj", np.where(gated, 2, 1) * inter // tp, h, ok_inter),
        ("mlp_down_proj", h, inter // tp, ok_inter),
    ]
    out: dict[str, list[pd.DataFrame]] = {"gemm": [], "rmsnorm": [], "siluandmul": []}
    dropped = 0
    if "gemm" in ops:
        for name, n, k, ok in gemm_specs:
            t = col(name)
            if t is None:
                continue
            ok = np.asarray(ok, dtype=bool)
            dropped += int((~ok).sum())
            out["gemm"].append(pd.DataFrame({"M": T, "N": n, "K": k, "hardware": hardware, "dtype": "float16",
                                             "avg_duration": t, "source": source}).loc[ok])
    norm, act = VIDUR_MODEL_NORM_ACT.get(model, (None, None))
    if norm is None:
        log(f"[{label}] model not in VIDUR_MODEL_NORM_ACT: norm/activation type unknown, rows skipped")
    if "rmsnorm" in ops and norm == "rms_norm":
        for name in ("input_layernorm", "post_attention_layernorm"):
            t = col(name)
            if t is not None:
                out["rmsnorm"].append(pd.DataFrame({"seq": T, "dim": h, "hardware": hardware, "dtype": "float16",
                                                    "avg_duration": t, "source": source}))
    elif "rmsnorm" in ops and norm is not None:
        log(f"[{label}] uses {norm}, not RMSNorm: its norm rows are not rmsnorm measurements, skipped")
    if "siluandmul" in ops and act == "silu":
        t = col("mlp_act")
        ok = np.asarray(gated & ok_inter, dtype=bool)
        dropped += int((~ok).sum())
        if t is not None:
            out["siluandmul"].append(pd.DataFrame({"seq": T, "dim": 2 * inter // tp, "hardware": hardware,
                                                   "dtype": "float16", "avg_duration": t, "source": source}).loc[ok])
    elif "siluandmul" in ops and act is not None:
        log(f"[{label}] activation is {act}, not gated SiLU: mlp_act rows skipped")
    if dropped:
        log(f"[{label}] {dropped} rows dropped: head or FFN size not divisible by TP")
    return {op: _finalize(op, pd.concat(frames, ignore_index=True), log, label)
            for op, frames in out.items() if frames}


def load_vidur(ops=None, log: Log = print, statistic: str = VIDUR_STATISTIC,
               data_dir: Path | None = None) -> dict[str, pd.DataFrame]:
    """Vidur's FP16 per-layer timings (``profiling/compute/*/**/mlp.csv``) as gemm / rmsnorm / siluandmul rows."""
    ops = _wanted(ops)
    data_dir = data_dir or existing_shared_data_dir()
    base = data_dir / "vidur" / "profiling" / "compute" if data_dir else None
    if base is None or not base.is_dir():
        log("[vidur] shared Vidur data not found; skipped")
        return {}
    ops = tuple(o for o in ops if o in ("gemm", "rmsnorm", "siluandmul"))
    parts: dict[str, list[pd.DataFrame]] = {op: [] for op in ops}
    for path in sorted(base.glob("*/*/*/mlp.csv")):
        gpu = path.relative_to(base).parts[0]
        if gpu not in VIDUR_GPUS:
            log(f"[vidur] unknown GPU folder {gpu!r}; skipped {path}")
            continue
        rel = path.relative_to(base).as_posix()
        for op, frame in _vidur_model_rows(path, gpu, rel, statistic, ops, log).items():
            parts[op].append(frame)
    out = {op: _concat(op, frames) for op, frames in parts.items()}
    return {op: frame for op, frame in out.items() if not frame.empty}


# ================================================================================================================
# PipeWeave FP8 GEMM
# ================================================================================================================

def load_pipeweave_fp8(log: Log = print, data_dir: Path | None = None) -> pd.DataFrame:
    """PipeWeave's FP8 GEMM measurements (train and test CSVs; ``source`` names the file)."""
    data_dir = data_dir or existing_shared_data_dir()
    frames = []
    for name in ("gemm_fp8_train.csv", "gemm_fp8_test.csv"):
        path = data_dir / "pipeweave" / "dataset" / name if data_dir else None
        if path is None or not path.is_file():
            log(f"[pipeweave] dataset/{name} not found; skipped")
            continue
        d = pd.read_csv(path, usecols=["M", "N", "K", "avg_duration", "hardware"])
        d["dtype"] = "fp8"
        d["source"] = f"pipeweave {PIPEWEAVE_COMMIT} dataset/{name}"
        frames.append(_finalize("gemm_fp8", d, log, f"pipeweave {name}"))
    return _concat("gemm_fp8", frames)


# ================================================================================================================
# project measurements
# ================================================================================================================

def load_measured(measured_dir: Path | str | None = None, ops=None, log: Log = print) -> dict[str, pd.DataFrame]:
    """Raw CSVs of the project's profiler: ``<measured_dir>/<gpu>/*.csv`` (default dataset/measured)."""
    ops = _wanted(ops)
    base = Path(measured_dir) if measured_dir is not None else DEFAULT_MEASURED_DIR
    if not base.is_dir():
        return {}
    parts: dict[str, list[pd.DataFrame]] = {op: [] for op in ops}
    for path in sorted(base.glob("*/*.csv")):
        try:
            rel = path.relative_to(REPO_ROOT).as_posix()
        except ValueError:
            rel = path.relative_to(base.parent).as_posix()
        label = f"measured {rel}"
        try:
            d = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
            log(f"[{label}] unreadable ({exc}); skipped")
            continue
        need = [c for c in ("op", "hardware", "avg_duration") if c not in d.columns]
        if need:
            log(f"[{label}] lacks required columns {need}; skipped")
            continue
        if d.empty:
            continue
        op_names = d["op"].astype(str).str.strip().map(lambda o: OP_ALIASES.get(o, o))
        unknown = sorted(set(op_names) - set(OPS))
        if unknown:
            log(f"[{label}] {int(op_names.isin(unknown).sum())} rows with unknown op {unknown}; skipped")
        for op in ops:
            rows = d.loc[(op_names == op).to_numpy()]
            if rows.empty:
                continue
            lacking = [c for c in SHAPE_COLUMNS[op] if c not in rows.columns]
            if lacking:
                log(f"[{label}] {len(rows)} {op} rows lack shape columns {lacking}; skipped")
                continue
            frame = rows[SHAPE_COLUMNS[op] + ["hardware", "avg_duration"]].copy()
            dtypes = rows["dtype"] if "dtype" in rows.columns else pd.Series([None] * len(rows), index=rows.index)
            frame["dtype"] = [_normalise_dtype(v, DEFAULT_DTYPE[op]) for v in dtypes]
            frame["source"] = f"measured {rel}"
            parts[op].append(_finalize(op, frame, log, label, check_lists=(op == "attn")))
    out = {op: _concat(op, frames) for op, frames in parts.items()}
    return {op: frame for op, frame in out.items() if not frame.empty}


# ================================================================================================================
# all sources
# ================================================================================================================

def load_measurements(ops=None, log: Log = print, measured_dir: Path | str | None = None,
                      moe_distributions: Iterable[str] = AIC_MOE_DISTRIBUTIONS) -> dict[str, pd.DataFrame]:
    """Every real measurement, one frame per operator class (all requested ops present, possibly empty).

    Sources: aiconfigurator-core (vLLM tables), Vidur (FP16 layers), PipeWeave FP8 GEMM, dataset/measured.
    Missing sources are skipped with a log line.
    """
    ops = _wanted(ops)
    start = time.perf_counter()
    parts: dict[str, list[pd.DataFrame]] = {op: [] for op in ops}
    for loaded in (load_aiconfigurator(ops, log=log, moe_distributions=moe_distributions),
                   load_vidur(ops, log=log),
                   {"gemm_fp8": load_pipeweave_fp8(log=log)} if "gemm_fp8" in ops else {},
                   load_measured(measured_dir, ops, log=log)):
        for op, frame in loaded.items():
            parts[op].append(frame)
    out = {op: _concat(op, frames) for op, frames in parts.items()}
    registry = _registry()
    if registry is not None:
        for op, frame in out.items():
            unknown = sorted(h for h in frame["hardware"].unique() if h not in registry)
            if unknown:
                log(f"[measurements] {op}: hardware without a hardware JSON (rows kept): {unknown}")
    log("[measurements] " + ", ".join(f"{op} {len(f)}" for op, f in out.items())
        + f" rows in {time.perf_counter() - start:.1f} s")
    return out


# ================================================================================================================
# collectives
# ================================================================================================================

def _collective_frame(collective, hardware, num_workers, devices_per_node, size_bytes, time_ms, source) -> pd.DataFrame:
    return pd.DataFrame({"collective": collective, "hardware": hardware, "num_workers": num_workers,
                         "devices_per_node": devices_per_node, "size_bytes": size_bytes, "time_ms": time_ms,
                         "source": source})


def _vidur_format_collectives(path: Path, hardware: str, source: str) -> pd.DataFrame:
    """PipeWeave / Vidur collective CSV (``time_stats.<op>.mean`` in ms, ``size`` in bytes)."""
    d = pd.read_csv(path)
    op = str(d["collective"].iloc[0]) if "collective" in d.columns and len(d) else path.stem
    collective = d["collective"] if "collective" in d.columns else op
    return _collective_frame(collective, hardware, d["num_workers"], d.get("devices_per_node", pd.NA), d["size"],
                             d[f"time_stats.{op}.mean"], source)


def load_collectives(log: Log = print, intra_node_only: bool = True, include_custom_allreduce: bool = True,
                     data_dir: Path | None = None, aic_root: Path | None = None) -> pd.DataFrame:
    """Collective timings: columns collective, hardware, num_workers, devices_per_node, size_bytes, time_ms, source.

    * PipeWeave ``dataset/collective/<GPU>/<op>.csv``: ``time_stats.<op>.mean`` (ms; PipeWeave's RF target),
      ``size`` bytes. Folder names map to driver names through the hardware JSONs.
    * Vidur ``profiling/network/<node>/<op>.csv`` (same format, mean): nodes a100_dgx (A100 SXM4),
      h100_dgx (H100 SXM5) and a40_pairwise_nvlink (A40, send_recv only). a100_pairwise_nvlink (A100 80GB PCIe)
      and h100_pairwise_nvlink (H100 NVL) are different products from our A100 / H100 and are skipped.
    * aiconfigurator ``comm/nccl/<ver>/nccl_perf``: NCCL all_reduce, ``nccl_dtype == half`` only;
      ``message_size`` is elements -> bytes x 2; latency ms; repeated keys averaged. Version: the newest folder
      with half all-reduce rows. nccl-tests ran on one node, so devices_per_node = num_gpus.
    * aiconfigurator ``comm/vllm/<ver>/custom_allreduce_perf`` (if ``include_custom_allreduce``): vLLM's own TP
      all-reduce as dispatched by ``tensor_model_parallel_all_reduce`` (custom one-shot/two-shot kernel for small
      messages, NCCL above its size limit), ``backend == vllm_graph`` (CUDA-graph replay, as in vLLM decode; the
      eager rows add ~20 µs of host overhead at small sizes). Labelled ``collective = "custom_all_reduce"`` so that
      it never mixes with NCCL ``all_reduce``; bfloat16 elements -> bytes x 2.

    ``intra_node_only`` drops rows with devices_per_node < num_workers (multi-node runs of Vidur's a100_dgx and
    its 2-node send_recv); PipeWeave's RF uses (size, num_workers) only and every e2e run is single-node.
    Repeated (collective, hardware, num_workers, devices_per_node, size_bytes, source) keys are averaged.
    """
    start = time.perf_counter()
    frames = []
    data_dir = data_dir or existing_shared_data_dir()
    if data_dir is not None and (data_dir / "pipeweave" / "dataset" / "collective").is_dir():
        base = data_dir / "pipeweave" / "dataset" / "collective"
        for path in sorted(base.glob("*/*.csv")):
            gpu = path.parent.name
            frames.append(_vidur_format_collectives(
                path, _hardware_name(gpu, PIPEWEAVE_COLLECTIVE_HARDWARE),
                f"pipeweave {PIPEWEAVE_COMMIT} dataset/collective/{gpu}/{path.name}"))
    else:
        log("[collectives] PipeWeave collective data not found; skipped")
    if data_dir is not None and (data_dir / "vidur" / "profiling" / "network").is_dir():
        base = data_dir / "vidur" / "profiling" / "network"
        for path in sorted(base.glob("*/*.csv")):
            node = path.parent.name
            hardware = VIDUR_NETWORK_NODES.get(node)
            if hardware is None:
                log(f"[collectives] vidur network/{node}/{path.name}: node's GPU is not one we model; skipped")
                continue
            frames.append(_vidur_format_collectives(path, hardware,
                                                    f"vidur {VIDUR_COMMIT} network/{node}/{path.name}"))
    else:
        log("[collectives] Vidur network data not found; skipped")
    root = aic_root or aiconfigurator_data_dir()
    if root is None:
        log("[collectives] aiconfigurator-core not installed; skipped")
    else:
        versions = _aic_query_versions(root)
        for system in aiconfigurator_systems():
            nccl_dir = root / system / "comm" / "nccl"
            chosen = None
            if nccl_dir.is_dir():
                for ver in sorted((p.name for p in nccl_dir.iterdir()), key=_version_key, reverse=True):
                    path = nccl_dir / ver / "nccl_perf.parquet"
                    if not path.is_file():
                        continue
                    d = _read_parquet(path, ["device", "op_name", "nccl_dtype", "num_gpus", "message_size", "latency"])
                    d = d[(d["op_name"] == "all_reduce") & (d["nccl_dtype"] == "half")]
                    if len(d) and "device" in d.columns:
                        chosen = (path, d)
                        break
            if chosen is None:
                log(f"[collectives] aiconfigurator {system}: no NCCL half all_reduce table; skipped")
            else:
                path, d = chosen
                frames.append(_collective_frame("all_reduce", d["device"], d["num_gpus"], d["num_gpus"],
                                                d["message_size"] * AIC_ELEMENT_BYTES["half"], d["latency"],
                                                _aic_source(root, path)))
            if include_custom_allreduce:
                path = _aic_table(root, system, "comm", AIC_FRAMEWORK, "custom_allreduce_perf",
                                  versions.get(system, versions["default"]), log)
                if path is None:
                    log(f"[collectives] aiconfigurator {system}: no vLLM custom_allreduce_perf; skipped")
                    continue
                d = _read_parquet(path, ["device", "kernel_source", "allreduce_dtype", "num_gpus", "message_size",
                                         "latency", "backend"])
                keep = d["backend"] == AIC_CUSTOM_ALLREDUCE_BACKEND if "backend" in d.columns else \
                    d["kernel_source"].astype(str).str.contains("graph")
                d = d[keep & d["allreduce_dtype"].isin(["bfloat16", "float16", "half"])]
                frames.append(_collective_frame("custom_all_reduce", d["device"], d["num_gpus"], d["num_gpus"],
                                                d["message_size"] * 2, d["latency"], _aic_source(root, path)))
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="str" if c in ("collective", "hardware", "source") else
                                          ("float64" if c == "time_ms" else "int64")) for c in COLLECTIVE_COLUMNS})
    df = pd.concat(frames, ignore_index=True)
    n_in = len(df)
    reasons: dict[str, int] = {}

    def drop(mask, reason):
        nonlocal df
        mask = np.asarray(mask, dtype=bool)
        if mask.sum():
            reasons[reason] = reasons.get(reason, 0) + int(mask.sum())
            df = df.loc[~mask]

    for c in ("num_workers", "devices_per_node", "size_bytes", "time_ms"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    df["devices_per_node"] = df["devices_per_node"].fillna(df["num_workers"])
    drop(df[["num_workers", "size_bytes", "time_ms"]].isna().any(axis=1), "missing value")
    drop(~np.isfinite(df["time_ms"]) | (df["time_ms"] <= 0), "zero, negative or non-finite time")
    drop((df["num_workers"] < 2) | (df["size_bytes"] <= 0), "fewer than 2 workers or empty message")
    if intra_node_only:
        drop(df["devices_per_node"] < df["num_workers"], "spans several nodes (devices_per_node < num_workers)")
    for c in ("num_workers", "devices_per_node", "size_bytes"):
        df[c] = df[c].astype("int64")
    for c in ("collective", "hardware", "source"):
        df[c] = df[c].astype("str")
    key = ["collective", "hardware", "num_workers", "devices_per_node", "size_bytes", "source"]
    repeated = int(df.duplicated(key).sum())
    if repeated:
        df = df.groupby(key, sort=False, as_index=False)["time_ms"].mean()
        reasons["repeated key averaged"] = repeated
    df = df[COLLECTIVE_COLUMNS].sort_values(["hardware", "collective", "source", "num_workers", "devices_per_node",
                                             "size_bytes"], kind="mergesort").reset_index(drop=True)
    detail = "; ".join(f"{n} {r}" for r, n in reasons.items()) if reasons else "nothing dropped"
    log(f"[collectives] {n_in} rows in, {len(df)} kept ({detail}) in {time.perf_counter() - start:.1f} s")
    return df
