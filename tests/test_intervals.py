"""Measured prediction intervals (pipeweave.intervals, pipeweave.interval_eval; docs/METHOD.md §4.4)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analytical_model.hardware import load_hardware
from analytical_model.registry import OPERATORS, get_operator
from pipeweave import quantize_model
from pipeweave.bounds import shipped_tables
from pipeweave.engine import Engine, Job
from pipeweave.flatten import load_workload
from pipeweave.interval_eval import (MIN_GPUS, coverage, donors, pooled_quantiles, predictive_quantiles, table_entry,
                                     trained_ratios)
from pipeweave.intervals import (DEFAULT_PATH, FORMAT, STATES, TRAINED, UNSEEN_ARCHITECTURE, UNSEEN_GPU,
                                 IntervalTable, calibrated_kernels, prediction_states, shipped_table)
from pipeweave.paths import DATASET_DIR, DEFAULT_WORKLOAD_DIR
from pipeweave.predictor import UNSEEN_ARCHITECTURE as ARCHITECTURE_BIT, KernelPredictor

TP4_PP2 = DEFAULT_WORKLOAD_DIR / "Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2.json"
TP1 = DEFAULT_WORKLOAD_DIR / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json"


def width(table: IntervalTable, op: str, state: int) -> float:
    low, high = table.factors(op, np.array([state]))
    return float(high[0] / low[0])


def test_shipped_table_covers_every_model_and_widens_outside_training():
    table = shipped_table()
    assert set(table.operators()) == {operator.model_op for operator in OPERATORS.values()}
    for op in table.operators():
        for state in range(len(STATES)):
            low, high = table.factors(op, np.array([state]))
            assert 0 < low[0] < high[0]
        # the requirement: the interval is wider where the model extrapolates than where it trained
        assert width(table, op, UNSEEN_ARCHITECTURE) > width(table, op, TRAINED), op
        assert width(table, op, UNSEEN_GPU) > width(table, op, TRAINED), op
    # the quantisation takes its bandwidth fit's own intervals, not RMSNorm's (pipeweave.quantize_model), wider
    # outside the fit too
    stored = quantize_model.load()["intervals"]
    for state, name in enumerate(STATES):
        low, high = table.factors("quantize", np.array([state]))
        assert (np.log(low[0]), np.log(high[0])) == pytest.approx((stored[name]["log_low"], stored[name]["log_high"]))
    assert width(table, "quantize", UNSEEN_GPU) >= width(table, "quantize", TRAINED)
    assert width(table, "quantize", UNSEEN_ARCHITECTURE) > width(table, "quantize", TRAINED)


def test_calibration_narrows_the_interval_of_a_gpu_outside_training():
    table = shipped_table()
    for op in table.operators():
        shots = sorted(json.loads(DEFAULT_PATH.read_text())["operators"][op]["calibrated"], key=int)
        assert [int(k) for k in shots] == [8, 32, 128]
        # the premise for calibrating: measured kernels of the GPU make its prediction more certain
        calibrated = table.factors(op, np.array([UNSEEN_ARCHITECTURE]), calibrated_kernels=128)
        assert calibrated[1] / calibrated[0] < width(table, op, UNSEEN_ARCHITECTURE), op


def test_calibrated_state_takes_the_largest_evaluated_k_and_spares_trained_gpus():
    entry = {"log_low": -0.2, "log_high": 0.2}
    calibrated = {"8": {"log_low": -0.15, "log_high": 0.15}, "32": {"log_low": -0.1, "log_high": 0.1},
                  "128": {"log_low": -0.05, "log_high": 0.05}}
    table = IntervalTable({"format": FORMAT, "levels": [0.1, 0.9], "operators": {"gemm": {
        "trained": {"log_low": -0.01, "log_high": 0.01}, "unseen_gpu": entry, "unseen_architecture": entry,
        "calibrated": calibrated}}})
    states = np.array([TRAINED, UNSEEN_GPU, UNSEEN_ARCHITECTURE])
    assert table.calibrated_shots("gemm", 7) is None and table.calibrated_shots("gemm", 40) == 32
    assert np.log(table.factors("gemm", states, 7)[1]) == pytest.approx([0.01, 0.2, 0.2])
    assert np.log(table.factors("gemm", states, 40)[1]) == pytest.approx([0.01, 0.1, 0.1])
    assert np.log(table.factors("gemm", states, 10_000)[0]) == pytest.approx([-0.01, -0.05, -0.05])


def test_a_calibration_whose_kernels_scatter_more_widens_its_interval_never_narrows_it():
    entry = {"log_low": -0.2, "log_high": 0.2}
    table = IntervalTable({"format": FORMAT, "levels": [0.1, 0.9], "operators": {"gemm": {
        "trained": {"log_low": -0.01, "log_high": 0.01}, "unseen_gpu": entry, "unseen_architecture": entry,
        "calibrated": {"8": {"log_low": -0.1, "log_high": 0.1}}}}})
    states = np.array([TRAINED, UNSEEN_ARCHITECTURE])
    low, high = np.log(table.factors("gemm", states, 8, spread=(-0.3, 0.05)))
    assert low == pytest.approx([-0.3, -0.3]) and high == pytest.approx([0.05, 0.1])  # the wider end only
    low, high = np.log(table.factors("gemm", states, 8, spread=(-0.02, 0.02)))
    # a trained GPU's own interval widened to its kernels' scatter (calibrate.py says so; it was recorded unused)
    assert low == pytest.approx([-0.02, -0.1]) and high == pytest.approx([0.02, 0.1])
    assert np.log(table.factors("gemm", states, 7, spread=(-0.3, 0.3))[0]) == pytest.approx([-0.01, -0.2])  # < 8


def test_quantisation_keeps_its_fits_interval_under_a_calibration_of_rmsnorm_kernels():
    """Quantisation takes RMSNorm's correction, but RMSNorm's k-shot interval (and its kernels' spread) describe
    another kernel: they narrowed quantisation's interval from x0.65-1.55 to x0.90-1.13 without one measured."""
    table = shipped_table()
    states = np.array([TRAINED, UNSEEN_GPU, UNSEEN_ARCHITECTURE])
    plain = table.factors("quantize", states)
    for kernels, spread in ((32, None), (200, (-0.01, 0.01)), (200, (-0.9, 0.9))):
        np.testing.assert_array_equal(table.factors("quantize", states, kernels, spread), plain)
    assert not np.allclose(table.factors("rmsnorm", states, 32)[0], table.factors("rmsnorm", states)[0])


class KernelCalibration:
    """A stand-in for a calibrate.py file of one GPU, fitted on ``kernels`` GEMMs; it changes no duration."""

    def __init__(self, hardware: str, kernels: int):
        self.hardware, self.kernels = hardware, kernels

    def kernel_count(self, op: str) -> int:
        return self.kernels if op == "gemm" else 0

    def apply(self, kind, hardware, durations_ms, features=None, shapes=None):
        return durations_ms

    def record(self, hardware):
        return None


def test_engine_and_predict_kernels_take_the_calibrated_interval_of_the_calibrated_gpu(tmp_path):
    from pipeweave.kernels import interval_us

    assert calibrated_kernels(None, "gemm", "L40") == 0
    assert calibrated_kernels(KernelCalibration("L40", 40), "gemm", "L40S") == 0  # another GPU's
    assert calibrated_kernels(KernelCalibration("L40", 40), "gemm", "L40") == 40
    keys = [("L40", (4096, 4096, 4096)), ("L40S", (4096, 4096, 4096))]
    plain = Engine(log=None)
    calibrated = Engine(log=None, calibration=KernelCalibration("L40", 40))
    for engine in (plain, calibrated):
        engine.load_models(["gemm"])
    codes = plain.kernel_durations("gemm", keys, *plain.kernel_features("gemm", keys))[2]
    before, after = plain.interval_factors("gemm", keys, codes), calibrated.interval_factors("gemm", keys, codes)
    assert after[1][0] / after[0][0] < before[1][0] / before[0][0]  # L40: calibrated on 40 GEMMs
    assert (after[0][1], after[1][1]) == (before[0][1], before[1][1])  # L40S is in training: unchanged
    table = shipped_table()
    assert after[1][0] == pytest.approx(table.factors("gemm", np.array([UNSEEN_GPU]), 32)[1][0])
    predictor = KernelPredictor()
    low, high = interval_us("gemm", predictor, ["L40"], np.array([10.0]), codes[:1], np.array([1.0]),
                            KernelCalibration("L40", 40))
    assert (low[0] / 10.0, high[0] / 10.0) == pytest.approx((after[0][0], after[1][0]))


def test_a_callers_own_kernel_count_of_one_argument_serves_attention_rows():
    """The engine's documented hook is kernel_count(op): attention rows, which count their class's kernels, called
    it with the class as well, a TypeError for a caller's own correction (every class's kernels are its count)."""

    class AttentionCalibration(KernelCalibration):
        def kernel_count(self, op: str) -> int:
            return self.kernels if op == "attn" else 0

    keys = [("L40", ("fa2_ragged", 1, (2048,), (2048,), 32, 8, 128)),
            ("L40", ("fa2_paged", 8, (1,) * 8, (4096,) * 8, 32, 8, 128))]
    assert calibrated_kernels(AttentionCalibration("L40", 40), "attn", "L40", "attn_prefill") == 40
    plain = Engine(log=None)
    calibrated = Engine(log=None, calibration=AttentionCalibration("L40", 40))
    codes = np.zeros(len(keys), dtype=np.int64)
    before, after = plain.interval_factors("attn", keys, codes), calibrated.interval_factors("attn", keys, codes)
    assert (after[1] - after[0] < before[1] - before[0]).all()  # both classes: the calibrated state's interval


def streamed_us(total_bytes: int, bandwidth: float) -> float:
    """The fastest a GEMM whose bytes spill the L2 may run: at the datasheet ``bandwidth`` (B/s) times the fastest
    streaming speed any measured GEMM reached beyond 1.05x its L2 (0.93, ``pipeweave/efficiency_band.json``)."""
    speed = shipped_tables()["gemm"]["dram_speed_max"][-1]
    assert speed == pytest.approx(0.93, abs=0.01)
    return total_bytes / bandwidth * 1e6 / speed


def test_no_interval_reaches_below_the_fastest_time_physics_allows():
    """M = 8192, N = 1, K = 8192 streams a 134 MB operand through L40S's 96 MiB L2: the point sits on the
    DRAM time at the fastest speed any GEMM streamed bytes beyond 1.05x its L2 (bytes / 864 GB/s / 0.93), and the
    low end may not go below it; a 16384³ GEMM on H20 sits on its tensor roofline. Far from any bound the low end is
    the table's factor."""
    import pipeweave

    shapes = {"M": [8192, 16384, 4096], "N": [1, 16384, 4096], "K": [8192, 16384, 4096]}
    gpus = ["L40S", "H20", "H100"]
    point, low, high = pipeweave.predict_kernels("gemm", shapes, gpus, interval=True)
    dram_us = streamed_us(2 * (8192 * 8192 + 8192) + 2 * 8192, 864e9)
    assert point[0] == pytest.approx(dram_us, rel=1e-9) and low[0] == pytest.approx(dram_us, rel=1e-9)
    tensor_us = 2 * 16384 ** 3 / (1024 * 78 * 1830e6) * 1e6
    assert point[1] == pytest.approx(tensor_us, rel=1e-9) and low[1] == pytest.approx(tensor_us, rel=1e-9)
    assert low[2] < point[2] < high[2]
    factors = shipped_table().factors("gemm", np.array([TRAINED]))
    assert low[2] / point[2] == pytest.approx(factors[0][0]) and high[2] / point[2] == pytest.approx(factors[1][0])
    engine = Engine(log=None)
    engine.load_models(["gemm"])
    keys = [(load_hardware(gpu).stem, tuple(shapes[c][i] for c in "MNK")) for i, gpu in enumerate(gpus)]
    fastest = engine.bounded_durations("gemm", keys)[3]
    assert fastest[:2] * 1000 == pytest.approx([dram_us, tensor_us], rel=1e-9)


class HalvingCalibration(KernelCalibration):
    """A correction that makes every kernel of its GPU twice as fast (no fine-tuned model)."""

    def fine_tuned_models(self):
        return {}

    def apply(self, kind, hardware, durations_ms, features=None, shapes=None):
        return durations_ms / 2 if hardware.stem == self.hardware else durations_ms


def test_a_calibration_cannot_move_a_kernel_past_its_physical_bound():
    """L40S's 134 MB GEMM already runs at its bytes' DRAM time: halved by a correction it stays there, while a
    GEMM far from its bounds (1024 x 1024 x 1024, 2.4x its fastest) is halved; the engine and predict_kernels agree."""
    from pipeweave.kernels import interval_us

    dram_us = streamed_us(2 * (8192 * 8192 + 8192) + 2 * 8192, 864e9)
    calibration = HalvingCalibration("L40S", 0)
    keys = [("L40S", (8192, 1, 8192)), ("L40S", (1024, 1024, 1024))]
    plain, calibrated = Engine(log=None), Engine(log=None, calibration=calibration)
    for engine in (plain, calibrated):
        engine.load_models(["gemm"])
    before = plain.bounded_durations("gemm", keys)[0] * 1000
    after, _, _, fastest = calibrated.bounded_durations("gemm", keys)
    assert after[0] * 1000 == pytest.approx(dram_us, rel=1e-9) and after[1] * 1000 == pytest.approx(before[1] / 2)
    predictor = KernelPredictor()
    columns = {"M": [8192, 1024], "N": [1, 1024], "K": [8192, 1024]}
    us, codes, fastest_us = predictor.predict_columns_bounded("gemm", columns, ["L40S"] * 2, calibration)
    np.testing.assert_allclose(us, after * 1000, rtol=1e-9)
    low, high = interval_us("gemm", predictor, ["L40S"] * 2, us, codes, fastest_us)
    assert low[0] == pytest.approx(dram_us, rel=1e-9) and low[1] < us[1] < high[1]


def test_memory_bound_rows_beyond_the_trained_range_are_continuous_and_take_the_unseen_gpu_interval():
    """A40's RMSNorm was measured up to width 8192: one element wider takes the bandwidth model's trend, anchored to
    the MLP at width 8192 (no jump at the edge), twice as wide about twice the time, and the interval of a GPU
    outside training (the bandwidth model's leave-one-GPU-out errors), not the trained one."""
    import pipeweave

    point, low, high = pipeweave.predict_kernels("rmsnorm", {"seq": [8192] * 3, "dim": [8192, 8208, 16384]}, "A40",
                                                 interval=True)
    assert point[0] < point[1] < point[0] * 1.01 and point[2] == pytest.approx(2 * point[0], rel=0.02)
    trained = shipped_table().factors("rmsnorm", np.array([TRAINED]))
    unseen = shipped_table().factors("rmsnorm", np.array([UNSEEN_GPU]))
    assert low[0] / point[0] == pytest.approx(trained[0][0]) and high[0] / point[0] == pytest.approx(trained[1][0])
    assert high[1] / point[1] == pytest.approx(unseen[1][0]) and high[2] / point[2] == pytest.approx(unseen[1][0])
    # the quantisation has no MLP: its fit predicts every row, flagged beyond its range or not, and a GPU it was
    # fitted on keeps the fit's trained interval (it took the unseen-GPU one beyond the range)
    point, low, high, flags = pipeweave.predict_kernels("quantize", {"seq": [4096, 131072], "dim": [4096, 8192]},
                                                        "H100", interval=True, extrapolation=True)
    trained = shipped_table().factors("quantize", np.array([TRAINED]))
    assert flags == ["", "range"] and (high / point == pytest.approx(trained[1][0])), (flags, high / point)


def test_table_errors_name_the_file_and_the_remedy(tmp_path):
    with pytest.raises(FileNotFoundError, match="interval_eval --write"):
        IntervalTable.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not readable JSON .*interval_eval --write"):
        IntervalTable.load(bad)
    bad.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="bad.json: not a pipeweave error-interval table"):
        IntervalTable.load(bad)
    entry = {"log_low": -0.1, "log_high": 0.1}
    partial = {"format": json.loads(DEFAULT_PATH.read_text())["format"], "levels": [0.1, 0.9],
               "operators": {"gemm": {"trained": entry}}}
    bad.write_text(json.dumps(partial))
    with pytest.raises(ValueError, match="'gemm' lacks state"):
        IntervalTable.load(bad)


def test_states_follow_training_gpus_and_the_architecture_bit():
    trained = frozenset({"NVIDIA H100"})
    codes = np.array([0, ARCHITECTURE_BIT, 0, ARCHITECTURE_BIT | 2], dtype=np.int8)
    names = ["NVIDIA H100", "NVIDIA H100", "NVIDIA H20", "NVIDIA B200"]
    assert prediction_states(trained, names, codes).tolist() == [TRAINED, TRAINED, UNSEEN_GPU, UNSEEN_ARCHITECTURE]


def test_pooled_quantiles_weigh_every_gpu_equally():
    # 1,000 rows at 0 and 10 rows at 1: pooled by rows the 90th percentile would be 0
    by_gpu = {"a": np.zeros(1000), "b": np.ones(10)}
    assert pooled_quantiles(by_gpu, (0.1, 0.9)) == [0.0, 1.0]
    assert pooled_quantiles({"a": np.arange(101.0)}, (0.1, 0.9)) == [10.0, 90.0]


def test_predictive_quantiles_widen_with_the_spread_of_gpu_biases():
    rng = np.random.default_rng(1)
    noise = {name: rng.normal(0, 0.05, 2000) for name in "abcd"}
    alike = predictive_quantiles(noise)
    assert predictive_quantiles(noise) == alike  # seeded: the same data give the same table
    assert alike == pytest.approx(pooled_quantiles(noise), abs=0.01)  # no bias spread: the pooled residuals
    biased = {name: values + bias for (name, values), bias in zip(noise.items(), (-0.2, 0.0, 0.1, 0.3))}
    low, high = predictive_quantiles(biased)
    pooled_low, pooled_high = pooled_quantiles(biased)
    assert low < pooled_low and high > pooled_high  # a new GPU's bias may lie beyond the four seen
    one = {"a": np.arange(101.0)}
    assert predictive_quantiles(one) == pooled_quantiles(one)  # one GPU: no spread of biases to estimate


def test_coverage_never_uses_the_scored_gpu():
    rng = np.random.default_rng(0)
    ratios = {TRAINED: {f"t{i}": rng.normal(0, 0.05, 500) for i in range(3)},
              UNSEEN_GPU: {"g1": rng.normal(0, 0.1, 500), "g2": rng.normal(0.02, 0.1, 500),
                           "biased": rng.normal(0.5, 0.1, 500)},
              UNSEEN_ARCHITECTURE: {"alone": rng.normal(0, 0.1, 500)}}
    assert MIN_GPUS == 3
    covered = coverage(ratios)
    assert covered["unseen_gpu"]["biased"]["coverage"] < 0.1  # its bias is not in the other GPUs' interval
    assert covered["unseen_gpu"]["g1"]["coverage"] > 0.5
    # a state with too few GPUs for a spread of biases adds the other unseen state's, as the table does
    states, used = donors(ratios, UNSEEN_ARCHITECTURE, exclude="alone")
    assert states == [UNSEEN_ARCHITECTURE, UNSEEN_GPU] and sorted(used) == ["biased", "g1", "g2"]
    assert covered["unseen_architecture"]["alone"]["high"] == pytest.approx(
        predictive_quantiles(ratios[UNSEEN_GPU])[1])
    entry = table_entry(ratios)
    assert "from" not in entry["unseen_gpu"] and "from" not in entry["trained"]
    assert entry["unseen_architecture"]["from"] == ["unseen_architecture", "unseen_gpu"]
    assert entry["unseen_architecture"]["gpus"] == ["alone", "biased", "g1", "g2"]


def test_aggregator_interval_brackets_the_prediction_and_widens_off_training():
    engine = Engine(collective_estimate="analytical", log=None)
    workload = load_workload(TP1)
    spans = {}
    for gpu in ("H100", "L40", "RTX PRO 6000 S"):
        result = engine.predict([Job(workload, engine.gpu(gpu))])[0].result
        interval, summary = result["interval"], result["summary"]
        assert interval["levels"] == [0.1, 0.9] and "note" not in interval  # TP1: no collectives
        for key, point in summary.items():
            assert interval["low"][key] < point < interval["high"][key], (gpu, key)
        spans[gpu] = interval["high"]["total_duration_ms"] / interval["low"]["total_duration_ms"]
        if gpu == "H100":  # every kernel trained: each end is a mean of the operators' trained factors
            factors = [shipped_table().factors(op, np.array([TRAINED])) for op in ("gemm", "attn", "rmsnorm",
                                                                                    "siluandmul")]
            low = interval["low"]["total_duration_ms"] / summary["total_duration_ms"]
            high = interval["high"]["total_duration_ms"] / summary["total_duration_ms"]
            assert min(f[0][0] for f in factors) <= low <= max(f[0][0] for f in factors)
            assert min(f[1][0] for f in factors) <= high <= max(f[1][0] for f in factors)
    assert spans["H100"] < spans["L40"]  # GEMM and attention trained on H100; L40 only through L40S
    with_collectives = engine.predict([Job(load_workload(TP4_PP2), engine.gpu("H100"))])[0].result["interval"]
    note = with_collectives["note"]
    assert "collectives at their point value (not in the interval): those with measured models" in note


def test_analytical_collectives_widen_the_interval_by_the_estimates_own(monkeypatch):
    """H800 at TP4: the 4-GPU all-reduce takes the analytical estimate, which enters the interval with the
    leave-one-GPU-out interval of its link family; the measured send/recv stays at its point value."""
    from pipeweave.collectives import CollectivePredictor
    job = Job(load_workload(TP4_PP2), Engine(log=None).gpu("H800"))
    result = Engine(collective_estimate="analytical", log=None).predict([job])[0].result
    low_factor, high_factor = CollectivePredictor("H800", allow_analytical=True).analytical_interval("all_reduce", 4)
    assert low_factor < 1 < high_factor
    analytical = result["extrapolation"]["analytical_collectives"]
    assert analytical["kinds"] == ["all_reduce"]
    assert analytical["interval"] == {"all_reduce": [round(low_factor, 4), round(high_factor, 4)]}
    assert "point value" in result["interval"]["note"]  # send/recv is measured on H800
    all_reduce_ms = sum(it["operator_durations"]["communication"]["all_reduce"]["total_duration_ms"]
                        for it in result["iterations"])
    monkeypatch.setattr(CollectivePredictor, "analytical_interval", lambda self, kind, workers: (1.0, 1.0))
    point = Engine(collective_estimate="analytical", log=None).predict([job])[0].result["interval"]
    for end, factor in (("low", low_factor), ("high", high_factor)):
        assert result["interval"][end]["total_duration_ms"] == pytest.approx(
            point[end]["total_duration_ms"] + all_reduce_ms * (factor - 1), abs=0.01)


def test_predict_kernels_writes_the_interval_columns(tmp_path):
    from pipeweave.kernels import main

    src = tmp_path / "in.csv"
    src.write_text("M,N,K,hardware\n4096,4096,4096,H100\n4096,4096,4096,RTX 6000 Ada\n")
    out = tmp_path / "out.csv"
    assert main(["--op", "gemm", "--input", str(src), "--output", str(out)]) == 0
    frame = pd.read_csv(out, keep_default_na=False)
    assert list(frame.columns) == ["M", "N", "K", "hardware", "predicted_us", "low_us", "high_us", "extrapolation"]
    assert (frame["low_us"] < frame["predicted_us"]).all() and (frame["predicted_us"] < frame["high_us"]).all()
    ratio = frame["high_us"] / frame["low_us"]
    assert ratio[0] < ratio[1]


@pytest.mark.data
def test_shipped_table_matches_the_shipped_models_on_held_out_shapes(built_datasets):
    """The ``trained`` entries are a function of the shipped models and the test split alone: a retrained model
    without a rewritten table fails here (the unseen entries need the leave-one-GPU-out cache)."""
    table = json.loads(DEFAULT_PATH.read_text())["operators"]
    predictor = KernelPredictor()
    for op, entry in table.items():
        ratios = trained_ratios(op, predictor, DATASET_DIR)
        assert sorted(ratios) == entry["trained"]["gpus"], op
        low, high = predictive_quantiles(ratios)
        assert (low, high) == pytest.approx((entry["trained"]["log_low"], entry["trained"]["log_high"]), abs=1e-9), op
        assert get_operator(op).model_op == op


@pytest.mark.data
def test_trained_errors_are_kept_in_a_band_their_held_out_shapes_did_not_shape(built_datasets, monkeypatch):
    """The trained state's errors are of held-out shapes: the band that keeps their predictions is the training
    split's. The shipped band was fitted on both splits (SiLU*Mul's latency allowance 22.54 µs with its test rows,
    22.58 µs without; attention's shortest duration, the launch ceiling, is a test row's)."""
    from pipeweave.bounds import frame_band_table
    from pipeweave.modeling import dataset_paths, read_dataset

    seen = []
    original = KernelPredictor.kernel_efficiency

    def recording(self, op, features, described, hw, band=None):
        seen.append(band)
        return original(self, op, features, described, hw, band)

    monkeypatch.setattr(KernelPredictor, "kernel_efficiency", recording)
    trained_ratios("siluandmul", KernelPredictor(), DATASET_DIR)
    expected = frame_band_table("siluandmul", read_dataset(dataset_paths("siluandmul", DATASET_DIR)[0]))
    assert seen and all(band == expected for band in seen)


@pytest.mark.data
def test_write_trained_rewrites_only_the_trained_entries(built_datasets, tmp_path):
    """``--write_trained`` (after retraining a shipped model, without the leave-one-GPU-out cache) restores the
    trained entry of the operators asked for from the shipped model, and keeps every other entry as it was."""
    from pipeweave.interval_eval import main

    shipped = json.loads(DEFAULT_PATH.read_text())
    stale = json.loads(DEFAULT_PATH.read_text())
    for op in ("rmsnorm", "gemm"):
        stale["operators"][op]["trained"]["log_high"] += 0.5
        stale["coverage"][op]["trained"] = {}
    table, report = tmp_path / "intervals.json", tmp_path / "ACCURACY.md"
    table.write_text(json.dumps(stale))
    report.write_text("# report\n")
    assert main(["--write_trained", "--ops", "rmsnorm", "--table", str(table), "--report", str(report)]) == 0
    written = json.loads(table.read_text())
    trained, expected = written["operators"]["rmsnorm"].pop("trained"), shipped["operators"]["rmsnorm"].pop("trained")
    assert trained["gpus"] == expected["gpus"] and trained["rows"] == expected["rows"]
    assert (trained["log_low"], trained["log_high"]) == pytest.approx((expected["log_low"], expected["log_high"]),
                                                                      abs=1e-9)
    assert written["operators"]["rmsnorm"] == shipped["operators"]["rmsnorm"]  # its other states untouched
    assert written["coverage"]["rmsnorm"] == shipped["coverage"]["rmsnorm"]
    assert written["operators"]["gemm"] == stale["operators"]["gemm"]  # not asked for: left as it was
    assert written["coverage"]["gemm"]["trained"] == {}
    assert "| rmsnorm | trained | 3 |" in report.read_text()


@pytest.mark.data
def test_write_trained_with_unseen_rewrites_the_unseen_states_from_the_held_out_rows(built_datasets, tmp_path,
                                                                                   monkeypatch):
    """``--with_unseen`` takes the unseen states of the operators asked for from their leave-one-GPU-out rows
    (here stand-ins, so no model is trained) and leaves the calibrated states, which pool every operator."""
    from types import SimpleNamespace

    import pipeweave.interval_eval as interval_eval

    rng = np.random.default_rng(0)
    held = {gpu: rng.normal(bias, 0.1, 200) for gpu, bias in
            (("NVIDIA A100-SXM4-80GB", 0.2), ("NVIDIA A40", -0.1), ("NVIDIA H100", 0.05))}
    monkeypatch.setattr(interval_eval, "held_out_rows",
                        lambda op, gpu, *args: SimpleNamespace(op=op, gpu=gpu, y=held[gpu]))
    shipped = json.loads(DEFAULT_PATH.read_text())
    table, report = tmp_path / "intervals.json", tmp_path / "ACCURACY.md"
    table.write_text(json.dumps(shipped))
    report.write_text("# report\n")
    assert interval_eval.main(["--write_trained", "--with_unseen", "--ops", "rmsnorm", "--table", str(table),
                               "--report", str(report)]) == 0
    written = json.loads(table.read_text())["operators"]["rmsnorm"]
    unseen = interval_eval.unseen_ratios("rmsnorm", [SimpleNamespace(op="rmsnorm", gpu=gpu, y=y)
                                                     for gpu, y in held.items()])
    expected = table_entry({**unseen, TRAINED: {"x": np.zeros(1)}})  # the unseen states do not read the trained one
    for state in (UNSEEN_GPU, UNSEEN_ARCHITECTURE):
        assert written[STATES[state]] == expected[STATES[state]]
    assert written["calibrated"] == shipped["operators"]["rmsnorm"]["calibrated"]
    assert written["trained"]["gpus"] == shipped["operators"]["rmsnorm"]["trained"]["gpus"]


def test_one_chip_under_two_names_sets_no_unseen_state():
    """FP8 GEMM's H100 and H800 have the same analytical-model inputs: left out, each one's model trained on the
    other's rows, so its errors (H100's 19.9 %, its harness against H800's) are no unseen GPU's; H200, the same SM
    design with more bandwidth, and H20 stay unseen GPUs."""
    from types import SimpleNamespace

    import pipeweave.interval_eval as interval_eval

    gpus = ("NVIDIA H100", "NVIDIA H800", "NVIDIA H200", "NVIDIA H20", "NVIDIA L40S")
    assert set(interval_eval.input_twins(gpus)) == {"NVIDIA H100", "NVIDIA H800"}
    assert interval_eval.input_twins(("NVIDIA H100", "NVIDIA H200")) == {}
    rows = [SimpleNamespace(op="gemm_fp8", gpu=gpu, y=np.full(4, i / 10)) for i, gpu in enumerate(gpus)]
    ratios = interval_eval.unseen_ratios("gemm_fp8", rows)
    assert set(ratios[UNSEEN_GPU]) == {"NVIDIA H200", "NVIDIA H20"}  # Hopper, whose SM design H100 shares
    assert set(ratios[UNSEEN_ARCHITECTURE]) == {"NVIDIA L40S"}


def test_write_trained_on_a_corrupt_table_is_one_line_naming_it(tmp_path, capsys):
    from pipeweave.cli import run_cli
    from pipeweave.interval_eval import main

    table, report = tmp_path / "intervals.json", tmp_path / "ACCURACY.md"
    table.write_text("{")
    code = run_cli(main, ["--write_trained", "--ops", "attn", "--table", str(table), "--report", str(report)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{table}: not a JSON interval table" in err[0]
    assert not report.exists() and table.read_text() == "{"


def test_api_interval_is_the_predict_kernels_columns(tmp_path):
    import pipeweave
    from pipeweave.kernels import main

    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_text("M,N,K,hardware\n4096,8192,8192,L40\n16,8192,8192,H100\n")
    assert main(["--op", "gemm", "--input", str(src), "--output", str(out)]) == 0
    frame = pd.read_csv(out)
    us, low, high = pipeweave.predict_kernels("gemm", {"M": [4096, 16], "N": [8192] * 2, "K": [8192] * 2},
                                              ["L40", "H100"], interval=True)
    assert us == pytest.approx(frame["predicted_us"].to_numpy(), rel=1e-12)
    assert low == pytest.approx(frame["low_us"].to_numpy(), rel=1e-12)
    assert high == pytest.approx(frame["high_us"].to_numpy(), rel=1e-12)


def test_api_interval_of_another_model_warns_as_predict_kernels_does(tmp_path, capsys):
    """predict_kernels.py says that low/high were measured for the shipped model when another predicts; the API
    returned the same low/high without a word."""
    import shutil
    import warnings

    import pipeweave
    from pipeweave.kernels import main

    shipped = KernelPredictor().model("gemm")[2]
    shutil.copytree(shipped, tmp_path / "models" / "gemm" / "20991231_000000")
    src = tmp_path / "in.csv"
    src.write_text("M,N,K,hardware\n4096,4096,4096,H100\n")
    assert main(["--op", "gemm", "--input", str(src), "--output", str(tmp_path / "out.csv"), "--model_dir",
                 str(tmp_path / "models")]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING")]
    assert len(printed) == 1 and "measured for" in printed[0]
    for interval, expected in ((True, printed), (False, [])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pipeweave.predict_kernels("gemm", {"M": [4096], "N": [4096], "K": [4096]}, "H100",
                                      model_dir=tmp_path / "models", interval=interval)
        assert [str(w.message) for w in caught] == expected, interval


def test_the_interval_table_is_of_the_shipped_models_and_warns_for_another():
    """The intervals are held-out errors of particular models: the table names them, they are the shipped ones,
    and a prediction by another model (one the user trained) says that the intervals are not its own."""
    from pathlib import Path

    from pipeweave.intervals import other_model_warning, shipped_table
    from pipeweave.predictor import KernelPredictor

    predictor = KernelPredictor()
    for op in ("gemm", "gemm_fp8", "attn", "rmsnorm", "siluandmul", "moe"):
        directory = predictor.model(op)[2]
        assert shipped_table().models[op] == Path(directory).name, op
        assert other_model_warning(op, directory) is None
    warning = other_model_warning("rmsnorm", "mlp_models/rmsnorm/20991231_000000")
    assert warning.startswith("WARNING: the 80 % intervals of the rmsnorm model were measured for 20261129_202402")


def test_no_other_model_warning_for_the_quantisation(tmp_path):
    """Its intervals and point come from its stored bandwidth fit: a user's RMSNorm model has no part in them, yet
    the warning said low/high described that model's errors."""
    from pipeweave.intervals import other_model_warning

    assert other_model_warning("quantize", tmp_path / "rmsnorm" / "20270101_000000") is None
    assert other_model_warning("rmsnorm", tmp_path / "rmsnorm" / "20270101_000000") is not None
