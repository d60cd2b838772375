"""The operator registry is the single source: a toy operator (one calculator + one registry entry) flows
through features, the training-data schema and the kernel-prediction plumbing; the tools' operator lists
are the registry's."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analytical_model import registry
from analytical_model.columns import int_column
from analytical_model.hardware import load_hardware
from analytical_model.pipes import HARDWARE_SPEC_COLUMNS
from analytical_model.registry import OPERATORS, OperatorClass, compute_features, get_operator, operator_keys
from dataset import build, sources  # imported before any toy registration: their lists are computed at import
from pipeweave import accuracy
from pipeweave.profiler import grids


def copy_calculator(rows: np.ndarray, width: np.ndarray, hw) -> np.ndarray:
    """A memory-bound row copy: one FMA per element, every byte read and written once (BF16)."""
    elements = rows.astype(np.float64) * width
    fma_cycles = elements / (hw.num_sms * 128)
    dram_cycles = 4.0 * elements / 1024 / hw.mem_bandwidth / 1024**2 * hw.sm_freq * 1e6
    return np.stack([fma_cycles, dram_cycles], axis=-1)


def toy_operator() -> OperatorClass:
    def compute(operator, columns, hw):
        rows, width = (int_column(columns, c) for c in ("rows", "width"))
        return operator.calculator("copy")(rows, width, hw)

    return OperatorClass(
        key="toy_copy",
        description="toy row copy (test only)",
        shape_columns=("rows", "width"),
        feature_names=("fma_all_cycle", "global_cycle"),
        ideal_cycle_features=("fma_all_cycle",),
        calculators={"copy": copy_calculator},
        compute=compute,
        descriptor_names=("shape_rows",),
        describe=lambda columns, hw: np.asarray(columns["rows"], dtype=np.float64)[:, None],
        workload_key="toy_copy",
    )


@pytest.fixture
def toy(monkeypatch):
    """Register the toy operator for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "OPERATORS", dict(OPERATORS))
    return registry.register(toy_operator())


def test_toy_operator_features(toy):
    frame = pd.DataFrame({"rows": [1, 64, 4096], "width": [8192, 8192, 5120], "hardware": ["H100", "A100", "H100"]})
    out = compute_features("toy_copy", frame)
    assert list(out.columns) == ["fma_all_cycle", "global_cycle", "shape_rows", "ideal_cycles"]
    h100 = load_hardware("H100")
    expected = copy_calculator(np.array([1]), np.array([8192]), h100)[0]
    assert out.loc[0, ["fma_all_cycle", "global_cycle"]].tolist() == pytest.approx(expected.tolist())
    assert out["ideal_cycles"].tolist() == pytest.approx(out["fma_all_cycle"].tolist(), rel=1e-6)
    # the same numbers from a plain mapping of numpy arrays (the prediction path, no pandas)
    columns = {"rows": np.array([1, 4096]), "width": np.array([8192, 5120])}
    assert toy.features(columns, h100) == pytest.approx(out.loc[[0, 2], list(toy.feature_names)].to_numpy())
    assert "toy_copy" in operator_keys(trainable=True) and "toy_copy" in registry.workload_operators()


def test_toy_operator_training_schema(toy):
    raw = pd.DataFrame({"rows": [16, 16, 256], "width": [4096, 4096, 4096], "hardware": ["H100"] * 3,
                        "avg_duration": [2.0, 4.0, 9.0], "source": ["test"] * 3})
    built = build.build_operator("toy_copy", raw, log=lambda message: None)
    assert list(built.columns) == ["rows", "width", "avg_duration", "hardware", *HARDWARE_SPEC_COLUMNS,
                                   "fma_all_cycle", "global_cycle", "shape_rows", "overall_perf", "source", "dtype"]
    assert built["avg_duration"].tolist() == [3.0, 9.0]  # repeats of a shape are averaged
    h100 = load_hardware("H100")
    ideal = toy.ideal_cycles(built[list(toy.feature_names)].to_numpy(np.float32))
    assert built["overall_perf"].to_numpy() == pytest.approx(ideal / (built["avg_duration"].to_numpy() * h100.sm_freq))


def test_toy_operator_prediction(toy, tmp_path):
    from benchmarks.aggregator import write_untrained_models
    from pipeweave.predictor import KernelPredictor

    write_untrained_models(tmp_path, ops=("toy_copy",), efficiency={"toy_copy": 0.25})
    predictor = KernelPredictor(tmp_path)
    # large enough that no bound of the band binds (the shortest kernel any operator was measured at is 1 µs)
    frame = pd.DataFrame({"rows": [4096, 65536], "width": [4096, 8192], "hardware": ["A100", "H100"]})
    out = predictor.predict_frame("toy_copy", frame)
    freq = np.array([load_hardware("A100").sm_freq, load_hardware("H100").sm_freq])
    assert out["predicted_perf"].to_numpy() == pytest.approx([0.25, 0.25], rel=0.05)
    assert out["predicted_us"].to_numpy() == pytest.approx(
        out["ideal_cycles"].to_numpy() / (out["predicted_perf"].to_numpy() * freq))


def test_an_element_wise_operator_added_later_is_predicted_with_intervals_calibrated_and_named_by_the_profiler(
        monkeypatch):
    """An audit added a GELU-like operator as one calculator and one registry entry: its predictions failed for
    want of measured intervals, any calibration refused workloads holding it, and the profiler measured nothing
    without a word."""
    from analytical_model import siluandmul
    from pipeweave.calibration_design import kernel_classes
    from pipeweave.intervals import TRAINED, other_model_warning, shipped_table
    from pipeweave.profiler import grids

    monkeypatch.setattr(registry, "OPERATORS", dict(OPERATORS))
    registry.register(registry.elementwise_operator("toy_gelu", "toy activation (test only)", siluandmul.features,
                                                     1.0))
    table = shipped_table()
    low, high = table.factors("toy_gelu", np.array([TRAINED]))
    widest = [table.factors(op, np.array([TRAINED])) for op in table.operators()]
    assert low[0] == min(w[0][0] for w in widest) and high[0] == max(w[1][0] for w in widest)
    assert other_model_warning("toy_gelu", "mlp_models").startswith("WARNING: no 80 % intervals were measured")
    assert list(kernel_classes("toy_gelu", 2)) == ["elementwise", "elementwise"]
    monkeypatch.setattr(grids, "OPS", (*grids.OPS, "toy_gelu"))  # as computed at import once registered there
    grid = grids.build_grid([], ops=["toy_gelu"], quick=True)
    assert "toy_gelu" not in grid.rows and any(note.startswith("toy_gelu: no shape grid") for note in grid.notes)
    # a workload holding it says what is missing
    from pipeweave.schema import Workload, WorkloadFormatError

    iteration = {"iteration": 1, "phase": "decode", "operators": {"toy_gelu": {"seq": 1, "dim": 4096, "count": 1}}}
    with pytest.raises(WorkloadFormatError, match="toy_gelu is a registered operator, which enters workloads once"):
        Workload.from_dict({"model": "m", "tp_size": 1, "pp_size": 1, "iterations": [iteration]})


def test_tools_take_their_operator_lists_from_the_registry():
    assert build.TRAINABLE_OPS == sources.OPS == accuracy.OPS == operator_keys(trainable=True)
    for op in sources.OPS:
        assert tuple(sources.SHAPE_COLUMNS[op]) == get_operator(op).shape_columns
    assert grids.OPS[:-1] == operator_keys(profiled=True) and grids.OPS[-1] == "all_reduce"
    assert set(operator_keys(quantile=True)) <= set(operator_keys(trainable=True))


def test_calculators_are_the_ones_used():
    """Replacing a registered calculator changes the features: the registry's table is what runs."""
    gemm = get_operator("gemm")
    hw = load_hardware("H100")
    columns = {"M": np.array([128]), "N": np.array([4096]), "K": np.array([4096])}
    marked = OperatorClass(**{**gemm.__dict__, "calculators": {
        "sm90": lambda problem, hw: np.full((1, len(gemm.feature_names)), 7.0), "sm80": gemm.calculators["sm80"]}})
    assert marked.features(columns, hw).tolist() == [[7.0] * len(gemm.feature_names)]
    with pytest.raises(ValueError, match="no calculator 'sm90'"):
        OperatorClass(**{**gemm.__dict__, "calculators": {}}).features(columns, hw)


def test_input_rows_append_the_descriptors_only_for_models_trained_with_them():
    operator = get_operator("gemm")
    features = np.ones((2, len(operator.feature_names)))
    described = np.full((2, len(operator.descriptor_names)), 2.0)
    assert operator.input_rows(features, described, len(operator.feature_names), "m") is features
    both = operator.input_rows(features, described, len(operator.input_names()), "m")
    np.testing.assert_array_equal(both, np.concatenate([features, described], axis=1))
    with pytest.raises(ValueError, match="mlp_models/gemm/x needs the gemm shape descriptors"):
        operator.input_rows(features, None, len(operator.input_names()), "mlp_models/gemm/x")


def test_fp8_gemm_reads_the_pipeweave_harness_of_a_measurement_and_a_prediction_is_the_reference_one():
    """A dataset row names its harness in ``source``; the FP8 GEMM model gets a 1 for PipeWeave's, a 0 for every
    other harness, and a shape to predict (no ``source``) is a measurement of the reference harness: 0."""
    operator = get_operator("gemm_fp8")
    assert operator.harness_families == ("pipeweave",) and operator.descriptor_names[-1] == "pipeweave_harness"
    assert "pipeweave_harness" not in get_operator("gemm").input_names()
    rows = pd.DataFrame({"M": [8, 8, 8, 8], "N": [4096] * 4, "K": [4096] * 4, "hardware": ["NVIDIA H100"] * 4,
                         "source": ["pipeweave 0a1b dataset/fp8_gemm_h100.csv", "aiconfigurator-core 0.12.0 h100_sxm",
                                    "measured profile.csv", ""]})
    described = compute_features("gemm_fp8", rows)
    assert described["pipeweave_harness"].tolist() == [1.0, 0.0, 0.0, 0.0]
    shape_only = operator.descriptors({c: rows[c].to_numpy() for c in ("M", "N", "K")}, load_hardware("H100"))
    assert shape_only[:, -1].tolist() == [0.0] * 4
    np.testing.assert_array_equal(shape_only[:, :-1], described[list(operator.descriptor_names[:-1])].to_numpy())
    assert registry.source_family("vidur 7d47513 h100/mlp.csv") == "vidur" and registry.source_family("") == ""


def test_bf16_gemm_reads_the_vidur_harness_and_takes_pipeweaves_stand_in_rows_as_the_reference():
    """The BF16 GEMM model tells Vidur's rows apart; H20's FP8 stand-in rows (PipeWeave's harness) are 0, as are
    aiconfigurator's and a shape to predict."""
    operator = get_operator("gemm")
    assert operator.harness_families == ("vidur",) and operator.descriptor_names[-1] == "vidur_harness"
    rows = pd.DataFrame({"M": [64] * 4, "N": [4096] * 4, "K": [4096] * 4, "hardware": ["NVIDIA H100"] * 4,
                         "source": ["vidur 7d47513 h100/mlp.csv", "aiconfigurator-core 0.12.0 h100_sxm",
                                    "pipeweave 0a1b dataset/fp8_gemm_h20.csv", ""]})
    assert compute_features("gemm", rows)["vidur_harness"].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_an_operator_without_harness_inputs_ignores_the_source_column():
    rows = pd.DataFrame({"seq": [64], "dim": [4096], "hardware": ["NVIDIA H100"], "source": ["vidur x"]})
    assert get_operator("rmsnorm").harness_families == ()
    with_source = compute_features("rmsnorm", rows)
    np.testing.assert_array_equal(with_source.to_numpy(),
                                  compute_features("rmsnorm", rows.drop(columns="source")).to_numpy())
    assert list(with_source.columns[-len(get_operator("rmsnorm").descriptor_names) - 1:-1]) == \
        list(get_operator("rmsnorm").descriptor_names)
