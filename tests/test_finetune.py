"""Fine-tuning the shipped kernel model on a GPU's measured kernels where it extrapolates (pipeweave/finetune.py,
calibrate.py --kernels): when it happens, that it follows the measurements, that it changes only that GPU, how
it is stored and what a missing torch or a damaged file says.

Uses the shipped models; the "measurements" are the shipped predictions with a planted, shape-dependent slowdown
on a GPU whose SM design no GEMM training GPU has, so every kernel is flagged as extrapolated: an L40 spec at
compute capability 12.1, written for the tests beside the shipped specs (every shipped GPU shares its SM design
with a GEMM training GPU).
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analytical_model.registry import get_operator
from pipeweave import aggregate, calibration_fit, kernels
from pipeweave.calibration import load_calibration
from pipeweave.calibration_eval import FineTunable, estimate_prior, kshot_errors
from pipeweave.cli import UserError, run_cli
from pipeweave.finetune import decode_arrays, encode_arrays
from pipeweave.mlp import NumpyMLP, latest_model_dir, read_weight_arrays, weights_path

from workload_copies import first_iterations

REPO = Path(__file__).resolve().parent.parent
TP1 = REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json"
#: the test GPU: an L40 at a compute capability (12.1) that no GPU of the GEMM model's training data has
GPU = "L40-SM121"


@pytest.fixture(scope="module")
def hardware_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("hardware")
    for path in (REPO / "hardware").glob("*.json"):
        shutil.copy(path, directory / path.name)
    spec = json.loads((REPO / "hardware" / "L40.json").read_text())
    spec.update(name="Test L40 at SM 12.1", aliases=[], computeMajor=12, computeMinor=1, architecture="blackwell")
    (directory / f"{GPU}.json").write_text(json.dumps(spec))
    return directory


def shapes_csv(path: Path, seed: int, gpus=(GPU,), n: int = 40) -> Path:
    rng = np.random.default_rng(seed)
    rows = [f"{int(2 ** rng.uniform(9, 15))},{rng.choice([5120, 7168, 13824, 27648])},{rng.choice([5120, 8192, 13824])},"
            f"{gpu}" for _ in range(n) for gpu in gpus]
    path.write_text("M,N,K,hardware\n" + "\n".join(rows) + "\n")
    return path


def predicted(shapes: Path, out: Path, hardware: Path, calibration: Path | None = None) -> pd.DataFrame:
    args = ["--op", "gemm", "--input", str(shapes), "--output", str(out), "--hardware_dir", str(hardware)]
    assert run_cli(kernels.main, args + (["--calibration", str(calibration)] if calibration else [])) == 0
    return pd.read_csv(out, keep_default_na=False)


def planted_slowdown(frame: pd.DataFrame) -> np.ndarray:
    """The "measured" factor over the shipped prediction: large GEMMs 40 % slower, small ones as predicted."""
    return np.where(frame["M"] >= 4096, 1.4, 1.0)


@pytest.fixture(scope="module")
def l40(tmp_path_factory, hardware_dir):
    """(directory, calibration file) of the test GPU calibrated on 40 planted GEMM measurements."""
    tmp = tmp_path_factory.mktemp("finetune")
    base = predicted(shapes_csv(tmp / "shapes.csv", seed=0), tmp / "base.csv", hardware_dir)
    assert (base["extrapolation"].str.contains("architecture")).all()
    measured = base.assign(op="gemm", avg_duration=base["predicted_us"] * planted_slowdown(base))
    measured[["op", "M", "N", "K", "hardware", "avg_duration"]].to_csv(tmp / "gemm.csv", index=False)
    out = tmp / "l40.json"
    assert run_cli(calibration_fit.main, ["--hardware", GPU, "--kernels", str(tmp / "gemm.csv"),
                                          "--hardware_dir", str(hardware_dir), "--output", str(out)]) == 0
    return tmp, out


def test_extrapolated_kernels_fine_tune_the_model(l40):
    calibration = load_calibration(l40[1])
    entry = calibration.fine_tuned["gemm"]
    assert entry["kernels"] == 40 and entry["extrapolated_share"] >= 0.5
    assert Path(entry["base_model"]).name == latest_model_dir(REPO / "mlp_models", "gemm").name
    assert set(calibration.fine_tuned_models()) == {"gemm"}
    assert "fine-tuned" in calibration.method and "kept within its range" in calibration.method
    recorded = calibration.summary()["fine_tuned"]["gemm"]["trusted_log_change"]  # outputs record the range
    assert recorded == list(calibration.trusted_log_change("gemm"))
    assert calibration.summary()["fine_tuned"]["gemm"]["kernels"] == 40  # outputs record it, without the weights
    assert "weights" not in calibration.summary()["fine_tuned"]["gemm"]


def test_fine_tuned_model_follows_the_measurements_on_its_gpu_only(l40, hardware_dir):
    """Unseen shapes on the test GPU move toward the planted truth; the same shapes on H100 do not move at all."""
    tmp, calibration = l40
    shapes = shapes_csv(tmp / "unseen.csv", seed=1, gpus=(GPU, "H100"))
    base = predicted(shapes, tmp / "u_base.csv", hardware_dir)
    calibrated = predicted(shapes, tmp / "u_cal.csv", hardware_dir, calibration)
    on_l40 = (base["hardware"] == GPU).to_numpy()
    truth = base["predicted_us"] * planted_slowdown(base)
    error_before = np.abs(base["predicted_us"] / truth - 1)[on_l40].mean()
    error_after = np.abs(calibrated["predicted_us"] / truth - 1)[on_l40].mean()
    assert error_after < 0.5 * error_before
    assert calibrated["predicted_us"][~on_l40].tolist() == base["predicted_us"][~on_l40].tolist()


def test_aggregator_uses_and_records_the_fine_tuned_model(l40, hardware_dir, tmp_path):
    """In a sweep, the test GPU is predicted with the fine-tuned model and records it; H100 is byte for byte
    unchanged."""
    tp1 = first_iterations(TP1, tmp_path, 2)
    plain, calibrated = tmp_path / "plain", tmp_path / "cal"
    sweep = ["--workload", str(tp1), "--hardware", f"{GPU},H100", "--hardware_dir", str(hardware_dir)]
    assert run_cli(aggregate.main, [*sweep, "--output", str(plain)]) == 0
    assert run_cli(aggregate.main, [*sweep, "--calibration", str(l40[1]), "--output", str(calibrated)]) == 0
    name = f"{tp1.stem}_{GPU}.json"
    result, base = json.loads((calibrated / name).read_text()), json.loads((plain / name).read_text())
    assert result["calibration"]["fine_tuned"]["gemm"]["kernels"] == 40
    assert result["summary"]["prefill_duration_ms"] > base["summary"]["prefill_duration_ms"] * 1.1
    name = f"{tp1.stem}_H100.json"
    assert (calibrated / name).read_text() == (plain / name).read_text()


def test_covered_kernels_and_no_fine_tune_fit_corrections_only(l40, hardware_dir, tmp_path, capsys):
    tmp, _ = l40
    measured = pd.read_csv(tmp / "gemm.csv")
    no_tune = tmp_path / "no_tune.json"
    assert run_cli(calibration_fit.main, ["--hardware", GPU, "--kernels", str(tmp / "gemm.csv"),
                                          "--hardware_dir", str(hardware_dir), "--output", str(no_tune),
                                          "--no_fine_tune"]) == 0
    assert load_calibration(no_tune).fine_tuned == {}
    h100 = tmp_path / "h100_gemm.csv"
    measured.assign(hardware="H100").to_csv(h100, index=False)
    out = tmp_path / "h100.json"
    assert run_cli(calibration_fit.main, ["--hardware", "H100", "--kernels", str(h100), "--output", str(out)]) == 0
    assert load_calibration(out).fine_tuned == {}  # the shipped model trained on H100's GEMMs
    assert "corrections only" in capsys.readouterr().out


def test_fine_tuning_without_torch_is_one_clear_error(l40, hardware_dir, tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    out = tmp_path / "cal.json"
    code = run_cli(calibration_fit.main, ["--hardware", GPU, "--kernels", str(l40[0] / "gemm.csv"),
                                          "--hardware_dir", str(hardware_dir), "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs torch" in err[0] and "--no_fine_tune" in err[0]
    assert not out.exists()


def test_damaged_fine_tuned_weights_are_refused(l40, tmp_path):
    data = json.loads(l40[1].read_text())
    data["fine_tuned"]["gemm"]["weights"] = data["fine_tuned"]["gemm"]["weights"][:200]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="fine-tuned model does not load"):
        load_calibration(bad)


def test_a_format_3_file_keeps_its_fine_tuned_model(l40, hardware_dir, tmp_path):
    """Format 3 brought the fine-tuned models and format 4 split the communication factor: a format-3 file read
    without its models would apply GEMM corrections fitted under the fine-tuned model to the shipped one, unsaid."""
    data = json.loads(l40[1].read_text())
    parameters = dict(data["parameters"])
    parameters["communication"] = parameters.pop("communication.latency")
    del parameters["communication.bandwidth"]
    old = tmp_path / "format3.json"
    old.write_text(json.dumps({**data, "format": 3, "parameters": parameters}))
    assert set(load_calibration(old).fine_tuned_models()) == {"gemm"}
    # format 5 brought the interpolated residuals, which a format-3 file cannot hold: compared without them
    without_residuals = tmp_path / "format5_without_residuals.json"
    without_residuals.write_text(json.dumps({**data, "residuals": {}}))
    shapes = l40[0] / "shapes.csv"
    now = predicted(shapes, tmp_path / "now.csv", hardware_dir, without_residuals)
    then = predicted(shapes, tmp_path / "then.csv", hardware_dir, old)
    assert then["predicted_us"].tolist() == now["predicted_us"].tolist()


def with_log_change(l40, tmp_path: Path, name: str, log_change, version: int = 6) -> Path:
    """The test GPU's calibration file with the fine-tuned GEMM model's trusted_log_change replaced (None: dropped)
    and the file format ``version``."""
    data = json.loads(l40[1].read_text())
    entry = data["fine_tuned"]["gemm"]
    entry.pop("trusted_log_change")
    if log_change is not None:
        entry["trusted_log_change"] = log_change
    path = tmp_path / name
    path.write_text(json.dumps({**data, "format": version}))
    return path


def test_the_fine_tuned_change_is_kept_within_its_range_on_the_measured_kernels(l40, hardware_dir, tmp_path):
    """calibrate.py stores the range of the fine-tuned model's log efficiency change on the measured kernels; the
    predictor keeps the change within it: the measured kernels predict as without the range, a narrower range bounds
    the changes beyond it and leaves the others, a range of [0, 0] gives the shipped model's efficiency (the
    calibration's corrections and interpolation alike), and a format-5 file, whose models were chosen unbounded,
    applies its model unbounded."""
    tmp, calibration = l40
    low, high = load_calibration(calibration).trusted_log_change("gemm")
    assert low <= high and high - low > 0.01  # the planted slowdown moves some kernels more than others
    unbounded = with_log_change(l40, tmp_path, "wide.json", [-50.0, 50.0])
    measured = tmp / "shapes.csv"
    assert (predicted(measured, tmp_path / "m_cal.csv", hardware_dir, calibration)["predicted_us"].tolist()
            == pytest.approx(predicted(measured, tmp_path / "m_wide.csv", hardware_dir, unbounded)["predicted_us"]
                             .tolist(), rel=1e-12))
    unseen = tmp_path / "unseen.csv"  # shapes unlike the measured ones (M 512-32768, N and K 5,120-27,648)
    unseen.write_text("M,N,K,hardware\n" + "".join(f"{m},{n},{k},{GPU}\n" for m in (1, 16, 128, 512, 65536)
                                                   for n in (1024, 5120, 65536) for k in (256, 5120, 32768)))
    free = predicted(unseen, tmp_path / "wide.csv", hardware_dir, unbounded)["predicted_us"].to_numpy()
    format5 = with_log_change(l40, tmp_path, "format5.json", None, version=5)
    assert "kept within" not in load_calibration(format5).method
    assert predicted(unseen, tmp_path / "f5.csv", hardware_dir, format5)["predicted_us"].tolist() == pytest.approx(
        free.tolist(), rel=1e-12)
    frozen = with_log_change(l40, tmp_path, "frozen.json", [0.0, 0.0])
    data = json.loads(frozen.read_text())
    del data["fine_tuned"]
    untuned = tmp_path / "untuned.json"
    untuned.write_text(json.dumps(data))
    base = predicted(unseen, tmp_path / "frozen.csv", hardware_dir, frozen)["predicted_us"].to_numpy()
    assert base.tolist() == predicted(unseen, tmp_path / "untuned.csv", hardware_dir, untuned)["predicted_us"].tolist()
    # the same corrections and interpolation multiply every file's predictions: their ratios are the models' changes
    # of efficiency; a range narrower than this fine-tuning's changes keeps some of them and bounds the others
    change_free = np.log(base / free)
    low, high = np.quantile(change_free, [0.25, 0.75])
    narrow = with_log_change(l40, tmp_path, "narrow.json", [low, high])
    kept = predicted(unseen, tmp_path / "narrow.csv", hardware_dir, narrow)["predicted_us"].to_numpy()
    change_kept = np.log(base / kept)
    inside = (change_free >= low) & (change_free <= high)
    assert 0 < inside.sum() < len(inside)
    assert kept[inside] == pytest.approx(free[inside], rel=1e-12)
    assert change_kept[~inside] == pytest.approx(np.clip(change_free[~inside], low, high), abs=1e-9)


@pytest.mark.parametrize("log_change, version", [(None, 6), ([0.1, -0.1], 6), ([0.0, float("inf")], 6),
                                                 (["a", 0.0], 6), ([0.0], 6), (True, 6)])
def test_a_damaged_trusted_log_change_is_refused(l40, tmp_path, log_change, version):
    path = with_log_change(l40, tmp_path, "bad.json", log_change, version)
    with pytest.raises(ValueError, match="trusted_log_change"):
        load_calibration(path)


def test_trusted_efficiency_keeps_the_log_change_within_its_range():
    from pipeweave.finetune import log_change_range, trusted_efficiency

    base = np.array([1.0, 1.0, 1.0, 0.5])
    tuned = np.array([2.0, 1.1, 0.5, 0.5])
    assert log_change_range(base[1:3], tuned[1:3]) == pytest.approx((np.log(0.5), np.log(1.1)))
    kept = trusted_efficiency(base, tuned, log_change_range(base[1:3], tuned[1:3]))
    assert kept == pytest.approx([1.1, 1.1, 0.5, 0.5])
    assert trusted_efficiency(base, tuned, (0.05, 0.2)) == pytest.approx([np.exp(0.2), 1.1, np.exp(0.05),
                                                                          0.5 * np.exp(0.05)])
    assert trusted_efficiency(base, tuned, None).tolist() == tuned.tolist()


def test_weights_survive_the_text_encoding():
    arrays = read_weight_arrays(weights_path(latest_model_dir(REPO / "mlp_models", "gemm"), "gemm"))
    inputs = np.abs(np.random.default_rng(0).normal(size=(5, NumpyMLP(arrays).input_dim))) * 1e4
    assert np.array_equal(NumpyMLP(decode_arrays(encode_arrays(arrays))).efficiency(inputs, 1755.0),
                          NumpyMLP(arrays).efficiency(inputs, 1755.0))


class PerfectFineTune(FineTunable):
    """A fine-tune that learns the GPU exactly (records what it was given)."""

    def fine_tuned_efficiency(self, op, drawn, target, base, target_without, pool=None):
        assert np.allclose(target_without(np.array([], dtype=int)), target)  # no kernel left out: the same fit
        self.calls.append((drawn, target))
        return self.efficiency.copy()


def test_kshot_evaluation_fine_tunes_only_where_most_drawn_kernels_are_flagged():
    """calibration_eval follows calibrate.py's rule: consider fine-tuning when at least half of k >= 32 drawn
    kernels are flagged, or k >= 200 (fine_tune_selected may still keep the corrections alone), on the measured
    efficiency times the fitted correction; otherwise the corrections alone."""
    from test_calibration import synthetic_gpu

    prior = estimate_prior([synthetic_gpu(f"gpu{i}", b, 0.0, seed=i) for i, b in enumerate((-0.2, 0.1, 0.2))], "s")
    held = synthetic_gpu("new", 0.3, 0.0, n=400, seed=7)
    x = held.design(prior.standardisation)
    efficiency = np.full(len(held.y), 0.5)

    def with_flags(share: float) -> PerfectFineTune:
        flagged = np.random.default_rng(0).uniform(size=len(held.y)) < share
        tune = PerfectFineTune([], np.zeros((len(held.y), 1)), efficiency, efficiency * np.exp(held.y), flagged,
                               lambda e: e, 1755.0)
        tune.calls = []
        return tune

    held.fine_tunable = with_flags(1.0)
    mean, _, tuned = kshot_errors(held, x, prior, 32, seed=3)
    assert tuned and mean > 0 and len(held.fine_tunable.calls) == 1
    drawn, target = held.fine_tunable.calls[0]
    assert len(drawn) == 32 and np.all(target != efficiency[drawn])  # the corrections' residual, not the raw
    assert kshot_errors(held, x, prior, 4, seed=3)[2] is False  # too few kernels
    held.fine_tunable = with_flags(0.0)
    assert kshot_errors(held, x, prior, 32, seed=3)[2] is False and not held.fine_tunable.calls
    assert kshot_errors(held, x, prior, 200, seed=3)[2] is True  # with many kernels, whatever the flags
    held.fine_tunable = with_flags(1.0)
    held.op = "attn"  # fine-tuned only where many kernels choose it, whatever the flags
    assert kshot_errors(held, x, prior, 32, seed=3)[2] is False and not held.fine_tunable.calls
    assert kshot_errors(held, x, prior, 200, seed=3)[2] is True
    held.fine_tunable = None
    assert kshot_errors(held, x, prior, 32, seed=3)[2] is False


def test_damaged_member_checkpoint_is_one_clear_error(l40, hardware_dir, tmp_path, capsys):
    """Fine-tuning reads the members' torch checkpoints: a damaged one names the file and the remedy."""
    models = tmp_path / "models"
    shutil.copytree(REPO / "mlp_models" / "gemm", models / "gemm")
    checkpoint = next((models / "gemm").glob("*/members/seed1/gemm_mlp_model.pth"))
    checkpoint.write_bytes(b"not a checkpoint")
    out = tmp_path / "cal.json"
    code = run_cli(calibration_fit.main, ["--hardware", GPU, "--kernels", str(l40[0] / "gemm.csv"),
                                          "--hardware_dir", str(hardware_dir), "--model_dir", str(models),
                                          "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(checkpoint) in err[0] and "train_mlp.py --op gemm" in err[0]
    assert not out.exists()


def test_the_trigger_reads_the_flags_it_was_set_on_not_the_shares_flag(monkeypatch):
    """A pipe share outside the training range (the `shares` flag, added after the trigger was measured) does not
    count towards fine-tuning; the three original flags do."""
    from analytical_model.hardware import load_hardware
    from pipeweave.finetune import TRIGGER_BITS
    from pipeweave.predictor import BEYOND_SHARES, MEMBERS_DISAGREE, KernelPredictor

    assert TRIGGER_BITS & BEYOND_SHARES == 0
    predictor = KernelPredictor()
    frame = pd.DataFrame({"M": [64, 128], "N": [4096, 4096], "K": [4096, 4096], "avg_duration": [10.0, 20.0]})
    for bits, share in ((BEYOND_SHARES, 0.0), (BEYOND_SHARES | MEMBERS_DISAGREE, 1.0)):
        monkeypatch.setattr(KernelPredictor, "extrapolation", lambda self, *a, bits=bits: np.full(2, bits, np.int8))
        monkeypatch.setattr(KernelPredictor, "member_spread_threshold", lambda self, op: None)
        got = calibration_fit.fine_tune_inputs("gemm", frame, load_hardware("H100"), predictor, NoCorrection())[0]
        assert got == share


class NoCorrection:
    def factors(self, op, features, shapes=None):
        return np.ones(len(features))


def test_kernels_not_above_the_fixed_time_have_nothing_to_teach():
    """A GEMM model with a fixed time t0 learns the time above it: a kernel whose target duration is t0 or less is
    left out of fine-tuning (none is left out without a fixed time)."""
    from analytical_model.hardware import load_hardware
    from pipeweave.finetune import above_fixed_time

    hw, operator = load_hardware("H100"), get_operator("gemm")
    shapes = {"M": [1, 4096], "N": [1024, 4096], "K": [1024, 4096]}
    inputs = np.concatenate([operator.features(shapes, hw), operator.descriptors(shapes, hw)], axis=1)
    ideal = operator.ideal_us(inputs, hw.sm_freq)
    durations = np.array([0.9, 200.0])  # a 0.9 us kernel cannot contain a 1 us fixed time
    efficiency = ideal / durations
    assert above_fixed_time("gemm", inputs, efficiency, hw.sm_freq, 1.0).tolist() == [False, True]
    assert above_fixed_time("gemm", inputs, efficiency, hw.sm_freq, 0.0).tolist() == [True, True]


def test_fine_tuning_leaves_out_kernels_not_above_the_fixed_time():
    """fine_tune on kernels of which some take less than the model's fixed time gives exactly the model fine-tuned
    on the others; with none above it, it refuses (seeded, tiny replay set: a few seconds)."""
    pytest.importorskip("torch", reason="fine-tuning needs the training extras")
    from analytical_model.hardware import load_hardware
    from pipeweave.ensemble import member_dirs
    from pipeweave.finetune import fine_tune

    hw, operator = load_hardware("L40"), get_operator("gemm")
    members = member_dirs(latest_model_dir(REPO / "mlp_models", "gemm"))[:2]
    shapes = {"M": [1, 2, 4, 8, 4096, 8192], "N": [1024] * 4 + [8192] * 2, "K": [1024] * 4 + [8192] * 2}
    inputs = np.concatenate([operator.features(shapes, hw), operator.descriptors(shapes, hw)], axis=1)
    durations = np.array([0.6, 0.9, 3.0, 3.5, 900.0, 1800.0])  # the first two cannot contain 1 us
    efficiency = operator.ideal_us(inputs, hw.sm_freq) / durations
    replay = inputs[[2, 4]]
    kept = fine_tune("gemm", members, inputs[2:], efficiency[2:], replay, 8, hw.sm_freq)
    both = fine_tune("gemm", members, inputs, efficiency, replay, 8, hw.sm_freq)
    assert kept.keys() == both.keys() and all(np.array_equal(kept[key], both[key]) for key in kept)
    with pytest.raises(ValueError, match="no measured kernel takes longer than the model's fixed 1.0 us"):
        fine_tune("gemm", members, inputs[:2], efficiency[:2], replay, 8, hw.sm_freq)


def test_many_kernels_choose_the_recipe_on_a_held_out_fifth(monkeypatch):
    """Below MIN_SELECTION_KERNELS the corrections alone and the standard recipe are compared by cross-validation
    (each kernel predicted by the recipe fine-tuned without its fold); from it on, each recipe is fine-tuned on the
    same seeded four fifths and the choice that predicts the held-out fifth best (the corrections alone among them)
    is kept; a recipe chosen is then fine-tuned on all kernels (fine-tuning and the model replaced by fakes whose
    error is known)."""
    from pipeweave import finetune, mlp

    calls = []

    def fake_fine_tunes(op, members, registry, fine_tunings, sm_freq, config_dir=None, pool=None):
        calls.extend((recipe.name, len(inputs)) for inputs, _, recipe in fine_tunings)
        return [{"recipe": recipe.name} for _, _, recipe in fine_tunings]

    class FakeModel:  # the thorough recipe is off by 2 %, the standard one by 10 %
        def __init__(self, arrays):
            self.factor = {"standard": 1.10, "thorough": 1.02}[arrays["recipe"]]

        def efficiency(self, inputs, sm_freq):
            return inputs[:, 0] * self.factor

    monkeypatch.setattr(finetune, "fine_tunes_for_gpu", fake_fine_tunes)
    monkeypatch.setattr(mlp, "NumpyMLP", FakeModel)
    few = finetune.MIN_SELECTION_KERNELS - 1
    truth = np.linspace(0.1, 0.9, few)[:, None]
    folds = finetune.validation_folds(few)
    assert len(folds) == finetune.VALIDATION_FOLDS and np.array_equal(np.sort(np.concatenate(folds)), np.arange(few))
    cross_validated = [("standard", few - len(fold)) for fold in folds]
    arrays, log_change, recipe, errors = finetune.fine_tune_selected("gemm", [], None, truth, truth[:, 0], 1000.0,
                                                                     truth[:, 0] * 1.20,  # the corrections: 20 % off
                                                                     lambda fold: truth[:, 0])
    assert (arrays, recipe) == ({"recipe": "standard"}, finetune.STANDARD)
    assert log_change == pytest.approx((np.log(1.10 / 1.20),) * 2)  # its change on the measured kernels
    assert calls == cross_validated + [("standard", few)]
    assert errors == pytest.approx({"corrections_only": np.log(1.20), "standard": np.log(1.10)})
    calls.clear()
    arrays, log_change, recipe, errors = finetune.fine_tune_selected("gemm", [], None, truth, truth[:, 0], 1000.0,
                                                                     truth[:, 0] * 1.05, lambda fold: truth[:, 0])
    assert (arrays, log_change, recipe, calls) == (None, None, finetune.CORRECTIONS_ONLY, cross_validated)
    # each fold is scored against the corrections refitted without it: here they explain the fold's kernels exactly
    # (they lie 1.20x from the corrections fitted on all), so the fine-tuning's 10 % error loses to them
    calls.clear()
    refits = []

    def refitted(fold):
        refits.append(fold)
        return truth[:, 0] * 1.20

    arrays, log_change, recipe, errors = finetune.fine_tune_selected("gemm", [], None, truth, truth[:, 0], 1000.0,
                                                                     truth[:, 0] * 1.20, refitted)
    assert [list(fold) for fold in refits] == [list(fold) for fold in folds]
    assert recipe is finetune.CORRECTIONS_ONLY and errors["corrections_only"] == pytest.approx(0.0)
    assert errors["standard"] == pytest.approx(abs(np.log(1.10 / 1.20)))
    assert "cross-validation" in finetune.selection_method(few)
    assert "fifth" in finetune.selection_method(finetune.MIN_SELECTION_KERNELS)

    calls.clear()
    many = 2 * finetune.MIN_SELECTION_KERNELS
    truth = np.linspace(0.1, 0.9, many)[:, None]
    held = round(many * finetune.VALIDATION_SHARE)

    def not_refitted(rows):  # the fifth is scored under the corrections fitted on all kernels, which are kept
        pytest.fail("from MIN_SELECTION_KERNELS kernels on the corrections are not refitted without the fifth")

    arrays, log_change, recipe, errors = finetune.fine_tune_selected("gemm", [], None, truth, truth[:, 0], 1000.0,
                                                                     truth[:, 0] * 1.05,  # the corrections: 5 % off
                                                                     not_refitted)
    assert recipe is finetune.THOROUGH and arrays == {"recipe": "thorough"}
    assert calls == [("standard", many - held), ("thorough", many - held), ("thorough", many)]
    assert errors == pytest.approx({"corrections_only": np.log(1.05), "standard": np.log(1.10),
                                    "thorough": np.log(1.02)})
    assert np.array_equal(finetune.validation_rows(many), finetune.validation_rows(many))  # seeded

    calls.clear()
    arrays, log_change, recipe, errors = finetune.fine_tune_selected("gemm", [], None, truth, truth[:, 0], 1000.0,
                                                                     truth[:, 0] * 1.01,  # the corrections: 1 % off
                                                                     lambda fold: truth[:, 0])
    assert (arrays, recipe) == (None, finetune.CORRECTIONS_ONLY)
    assert calls == [("standard", many - held), ("thorough", many - held)]


def test_fine_tuning_is_considered_where_the_model_extrapolates_or_with_many_kernels():
    from pipeweave.finetune import MIN_KERNELS, MIN_SELECTION_KERNELS, considers_fine_tuning

    for op in ("gemm", "gemm_fp8"):
        assert not considers_fine_tuning(op, MIN_KERNELS - 1, 1.0)
        assert considers_fine_tuning(op, MIN_KERNELS, 0.5)
        assert not considers_fine_tuning(op, MIN_SELECTION_KERNELS - 1, 0.49)
        assert considers_fine_tuning(op, MIN_SELECTION_KERNELS, 0.0)


def test_attention_and_moe_are_fine_tuned_only_where_many_kernels_choose_it():
    """Attention and MoE are fine-tunable, but the flag never triggers it: only from MIN_SELECTION_KERNELS kernels
    on, where a held-out fifth of them chooses between the corrections alone and the recipes."""
    from pipeweave.finetune import FINE_TUNABLE, MIN_SELECTION_KERNELS, SELECTION_ONLY, considers_fine_tuning

    for op in ("attn", "moe"):
        assert op in FINE_TUNABLE and op in SELECTION_ONLY
        assert not considers_fine_tuning(op, MIN_SELECTION_KERNELS - 1, 1.0)
        assert considers_fine_tuning(op, MIN_SELECTION_KERNELS, 0.0)


def test_the_thorough_recipe_weighs_the_kernels_as_the_whole_replay_set():
    from pipeweave.finetune import STANDARD, THOROUGH

    assert STANDARD.measured_rows(replay_rows=37_900, replay_rows_per_gpu=3_790) == 3_790
    assert THOROUGH.measured_rows(replay_rows=37_900, replay_rows_per_gpu=3_790) == 37_900
    assert THOROUGH.epochs > STANDARD.epochs


def test_the_thorough_recipe_anneals_its_learning_rate(monkeypatch):
    """Each pass of the thorough recipe trains at LEARNING_RATE times a half cosine (the first at the full rate, the
    last near 0), the standard recipe's at the constant rate; the calibration file says which (one real member,
    a tiny replay set, the passes replaced by a recorder)."""
    pytest.importorskip("torch", reason="fine-tuning needs the training extras")
    from analytical_model.hardware import load_hardware
    from pipeweave import training
    from pipeweave.ensemble import member_dirs
    from pipeweave.finetune import LEARNING_RATE, STANDARD, THOROUGH, fine_tune

    rates = []
    monkeypatch.setattr(training, "train_epoch",
                        lambda model, optimizer, *rest: rates.append(optimizer.param_groups[0]["lr"]))
    hw, operator = load_hardware("L40"), get_operator("gemm")
    members = member_dirs(latest_model_dir(REPO / "mlp_models", "gemm"))[:1]
    shapes = {"M": [4096, 8192], "N": [4096, 8192], "K": [4096, 8192]}
    inputs = np.concatenate([operator.features(shapes, hw), operator.descriptors(shapes, hw)], axis=1)
    efficiency = operator.ideal_us(inputs, hw.sm_freq) / np.array([900.0, 1800.0])
    fine_tune("gemm", members, inputs, efficiency, inputs[:1], 8, hw.sm_freq, THOROUGH)
    n = THOROUGH.epochs
    assert rates == pytest.approx([LEARNING_RATE * (1 + np.cos(np.pi * e / n)) / 2 for e in range(n)])
    assert rates[0] == LEARNING_RATE and rates[-1] < 0.01 * LEARNING_RATE
    rates.clear()
    fine_tune("gemm", members, inputs, efficiency, inputs[:1], 8, hw.sm_freq, STANDARD)
    assert rates == [LEARNING_RATE] * STANDARD.epochs
    assert (THOROUGH.as_dict()["learning_rate_schedule"], STANDARD.as_dict()["learning_rate_schedule"]) == \
        ("cosine", "constant")


def test_many_kernel_section_names_the_command_that_rewrites_it():
    """The rendered section says which operator and k it is for, and the command it names parses to the same."""
    from pipeweave import calibration_eval

    def summary(mean):
        return {"mean": mean, "median": mean / 2}

    cell = {"n": 5000, "k": 239, "flagged": 1.0, "k0": summary(12.0), "corrections_only": summary(9.0),
            "standard": summary(8.0), "before": summary(8.0), "selected": summary(6.0), "recipe": "thorough",
            "validation": {"corrections_only": 0.09, "standard": 0.08, "thorough": 0.06}}
    text = calibration_eval.render_many({"NVIDIA A40": cell, "NVIDIA L40S": {**cell, "selected": summary(10.0)}},
                                        "gemm_fp8", 239)
    assert text.startswith("## Calibration on many kernels: gemm_fp8, k = 239\n")
    assert "`python3 -m pipeweave.calibration_eval --many_kernels gemm_fp8 --many_kernels_k 239`" in text
    assert "| NVIDIA A40 | 5000 | 100% | 12.0 / 6.0 | 9.0 / 4.5 | 8.0 / 4.0 | 8.0 / 4.0 | thorough " \
           "(0.090 / 0.080 / 0.060) | **6.0 / 3.0** |" in text
    assert text.endswith("Mean over the 2 GPUs: before 8.0 %, now 8.0 %; the largest now 10.0 % (NVIDIA L40S).")
    with pytest.raises(UserError, match="--many_kernels_k: must be at least 1, got 0"):
        calibration_eval.main(["--many_kernels", "gemm", "--many_kernels_k", "0"])


def attention_measurements(path: Path, rows: np.ndarray, gpu: str = "L40") -> pd.DataFrame:
    """Attention kernels of the profiler's full grid (``rows`` of it) "measured" on ``gpu``: the shipped prediction
    with a planted slowdown the calibration's covariates do not see (GQA with 8 KV heads 1.5x slower, the paged
    decode kernel 20 % faster), in the profiler's CSV format."""
    from pipeweave.finetune import replay_shapes
    from pipeweave.predictor import KernelPredictor
    from pipeweave.profiler.grids import SHAPE_COLUMNS

    shapes = pd.DataFrame(replay_shapes("attn")).iloc[rows].reset_index(drop=True)
    base = KernelPredictor().predict_frame("attn", shapes.assign(hardware=gpu))["predicted_us"].to_numpy()
    factor = (np.where(shapes["nkv"].astype(int) >= 8, 1.5, 1.0)
              * np.where(shapes["attention_type"].str.contains("paged"), 0.8, 1.0))
    frame = shapes.assign(op="attn", hardware=gpu, avg_duration=base * factor)
    frame[["op", *SHAPE_COLUMNS["attn"], "hardware", "avg_duration"]].to_csv(path, index=False)
    return frame.assign(base_us=base)


def test_measured_decode_kernels_calibrate_the_interval_of_decode_rows_only(tmp_path):
    """Prefill and decode attention have corrections of their own: a calibration from decode kernels alone (a Hopper
    profiler file, whose prefill rows are left out) left prefill rows with the calibrated interval too."""
    import pipeweave
    from pipeweave.finetune import replay_shapes

    paged = np.flatnonzero(pd.DataFrame(replay_shapes("attn"))["attention_type"].str.contains("paged").to_numpy())
    attention_measurements(tmp_path / "decode.csv", paged[:40])
    out = tmp_path / "l40.json"
    assert run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(tmp_path / "decode.csv"),
                                          "--output", str(out)]) == 0
    calibration = load_calibration(out)
    assert calibration.kernel_count("attn") == 40 and calibration.fitted_from["kernels"][0]["classes"] == {
        "attn_decode": 40}
    assert calibration.kernel_count("attn", "attn_decode") == 40
    assert calibration.kernel_count("attn", "attn_prefill") == 0
    rows = {"attention_type": ["fa2_ragged", "fa2_paged"], "bs": [1, 8], "q_lengths": ["[2048]", str([1] * 8)],
            "kv_lengths": ["[2048]", str([4096] * 8)], "nh": [32, 32], "nkv": [8, 8], "hd": [128, 128]}
    widths = {}
    for name, given in (("plain", None), ("calibrated", str(out))):
        point, low, high = pipeweave.predict_kernels("attn", rows, "L40", calibration=given, interval=True)
        widths[name] = high / point
    assert widths["calibrated"][0] == widths["plain"][0]  # prefill: its correction is the prior's alone
    assert widths["calibrated"][1] < widths["plain"][1]  # decode: the calibrated state's narrower interval


def test_few_attention_kernels_fit_the_corrections_only(tmp_path, capsys):
    attention_measurements(tmp_path / "attn.csv", np.arange(40))
    out = tmp_path / "l40.json"
    assert run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(tmp_path / "attn.csv"),
                                          "--output", str(out)]) == 0
    assert load_calibration(out).fine_tuned == {}
    said = capsys.readouterr().out
    assert "attn, " in said and "measured kernels (the shipped model extrapolates on" in said
    assert "corrections only (fine-tuning needs at least 200 kernels)" in said


@pytest.mark.slow
def test_many_attention_kernels_fine_tune_where_a_held_out_fifth_prefers_it(tmp_path, capsys):
    """200 attention kernels with a slowdown the corrections cannot express: the held-out fifth chooses a
    fine-tuning, recorded in the file (the log says before the minutes it takes); unseen grid shapes on L40 move
    toward the planted truth, H100's do not move."""
    pytest.importorskip("torch", reason="fine-tuning needs the training extras")
    from pipeweave.finetune import MIN_SELECTION_KERNELS, replay_shapes

    order = np.random.default_rng(0).permutation(len(next(iter(replay_shapes("attn").values()))))
    attention_measurements(tmp_path / "attn.csv", order[:MIN_SELECTION_KERNELS])
    out = tmp_path / "l40.json"
    assert run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(tmp_path / "attn.csv"),
                                          "--output", str(out)]) == 0
    assert (f"attn, {MIN_SELECTION_KERNELS} measured kernels: choosing whether to fine-tune its 5 member(s) on them "
            "(2 fine-tunings to compare") in capsys.readouterr().out
    entry = load_calibration(out).fine_tuned["attn"]
    assert entry["kernels"] == MIN_SELECTION_KERNELS and entry["recipe"] in ("standard", "thorough")
    errors = entry["validation_errors"]
    assert errors[entry["recipe"]] < errors["corrections_only"]

    unseen = attention_measurements(tmp_path / "unseen_truth.csv", order[-100:])
    columns = [c for c in pd.read_csv(tmp_path / "unseen_truth.csv").columns if c not in ("op", "avg_duration")]
    both = pd.concat([unseen[columns], unseen[columns].assign(hardware="H100")], ignore_index=True)
    both.to_csv(tmp_path / "unseen.csv", index=False)
    runs = {}
    for name, extra in (("base", []), ("calibrated", ["--calibration", str(out)])):
        assert run_cli(kernels.main, ["--op", "attn", "--input", str(tmp_path / "unseen.csv"),
                                      "--output", str(tmp_path / f"{name}.csv"), *extra]) == 0
        runs[name] = pd.read_csv(tmp_path / f"{name}.csv", keep_default_na=False)["predicted_us"].to_numpy()
    on_l40, truth = np.arange(len(unseen)), unseen["avg_duration"].to_numpy()
    before = np.abs(runs["base"][on_l40] / truth - 1).mean()
    after = np.abs(runs["calibrated"][on_l40] / truth - 1).mean()
    assert after < 0.5 * before
    h100 = np.arange(len(unseen), len(both))
    assert runs["calibrated"][h100].tolist() == runs["base"][h100].tolist()


def moe_measurements(path: Path, n: int, weight_type: str = "layer") -> Path:
    """``n`` fused-MoE layers of the MoE grid "measured" on L40: the shipped prediction, 1.5x slower with 64 or
    more experts per rank."""
    from pipeweave.finetune import replay_shapes
    from pipeweave.predictor import KernelPredictor

    shapes = pd.DataFrame(replay_shapes("moe"))
    shapes = shapes.iloc[np.random.default_rng(0).choice(len(shapes), n, replace=False)].reset_index(drop=True)
    base = KernelPredictor().predict_frame("moe", shapes.assign(hardware="L40"))["predicted_us"].to_numpy()
    frame = shapes.assign(op="moe", weight_type=weight_type, hardware="L40",
                          avg_duration=base * np.where(shapes["E"] >= 64, 1.5, 1.0))
    frame[["op", "weight_type", "M", "E", "topk", "H", "N", "hardware", "avg_duration"]].to_csv(path, index=False)
    return path


def test_measured_moe_layers_calibrate_the_moe_class(tmp_path, capsys):
    """calibrate.py --kernels reads whole fused-MoE layers (the profiler does not measure them; other benchmarks
    do): they fit the moe corrections, and with fewer than MIN_SELECTION_KERNELS of them nothing is fine-tuned."""
    out, measured = tmp_path / "l40.json", moe_measurements(tmp_path / "moe.csv", 60)
    assert run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(measured), "--output", str(out)]) == 0
    calibration = load_calibration(out)
    assert calibration.fine_tuned == {} and calibration.fitted_from["kernels"][0]["op"] == "moe"
    factors = calibration.summary()["factors"]
    assert factors["moe.compute"] != 1.0 or factors["moe.memory"] != 1.0
    assert "corrections only (fine-tuning needs at least 200 kernels)" in capsys.readouterr().out


def test_moe_passes_are_refused_as_calibration_kernels(tmp_path, capsys):
    path = moe_measurements(tmp_path / "moe.csv", 10, weight_type="w13")
    code = run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(path),
                                          "--output", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "line 2: weight_type must be 'layer'" in err[0]


def test_the_moe_replay_grid_is_what_the_generator_lays_out():
    """Every MoE model x TP x token count of the grid (an expert-parallel rank is the TP shard), one layer row
    each, with a top-k the fused kernel can run; the dense default configs give none."""
    from pipeweave.moe import expert_operators
    from pipeweave.profiler.grids import DEFAULT_CONFIGS, DEFAULT_MOE_CONFIGS, grid_tokens, load_models, moe_grid

    config_dir = REPO / "config"
    assert moe_grid(load_models(DEFAULT_CONFIGS, config_dir), (1, 2), (16,)) == []
    rows = moe_grid(load_models(DEFAULT_MOE_CONFIGS, config_dir), (1, 2, 4, 8), grid_tokens(quick=False))
    assert len(rows) > 500 and all(r["weight_type"] == "layer" and r["topk"] <= r["E"] for r in rows)
    mixtral = load_models(["Mixtral-8x7B"], config_dir)[0]
    layer = expert_operators(mixtral.moe, mixtral.hidden_size, 4096, 8, 8, 1)[0]
    assert {"weight_type": "layer", "M": layer.M, "E": layer.E, "topk": layer.topk, "H": layer.H,
            "N": layer.N} in rows


@pytest.mark.parametrize("body, message", [
    ("", "no measured kernels (only a header)"),
    ("moe,layer,16,1,2,4096,14336,30\n", "row 1 (CSV line 2): topk = 2 exceeds E = 1"),
    ("moe,layer,abc,8,2,4096,14336,30\n", "row 1 (CSV line 2): column M must be a positive integer, got 'abc'"),
])
def test_bad_kernel_files_name_the_file(tmp_path, capsys, body, message):
    """A header-only file, or a shape the operator cannot take, is one line that names the file; no output."""
    path = tmp_path / "kernels.csv"
    path.write_text("op,weight_type,M,E,topk,H,N,avg_duration\n" + body)
    out = tmp_path / "cal.json"
    code = run_cli(calibration_fit.main, ["--hardware", "L40", "--kernels", str(path), "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"--kernels {path}: {message}" in err[0] and not out.exists()


def four_l40_gemms() -> tuple:
    """(L40's spec, the raw model inputs of four GEMMs on it, an efficiency for each): kernels to fine-tune on."""
    from analytical_model.hardware import hardware_registry

    hw = hardware_registry().get("L40")
    operator = get_operator("gemm")
    shapes = {"M": np.array([16, 128, 1024, 4096]), "N": np.array([4096, 8192, 2048, 14336]),
              "K": np.array([4096, 8192, 8192, 4096])}
    rows = np.concatenate([operator.features(shapes, hw), operator.descriptors(shapes, hw)], axis=1)
    return hw, rows, np.array([0.3, 0.5, 0.6, 0.7])


def test_fine_tuning_is_deterministic_and_starts_from_the_members_weight_files_alike(tmp_path):
    """Two fine-tunings of the same members on the same kernels give the same model, to the bit, whether the members
    are read from their torch checkpoints or from their numpy weight files: an installed package ships only the
    latter (a user audit, 2026-12-05: calibrate.py --kernels stopped there whenever it fine-tuned)."""
    pytest.importorskip("torch", reason="fine-tuning needs the training extras")
    from pipeweave.ensemble import member_dirs
    from pipeweave.finetune import fine_tune
    from pipeweave.mlp import checkpoint_path
    from pipeweave.paths import DEFAULT_MODEL_DIR
    from pipeweave.predictor import KernelPredictor

    members = member_dirs(KernelPredictor().model("gemm")[2])[:2]
    copies = []
    for directory in members:
        copy = tmp_path / Path(directory).name
        shutil.copytree(directory, copy)
        checkpoint_path(copy, "gemm").unlink()
        copies.append(copy)
    hw, rows, efficiency = four_l40_gemms()
    tuned = [fine_tune("gemm", dirs, rows, efficiency, rows, 4, hw.sm_freq) for dirs in (members, copies)]
    assert tuned[0].keys() == tuned[1].keys()
    assert all(np.array_equal(tuned[0][key], tuned[1][key]) for key in tuned[0])
    assert str(DEFAULT_MODEL_DIR) in str(members[0])
    damaged = weights_path(copies[0], "gemm")
    damaged.write_bytes(damaged.read_bytes()[:1000])  # cut short: not a zip archive any more
    with pytest.raises(ValueError, match=r"gemm_mlp_weights.npz: damaged or not the weights of this model \(File is "
                                         r"not a zip file\); restore it or retrain with train_mlp.py --op gemm"):
        fine_tune("gemm", copies, rows, efficiency, rows, 4, hw.sm_freq)


def test_members_fine_tuned_in_a_pool_of_processes_are_the_ones_fine_tuned_here():
    """calibrate.py --workers: members fine-tuned at once in two processes give the weights fine-tuned one after the
    other in this one, to the bit (each trains single-threaded with its own seed), in member order; a member that
    fails there fails the fine-tuning with its own error."""
    pytest.importorskip("torch", reason="fine-tuning needs the training extras")
    from pipeweave.ensemble import member_dirs
    from pipeweave.finetune import default_workers, fine_tune, fine_tuning_pool
    from pipeweave.predictor import KernelPredictor

    members = member_dirs(KernelPredictor().model("gemm")[2])[:3]
    hw, rows, efficiency = four_l40_gemms()
    here = fine_tune("gemm", members, rows, efficiency, rows, 4, hw.sm_freq)
    with fine_tuning_pool(2) as pool:
        pooled = fine_tune("gemm", members, rows, efficiency, rows, 4, hw.sm_freq, pool=pool)
        with pytest.raises(FileNotFoundError, match="metadata.json is missing"):
            fine_tune("gemm", [members[0], members[0].parent / "seed999"], rows, efficiency, rows, 4, hw.sm_freq,
                      pool=pool)
    assert here.keys() == pooled.keys() and all(np.array_equal(here[key], pooled[key]) for key in here)
    assert 1 <= default_workers() <= 8
    with fine_tuning_pool(1) as none:
        assert none is None


def test_a_pool_that_cannot_start_or_loses_a_process_is_one_clear_error(monkeypatch):
    """No POSIX semaphores (some sandboxes), or a fine-tuning process killed (out of memory): one line that says
    what happened and names --workers, not a traceback from inside concurrent.futures."""
    import concurrent.futures
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from pipeweave.finetune import fine_tuning_pool, trained_ensembles

    class DyingPool:
        def submit(self, function, *args):
            future = Future()
            future.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))
            return future

    with pytest.raises(UserError, match=r"ended abruptly \(killed for memory\?\).*pass fewer --workers"):
        trained_ensembles([[("gemm", "member")]], DyingPool())

    def no_semaphores(*args, **kwargs):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_semaphores)
    with pytest.raises(UserError, match=r"cannot start 2 worker processes .*Function not implemented.*--workers 1"):
        fine_tuning_pool(2)
