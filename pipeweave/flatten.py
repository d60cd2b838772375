"""A workload flattened for the engine: one row per operator instance, distinct shapes per operator class.

:class:`FlatWorkload` turns a validated :class:`pipeweave.schema.Workload` into index arrays (iteration,
repeat count, category, index of the distinct shape or collective), so that the engine computes each distinct
shape once and scatters the durations back without a Python loop per instance.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analytical_model.registry import workload_operators
from pipeweave.paths import DEFAULT_WORKLOAD_DIR, command, workload_stem_dirs
from pipeweave.schema import NO_OPERATORS, Category, Workload, WorkloadFormatError, read_workload

#: workload operator key → registry operator class, in output order
KERNEL_CATEGORIES = {key: operator.key for key, operator in workload_operators().items()}
#: the categories in output order; a FlatWorkload's ``inst_code`` indexes this tuple
CATEGORIES = tuple(c.value for c in Category)
CATEGORY_CODE = {category: code for code, category in enumerate(CATEGORIES)}
COMMUNICATION_CODE = CATEGORY_CODE[Category.COMMUNICATION.value]


@dataclass
class FlatWorkload:
    """A validated workload flattened into operator instances (iteration order, then category order), with the
    distinct kernel shapes per registry operator and the distinct collectives."""

    path: Path | None
    stem: str
    model: str
    tp_size: int
    pp_size: int
    numbers: list[int]  # the "iteration" field of every iteration
    phases: list[str]
    #: per iteration: [(category, name or None, instance index)], in output order
    layout: list[list[tuple[str, str | None, int]]]
    #: per registry op: unique shape keys (tuples of the operator's shape columns)
    shapes: dict[str, list[tuple]]
    #: unique (kind, volume_bytes) of the collectives
    collectives: list[tuple[str, int]]
    inst_iter: np.ndarray  # iteration position of every instance
    inst_count: np.ndarray  # float64 repeat counts
    inst_code: np.ndarray  # index into CATEGORIES
    inst_local: np.ndarray  # index into shapes[op] (kernels) or collectives
    counts_int: list[int] = field(default_factory=list)
    #: what the memory check (pipeweave.memory) reads: model_params (None if absent), EP, dtype, prompt lengths, and
    #: the query lengths of the iteration with the most query tokens, whose activations are the peak
    model_params: dict | None = None
    ep_size: int = 1
    dtype: str = "bf16"
    prompt_lengths: list[int] = field(default_factory=list)
    peak_q_lengths: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, workload: Workload, stem: str = "workload", path: Path | None = None) -> "FlatWorkload":
        shapes: dict[str, list[tuple]] = {op: [] for op in KERNEL_CATEGORIES.values()}
        index: dict[str, dict[tuple, int]] = {op: {} for op in KERNEL_CATEGORIES.values()}
        inst_iter, inst_count, inst_code, inst_local, layout = [], [], [], [], []

        collectives: list[tuple[str, int]] = []
        coll_index: dict[tuple[str, int], int] = {}
        communication = Category.COMMUNICATION.value
        if not workload.iterations:  # an in-memory workload (a file's are checked by its reader)
            raise WorkloadFormatError(f"{stem}: 'iterations' must be a non-empty list")
        first = workload.iterations[0]
        for position, iteration in enumerate(workload.iterations):
            entries: list = []
            items = [(category, name, index[KERNEL_CATEGORIES[category]], shapes[KERNEL_CATEGORIES[category]],
                      op.shape, op.count) for category, name, op in iteration.kernels()]
            items += [(communication, op.name, coll_index, collectives, (op.kind, op.volume_bytes), op.count)
                      for op in iteration.communication]
            for category, name, table, values, key, count in items:
                local = table.get(key)
                if local is None:  # a shape (or message) not seen before
                    local = table[key] = len(values)
                    values.append(key)
                entries.append((category, name, len(inst_iter)))
                inst_iter.append(position)
                inst_count.append(count)
                inst_code.append(CATEGORY_CODE[category])
                inst_local.append(local)
            if not entries:  # an in-memory iteration (a file's are checked by its reader)
                raise WorkloadFormatError(f"{stem}: iteration {position + 1}: {NO_OPERATORS}")
            layout.append(entries)
        # a workload without a prefill iteration (decode steps alone) never runs a forward pass over its prompts
        attentions = [it.attention for it in workload.iterations if it.attention is not None]
        peak = max(attentions, key=lambda attention: sum(attention.q_lengths), default=None)
        return cls(
            path=path, stem=stem, model=workload.model, tp_size=workload.tp_size, pp_size=workload.pp_size,
            numbers=[it.iteration for it in workload.iterations], phases=[it.phase for it in workload.iterations],
            layout=layout, shapes=shapes, collectives=collectives,
            inst_iter=np.asarray(inst_iter, dtype=np.int64), inst_count=np.asarray(inst_count, dtype=np.float64),
            inst_code=np.asarray(inst_code, dtype=np.int64), inst_local=np.asarray(inst_local, dtype=np.int64),
            counts_int=inst_count, model_params=workload.model_params, ep_size=workload.ep_size,
            dtype=workload.dtype, prompt_lengths=list(first.attention.kv_lengths) if first.attention else [],
            peak_q_lengths=list(peak.q_lengths) if peak else [],
        )

    @property
    def has_communication(self) -> bool:
        return bool(self.collectives)

    def ops(self) -> list[str]:
        return [op for op in KERNEL_CATEGORIES.values() if self.shapes[op]]

    def parallelism_warning(self) -> str | None:
        """A WARNING line where ``tp_size`` / ``pp_size`` split the model over GPUs but no entry carries the
        communication that split needs (a hand-edited file): the prediction holds none of it, while the memory check
        takes the split; None for a consistent workload."""
        kinds = {kind for kind, _ in self.collectives}
        missing = []
        if self.tp_size > 1 and "all_reduce" not in kinds:
            missing.append(f"tp_size {self.tp_size} without an all_reduce (TP ranks sum their partial results)")
        if self.pp_size > 1 and "send_recv" not in kinds:
            missing.append(f"pp_size {self.pp_size} without a send/recv (stages pass their activations on)")
        if not missing:
            return None
        return (f"WARNING: {self.stem} has {' and '.join(missing)}: the prediction holds no such communication, while "
                f"the memory check takes the split ({command('workload_generator.py')} writes both)")

    def collective_summary(self) -> str:
        return ", ".join(sorted({kind for kind, _ in self.collectives}))


def parse_workload(data, source: str = "workload", path: Path | None = None) -> FlatWorkload:
    """Validate a workload object (docs/METHOD.md §6.4) and flatten it; errors name iteration and field."""
    stem = Path(source).stem if path is None else path.stem
    return FlatWorkload.of(Workload.from_dict(data, source), stem, path)


def resolve_workload_path(name: str | Path, workload_dir: Path = DEFAULT_WORKLOAD_DIR) -> Path:
    path = Path(name)
    if path.is_file():
        return path
    folders = workload_stem_dirs(workload_dir)
    if "/" not in str(name):
        for folder in folders:
            candidate = folder / (str(name) if str(name).endswith(".json") else f"{name}.json")
            if candidate.is_file():
                return candidate
    if path.is_dir():
        raise FileNotFoundError(f"workload {name} is a directory, not a workload JSON file")
    searched = "" if "/" in str(name) else f" (a stem is looked up in {' and '.join(map(str, folders))})"
    raise FileNotFoundError(f"workload file not found: {name}{searched}")


def load_workload(name: str | Path, workload_dir: Path = DEFAULT_WORKLOAD_DIR) -> FlatWorkload:
    """A workload file (a path, or a stem of ``workload_dir``), validated and flattened."""
    path = resolve_workload_path(name, workload_dir)
    return FlatWorkload.of(read_workload(path), path.stem, path)


