"""The workload schema as code (docs/METHOD.md §6.4): typed entities shared by the generator and the aggregator.

A :class:`Workload` is a list of :class:`Iteration` objects; each iteration holds its operators by
:class:`Category`: lists of named :class:`GemmOp` (BF16 and FP8), at most one :class:`AttentionOp`,
:class:`ElementwiseOp` for RMSNorm and SiLU*Mul, lists of named :class:`MoeOp` (fused-MoE passes) and
:class:`QuantizeOp` (FP8 activation quantisation), and a list of named :class:`CollectiveOp`. Only the paper's
categories are written when the others are empty, and ``ep_size`` / ``dtype`` only when not 1 / bf16.
``Workload.from_dict`` validates a parsed JSON object (every error names the iteration and the field); every
entity checks its own fields when made, with the same checks and messages (naming the entity by its class and
name), so that an in-memory workload is refused where a file would be (an iteration without operators when it is
flattened for prediction, :class:`pipeweave.flatten.FlatWorkload`: an empty one may serve as a template);
``Workload.to_dict`` writes the JSON object with the keys in the artifact's order, so the generator's files
stay byte-identical to the artifact's.

The kernel categories map to registry operator classes through the registry's ``workload_key``
(:func:`analytical_model.registry.workload_operators`); each kernel entry's ``shape`` is the tuple of that
operator's shape columns.

Why one module above ~400 lines: the entities, their validators and the JSON reader/writer must change together
(a new category needs all three), and the reader's fast paths sit beside the entities they construct.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from enum import Enum
from functools import lru_cache
from operator import le
from pathlib import Path

from analytical_model.attention import resolve_attention_type
from analytical_model.operator_features import MOE_WEIGHT_TYPES
from pipeweave import validation
from pipeweave.cli import UserError
from pipeweave.paths import command


class WorkloadFormatError(UserError):
    """A workload that does not follow docs/METHOD.md §6.4; the message names the iteration and field."""


class Category(str, Enum):
    """The operator classes of a workload iteration, in output order (the keys under ``operators``)."""

    GEMM = "gemm"
    GEMM_FP8 = "gemm_fp8"
    ATTENTION = "attention"
    RMSNORM = "rmsnorm"
    SILUANDMUL = "siluandmul"
    MOE = "moe"
    QUANTIZE = "quantize"
    COMMUNICATION = "communication"


KERNEL_CATEGORIES = tuple(c for c in Category if c is not Category.COMMUNICATION)
#: the keys under "operators" (plain strings: the readers and the engine compare them many times)
CATEGORY_KEYS = tuple(c.value for c in Category)
_KERNEL_KEYS = tuple(c.value for c in KERNEL_CATEGORIES)
#: kernel categories that hold a list of named entries (the others hold at most one entry per iteration)
_LIST_KERNEL_KEYS = (Category.GEMM.value, Category.GEMM_FP8.value, Category.MOE.value, Category.QUANTIZE.value)
DTYPES = ("bf16", "fp8")
#: the fields each level and entry of a workload file may hold (what ``to_dict`` writes); any other is refused, since
#: a misspelt or misplaced one ("dtype" on a GEMM entry) would otherwise be ignored without a word
_WORKLOAD_FIELDS = frozenset(("model", "model_params", "tp_size", "pp_size", "ep_size", "dtype", "iterations"))
_ITERATION_FIELDS = frozenset(("iteration", "phase", "batch_size", "q_lengths", "kv_lengths", "num_tokens",
                               "operators"))
_GEMM_FIELDS = frozenset(("name", "type", "M", "N", "K", "count"))
_ATTENTION_FIELDS = frozenset(("attention_type", "bs", "q_lengths", "kv_lengths", "nh", "nkv", "hd", "count"))
_ELEMENTWISE_FIELDS = frozenset(("seq", "dim", "count"))
_QUANTIZE_FIELDS = frozenset(("name", "seq", "dim", "count"))
_MOE_FIELDS = frozenset(("name", "weight_type", "M", "E", "topk", "H", "N", "count"))
_COLLECTIVE_FIELDS = frozenset(("name", "type", "volume_bytes", "count"))
PHASES = ("prefill", "decode")
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "send_recv")
#: why an iteration without any operator entry is refused (by the file reader and for in-memory workloads)
NO_OPERATORS = "has no operators (an empty iteration would be predicted as 0 ms)"

# the limits of the entities' own checks (the reader's checks name the field and the limit; pipeweave.validation)
_TOKENS, _WIDTH, _COUNT = validation.MAX_TOKENS, validation.MAX_WIDTH, validation.MAX_COUNT
_BATCH, _HEADS, _CONTEXT = validation.MAX_BATCH, validation.MAX_HEADS, validation.MAX_CONTEXT
_HEAD_STEP, _HEAD_DIM, _VOLUME = validation.HEAD_DIM_STEP, validation.MAX_HEAD_DIM, validation.MAX_VOLUME_BYTES
_INT = frozenset((int,))  # _INT.issuperset(map(type, lengths)): every entry an int, at C speed
_SEQUENCES = (list, tuple)


def collective_kind(name: str, kind_type: str = "") -> str | None:
    """all_reduce / all_gather / send_recv from a communication entry's name and type (None if none of them)."""
    lowered, kind_type = name.lower(), str(kind_type).lower()
    if "all_reduce" in lowered or "allreduce" in lowered:  # the name first, then the type
        return "all_reduce"
    if "all_gather" in lowered or "allgather" in lowered:
        return "all_gather"
    if "send" in lowered or "recv" in lowered:
        return "send_recv"
    return {"all_gather": "all_gather", "p2p": "send_recv"}.get(kind_type)


def phase_problem(phase) -> str | None:
    """None for a known phase, else the reason."""
    return None if phase in PHASES else f"phase must be \"prefill\" or \"decode\", got {phase!r}"


@lru_cache(maxsize=64)
def _attention_type_problem(kind: str) -> str | None:
    try:
        resolve_attention_type(kind)
    except ValueError as exc:
        return str(exc)
    return None


def _refuse(op, check: str) -> None:
    """Raise the file reader's error for an in-memory entry whose own fast check failed: the same checks and
    messages, the entry named by its class (and name) where a file's error names its JSON path."""
    values = {f.name: getattr(op, f.name) for f in fields(op)}
    for key in ("q_lengths", "kv_lengths"):
        if type(values.get(key)) is tuple:  # the file's lists are the entity's tuples
            values[key] = list(values[key])
    reader_check = getattr(_Reader(None), check)
    if "name" not in values:
        reader_check(values, type(op).__name__)
        return
    name = values["name"]
    reader_check(values, f"{type(op).__name__}({name!r})" if isinstance(name, str) and name else type(op).__name__,
                 set())


# --------------------------------------------------------------------------------------------------
# entities (each checks its fields when made, so that an in-memory workload is refused as a file would be; the
# fast checks here are the reader's checks, which run, naming the field, only when these fail)
# --------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class GemmOp:
    name: str
    M: int
    N: int
    K: int
    count: int
    type: str | None = None  # the framework's layer class, informational

    def __post_init__(self):
        if not (type(self.name) is str and self.name and type(self.M) is int and 0 < self.M <= _TOKENS
                and type(self.N) is int and 0 < self.N <= _WIDTH and type(self.K) is int and 0 < self.K <= _WIDTH
                and type(self.count) is int and 0 < self.count <= _COUNT):
            _refuse(self, "check_gemm")

    @property
    def shape(self) -> tuple:
        return (self.M, self.N, self.K)

    def to_dict(self) -> dict:
        head = {"name": self.name} if self.type is None else {"name": self.name, "type": self.type}
        return {**head, "M": self.M, "N": self.N, "K": self.K, "count": self.count}


@dataclass(slots=True)
class AttentionOp:
    attention_type: str
    bs: int
    q_lengths: tuple[int, ...]
    kv_lengths: tuple[int, ...]
    nh: int
    nkv: int
    hd: int
    count: int

    def __post_init__(self):
        q, kv, bs, nh, nkv, hd = self.q_lengths, self.kv_lengths, self.bs, self.nh, self.nkv, self.hd
        if not (type(self.attention_type) is str and _attention_type_problem(self.attention_type) is None
                and type(bs) is int and 0 < bs <= _BATCH and type(nh) is int and 0 < nh <= _HEADS
                and type(nkv) is int and 0 < nkv <= _HEADS and nh % nkv == 0
                and type(hd) is int and 0 < hd <= _HEAD_DIM and hd % _HEAD_STEP == 0
                and type(self.count) is int and 0 < self.count <= _COUNT
                and type(q) in _SEQUENCES and type(kv) in _SEQUENCES and len(q) == bs == len(kv)
                and _INT.issuperset(map(type, q)) and _INT.issuperset(map(type, kv))
                and min(q) > 0 and all(map(le, q, kv)) and sum(q) <= _TOKENS and max(kv) <= _CONTEXT):
            _refuse(self, "check_attention")
        if type(q) is not tuple or type(kv) is not tuple:  # hashable: signature() keys the engine's memo
            self.q_lengths, self.kv_lengths = tuple(q), tuple(kv)

    @property
    def shape(self) -> tuple:
        return (self.attention_type, self.bs, self.q_lengths, self.kv_lengths, self.nh, self.nkv, self.hd)

    def to_dict(self) -> dict:
        return {"attention_type": self.attention_type, "bs": self.bs, "q_lengths": list(self.q_lengths),
                "kv_lengths": list(self.kv_lengths), "nh": self.nh, "nkv": self.nkv, "hd": self.hd,
                "count": self.count}


@dataclass(slots=True)
class ElementwiseOp:
    """RMSNorm or SiLU*Mul over ``seq`` rows of ``dim`` elements."""

    seq: int
    dim: int
    count: int

    def __post_init__(self):
        if not (type(self.seq) is int and 0 < self.seq <= _TOKENS and type(self.dim) is int
                and 0 < self.dim <= _WIDTH and type(self.count) is int and 0 < self.count <= _COUNT):
            _refuse(self, "check_elementwise")

    @property
    def shape(self) -> tuple:
        return (self.seq, self.dim)

    def to_dict(self) -> dict:
        return {"seq": self.seq, "dim": self.dim, "count": self.count}


@dataclass(slots=True)
class MoeOp:
    """A fused-MoE launch over ``M`` tokens routed top-``topk`` to ``E`` experts of width H -> ``N``:
    the gate/up pass (``w13``), the down pass (``w2``) or a whole ``layer`` (:mod:`pipeweave.moe`)."""

    name: str
    weight_type: str
    M: int
    E: int
    topk: int
    H: int
    N: int
    count: int

    def __post_init__(self):
        if not (type(self.name) is str and self.name and self.weight_type in MOE_WEIGHT_TYPES
                and type(self.M) is int and 0 < self.M <= _TOKENS and type(self.E) is int and 0 < self.E <= _HEADS
                and type(self.topk) is int and 0 < self.topk <= self.E and type(self.H) is int
                and 0 < self.H <= _WIDTH and type(self.N) is int and 0 < self.N <= _WIDTH
                and type(self.count) is int and 0 < self.count <= _COUNT):
            _refuse(self, "check_moe")

    @property
    def shape(self) -> tuple:
        return (self.weight_type, self.M, self.E, self.topk, self.H, self.N)

    def to_dict(self) -> dict:
        return {"name": self.name, "weight_type": self.weight_type, "M": self.M, "E": self.E, "topk": self.topk,
                "H": self.H, "N": self.N, "count": self.count}


@dataclass(slots=True)
class QuantizeOp(ElementwiseOp):
    """The BF16 -> FP8 conversion of an FP8 GEMM's input: ``seq`` rows of ``dim`` elements, named."""

    name: str = ""

    def __post_init__(self):
        if not (type(self.name) is str and self.name and type(self.seq) is int and 0 < self.seq <= _TOKENS
                and type(self.dim) is int and 0 < self.dim <= _WIDTH
                and type(self.count) is int and 0 < self.count <= _COUNT):
            _refuse(self, "check_quantize")

    def to_dict(self) -> dict:
        return {"name": self.name, **ElementwiseOp.to_dict(self)}


@dataclass(slots=True)
class CollectiveOp:
    name: str
    volume_bytes: int
    count: int
    type: str = ""

    def __post_init__(self):
        if not (type(self.name) is str and self.name and collective_kind(self.name, self.type) is not None
                and type(self.volume_bytes) is int and 0 < self.volume_bytes <= _VOLUME
                and type(self.count) is int and 0 < self.count <= _COUNT):
            _refuse(self, "check_collective")

    @property
    def kind(self) -> str:
        return collective_kind(self.name, self.type)

    def to_dict(self) -> dict:
        return {"name": self.name, "type": self.type, "volume_bytes": self.volume_bytes, "count": self.count}


@dataclass(slots=True)
class Iteration:
    """One forward pass. ``batch_size``, ``q_lengths``, ``kv_lengths`` and ``num_tokens`` describe the batch
    (written by the generator, not needed for prediction)."""

    phase: str
    iteration: int = 1
    gemm: list[GemmOp] = field(default_factory=list)
    attention: AttentionOp | None = None
    rmsnorm: ElementwiseOp | None = None
    siluandmul: ElementwiseOp | None = None
    communication: list[CollectiveOp] = field(default_factory=list)
    batch_size: int | None = None
    q_lengths: list[int] | None = None
    kv_lengths: list[int] | None = None
    num_tokens: int | None = None
    gemm_fp8: list[GemmOp] = field(default_factory=list)
    moe: list[MoeOp] = field(default_factory=list)
    quantize: list[QuantizeOp] = field(default_factory=list)

    def __post_init__(self):
        problem = phase_problem(self.phase)
        if problem:
            raise WorkloadFormatError(f"Iteration: {problem}")
        if not _is_pos_int(self.iteration):
            raise WorkloadFormatError(f"Iteration: iteration must be a positive integer, got {self.iteration!r}")
        # an in-memory step (the serving simulator's) may describe no batch: each field may be absent
        problem = batch_fields_problem(self.batch_size, self.q_lengths, self.kv_lengths, self.num_tokens)
        if problem:
            raise WorkloadFormatError(f"Iteration: {problem}")

    def kernels(self):
        """(category key, name or None, op) of every kernel entry, in output order."""
        for key in _KERNEL_KEYS:
            value = getattr(self, key)
            if key in _LIST_KERNEL_KEYS:
                for op in value:
                    yield key, op.name, op
            elif value is not None:
                yield key, None, value

    def signature(self) -> tuple:
        """A hashable key of everything that determines the iteration's predicted duration."""
        return (tuple((key, name, op.shape, op.count) for key, name, op in self.kernels()),
                tuple((op.kind, op.volume_bytes, op.count) for op in self.communication))

    def to_dict(self) -> dict:
        out: dict = {"iteration": self.iteration, "phase": self.phase}
        for key in ("batch_size", "q_lengths", "kv_lengths", "num_tokens"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        operators: dict = {"gemm": [op.to_dict() for op in self.gemm]}
        for key in _KERNEL_KEYS[1:]:
            value = getattr(self, key)
            if key in _LIST_KERNEL_KEYS:
                if value:
                    operators[key] = [op.to_dict() for op in value]
            elif value is not None:
                operators[key] = value.to_dict()
        operators["communication"] = [op.to_dict() for op in self.communication]
        out["operators"] = operators
        return out


@dataclass(slots=True)
class Workload:
    """A whole workload: iterations plus the parallelism they were generated for."""

    iterations: list[Iteration]
    model: str = "model"
    tp_size: int = 1
    pp_size: int = 1
    model_params: dict | None = None
    ep_size: int = 1  # expert-parallel size of an MoE model (pipeweave.moe)
    dtype: str = "bf16"  # weight dtype of the linear layers

    def __post_init__(self):
        """The reader's checks of the workload's own fields (its iterations check themselves)."""
        reader = _Reader(None)
        for key in ("tp_size", "pp_size", "ep_size"):
            value = getattr(self, key)
            if not _is_pos_int(value):
                reader.fail(f"Workload: {key} must be a positive integer, got {value!r}")
            reader.within_limit(value, key, "Workload")
        if self.dtype not in DTYPES:
            reader.fail(f"Workload: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    def to_dict(self) -> dict:
        head: dict = {"model": self.model}
        if self.model_params is not None:
            head["model_params"] = self.model_params
        head.update(tp_size=self.tp_size, pp_size=self.pp_size)
        if self.ep_size != 1:
            head["ep_size"] = self.ep_size
        if self.dtype != "bf16":
            head["dtype"] = self.dtype
        return {**head, "iterations": [it.to_dict() for it in self.iterations]}

    def to_json_bytes(self) -> bytes:
        """The artifact's serialization: 2-space indent, ASCII, no final newline."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=True).encode("ascii")

    @classmethod
    def from_dict(cls, data, source: str = "workload") -> "Workload":
        return _Reader(source).workload(data)


def read_workload(path: str | Path) -> Workload:
    """Read and validate a workload JSON file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadFormatError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise WorkloadFormatError(f"{path}: nested too deeply to be a workload") from None
    return Workload.from_dict(data, str(path))


# --------------------------------------------------------------------------------------------------
# validation: the checks that name the field
# --------------------------------------------------------------------------------------------------

def _is_pos_int(value) -> bool:
    return type(value) is int and value > 0


def _is_count(value) -> bool:
    return type(value) is int and value > 0


def batch_fields_problem(batch_size, q_lengths, kv_lengths, num_tokens) -> str | None:
    """None if an iteration's description of its batch (``batch_size``, ``q_lengths``, ``kv_lengths``,
    ``num_tokens``; each may be absent, None) is well-formed, else what is wrong. Prediction does not read them, but a
    file that holds them must not hold nonsense (a negative batch, lengths as strings) that other tools would read."""
    for key, value, limit in (("batch_size", batch_size, _BATCH), ("num_tokens", num_tokens, _TOKENS)):
        if value is not None and not (_is_pos_int(value) and value <= limit):
            return f"{key} must be a positive integer up to {limit:,}, got {value!r}"
    for key, value in (("q_lengths", q_lengths), ("kv_lengths", kv_lengths)):
        if value is None:
            continue
        if type(value) not in _SEQUENCES or not value:
            return f"{key} must be a non-empty list of positive integers"
        size = len(value) if batch_size is None else batch_size
        if len(value) == size and _INT.issuperset(map(type, value)) and min(value) > 0:  # at C speed
            continue
        return f"{key} {_int_list_problem(list(value), size, 'batch_size')}"
    return None


def _int_list_problem(value, bs: int, size_key: str = "bs") -> str | None:
    """None if ``value`` is a list of ``bs`` positive ints, else what is wrong (``size_key`` names ``bs``)."""
    if type(value) is not list:
        return "must be a list of positive integers"
    if len(value) != bs:
        return f"has {len(value)} entries but {size_key} is {bs}"
    for v in value:
        if type(v) is not int or v <= 0:
            return f"entries must be positive integers, got {v!r}"
    return None


class _Reader:
    """The checks that name the field: of a file's entries (``source`` its path) and, with ``source`` None, of an
    in-memory entry whose own check failed. The ``check_*`` methods only raise; the entry methods build the entities,
    through the entities' own checks first (the fast path of a valid file)."""

    def __init__(self, source: str | None):
        self.source = source

    def fail(self, message: str):
        raise WorkloadFormatError(message if self.source is None else f"{self.source}: {message}")

    def object(self, value, at: str, allowed: frozenset) -> dict:
        if not isinstance(value, dict):
            self.fail(f"{at} must be an object")
        self.known_fields(value, at, allowed)
        return value

    def known_fields(self, value: dict, at: str, allowed: frozenset) -> None:
        unknown = [key for key in value if key not in allowed]
        if unknown:
            self.fail(f"{at}: unknown field {unknown[0]!r} (a typo, or a field of another level?); "
                      f"this entry takes {', '.join(sorted(allowed, key=str.lower))}")

    def positive(self, op: dict, keys, at: str) -> None:
        for key in keys:
            if not _is_pos_int(op.get(key)):
                self.fail(f"{at}.{key} must be a positive integer, got {op.get(key)!r}")
            self.within_limit(op[key], key, at)

    def within_limit(self, value: int, key: str, at: str) -> None:
        problem = validation.limit_problem(key, value)
        if problem:
            self.fail(f"{at}.{problem}")

    def count(self, op: dict, at: str) -> int:
        if not _is_count(op.get("count")):
            self.fail(f"{at}.count must be a positive integer (an entry that never runs is left out), "
                      f"got {op.get('count')!r}")
        self.within_limit(op["count"], "count", at)
        return op["count"]

    def name(self, op: dict, at: str, names: set) -> str:
        name = op.get("name")
        if not isinstance(name, str) or not name:
            self.fail(f"{at}.name must be a non-empty string, got {name!r}")
        if name in names:
            self.fail(f"{at}.name {name!r} is used twice in this iteration")
        names.add(name)
        return name

    def named_list(self, operators: dict, key: str, where: str) -> list:
        entries = operators.get(key, [])
        if not isinstance(entries, list):
            self.fail(f"{where}: operators.{key} must be a list")
        return entries

    def workload(self, data) -> Workload:
        if not isinstance(data, dict):
            self.fail("expected a JSON object with an 'iterations' list")
        self.known_fields(data, "workload", _WORKLOAD_FIELDS)
        iterations = data.get("iterations")
        if not isinstance(iterations, list) or not iterations:
            self.fail("'iterations' must be a non-empty list")
        if len(iterations) > validation.MAX_ITERATIONS:
            self.fail(f"{len(iterations)} iterations exceed the limit {validation.MAX_ITERATIONS:,}")
        sizes = {}
        for key in ("tp_size", "pp_size", "ep_size"):
            value = data.get(key, 1)
            if not _is_pos_int(value):
                self.fail(f"{key} must be a positive integer, got {value!r}")
            self.within_limit(value, key, "workload")
            sizes[key] = value
        dtype = data.get("dtype", "bf16")
        if dtype not in DTYPES:
            self.fail(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        params = data.get("model_params")
        if params is not None and not isinstance(params, dict):
            self.fail(f"model_params must be an object, got {params!r}")
        model = data.get("model", Path(self.source).stem)
        if not isinstance(model, str):
            self.fail(f"model must be a string, got {model!r}")
        layers = (params or {}).get("num_hidden_layers")
        if _is_pos_int(layers) and sizes["pp_size"] > layers:
            self.fail(f"pp_size {sizes['pp_size']} exceeds model_params.num_hidden_layers {layers} (a pipeline stage "
                      f"holds at least one layer)")
        parsed = [self.iteration(it, position) for position, it in enumerate(iterations)]
        self.consistent(parsed, sizes["tp_size"], dtype)
        if params is not None:
            self.consistent_experts(parsed, params)
        return Workload(parsed, model=model, model_params=params, dtype=dtype, **sizes)

    def consistent(self, iterations: list[Iteration], tp_size: int, dtype: str) -> None:
        """Refuse the top-level fields that contradict the entries (hand edits): a TP collective with tp_size 1 (it
        would run over one GPU: 0 ms), and dtype "fp8" without an FP8 GEMM (the memory check would count every
        weight at one byte) or with fused-MoE layers (the MoE model knows BF16 layers only)."""
        for position, iteration in enumerate(iterations):
            where = f"iteration {position + 1}"
            if tp_size == 1:
                for index, op in enumerate(iteration.communication):
                    if op.kind != "send_recv":
                        self.fail(f"{where}: operators.communication[{index}] is an {op.kind} of the TP group, but "
                                  f"tp_size is 1 (over one GPU it would cost nothing): set tp_size or remove it")
            if dtype == "fp8" and iteration.moe:
                self.fail(f"{where}: dtype is 'fp8' but operators.moe holds fused-MoE layers, which pipeweave "
                          f"models in BF16 only ({command('workload_generator.py')} refuses FP8 MoE models)")
        if dtype == "fp8" and not any(iteration.gemm_fp8 for iteration in iterations):
            self.fail("dtype is 'fp8' but no iteration has an operators.gemm_fp8 entry: the memory check would count "
                      f"BF16 weights at one byte ({command('workload_generator.py')} --dtype fp8 writes both)")

    def consistent_experts(self, iterations: list[Iteration], params: dict) -> None:
        """Refuse ``model_params`` whose experts contradict the fused-MoE entries (hand edits): the memory check reads
        the experts from model_params, so without ``num_experts`` an MoE model's expert weights went uncounted."""
        experts, top_k = params.get("num_experts"), params.get("num_experts_per_tok")
        for position, iteration in enumerate(iterations):
            for index, op in enumerate(iteration.moe):
                at = f"iteration {position + 1}: operators.moe[{index}]"
                if experts is None:
                    self.fail(f"{at} is a fused-MoE layer, but model_params has no num_experts (the memory check "
                              f"would count a dense model's weights): add the model's MoE keys or regenerate it")
                if (op.E, op.topk) != (experts, top_k):
                    self.fail(f"{at} routes top-{op.topk} of E = {op.E} experts, but model_params says "
                              f"num_experts {experts!r}, num_experts_per_tok {top_k!r}")
        if experts is not None and not any(iteration.moe for iteration in iterations):
            self.fail(f"model_params.num_experts is {experts!r}, but no iteration has an operators.moe entry (the "
                      f"experts would not be predicted): remove the MoE keys or regenerate the workload")

    def iteration(self, iteration, position: int) -> Iteration:
        where = f"iteration {position + 1}"
        if not isinstance(iteration, dict):
            self.fail(f"{where}: must be an object")
        self.known_fields(iteration, where, _ITERATION_FIELDS)
        number = iteration.get("iteration", position + 1)
        if not _is_pos_int(number):
            self.fail(f"{where}: iteration must be a positive integer, got {number!r}")
        phase = iteration.get("phase")
        problem = phase_problem(phase)
        if problem:
            self.fail(f"{where}: {problem}")
        operators = iteration.get("operators")
        if not isinstance(operators, dict):
            self.fail(f"{where}: operators must be an object")
        unknown = [key for key in operators if key not in CATEGORY_KEYS]
        if unknown:
            from analytical_model.registry import workload_operators

            registered = (f"; {unknown[0]} is a registered operator, which enters workloads once "
                          f"pipeweave/schema.py reads its entries (README, 'Adding an operator')"
                          if unknown[0] in workload_operators() else "")
            self.fail(f"{where}: unknown operator class operators.{unknown[0]} (known: {', '.join(CATEGORY_KEYS)})"
                      + registered)
        batch = [iteration.get(key) for key in ("batch_size", "q_lengths", "kv_lengths", "num_tokens")]
        try:  # Iteration checks its description of the batch
            out = Iteration(phase, number, batch_size=batch[0], q_lengths=batch[1], kv_lengths=batch[2],
                            num_tokens=batch[3])
        except WorkloadFormatError as exc:  # said again, naming the iteration
            self.fail(f"{where}: {batch_fields_problem(*batch) or str(exc).removeprefix('Iteration: ')}")
        for key, read in (("gemm", self.gemm), ("gemm_fp8", self.gemm), ("moe", self.moe), ("quantize", self.quantize)):
            names = set()
            setattr(out, key, [read(op, f"{where}: operators.{key}[{i}]", names)
                               for i, op in enumerate(self.named_list(operators, key, where))])
        if "attention" in operators:
            out.attention = self.attention(operators["attention"], f"{where}: operators.attention")
        for key in ("rmsnorm", "siluandmul"):
            if key in operators:
                setattr(out, key, self.elementwise(operators[key], f"{where}: operators.{key}"))
        names = set()
        out.communication = [self.collective(op, f"{where}: operators.communication[{i}]", names)
                             for i, op in enumerate(self.named_list(operators, "communication", where))]
        if not out.communication and next(out.kernels(), None) is None:
            self.fail(f"{where}: {NO_OPERATORS}")
        return out

    def gemm(self, op, at: str, names: set) -> GemmOp:
        # each kind inlines its fast path (a well-formed entry, built at once): one helper taking the constructor as
        # a closure made reading a workload 13 % slower
        if type(op) is dict and op.keys() <= _GEMM_FIELDS:
            name = op.get("name")
            if type(name) is str and name not in names:
                try:
                    made = GemmOp(name, op.get("M"), op.get("N"), op.get("K"), op.get("count"), op.get("type"))
                except WorkloadFormatError:  # the checks below name the iteration and field
                    pass
                else:
                    names.add(name)
                    return made
        op = self.object(op, at, _GEMM_FIELDS)
        self.check_gemm(op, at, names)
        return GemmOp(op["name"], op["M"], op["N"], op["K"], op["count"], op.get("type"))

    def check_gemm(self, op: dict, at: str, names: set) -> None:
        self.name(op, at, names)
        self.positive(op, ("M", "N", "K"), at)
        self.count(op, at)

    def moe(self, op, at: str, names: set) -> MoeOp:
        op = self.object(op, at, _MOE_FIELDS)
        self.check_moe(op, at, names)
        return MoeOp(op["name"], op["weight_type"], op["M"], op["E"], op["topk"], op["H"], op["N"], op["count"])

    def check_moe(self, op: dict, at: str, names: set) -> None:
        self.name(op, at, names)
        if op.get("weight_type") not in MOE_WEIGHT_TYPES:
            self.fail(f"{at}.weight_type must be one of {', '.join(MOE_WEIGHT_TYPES)}, got {op.get('weight_type')!r}")
        self.positive(op, ("M", "E", "topk", "H", "N"), at)
        if op["topk"] > op["E"]:
            self.fail(f"{at}.topk = {op['topk']} exceeds E = {op['E']} (each token goes to topk of the E experts)")
        self.count(op, at)

    def quantize(self, op, at: str, names: set) -> QuantizeOp:
        op = self.object(op, at, _QUANTIZE_FIELDS)
        self.check_quantize(op, at, names)
        return QuantizeOp(op["seq"], op["dim"], op["count"], name=op["name"])

    def check_quantize(self, op: dict, at: str, names: set) -> None:
        self.name(op, at, names)
        self.positive(op, ("seq", "dim"), at)
        self.count(op, at)

    def attention(self, op, at: str) -> AttentionOp:
        if type(op) is dict and op.keys() <= _ATTENTION_FIELDS:
            try:
                return AttentionOp(op.get("attention_type"), op.get("bs"), op.get("q_lengths"), op.get("kv_lengths"),
                                   op.get("nh"), op.get("nkv"), op.get("hd"), op.get("count"))
            except WorkloadFormatError:  # the checks below name the iteration and field
                pass
        op = self.object(op, at, _ATTENTION_FIELDS)
        self.check_attention(op, at)
        return AttentionOp(op["attention_type"], op["bs"], op["q_lengths"], op["kv_lengths"], op["nh"], op["nkv"],
                           op["hd"], op["count"])

    def check_attention(self, op: dict, at: str) -> None:
        kind = op.get("attention_type")
        if not isinstance(kind, str):
            self.fail(f"{at}.attention_type must be a string, got {kind!r}")
        problem = _attention_type_problem(kind)
        if problem:
            self.fail(f"{at}.attention_type: {problem}")
        self.positive(op, ("bs", "nh", "nkv", "hd"), at)
        problem = validation.head_dim_problem(resolve_attention_type(kind)[0], op["hd"])
        if problem:
            self.fail(f"{at}.{problem}")
        if op["nh"] % op["nkv"]:
            self.fail(f"{at}: nh ({op['nh']}) must be divisible by nkv ({op['nkv']})")
        for key in ("q_lengths", "kv_lengths"):
            problem = _int_list_problem(op.get(key), op["bs"])
            if problem:
                self.fail(f"{at}.{key} {problem}")
        q, kv = op["q_lengths"], op["kv_lengths"]
        for j, (a, b) in enumerate(zip(q, kv)):
            if a > b:
                self.fail(f"{at}: q_lengths[{j}] = {a} exceeds kv_lengths[{j}] = {b}")
        problem = validation.lengths_problem(q, kv)
        if problem:
            self.fail(f"{at}: {problem}")
        self.count(op, at)

    def elementwise(self, op, at: str) -> ElementwiseOp:
        if type(op) is dict and op.keys() <= _ELEMENTWISE_FIELDS:
            try:
                return ElementwiseOp(op.get("seq"), op.get("dim"), op.get("count"))
            except WorkloadFormatError:  # the checks below name the iteration and field
                pass
        op = self.object(op, at, _ELEMENTWISE_FIELDS)
        self.check_elementwise(op, at)
        return ElementwiseOp(op["seq"], op["dim"], op["count"])

    def check_elementwise(self, op: dict, at: str) -> None:
        self.positive(op, ("seq", "dim"), at)
        self.count(op, at)

    def collective(self, op, at: str, names: set) -> CollectiveOp:
        if type(op) is dict and op.keys() <= _COLLECTIVE_FIELDS:
            name = op.get("name")
            if type(name) is str and name not in names:
                try:
                    made = CollectiveOp(name, op.get("volume_bytes"), op.get("count"), op.get("type", ""))
                except WorkloadFormatError:  # the checks below name the iteration and field
                    pass
                else:
                    names.add(name)
                    return made
        op = self.object(op, at, _COLLECTIVE_FIELDS)
        self.check_collective(op, at, names)
        return CollectiveOp(op["name"], op["volume_bytes"], op["count"], op.get("type", ""))

    def check_collective(self, op: dict, at: str, names: set) -> None:
        name = self.name(op, at, names)
        kind_type = op.get("type", "")
        if collective_kind(name, kind_type) is None:
            self.fail(f"{at}: unknown collective {name!r} (type {kind_type!r}); expected a name containing "
                      "'all_reduce' or 'all_gather' (or type 'all_gather'), or 'send'/'recv' or type 'p2p'")
        volume = op.get("volume_bytes")
        if type(volume) is not int or volume <= 0:
            self.fail(f"{at}.volume_bytes must be a positive integer, got {volume!r}")
        self.within_limit(volume, "volume_bytes", at)
        self.count(op, at)
