"""The prediction engine (docs/METHOD.md §7): workloads × GPUs → per-operator and per-iteration durations.

For every (workload, GPU) pair the predicted duration of each operator instance is

* a kernel (the registry's workload operators: BF16 / FP8 GEMM, attention, RMSNorm, SiLU*Mul, fused MoE, FP8
  activation quantisation): analytical features on that GPU → float32 → the model's input transform (§4.1:
  log1p, or pipe shares for BF16 GEMM, attention and MoE) → the operator's MLP → efficiency →
  ``C_ideal / (efficiency × f_SM)`` (§4.3); a fused-MoE pass is its share of the predicted whole
  layer (:mod:`pipeweave.moe`);
* a collective: the collective model of a GPU (:mod:`pipeweave.collectives`); all-reduce with
  ``num_workers = tp_size``, send/recv with ``num_workers = 2`` (a pipeline-stage boundary is a two-party
  transfer; fix of quirk §11.3.19).

Why one module above ~400 lines: the batch pipeline (deduplicate shapes across all jobs → features → one MLP pass per
operator → durations → bounds, calibration and extrapolation flags → per-iteration sums) shares its index arrays
between steps; split across modules those arrays would become a public interface of their own.

**Public surface** (what other features plug into):

* ``Engine(model_dir=..., hardware_dir=..., collective_dir=..., collective_estimate=..., quantile_dir=...,
  calibration=None)``: models are loaded once, on first use.
* ``Engine.predict(jobs)``: any number of :class:`Job` (workload, GPU) pairs in one batch → :class:`Prediction`
  (the docs/METHOD.md §7.5 output object of :mod:`pipeweave.report`).
* ``Engine.predict_workload(workload, hardware)``: one in-memory :class:`pipeweave.schema.Workload` (or a
  path) on one GPU → the output object; no JSON file needed.
* ``Engine.iteration_ms(iteration, hardware, tp_size=1)``: the duration of one
  :class:`pipeweave.schema.Iteration` (e.g. a batch of mixed prefill/decode requests of a serving simulator),
  memoised on the iteration's operators, so asking again for the same batch costs a dictionary lookup.
* ``calibration``: an object with ``apply(kind, hardware, durations_ms, features=None, shapes=None) ->
  durations_ms`` (``kind`` is a registry operator key or a collective kind; for kernels ``features`` are the rows'
  analytical features and ``shapes`` their shape keys, for collectives ``shapes`` are (message bytes, workers)
  and ``features`` None), called on every kernel and collective duration before they
  are summed, and optionally ``record(hardware) -> dict | None``, what a prediction on that GPU records under
  ``"calibration"`` (:class:`pipeweave.calibration.Calibration`), ``fine_tuned_models() ->
  {op: NumpyMLP}`` and ``hardware`` (a file stem): kernel models fine-tuned on that GPU, which replace the shipped
  ones for its rows (:mod:`pipeweave.finetune`), and ``kernel_count(op, cls=None) -> int``: the measured kernels
  of an operator it was fitted on, which select the calibrated prediction interval (:mod:`pipeweave.intervals`);
  with ``cls`` (``attn_prefill`` or ``attn_decode``), those of attention's class (a ``kernel_count(op)`` without it
  counts every class's).
  None = no correction.
* Every kernel efficiency is kept inside its physical band (:mod:`pipeweave.bounds`) before the calibration;
  the output's ``extrapolation`` block gives the share of predicted kernel time that is extrapolated (its GPU's
  architecture, its shape or its balance of pipes outside the model's training data, or the ensemble's members
  disagreeing), overall, per operator and per phase.
* A capacity check (e.g. memory) belongs before :meth:`Engine.predict`, on the :class:`Job` list: it needs the
  workload and the GPU spec, both on the job.

**Speed.** Nothing is computed per iteration: every operator instance of every requested pair is gathered
first, identical shapes are deduplicated per (operator class, GPU), features are computed vectorised once per
operator class (FA2 attention through :mod:`analytical_model.fa2_batch`, bit-identical to the per-launch
calculator), each MLP runs once on its whole batch, collectives are predicted once per distinct message, and the
results are scattered back with index arrays. ``python3 -m benchmarks.aggregator`` times it.

**Fixes of docs/METHOD.md §11.3** (all deliberate): GEMM tiles from the registry's tile rule, not a 130 MB CSV
lookup (16); an unknown GPU, an operator class without a model or a malformed workload is an error, never a
silently dropped operator (17); no silent 0 ms for communication: a collective without a measured model uses the
documented analytical estimate from the GPU's hardware JSON and prints a WARNING naming it (default
``collective_estimate="analytical"``, so that one uncovered GPU does not stop a sweep; ``"model"`` makes it an
error naming both flags) (18); send/recv with 2
workers (19); one batched forward pass per operator class (20); several prefill iterations are summed (22).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.pipes import HardwareSpec
from analytical_model.registry import get_operator
from pipeweave.cli import UserError, gc_paused
from pipeweave.collectives import NODE_GPUS, collective_workers, fallback_kind
from pipeweave.flatten import CATEGORY_CODE, COMMUNICATION_CODE, KERNEL_CATEGORIES, FlatWorkload, load_workload
from pipeweave.intervals import physical_interval, spread_record
from pipeweave.moe import pass_fastest_us, pass_shares
from pipeweave.paths import DEFAULT_COLLECTIVE_DIR, DEFAULT_MODEL_DIR, command
from pipeweave.report import build_result
from pipeweave.schema import COLLECTIVE_KINDS, Iteration, Workload
from pipeweave.validation import attention_warnings, check_durations, load_model_checked

#: where a kernel is extrapolated (GPU architecture or shape region absent from its model's training), the
#: optimistic efficiency is the quantile model's × 1.5 (within the physical band): the leave-one-GPU-out errors of
#: the recipe reach ~50 % of the duration (docs/ACCURACY.md) where shape-held-out errors are ~10 %
EXTRAPOLATION_WIDENING = 1.5
COLLECTIVE_ESTIMATES = ("model", "analytical")
#: which duration of a kernel :meth:`Engine.shape_ms` gives: the point prediction or an end of its interval
INTERVAL_ENDS = ("point", "low", "high")

Log = Callable[[str], None]


class Calibration(Protocol):
    """A correction of predicted durations, applied per operator class (or collective kind) and GPU; the optional
    hooks (``record``, ``fine_tuned_models``, ``hardware``, ``kernel_count``) are in the module docstring."""

    def apply(self, kind: str, hardware: HardwareSpec, durations_ms: np.ndarray, features: np.ndarray | None = None,
              shapes: Sequence[tuple] | None = None) -> np.ndarray: ...


# ==================================================================================================
# prediction
# ==================================================================================================

def as_flat_workload(workload: Workload | FlatWorkload | str | Path) -> FlatWorkload:
    """The flattened form of an in-memory :class:`pipeweave.schema.Workload`, a flattened one or a workload file."""
    if isinstance(workload, Workload):
        return FlatWorkload.of(workload)
    if isinstance(workload, FlatWorkload):
        return workload
    return load_workload(workload)


@dataclass
class Job:
    """One (workload, GPU) pair; ``collective_hardware`` None = the prediction GPU's own models."""

    workload: FlatWorkload
    hardware: HardwareSpec
    collective_hardware: str | None = None


@dataclass
class Prediction:
    job: Job
    result: dict
    collective_source: str | None = None  # "<GPU> models", "<GPU> models + analytical (kinds)", ...
    #: per operator instance (the workload's flattened order), whether its kernel prediction is extrapolated
    #: (False for collectives): what the output's ``extrapolation`` shares sum, for callers that need it per instance
    extrapolated: np.ndarray | None = None
    #: per operator instance, the (low, high) single durations (ms) that the output's ``interval`` block sums
    interval: tuple[np.ndarray, np.ndarray] | None = None


def uncalibrated(categories, record: dict | None) -> tuple[list[str], list[str]]:
    """(the kernel ``categories`` a calibration took no measurement of, the categories it measured), from its
    ``record`` (the ``calibration`` entry of an output; None without a calibration of the GPU). A calibration
    measured the operators of its kernel CSVs and those its measured runs executed (``fitted_from.e2e.ops``; a file
    written before that record, or a calibration hook without one, counts as covering all); the others move only
    with the GPU-wide part of its corrections (pipeweave.calibration, "Prior")."""
    if record is None:
        return list(categories), []
    fitted = record.get("fitted_from")
    e2e = fitted.get("e2e") if isinstance(fitted, dict) else None
    if not isinstance(fitted, dict) or (e2e and "ops" not in e2e):
        return [], []
    ops = {entry.get("op") for entry in fitted.get("kernels", []) if entry.get("rows")}
    ops |= set((e2e or {}).get("ops", []))
    measured = [category for category, op in KERNEL_CATEGORIES.items() if op in ops]
    return [category for category in categories if category not in measured], measured


def unmeasured_note(gpu_name: str, categories, what: str = "predictions", calibrated=()) -> str:
    """The console note for :meth:`Engine.unmeasured` categories (``what``: the durations they make up) that no
    calibration measured either (``calibrated``: the categories a calibration of the GPU measured instead)."""
    if calibrated:
        return (f"Note: no kernel of {gpu_name} is in the training data of {', '.join(categories)}, and the "
                f"calibration measured none of theirs (it measured {', '.join(calibrated)}): those {what} are "
                f"zero-shot, moved only by the GPU-wide part of its corrections; {command('calibrate.py')} with their "
                f"kernels, or a measured run that holds them, corrects them")
    return (f"Note: no kernel of {gpu_name} is in the training data of {', '.join(categories)}: those {what} are "
            f"zero-shot (leave-one-GPU-out errors in docs/ACCURACY.md); {command('calibrate.py')} with a few measured "
            f"kernels or one measured run corrects them")


class Engine:
    """Loads models once; :meth:`predict` handles any number of (workload, GPU) pairs in one batch."""

    def __init__(
        self,
        model_dir: str | Path = DEFAULT_MODEL_DIR,
        hardware_dir: str | Path = DEFAULT_HARDWARE_DIR,
        collective_dir: str | Path | None = None,
        collective_estimate: str = "analytical",
        quantile_dir: str | Path | None = None,
        calibration: Calibration | None = None,
        log: Log | None = print,
        keyword_options: bool = False,
    ):
        #: messages name options as the caller gives them: command-line flags, or the Python API's keywords
        self.keyword_options = keyword_options
        if collective_estimate not in COLLECTIVE_ESTIMATES:
            raise UserError(f"{self.option('collective_estimate')} must be one of {', '.join(COLLECTIVE_ESTIMATES)}, "
                            f"got {collective_estimate!r}")
        self.hardware_dir = Path(hardware_dir)
        self.registry = hardware_registry(self.hardware_dir)
        self.model_dir = Path(model_dir)
        self.quantile_dir = Path(quantile_dir) if quantile_dir else None
        self._predictor = None
        self._quantile_predictor = None
        self.quantile_ops: dict[str, bool] = {}
        self.collective_dir = Path(DEFAULT_COLLECTIVE_DIR if collective_dir is None else collective_dir)
        if not self.collective_dir.is_dir():  # a misspelt folder silently gave the textbook ring estimate
            raise FileNotFoundError(f"{self.option('collective_dir')}: collective model directory not found: "
                                    f"{self.collective_dir}")
        self.collective_estimate = collective_estimate
        self.log = log or (lambda message: None)
        self._collective_predictors: dict[str, object] = {}
        self._warned: set[tuple] = set()
        self.calibration = calibration
        self._iteration_ms: dict[tuple, float] = {}
        self._loaded: set[str] = set()

    # ---------------------------------------------------------------------------------------------
    @property
    def predictor(self):
        """The point-prediction KernelPredictor (created, and its models loaded, on first use)."""
        if self._predictor is None:
            from pipeweave.predictor import KernelPredictor

            self._predictor = KernelPredictor(self.model_dir, self.hardware_dir)
            if self.calibration is not None and hasattr(self.calibration, "fine_tuned_models"):
                self._predictor.use_fine_tuned(self.calibration)
        return self._predictor

    @property
    def quantile_predictor(self):
        """KernelPredictor of the quantile (upper-efficiency) models, None without --quantiles."""
        if self.quantile_dir is None:
            return None
        if self._quantile_predictor is None:
            from pipeweave.predictor import KernelPredictor

            self._quantile_predictor = KernelPredictor(self.quantile_dir, self.hardware_dir, quantile=True)
        return self._quantile_predictor

    def gpu(self, name: str) -> HardwareSpec:
        return self.registry.get(name)

    def load_models(self, ops: Iterable[str]) -> None:
        """Load every needed model now, so that a missing one fails before any work (names file + command)."""
        from pipeweave.intervals import other_model_warning

        for op in ops:
            if op in self._loaded:
                continue
            _, metadata, directory = load_model_checked(self.predictor, op)
            self._loaded.add(op)
            self.log(f"Loaded {op} model: {directory} ({metadata['model_info'].get('architecture', 'MLP')})")
            warning = other_model_warning(op, directory)
            if warning:
                self.log(warning)
            if self.quantile_predictor is not None and op not in self.quantile_ops:
                try:
                    _, _, qdir = load_model_checked(self.quantile_predictor, op, "train_mlp_quantile.py")
                    self.quantile_ops[op] = True
                    self.log(f"Loaded {op} quantile model: {qdir}")
                except FileNotFoundError:
                    self.quantile_ops[op] = False
                    self.log(f"Note: no {op} quantile model under {self.quantile_predictor.model_dir}/{op}; "
                             f"optimistic {op} durations use the point prediction")
        if self.quantile_predictor is not None and self.quantile_ops and not any(self.quantile_ops.values()):
            raise FileNotFoundError(
                f"{self.option('quantiles')}: no quantile model for any of {', '.join(self.quantile_ops)} under "
                f"{self.quantile_predictor.model_dir} (expected <dir>/<op>/<timestamp>/<op>_mlp_weights.npz); "
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
                    f"{self.option('collective_hardware', job.collective_hardware)}: no collective models for {stem} "
                    f"in {self.collective_dir} (GPUs with collective models: {', '.join(have) or 'none'}); "
                    f"{self.flag_hint()}")
        else:
            stem = job.hardware.stem
            if stem not in have and not analytical:
                raise UserError(
                    f"{job.workload.stem}: the workload has communication ({job.workload.collective_summary()}) but "
                    f"{stem} has no collective models in {self.collective_dir}; {self.covering_hint(job)}")
        if stem not in self._collective_predictors:
            try:
                self._collective_predictors[stem] = CollectivePredictor(self.gpu(stem), self.collective_dir,
                                                                        allow_analytical=analytical)
            except FileNotFoundError as exc:
                raise UserError(f"{exc.args[0] if exc.args else exc}; {self.flag_hint()}") from None
        return self._collective_predictors[stem]

    def calibration_warnings(self, ops, collective_gpus=()) -> list[str]:
        """The WARNING lines of a calibration fitted against other models than those predicting now: the kernel
        models of ``ops`` and the collective models of ``collective_gpus`` (the GPUs whose collectives are predicted;
        none where nothing communicates). Empty without a calibration, or for a plain correction (no record)."""
        if not hasattr(self.calibration, "stale_models"):
            return []
        named = self.option("calibration", str(self.calibration.path))
        lines = self.calibration.stale_models({op: self.predictor.model(op)[2] for op in sorted(set(ops))}, named)
        lines += [self.calibration.stale_collectives(self.collective_dir, stem, named)
                  for stem in sorted(set(collective_gpus))]
        lines.append(self.calibration.stale_spec(self.gpu(self.calibration.hardware), named))
        return [line for line in lines if line]

    def calibration_record(self, hardware: HardwareSpec) -> dict | None:
        """What an output records of the calibration on ``hardware``: None without a calibration of that GPU, or for
        a plain correction hook, which records nothing."""
        recorder = getattr(self.calibration, "record", None)
        return recorder(hardware) if recorder is not None else None

    def unmeasured(self, hardware: HardwareSpec, categories) -> list[str]:
        """The operator ``categories`` whose model has no measurement of ``hardware`` (in its training data, or from a
        calibration's fine-tuning): zero-shot predictions, whether or not its SM design was seen (the extrapolation
        flag's ``architecture`` bit)."""
        return [category for category in categories
                if not self.predictor.measured_on(KERNEL_CATEGORIES[category], hardware)]

    def option(self, name: str, value=None) -> str:
        """An option as the caller spells it: ``--name value`` on the command line, ``name=value`` in the API."""
        if self.keyword_options:
            return name if value is None else f"{name}={value!r}"
        return f"--{name}" if value is None else f"--{name} {value}"

    def flag_hint(self) -> str:
        return (f"give {self.option('collective_hardware', 'GPU')} (a GPU with collective models) or "
                f"{self.option('collective_estimate', 'analytical')}")

    def covering_hint(self, job: Job) -> str:
        """What to give instead: the GPUs whose measured models cover every collective (kind, workers) of the job,
        so that following the hint cannot lead to the next missing model."""
        from pipeweave.collectives import hardware_covering

        needed = {(fallback_kind(kind)[0], collective_workers(kind, job.workload.tp_size))
                  for kind, _ in job.workload.collectives}  # an all-gather needs the all-reduce model
        covering = hardware_covering(needed, self.collective_dir, self.registry)
        what = ", ".join(f"{kind} with {workers} workers" for kind, workers in sorted(needed))
        alternative = ("" if self.collective_estimate == "analytical"
                       else f" or {self.option('collective_estimate', 'analytical')}")
        shipped = [] if covering else hardware_covering(needed, self.collective_dir)
        if shipped:  # a hardware folder of one's own without those GPUs: --collective_hardware cannot name them yet
            return (f"GPUs with measured models for {what}: {', '.join(shipped)}, whose JSONs are not in "
                    f"{self.hardware_dir}: copy one of them there from hardware/ and name it with "
                    f"{self.option('collective_hardware')}{alternative.replace(' or ', ', or give ')}")
        if not covering:  # "give one of them" of none reads as a riddle
            return (f"no GPU has measured models for {what}"
                    + (f"; give {self.option('collective_estimate', 'analytical')} for the warned estimate"
                       if alternative else ""))
        return (f"GPUs with measured models for {what}: {', '.join(covering)}; give "
                f"{self.option('collective_hardware')} one of them{alternative}")

    # ---------------------------------------------------------------------------------------------
    def predict(self, jobs: Sequence[Job]) -> list[Prediction]:
        """Predict every job; raises before returning anything if any job cannot be predicted."""
        # the output's thousands of small dicts would trigger full collections over the interpreter's heap (about
        # 5 ms for a 403-iteration workload); nothing built here is cyclic
        with gc_paused():
            return self._predict(jobs)

    def predict_workload(self, workload: Workload | FlatWorkload | str | Path, hardware: str | HardwareSpec,
                         collective_hardware: str | None = None) -> dict:
        """The output object (docs/METHOD.md §7.5) of one workload on one GPU; ``workload`` may be an in-memory
        :class:`pipeweave.schema.Workload`, a flattened one or a workload file."""
        workload = as_flat_workload(workload)
        spec = hardware if isinstance(hardware, HardwareSpec) else self.gpu(hardware)
        return self.predict([Job(workload, spec, collective_hardware)])[0].result

    def iteration_ms(self, iteration: Iteration, hardware: str | HardwareSpec, tp_size: int = 1,
                     collective_hardware: str | None = None) -> float:
        """Predicted duration (ms) of one iteration, memoised on its operators, GPU and parallelism."""
        spec = hardware if isinstance(hardware, HardwareSpec) else self.gpu(hardware)
        key = (spec.stem, collective_hardware, tp_size, iteration.signature())
        found = self._iteration_ms.get(key)
        if found is None:
            # the stem names the call in errors: "Engine.iteration_ms: iteration 1: has no operators ..."
            workload = FlatWorkload.of(Workload([iteration], tp_size=tp_size), stem="Engine.iteration_ms")
            result = self.predict([Job(workload, spec, collective_hardware)])[0].result
            found = self._iteration_ms[key] = result["summary"]["total_duration_ms"]
        return found

    def _predict(self, jobs: Sequence[Job]) -> list[Prediction]:
        ops = sorted({op for job in jobs for op in job.workload.ops()}, key=list(KERNEL_CATEGORIES.values()).index)
        # collectives first (cheap): a missing collective model fails before the MLPs are loaded
        collective_of = {id(job): self.collective_predictor(job) for job in jobs if job.workload.has_communication}
        coll_ms: dict[int, tuple[np.ndarray, list[str]]] = {}
        for j, job in enumerate(jobs):
            if job.workload.has_communication:
                coll_ms[j] = self.collective_durations(job, collective_of[id(job)])
        self.load_models(ops)
        for job in jobs:
            self.warn_fa3_mismatch(job)

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
        unique_codes: dict[str, np.ndarray] = {}
        fastest_ms: dict[str, np.ndarray] = {}
        interval_factors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for op, table in tables.items():
            unique_ms[op], optimistic_ms[op], unique_codes[op], fastest_ms[op] = self.bounded_durations(op,
                                                                                                        list(table))
            interval_factors[op] = self.interval_factors(op, list(table), unique_codes[op])

        # 3. scatter back and assemble the outputs
        out = []
        for j, job in enumerate(jobs):
            single = np.zeros(len(job.workload.inst_code))
            best = np.zeros(len(job.workload.inst_code)) if self.quantile_predictor is not None else None
            extrapolated = np.zeros(len(job.workload.inst_code), dtype=bool)
            low, high = np.zeros(len(job.workload.inst_code)), np.zeros(len(job.workload.inst_code))
            siblings, same_die, unmeasured = {}, {}, []
            warning = self.predictor.respecified_warning(job.hardware)
            if warning and ("respecified", job.hardware.stem) not in self._warned:
                self._warned.add(("respecified", job.hardware.stem))
                self.log(warning)
            codes = job.workload.inst_code
            for category, op in KERNEL_CATEGORIES.items():
                rows = np.flatnonzero(codes == CATEGORY_CODE[category])
                if rows.size:
                    unmeasured += self.unmeasured(job.hardware, [category])
                    sibling = self.predictor.sibling(op, job.hardware)
                    if sibling is not None:
                        siblings[category] = sibling.name
                    die = self.predictor.die_sibling(op, job.hardware)
                    if die is not None:
                        same_die[category] = die.name
                    ids = maps[(j, op)][job.workload.inst_local[rows]]
                    single[rows] = unique_ms[op][ids]
                    extrapolated[rows] = unique_codes[op][ids] > 0
                    low[rows], high[rows] = physical_interval(single[rows], interval_factors[op][0][ids],
                                                              interval_factors[op][1][ids], fastest_ms[op][ids])
                    if best is not None:
                        best[rows] = optimistic_ms[op][ids]
            rows = np.flatnonzero(codes == COMMUNICATION_CODE)
            point_collectives, estimate_intervals = bool(rows.size), {}
            if rows.size:
                local = job.workload.inst_local[rows]
                single[rows] = coll_ms[j][0][local]
                low[rows] = high[rows] = single[rows]  # measured: intervals.COMMUNICATION_NOTE
                kinds = np.array([job.workload.collectives[i][0] for i in local])
                for kind in coll_ms[j][1]:
                    workers = collective_workers(kind, job.workload.tp_size)
                    factors = (calibrated_sweep_interval(self.calibration, job.hardware.stem, kind, workers)
                               or collective_of[id(job)].analytical_interval(kind, workers))
                    if factors is not None:
                        estimate_intervals[kind] = factors
                        low[rows[kinds == kind]] *= factors[0]
                        high[rows[kinds == kind]] *= factors[1]
                point_collectives = not np.isin(kinds, list(estimate_intervals)).all()
                if best is not None:
                    best[rows] = single[rows]
            source, borrowed = None, {}
            if job.workload.has_communication:
                predictor = collective_of[id(job)]
                measured = [k for k in COLLECTIVE_KINDS if k not in coll_ms[j][1]
                            and any(kind == k for kind, _ in job.workload.collectives)]
                borrowed = {k: how for k in measured
                            if (how := predictor.borrowed(k, collective_workers(k, job.workload.tp_size)))}
                parts = []
                if measured:
                    parts.append(f"{predictor.hardware} collective models ("
                                 + ", ".join(f"{k} as its {borrowed[k]}" if k in borrowed else k for k in measured)
                                 + ")")
                if coll_ms[j][1]:
                    parts.append(f"ANALYTICAL estimate ({', '.join(coll_ms[j][1])}, {predictor.hardware} link)")
                source = " + ".join(parts)
            result = build_result(job, single, best, extrapolated, (low, high, point_collectives))
            if unmeasured:  # zero-shot, whether or not the SM design was seen (the flags' `architecture` bit)
                result["extrapolation"]["unmeasured_gpu"] = unmeasured
            if borrowed:  # a kind predicted as another kind of this GPU (pipeweave.collectives.fallback_kind)
                result["extrapolation"]["collective_fallback"] = {k: f"its {how}" for k, how in borrowed.items()}
            if siblings:
                result["extrapolation"]["sibling"] = siblings
            if same_die:  # the trained GPU of the same die that bounds the category (pipeweave.siblings.die_band)
                result["extrapolation"]["same_die"] = same_die
            if j in coll_ms and coll_ms[j][1]:  # recorded in the output, not only in the console's WARNING
                predictor = collective_of[id(job)]
                result["extrapolation"]["analytical_collectives"] = {
                    "kinds": list(coll_ms[j][1]), "link_of": predictor.hardware,
                    "ring_efficiency": {kind: ring_record(*predictor.ring_efficiency(
                        kind, collective_workers(kind, job.workload.tp_size))) for kind in coll_ms[j][1]},
                    "interval": {kind: [round(f, 4) for f in estimate_intervals[kind]] if kind in estimate_intervals
                                 else None for kind in coll_ms[j][1]}}
            record = self.calibration_record(job.hardware)
            if record:
                result["calibration"] = record
            out.append(Prediction(job, result, source, extrapolated, (low, high)))
        return out

    def shape_ms(self, op: str, shapes: Sequence[tuple], hardware: HardwareSpec, label: str, end: str = "point"
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(durations in ms, unrounded; whether each is extrapolated) of distinct shapes of one operator class on one
        GPU, each what :meth:`predict` gives it as a single instance (calibration included; ``end`` ``"low"`` or
        ``"high"``: the end of its interval that the output's ``interval`` block sums), without building a workload:
        for callers that memoise shapes themselves (the serving simulator). ``label`` names the caller in
        warnings."""
        if end not in INTERVAL_ENDS:
            raise ValueError(f"end must be one of {', '.join(INTERVAL_ENDS)}, got {end!r}")
        self.load_models([op])
        if op == "attn":
            self._warn_fa3(label, [shape[0] for shape in shapes], hardware)
        keys = [(hardware.stem, shape) for shape in shapes]
        if end == "point":
            ms, _, codes = self.unique_durations(op, keys)
        else:
            point, _, codes, fastest = self.bounded_durations(op, keys)
            ms = physical_interval(point, *self.interval_factors(op, keys, codes), fastest)[end == "high"]
        return ms, codes > 0

    def unique_durations(self, op: str, keys: list[tuple[str, tuple]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(point ms, optimistic ms, extrapolation bits) of unique (GPU stem, shape) rows, checked finite and > 0."""
        return self.bounded_durations(op, keys, with_fastest=False)[:3]

    def bounded_durations(self, op: str, keys: list[tuple[str, tuple]], with_fastest: bool = True
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """:meth:`unique_durations` and, ``with_fastest``, the fastest ms the physical band allows each row
        (:func:`pipeweave.bounds.fastest_us`; an MoE pass's share of its layer's), the floor of its interval."""
        features, described = self.kernel_features(op, keys)
        fastest = self.fastest_ms(op, keys, features, described) if with_fastest else None
        point, optimistic, codes = self.kernel_durations(op, keys, features, described, fastest)
        check_durations(op, keys, point, optimistic)
        return point, optimistic, codes, fastest

    def fastest_ms(self, op: str, keys: list[tuple[str, tuple]], features: np.ndarray, described: np.ndarray
                   ) -> np.ndarray:
        """The fastest ms the physical band allows each unique (GPU stem, shape) row (an MoE pass: its share), and
        never faster than its cold operands' DRAM time (:meth:`cold_floor_ms`)."""
        from pipeweave.bounds import fastest_us, l2_cycles

        specs = [self.registry.get(stem) for stem, _ in keys]
        freq = np.array([spec.sm_freq for spec in specs], dtype=np.float64)
        l2 = np.array([l2_cycles(spec) for spec in specs], dtype=np.float64)
        fastest = fastest_us(op, features, described, freq, l2=l2)
        if op == "moe":
            fastest = pass_fastest_us(keys, self.registry, fastest)
        return np.maximum(fastest / 1000.0, self.cold_floor_ms(op, keys))

    def cold_floor_ms(self, op: str, keys: list[tuple[str, tuple]]) -> np.ndarray:
        """The DRAM time (ms) of the unique (GPU stem, shape) rows' cold operands, weights and cached KV, which a
        workload reads from DRAM whatever the L2 size (:func:`pipeweave.bounds.cold_fastest_us`)."""
        from pipeweave.bounds import cold_fastest_us

        operator = get_operator(op)
        if operator.cold_bytes is None or not keys:
            return np.zeros(len(keys))
        columns = shape_table(operator, [shape for _, shape in keys])
        bandwidth = [self.registry.get(stem).mem_bandwidth for stem, _ in keys]
        return cold_fastest_us(op, columns, bandwidth) / 1000.0

    def interval_factors(self, op: str, keys: list[tuple[str, tuple]], codes: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) multipliers of the point durations of the unique (GPU stem, shape) rows: the measured
        interval of each row's state (:mod:`pipeweave.intervals`: its GPU in the model's training data, outside it
        with its SM design trained, outside it altogether, or calibrated on the GPU's measured kernels)."""
        from pipeweave.intervals import row_factors

        return row_factors(op, self.predictor.trained_on(op), [self.registry.get(stem) for stem, _ in keys], codes,
                           self.calibration, [shape[0] for _, shape in keys] if op == "attn" else None)

    def forget_warnings(self) -> None:
        """Give each WARNING again, as a new run would: the Python API's calls share a cached engine, and each call is
        a run of its own (Python's warnings filter decides what repeats)."""
        self._warned.clear()

    def warn_fa3_mismatch(self, job: Job) -> None:
        """A FlashAttention-3 workload on a GPU that cannot run FA3 is predicted (the paper's matrix does so), but
        never without a word (once per workload and GPU)."""
        self._warn_fa3(job.workload.stem, [shape[0] for shape in job.workload.shapes.get("attn", [])], job.hardware)

    def _warn_fa3(self, label: str, attention_types, hardware: HardwareSpec) -> None:
        """The WARNING of FA3 kernels on a GPU that cannot run them, and of attention types no GPU measured."""
        for what, warning in attention_warnings(label, attention_types, hardware):
            if (label, hardware.stem, what) not in self._warned:
                self._warned.add((label, hardware.stem, what))
                self.log(warning)

    def kernel_features(self, op: str, keys: list[tuple[str, tuple]]) -> tuple[np.ndarray, np.ndarray]:
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
            if op == "moe":  # every pass is predicted through its whole measured layer (pipeweave.moe)
                shapes = [("layer", *shape[1:]) for shape in shapes]
            columns = shape_table(operator, shapes)
            features[rows] = operator.features(columns, hw)
            described[rows] = operator.descriptors(columns, hw)
        return features, described

    def kernel_durations(self, op: str, keys, features: np.ndarray, described: np.ndarray,
                         fastest: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(point, optimistic) durations in ms of the unique (GPU stem, shape) rows, each efficiency kept inside
        its physical band (:mod:`pipeweave.bounds`) and then calibrated if asked, never faster than the rows' cold
        operands allow (:meth:`cold_floor_ms`) nor, calibrated, past the band's fastest time (``fastest``:
        :meth:`fastest_ms` of the rows, cold floor included, when the caller has it), and the rows' extrapolation
        bits (:meth:`KernelPredictor.kernel_efficiency_and_codes`). The optimistic efficiency is the quantile
        model's, never below the point one (optimistic ≤ point), times EXTRAPOLATION_WIDENING where the row is
        extrapolated (still inside the band)."""
        from pipeweave.bounds import clip_efficiency, l2_cycles
        from pipeweave.predictor import duration_us

        stems = [stem for stem, _ in keys]
        shapes = [shape for _, shape in keys]
        specs = [self.registry.get(stem) for stem in stems]
        ideal, efficiency, codes, freq, share = self._model_rows(op, keys, features, described)
        point = self._calibrated(op, stems, duration_us(ideal, efficiency, freq) / 1000.0 * share, features, shapes)
        if self.calibration is not None:  # a correction cannot make the kernel beat its physical bound either
            fastest = self.fastest_ms(op, keys, features, described) if fastest is None else fastest
        elif fastest is None:  # without a correction the band holds the point (but for an MoE pass, whose floor is
            # its own FLOPs above its share of the layer's band); the cold operands are left
            fastest = self.fastest_ms(op, keys, features, described) if op == "moe" else self.cold_floor_ms(op, keys)
        point = np.maximum(point, fastest)
        if self.quantile_predictor is None:
            return point, point, codes
        upper = efficiency
        if self.quantile_ops.get(op):
            # an upper bound on efficiency can never give a longer time than the point prediction: where the
            # quantile model (trained separately, on a different loss) predicts a lower efficiency than the point
            # model, the point model is the better bound (and a calibration cannot reorder the two)
            upper = np.maximum(self.quantile_predictor.efficiency_from_features(op, features, described, freq),
                               efficiency)
        l2 = np.array([l2_cycles(spec) for spec in specs], dtype=np.float64)
        upper = clip_efficiency(op, np.where(codes > 0, upper * EXTRAPOLATION_WIDENING, upper), features, described,
                                freq, l2=l2)[0]
        optimistic = self._calibrated(op, stems, duration_us(ideal, upper, freq) / 1000.0 * share, features, shapes)
        return point, np.minimum(np.maximum(optimistic, fastest), point), codes

    def _model_rows(self, op: str, keys, features: np.ndarray, described: np.ndarray) -> tuple:
        """(C_ideal, efficiency inside the band, extrapolation bits, SM clock, share of the predicted row: an MoE
        pass's part of its layer, else 1) of the unique (GPU stem, shape) rows."""
        ideal = get_operator(op).ideal_cycles(features.astype(np.float32)).astype(np.float64)
        stems = [stem for stem, _ in keys]
        freq = np.array([self.registry.get(stem).sm_freq for stem in stems], dtype=np.float64)
        share = pass_shares(keys, self.registry) if op == "moe" else 1.0
        efficiency, codes = self.predictor.kernel_rows(op, features, described, stems)
        return ideal, efficiency, codes, freq, share

    def model_ms(self, op: str, keys, features: np.ndarray, described: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ms the model gives the unique rows inside the efficiency band, before any calibration and before the
        clamp to the fastest time; that fastest time, :meth:`fastest_ms`): a calibration scales the first and the
        engine keeps the result at or above the second, which a calibration fit must do the same way
        (:mod:`pipeweave.calibration_fit`)."""
        from pipeweave.predictor import duration_us

        ideal, efficiency, _, freq, share = self._model_rows(op, keys, features, described)
        return duration_us(ideal, efficiency, freq) / 1000.0 * share, self.fastest_ms(op, keys, features, described)

    def _calibrated(self, kind: str, stems: Sequence[str], ms: np.ndarray, features: np.ndarray | None = None,
                    shapes: Sequence[tuple] | None = None) -> np.ndarray:
        """``ms`` after the calibration's per-GPU correction (unchanged without a calibration)."""
        if self.calibration is None or not len(ms):
            return ms
        stems_array = np.asarray(stems, dtype=object)
        out = np.array(ms, dtype=np.float64)
        for stem in dict.fromkeys(stems):
            rows = np.flatnonzero(stems_array == stem)
            out[rows] = self.calibration.apply(kind, self.gpu(stem), out[rows],
                                               None if features is None else features[rows],
                                               None if shapes is None else [shapes[i] for i in rows])
        return out

    def collective_durations(self, job: Job, predictor) -> tuple[np.ndarray, list[str]]:
        """(ms per unique collective of the job's workload, kinds that used the analytical estimate)."""
        workload = job.workload
        out = np.zeros(len(workload.collectives))
        analytical = []
        for kind in COLLECTIVE_KINDS:
            rows = [i for i, (k, _) in enumerate(workload.collectives) if k == kind]
            if not rows:
                continue
            sizes = np.array([workload.collectives[i][1] for i in rows], dtype=np.float64)
            workers = collective_workers(kind, workload.tp_size)
            measured = predictor.available(kind) and (
                workers in predictor.worker_counts(kind) or (kind != "send_recv" and workers == 1))
            try:
                out[rows] = self._calibrated(kind, [job.hardware.stem] * len(rows),
                                             predictor.predict_ms(kind, sizes, workers),
                                             shapes=[(size, workers) for size in sizes])
            except (ValueError, FileNotFoundError) as exc:
                message = exc.args[0] if exc.args else str(exc)
                raise UserError(f"{workload.stem} on {job.hardware.stem}: cannot predict {kind} with "
                                f"{predictor.hardware}'s collective models: {message.split('; ')[0]}; "
                                f"{self.covering_hint(job)}") from None
            if not measured:
                analytical.append(kind)
                if (predictor.hardware, kind, workers) not in self._warned:
                    self._warned.add((predictor.hardware, kind, workers))
                    factor, basis = predictor.ring_efficiency(kind, workers)
                    floor = predictor.estimate_floor(kind, workers)
                    self.log(
                        f"WARNING: {kind} on {predictor.hardware} ({workers} workers) uses the ANALYTICAL collective "
                        f"estimate (pipeweave.collectives.CollectivePredictor.analytical_ms: hardware JSON link "
                        f"bandwidth and latency, the bandwidth term x {factor:.2f}, the ring efficiency {basis}; not "
                        f"measurements of this GPU) because no measured model covers it"
                        + ("" if fallback_kind(kind)[0] != "all_reduce" or not predictor.lacks_custom_allreduce_fit else
                           f"; {predictor.model_dir} has no trained models or serving.json, so small messages use "
                           f"the plain ring estimate, not the fitted custom all-reduce")
                        + ("" if workers <= NODE_GPUS else
                           f"; {workers} GPUs are more than one node's {NODE_GPUS}: the estimate takes them all on "
                           f"this GPU's own link, as one NVLink domain (an NVL72 rack) would be; a network between "
                           f"nodes is not modelled")
                        + ("" if not floor else
                           f"; it is held at no less than the measured {floor[0]} workers' time" if len(floor) == 1
                           else f"; it is held at no less than the faster of the measured {floor[0]} and {floor[1]} "
                                f"workers' times"))
        return out, analytical


def calibrated_sweep_interval(calibration, stem: str, kind: str, workers: int) -> tuple[float, float] | None:
    """(low, high) factors of an analytically estimated all-reduce (or the all-gather estimated as one) on the GPU
    ``stem`` at ``workers``, where ``calibration`` is that GPU's and was fitted on its own all-reduce sweep at that
    worker count: how far the sweep's sizes lie from the calibration fitted without them (cross-validated,
    10th-90th percentile; :func:`pipeweave.calibration_fit.kernel_spread`; widened to hold the point), in place of
    the spread of other GPUs around the uncalibrated estimate. None otherwise."""
    entry = spread_record(calibration, "all_reduce", stem) if fallback_kind(kind)[0] == "all_reduce" else None
    if entry is None or workers not in entry.get("workers", ()):
        return None
    return float(np.exp(min(entry["log_low"], 0.0))), float(np.exp(max(entry["log_high"], 0.0)))  # holds the point


def shape_table(operator, shapes: Sequence[tuple]) -> dict[str, list]:
    """Shape tuples (the registry's ``shape_columns`` order) as the column table the registry's functions take."""
    return {name: [shape[i] for shape in shapes] for i, name in enumerate(operator.shape_columns)}


def ring_record(factor: float, basis: str) -> dict:
    """The output's record of a ring efficiency (``extrapolation.analytical_collectives.ring_efficiency``)."""
    return {"factor": round(factor, 4), "basis": basis}


Aggregator = Engine  # the name the aggregator CLI and earlier code use
