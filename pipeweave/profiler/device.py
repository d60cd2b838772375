"""The local GPU: name, library versions, clocks at measurement time, output folder, hardware-JSON skeleton.

Everything that touches torch or pynvml is imported lazily; the skeleton builder is a pure function of
a device-properties object so it can be tested without a GPU.
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from analytical_model.pipes import MEMORY_TYPES, HardwareSpec, architecture_for

NO_GPU_REASON = "no CUDA GPU visible: the driver reports none (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
NO_TORCH_REASON = "torch is not installed (pip install '.[train]')"
CPU_TORCH_REASON = ("torch {version} was built without CUDA (torch.version.cuda is None): install a CUDA build of "
                    "torch")
DRY_RUN_HINT = "profile_operators.py measures on the local GPU; use --dry_run to see the grid"
NO_CUDA_MESSAGE = f"{NO_GPU_REASON}; {DRY_RUN_HINT}"


def no_cuda_reason() -> str:
    """Why no CUDA GPU can be used, in the terms of its fix: torch missing, torch built without CUDA (a CPU wheel), or
    a CUDA torch whose driver sees no GPU. One message for all three sent users to the driver for a pip problem."""
    try:
        import torch
    except ImportError:
        return NO_TORCH_REASON
    if getattr(torch.version, "cuda", None) is None:
        return CPU_TORCH_REASON.format(version=getattr(torch, "__version__", ""))
    return NO_GPU_REASON


def no_cuda_message() -> str:
    """:func:`no_cuda_reason`, and what runs without a GPU."""
    return f"{no_cuda_reason()}; {DRY_RUN_HINT}"


def cuda_device_count() -> int:
    """Visible CUDA GPUs (0 when torch is missing or has no CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # broken driver installs raise here
        return 0


def library_versions() -> dict[str, str]:
    versions = {"torch_version": "", "cuda_version": "", "flash_attn_version": ""}
    try:
        import torch

        versions["torch_version"] = torch.__version__
        versions["cuda_version"] = torch.version.cuda or ""
    except ImportError:
        pass
    try:
        import flash_attn  # noqa: F401

        versions["flash_attn_version"] = getattr(flash_attn, "__version__", "unknown")
    except Exception:
        pass
    return versions


def nvml_handle(pynvml, device_index: int):
    """NVML's handle of CUDA device ``device_index``, found by the device's UUID, else its PCI address. An index
    would do only by chance: CUDA numbers GPUs fastest first (unless CUDA_DEVICE_ORDER=PCI_BUS_ID) and NVML by PCI
    bus, so on a machine of two kinds of GPU the clocks would be another GPU's. None where neither identifies it:
    no clocks rather than another GPU's."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except Exception:
            pass
    if getattr(props, "pci_bus_id", None) is not None:
        address = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        try:
            return pynvml.nvmlDeviceGetHandleByPciBusId(address)
        except Exception:
            pass
    return None


class ClockReader:
    """Current SM and memory clocks (MHz) through NVML; empty strings when pynvml is unavailable."""

    def __init__(self, device_index: int = 0):
        self._handle = None
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = nvml_handle(pynvml, device_index)
            self._nvml = pynvml if self._handle is not None else None
        except Exception:
            self._handle = None

    @property
    def available(self) -> bool:
        return self._handle is not None

    def read(self) -> tuple[int | str, int | str]:
        return self._sm_and_memory("nvmlDeviceGetClockInfo", "")

    def max_clocks(self) -> tuple[int | None, int | None]:
        return self._sm_and_memory("nvmlDeviceGetMaxClockInfo", None)

    def _sm_and_memory(self, query: str, missing):
        """The NVML clock function ``query`` for the SM and the memory clock; ``missing`` twice if NVML cannot say."""
        if self._handle is None:
            return missing, missing
        try:
            nvml = self._nvml
            clock = getattr(nvml, query)
            return clock(self._handle, nvml.NVML_CLOCK_SM), clock(self._handle, nvml.NVML_CLOCK_MEM)
        except Exception:
            return missing, missing

    def bus_width(self) -> int | None:
        if self._handle is None:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetMemoryBusWidth(self._handle))
        except Exception:
            return None


@dataclass
class DeviceInfo:
    """What every measured row records about the device and the software."""

    name: str
    versions: dict[str, str] = field(default_factory=dict)
    clocks: Callable[[], tuple] = lambda: ("", "")

    def row_fields(self) -> dict:
        sm, mem = self.clocks()
        return {
            "hardware": self.name,
            "torch_version": self.versions.get("torch_version", ""),
            "cuda_version": self.versions.get("cuda_version", ""),
            "flash_attn_version": self.versions.get("flash_attn_version", ""),
            "sm_clock_mhz": sm,
            "mem_clock_mhz": mem,
            "timestamp": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


def local_device_info(device_index: int = 0) -> DeviceInfo:
    import torch

    reader = ClockReader(device_index)
    return DeviceInfo(name=torch.cuda.get_device_name(device_index), versions=library_versions(), clocks=reader.read)


def sanitize(name: str) -> str:
    text = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")
    return text or "gpu"


def gpu_dir_name(device_name: str, hardware_dir: str | Path | None = None) -> str:
    """The ``hardware/`` file stem of this GPU when one matches its driver name, else a sanitized name."""
    try:
        from analytical_model.hardware import DEFAULT_HARDWARE_DIR, HardwareRegistry

        registry = HardwareRegistry(hardware_dir or DEFAULT_HARDWARE_DIR)
        if device_name in registry:
            return registry.get(device_name).stem
    except Exception:  # no or broken hardware folder: fall back to the driver name
        pass
    return sanitize(device_name)


def measured_dir(output_dir: str | Path, device_name: str, hardware_dir: str | Path | None = None) -> Path:
    """Where this GPU's measurements go under ``output_dir``: its :func:`gpu_dir_name` folder, or the folder of its
    sanitized driver name when only that one exists: measured before its hardware JSON was added, a rerun must resume
    there, not measure the whole grid again into a second folder."""
    chosen = Path(output_dir) / gpu_dir_name(device_name, hardware_dir)
    earlier = Path(output_dir) / sanitize(device_name)
    return earlier if not chosen.exists() and earlier.is_dir() else chosen


# ----------------------------------------------------------------------------------------------
# Hardware JSON skeleton (docs/METHOD.md §1.1)

# FP32 FMA lanes per SM by compute capability (CUDA programming guide throughput table);
# the special-function unit (XU) issues 16 results per clock per SM on every one of these.
_FMA_LANES = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128,
              (10, 0): 128, (10, 3): 128, (12, 0): 128, (12, 1): 128}
_XU_PER_SM = 16


def _kb(value) -> float | int | None:
    if not value:
        return None
    v = value / 1024
    return int(v) if v == int(v) else v


class _Skeleton:
    """The fields of a hardware JSON in writing order, with the ``TODO`` and ``CHECK`` lists beside them."""

    def __init__(self, data: dict):
        self.data = data
        self.todo: list[str] = []
        self.check: dict[str, str] = {}

    def set(self, key: str, value, check: str | None = None) -> None:
        """A value read from the driver, or derived by a rule (then ``check`` says which)."""
        self.data[key] = value
        if check is not None:
            self.check[key] = check

    def ask(self, key: str, text: str) -> None:
        """A field only the user can fill: a ``"TODO: …"`` string, listed under ``TODO``."""
        self.data[key] = f"TODO: {text}"
        self.todo.append(key)


def capability_refusal(major: int, minor: int) -> str | None:
    """Why ``analytical_model.hardware`` refuses a GPU of compute capability ``major.minor`` (None if it loads), by
    the loader's own two checks: an architecture class, and an SM occupancy limit the calculators know. A skeleton
    that can never load must say so rather than have the user fill it in (Volta, Turing; Orin's 8.7)."""
    capability = f"compute capability {major}.{minor}"
    arch = architecture_for(major, minor)
    if arch is None:
        return f"pipeweave cannot model this GPU's SM design: the analytical model has no class for {capability}"
    probe = HardwareSpec(stem="probe", name="probe", num_sms=1, sm_freq=1.0, mem_bandwidth=1.0, l2_cache_bandwidth=1.0,
                         shared_memory_bandwidth=1.0, tc_bf16=1.0, tc_fp8=0.0, xu_fp32=1.0, fma_fp32=1.0,
                         architecture=arch, compute_capability=(major, minor))
    try:
        probe.max_threads_per_sm
    except ValueError:
        return (f"pipeweave cannot model this GPU's SM design: its calculators know no occupancy limit for "
                f"{capability}")
    return None


def hardware_skeleton(props, *, max_sm_clock_mhz: int | None = None, max_mem_clock_mhz: int | None = None,
                      memory_bus_width: int | None = None, today: str | None = None) -> dict:
    """A hardware JSON for the device described by ``props`` (a ``torch.cuda.get_device_properties`` result).

    Fields the driver reports are filled in; fields it cannot know hold a ``"TODO: …"`` string (which
    ``analytical_model.hardware.parse_hardware`` rejects, since they must be numbers) and are listed under
    ``"TODO"``. Values derived by a rule rather than read are listed under ``"CHECK"``.
    """
    major, minor = int(props.major), int(props.minor)
    sm_clock = max_sm_clock_mhz or (int(getattr(props, "clock_rate", 0) or 0) // 1000) or None
    mem_clock = max_mem_clock_mhz or (int(getattr(props, "memory_clock_rate", 0) or 0) // 1000) or None
    bus_width = memory_bus_width or int(getattr(props, "memory_bus_width", 0) or 0) or None
    regs = int(getattr(props, "regs_per_multiprocessor", 0) or 0)

    out = _Skeleton({
        "name": props.name,
        "aliases": [],
        "totalGlobalMem": int(props.total_memory),
        "computeMajor": major,
        "computeMinor": minor,
        "numSms": int(props.multi_processor_count),
    })
    if mem_clock and bus_width:
        # Convention of the shipped files: memory clock × 2 (double data rate) × bus width / 8, in GB/s.
        out.set("memBandwidth", round(mem_clock * 2 * bus_width / 8 / 1000, 6),
                f"theoretical DRAM bandwidth from the driver: {mem_clock} MHz × 2 × {bus_width} bit / 8; "
                "compare with the vendor datasheet")
    else:
        out.ask("memBandwidth", "DRAM bandwidth in GB/s from the vendor datasheet")
    out.set("l1CacheSize", None, "not reported by the driver; optional and unused by the model (KB per SM)")
    smem = _kb(getattr(props, "shared_memory_per_multiprocessor", 0))
    if smem is not None:
        out.set("sharedMemorySize", smem)
    else:
        out.ask("sharedMemorySize", "shared memory per SM in KB")
    l2 = _kb(getattr(props, "L2_cache_size", 0))
    if l2 is not None:
        out.set("l2CacheSize", l2)
    else:  # required: the L2 ceiling of the physical band needs it
        out.ask("l2CacheSize", "L2 cache size in KB from the vendor datasheet")
    out.set("registerFileSize", _kb(regs * 4) if regs else None)
    out.ask("l2CacheBandwidth", "L2 bandwidth in GB/s (vendor figure or a measured L2-resident copy)")
    out.set("sharedMemoryBandwidth", 128, "32 banks × 4 bytes per clock per SM, as on every GPU in hardware/")
    out.ask("tcBf16", "dense BF16 tensor-core FLOP per clock per SM, a power of two (e.g. A100 2048, H100 4096)")
    if (major, minor) >= (8, 9):
        out.ask("tcFp8", "dense FP8 tensor-core FLOP per clock per SM, a power of two (usually 2 × tcBf16)")
    lanes = _FMA_LANES.get((major, minor))
    if lanes is not None:
        capability = f"for compute capability {major}.{minor}"
        out.set("xuFp32", _XU_PER_SM, f"special-function results per clock per SM {capability}")
        out.set("FmaFp32", lanes, f"FP32 FMA lanes per SM {capability}")
    else:
        out.ask("xuFp32", "special-function unit results per clock per SM")
        out.ask("FmaFp32", "FP32 FMA lanes per SM")
    if sm_clock:
        out.set("smFreq", sm_clock, "maximum SM clock reported by the driver, in MHz; the shipped files use the "
                                    "clock the vendor's dense tensor peak is quoted at (tcBf16 x numSms x smFreq = "
                                    "that peak; H100: 1830, not its 1980 boost), which may be lower")
    else:
        out.ask("smFreq", "SM clock in MHz at which the vendor quotes the dense tensor peak")
    arch = architecture_for(major, minor)
    refusal = capability_refusal(major, minor)
    if refusal:
        out.ask("architecture", f"none: {refusal}, so the loader refuses this file whatever is filled in")
    else:
        out.set("architecture", arch)
    out.ask("memoryType", f"DRAM type, one of {', '.join(MEMORY_TYPES)} (datasheet)")
    out.ask("linkType", "GPU-to-GPU interconnect: nvlink3/4/5 on SXM boards with NVSwitch, else pcie4/5")
    out.ask("linkGbps", "per-GPU, per-direction interconnect bandwidth in GB/s (half the bidirectional "
                        "datasheet figure: H100 SXM 450, PCIe Gen4 x16 32)")
    out.ask("linkLatencyUs", "smallest-message 2-GPU all-reduce time in us (measured; else 8 for NVLink, 6.1 for "
                             "PCIe, the medians of the shipped files)")
    date = today or _dt.date.today().isoformat()
    reader = "torch.cuda.get_device_properties" + (
        " and NVML" if max_sm_clock_mhz or max_mem_clock_mhz or memory_bus_width else "")
    provenance = {key: ("TODO: name the source (datasheet, whitepaper, measurement)" if key in out.todo
                        else f"{out.check[key]} ({reader}, {date})" if key in out.check
                        else f"driver ({reader}, {date})")
                  for key in out.data}
    return {**out.data, "provenance": provenance, "TODO": out.todo, "CHECK": out.check}


def local_hardware_skeleton(device_index: int = 0) -> dict:
    import torch

    props = torch.cuda.get_device_properties(device_index)
    reader = ClockReader(device_index)
    sm, mem = reader.max_clocks()
    return hardware_skeleton(props, max_sm_clock_mhz=sm, max_mem_clock_mhz=mem, memory_bus_width=reader.bus_width())
