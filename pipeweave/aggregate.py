"""End-to-end latency prediction of a workload on a GPU (METHOD.md §7): the logic behind ``aggregator.py``.

A workload JSON (§6.4) lists iterations (one prefill, then decode steps), each with its operators
(GEMMs, one attention launch, RMSNorm, SiLU*Mul, collectives) and their repeat counts. For each
(workload, GPU) pair the predicted duration of every operator instance is

* a kernel (gemm / attention / rmsnorm / siluandmul): analytical features on that GPU → float32 →
  log1p → the operator's MLP → efficiency → ``C_ideal / (efficiency × f_SM)`` (§4.3);
* a collective: the collective model of a GPU (:mod:`pipeweave.collectives`); all-reduce with
  ``num_workers = tp_size``, send/recv with ``num_workers = 2`` (a pipeline-stage boundary is a
  two-party transfer; fix of quirk §11.3.19).

Iteration duration = Σ single × count (unrounded); summary: prefill, mean and total of the decode
iterations, total. Output JSON keys and order follow §7.5.

**Speed.** Nothing is computed per iteration: every operator instance of every requested pair is
gathered first, identical shapes are deduplicated per (operator class, GPU), features are computed
vectorised once per operator class (FA2 attention through the batched path of
:mod:`analytical_model.fa2_batch`, bit-identical to the per-launch calculator), each MLP runs once on
its whole batch, collectives are predicted once per distinct message, and the results are scattered
back with index arrays. ``python3 -m benchmarks.aggregator`` times it.

**Fixes of METHOD.md §11.3** (all deliberate):

* no GEMM tile lookup in a 130 MB CSV: tiles come from the registry's deterministic tile rule (16);
* no hard-coded hardware fallback table, no silently dropped operator (17): an unknown GPU, an
  operator class without a model, an unknown operator key or a malformed workload is an error;
* no silent 0 ms for communication (18): a workload with collectives needs a usable collective model
  (of the prediction GPU, or of ``--collective_hardware GPU``) or the explicit, visibly warned
  ``--collective_estimate analytical``; otherwise it is an error naming both flags;
* send/recv with 2 workers (19);
* one batched forward pass per operator class instead of one per operator instance (20);
* several prefill iterations are **summed** into ``prefill_duration_ms`` (22; the artifact kept the
  last one). Decode = every iteration whose phase is not "prefill".
"""
from __future__ import annotations

import csv
import gc
import io
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from analytical_model.attention import resolve_attention_type
from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.pipes import HardwareSpec
from analytical_model.registry import get_operator, workload_operators
from pipeweave.cli import UserError, write_atomically

# torch (through pipeweave.predictor) is imported only when models are loaded, so that flag and workload errors
# are reported quickly
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = REPO_ROOT / "mlp_models"
DEFAULT_QUANTILE_DIR = REPO_ROOT / "mlp_models_quantile"
DEFAULT_WORKLOAD_DIR = REPO_ROOT / "workload"

#: workload operator key → registry operator class, in output order
KERNEL_CATEGORIES = {key: operator.key for key, operator in workload_operators().items()}
CATEGORIES = (*KERNEL_CATEGORIES, "communication")
COLLECTIVE_KINDS = ("all_reduce", "send_recv")
SEND_RECV_WORKERS = 2
COLLECTIVE_ESTIMATES = ("model", "analytical")
SUMMARY_KEYS = ("prefill_duration_ms", "decode_avg_duration_ms", "decode_total_duration_ms", "total_duration_ms")
FLAG_HINT = "give --collective_hardware GPU (a GPU with collective models) or --collective_estimate analytical"

Log = Callable[[str], None]


class WorkloadFormatError(UserError):
    """A workload JSON that does not follow METHOD.md §6.4; the message names the iteration and field."""


# ==================================================================================================
# workload parsing and validation
# ==================================================================================================

@dataclass
class Workload:
    """A validated workload, flattened into operator instances (iteration order, then category order)."""

    path: Path | None
    stem: str
    model: str
    tp_size: int
    pp_size: int
    numbers: list[int]  # the "iteration" field of every iteration
    phases: list[str]
    #: per iteration: [(category, name or None, instance index)], in output order
    layout: list[list[tuple[str, str | None, int]]]
    #: per registry op: unique shape keys (gemm (M,N,K); attn (type,bs,q,kv,nh,nkv,hd); elementwise (seq,dim))
    shapes: dict[str, list[tuple]]
    #: unique (kind, volume_bytes) of the collectives
    collectives: list[tuple[str, int]]
    inst_iter: np.ndarray  # iteration position of every instance
    inst_count: np.ndarray  # float64 repeat counts
    inst_code: np.ndarray  # 0..3 kernel categories in KERNEL_CATEGORIES order, 4 collective
    inst_local: np.ndarray  # index into shapes[op] (kernels) or collectives
    counts_int: list[int] = field(default_factory=list)

    @property
    def has_communication(self) -> bool:
        return bool(self.collectives)

    def ops(self) -> list[str]:
        return [op for op in KERNEL_CATEGORIES.values() if self.shapes[op]]

    def collective_summary(self) -> str:
        kinds = sorted({kind for kind, _ in self.collectives})
        return ", ".join(kinds)


def _is_pos_int(value) -> bool:
    return type(value) is int and value > 0


def _is_count(value) -> bool:
    return type(value) is int and value >= 0


def _int_list(value, bs: int):
    """None if ``value`` is a list of ``bs`` positive ints."""
    if type(value) is not list:
        return "must be a list of positive integers"
    if len(value) != bs:
        return f"has {len(value)} entries but bs is {bs}"
    for v in value:
        if type(v) is not int or v <= 0:
            return f"entries must be positive integers, got {v!r}"
    return None


def parse_workload(data, source: str = "workload", path: Path | None = None) -> Workload:
    """Validate a workload object (METHOD.md §6.4) and flatten it; errors name iteration and field."""
    def fail(message: str):
        raise WorkloadFormatError(f"{source}: {message}")

    if not isinstance(data, dict):
        fail("expected a JSON object with an 'iterations' list")
    iterations = data.get("iterations")
    if not isinstance(iterations, list) or not iterations:
        fail("'iterations' must be a non-empty list")
    sizes = {}
    for key in ("tp_size", "pp_size"):
        value = data.get(key, 1)
        if not _is_pos_int(value):
            fail(f"{key} must be a positive integer, got {value!r}")
        sizes[key] = value
    model = data.get("model", Path(source).stem)
    if not isinstance(model, str):
        fail(f"model must be a string, got {model!r}")

    shapes: dict[str, list[tuple]] = {op: [] for op in KERNEL_CATEGORIES.values()}
    index: dict[str, dict[tuple, int]] = {op: {} for op in KERNEL_CATEGORIES.values()}
    collectives: list[tuple[str, int]] = []
    coll_index: dict[tuple[str, int], int] = {}
    inst_iter, inst_count, inst_code, inst_local = [], [], [], []
    numbers, phases, layout = [], [], []
    attention_types: dict[str, str | None] = {}

    def add(position: int, code: int, local: int, count: int, category: str, name, entries):
        entries.append((category, name, len(inst_iter)))
        inst_iter.append(position)
        inst_count.append(count)
        inst_code.append(code)
        inst_local.append(local)

    def shape_index(op: str, key: tuple) -> int:
        table = index[op]
        found = table.get(key)
        if found is None:
            found = table[key] = len(shapes[op])
            shapes[op].append(key)
        return found

    for position, iteration in enumerate(iterations):
        where = f"iteration {position + 1}"
        if not isinstance(iteration, dict):
            fail(f"{where}: must be an object")
        number = iteration.get("iteration", position + 1)
        if not _is_pos_int(number):
            fail(f"{where}: iteration must be a positive integer, got {number!r}")
        phase = iteration.get("phase")
        if phase not in ("prefill", "decode"):
            fail(f"{where}: phase must be \"prefill\" or \"decode\", got {phase!r}")
        operators = iteration.get("operators")
        if not isinstance(operators, dict):
            fail(f"{where}: operators must be an object")
        unknown = [key for key in operators if key not in CATEGORIES]
        if unknown:
            fail(f"{where}: unknown operator class operators.{unknown[0]} (known: {', '.join(CATEGORIES)})")
        entries: list[tuple[str, str | None, int]] = []

        gemms = operators.get("gemm", [])
        if not isinstance(gemms, list):
            fail(f"{where}: operators.gemm must be a list")
        names = set()
        for i, op in enumerate(gemms):
            at = f"{where}: operators.gemm[{i}]"
            if not isinstance(op, dict):
                fail(f"{at} must be an object")
            name = op.get("name")
            if not isinstance(name, str) or not name:
                fail(f"{at}.name must be a non-empty string, got {name!r}")
            if name in names:
                fail(f"{at}.name {name!r} is used twice in this iteration")
            names.add(name)
            for dim in ("M", "N", "K"):
                if not _is_pos_int(op.get(dim)):
                    fail(f"{at}.{dim} must be a positive integer, got {op.get(dim)!r}")
            if not _is_count(op.get("count")):
                fail(f"{at}.count must be a non-negative integer, got {op.get('count')!r}")
            add(position, 0, shape_index("gemm", (op["M"], op["N"], op["K"])), op["count"], "gemm", name, entries)

        if "attention" in operators:
            at = f"{where}: operators.attention"
            op = operators["attention"]
            if not isinstance(op, dict):
                fail(f"{at} must be an object")
            kind = op.get("attention_type")
            if not isinstance(kind, str):
                fail(f"{at}.attention_type must be a string, got {kind!r}")
            if kind not in attention_types:
                try:
                    resolve_attention_type(kind)
                    attention_types[kind] = None
                except ValueError as exc:
                    attention_types[kind] = str(exc)
            if attention_types[kind]:
                fail(f"{at}.attention_type: {attention_types[kind]}")
            for key in ("bs", "nh", "nkv", "hd"):
                if not _is_pos_int(op.get(key)):
                    fail(f"{at}.{key} must be a positive integer, got {op.get(key)!r}")
            if op["nh"] % op["nkv"]:
                fail(f"{at}: nh ({op['nh']}) must be divisible by nkv ({op['nkv']})")
            for key in ("q_lengths", "kv_lengths"):
                problem = _int_list(op.get(key), op["bs"])
                if problem:
                    fail(f"{at}.{key} {problem}")
            q, kv = op["q_lengths"], op["kv_lengths"]
            for j, (a, b) in enumerate(zip(q, kv)):
                if a > b:
                    fail(f"{at}: q_lengths[{j}] = {a} exceeds kv_lengths[{j}] = {b}")
            if not _is_count(op.get("count")):
                fail(f"{at}.count must be a non-negative integer, got {op.get('count')!r}")
            key = (kind, op["bs"], tuple(q), tuple(kv), op["nh"], op["nkv"], op["hd"])
            add(position, 1, shape_index("attn", key), op["count"], "attention", None, entries)

        for code, category in ((2, "rmsnorm"), (3, "siluandmul")):
            if category not in operators:
                continue
            at = f"{where}: operators.{category}"
            op = operators[category]
            if not isinstance(op, dict):
                fail(f"{at} must be an object")
            for key in ("seq", "dim"):
                if not _is_pos_int(op.get(key)):
                    fail(f"{at}.{key} must be a positive integer, got {op.get(key)!r}")
            if not _is_count(op.get("count")):
                fail(f"{at}.count must be a non-negative integer, got {op.get('count')!r}")
            add(position, code, shape_index(category, (op["seq"], op["dim"])), op["count"], category, None, entries)

        comms = operators.get("communication", [])
        if not isinstance(comms, list):
            fail(f"{where}: operators.communication must be a list")
        names = set()
        for i, op in enumerate(comms):
            at = f"{where}: operators.communication[{i}]"
            if not isinstance(op, dict):
                fail(f"{at} must be an object")
            name, kind_type = op.get("name"), op.get("type", "")
            if not isinstance(name, str) or not name:
                fail(f"{at}.name must be a non-empty string, got {name!r}")
            if name in names:
                fail(f"{at}.name {name!r} is used twice in this iteration")
            names.add(name)
            kind = collective_kind(name, kind_type)
            if kind is None:
                fail(f"{at}: unknown collective {name!r} (type {kind_type!r}); expected a name containing "
                     "'all_reduce', or 'send'/'recv' or type 'p2p'")
            volume = op.get("volume_bytes")
            if type(volume) is not int or volume < 0:
                fail(f"{at}.volume_bytes must be a non-negative integer, got {volume!r}")
            if not _is_count(op.get("count")):
                fail(f"{at}.count must be a non-negative integer, got {op.get('count')!r}")
            ckey = (kind, volume)
            local = coll_index.get(ckey)
            if local is None:
                local = coll_index[ckey] = len(collectives)
                collectives.append(ckey)
            add(position, 4, local, op["count"], "communication", name, entries)

        numbers.append(number)
        phases.append(phase)
        layout.append(entries)

    return Workload(
        path=path,
        stem=Path(source).stem if path is None else path.stem,
        model=model,
        tp_size=sizes["tp_size"],
        pp_size=sizes["pp_size"],
        numbers=numbers,
        phases=phases,
        layout=layout,
        shapes=shapes,
        collectives=collectives,
        inst_iter=np.asarray(inst_iter, dtype=np.int64),
        inst_count=np.asarray(inst_count, dtype=np.float64),
        inst_code=np.asarray(inst_code, dtype=np.int64),
        inst_local=np.asarray(inst_local, dtype=np.int64),
        counts_int=inst_count,
    )


def collective_kind(name: str, kind_type: str = "") -> str | None:
    """all_reduce / send_recv from a communication entry's name and type (None if neither)."""
    lowered = name.lower()
    if "all_reduce" in lowered or "allreduce" in lowered:
        return "all_reduce"
    if "send" in lowered or "recv" in lowered or str(kind_type).lower() == "p2p":
        return "send_recv"
    return None


def resolve_workload_path(name: str | Path, workload_dir: Path = DEFAULT_WORKLOAD_DIR) -> Path:
    path = Path(name)
    if path.is_file():
        return path
    if "/" not in str(name):
        candidate = workload_dir / (str(name) if str(name).endswith(".json") else f"{name}.json")
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"workload file not found: {name}")


def load_workload(name: str | Path, workload_dir: Path = DEFAULT_WORKLOAD_DIR) -> Workload:
    path = resolve_workload_path(name, workload_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadFormatError(f"{path}: not valid JSON ({exc})") from None
    return parse_workload(data, str(path), path)


# ==================================================================================================
# prediction
# ==================================================================================================

@dataclass
class Job:
    """One (workload, GPU) pair; ``collective_hardware`` None = the prediction GPU's own models."""

    workload: Workload
    hardware: HardwareSpec
    collective_hardware: str | None = None


@dataclass
class Prediction:
    job: Job
    result: dict
    collective_source: str | None = None  # "<GPU> models", "<GPU> models + analytical (kinds)", ...


class Aggregator:
    """Loads models once; :meth:`predict` handles any number of (workload, GPU) pairs in one batch."""

    def __init__(
        self,
        model_dir: str | Path = DEFAULT_MODEL_DIR,
        hardware_dir: str | Path = DEFAULT_HARDWARE_DIR,
        device: str = "cpu",
        collective_dir: str | Path | None = None,
        collective_estimate: str = "model",
        quantile_dir: str | Path | None = None,
        log: Log | None = print,
    ):
        if collective_estimate not in COLLECTIVE_ESTIMATES:
            raise UserError(f"--collective_estimate must be one of {', '.join(COLLECTIVE_ESTIMATES)}, "
                            f"got {collective_estimate!r}")
        self.hardware_dir = Path(hardware_dir)
        self.registry = hardware_registry(self.hardware_dir)
        self.model_dir = Path(model_dir)
        self.device = device
        self.quantile_dir = Path(quantile_dir) if quantile_dir else None
        self._predictor = None
        self._quantile_predictor = None
        self.quantile_ops: dict[str, bool] = {}
        if collective_dir is None:
            from pipeweave.collectives import DEFAULT_COLLECTIVE_DIR
            collective_dir = DEFAULT_COLLECTIVE_DIR
        self.collective_dir = Path(collective_dir)
        self.collective_estimate = collective_estimate
        self.log = log or (lambda message: None)
        self._collective_predictors: dict[str, object] = {}
        self._warned: set[tuple[str, str, int]] = set()

    # ---------------------------------------------------------------------------------------------
    @property
    def predictor(self):
        """The point-prediction KernelPredictor (created, and torch imported, on first use)."""
        if self._predictor is None:
            from pipeweave.predictor import KernelPredictor

            self._predictor = KernelPredictor(self.model_dir, self.device, self.hardware_dir)
        return self._predictor

    @property
    def quantile_predictor(self):
        """KernelPredictor of the quantile (upper-efficiency) models, None without --quantiles."""
        if self.quantile_dir is None:
            return None
        if self._quantile_predictor is None:
            from pipeweave.predictor import KernelPredictor

            self._quantile_predictor = KernelPredictor(self.quantile_dir, self.device, self.hardware_dir)
        return self._quantile_predictor

    def gpu(self, name: str) -> HardwareSpec:
        return self.registry.get(name)

    def load_models(self, ops: Iterable[str]) -> None:
        """Load every needed model now, so that a missing one fails before any work (names file + command)."""
        for op in ops:
            if op in self.predictor._models:
                continue
            _, metadata, directory = self.predictor.model(op)
            self.log(f"Loaded {op} model: {directory} ({metadata['model_info'].get('architecture', 'MLP')})")
            if self.quantile_predictor is not None and op not in self.quantile_ops:
                try:
                    _, _, qdir = self.quantile_predictor.model(op)
                    self.quantile_ops[op] = True
                    self.log(f"Loaded {op} quantile model: {qdir}")
                except FileNotFoundError:
                    self.quantile_ops[op] = False
                    self.log(f"Note: no {op} quantile model under {self.quantile_predictor.model_dir}/{op}; "
                             f"optimistic {op} durations use the point prediction")
        if self.quantile_predictor is not None and self.quantile_ops and not any(self.quantile_ops.values()):
            raise FileNotFoundError(
                f"--quantiles: no quantile model for any of {', '.join(self.quantile_ops)} under "
                f"{self.quantile_predictor.model_dir} (expected <dir>/<op>/<timestamp>/<op>_mlp_model.pth); "
                f"train one with: python3 train_mlp_quantile.py --op {next(iter(self.quantile_ops))}")

    def collective_predictor(self, job: Job):
        """The CollectivePredictor a job's collectives use; errors name the flags to give."""
        from pipeweave.collectives import CollectivePredictor, collective_hardware_with_models

        have = collective_hardware_with_models(self.collective_dir)
        analytical = self.collective_estimate == "analytical"
        if job.collective_hardware:
            stem = self.gpu(job.collective_hardware).stem
            if stem not in have and not analytical:
                raise UserError(
                    f"--collective_hardware {job.collective_hardware}: no collective models for {stem} in "
                    f"{self.collective_dir} (GPUs with collective models: {', '.join(have) or 'none'}); "
                    f"{FLAG_HINT}")
        else:
            stem = job.hardware.stem
            if stem not in have and not analytical:
                raise UserError(
                    f"{job.workload.stem}: the workload has communication ({job.workload.collective_summary()}) but "
                    f"{stem} has no collective models in {self.collective_dir} (GPUs with collective models: "
                    f"{', '.join(have) or 'none'}); {FLAG_HINT}")
        if stem not in self._collective_predictors:
            try:
                self._collective_predictors[stem] = CollectivePredictor(stem, self.collective_dir,
                                                                        allow_analytical=analytical)
            except FileNotFoundError as exc:
                raise UserError(f"{exc.args[0] if exc.args else exc}; {FLAG_HINT}") from None
        return self._collective_predictors[stem]

    # ---------------------------------------------------------------------------------------------
    def predict(self, jobs: Sequence[Job]) -> list[Prediction]:
        """Predict every job; raises before returning anything if any job cannot be predicted."""
        with gc_paused():
            return self._predict(jobs)

    def _predict(self, jobs: Sequence[Job]) -> list[Prediction]:
        ops = sorted({op for job in jobs for op in job.workload.ops()}, key=list(KERNEL_CATEGORIES.values()).index)
        # collectives first (cheap, no torch): a missing collective model fails before the MLPs are loaded
        collective_of = {id(job): self.collective_predictor(job) for job in jobs if job.workload.has_communication}
        coll_ms: dict[int, tuple[np.ndarray, list[str]]] = {}
        for j, job in enumerate(jobs):
            if job.workload.has_communication:
                coll_ms[j] = self._collectives(job, collective_of[id(job)])
        self.load_models(ops)

        # 1. unique (GPU, shape) rows per operator class, and each job's map from its local shapes to them
        tables: dict[str, dict[tuple[str, tuple], int]] = {op: {} for op in ops}
        maps: dict[tuple[int, str], np.ndarray] = {}
        for j, job in enumerate(jobs):
            stem = job.hardware.stem
            for op in job.workload.ops():
                table = tables[op]
                ids = np.empty(len(job.workload.shapes[op]), dtype=np.int64)
                for i, shape in enumerate(job.workload.shapes[op]):
                    key = (stem, shape)
                    found = table.get(key)
                    if found is None:
                        found = table[key] = len(table)
                    ids[i] = found
                maps[(j, op)] = ids

        # 2. one feature computation and one forward pass per operator class
        unique_ms: dict[str, np.ndarray] = {}
        optimistic_ms: dict[str, np.ndarray] = {}
        with single_thread_inference(self.device):
            for op, table in tables.items():
                keys = list(table)  # dict order = row order
                features, described = self._features(op, keys)
                unique_ms[op], optimistic_ms[op] = self._durations(op, keys, features, described)

        # 3. scatter back and assemble the outputs
        out = []
        for j, job in enumerate(jobs):
            single = np.zeros(len(job.workload.inst_code))
            best = np.zeros(len(job.workload.inst_code)) if self.quantile_predictor is not None else None
            codes = job.workload.inst_code
            for code, op in enumerate(KERNEL_CATEGORIES.values()):
                rows = np.flatnonzero(codes == code)
                if rows.size:
                    ids = maps[(j, op)][job.workload.inst_local[rows]]
                    single[rows] = unique_ms[op][ids]
                    if best is not None:
                        best[rows] = optimistic_ms[op][ids]
            rows = np.flatnonzero(codes == 4)
            if rows.size:
                single[rows] = coll_ms[j][0][job.workload.inst_local[rows]]
                if best is not None:
                    best[rows] = single[rows]
            source = None
            if job.workload.has_communication:
                predictor = collective_of[id(job)]
                measured = [k for k in COLLECTIVE_KINDS if k not in coll_ms[j][1]
                            and any(kind == k for kind, _ in job.workload.collectives)]
                parts = []
                if measured:
                    parts.append(f"{predictor.hardware} collective models ({', '.join(measured)})")
                if coll_ms[j][1]:
                    parts.append(f"ANALYTICAL estimate ({', '.join(coll_ms[j][1])}, {predictor.hardware} link)")
                source = " + ".join(parts)
            out.append(Prediction(job, build_result(job, single, best), source))
        return out

    def _features(self, op: str, keys: list[tuple[str, tuple]]) -> tuple[np.ndarray, np.ndarray]:
        """float64 (features, shape descriptors) of the unique (GPU stem, shape) rows of one operator class."""
        operator = get_operator(op)
        features = np.zeros((len(keys), len(operator.feature_names)))
        described = np.zeros((len(keys), len(operator.descriptor_names)))
        if not keys:
            return features, described
        stems = np.array([stem for stem, _ in keys], dtype=object)
        for stem in dict.fromkeys(stems.tolist()):
            rows = np.flatnonzero(stems == stem)
            hw = self.registry.get(stem)
            shapes = [keys[i][1] for i in rows]
            columns = {name: [shape[i] for shape in shapes] for i, name in enumerate(operator.shape_columns)}
            features[rows] = operator.features(columns, hw)
            described[rows] = operator.descriptors(columns, hw)
        return features, described

    def _durations(self, op: str, keys, features: np.ndarray, described: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(point, optimistic) durations in ms of the unique rows."""
        operator = get_operator(op)
        ideal = operator.ideal_cycles(features.astype(np.float32)).astype(np.float64)
        freq = np.array([self.registry.get(stem).sm_freq for stem, _ in keys], dtype=np.float64)
        from pipeweave.predictor import duration_us

        efficiency = self.predictor.efficiency_from_features(op, features, described)
        point = duration_us(ideal, efficiency, freq) / 1000.0
        if self.quantile_predictor is not None and self.quantile_ops.get(op):
            upper = self.quantile_predictor.efficiency_from_features(op, features, described)
            return point, duration_us(ideal, upper, freq) / 1000.0
        return point, point

    def _collectives(self, job: Job, predictor) -> tuple[np.ndarray, list[str]]:
        """(ms per unique collective of the job's workload, kinds that used the analytical estimate)."""
        workload = job.workload
        out = np.zeros(len(workload.collectives))
        analytical = []
        for kind in COLLECTIVE_KINDS:
            rows = [i for i, (k, _) in enumerate(workload.collectives) if k == kind]
            if not rows:
                continue
            sizes = np.array([workload.collectives[i][1] for i in rows], dtype=np.float64)
            workers = workload.tp_size if kind == "all_reduce" else SEND_RECV_WORKERS
            measured = predictor.available(kind) and (
                workers in predictor.worker_counts(kind) or (kind == "all_reduce" and workers == 1))
            try:
                out[rows] = predictor.predict_ms(kind, sizes, workers)
            except (ValueError, FileNotFoundError) as exc:
                message = exc.args[0] if exc.args else str(exc)
                raise UserError(f"{workload.stem} on {job.hardware.stem}: cannot predict {kind} with "
                                f"{predictor.hardware}'s collective models: {message.split('; ')[0]}; "
                                f"{FLAG_HINT}") from None
            if not measured:
                analytical.append(kind)
                if (predictor.hardware, kind, workers) not in self._warned:
                    self._warned.add((predictor.hardware, kind, workers))
                    self.log(
                        f"WARNING: {kind} on {predictor.hardware} ({workers} workers) uses the ANALYTICAL collective "
                        f"estimate (--collective_estimate analytical: pipeweave.collectives.analytical_collective_ms, "
                        f"peak link bandwidth + fixed latency, not measurements) because no measured model covers it")
        return out, analytical


@contextmanager
def gc_paused():
    """No cyclic garbage collection while the output objects are built: the thousands of small dicts
    otherwise trigger full collections over torch's and pandas' heaps (≈ 5 ms for a 403-iteration
    workload). Nothing built here is cyclic; the previous state is restored."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def single_thread_inference(device: str):
    """One intra-op thread for CPU inference: the batches here are small (hundreds of rows), where thread
    start-up and contention with other processes cost far more than they save (measured: 240 ms vs 24 ms
    for a 403-iteration workload on a busy 2-core machine)."""
    if not str(device).startswith("cpu"):
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ==================================================================================================
# output
# ==================================================================================================

def round6(values: np.ndarray) -> list[float]:
    """Round to 6 decimals, vectorised: rint(x·10⁶) / 10⁶ is the double nearest to the 6-decimal value
    (prints cleanly); it can differ from Python's round() only for values within an ulp of a tie."""
    return (np.rint(np.asarray(values, dtype=np.float64) * 1e6) / 1e6).tolist()


def build_result(job: Job, single: np.ndarray, optimistic: np.ndarray | None = None) -> dict:
    """The §7.5 output object from per-instance single durations (ms, unrounded)."""
    workload = job.workload
    n_iter = len(workload.numbers)
    weighted = single * workload.inst_count
    # bincount accumulates in input order: the same sequence of additions as Σ over an iteration's operators
    iter_total = np.bincount(workload.inst_iter, weights=weighted, minlength=n_iter).tolist()
    singles = round6(single)
    totals = round6(weighted)
    iter_rounded = round6(iter_total)
    counts = workload.counts_int
    iterations = []
    for position in range(n_iter):
        durations: dict = {"gemm": {}}
        for category, name, i in workload.layout[position]:
            entry = {"single_duration_ms": singles[i], "count": counts[i], "total_duration_ms": totals[i]}
            if category == "gemm":
                durations["gemm"][name] = entry
            elif category == "communication":
                durations.setdefault("communication", {})[name] = entry
            else:
                durations[category] = entry
        iterations.append({  # layout entries are in CATEGORIES order, so the keys are too
            "iteration": workload.numbers[position],
            "phase": workload.phases[position],
            "operator_durations": durations,
            "total_duration_ms": iter_rounded[position],
        })
    summary = summarize(workload.phases, iter_total)
    if optimistic is not None:
        best_total = np.bincount(workload.inst_iter, weights=optimistic * workload.inst_count, minlength=n_iter)
        for key, value in summarize(workload.phases, best_total.tolist()).items():
            summary[f"optimistic_{key}"] = value
    return {
        "model": workload.model,
        "hardware": job.hardware.name,
        "tp_size": workload.tp_size,
        "pp_size": workload.pp_size,
        "iterations": iterations,
        "summary": summary,
    }


def summarize(phases: Sequence[str], totals: Sequence[float]) -> dict:
    """Prefill = Σ of the prefill iterations (quirk §11.3.22 fixed), decode = all other iterations."""
    prefill = 0.0
    decode = []
    for phase, total in zip(phases, totals):
        if phase == "prefill":
            prefill += total
        else:
            decode.append(total)
    decode_total = sum(decode)
    return {
        "prefill_duration_ms": round(prefill, 6),
        "decode_avg_duration_ms": round(decode_total / len(decode), 6) if decode else 0.0,
        "decode_total_duration_ms": round(decode_total, 6),
        "total_duration_ms": round(sum(totals), 6),
    }


def dumps_result(result: dict) -> str:
    return json.dumps(result, indent=2) + "\n"


def output_name(workload_stem: str, hardware: HardwareSpec) -> str:
    return f"{workload_stem}_{hardware.stem.replace(' ', '_')}.json"


# ==================================================================================================
# command line
# ==================================================================================================

def build_parser():
    from pipeweave.cli import ArgumentParser

    parser = ArgumentParser(
        prog="aggregator.py",
        description="Predict the end-to-end latency of LLM inference workloads on GPUs (METHOD.md §7).",
        epilog="Several workloads and/or GPUs (or --pairs) predict every pair in one process with the models loaded "
               "once; --output is then a directory that receives <workload stem>_<GPU stem>.json per pair.",
    )
    parser.add_argument("--workload", nargs="+", action="extend", default=[], metavar="JSON",
                        help="workload JSON file(s) (METHOD.md §6.4), or stems of files in workload/; repeatable")
    parser.add_argument("--hardware", action="append", default=[], metavar="GPU",
                        help="GPU name (hardware file stem such as 'H100' or 'RTX 6000 Ada', or the device name), "
                             "a comma-separated list, or 'all' (every GPU in --hardware_dir); repeatable")
    parser.add_argument("--pairs", metavar="CSV",
                        help="sweep matrix instead of --workload x --hardware: CSV with header "
                             "'workload,hardware[,collective_hardware]', one pair per line ('#' lines ignored; "
                             "'-' reads standard input)")
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR),
                        help="root of the trained MLPs: <model_dir>/<op>/<timestamp>/ (default: mlp_models)")
    parser.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR), help="directory of GPU spec JSONs")
    parser.add_argument("--dataset_dir", default=None,
                        help="accepted for compatibility with the reference CLI and ignored: pipeweave needs no "
                             "dataset at inference (GEMM tiles come from the tile rule, collective models from "
                             "--collective_dir)")
    parser.add_argument("--output", default=None,
                        help="output JSON for one pair (default predictions.json); a directory when several pairs")
    parser.add_argument("--device", default="cpu", help="torch device of the MLPs: cpu (default) or cuda")
    parser.add_argument("--collective_hardware", default=None, metavar="GPU",
                        help="GPU whose collective models predict the communication (default: the prediction GPU, "
                             "if it has collective models; otherwise a workload with communication is an error)")
    parser.add_argument("--collective_dir", default=None,
                        help="root of the collective models (default: collective_models)")
    parser.add_argument("--collective_estimate", choices=COLLECTIVE_ESTIMATES, default="model",
                        help="'model' (default): measured collective models only, a missing one is an error; "
                             "'analytical': where no measured model covers a collective (GPU, kind or worker count), "
                             "use the documented analytical estimate pipeweave.collectives.analytical_collective_ms "
                             "(ring all-reduce / point-to-point at the GPU's peak link bandwidth + fixed latency) and "
                             "print a WARNING line naming it")
    parser.add_argument("--quantiles", action="store_true",
                        help="also load quantile (upper-efficiency) models from --quantile_dir and report optimistic "
                             "latencies (summary.optimistic_*) beside the point prediction")
    parser.add_argument("--quantile_dir", default=str(DEFAULT_QUANTILE_DIR),
                        help="root of the quantile models (default: mlp_models_quantile)")
    return parser


def expand_hardware(values: Sequence[str], registry) -> list[HardwareSpec]:
    specs: list[HardwareSpec] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            if name.lower() == "all":
                specs.extend(registry.specs[stem] for stem in registry.known())
            else:
                specs.append(registry.get(name))
    unique = list(dict.fromkeys(specs))
    if not unique:
        raise UserError("--hardware names no GPU")
    return unique


def read_pairs(path: str) -> list[tuple[str, str, str | None]]:
    text = sys.stdin.read() if path == "-" else _read_text(path)
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise UserError(f"--pairs {path}: no pairs")
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    header = [h.strip() for h in next(reader)]
    if header[:2] != ["workload", "hardware"] or any(h not in ("workload", "hardware", "collective_hardware")
                                                     for h in header):
        raise UserError(f"--pairs {path}: header must be 'workload,hardware[,collective_hardware]', "
                        f"got {','.join(header)!r}")
    pairs = []
    for line_no, row in enumerate(reader, start=2):
        row = [cell.strip() for cell in row]
        if len(row) < 2 or len(row) > len(header):
            raise UserError(f"--pairs {path}: line {line_no} needs {len(header)} fields, got {len(row)}")
        values = dict(zip(header, row))
        pairs.append((values["workload"], values["hardware"], values.get("collective_hardware") or None))
    return pairs


def _read_text(path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--pairs file not found: {path}")
    return p.read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    registry = hardware_registry(Path(args.hardware_dir))
    workload_cache: dict[str, Workload] = {}

    def workload(name: str) -> Workload:
        if name not in workload_cache:
            workload_cache[name] = load_workload(name)
        return workload_cache[name]

    jobs: list[Job] = []
    if args.pairs:
        if args.workload or args.hardware:
            raise UserError("--pairs replaces --workload and --hardware; give one or the other")
        for wname, hname, cname in read_pairs(args.pairs):
            jobs.append(Job(workload(wname), registry.get(hname), cname or args.collective_hardware))
    else:
        if not args.workload:
            raise UserError("the following arguments are required: --workload (or --pairs)")
        if not args.hardware:
            raise UserError("the following arguments are required: --hardware (or --pairs)")
        gpus = expand_hardware(args.hardware, registry)
        for wname in dict.fromkeys(args.workload):
            for spec in gpus:
                jobs.append(Job(workload(wname), spec, args.collective_hardware))
    if args.collective_hardware:
        registry.get(args.collective_hardware)  # unknown name: error listing the known GPUs

    several = len(jobs) > 1
    if several:
        out_dir = Path(args.output) if args.output else None
        if out_dir is None:
            raise UserError(f"{len(jobs)} (workload, GPU) pairs: give --output DIRECTORY for one file per pair")
        if out_dir.suffix == ".json" or out_dir.is_file():
            raise UserError(f"--output {out_dir}: with {len(jobs)} pairs --output must be a directory")
        targets = [out_dir / output_name(job.workload.stem, job.hardware) for job in jobs]
        duplicates = {t for t in targets if targets.count(t) > 1}
        if duplicates:
            raise UserError(f"two pairs would write the same file {sorted(duplicates)[0]}")
    else:
        target = Path(args.output or "predictions.json")
        if target.is_dir():
            target = target / output_name(jobs[0].workload.stem, jobs[0].hardware)
        targets = [target]

    if args.quantiles and not Path(args.quantile_dir).is_dir():
        raise FileNotFoundError(f"--quantiles: quantile model directory not found: {args.quantile_dir} "
                                f"(train with: python3 train_mlp_quantile.py --op OP)")
    if args.dataset_dir:
        print(f"Note: --dataset_dir {args.dataset_dir} is ignored (pipeweave needs no dataset at inference)")
    aggregator = Aggregator(
        model_dir=args.model_dir,
        hardware_dir=args.hardware_dir,
        device=args.device,
        collective_dir=args.collective_dir,
        collective_estimate=args.collective_estimate,
        quantile_dir=args.quantile_dir if args.quantiles else None,
    )
    started = time.perf_counter()
    predictions = aggregator.predict(jobs)
    elapsed = time.perf_counter() - started
    for prediction, target in zip(predictions, targets):
        text = dumps_result(prediction.result)
        write_atomically(target, lambda tmp, text=text: tmp.write_text(text))
        summary = prediction.result["summary"]
        job = prediction.job
        if several:
            print(f"== {job.workload.stem} on {job.hardware.stem}")
        if prediction.collective_source:
            print(f"Communication: {prediction.collective_source}")
        print(f"Prefill duration: {summary['prefill_duration_ms']:.3f} ms")
        print(f"Decode avg duration: {summary['decode_avg_duration_ms']:.3f} ms")
        print(f"Total duration: {summary['total_duration_ms']:.3f} ms")
        if "optimistic_total_duration_ms" in summary:
            print(f"Optimistic (quantile models) prefill / decode avg / total: "
                  f"{summary['optimistic_prefill_duration_ms']:.3f} / "
                  f"{summary['optimistic_decode_avg_duration_ms']:.3f} / "
                  f"{summary['optimistic_total_duration_ms']:.3f} ms")
        print(f"Predictions saved to {target}")
    if several:
        print(f"Predicted {len(jobs)} pairs in {elapsed * 1000:.1f} ms (models loaded once)")
    return 0
