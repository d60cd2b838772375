"""The workload schema (pipeweave/schema.py) and the engine's public surface (pipeweave/engine.py): in-memory
workloads, memoised single iterations, calibration hooks."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analytical_model.registry import workload_operators
from pipeweave.engine import Engine, Job
from pipeweave.flatten import load_workload
from pipeweave.schema import (KERNEL_CATEGORIES, AttentionOp, Category, CollectiveOp, ElementwiseOp, GemmOp, Iteration,
                              Workload, WorkloadFormatError, read_workload)

REPO = Path(__file__).resolve().parent.parent
TP2 = REPO / "workload" / "Qwen3-32B_arxiv_12_fa2_tp2_pp1.json"


@pytest.fixture(scope="module")
def engine(models) -> Engine:
    return Engine(model_dir=models, log=None)


def small_workload(iterations: int = 4) -> Workload:
    workload = read_workload(TP2)
    workload.iterations = workload.iterations[:iterations]
    return workload


def mixed_batch() -> Iteration:
    """A serving-style batch: one prefill request of 300 tokens and three decode requests."""
    q, kv = (300, 1, 1, 1), (300, 513, 77, 1025)
    tokens = sum(q)
    return Iteration("prefill", gemm=[GemmOp("qkv_proj", tokens, 5120, 5120, 64), GemmOp("lm_head", 4, 151936, 5120, 1)],
                     attention=AttentionOp("fa2_ragged", 4, q, kv, 32, 4, 128, 64),
                     rmsnorm=ElementwiseOp(tokens, 5120, 129), siluandmul=ElementwiseOp(tokens, 13824, 64),
                     communication=[CollectiveOp("all_reduce", tokens * 5120 * 2, 128, "collective")])


def test_schema_categories_are_the_registry_workload_keys():
    assert [c.value for c in KERNEL_CATEGORIES] == list(workload_operators())
    assert [c.value for c in Category][-1] == "communication"


def test_schema_round_trip_is_exact():
    data = json.loads(TP2.read_text())
    assert Workload.from_dict(data, "w.json").to_dict() == data


def test_schema_errors_name_iteration_and_field():
    data = small_workload(2).to_dict()
    data["iterations"][1]["operators"]["siluandmul"]["dim"] = "4"
    with pytest.raises(WorkloadFormatError, match=r"w.json: iteration 2: operators.siluandmul.dim must be a positive"):
        Workload.from_dict(data, "w.json")


def test_predict_workload_from_memory_equals_file(engine, tmp_path):
    workload = small_workload()
    path = tmp_path / "w.json"
    path.write_bytes(workload.to_json_bytes())
    from_memory = engine.predict_workload(workload, "A100")
    from_file = engine.predict([Job(load_workload(path), engine.gpu("A100"))])[0].result
    assert from_memory["iterations"] == from_file["iterations"]
    assert from_memory["summary"] == from_file["summary"] and from_memory["summary"]["total_duration_ms"] > 0


def test_iteration_ms_is_the_one_iteration_total_and_memoised(engine):
    batch = mixed_batch()
    first = engine.iteration_ms(batch, "A100", tp_size=2)
    whole = engine.predict_workload(Workload([batch], tp_size=2), "A100")
    assert first == whole["summary"]["total_duration_ms"] > 0
    # a memo hit: the same batch again, even as a new object, does not predict again
    calls = []
    original = engine.predict
    engine.predict = lambda jobs: calls.append(jobs) or original(jobs)
    try:
        assert engine.iteration_ms(mixed_batch(), "A100", tp_size=2) == first
        assert not calls
        engine.iteration_ms(mixed_batch(), "H100", tp_size=2)
        assert len(calls) == 1
    finally:
        del engine.predict


class Scale:
    """A per-GPU multiplicative calibration of the kind the engine accepts."""

    def __init__(self, factors: dict[str, float]):
        self.factors, self.seen = factors, set()

    def apply(self, kind, hardware, durations_ms, features=None, shapes=None):
        self.seen.add(kind)
        if kind in ("all_reduce", "send_recv"):  # collectives come with (message bytes, workers), row for row
            assert features is None and len(shapes) == len(durations_ms) and all(len(s) == 2 for s in shapes)
        else:  # kernels come with their features and shape keys, row for row
            assert len(features) == len(shapes) == len(durations_ms)
        return durations_ms * self.factors.get(hardware.stem, 1.0)

    def record(self, hardware):
        return None


def test_calibration_scales_every_kernel_and_collective(engine, monkeypatch):
    # the untrained models put some kernels below their cold operands' DRAM time, which then sets their time
    monkeypatch.setattr(Engine, "cold_floor_ms", lambda self, op, keys: np.zeros(len(keys)))
    workload = small_workload(3)
    plain = engine.predict_workload(workload, "A100")
    calibration = Scale({"A100": 2.0})
    calibrated = Engine(model_dir=engine.model_dir, calibration=calibration, log=None).predict_workload(workload, "A100")
    for before, after in zip(plain["iterations"], calibrated["iterations"]):
        assert after["total_duration_ms"] == pytest.approx(2 * before["total_duration_ms"], rel=1e-6)
    assert calibration.seen == {"gemm", "attn", "rmsnorm", "siluandmul", "all_reduce"}
    other = Engine(model_dir=engine.model_dir, calibration=Scale({"A100": 2.0}), log=None).predict_workload(workload,
                                                                                                      "H100")
    assert other["summary"] == engine.predict_workload(workload, "H100")["summary"]
    assert np.isfinite(calibrated["summary"]["total_duration_ms"])


GEMM = {"name": "qkv_proj", "M": 8, "N": 7168, "K": 5120, "count": 48}
DECODE = {"attention_type": "fa2_paged", "bs": 2, "q_lengths": [1, 1], "kv_lengths": [900, 900], "nh": 40, "nkv": 8,
          "hd": 128, "count": 48}


@pytest.mark.parametrize("make, category, entry, field", [
    (lambda: GemmOp("qkv_proj", 8, 7168, 5120, 0), "gemm", {**GEMM, "count": 0}, "count"),
    (lambda: GemmOp("qkv_proj", 8, 7168, 5120.0, 48), "gemm", {**GEMM, "K": 5120.0}, "K"),
    (lambda: ElementwiseOp(8, 5120, 0), "rmsnorm", {"seq": 8, "dim": 5120, "count": 0}, "count"),
    (lambda: AttentionOp("fa2_paged", 3, (1, 1), (900, 900), 40, 8, 128, 48), "attention", {**DECODE, "bs": 3},
     "q_lengths"),
    (lambda: AttentionOp("fa2_paged", 2, (1, 1), (900, 900), 40, 8, 100, 48), "attention", {**DECODE, "hd": 100},
     "hd"),
    (lambda: CollectiveOp("all_reduce", 0, 1, "collective"), "communication",
     {"name": "all_reduce", "type": "collective", "volume_bytes": 0, "count": 1}, "volume_bytes"),
])
def test_in_memory_entries_are_refused_as_a_file_refuses_them(make, category, entry, field):
    """An entry with count 0 was predicted as 0.0 ms (and other fields a file refuses went unchecked): an in-memory
    entry is checked when made, with the file reader's message, named by its class instead of its JSON path."""
    with pytest.raises(WorkloadFormatError) as in_memory:
        make()
    listed = category in ("gemm", "communication")
    data = {"iterations": [{"phase": "decode", "operators": {category: [entry] if listed else entry}}]}
    with pytest.raises(WorkloadFormatError) as from_file:
        Workload.from_dict(data, "w.json")
    path = f"w.json: iteration 1: operators.{category}{'[0]' if listed else ''}.{field}"
    assert str(from_file.value).startswith(path)
    assert str(in_memory.value).split(f".{field}", 1)[1] == str(from_file.value).removeprefix(path)


def test_empty_iterations_and_unknown_phases_are_refused_in_memory(engine):
    """Engine.iteration_ms(Iteration("decode"), ...) returned 0 ms and Iteration("foo", ...) was accepted; a workload
    file refuses both ("has no operators", "phase must be ...")."""
    with pytest.raises(WorkloadFormatError, match=r"^Engine.iteration_ms: iteration 1: has no operators \(an empty "
                                                  r"iteration would be predicted as 0 ms\)$"):
        engine.iteration_ms(Iteration("decode"), "A100")
    with pytest.raises(WorkloadFormatError, match=r"^Iteration: phase must be \"prefill\" or \"decode\", got 'foo'$"):
        Iteration("foo", rmsnorm=ElementwiseOp(8, 5120, 1))
    step = Iteration("decode", rmsnorm=ElementwiseOp(8, 5120, 1))
    with pytest.raises(WorkloadFormatError, match=r"^workload: iteration 2: has no operators"):
        engine.predict_workload(Workload([step, Iteration("decode")]), "A100")
    with pytest.raises(WorkloadFormatError, match=r"^workload: 'iterations' must be a non-empty list$"):
        engine.predict_workload(Workload([]), "A100")
    assert engine.iteration_ms(step, "A100") > 0


@pytest.mark.parametrize("fields, message", [
    ({"pp_size": 0}, r"^Workload: pp_size must be a positive integer, got 0$"),
    ({"tp_size": 2.5}, r"^Workload: tp_size must be a positive integer, got 2.5$"),
    ({"dtype": "int4"}, r"^Workload: dtype must be one of bf16, fp8, got 'int4'$"),
])
def test_in_memory_workload_fields_are_refused_as_a_file_refuses_them(fields, message):
    """Workload(..., pp_size=0) or dtype 'int4' used to be predicted without a word (a file refuses both)."""
    step = Iteration("decode", rmsnorm=ElementwiseOp(8, 5120, 1))
    with pytest.raises(WorkloadFormatError, match=message):
        Workload([step], **fields)
    with pytest.raises(WorkloadFormatError, match=r"^Iteration: iteration must be a positive integer, got 0$"):
        Iteration("decode", iteration=0, rmsnorm=ElementwiseOp(8, 5120, 1))
    with pytest.raises(WorkloadFormatError, match=r"^Iteration: batch_size must be a positive integer up to 65,536, "
                                                  r"got -1$"):
        Iteration("decode", batch_size=-1, rmsnorm=ElementwiseOp(8, 5120, 1))
    with pytest.raises(WorkloadFormatError, match=r"^Iteration: q_lengths has 1 entries but batch_size is 2$"):
        Iteration("decode", batch_size=2, q_lengths=[1], rmsnorm=ElementwiseOp(8, 5120, 1))
