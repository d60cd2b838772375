"""Load and validate the GPU spec JSONs under ``hardware/`` (docs/METHOD.md §1).

A GPU can be named by its file stem ("H100", "RTX 6000 Ada" or "RTX_6000_Ada"), by the device
name the driver reports ("NVIDIA H100", "NVIDIA H100 80GB HBM3") or by aiconfigurator's system key
("h100_sxm"). Anything else is an error that lists the known GPUs, except the path of a JSON file (a name ending in
``.json``): that GPU joins the registry beside the folder's (:meth:`HardwareRegistry.add_file`), so that a GPU of
one's own needs one file and no copy of the folder.

Besides the analytical model's spec fields (docs/METHOD.md §1.1), every file carries what the collective fallback
needs (``linkType``: NVLink or PCIe generation, ``linkGbps``: per-GPU per-direction GPU-to-GPU bandwidth in GB/s,
``linkLatencyUs``: smallest-message 2-GPU all-reduce time; optionally ``p2p``: false for a board without GPU
peer-to-peer, whose collectives go through host memory), ``memoryType``, optionally ``boostClock`` and ``tdpW``,
and a ``provenance`` object naming the source of every field (datasheet, whitepaper, driver, measurement or a
stated estimate). A field without a source is an error.
"""
from __future__ import annotations

import difflib
import json
import math
import re
from functools import lru_cache
from pathlib import Path

from pipeweave.paths import DEFAULT_HARDWARE_DIR, data_root_note

from .pipes import (ARCHITECTURES, KNOWN_CAPABILITIES, LINK_TYPES, MEMORY_TYPES, HardwareSpec, architecture_for,
                    resident_threads_per_sm)


_REQUIRED_NUMBERS = {
    "numSms": "num_sms",
    "memBandwidth": "mem_bandwidth",
    "l2CacheBandwidth": "l2_cache_bandwidth",
    "sharedMemoryBandwidth": "shared_memory_bandwidth",
    "tcBf16": "tc_bf16",
    "xuFp32": "xu_fp32",
    "FmaFp32": "fma_fp32",
    "smFreq": "sm_freq",
    "linkGbps": "link_gbps",
    "linkLatencyUs": "link_latency_us",
    # required of a file although a HardwareSpec built in code may lack them: without them attention and MoE cannot
    # be predicted, nothing checks memory and no kernel is held to the DRAM time of bytes that spill the L2
    "sharedMemorySize": "shared_memory_size",
    "totalGlobalMem": "total_global_mem",
    "l2CacheSize": "l2_cache_size",
}
_OPTIONAL_NUMBERS = {"tcFp8": "tc_fp8", "l1CacheSize": None, "registerFileSize": None, "boostClock": "boost_clock",
                     "tdpW": "tdp_w"}
_CHOICES = {"linkType": LINK_TYPES, "memoryType": MEMORY_TYPES}
#: true/false fields and their default: ``p2p`` is false only where the vendor disables GPU peer-to-peer (GeForce)
_FLAGS = {"p2p": True}
# fields that describe the file rather than the GPU: no provenance entry needed
_UNSOURCED = ("provenance", "note")
# the other fields a file may have; anything else (a typo such as "tcFP8", whose value would be silently dropped)
# is an error
_DESCRIPTIVE = ("name", "aliases", "architecture", "computeMajor", "computeMinor", "aiconfiguratorSystem", "linkName")
#: what `profile_operators.py --hardware_json` leaves for the user to fill in and review; the file is done when both
#: lists are deleted
_SKELETON_LISTS = ("TODO", "CHECK")
#: physically plausible ranges (units as in the files), about 10x around every GPU shipped: a value outside is a
#: typo or a unit mistake that would give NaN, Infinity or 0 ms predictions downstream
PLAUSIBLE_RANGES = {
    "numSms": (1, 2048), "memBandwidth": (10, 100_000), "l2CacheBandwidth": (10, 1_000_000),
    "sharedMemoryBandwidth": (8, 4096), "tcBf16": (16, 65_536), "xuFp32": (1, 1024), "FmaFp32": (1, 4096),
    "smFreq": (100, 10_000), "tcFp8": (0, 131_072), "sharedMemorySize": (16, 8192),
    "totalGlobalMem": (2 ** 30, 2 ** 50), "l2CacheSize": (512, 2 ** 22), "l1CacheSize": (0, 65_536),
    "registerFileSize": (0, 65_536),
    "linkGbps": (1, 20_000), "linkLatencyUs": (0.1, 1000), "boostClock": (100, 10_000), "tdpW": (10, 10_000),
}


#: the most a GPU's link of each generation carries per direction, GB/s (x16 for PCIe; NVLink: V100 6, A100 12,
#: H100 18 links of 25 GB/s, B200 18 of 50, Rubin 3.6 TB/s bidirectional): more is the bidirectional figure or a unit slip
LINK_MAX_GBPS = {"nvlink2": 150, "nvlink3": 300, "nvlink4": 450, "nvlink5": 900, "nvlink6": 1800,
                 "pcie3": 16, "pcie4": 32, "pcie5": 64, "pcie6": 128}
#: the first compute capability with FP8 tensor cores (Ada; CUDA programming guide): below it a file has no tcFp8
FP8_CAPABILITY = (8, 9)


#: how alike (difflib ratio) an unknown GPU name and a known one must be for "did you mean" (besides the same model
#: numbers and the letter before them, which tell GPUs apart: RTX 5090 is not an RTX 4090, nor H800 PCIe an H100 PCIe)
SUGGEST_CUTOFF = 0.7


class UnknownHardwareError(ValueError):
    pass


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_hardware(data: dict, stem: str, source: str) -> HardwareSpec:
    """Validate one hardware JSON object; errors name the file and the field."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a JSON object")
    left = [key for key in _SKELETON_LISTS if key in data]
    if left:
        raise ValueError(f"{source}: still has the skeleton's {' and '.join(left)} list(s): fill in each TODO field "
                         f"from the vendor data sheet, review each CHECK field, then delete the lists")
    known = (*_REQUIRED_NUMBERS, *_OPTIONAL_NUMBERS, *_CHOICES, *_FLAGS, *_UNSOURCED, *_DESCRIPTIVE)
    unknown = sorted(key for key in data if key not in known)
    if unknown:
        raise ValueError(f"{source}: unknown field(s) {', '.join(map(repr, unknown))} (a typo? known fields: "
                         f"{', '.join(sorted(known))})")
    for key in _REQUIRED_NUMBERS:
        if key not in data:
            raise ValueError(f"{source}: missing field {key!r}")
        if not _is_number(data[key]) or data[key] <= 0:
            raise ValueError(f"{source}: field {key!r} must be a positive number, got {data[key]!r}")
    for key in _OPTIONAL_NUMBERS:
        if key in data and data[key] is not None and (not _is_number(data[key]) or data[key] < 0):
            raise ValueError(f"{source}: field {key!r} must be a non-negative number, got {data[key]!r}")
    for key, (low, high) in PLAUSIBLE_RANGES.items():
        value = data.get(key)
        if value is not None and not low <= value <= high:
            raise ValueError(f"{source}: field {key!r} = {value!r} is outside the plausible range [{low}, {high}] "
                             f"(check the value and its unit against the other files in hardware/)")
    _check_units(data, source)
    if data.get("boostClock") is not None and data["boostClock"] < data["smFreq"]:
        raise ValueError(f"{source}: field 'boostClock' = {data['boostClock']!r} is below smFreq = {data['smFreq']!r} "
                         f"(smFreq is the clock the tensor peak is quoted at, never above the boost clock)")
    if not isinstance(data["numSms"], int):
        raise ValueError(f"{source}: field 'numSms' must be an integer, got {data['numSms']!r}")
    for key in ("computeMajor", "computeMinor"):
        if key not in data:
            raise ValueError(f"{source}: missing field {key!r}")
        if not isinstance(data[key], int) or isinstance(data[key], bool):
            raise ValueError(f"{source}: field {key!r} must be an integer, got {data[key]!r}")
    for key, choices in _CHOICES.items():
        if data.get(key) not in choices:
            raise ValueError(f"{source}: field {key!r} must be one of {', '.join(choices)}, got {data.get(key)!r}")
    for key in _FLAGS:
        if key in data and not isinstance(data[key], bool):
            raise ValueError(f"{source}: field {key!r} must be true or false, got {data[key]!r}")
    _check_provenance(data, source)
    name = data.get("name", stem)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{source}: field 'name' must be a non-empty string")
    capability = f"{data['computeMajor']}.{data['computeMinor']}"
    derived = architecture_for(data["computeMajor"], data["computeMinor"])
    if derived is None or resident_threads_per_sm(data["computeMajor"], data["computeMinor"]) is None:
        raise ValueError(f"{source}: compute capability {capability} is not one the analytical model describes "
                         f"({KNOWN_CAPABILITIES}: {', '.join(ARCHITECTURES)})")
    if data.get("tcFp8") and (data["computeMajor"], data["computeMinor"]) < FP8_CAPABILITY:
        # a copy of an FP8 part's file edited into an Ampere GPU (an A800 from H100.json) predicted FP8 GEMMs there
        raise ValueError(f"{source}: field 'tcFp8' = {data['tcFp8']!r}, but compute capability {capability} has no "
                         f"FP8 tensor cores (FP8 needs {'.'.join(map(str, FP8_CAPABILITY))} or later): remove the "
                         f"field and its provenance entry")
    architecture = data.get("architecture", derived)
    if not isinstance(architecture, str) or architecture.lower() not in ARCHITECTURES:
        raise ValueError(f"{source}: field 'architecture' must be one of {', '.join(ARCHITECTURES)}, "
                         f"got {architecture!r}")
    if architecture.lower() != derived:
        raise ValueError(f"{source}: field 'architecture' is {architecture!r}, but compute capability {capability} "
                         f"is {derived!r}")
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ValueError(f"{source}: field 'aliases' must be a list of strings")
    system = data.get("aiconfiguratorSystem")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"{source}: field 'aiconfiguratorSystem' must be a string")
    spec_kwargs = {internal: data[key] for key, internal in _REQUIRED_NUMBERS.items()}
    spec_kwargs.update({internal: data.get(key) for key, internal in _OPTIONAL_NUMBERS.items() if internal})
    spec_kwargs["tc_fp8"] = spec_kwargs["tc_fp8"] or 0
    spec = HardwareSpec(
        stem=stem,
        name=name,
        architecture=architecture.lower(),
        compute_capability=(data["computeMajor"], data["computeMinor"]),
        aliases=tuple(aliases),
        aiconfigurator_system=system,
        memory_type=data["memoryType"],
        link_type=data["linkType"],
        p2p=data.get("p2p", _FLAGS["p2p"]),
        **spec_kwargs,
    )
    try:  # every calculator needs the SM's occupancy limit: a compute capability without one fails here, not later
        spec.max_threads_per_sm
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return spec


def _check_units(data: dict, source: str) -> None:
    """Relations every GPU satisfies, which catch a figure in the wrong unit that the plausible ranges let through: a
    vendor TFLOPS figure as the per-SM rate, an L2 bandwidth in TB/s, the bidirectional link figure."""
    fma, bf16, fp8 = data["FmaFp32"], data["tcBf16"], data.get("tcFp8")
    if bf16 < 4 * fma:  # the half-rate parts (GeForce, L40, L20) sit at 4 x FmaFp32: twice the FMA pipe's 2 FLOP/lane
        raise ValueError(f"{source}: field 'tcBf16' = {bf16!r} is below 4 x FmaFp32 = {4 * fma!r}, twice the FP32 "
                         f"FMA pipe's FLOP rate, which every tensor core reaches: tcBf16 is dense BF16 FLOP per clock "
                         f"per SM (the vendor's dense TFLOPS x 1e6 / (numSms x smFreq in MHz)), not the TFLOPS figure")
    if fp8 and fp8 < bf16:
        raise ValueError(f"{source}: field 'tcFp8' = {fp8!r} is below tcBf16 = {bf16!r}: FP8 runs at least at the BF16 "
                         f"rate (twice it on every FP8 part); tcFp8 is dense FP8 FLOP per clock per SM, not TFLOPS")
    if data["l2CacheBandwidth"] < data["memBandwidth"]:
        raise ValueError(f"{source}: field 'l2CacheBandwidth' = {data['l2CacheBandwidth']!r} is below memBandwidth = "
                         f"{data['memBandwidth']!r}: the L2 is faster than DRAM on every GPU (both in GB/s)")
    ceiling = LINK_MAX_GBPS.get(data["linkType"])
    if ceiling is not None and data["linkGbps"] > ceiling:
        raise ValueError(f"{source}: field 'linkGbps' = {data['linkGbps']!r} is above the {ceiling} GB/s per GPU and "
                         f"direction of {data['linkType']}: give half the bidirectional datasheet figure")


def _check_provenance(data: dict, source: str) -> None:
    """Every field must name its source (a datasheet, a whitepaper, a measurement, an estimate and why)."""
    provenance = data.get("provenance")
    if not isinstance(provenance, dict):
        raise ValueError(f"{source}: field 'provenance' must be an object mapping every field to its source")
    missing = [key for key in data if key not in _UNSOURCED
               and (not isinstance(provenance.get(key), str) or not provenance[key].strip()
                    or provenance[key].strip().lower().startswith("todo"))]
    if missing:
        raise ValueError(f"{source}: 'provenance' has no source for field(s) {', '.join(missing)}")
    unknown = [key for key in provenance if key not in data]
    if unknown:
        raise ValueError(f"{source}: 'provenance' names field(s) the file does not have: {', '.join(unknown)}")


def _normalise(key: str) -> str:
    return " ".join(key.replace("_", " ").split()).casefold()


def read_hardware_file(path: Path) -> HardwareSpec:
    """The validated spec of one hardware JSON file (errors name the file and the field)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_without_repeated_keys)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: invalid JSON ({type(exc).__name__}: {exc})") from None
    except RepeatedKeyError as exc:
        raise ValueError(f"{path}: field {exc.key!r} is given twice; JSON keeps only the last value, so one "
                         f"of the two would be lost without a word: remove one") from None
    return parse_hardware(data, path.stem, str(path))


def is_hardware_file(name: str) -> bool:
    """Whether a GPU name given on a command line is the path of a hardware JSON file."""
    return str(name).strip().lower().endswith(".json")


def hardware_files(names) -> tuple[str, ...]:
    """The resolved paths of the hardware JSON files among GPU names ``names`` (a comma list or an iterable), in
    order, each once: what a process that resolves the names elsewhere (a Dask worker) must add to its registry,
    and what an output must not overwrite."""
    if names is None:
        return ()
    if isinstance(names, str):
        names = names.split(",")
    return tuple(dict.fromkeys(str(Path(name.strip()).resolve()) for name in names if is_hardware_file(name)))


class HardwareRegistry:
    """All GPUs of one hardware directory, addressable by any of their names, and the GPUs of single files added
    to it (:meth:`add_file`)."""

    def __init__(self, hardware_dir: str | Path = DEFAULT_HARDWARE_DIR):
        self.hardware_dir = Path(hardware_dir)
        if not self.hardware_dir.is_dir():
            raise FileNotFoundError(f"hardware directory not found: {self.hardware_dir}"
                                    f"{data_root_note(self.hardware_dir)}")
        #: the folder's GPUs by file stem (what ``known`` lists and ``all`` expands to)
        self.specs: dict[str, HardwareSpec] = {}
        #: GPUs of single files added with :meth:`add_file`, by file stem, and those files (resolved) by stem
        self.added: dict[str, HardwareSpec] = {}
        self.added_files: dict[str, Path] = {}
        self._file_states: dict[str, tuple[int, int]] = {}  # stem -> (mtime in ns, size) of its file when read
        self._index: dict[str, str] = {}
        self._claimed: dict[str, str] = {}  # normalised name -> which file claims it, and as what
        for path in sorted(self.hardware_dir.glob("*.json")):
            spec = read_hardware_file(path)
            # both files named: the one loaded first (by sort order) is as likely to be the edited one
            self._register(spec, path, "change one of the two files")
            self.specs[spec.stem] = spec
        if not self.specs:
            raise FileNotFoundError(f"no hardware JSON files in {self.hardware_dir}")

    def _register(self, spec: HardwareSpec, path: Path, remedy: str) -> None:
        """Index ``spec`` (read from ``path``) by every name it has; a name another GPU has is an error."""
        keys = [(spec.stem, "file name"), (spec.name, "name"), *((alias, "alias") for alias in spec.aliases)]
        if spec.aiconfigurator_system:
            keys.append((spec.aiconfigurator_system, "aiconfiguratorSystem"))
        for key, field in keys:
            norm = _normalise(key)
            if self._index.get(norm, spec.stem) != spec.stem:
                raise ValueError(f"{path}: its {field} {key!r} is also {self._claimed[norm]}; a name may belong to one "
                                 f"GPU only: {remedy}")
        for key, field in keys:
            norm = _normalise(key)
            self._index[norm] = spec.stem
            self._claimed.setdefault(norm, f"the {field} {key!r} of {path.name}")

    def add_file(self, path: str | Path) -> HardwareSpec:
        """The GPU of the hardware JSON file ``path`` (any folder), added to this registry beside the folder's GPUs
        under its names, as a GPU of the folder would be: a GPU of one's own needs that one file. A name of another
        GPU (a copy of a shipped file, its ``aliases`` or ``aiconfiguratorSystem`` kept) is an error: the models
        know a GPU by its name. Adding the same file again returns its GPU, read again if the file changed since."""
        path = Path(str(path).strip())
        if not path.is_file():
            raise UnknownHardwareError(f"hardware file {path} not found (a GPU name ending in .json is read as the "
                                       f"path of a hardware JSON file)")
        resolved, state = path.resolve(), (path.stat().st_mtime_ns, path.stat().st_size)
        if resolved.parent == self.hardware_dir.resolve() and resolved.stem in self.specs:
            return self.specs[resolved.stem]  # a file of the folder itself
        for stem, added in list(self.added_files.items()):
            if added == resolved:
                if self._file_states[stem] == state:
                    return self.added[stem]
                self._forget(stem)  # edited since: its names may have changed too
        spec = read_hardware_file(path)
        remedy = (f"give {path.name} a file name, 'name' and aliases of its own (an unchanged copy of a GPU of "
                  f"{self.hardware_dir} is that GPU: name it instead; an edited one is another GPU)")
        if spec.stem in self.specs or spec.stem in self.added:  # a file stem names one GPU, as a name does
            owner = self.specs.get(spec.stem) or self.added[spec.stem]
            raise ValueError(f"{path}: its file name {spec.stem!r} is also the file name {owner.stem!r} of "
                             f"{owner.stem}.json; a name may belong to one GPU only: {remedy}")
        self._register(spec, path, remedy)
        self.added[spec.stem], self.added_files[spec.stem], self._file_states[spec.stem] = spec, resolved, state
        return spec

    def _forget(self, stem: str) -> None:
        """Take the added GPU ``stem`` and its names out of the registry."""
        for norm in [norm for norm, owner in self._index.items() if owner == stem]:
            del self._index[norm], self._claimed[norm]
        del self.added[stem], self.added_files[stem], self._file_states[stem]

    def known(self) -> list[str]:
        return sorted(self.specs)

    def get(self, name: str) -> HardwareSpec:
        stem = self._index.get(_normalise(str(name)))
        if stem is None and is_hardware_file(name):
            return self.add_file(name)
        if stem is None:
            raise UnknownHardwareError(
                f"unknown GPU {name!r}; {self._did_you_mean(str(name))}known GPUs (file stems in "
                f"{self.hardware_dir}; a GPU of one's own: the path of its JSON file): " + ", ".join(self.known())
            )
        return self.specs[stem] if stem in self.specs else self.added[stem]

    def _did_you_mean(self, name: str) -> str:
        """The clause "did you mean 'RTX 4090'? " naming the GPUs (at most three) whose names are close to ``name``
        once case, spaces, underscores and hyphens are ignored ("RTX4090", "h100-pcie") and that carry the same
        numbers, the same letters joined to the first of them in its word, the vendor's words aside (GB200 is not a
        B200, but A6000 is the RTX A6000), and the same letters after them (or ones the query abbreviates: "PCI" for
        "PCIe"), else "": the full list alone hides the one meant, and a suggestion of another GPU (RTX 4090 for
        "RTX 5090") would mislead."""
        def squash(text: str) -> str:
            return re.sub(r"[\s_-]", "", text.lower())

        def identity(text: str) -> tuple:  # the numbers, and the letters joined to the first (H100 is not A100)
            words = re.sub("nvidia|geforce|quadro|rtx", " ", text.lower())
            joined = re.search(r"([a-z]*)\d", words)
            return re.findall(r"\d+", squash(words)), joined.group(1) if joined else ""

        def suffix(text: str) -> str:  # the letters after the last number: NVL, G, D, Ada name other GPUs
            return re.sub(r"^.*\d", "", squash(text))

        def same_gpu(key: str, query: str) -> bool:
            tail = suffix(query)
            return identity(key) == identity(query) and (suffix(key) == tail or bool(tail)
                                                         and suffix(key).startswith(tail))

        keys = {squash(key): key for key in self._index}  # the names as written (spaces kept), by squashed form
        query = squash(name)
        close = [query] if query in keys else [
            key for key in difflib.get_close_matches(query, keys, n=10, cutoff=SUGGEST_CUTOFF)
            if same_gpu(keys[key], name)]
        stems = list(dict.fromkeys(self._index[keys[key]] for key in close))[:3]
        if not stems:
            return ""
        quoted = [repr(stem) for stem in stems]
        listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        return f"did you mean {listed}? "

    def __contains__(self, name: str) -> bool:
        return _normalise(str(name)) in self._index


class RepeatedKeyError(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _without_repeated_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's dict that refuses a key written twice (a hand-edited spec's copy-paste slip)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise RepeatedKeyError(key)
        out[key] = value
    return out


@lru_cache(maxsize=8)
def hardware_registry(hardware_dir: str | Path = DEFAULT_HARDWARE_DIR) -> HardwareRegistry:
    return HardwareRegistry(hardware_dir)


def load_hardware(name: str, hardware_dir: str | Path = DEFAULT_HARDWARE_DIR) -> HardwareSpec:
    return hardware_registry(Path(hardware_dir)).get(name)
