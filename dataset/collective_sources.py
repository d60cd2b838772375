"""Collective measurements of every source (PipeWeave sweeps, aiconfigurator's NCCL tables, Vidur's network data) in
one schema: :func:`load_collectives`.

docs/DATA.md, "Collectives: which source each model uses", explains the sources and their precedence.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from dataset.aiconfigurator import load_aiconfigurator_collectives
from dataset.common import COLLECTIVE_COLUMNS, PIPEWEAVE_COMMIT, VIDUR_COMMIT, Log, collective_frame, hardware_name
from pipeweave.paths import existing_shared_data_dir

# network node -> device name; nodes whose GPUs we do not model are listed with None (and skipped)
VIDUR_NETWORK_NODES = {
    "a100_dgx": "NVIDIA A100-SXM4-80GB",  # DGX A100, 8x A100 SXM4 80 GB, NVSwitch
    "h100_dgx": "NVIDIA H100",  # DGX H100, 8x H100 SXM5, NVSwitch
    "a40_pairwise_nvlink": "NVIDIA A40",  # 8x A40 with pairwise NVLink bridges (send_recv only)
    "a100_pairwise_nvlink": None,  # A100 80GB PCIe: a different product from our A100 SXM4
    "h100_pairwise_nvlink": None,  # H100 NVL: a different product from our H100 SXM5
}


def _vidur_format_collectives(path: Path, hardware: str, source: str) -> pd.DataFrame:
    """PipeWeave / Vidur collective CSV (``time_stats.<op>.mean`` in ms, ``size`` in bytes)."""
    d = pd.read_csv(path)
    op = str(d["collective"].iloc[0]) if "collective" in d.columns and len(d) else path.stem
    collective = d["collective"] if "collective" in d.columns else op
    return collective_frame(collective, hardware, d["num_workers"], d.get("devices_per_node", pd.NA), d["size"],
                             d[f"time_stats.{op}.mean"], source)


def load_collectives(log: Log = print, intra_node_only: bool = True, include_custom_allreduce: bool = True,
                     data_dir: Path | None = None, aic_root: Path | None = None) -> pd.DataFrame:
    """Collective timings: columns collective, hardware, num_workers, devices_per_node, size_bytes, time_ms, source.

    * PipeWeave ``dataset/collective/<GPU>/<op>.csv``: ``time_stats.<op>.mean`` (ms; PipeWeave's RF target),
      ``size`` bytes. Folder names map to driver names through the hardware JSONs.
    * Vidur ``profiling/network/<node>/<op>.csv`` (same format, mean): nodes a100_dgx (A100 SXM4),
      h100_dgx (H100 SXM5) and a40_pairwise_nvlink (A40, send_recv only). a100_pairwise_nvlink (A100 80GB PCIe)
      and h100_pairwise_nvlink (H100 NVL) are different products from our A100 / H100 and are skipped.
    * aiconfigurator ``comm/nccl/<ver>/nccl_perf``: NCCL all_reduce and all_gather (the gathered output's size),
      ``nccl_dtype == half`` only;
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
    frames = [*_pipeweave_collectives(data_dir, log), *_vidur_collectives(data_dir, log),
              *load_aiconfigurator_collectives(aic_root, include_custom_allreduce, log)]
    return _clean_collectives(frames, intra_node_only, log, start)


def _pipeweave_collectives(data_dir: Path | None, log: Log) -> list[pd.DataFrame]:
    base = data_dir / "pipeweave" / "dataset" / "collective" if data_dir is not None else None
    if base is None or not base.is_dir():
        log("[collectives] PipeWeave collective data not found; skipped")
        return []
    return [_vidur_format_collectives(path, hardware_name(path.parent.name),
                                      f"pipeweave {PIPEWEAVE_COMMIT} dataset/collective/{path.parent.name}/{path.name}")
            for path in sorted(base.glob("*/*.csv"))]


def _vidur_collectives(data_dir: Path | None, log: Log) -> list[pd.DataFrame]:
    base = data_dir / "vidur" / "profiling" / "network" if data_dir is not None else None
    if base is None or not base.is_dir():
        log("[collectives] Vidur network data not found; skipped")
        return []
    frames = []
    for path in sorted(base.glob("*/*.csv")):
        node = path.parent.name
        hardware = VIDUR_NETWORK_NODES.get(node)
        if hardware is None:
            log(f"[collectives] vidur network/{node}/{path.name}: node's GPU is not one we model; skipped")
            continue
        frames.append(_vidur_format_collectives(path, hardware, f"vidur {VIDUR_COMMIT} network/{node}/{path.name}"))
    return frames


def _clean_collectives(frames: list[pd.DataFrame], intra_node_only: bool, log: Log, start: float) -> pd.DataFrame:
    """Concatenate, drop invalid rows (logged with counts and reasons), average repeated keys, sort."""
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
