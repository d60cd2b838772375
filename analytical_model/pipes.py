"""Hardware spec, pipe records and problem configurations shared by every calculator.

A *pipe* is the demand a kernel puts on one hardware pipeline (docs/METHOD.md §3.0):

* compute pipes (tensor, XU, FMA): ``all_ops, all_cycle, sm_max_ops, sm_max_cycle``;
* the memory pipe: ``global_in_flight, global_cycle, local_cycle, sm_max_in_flight,
  sm_max_global_cycle, sm_max_shared_cycle, sm_max_local_cycle``.

All helpers are vectorised: every argument may be a scalar or a NumPy array, and the
result has one row per problem.  Values are float64; the float32 cast that the models see
happens in :mod:`analytical_model.registry`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


def float32_sum(columns: np.ndarray) -> np.ndarray:
    """The row sums of cycle columns (rows x columns), cast to float32 and added left to right in float32: how
    C_ideal is summed from the ideal-cycle features (docs/METHOD.md §4.3), wherever it is computed."""
    columns = np.asarray(columns).astype(np.float32)
    total = columns[:, 0]
    for i in range(1, columns.shape[1]):
        total = total + columns[:, i]
    return total

COMPUTE_PIPE_FIELDS = ("all_ops", "all_cycle", "sm_max_ops", "sm_max_cycle")
MEMORY_FEATURES = (
    "global_in_flight",
    "global_cycle",
    "local_cycle",
    "sm_max_in_flight",
    "sm_max_global_cycle",
    "sm_max_shared_cycle",
    "sm_max_local_cycle",
)


def compute_pipe_names(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}_{name}" for name in COMPUTE_PIPE_FIELDS)


TENSOR_FEATURES = compute_pipe_names("tensor")
XU_FEATURES = compute_pipe_names("xu")
FMA_FEATURES = compute_pipe_names("fma")

ARCHITECTURES = ("ampere", "ada", "hopper", "blackwell")


def architecture_for(major: int, minor: int) -> str | None:
    """The architecture class of compute capability ``major.minor`` (None: not a class the analytical model knows,
    such as Volta or Turing)."""
    if major == 8:
        return "ada" if minor == 9 else "ampere"
    if major == 9:
        return "hopper"
    if major in (10, 11, 12):
        return "blackwell"
    return None

#: the compute capabilities whose SM the analytical model describes (:func:`resident_threads_per_sm`)
KNOWN_CAPABILITIES = "8.0, 8.6, 8.9, 9.0, 10.x, 12.x"


def resident_threads_per_sm(major: int, minor: int) -> int | None:
    """Resident threads an SM holds at full occupancy (CUDA C++ Programming Guide, technical specifications per
    compute capability): 1536 on the GDDR workstation/server parts 8.6, 8.9 and 12.x, 2048 on 8.0, 9.0, 10.x;
    None for a capability outside :data:`KNOWN_CAPABILITIES`."""
    if major == 12 or (major, minor) in ((8, 6), (8, 9)):
        return 1536
    if major == 10 or (major, minor) in ((8, 0), (9, 0)):
        return 2048
    return None


# GPU-to-GPU interconnect of a hardware JSON's ``linkType``: NVLink generation (through NVSwitch on SXM boards) or
# PCIe generation; the collective fallback (pipeweave.collectives) reads the family and the generation.
LINK_TYPES = ("nvlink2", "nvlink3", "nvlink4", "nvlink5", "nvlink6", "pcie3", "pcie4", "pcie5", "pcie6")
#: recorded only (the zero-shot experiments of pipeweave.transfer_ideas); the list catches typos, not new parts
MEMORY_TYPES = ("HBM2", "HBM2e", "HBM3", "HBM3e", "HBM4", "GDDR6", "GDDR6X", "GDDR7", "LPDDR5X")


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU as the analytical model sees it (docs/METHOD.md §1.1, snake_case)."""

    stem: str
    name: str
    num_sms: int
    sm_freq: float
    mem_bandwidth: float
    l2_cache_bandwidth: float
    shared_memory_bandwidth: float
    tc_bf16: float
    tc_fp8: float
    xu_fp32: float
    fma_fp32: float
    architecture: str
    compute_capability: tuple[int, int]
    shared_memory_size: float | None = None
    total_global_mem: int | None = None
    l2_cache_size: float | None = None
    aliases: tuple[str, ...] = field(default=())
    aiconfigurator_system: str | None = None
    memory_type: str | None = None
    link_type: str | None = None  # one of LINK_TYPES
    link_gbps: float | None = None  # per-GPU, per-direction GPU-to-GPU bandwidth, GB/s (10^9 B/s)
    link_latency_us: float | None = None  # smallest-message 2-GPU all-reduce, device time
    p2p: bool = True  # GPU peer-to-peer over the link; False (GeForce): collectives are staged through host memory
    boost_clock: float | None = None  # MHz, vendor maximum boost (smFreq is the clock of the tensor peak)
    tdp_w: float | None = None  # maximum board power, W

    @property
    def link_family(self) -> str | None:
        """"nvlink" or "pcie" (None when the JSON has no link)."""
        return None if self.link_type is None else self.link_type.rstrip("0123456789")

    @property
    def max_threads_per_sm(self) -> int:
        """Resident threads an SM holds at full occupancy (CUDA C++ Programming Guide, technical specifications per
        compute capability): 1536 on the GDDR workstation/server parts 8.6, 8.9 and 12.x, 2048 on 8.0, 9.0, 10.x."""
        threads = resident_threads_per_sm(*self.compute_capability)
        if threads is None:
            raise ValueError(f"{self.name}: no resident-thread limit known for compute capability "
                             f"{'.'.join(map(str, self.compute_capability))} (known: {KNOWN_CAPABILITIES})")
        return threads

    @property
    def uses_sm90_gemm(self) -> bool:
        """Hopper-style GEMM (TMA + asynchronous warpgroup MMA, persistent kernels).

        Datacenter Blackwell (compute capability 10.x, e.g. B200) keeps that programming model;
        the workstation/server Blackwell RTX PRO 6000 (12.x) uses Ampere-style mma.sync tiles.
        """
        if self.architecture == "hopper":
            return True
        return self.architecture == "blackwell" and self.compute_capability[0] == 10

    def spec_columns(self) -> dict[str, float]:
        """The eight hardware columns every dataset CSV carries (docs/METHOD.md §5.3)."""
        return {
            "tc_bf16": self.tc_bf16,
            "xu_fp32": self.xu_fp32,
            "fma_fp32": self.fma_fp32,
            "num_sms": self.num_sms,
            "sm_freq": self.sm_freq,
            "mem_bandwidth": self.mem_bandwidth,
            "l2_cache_bandwidth": self.l2_cache_bandwidth,
            "shared_memory_bandwidth": self.shared_memory_bandwidth,
        }


HARDWARE_SPEC_COLUMNS = (
    "tc_bf16",
    "xu_fp32",
    "fma_fp32",
    "num_sms",
    "sm_freq",
    "mem_bandwidth",
    "l2_cache_bandwidth",
    "shared_memory_bandwidth",
)


def ceil_div(x, y):
    """Ceiling division that also rounds toward +inf for negative numerators (docs/METHOD.md §0.3)."""
    return -((-x) // y)


def compute_pipe(total_ops, sm_max_ops, rate: float, num_sms: int) -> np.ndarray:
    """P(total_ops, sm_max_ops, rate) of docs/METHOD.md §3.0, one row per problem."""
    total = np.asarray(total_ops, dtype=np.float64)
    sm_max = np.asarray(sm_max_ops, dtype=np.float64)
    total, sm_max = np.broadcast_arrays(total, sm_max)
    return np.stack([total, total / rate / num_sms, sm_max, sm_max / rate], axis=-1)


def memory_pipe(bytes_total, bytes_sm_max, hw: HardwareSpec) -> np.ndarray:
    """M(B_total, B_sm) of docs/METHOD.md §3.0: KiB loaded and the cycles they take at each level."""
    kib_total = np.asarray(bytes_total, dtype=np.float64) / 1024
    kib_sm = np.asarray(bytes_sm_max, dtype=np.float64) / 1024
    kib_total, kib_sm = np.broadcast_arrays(kib_total, kib_sm)
    to_cycles = hw.sm_freq * 1e6
    mib = 1024 * 1024
    return np.stack(
        [
            kib_total,
            kib_total / hw.mem_bandwidth / mib * to_cycles,
            kib_total / hw.l2_cache_bandwidth / mib * to_cycles,
            kib_sm,
            kib_sm / (hw.mem_bandwidth / hw.num_sms) / mib * to_cycles,
            kib_sm * 1024 / hw.shared_memory_bandwidth,
            kib_sm / (hw.l2_cache_bandwidth / hw.num_sms) / mib * to_cycles,
        ],
        axis=-1,
    )


def uniform_sm_max(num_ctas, num_sms: int):
    """Largest per-SM CTA count when CTAs are dealt evenly over SMs (0 for no CTAs)."""
    return ceil_div(np.asarray(num_ctas, dtype=np.int64), num_sms)


def require_positive(name: str, value) -> None:
    arr = np.asarray(value)
    if arr.size and not np.all(arr > 0):
        raise ValueError(f"{name} must be a positive integer, got {arr[arr <= 0].ravel()[0].item()!r}")


def require_integral(name: str, value) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "b" or not np.all(np.isfinite(arr)) or not np.all(np.floor(arr) == arr):
            raise ValueError(f"{name} must be an integer, got {arr.ravel()[0]!r}")
        arr = arr.astype(np.int64)
    return arr.astype(np.int64)


def positive_int_array(name: str, value) -> np.ndarray:
    arr = require_integral(name, value)
    require_positive(name, arr)
    return arr


@dataclass(frozen=True)
class GemmProblem:
    """C[m×n] = A[m×k]·B[k×n] with the CTA tiling the kernel used (docs/METHOD.md §3.1). Array-valued."""

    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    tile_m: np.ndarray
    tile_n: np.ndarray
    tile_k: np.ndarray
    cta_count: np.ndarray
    is_split_k: np.ndarray
    data_size_bytes: int = 2

    @classmethod
    def create(cls, m, n, k, tile_m, tile_n, tile_k, cta_count, is_split_k=True, data_size_bytes=2):
        m, n, k = (positive_int_array(nm, v) for nm, v in (("M", m), ("N", n), ("K", k)))
        tiles = [positive_int_array(nm, v) for nm, v in (("tile_M", tile_m), ("tile_N", tile_n), ("tile_K", tile_k))]
        cta = positive_int_array("cta_count", cta_count)
        split = np.asarray(is_split_k).astype(bool)
        arrays = np.broadcast_arrays(m, n, k, *tiles, cta, split)
        return cls(*arrays, data_size_bytes=int(data_size_bytes))

    @property
    def m_tiles(self):
        return ceil_div(self.m, self.tile_m)

    @property
    def n_tiles(self):
        return ceil_div(self.n, self.tile_n)

    @property
    def k_padded(self):
        return ceil_div(self.k, self.tile_k) * self.tile_k

    @property
    def output_tiles(self):
        return self.m_tiles * self.n_tiles

    @property
    def flops_padded(self):
        return 2.0 * (self.m_tiles * self.tile_m) * (self.n_tiles * self.tile_n) * self.k_padded

    @property
    def bytes_total(self):
        """A and B each read once, on tile-padded extents."""
        k_p = self.k_padded
        return self.data_size_bytes * (self.m_tiles * self.tile_m * k_p + self.n_tiles * self.tile_n * k_p)

    def split_k_slice(self):
        """(splits, k_slice): K extent handled by one CTA when cta_count is read as a split-K grid."""
        splits = np.maximum(1, self.cta_count // self.output_tiles)
        k_slice = ceil_div(ceil_div(self.k_padded, splits), self.tile_k) * self.tile_k
        return splits, k_slice


ATTENTION_LAYOUTS = ("paged", "ragged")


@dataclass(frozen=True)
class AttentionProblem:
    """A batch of attention requests (docs/METHOD.md §3.5). One problem per kernel launch."""

    batch_size: int
    q_lengths: tuple[int, ...]
    kv_lengths: tuple[int, ...]
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    layout: str = "ragged"
    causal: bool = True
    data_size_q: int = 2
    data_size_kv: int = 2
    data_size_o: int = 2

    def __post_init__(self):
        for name in ("batch_size", "num_qo_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(value, 'item', lambda: value)()!r}")
        for name in ("q_lengths", "kv_lengths"):
            values = getattr(self, name)
            if len(values) != self.batch_size:
                raise ValueError(f"{name} has {len(values)} entries but batch_size is {self.batch_size}")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                    raise ValueError(f"{name} entries must be positive integers, got {v!r}")
            object.__setattr__(self, name, tuple(int(v) for v in values))
        for q, kv in zip(self.q_lengths, self.kv_lengths):
            if q > kv:
                raise ValueError(f"q_lengths entry {q} exceeds its kv_lengths entry {kv} (kv includes the new tokens)")
        if self.num_qo_heads % self.num_kv_heads:
            raise ValueError(
                f"nh ({self.num_qo_heads}) must be divisible by nkv ({self.num_kv_heads})"
            )
        if self.layout not in ATTENTION_LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(ATTENTION_LAYOUTS)}, got {self.layout!r}")


@dataclass(frozen=True)
class ElementwiseProblem:
    """RMSNorm / SiLU*Mul: one CTA per token row of ``dim`` elements. Array-valued."""

    rows: np.ndarray
    dim: np.ndarray
    dtype_size: int = 2

    @classmethod
    def create(cls, rows, dim, dtype_size=2):
        rows = positive_int_array("seq", rows)
        dim = positive_int_array("dim", dim)
        rows, dim = np.broadcast_arrays(rows, dim)
        return cls(rows, dim, int(dtype_size))


MOE_PASSES = ("w13", "w2")


@dataclass(frozen=True)
class MoeProblem:
    """One Triton fused-MoE GEMM pass (docs/METHOD.md §3.12). Array-valued except the pass type."""

    m: np.ndarray
    experts: np.ndarray
    top_k: np.ndarray
    hidden: np.ndarray
    inter: np.ndarray
    pass_type: str = "w13"
    data_size_bytes: int = 2

    @classmethod
    def create(cls, m, experts, top_k, hidden, inter, pass_type="w13", data_size_bytes=2):
        if pass_type not in MOE_PASSES:
            raise ValueError(f"weight_type must be one of {', '.join(MOE_PASSES)}, got {pass_type!r}")
        arrays = [
            positive_int_array(nm, v)
            for nm, v in (("M", m), ("E", experts), ("topk", top_k), ("H", hidden), ("N", inter))
        ]
        if np.any(arrays[2] > arrays[1]):
            raise ValueError("topk must not exceed the number of experts E")
        return cls(*np.broadcast_arrays(*arrays), pass_type=pass_type, data_size_bytes=int(data_size_bytes))


def stack_features(*blocks: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.atleast_2d(b) for b in blocks], axis=-1)


def row_kernel_features(problem: "ElementwiseProblem", fma_per_cta, xu_per_cta, hw: HardwareSpec) -> np.ndarray:
    """FMA, XU and memory pipes of an element-wise kernel with one CTA per token row (§3.10–3.11): CTAs dealt
    evenly over the SMs, each reading its row once."""
    ctas = problem.rows
    busiest = uniform_sm_max(ctas, hw.num_sms)
    row_bytes = problem.dim * problem.dtype_size
    return stack_features(
        compute_pipe(fma_per_cta * ctas, fma_per_cta * busiest, hw.fma_fp32, hw.num_sms),
        compute_pipe(xu_per_cta * ctas, xu_per_cta * busiest, hw.xu_fp32, hw.num_sms),
        memory_pipe(row_bytes * ctas, row_bytes * busiest, hw),
    )
