"""Vidur @ 7d47513 (source B): FP16 per-layer operator times (``profiling/compute/*/**/mlp.csv``) as GEMM, RMSNorm and
SiLU*Mul rows.

docs/DATA.md, "B. Vidur", gives the per-layer mapping (projections to GEMM shapes, norms, activation widths), the
GPU folders and why the median of the repeats is used.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dataset.common import VIDUR_COMMIT, Log, concat_frames, finalize, wanted_ops
from pipeweave.paths import existing_shared_data_dir

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
    return {op: finalize(op, pd.concat(frames, ignore_index=True), log, label)
            for op, frames in out.items() if frames}


def load_vidur(ops=None, log: Log = print, statistic: str = VIDUR_STATISTIC,
               data_dir: Path | None = None) -> dict[str, pd.DataFrame]:
    """Vidur's FP16 per-layer timings (``profiling/compute/*/**/mlp.csv``) as gemm / rmsnorm / siluandmul rows."""
    ops = wanted_ops(ops)
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
    out = {op: concat_frames(op, frames) for op, frames in parts.items()}
    return {op: frame for op, frame in out.items() if not frame.empty}
