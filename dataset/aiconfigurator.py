"""aiconfigurator-core 0.12.0 (source C): the vLLM GEMM, FP8 GEMM, attention and fused-MoE tables of the installed
package, read in place (the package is located, never imported).

docs/DATA.md, "C. aiconfigurator-core 0.12.0", says which framework, versions and kernels are used and why, how
context and generation rows become prefill and decode shapes, and how MoE widths are derived.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from analytical_model.hardware import hardware_registry
from dataset.common import (Log, collective_frame, concat_frames, finalize, read_parquet, uniform_lists, version_key,
                            wanted_ops)

AIC_FRAMEWORK = "vllm"
AIC_DEFAULT_VERSIONS = {"default": "0.24.0", "a100_sxm": "0.14.0"}  # used only if query_versions.yaml is unreadable
# kernel_source -> (attention_type of context rows, attention_type of generation rows)
AIC_ATTENTION_KERNELS: dict[str, tuple[str, str]] = {
    "vllm_flash_attn": ("fa2_ragged", "fa2_paged"),  # a100_sxm, vLLM 0.14: vllm-flash-attn FA2 (Ampere)
    "vllm_flash_attn_fa2": ("fa2_ragged", "fa2_paged"),  # l40s, rtx_pro_6000_server
    "vllm_flash_attn_fa3": ("fa3_ragged", "fa2_paged"),  # h100_sxm, h200_sxm; decode labelled as the workloads do
}
AIC_GEMM_FP8_KERNELS = ("CutlassFP8ScaledMMLinearKernel",)
AIC_MOE_KERNELS = ("vllm_unquantizedfusedmoe_triton_tritonexperts", "vllm_fused_moe")
AIC_MOE_DISTRIBUTIONS = ("balanced",)
#: (hidden_size, num_experts, topk) of the MoE tables' models whose experts are not gated: NVIDIA's Nemotron-3
#: experts are squared-ReLU MLPs, an N x H up projection and an H x N down one, where the calculator models gated
#: SiLU experts (gate and up, 2N x H), so their features would count 1.5x the expert weights the kernel reads, and
#: their rows are left out. The measured layers say so: beyond the L2 these run up to 1.5x faster than the DRAM time
#: of their weights as gated experts, and within that time as non-gated ones, as every other MoE layer does (README,
#: "Physical consistency of predictions").
NON_GATED_MOE_MODELS = {(2688, 128, 6): "Nemotron-3 Nano", (2048, 512, 22): "Nemotron-3 Super's 512 experts, top-22"}
AIC_CUSTOM_ALLREDUCE_BACKEND = "vllm_graph"
AIC_ELEMENT_BYTES = {"half": 2, "bfloat16": 2, "float16": 2, "int8": 1, "float": 4, "float32": 4}
#: NCCL collectives of the nccl_perf tables that pipeweave models (all_gather: the gathered output's size, as nccl-tests
#: reports it)
AIC_NCCL_OPS = ("all_reduce", "all_gather")


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
    registry = hardware_registry()
    return tuple(sorted({s.aiconfigurator_system for s in registry.specs.values() if s.aiconfigurator_system}))


def _aic_table(root: Path, system: str, family: str, framework: str, table: str, preferred: str | None,
               log: Log) -> Path | None:
    base = root / system / family / framework
    if preferred and (base / preferred / f"{table}.parquet").is_file():
        return base / preferred / f"{table}.parquet"
    if not base.is_dir():
        return None
    versions = sorted((p.name for p in base.iterdir() if (p / f"{table}.parquet").is_file()), key=version_key)
    if not versions:
        return None
    log(f"[aiconfigurator] {system}: {family}/{framework}/{preferred} has no {table}; using newest {versions[-1]}")
    return base / versions[-1] / f"{table}.parquet"


def _aic_source(root: Path, path: Path) -> str:
    return f"aiconfigurator-core {aiconfigurator_version()} {path.relative_to(root).as_posix()}"


def log_kept(log: Log, label: str, op: str, total: int, reasons: dict[str, int]) -> None:
    detail = "; ".join(f"{n} {r}" for r, n in reasons.items() if n)
    if detail:
        log(f"[{label}] {op}: of {total} rows, filtered out {detail}")


def filter_rows(df: pd.DataFrame, mask, reason: str, reasons: dict[str, int]) -> pd.DataFrame:
    mask = np.asarray(mask, dtype=bool)
    reasons[reason] = reasons.get(reason, 0) + int((~mask).sum())
    return df.loc[mask]


def _aic_gemm(root: Path, system: str, version: str, ops: tuple[str, ...], log: Log) -> dict[str, pd.DataFrame]:
    path = _aic_table(root, system, "gemm", AIC_FRAMEWORK, "gemm_perf", version, log)
    if path is None:
        return {}
    raw = read_parquet(path, ["device", "kernel_source", "gemm_dtype", "m", "n", "k", "latency"])
    source, label = _aic_source(root, path), f"aiconfigurator {system}"
    out = {}
    for op, dtype in (("gemm", "bfloat16"), ("gemm_fp8", "fp8")):
        if op not in ops:
            continue
        reasons: dict[str, int] = {}
        df = filter_rows(raw, raw["gemm_dtype"] == dtype, "other gemm_dtype", reasons)
        if op == "gemm_fp8":
            df = filter_rows(df, df["kernel_source"].isin(AIC_GEMM_FP8_KERNELS), "other fp8 kernel", reasons)
        log_kept(log, label, op, len(raw), reasons)
        if df.empty:
            continue
        frame = pd.DataFrame({"M": df["m"], "N": df["n"], "K": df["k"], "hardware": df["device"], "dtype": dtype,
                              "avg_duration": df["latency"] * 1000.0, "source": source})
        out[op] = finalize(op, frame, log, label)
    return out


def _aic_attention(root: Path, system: str, version: str, log: Log) -> pd.DataFrame | None:
    frames = []
    label = f"aiconfigurator {system}"
    for phase, table in ((0, "context_attention_perf"), (1, "generation_attention_perf")):
        path = _aic_table(root, system, "attention", AIC_FRAMEWORK, table, version, log)
        if path is None:
            continue
        raw = read_parquet(path, ["device", "kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads",
                                   "head_dim", "beam_width", "attn_dtype", "kv_cache_dtype", "step", "window_size",
                                   "latency"])
        reasons: dict[str, int] = {}
        df = filter_rows(raw, raw["kernel_source"].isin(list(AIC_ATTENTION_KERNELS)),
                     "kernel not FA2/FA3 (" + ",".join(sorted(set(raw["kernel_source"]) - set(AIC_ATTENTION_KERNELS)))
                     + ")", reasons)
        df = filter_rows(df, df["attn_dtype"] == "bfloat16", "attn_dtype not bfloat16", reasons)
        df = filter_rows(df, df["kv_cache_dtype"] == "bfloat16", "fp8 KV cache", reasons)
        if "window_size" in df.columns:
            df = filter_rows(df, df["window_size"].fillna(0) == 0, "sliding window", reasons)
        df = filter_rows(df, df["beam_width"].fillna(1) == 1, "beam_width != 1", reasons)
        df = filter_rows(df, (df["head_dim"] % 16 == 0) & (df["head_dim"] <= 256), "head_dim unsupported", reasons)
        log_kept(log, label, f"attn ({table})", len(raw), reasons)
        if df.empty:
            continue
        bs = df["batch_size"].astype("int64")
        q = df["isl"].astype("int64")
        kv = q + df["step"].astype("int64")
        frames.append(pd.DataFrame({
            "attention_type": df["kernel_source"].map(lambda k: AIC_ATTENTION_KERNELS[k][phase]),
            "bs": bs, "q_lengths": uniform_lists(bs, q), "kv_lengths": uniform_lists(bs, kv),
            "nh": df["num_heads"], "nkv": df["num_key_value_heads"], "hd": df["head_dim"],
            "hardware": df["device"], "dtype": "bfloat16", "avg_duration": df["latency"] * 1000.0,
            "source": _aic_source(root, path)}))
    if not frames:
        return None
    return finalize("attn", pd.concat(frames, ignore_index=True), log, label)


def _aic_moe_rows(root: Path, system: str, version: str, log: Log, distributions: tuple[str, ...],
                  expert_parallel: bool) -> tuple[pd.DataFrame, str] | None:
    """(the vLLM BF16 balanced Triton fused-MoE rows of one system, the source label): without expert parallelism
    (``moe_ep_size == 1``, the dataset's) or only with it (the rows :func:`expert_parallel_moe_rows` scores)."""
    path = _aic_table(root, system, "moe", AIC_FRAMEWORK, "moe_perf", version, log)
    if path is None:
        return None
    raw = read_parquet(path, ["device", "kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size",
                               "topk", "num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency"])
    label = f"aiconfigurator {system}"
    reasons: dict[str, int] = {}
    df = filter_rows(raw, raw["moe_dtype"] == "bfloat16", "moe_dtype not bfloat16", reasons)
    df = filter_rows(df, df["kernel_source"].isin(AIC_MOE_KERNELS), "kernel not Triton fused-MoE", reasons)
    if expert_parallel:
        df = filter_rows(df, df["moe_ep_size"] > 1, "no expert parallelism (moe_ep_size == 1)", reasons)
    else:
        df = filter_rows(df, df["moe_ep_size"] == 1, "expert parallel (moe_ep_size > 1)", reasons)
    df = filter_rows(df, df["distribution"].isin(distributions),
                 "routing distribution not in " + ",".join(distributions), reasons)
    df = filter_rows(df, df["inter_size"] % df["moe_tp_size"] == 0, "inter_size not divisible by moe_tp_size", reasons)
    gated = np.array([key not in NON_GATED_MOE_MODELS for key in zip(df["hidden_size"], df["num_experts"], df["topk"])],
                     dtype=bool)
    df = filter_rows(df, gated, f"experts not gated ({'; '.join(NON_GATED_MOE_MODELS.values())})", reasons)
    log_kept(log, label, "moe", len(raw), reasons)
    return df, _aic_source(root, path)


def _aic_moe(root: Path, system: str, version: str, log: Log, distributions: tuple[str, ...]) -> pd.DataFrame | None:
    found = _aic_moe_rows(root, system, version, log, distributions, expert_parallel=False)
    if found is None or found[0].empty:
        return None
    return finalize("moe", _moe_layer_frame(*found).assign(dtype="bfloat16"), log, f"aiconfigurator {system}")


def _moe_layer_frame(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Rows of a fused-MoE table (:func:`_aic_moe_rows`) as whole layers in the dataset's MoE shape columns, with the
    table's device name as ``hardware``, the latency in µs and the source."""
    return pd.DataFrame({"weight_type": "layer", "M": df["num_tokens"], "E": df["num_experts"], "topk": df["topk"],
                         "H": df["hidden_size"], "N": df["inter_size"] // df["moe_tp_size"], "hardware": df["device"],
                         "avg_duration": df["latency"] * 1000.0, "source": source})


def _pinned_systems(root: Path) -> list[tuple[str, str]]:
    """(system, its pinned vLLM version) of every system a hardware JSON maps to that the package has a folder for."""
    versions = _aic_query_versions(root)
    return [(system, versions.get(system, versions["default"])) for system in aiconfigurator_systems()
            if (root / system).is_dir()]


def expert_parallel_moe_rows(root: Path | None = None, log: Log = print) -> pd.DataFrame:
    """aiconfigurator-core's expert-parallel fused-MoE layers (vLLM, BF16, balanced routing, ``moe_ep_size > 1``),
    which the dataset leaves out: one row per measured layer with ``tokens`` (entering the rank), ``experts`` (of
    the whole model), ``topk``, ``hidden``, ``inter`` (the whole expert width), ``moe_tp``, ``ep``, the GPU and
    the measured ``avg_duration`` (µs). They score how a rank of an expert-parallel layout is described
    (:func:`pipeweave.moe.expert_parallel_errors`); nothing is trained on them. Empty without the package."""
    root = root or aiconfigurator_data_dir()
    registry = hardware_registry()
    frames = []
    if root is not None:
        for system, pinned in _pinned_systems(root):
            found = _aic_moe_rows(root, system, pinned, log, AIC_MOE_DISTRIBUTIONS, expert_parallel=True)
            if found is not None and not found[0].empty:
                df = found[0]
                frames.append(pd.DataFrame({
                    "tokens": df["num_tokens"], "experts": df["num_experts"], "topk": df["topk"],
                    "hidden": df["hidden_size"], "inter": df["inter_size"], "moe_tp": df["moe_tp_size"],
                    "ep": df["moe_ep_size"], "hardware": df["device"].map(lambda name: registry.get(name).name),
                    "avg_duration": df["latency"] * 1000.0}))
    columns = ["tokens", "experts", "topk", "hidden", "inter", "moe_tp", "ep", "hardware", "avg_duration"]
    if not frames:
        return pd.DataFrame(columns=columns)
    out = pd.concat(frames, ignore_index=True)
    for column in columns[:7]:
        out[column] = out[column].astype("int64")
    return out.sort_values(["hardware", *columns[:7]], kind="mergesort").reset_index(drop=True)


def _older_balanced_moe_rows(root: Path, system: str, pinned: str, log: Log) -> tuple[pd.DataFrame, str] | None:
    """:func:`_aic_moe_rows` (balanced, no expert parallelism) of the newest vLLM version below ``pinned`` whose
    fused-MoE table of ``system`` has such layers (None if none has)."""
    base = root / system / "moe" / AIC_FRAMEWORK
    if not base.is_dir():
        return None
    older = sorted((p.name for p in base.iterdir()
                    if (p / "moe_perf.parquet").is_file() and version_key(p.name) < version_key(pinned)),
                   key=version_key, reverse=True)
    for version in older:
        found = _aic_moe_rows(root, system, version, log, AIC_MOE_DISTRIBUTIONS, expert_parallel=False)
        if found is not None and not found[0].empty:
            return found
    return None


#: the routing of the layers that stand in for balanced ones on a GPU whose table has no balanced layer (a100_sxm):
#: the mildest skew the tables have; on the GPUs that measured both, its layers take 0.96-0.99x the balanced ones'
#: time at the median (:func:`routing_proxy_errors` gives the spread)
ROUTING_PROXY = "power_law_1.01"


@lru_cache(maxsize=2)
def _pinned_routing_rows(root: Path) -> tuple[tuple[str, str, tuple[pd.DataFrame, str]], ...]:
    """(system, its pinned vLLM version, :func:`_aic_moe_rows` of balanced and :data:`ROUTING_PROXY` layers without
    expert parallelism) of every system with a pinned fused-MoE table: read once for :func:`unseen_moe_rows` and
    :func:`routing_proxy_errors` (the accuracy report calls both; callers must not modify the frames)."""
    out = []
    for system, pinned in _pinned_systems(root):
        found = _aic_moe_rows(root, system, pinned, lambda line: None, (AIC_MOE_DISTRIBUTIONS[0], ROUTING_PROXY),
                              expert_parallel=False)
        if found is not None:
            out.append((system, pinned, found))
    return tuple(out)


def unseen_moe_rows(root: Path | None = None, log: Log = print) -> pd.DataFrame:
    """Fused-MoE layers of GPUs the dataset has none of, which score the shipped MoE model on a GPU and an
    architecture outside its training data (:func:`pipeweave.moe.unseen_gpu_errors`):

    * where the pinned vLLM table has no balanced Triton fused-MoE layer (the Blackwell systems' 0.24 tables time
      FlashInfer's experts) but an older table of the system has, that table's (b200_sxm: vLLM 0.22). The dataset
      reads the pinned tables alone, so no model is trained on them (trained on, they made the MoE model transfer
      worse to the other GPUs: README, "Tried for MoE, not shipped");
    * failing that, the pinned table's :data:`ROUTING_PROXY` layers (a100_sxm, vLLM 0.14: Triton layers, none with
      balanced routing).

    Columns: the MoE shape columns (``weight_type`` ``layer``), ``hardware``, ``avg_duration`` (µs), ``source`` and
    ``routing``; no expert parallelism, as in the dataset. Empty without the package."""
    root = root or aiconfigurator_data_dir()
    registry = hardware_registry()
    frames = []
    if root is not None:
        balanced = AIC_MOE_DISTRIBUTIONS[0]
        for system, pinned, pinned_rows in _pinned_routing_rows(root):
            if (pinned_rows[0]["distribution"] == balanced).any():
                continue  # the dataset's own layers
            found, routing = _older_balanced_moe_rows(root, system, pinned, log), balanced
            if found is None:
                found, routing = pinned_rows, ROUTING_PROXY  # the pinned table's proxy-routed layers, if any
            if not found[0].empty:
                frame = _moe_layer_frame(*found)
                frames.append(frame.assign(hardware=frame["hardware"].map(lambda name: registry.get(name).name),
                                           routing=routing))
    columns = ["weight_type", "M", "E", "topk", "H", "N", "hardware", "avg_duration", "source", "routing"]
    if not frames:
        return pd.DataFrame(columns=columns)
    out = pd.concat(frames, ignore_index=True)
    for column in ("M", "E", "topk", "H", "N"):
        out[column] = out[column].astype("int64")
    return out.sort_values(["hardware", "M", "E", "topk", "H", "N"], kind="mergesort").reset_index(drop=True)


def routing_proxy_errors(root: Path | None = None) -> dict[str, float]:
    """Per GPU whose pinned fused-MoE table times both routings without expert parallelism, the mean |balanced /
    :data:`ROUTING_PROXY` - 1| (%) over their common layers: the error a prediction that were exact for balanced
    routing would have on proxy-routed layers. Empty without the package."""
    root = root or aiconfigurator_data_dir()
    out = {}
    if root is None:
        return out
    registry = hardware_registry()
    keys = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size"]
    for _, _, found in _pinned_routing_rows(root):
        if found[0].empty:
            continue
        by_routing = found[0].groupby(keys + ["distribution"])["latency"].median().unstack("distribution")
        if set(by_routing.columns) >= {AIC_MOE_DISTRIBUTIONS[0], ROUTING_PROXY}:
            ratio = (by_routing[AIC_MOE_DISTRIBUTIONS[0]] / by_routing[ROUTING_PROXY]).dropna()
            if len(ratio):
                out[registry.get(found[0]["device"].iloc[0]).name] = float(np.mean(np.abs(ratio - 1)) * 100)
    return out


def quantize_rows(root: Path | None = None, log: Log = print) -> pd.DataFrame:
    """aiconfigurator-core's vLLM BF16 -> FP8 activation quantisation kernels (``quantize/vllm/<v>``): per GPU and
    (m tokens, k width) the dynamic per-token pass, its ``scale_matrix_perf`` (``static_scaled_fp8_quant``) plus
    its ``computescale_perf`` (the dynamic per-token kernel's extra time over the static one), as ``seq``, ``dim``,
    ``hardware`` and ``avg_duration`` (µs). They fit the quantisation's bandwidth model
    (:mod:`pipeweave.quantize_model`). Empty without the package."""
    root = root or aiconfigurator_data_dir()
    columns = ["seq", "dim", "hardware", "avg_duration", "source"]
    frames = []
    if root is not None:
        versions = _aic_query_versions(root)
        registry = hardware_registry()
        for system in aiconfigurator_systems():
            version = versions.get(system, versions["default"])
            static = _aic_table(root, system, "quantize", AIC_FRAMEWORK, "scale_matrix_perf", version, log)
            scale = _aic_table(root, system, "quantize", AIC_FRAMEWORK, "computescale_perf", version, log)
            if static is None or scale is None:
                continue
            merged = read_parquet(static, ["device", "m", "k", "quant_dtype", "latency"]).merge(
                read_parquet(scale, ["m", "k", "quant_dtype", "latency"]), on=["m", "k", "quant_dtype"],
                suffixes=("", "_scale"))
            merged = merged[merged["quant_dtype"] == "fp8"]
            frames.append(pd.DataFrame({
                "seq": merged["m"].astype("int64"), "dim": merged["k"].astype("int64"),
                "hardware": merged["device"].map(lambda name: registry.get(name).name),
                "avg_duration": (merged["latency"] + merged["latency_scale"]) * 1000.0,
                "source": _aic_source(root, static)}))
    if not frames:
        return pd.DataFrame(columns=columns)
    out = pd.concat(frames, ignore_index=True)[columns]
    return out.sort_values(["hardware", "seq", "dim"], kind="mergesort").reset_index(drop=True)


def load_aiconfigurator(ops=None, log: Log = print, systems: Iterable[str] | None = None,
                        moe_distributions: Iterable[str] = AIC_MOE_DISTRIBUTIONS,
                        root: Path | None = None) -> dict[str, pd.DataFrame]:
    """aiconfigurator-core vLLM kernel tables in the common schema (see the module docstring for the choices).

    Returns {op: frame} for the ops that have rows; {} (logged) when the package is not installed.
    """
    ops = wanted_ops(ops)
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
    out = {op: concat_frames(op, frames) for op, frames in parts.items()}
    return {op: frame for op, frame in out.items() if not frame.empty}


def load_aiconfigurator_collectives(root: Path | None, include_custom_allreduce: bool, log: Log) -> list[pd.DataFrame]:
    """NCCL all-reduce (newest version with half-precision rows) and, if asked, vLLM's custom all-reduce of every
    system, in the collective schema (see :func:`dataset.collective_sources.load_collectives`)."""
    frames: list[pd.DataFrame] = []
    root = root or aiconfigurator_data_dir()
    if root is None:
        log("[collectives] aiconfigurator-core not installed; skipped")
        return frames
    versions = _aic_query_versions(root)
    for system in aiconfigurator_systems():
        nccl_dir = root / system / "comm" / "nccl"
        chosen = None
        if nccl_dir.is_dir():
            for ver in sorted((p.name for p in nccl_dir.iterdir()), key=version_key, reverse=True):
                path = nccl_dir / ver / "nccl_perf.parquet"
                if not path.is_file():
                    continue
                d = read_parquet(path, ["device", "op_name", "nccl_dtype", "num_gpus", "message_size", "latency"])
                d = d[d["op_name"].isin(AIC_NCCL_OPS) & (d["nccl_dtype"] == "half")]
                if (d["op_name"] == "all_reduce").any() and "device" in d.columns:
                    chosen = (path, d)
                    break
        if chosen is None:
            log(f"[collectives] aiconfigurator {system}: no NCCL half all_reduce table; skipped")
        else:
            path, d = chosen
            for op, rows in d.groupby("op_name", sort=True):  # all_reduce, and all_gather where measured
                frames.append(collective_frame(op, rows["device"], rows["num_gpus"], rows["num_gpus"],
                                                rows["message_size"] * AIC_ELEMENT_BYTES["half"], rows["latency"],
                                                _aic_source(root, path)))
        if include_custom_allreduce:
            path = _aic_table(root, system, "comm", AIC_FRAMEWORK, "custom_allreduce_perf",
                              versions.get(system, versions["default"]), log)
            if path is None:
                log(f"[collectives] aiconfigurator {system}: no vLLM custom_allreduce_perf; skipped")
                continue
            d = read_parquet(path, ["device", "kernel_source", "allreduce_dtype", "num_gpus", "message_size",
                                     "latency", "backend"])
            keep = d["backend"] == AIC_CUSTOM_ALLREDUCE_BACKEND if "backend" in d.columns else \
                d["kernel_source"].astype(str).str.contains("graph")
            d = d[keep & d["allreduce_dtype"].isin(["bfloat16", "float16", "half"])]
            frames.append(collective_frame("custom_all_reduce", d["device"], d["num_gpus"], d["num_gpus"],
                                            d["message_size"] * 2, d["latency"], _aic_source(root, path)))
    return frames
