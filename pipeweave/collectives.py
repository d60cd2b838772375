"""Collective-communication time models: all-reduce (tensor parallel), all-gather (the logits of a vocabulary-parallel
``lm_head``) and send/recv (pipeline stages).

Replaces the artifact's per-GPU random forests (docs/METHOD.md §5.5, §7.3 "Communication") and fixes the quirks of
§11.3 items 18-19.

Usage::

    from pipeweave.collectives import CollectivePredictor
    pred = CollectivePredictor("H100")                        # any name load_hardware accepts
    pred.predict_ms("all_reduce", [2**20, 2**30], 4)          # ms, vectorised over sizes and/or worker counts
    pred.predict_ms("send_recv", 2**24, 8)                    # a PP boundary is a 2-party transfer: uses 2 workers
    CollectivePredictor("L20", allow_analytical=True)         # no data for L20: explicit analytical estimate
    # training: python3 train_collective_rf.py   (pipeweave.collective_training; writes collective_models/<GPU>/)

Model
-----
One model per GPU (hardware stem) and collective kind, over the features (log2 size_bytes, num_workers):
for each measured worker count, a piecewise-linear interpolant of log(time) over log2(size) through the
measurements (dense sweeps - >= 100 sizes, i.e. PipeWeave/Vidur - are first smoothed by a centred rolling median
over 5 neighbouring sizes). It was chosen over random forests because it is more accurate on held-out sizes on
every GPU x kind (see ``metadata.json``; the aiconfigurator sweeps have only 21 power-of-two sizes, where a forest
degrades to a coarse step function with 8-65 % error while interpolation gives 3-8 %), and because the files are
small JSON (2-241 kB) that prediction reads with numpy alone. A small random forest in log-log space
(``regressor="rf"``, 30 trees, depth 12, min leaf 3; saved with joblib, loading needs scikit-learn) and the
artifact's exact forest (``regressor="reference_rf"``: [size, num_workers] -> ms, 100 trees, depth 20, min split 5,
min leaf 2, random_state 42) can be trained instead for comparison; all three share the range handling below.

* **Above the largest measured size** the time grows linearly in bytes:
  t(s) = t(s_max) + (s - s_max) / B, with B the bandwidth implied by the largest sizes (least-squares slope of
  time over bytes for the measured sizes in [s_max/4, s_max]; if that slope is not positive, B = s_max / t(s_max)).
  Forests (and the artifact) return a constant there.
* **Below the smallest measured size** the time of the smallest size is returned (latency floor).
* **Unseen worker counts** raise a ValueError listing the measured ones, unless the analytical estimate was
  explicitly allowed (``allow_analytical=True``), in which case those entries use :func:`analytical_collective_ms`
  and the kind is added to ``used_analytical`` so that callers can warn visibly. Nothing falls back silently.
* **send/recv** always uses num_workers = 2 (fix of METHOD §11.3 item 19: the artifact passed the TP size, although
  every send/recv sweep is a 2-GPU transfer; a PP stage-boundary transfer is a 2-party send/recv whatever TP is).
* A zero-byte message takes 0 ms.

Sources and precedence
----------------------
Rows come from :func:`dataset.collective_sources.load_collectives` (NCCL ``all_reduce``, ``all_gather`` and
``send_recv``, and vLLM's ``custom_all_reduce``, which counts as all-reduce). A GPU without all-gather rows predicts
it from its all-reduce (:func:`fallback_kind`). For every (GPU, kind, num_workers) exactly one source is used,
the first available of:

0. **C* aiconfigurator-core 0.12.0** ``comm/vllm/<ver>/custom_allreduce_perf.parquet``, CUDA-graph replay: vLLM's
   own tensor-parallel all-reduce as a serving engine runs it (custom kernel below 8 MiB, NCCL above);
   all-reduce only.
1. **C aiconfigurator-core 0.12.0** ``systems/data/<system>/comm/nccl/<ver>/nccl_perf.parquet`` (NVIDIA,
   Apache-2.0): nccl-tests, half precision, single node: GPU time of the collective (6-25 us at small sizes).
2. **B Vidur** ``profiling/network/<node>/<op>.csv`` (github.com/microsoft/vidur @ 7d47513, MIT): DGX A100,
   DGX H100 and A40-pairwise-NVLink nodes, kineto GPU kernel times, single-node rows only, sizes up to 64 MiB.
3. **A PipeWeave** ``dataset/collective/<GPU>/<op>.csv`` (github.com/zksainx/pipeweave @ 55e0317, Apache-2.0): the
   artifact's own sweeps, timed from the host, so they include the PyTorch call overhead (20-55 us at small
   sizes, e.g. 68 us for a 0.5 MB 2-GPU all-reduce on H100 where nccl-tests measures 11 us); all-reduce sweeps
   are converted to device time (:mod:`pipeweave.collective_serving`).

Why GPU-time sources first: serving engines launch decode steps from CUDA graphs, so the host-side call
overhead overlaps GPU work and what adds to latency is the kernel time. With the host-timed sweeps first, a
decode step of Qwen3-32B at TP2 on H100 (128 all-reduces) carried about 8 ms of all-reduce and was predicted 35 %
too slow (docs/E2E.md, before this change: H100 TP2 runs 14-26 % mean error). This precedence was chosen after
seeing that end-to-end error; the reason above is independent of it, and docs/E2E.md reports both.

Sources are never mixed within one worker count (their harnesses differ by up to ~3x at small sizes), but one GPU
may combine worker counts from different sources;
``metadata.json`` records the source of every worker count and which lower-precedence sources were skipped.

Analytical estimate
-------------------
See :func:`analytical_collective_ms`: link type, bandwidth and latency come from the GPU's hardware JSON
(``linkType``, ``linkGbps``, ``linkLatencyUs``); the bandwidth term is scaled by the ring efficiency measured on
other GPUs of the same link (:meth:`CollectivePredictor.ring_efficiency`); small NVLink all-reduces use the custom
all-reduce model of :mod:`pipeweave.collective_serving`. Used only when allowed (the aggregator allows it by
default and prints a WARNING naming it).

Serving corrections
-------------------
All-reduce models describe what a serving engine pays: host-timed sweeps are converted to device time and small
NVLink messages follow vLLM's custom all-reduce; see :mod:`pipeweave.collective_serving`. aiconfigurator-core's
measured vLLM custom all-reduce (CUDA-graph replay) is the first source of all-reduce where it exists.
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np

from pipeweave.paths import DEFAULT_COLLECTIVE_DIR

from .collective_serving import (
    ALGORITHM_SWITCH_BYTES, CUSTOM_AR_MAX_BYTES, CUSTOM_AR_WORLD_SIZES, SERVING_FILE, custom_allreduce_ms,
    custom_allreduce_params, link_family, read_serving, ring_factor,
)

KINDS = ("all_reduce", "send_recv", "all_gather")  # the kinds with measured models
#: a kind a GPU did not measure, predicted as a measured kind of that GPU at a fraction of its bytes
#: (:func:`fallback_kind`)
FALLBACK_KINDS = {"all_gather": ("all_reduce", 0.5)}
MODEL_FORMAT = "pipeweave-collective-v1"
METADATA_FILE = "metadata.json"
SEND_RECV_WORKERS = 2
#: GPUs of one node (an HGX board, a PCIe server): the analytical estimate beyond them still assumes one fabric
NODE_GPUS = 8


def fallback_kind(kind: str) -> tuple[str, float]:
    """(the kind that predicts ``kind`` where this GPU did not measure it, the factor on its bytes). An all-gather
    whose gathered output is S bytes moves what an all-reduce of S / 2 moves: a ring all-reduce is a reduce-scatter
    followed by an all-gather, each rank sending (n - 1) / n of the message in each, so both move (n - 1) / n * S
    per rank in n - 1 steps. Measured, the rule is rough: on the 17 NCCL tables of aiconfigurator-core that hold
    both (9 GPUs, 2-8 workers, half precision), NCCL's all-gather of S bytes is 0.48-1.78x its all-reduce of S / 2
    from 256 KiB to 64 MiB, the logits' sizes (mean deviation 17 %, ``tests/test_collectives.py``): NCCL's
    all-reduce switches to tree and NVLS algorithms at 8 GPUs, the all-gather does not. And where a GPU's
    all-reduce model is vLLM's custom all-reduce (below 8 MiB on NVLink), which is 0.3-0.8x NCCL's all-reduce
    there, the rule is faster still: on those 9 GPUs it gives a median 0.78x the measured all-gather (mean deviation
    29 %). So the 9 GPUs' own all-gather measurements are models of their own (``all_gather_model.json``); the rule
    serves the GPUs without, where a workload's one all-gather per iteration (the logits of a vocabulary-parallel
    ``lm_head``) is small beside the step (0.02 of 11.3 ms in a decode step of Llama-3.1-70B with 16 requests at
    TP8 on H20)."""
    return FALLBACK_KINDS.get(kind, (kind, 1.0))


def collective_workers(kind: str, tp_size: int) -> int:
    """Workers of one collective of a workload: a pipeline pair for send/recv, else its TP group."""
    return SEND_RECV_WORKERS if kind == "send_recv" else tp_size

REGRESSORS = ("interp", "rf", "reference_rf")

TRAIN_HINT = "train them with `python3 train_collective_rf.py --hardware <GPU>` (needs collective measurements)"
ANALYTICAL_HINT = ("explicitly allow the analytical estimate (CollectivePredictor(..., allow_analytical=True); "
                   "the aggregator's analytical-collectives flag)")


# ================================================================================================================
# analytical estimate
# ================================================================================================================

def analytical_collective_ms(kind: str, size_bytes, num_workers, link_gbps: float, latency_us: float
                             ) -> np.ndarray:
    """Textbook estimate of one collective, in ms (vectorised); the fallback where nothing was measured.

    * ``all_reduce`` (ring): 2 (n - 1) / n * bytes / link_gbps + latency_us * log2(n); 0 ms for n = 1.
    * ``send_recv``: bytes / link_gbps + latency_us (num_workers is ignored: a point-to-point transfer).
    * ``all_gather`` (of ``bytes`` gathered): the all-reduce of half the bytes (:func:`fallback_kind`).

    ``link_gbps`` is the per-GPU, per-direction link bandwidth in **GB/s** (10^9 bytes/s, not gigabits), i.e. half
    the bidirectional figure vendors quote, and ``latency_us`` the smallest-message 2-GPU time: the hardware JSON's
    ``linkGbps`` and ``linkLatencyUs`` (sources in each file's ``provenance``). The latency grows with log2(n), as
    the measured nccl-tests floors do (H100: 5.9 / 9.3 / 15.6 us for 2 / 4 / 8 GPUs; this rule: 5.9 / 11.8 /
    17.7). Peak link rates make this textbook estimate optimistic at large sizes (``metadata.json``,
    ``analytical_over_measured_at_max_size``: 0.99-1.06 for 8-GPU all-reduce on H20/H800/H100/H200, 0.6-0.8 for
    the other NVLink cases, 0.36-0.63 on 2-GPU PCIe boards, 0.05 on 8x L40S without P2P), so
    :class:`CollectivePredictor` scales its bandwidth term by the ring efficiency measured on other GPUs of the
    same link (:func:`pipeweave.collective_serving.ring_factor`), and below vLLM's custom all-reduce limit on
    NVLink uses the custom all-reduce model of :mod:`pipeweave.collective_serving` instead. A zero-byte message
    takes 0 ms.
    """
    latency, transfer = analytical_collective_terms(kind, size_bytes, num_workers, link_gbps, latency_us)
    return latency + transfer


def analytical_collective_terms(kind: str, size_bytes, num_workers, link_gbps: float, latency_us: float
                                ) -> tuple[np.ndarray, np.ndarray]:
    """(latency term, bandwidth term) of :func:`analytical_collective_ms`, in ms: their sum is the estimate."""
    _check_kind(kind)
    base, factor = fallback_kind(kind)
    if base != kind:
        return analytical_collective_terms(base, np.asarray(size_bytes, dtype=np.float64) * factor, num_workers,
                                           link_gbps, latency_us)
    if not link_gbps or link_gbps <= 0:
        raise ValueError(f"link_gbps must be a positive bandwidth in GB/s, got {link_gbps!r}")
    size, workers = np.broadcast_arrays(np.asarray(size_bytes, dtype=np.float64),
                                        np.asarray(num_workers, dtype=np.float64))
    _check_sizes(size)
    seconds_per_byte = 1.0 / (float(link_gbps) * 1e9)
    if kind == "all_reduce":
        if np.any(~np.isfinite(workers)) or np.any(workers < 1):
            raise ValueError("num_workers must be >= 1")
        transfer = 2.0 * (workers - 1.0) / workers * size * seconds_per_byte * 1e3
        latency = np.full(size.shape, float(latency_us) * 1e-3) * np.log2(np.maximum(workers, 2))
        idle = (workers <= 1) | (size == 0)
    else:
        transfer = size * seconds_per_byte * 1e3
        latency = np.full(size.shape, float(latency_us) * 1e-3)
        idle = size == 0
    return np.where(idle, 0.0, latency), np.where(idle, 0.0, transfer)


# ================================================================================================================
# model files: the interpolation model as JSON (read with numpy alone), forests as joblib (need scikit-learn)
# ================================================================================================================

MODEL_SUFFIXES = {"interp": ".json", "rf": ".joblib", "reference_rf": ".joblib"}


def model_file(gpu_dir: Path, kind: str, regressor: str) -> Path:
    """Where a model of ``regressor`` is written: ``<kind>_model.json`` (interp) or ``<kind>_model.joblib``."""
    return Path(gpu_dir) / f"{kind}_model{MODEL_SUFFIXES[regressor]}"


def find_model_file(gpu_dir: Path, kind: str) -> Path | None:
    """The model file of ``kind`` in ``gpu_dir`` (JSON preferred; training leaves only one), or None."""
    for suffix in dict.fromkeys(MODEL_SUFFIXES.values()):
        path = Path(gpu_dir) / f"{kind}_model{suffix}"
        if path.is_file():
            return path
    return None


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(KINDS)}")


def _check_sizes(size: np.ndarray) -> None:
    if np.any(~np.isfinite(size)) or np.any(size < 0):
        raise ValueError("size_bytes must be finite and non-negative")


def _features(regressor: str, size: np.ndarray, workers: np.ndarray) -> np.ndarray:
    if regressor == "reference_rf":
        return np.column_stack([size, workers]).astype(np.float64)
    return np.column_stack([np.log2(size), workers]).astype(np.float64)


def _curve_ms(model: dict, size: np.ndarray, workers: np.ndarray) -> np.ndarray:
    """Raw regressor output (no range handling); ``size`` already clipped to the measured range."""
    regressor = model["regressor"]
    if regressor == "interp":
        out = np.empty(len(size))
        for w, curve in model["curves"].items():
            mask = workers == w
            if mask.any():
                out[mask] = np.exp(np.interp(np.log2(size[mask]), curve["log2_size"], curve["log_time_ms"]))
        return out
    estimator = model["estimator"]
    pred = estimator.predict(_features(regressor, size, workers))
    return np.exp(pred) if model["target"] == "log_ms" else np.asarray(pred, dtype=np.float64)


def model_predict_ms(model: dict, size_bytes, num_workers) -> np.ndarray:
    """Predict with one loaded model dict; worker counts must be measured ones (checked by the caller)."""
    size = np.asarray(size_bytes, dtype=np.float64).ravel()
    workers = np.asarray(num_workers, dtype=np.int64).ravel()
    out = np.zeros(len(size))
    if not len(size):
        return out
    for w in np.unique(workers):
        ext = model["range"][int(w)]
        mask = (workers == w) & (size > 0)
        if not mask.any():
            continue
        s = size[mask]
        clipped = np.clip(s, ext["min_size_bytes"], ext["max_size_bytes"])
        t = _curve_ms(model, clipped, np.full(len(s), w))
        above = s > ext["max_size_bytes"]
        if above.any():
            t_max = _curve_ms(model, np.array([float(ext["max_size_bytes"])]), np.array([w]))[0]
            t[above] = t_max + (s[above] - ext["max_size_bytes"]) * ext["ms_per_byte"]
        out[mask] = t
    return out


# ================================================================================================================
# predictor
# ================================================================================================================

def collective_hardware_with_models(model_dir: str | Path = DEFAULT_COLLECTIVE_DIR) -> list[str]:
    """GPU stems that have at least one collective model file under ``model_dir``."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(p.name for p in model_dir.iterdir()
                  if p.is_dir() and any(find_model_file(p, k) for k in KINDS))


def hardware_covering(needed, model_dir: str | Path = DEFAULT_COLLECTIVE_DIR, registry=None) -> list[str]:
    """GPUs whose measured models cover every (kind, worker count) in ``needed``: what a hint may suggest
    (``registry``: the HardwareRegistry of the GPUs a user can name, hardware/'s by default)."""
    covering = []
    for stem in collective_hardware_with_models(model_dir):
        try:
            predictor = CollectivePredictor(stem if registry is None else registry.get(stem), model_dir)
        except (FileNotFoundError, ValueError):
            continue
        if all(predictor.available(kind) and workers in predictor.worker_counts(kind) for kind, workers in needed):
            covering.append(stem)
    return covering


class CollectivePredictor:
    """Collective times of one GPU (see the module docstring for the model, ranges and fixes)."""

    def __init__(self, hardware, model_dir: str | Path = DEFAULT_COLLECTIVE_DIR, allow_analytical: bool = False):
        """``hardware``: a GPU name of hardware/ (unknown names raise UnknownHardwareError, which lists the known
        GPUs) or a loaded HardwareSpec, e.g. one of another ``--hardware_dir``."""
        from analytical_model.hardware import HardwareSpec, load_hardware
        spec = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
        self.spec = spec
        self.hardware = spec.stem
        self.device_name = spec.name
        self.model_dir = Path(model_dir)
        self.allow_analytical = bool(allow_analytical)
        self.used_analytical: set[str] = set()
        self.models: dict[str, dict] = {}
        self.metadata: dict = {}
        gpu_dir = self.model_dir / self.hardware
        if not gpu_dir.is_dir():
            if not self.allow_analytical:
                have = collective_hardware_with_models(self.model_dir)
                raise FileNotFoundError(
                    f"no collective models for {self.hardware} ({self.device_name}) in {self.model_dir}; GPUs with "
                    f"collective models: {', '.join(have) if have else 'none'}; {TRAIN_HINT}, or {ANALYTICAL_HINT}")
            return
        meta_path = gpu_dir / METADATA_FILE
        if meta_path.is_file():
            self.metadata = _read_json(meta_path)
        for kind in KINDS:
            path = find_model_file(gpu_dir, kind)
            if path is not None:
                self.models[kind] = load_model(path)

    # --------------------------------------------------------------------------------------------------------
    def available(self, kind: str) -> bool:
        """Whether a measured model predicts ``kind`` (False does not mean predict_ms fails when allowed): its own,
        or that of the kind it falls back to (:func:`fallback_kind`)."""
        _check_kind(kind)
        return kind in self.models or fallback_kind(kind)[0] in self.models

    def worker_counts(self, kind: str) -> list[int]:
        """The worker counts a measured model predicts ``kind`` at (its own, or its fallback's elsewhere)."""
        _check_kind(kind)
        return sorted({int(w) for k in dict.fromkeys((kind, fallback_kind(kind)[0])) if k in self.models
                       for w in self.models[k]["range"]})

    def borrowed(self, kind: str, num_workers: int) -> str | None:
        """How ``kind`` at ``num_workers`` is predicted when this GPU did not measure it but measured the kind it falls
        back to (:func:`fallback_kind`), e.g. "all_reduce of half the bytes"; None where its own model covers it or
        it has no fallback."""
        base, factor = fallback_kind(kind)
        own = self.models.get(kind)
        if base == kind or (own is not None and int(num_workers) in own["range"]):
            return None
        return f"{base} of {'half the' if factor == 0.5 else f'{factor:g}x the'} bytes"

    def estimate_floor(self, kind: str, num_workers: int) -> tuple[int, ...]:
        """The measured worker counts whose faster time bounds the analytical estimate of ``kind`` at
        ``num_workers`` from below (:func:`floor_counts`): its own model's, else (an all-gather this GPU did not
        measure, estimated as its all-reduce) the all-reduce's."""
        model = self.models.get(kind, self.models.get(fallback_kind(kind)[0]))
        return floor_counts(sorted(model["range"]) if model is not None else [], int(num_workers))

    @cached_property
    def _serving(self) -> dict | None:
        """``serving.json`` of the model folder (read once); None for a folder without any trained model, which
        has nothing fitted and gives the plain textbook estimate."""
        if not collective_hardware_with_models(self.model_dir) and not (self.model_dir / SERVING_FILE).is_file():
            return None
        return read_serving(self.model_dir)

    @cached_property
    def _custom_allreduce_params(self):
        """This GPU's NVLink generation's custom all-reduce constants, or None."""
        link_type = self.spec.link_type
        if not link_type.startswith("nvlink") or self._serving is None:
            return None
        return custom_allreduce_params(self._serving.get("custom_allreduce", {}), link_type)

    @property
    def lacks_custom_allreduce_fit(self) -> bool:
        """Whether this NVLink GPU's analytical all-reduce estimate has no fitted custom all-reduce model for small
        messages (its model folder has nothing trained), so it is the plain ring estimate."""
        return self.spec.link_type.startswith("nvlink") and self._custom_allreduce_params is None

    def _ring_record(self) -> dict | None:
        """``serving.json``'s ``ring_efficiency`` (None for a folder without trained models); one written by an
        older pipeweave, without the factors or their interval, is refused with the command that rewrites it."""
        if self._serving is None:
            return None
        ring = self._serving.get("ring_efficiency")
        retrain = f"retrain with `python3 train_collective_rf.py --output_dir {self.model_dir}`"
        if not (isinstance(ring, dict) and "measured" in ring and isinstance(ring.get("interval"), dict)
                and all("pooled" in family for family in ring["interval"].values())):
            raise FileNotFoundError(
                f"{self.model_dir / SERVING_FILE} has no measured ring efficiency and interval (written by an older "
                f"pipeweave): {retrain}")
        entries = [*(m.get("factor") for m in ring["measured"]),
                   *(entry.get(end) for family in ring["interval"].values()
                     for entry in (family["pooled"], *family.get("by_count", {}).values()) for end in ("low", "high"))]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in entries) or \
                not all(m["factor"] > 0 for m in ring["measured"]):
            raise ValueError(f"{self.model_dir / SERVING_FILE}: ring_efficiency holds a factor or interval end that is "
                             f"not a finite number (factors above 0): {retrain}")
        return ring

    def ring_efficiency(self, kind: str, num_workers: int) -> tuple[float, str]:
        """(factor on the analytical estimate's bandwidth term, the other GPUs it was measured on) for this GPU's
        link: :func:`pipeweave.collective_serving.ring_factor` over ``serving.json``'s measured factors, this GPU's
        own left out (its estimate and interval stand for a GPU without measurements); 1 for a folder without
        trained models. The basis ends with :attr:`link_caveat` where the GPU has one, so that the estimate's
        WARNING and the output's record say it."""
        ring = self._ring_record()
        if ring is None:
            factor, basis = 1.0, f"textbook ring: {self.model_dir} has no trained collective models"
        else:
            kind = fallback_kind(kind)[0]
            workers = SEND_RECV_WORKERS if kind == "send_recv" else int(num_workers)
            factor, basis = ring_factor(ring["measured"], self.spec.link_type, kind, workers,
                                        exclude=self.hardware)
        return factor, basis if self.link_caveat is None else f"{basis}; {self.link_caveat}"

    @property
    def link_caveat(self) -> str | None:
        """Why the analytical estimate is optimistic for this GPU whatever the ring efficiency: a board without GPU
        peer-to-peer (``"p2p": false`` in its hardware JSON, GeForce) stages collectives through host memory, which
        the factors measured on P2P-capable GPUs of its link do not include. None for the others."""
        if self.spec.p2p:
            return None
        return (f"{self.hardware} has no GPU peer-to-peer, so its collectives go through host memory and this "
                f"estimate is optimistic")

    def analytical_interval(self, kind: str, num_workers: int) -> tuple[float, float] | None:
        """(low, high) factors of the 80 % interval of this GPU's analytical estimate of ``kind`` at ``num_workers``:
        the leave-one-GPU-out errors of the estimate on the measured GPUs of its link family at that worker count,
        or pooled over the family's kinds and worker counts where fewer than three GPUs measured it (``serving.json``,
        ``ring_efficiency.interval``); None for a folder without trained models or a link family without
        measurements (nothing was evaluated)."""
        ring = self._ring_record()
        family = None if ring is None else ring["interval"].get(link_family(self.spec.link_type))
        if family is None:
            return None
        kind = fallback_kind(kind)[0]
        workers = SEND_RECV_WORKERS if kind == "send_recv" else int(num_workers)
        entry = family["by_count"].get(f"{kind} x{workers}", family["pooled"])
        return float(np.exp(entry["low"])), float(np.exp(entry["high"]))

    def analytical_ms(self, kind: str, size_bytes, num_workers) -> np.ndarray:
        """Estimate from the hardware JSON's link, its bandwidth term scaled by the measured ring efficiency of
        the link (:meth:`ring_efficiency`); small NVLink all-reduces use the custom all-reduce model. A message is
        never slower than a larger one, which it could be padded to: where the modelled algorithm changes at a
        larger size (one- to two-stage, custom all-reduce to NCCL) and is faster there, that time bounds it."""
        base, factor = fallback_kind(kind)  # an all-gather's estimate is its all-reduce of half the bytes
        size, workers = np.broadcast_arrays(np.asarray(size_bytes, dtype=np.float64) * factor,
                                            np.asarray(num_workers))
        kind = base
        out = self._algorithm_ms(kind, size, workers)
        for switch in ALGORITHM_SWITCH_BYTES:
            below = (size > 0) & (size < switch)
            if below.any():
                out[below] = np.minimum(out[below], self._algorithm_ms(kind, np.full(below.sum(), float(switch)),
                                                                       workers[below]))
        return out

    def _algorithm_ms(self, kind: str, size: np.ndarray, workers: np.ndarray) -> np.ndarray:
        """:meth:`analytical_ms` of the algorithm each size runs with, before the padding bound."""
        spec = self.spec
        latency_ms, transfer_ms = analytical_collective_terms(kind, size, workers, spec.link_gbps,
                                                              spec.link_latency_us)
        factor = np.ones(size.shape)
        for count in np.unique(workers):
            factor[workers == count] = self.ring_efficiency(kind, int(count))[0]
        out = latency_ms + factor * transfer_ms
        params = self._custom_allreduce_params
        if kind == "all_reduce" and params is not None:
            custom = (size < CUSTOM_AR_MAX_BYTES) & np.isin(workers, CUSTOM_AR_WORLD_SIZES) & (size > 0)
            out = np.where(custom, custom_allreduce_ms(params, size, workers, spec.link_gbps), out)
        return out

    def predict_ms(self, kind: str, size_bytes, num_workers) -> np.ndarray:
        """Time in ms of one ``kind`` collective of ``size_bytes`` over ``num_workers`` GPUs (broadcast arrays).

        send_recv always uses 2 workers; one worker is no communication (0 ms). An all-gather this GPU did not
        measure at a worker count is its all-reduce of half the bytes (:func:`fallback_kind`). Unseen worker counts
        or a missing model raise unless the analytical estimate was allowed; then those entries are estimated
        analytically and ``kind`` joins ``used_analytical``.
        """
        _check_kind(kind)
        size, workers = np.broadcast_arrays(np.asarray(size_bytes, dtype=np.float64), np.asarray(num_workers))
        shape = size.shape
        size = size.ravel()
        _check_sizes(size)
        workers = workers.ravel()
        if kind == "send_recv":
            workers = np.full(len(size), SEND_RECV_WORKERS, dtype=np.int64)
        else:
            w = np.asarray(workers, dtype=np.float64)
            if np.any(~np.isfinite(w)) or np.any(w < 1) or np.any(w != np.round(w)):
                raise ValueError(f"num_workers must be positive integers, got {np.unique(workers)[:5].tolist()}")
            workers = w.astype(np.int64)
        out = np.zeros(len(size))
        model = self.models.get(kind)
        known = sorted(model["range"]) if model is not None else []
        trivial = (workers == 1) if kind != "send_recv" else np.zeros(len(size), dtype=bool)
        base, factor = fallback_kind(kind)
        borrowed = (~np.isin(workers, known) & ~trivial) if base != kind else np.zeros(len(size), dtype=bool)
        if borrowed.any():
            outer, self.used_analytical = self.used_analytical, set()
            try:
                out[borrowed] = self.predict_ms(base, size[borrowed] * factor, workers[borrowed])
            finally:  # an estimate that stood in here stood in for this kind
                estimated, self.used_analytical = self.used_analytical, outer
            if estimated:
                self.used_analytical.add(kind)
            if model is not None:  # and not faster than this kind's own measured counts around it
                self._hold_at_measured(out, borrowed, size, workers, model)
        rest = ~borrowed & ~trivial
        if not rest.any():
            return out.reshape(shape)
        if model is None:
            if not self.allow_analytical:
                raise FileNotFoundError(
                    f"no {kind} model for {self.hardware} in {self.model_dir / self.hardware} (models present: "
                    f"{', '.join(self.models) or 'none'}); {TRAIN_HINT}, or {ANALYTICAL_HINT}")
            self.used_analytical.add(kind)
            out[rest] = self.analytical_ms(kind, size[rest], workers[rest])
            return out.reshape(shape)
        unseen = rest & ~np.isin(workers, known)
        if unseen.any():
            if not self.allow_analytical:
                raise ValueError(
                    f"{self.hardware} {kind}: no measurements for num_workers "
                    f"{sorted(set(workers[unseen].tolist()))}; measured: {known}; "
                    f"to estimate the others, {ANALYTICAL_HINT}")
            self.used_analytical.add(kind)
            out[unseen] = self.analytical_ms(kind, size[unseen], workers[unseen])
            self._hold_at_measured(out, unseen, size, workers, model)
        seen = rest & ~unseen
        if seen.any():
            out[seen] = model_predict_ms(model, size[seen], workers[seen])
        return out.reshape(shape)

    @staticmethod
    def _hold_at_measured(out: np.ndarray, estimated: np.ndarray, size: np.ndarray, workers: np.ndarray,
                          model: dict) -> None:
        """Raise the ``estimated`` entries of ``out`` (worker counts ``model`` did not measure) to no less than the
        faster of its measured counts around them (:func:`floor_counts`)."""
        known = sorted(model["range"])
        for count in np.unique(workers[estimated]):
            bounds = floor_counts(known, int(count))
            if bounds:
                rows = estimated & (workers == count)
                floor = np.min([model_predict_ms(model, size[rows], np.full(int(rows.sum()), bound))
                                for bound in bounds], axis=0)
                out[rows] = np.maximum(out[rows], floor)


def floor_counts(known, num_workers: int) -> tuple[int, ...]:
    """The measured worker counts (``known``, sorted) whose faster time is the least an estimate at the unmeasured
    ``num_workers`` may take: the nearest below it and, where there is one, the nearest above; none below the
    smallest. More GPUs of the same box do not reduce faster than fewer did: the link's median factor alone made
    L40S at 16 GPUs 7x faster than its measured 8 (search_config ranked TP16 first), and at 6 GPUs 3.5x faster
    than its measured 4. Between two measured counts the faster one bounds it, since some boxes do reduce faster
    with more GPUs (H20 at 1 GiB: 8 GPUs 7 % faster than 4, NCCL's algorithms change with the count)."""
    below = [count for count in known if count < num_workers]
    above = [count for count in known if count > num_workers]
    return (below[-1], *above[:1]) if below else ()


def load_model(path: str | Path) -> dict:
    path = Path(path)
    if path.suffix == ".json":
        model = _model_from_json(_read_json(path))
    else:
        try:
            import joblib
        except ImportError:
            raise ValueError(f"{path}: a forest model needs scikit-learn and joblib (pip install '.[train]')") from None
        model = joblib.load(path)
    if not isinstance(model, dict) or model.get("format") != MODEL_FORMAT:
        raise ValueError(f"{path}: not a {MODEL_FORMAT} collective model (retrain with train_collective_rf.py)")
    return model


def _read_json(path: Path):
    """A model folder's JSON file; a damaged one is refused naming it (the decoder's message alone, "Expecting
    property name enclosed in double quotes: line 1 column 2", said nothing of which file)."""
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}): retrain with train_collective_rf.py") from None


def _model_from_json(data: dict) -> dict:
    if not isinstance(data, dict) or "range" not in data or "curves" not in data:
        return data  # rejected by the format check of load_model
    return {**data, "range": {int(w): ext for w, ext in data["range"].items()},
            "curves": {int(w): {name: np.asarray(values, dtype=np.float64) for name, values in curve.items()}
                       for w, curve in data["curves"].items()}}


__all__ = ["DEFAULT_COLLECTIVE_DIR", "KINDS", "FALLBACK_KINDS", "fallback_kind", "CollectivePredictor",
           "collective_hardware_with_models",
           "analytical_collective_ms", "model_predict_ms", "load_model"]
