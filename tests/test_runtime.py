"""The lean prediction runtime: exported numpy weights, no torch / scikit-learn on the prediction path, the
Python API, and an installed copy that finds its data outside the checkout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from analytical_model.registry import get_operator
from pipeweave.mlp import LOG1P, NumpyMLP, latest_model_dir, load_model_dir, model_inputs, weights_path
from pipeweave.paths import DEFAULT_MODEL_DIR, DEFAULT_QUANTILE_DIR

REPO = Path(__file__).resolve().parent.parent
SHIPPED = [(root, op) for root in (DEFAULT_MODEL_DIR, DEFAULT_QUANTILE_DIR)
           for op in sorted(p.name for p in root.iterdir() if p.is_dir())]

# Shapes per operator (several GPUs each) whose registry features feed the shipped models.
SHAPES = {
    "gemm": ({"M": [1, 16, 128, 1024, 8192, 3], "N": [8192, 1024, 4096, 8192, 28672, 5120],
              "K": [8192, 4096, 1024, 28672, 8192, 5120]}, ("H100", "A100", "L40S")),
    "gemm_fp8": ({"M": [1, 64, 2048, 8192], "N": [4096, 8192, 1024, 28672], "K": [4096, 1024, 8192, 8192]},
                 ("H100", "L40S", "B200")),
    "attn": ({"attention_type": ["fa2_paged", "fa2_paged", "fa3_ragged", "fa2_ragged"], "bs": [1, 4, 2, 1],
              "q_lengths": ["[1]", "[1,1,1,1]", "[512,2048]", "[4096]"],
              "kv_lengths": ["[1024]", "[100,2000,4000,8000]", "[512,2048]", "[4096]"],
              "nh": [64, 16, 32, 8], "nkv": [8, 2, 8, 8], "hd": [128, 128, 128, 64]}, ("H100", "A100")),
    "rmsnorm": ({"seq": [1, 64, 4096, 32768], "dim": [5120, 8192, 4096, 1024]}, ("A100", "H100", "A40")),
    "siluandmul": ({"seq": [1, 64, 4096, 32768], "dim": [27648, 14336, 7168, 1024]}, ("A100", "H100", "A40")),
    "moe": ({"weight_type": ["layer", "w13", "w2", "layer"], "M": [1, 64, 1024, 8192], "E": [8, 64, 8, 128],
             "topk": [2, 8, 2, 8], "H": [4096, 2048, 4096, 7168], "N": [896, 768, 14336, 2048]}, ("H100", "H200")),
}


def feature_rows(op: str, names: list[str]) -> np.ndarray:
    """The model inputs of ``SHAPES[op]`` on each of its GPUs, as the predictor computes them."""
    pd = pytest.importorskip("pandas", reason="the registry's feature functions take DataFrames")
    from analytical_model.registry import compute_features

    columns, gpus = SHAPES[op]
    frame = pd.concat([pd.DataFrame(columns).assign(hardware=gpu) for gpu in gpus], ignore_index=True)
    return compute_features(op, frame)[names].to_numpy(np.float64)


@pytest.mark.parametrize("root,op", SHIPPED, ids=[f"{root.name}-{op}" for root, op in SHIPPED])
def test_numpy_forward_equals_torch_on_shipped_models(root, op):
    torch = pytest.importorskip("torch", reason="the torch reference needs the training extras")
    from pipeweave import torch_mlp

    from pipeweave.ensemble import member_dirs

    from analytical_model.hardware import load_hardware
    from pipeweave.mlp import total_efficiency

    directory = latest_model_dir(root, op)
    model, metadata = load_model_dir(directory, op)
    x = feature_rows(op, metadata["model_info"]["features"])
    columns, gpus = SHAPES[op]
    sm_freq = np.repeat([load_hardware(gpu).sm_freq for gpu in gpus], len(next(iter(columns.values()))))
    got = model.efficiency(x, sm_freq)
    ideal_us = get_operator(op).ideal_us(x, sm_freq)
    exact, float32 = [], []  # log-efficiency per member (one member for a single model)
    for member in member_dirs(directory) or [directory]:
        reference, _ = torch_mlp.load_model_dir(member, op)
        with torch.no_grad():  # the same network evaluated in double precision
            exact.append(np.log(reference.double().efficiency(
                torch.as_tensor(model.inputs(x), dtype=torch.float64)).numpy()))
        # against torch's float32 pass (what prediction ran before): float32 rounding noise only
        float32.append(np.log(torch_mlp.predict_efficiency(reference.float(), model.inputs(x))))
    # a model with a fixed time reports the whole duration's efficiency from its network's (docs/METHOD.md §4.3)
    fixed = model.fixed_time_us
    np.testing.assert_allclose(got, total_efficiency(np.exp(np.median(exact, axis=0)), ideal_us, fixed), rtol=1e-6)
    np.testing.assert_allclose(got, total_efficiency(np.exp(np.median(float32, axis=0)), ideal_us, fixed), rtol=2e-5)
    assert len(np.unique(got)) > len(got) // 2  # the inputs really differ


def test_export_roundtrip_both_architectures(tmp_path):
    torch = pytest.importorskip("torch", reason="exporting needs the training extras")
    from pipeweave.torch_mlp import build_model, export_weights

    torch.manual_seed(0)
    names = [f"f{i}" for i in range(5)]
    x = np.random.default_rng(0).uniform(0, 1e4, (64, 5))
    for architecture in ("MLP", "MLP_v2"):
        model = build_model(architecture, len(names))
        with torch.no_grad():  # non-trivial batch-norm statistics and bounds
            for module in model.network:
                if isinstance(module, torch.nn.BatchNorm1d):
                    module.running_mean.uniform_(-1, 1)
                    module.running_var.uniform_(0.5, 2)
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.uniform_(-0.5, 0.5)
            if architecture == "MLP_v2":
                model.set_target_range(torch.tensor([-3.0, -0.2]))
        model.eval()
        path = export_weights(model, names, LOG1P, tmp_path / f"{architecture}.npz")
        exported = NumpyMLP.load(path)
        assert exported.architecture == architecture and exported.features == names
        with torch.no_grad():
            exact = model.double().efficiency(torch.as_tensor(model_inputs(x), dtype=torch.float64)).numpy()
        np.testing.assert_allclose(exported.efficiency(x), exact, rtol=1e-9, atol=0)
        if architecture == "MLP_v2":  # the clamp is applied
            assert exported.efficiency(x).min() >= np.exp(-3.0) * (1 - 1e-9)


def test_ensemble_is_the_median_log_efficiency_of_its_members(tmp_path):
    torch = pytest.importorskip("torch", reason="exporting needs the training extras")
    from pipeweave.mlp import ensemble_arrays
    from pipeweave.torch_mlp import build_model, exported_arrays

    names = [f"f{i}" for i in range(5)]
    x = np.random.default_rng(1).uniform(0, 1e4, (32, 5))
    members, singles = [], []
    for seed, bounds in ((0, [-3.0, -0.2]), (1, [-2.0, -0.5]), (2, [-4.0, 0.0])):
        torch.manual_seed(seed)
        model = build_model("MLP_v2", len(names))
        model.set_target_range(torch.tensor(bounds))
        model.eval()
        members.append(exported_arrays(model, names, LOG1P))
        singles.append(NumpyMLP(members[-1]))
    ensemble = NumpyMLP(ensemble_arrays(members))
    expected = np.exp(np.median([np.log(single.efficiency(x)) for single in singles], axis=0))
    np.testing.assert_allclose(ensemble.efficiency(x), expected, rtol=1e-12)  # each member keeps its own clamp
    assert not np.allclose(singles[0].efficiency(x), singles[1].efficiency(x))  # the members really differ
    np.testing.assert_allclose(NumpyMLP(ensemble_arrays([members[0]] * 3)).efficiency(x), singles[0].efficiency(x),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="at least one member"):
        NumpyMLP({**ensemble_arrays(members), "members": np.array(0)})
    with pytest.raises(ValueError, match="share architecture, input transform and features"):
        ensemble_arrays([members[0], {**members[1], "features": np.array(names[::-1])}])


def test_weight_file_checks(tmp_path):
    np.savez(tmp_path / "bad.npz", format=np.array("something else"))
    with pytest.raises(ValueError, match="not a pipeweave-mlp-v1 weight file"):
        NumpyMLP.load(tmp_path / "bad.npz")
    directory = tmp_path / "gemm" / "20000101_000000"
    directory.mkdir(parents=True)
    (directory / "gemm_mlp_model.pth").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="pipeweave-export-mlp"):
        latest_model_dir(tmp_path, "gemm")
    model = NumpyMLP.load(weights_path(latest_model_dir(DEFAULT_MODEL_DIR, "gemm"), "gemm"))
    with pytest.raises(ValueError, match=f"width {len(get_operator('gemm').input_names())}"):
        model.efficiency(np.ones((3, 4)))


PREDICTION_SCRIPT = """
import sys
import pipeweave
from pipeweave.aggregate import main
main(["--workload", "Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2", "--hardware", "H100", "--quantiles",
      "--output", sys.argv[1]])
pipeweave.predict_kernels("gemm", {"M": [1], "N": [1024], "K": [1024]}, "H100")
heavy = sorted(m for m in ("torch", "sklearn", "joblib", "pandas") if m in sys.modules)
print("heavy:", ",".join(heavy))
"""


def test_prediction_path_imports_no_torch_sklearn_or_pandas(tmp_path):
    out = tmp_path / "pred.json"
    proc = subprocess.run([sys.executable, "-c", PREDICTION_SCRIPT, str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "heavy:", proc.stdout
    summary = json.loads(out.read_text())["summary"]
    assert 0 < summary["optimistic_total_duration_ms"] <= summary["total_duration_ms"]


def test_api_matches_the_aggregator_and_predict_kernels(tmp_path):
    import pipeweave
    from pipeweave.aggregate import main

    out = tmp_path / "pred.json"
    main(["--workload", "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1", "--hardware", "A100", "--output", str(out)])
    written = json.loads(out.read_text())
    assert pipeweave.predict_workload("Qwen2.5-14B_arxiv_8_fa2_tp1_pp1", "A100") == written
    data = json.loads((REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json").read_text())
    assert pipeweave.predict_workload(data, "NVIDIA A100-SXM4-80GB")["summary"] == written["summary"]
    with pytest.raises(ValueError, match="known"):
        pipeweave.predict_workload(data, "Z100")

    from pipeweave.predictor import KernelPredictor

    columns, _ = SHAPES["gemm"]
    gpus = ["H100", "NVIDIA A100-SXM4-80GB"] * 3
    us = pipeweave.predict_kernels("gemm", columns, gpus)
    pd = pytest.importorskip("pandas")  # the frame path of the CSV-facing tools, as the reference
    expected = KernelPredictor().predict_frame("gemm", pd.DataFrame(columns).assign(hardware=gpus))["predicted_us"]
    np.testing.assert_allclose(us, expected.to_numpy(), rtol=1e-12)  # same pass, batched per GPU
    assert us.shape == (6,) and np.all(us > 0)
    np.testing.assert_array_equal(pipeweave.predict_kernels("gemm", columns, "H100"),
                                  pipeweave.predict_kernels("gemm", columns, ["H100"] * 6))  # one name for all rows


@pytest.mark.parametrize("op", ["gemm", "gemm_fp8", "attn"])
def test_the_frame_path_predicts_models_trained_without_descriptors(op):
    """The quantile models (and the reference recipe's) read the features alone, but the physical band reads the
    descriptors: the frame path passed only the model's inputs to it and failed with an IndexError."""
    pd = pytest.importorskip("pandas")
    from pipeweave.predictor import KernelPredictor

    columns, gpus = SHAPES[op]
    gpus = [gpu for gpu in gpus for _ in next(iter(columns.values()))]
    predictor = KernelPredictor(DEFAULT_QUANTILE_DIR, quantile=True)
    frame = pd.concat([pd.DataFrame(columns)] * len(SHAPES[op][1]), ignore_index=True).assign(hardware=gpus)
    expected = predictor.predict_columns(op, {c: frame[c].tolist() for c in columns}, gpus)
    np.testing.assert_allclose(predictor.predict_frame(op, frame)["predicted_us"].to_numpy(), expected, rtol=1e-12)


def test_api_errors_are_value_errors_and_memory_is_checked():
    """A library caller catches ValueError for every input problem (the command line's UserError included), and
    the API refuses a workload that does not fit the GPU as the command line does."""
    import pipeweave

    with pytest.raises(ValueError, match="no collective models") as missing:
        pipeweave.predict_workload("Qwen3-32B_arxiv_12_fa2_tp2_pp1", "L40")
    # the fix is told in the API's keywords, not the command line's flags
    assert "collective_estimate='analytical'" in str(missing.value) and "--" not in str(missing.value)
    with pytest.raises(ValueError, match="collective_estimate must be one of model, analytical"):
        pipeweave.predict_workload("Qwen3-32B_arxiv_12_fa2_tp2_pp1", "L40", collective_estimate="Analytical")
    # a list or dict keyed the engine cache first: lru_cache's TypeError "unhashable type: 'list'"
    with pytest.raises(ValueError, match=r"collective_estimate must be one of model, analytical, got \['analytical'\]"):
        pipeweave.predict_workload("Qwen3-32B_arxiv_12_fa2_tp2_pp1", "L40", collective_estimate=["analytical"])
    with pytest.raises(ValueError, match="collective_estimate must be one of model, analytical, got {}"):
        pipeweave.simulate_serving("Llama-3.1-8B", "splitwise_48", "H100", collective_estimate={}, num_requests=4)
    with pytest.raises(ValueError, match="does not fit in GPU memory at TP 4"):
        pipeweave.predict_workload("Llama-3.1-70B_splitwise_64_fa2_tp4_pp1", "A40")
    with pytest.raises(ValueError, match="kernel 1: M = 5000000 exceeds the limit"):
        pipeweave.predict_kernels("gemm", {"M": [16, 5000000], "N": [16, 16], "K": [16, 16]}, "H100")
    with pytest.raises(ValueError, match="one value per kernel each, got lengths M 2, N 1, K 1"):
        pipeweave.predict_kernels("gemm", {"M": [1, 2], "N": [16], "K": [16]}, "H100")
    with pytest.raises(ValueError, match="2 GPU names for 1 kernels"):
        pipeweave.predict_kernels("gemm", {"M": [1], "N": [16], "K": [16]}, ["H100", "A100"])
    # a set's order changes between interpreter runs, so its GPUs would land on other kernels
    with pytest.raises(ValueError, match="hardware: a set has no order"):
        pipeweave.predict_kernels("gemm", {"M": [1, 2], "N": [16] * 2, "K": [16] * 2}, {"H100", "A100"})
    with pytest.raises(ValueError, match="M: an array of 2 dimensions"):
        pipeweave.predict_kernels("gemm", {"M": np.array([[1, 2]]), "N": [16], "K": [16]}, "H100")
    with pytest.raises(ValueError, match="calibration must be the path of a file written by calibrate.py, got dict"):
        pipeweave.predict_kernels("gemm", {"M": [1], "N": [16], "K": [16]}, "H100", calibration={})


def test_api_options_are_checked_and_folders_are_read_as_they_are(tmp_path, monkeypatch):
    """An API audit: "no" switched true/false options on; "" or a list as a GPU was "unknown GPU"; a relative folder
    kept naming the first directory after os.chdir, and a spec JSON edited in place was never read again; warnings
    pointed at pipeweave's lines; predict_kernels gave no extrapolation flags; an unknown attention type warned
    before it was refused."""
    import warnings

    import pipeweave

    workload = "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1"
    for options in ({"quantiles": "no"}, {"ignore_memory": 1}):
        with pytest.raises(ValueError, match="must be True or False, got"):
            pipeweave.predict_workload(workload, "H100", **options)
    with pytest.raises(ValueError, match="per_request_outputs must be True or False"):
        pipeweave.simulate_serving("Llama-3.1-8B", "splitwise_48", "H100", per_request_outputs="no")
    for bad in (["H100"], "", 100):
        with pytest.raises(ValueError, match="hardware must be a GPU name"):
            pipeweave.predict_workload(workload, bad)
    with pytest.raises(ValueError, match="collective_hardware must be a GPU name"):
        pipeweave.predict_workload(workload, "H100", collective_hardware="")
    with pytest.raises(ValueError, match="model_config must be a path or the stem of a shipped one, got None"):
        pipeweave.simulate_serving(None, "splitwise_48", "H100")
    with pytest.raises(ValueError, match="workload must be"):
        pipeweave.predict_workload("", "H100")
    # a copy of the hardware folder, used by a relative name, then edited in place and used from elsewhere
    root = Path(__file__).resolve().parent.parent
    copy = tmp_path / "mine" / "hardware"
    shutil.copytree(root / "hardware", copy)
    monkeypatch.chdir(tmp_path / "mine")
    gemm = {"M": [8192], "N": [8192], "K": [8192]}
    before = pipeweave.predict_kernels("gemm", gemm, "H100", hardware_dir="hardware")[0]
    spec = json.loads((copy / "H100.json").read_text())
    spec["smFreq"] = spec["smFreq"] // 2
    (copy / "H100.json").write_text(json.dumps(spec))
    os.utime(copy / "H100.json", ns=(1, 1))  # a distinct modification time, whatever the file system's resolution
    with pytest.warns(UserWarning, match=r"other values \(sm_freq\) than pipeweave's own JSON of that GPU"):
        assert pipeweave.predict_kernels("gemm", gemm, "H100", hardware_dir="hardware")[0] > 1.5 * before
    monkeypatch.chdir(root)  # "hardware" is now the shipped folder
    assert pipeweave.predict_kernels("gemm", gemm, "H100", hardware_dir="hardware")[0] == pytest.approx(before)
    # flags as predict_kernels.py writes them
    us, flags = pipeweave.predict_kernels("gemm", {"M": [4096, 1000000], "N": [8192, 65536], "K": [8192, 65536]},
                                          "H100", extrapolation=True)
    assert flags[0] == "" and "range" in flags[1]
    assert len(pipeweave.predict_kernels("gemm", gemm, "H100", interval=True, extrapolation=True)) == 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipeweave.predict_workload("Qwen2.5-14B_arxiv_8_fa3_tp1_pp1", "A100")  # FA3 on Ampere: a WARNING
        with pytest.raises(ValueError, match="unknown attention_type 'fa9'"):
            pipeweave.predict_kernels("attn", {"attention_type": "fa9", "bs": 1, "q_lengths": [[512]],
                                               "kv_lengths": [[512]], "nh": 32, "nkv": 8, "hd": 128}, "H100")
    assert caught and all(w.filename == __file__ for w in caught)
    assert not any("fa9" in str(w.message) for w in caught)


def test_engine_takes_a_correction_with_apply_only():
    from pipeweave.engine import Engine

    class Slower:
        def apply(self, kind, hardware, durations_ms, features=None, shapes=None):
            return durations_ms * 2

    workload = "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1"
    plain = Engine(log=None).predict_workload(workload, "A100")
    slower = Engine(calibration=Slower(), log=None).predict_workload(workload, "A100")
    assert slower["summary"]["prefill_duration_ms"] == pytest.approx(2 * plain["summary"]["prefill_duration_ms"],
                                                                     rel=1e-3)
    assert "calibration" not in slower


def test_api_docstring_examples():
    import doctest

    import pipeweave.api

    result = doctest.testmod(pipeweave.api, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 4 and result.failed == 0


def test_requirements_txt_is_the_pyproject_dependencies():
    """CI installs requirements.txt; it must list exactly the base dependencies plus the train, test and serve
    extras."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {*project["dependencies"], *(d for extra in ("train", "test", "serve")
                                         for d in project["optional-dependencies"][extra])}
    lines = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    assert {line for line in lines if line} == wanted


@pytest.mark.slow
def test_installed_copy_predicts_outside_the_checkout(tmp_path):
    """pip-install the package (no dependencies, no build isolation: offline) into a folder and predict from
    another directory: the shipped hardware, models and workloads must come with it. Built from a clean copy of
    the tracked files, so that no earlier build/ folder or untracked file can leak into the package."""
    builder = subprocess.run([sys.executable, "-c", "import setuptools.command.bdist_wheel"], capture_output=True)
    if builder.returncode != 0:  # built into setuptools since 70.1; older ones need the wheel package
        builder = subprocess.run([sys.executable, "-c", "import setuptools, wheel"], capture_output=True)
    if builder.returncode != 0:
        pytest.skip("building offline (--no-build-isolation) needs setuptools >= 70.1, or setuptools with wheel")
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: cannot list the tracked files")
    for name in tracked.stdout.split("\0"):
        if name and (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert not list(target.rglob("*.pth")), "torch checkpoints must not be installed"
    assert not (target / "dataset").exists(), "a top-level dataset package would replace PyPI's of that name"
    from pipeweave.ensemble import member_dirs
    from pipeweave.finetune import FINE_TUNABLE
    from pipeweave.mlp import latest_model_dir

    for op in FINE_TUNABLE:  # fine-tuning (calibrate.py --kernels) starts from the members' weight files
        for member in member_dirs(latest_model_dir(REPO / "mlp_models", op)):
            installed = target / "pipeweave" / "_data" / member.relative_to(REPO)
            assert (installed / "metadata.json").is_file() and (installed / f"{op}_mlp_weights.npz").is_file(), member
    # every file prediction reads at run time comes with it (a missing one would change numbers silently)
    for name in ("pipeweave/_data/collective_models/serving.json", "pipeweave/calibration_prior.json",
                 "pipeweave/efficiency_band.json", "pipeweave/error_intervals.json", "pipeweave/quantize_bandwidth.json",
                 "pipeweave/serving/simulator.py", "pipeweave/paper/reproduce.py"):
        assert (target / name).is_file(), f"{name} is not installed"
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = ("import json, sys, pipeweave, pipeweave.paths as p; "
              "r = pipeweave.predict_workload('Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2', 'H20'); "
              "print(json.dumps({'root': str(p.DATA_ROOT), 'summary': r['summary']}))")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target), "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert Path(got["root"]).is_relative_to(target)
    expected = json.loads((REPO / "e2e" / "pipeweave_pred" / "Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2_H20.json")
                          .read_text())["summary"]
    for key, value in expected.items():
        assert got["summary"][key] == pytest.approx(value, rel=1e-6)
    # a user audit (2026-12-05): a workload the installed generator wrote into ./workload was not found by its stem,
    # and the checkout-only folders (e2e/, docs/, the shared data) were placed in or beside site-packages
    (work / "workload").mkdir()
    shutil.copy(REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json", work / "workload" / "mine.json")
    script = ("import json, pipeweave, pipeweave.paths as p; r = pipeweave.predict_workload('mine', 'A100'); "
              "print(json.dumps({'found': r['summary']['total_duration_ms'] > 0, 'e2e': str(p.E2E_DIR.resolve()), "
              "'shared': str(p.shared_data_dir())}))")
    run = subprocess.run([sys.executable, "-c", script], cwd=work, capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got == {"found": True, "e2e": str(work.resolve() / "e2e"),
                   "shared": str(tmp_path.resolve() / "shared" / "data")}


@pytest.mark.parametrize("module, command, extra", [
    ("torch", "export_mlp", "training extras (pip install 'pipeweave[train]'"),
    ("distributed", "search_config", "serving extras (pip install 'pipeweave[serve]'"),
])
def test_console_script_without_its_extra_is_one_error_line(monkeypatch, capsys, module, command, extra):
    from pipeweave import commands

    def missing(name):
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)

    program = "pipeweave-" + command.replace("_", "-")
    monkeypatch.setattr(commands, "import_module", missing)
    monkeypatch.setattr(sys, "argv", [program])
    assert getattr(commands, command)() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{program}: error: this command needs the {extra}; module '{module}' is missing)"]


def test_console_scripts_point_at_commands():
    from pipeweave import commands

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "pipeweave-aggregate" in scripts and "pipeweave-predict-kernels" in scripts
    for name, target in scripts.items():
        module, function = target.split(":")
        assert module == "pipeweave.commands" and callable(getattr(commands, function)), name


@pytest.mark.parametrize("command, script", [("aggregate", "aggregator.py"), ("serve_sim", "serve_sim.py"),
                                             ("calibrate", "calibrate.py")])
def test_console_script_usage_names_what_was_typed(monkeypatch, capsys, command, script):
    """``pipeweave-serve-sim --help`` said ``usage: serve_sim.py``, a file an installed user does not have."""
    from pipeweave import commands

    program = "pipeweave-" + command.replace("_", "-")
    monkeypatch.setattr(sys, "argv", [f"/venv/bin/{program}", "--help"])
    with pytest.raises(SystemExit) as exit_:
        getattr(commands, command)()
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {program} ")
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit):
        getattr(commands, command)()
    assert capsys.readouterr().out.startswith(f"usage: {script} ")


def _gemm_input_rows(rows: int = 48) -> tuple[list[str], np.ndarray]:
    from analytical_model.hardware import load_hardware
    from analytical_model.registry import get_operator

    operator = get_operator("gemm")
    rng = np.random.default_rng(3)
    shapes = {name: rng.integers(16, 8192, rows) for name in ("M", "N", "K")}
    hw = load_hardware("H100")
    x = np.concatenate([operator.features(shapes, hw), operator.descriptors(shapes, hw)], axis=1)
    return list(operator.input_names(True)), x


def test_pipe_shares_keep_only_the_balance_between_pipes_the_size_and_the_shape():
    from pipeweave.mlp import PIPE_SHARES, transformed_names

    names, x = _gemm_input_rows()
    inputs = model_inputs(x, names, PIPE_SHARES)
    columns = transformed_names(names, PIPE_SHARES)
    assert inputs.shape == (len(x), len(columns)) and np.isfinite(inputs).all()
    cycles = np.array([name.endswith("_cycle") for name in names])
    busiest = columns.index("log(busiest_cycles)")
    assert inputs[:, :busiest].max() <= 1e-6  # a share of the busiest pipe is at most 1 (log ≤ 0)
    # every pipe c times slower (a GPU c times slower throughout): only the size moves, by log c
    slower = x.copy()
    slower[:, cycles] *= 4.0
    moved = model_inputs(slower, names, PIPE_SHARES)
    np.testing.assert_allclose(np.delete(moved, busiest, axis=1), np.delete(inputs, busiest, axis=1), atol=1e-5)
    np.testing.assert_allclose(moved[:, busiest] - inputs[:, busiest], np.log(4.0), atol=1e-5)
    # operation counts and bytes in flight (how much work, which the shape descriptors carry) are not read
    demands = np.array([name.endswith(("_ops", "_in_flight")) for name in names])
    other = x.copy()
    other[:, demands] *= 7.0
    np.testing.assert_array_equal(model_inputs(other, names, PIPE_SHARES), inputs)
    np.testing.assert_array_equal(model_inputs(x, names), np.log1p(x.astype(np.float32)))  # the default: log1p


def _pipe_share_model(names: list[str]):
    """An untrained MLP_v2 over the pipe-share inputs of ``names`` (seeded), in eval mode."""
    import torch

    from pipeweave.mlp import PIPE_SHARES, transformed_names
    from pipeweave.torch_mlp import build_model

    torch.manual_seed(0)
    model = build_model("MLP_v2", len(transformed_names(names, PIPE_SHARES)))
    model.set_target_range(torch.tensor([-3.0, -0.1]))
    return model.eval()


def test_pipe_shares_model_exports_and_runs_as_torch_does(tmp_path):
    torch = pytest.importorskip("torch", reason="exporting needs the training extras")
    from pipeweave.mlp import PIPE_SHARES
    from pipeweave.torch_mlp import build_model, export_weights

    names, x = _gemm_input_rows()
    model = _pipe_share_model(names)
    exported = NumpyMLP.load(export_weights(model, names, PIPE_SHARES, tmp_path / "w.npz"))
    assert exported.input_transform == PIPE_SHARES and exported.input_dim == len(names)
    with torch.no_grad():
        exact = model.double().efficiency(torch.as_tensor(model_inputs(x, names, PIPE_SHARES),
                                                          dtype=torch.float64)).numpy()
    np.testing.assert_allclose(exported.efficiency(x), exact, rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="cannot export"):  # a network over the raw width is not a pipe-shares model
        export_weights(build_model("MLP_v2", len(names)), names, PIPE_SHARES, tmp_path / "bad.npz")


def test_unknown_input_transform_is_refused(tmp_path):
    pytest.importorskip("torch", reason="exporting needs the training extras")
    from pipeweave.torch_mlp import build_model, exported_arrays

    names = [f"f{i}" for i in range(5)]
    arrays = exported_arrays(build_model("MLP_v2", len(names)), names, LOG1P)
    arrays["input_transform"] = np.array("sqrt(x)")
    with pytest.raises(ValueError, match="unsupported input transform 'sqrt"):
        NumpyMLP(arrays, "w.npz")
    with pytest.raises(ValueError, match="unknown input transform"):
        model_inputs(np.ones((2, 5)), names, "sqrt(x)")


def test_fixed_time_efficiency_is_the_whole_duration_and_inverts():
    """t = t0 + C / (p_w f): the total efficiency C / (f t) and back to p_w, exactly; a duration not above t0 is
    an error (the fixed time could not be part of it), and no fixed time changes nothing."""
    from pipeweave.mlp import total_efficiency, work_efficiency

    ideal_us, work = np.array([0.5, 3.0, 200.0]), np.array([0.4, 0.8, 0.9])
    total = total_efficiency(work, ideal_us, 1.0)
    np.testing.assert_allclose(ideal_us / total, 1.0 + ideal_us / work, rtol=1e-15)  # the durations
    np.testing.assert_allclose(work_efficiency(total, ideal_us, 1.0), work, rtol=1e-12)
    assert (total < work).all() and total[-1] > 0.89  # the fixed time weighs on short kernels only
    np.testing.assert_array_equal(total_efficiency(work, ideal_us, 0.0), work)
    np.testing.assert_array_equal(work_efficiency(work, None, 0.0), work)
    with pytest.raises(ValueError, match="not above the fixed time of 1.0 us"):
        work_efficiency(np.array([0.9]), np.array([0.8]), 1.0)  # a 0.89 us kernel


def test_fixed_time_model_exports_and_needs_the_clock(tmp_path):
    """A model trained with a fixed time reports the efficiency of the whole duration from the torch network's
    efficiency of the work, with C_ideal summed from its features and the GPU's clock; without the clock it refuses
    loudly, and its members' disagreement needs none. Ensembles keep one fixed time."""
    torch = pytest.importorskip("torch", reason="exporting needs the training extras")
    from pipeweave.mlp import PIPE_SHARES, ensemble_arrays, total_efficiency
    from pipeweave.torch_mlp import exported_arrays, export_weights

    names, x = _gemm_input_rows()
    model = _pipe_share_model(names)
    ideal_features = get_operator("gemm").ideal_cycle_features
    exported = NumpyMLP.load(export_weights(model, names, PIPE_SHARES, tmp_path / "w.npz", 1.0, ideal_features))
    assert exported.fixed_time_us == 1.0
    with torch.no_grad():
        work = model.double().efficiency(torch.as_tensor(model_inputs(x, names, PIPE_SHARES),
                                                         dtype=torch.float64)).numpy()
    sm_freq = np.linspace(1400.0, 2000.0, len(x))
    expected = total_efficiency(work, get_operator("gemm").ideal_us(x, sm_freq), 1.0)
    np.testing.assert_allclose(exported.efficiency(x, sm_freq), expected, rtol=1e-9, atol=0)
    assert (exported.efficiency(x, sm_freq) < work).all()
    with pytest.raises(ValueError, match="fixed 1.0 us out of every kernel.*SM clock"):
        exported.efficiency(x)
    assert exported.spread(x).shape == (len(x),)
    with pytest.raises(ValueError, match="share their fixed time"):
        ensemble_arrays([exported_arrays(model, names, PIPE_SHARES, 1.0, ideal_features),
                         exported_arrays(model, names, PIPE_SHARES)])
    with pytest.raises(ValueError, match="needs ideal_cycle_features"):
        NumpyMLP({**exported_arrays(model, names, PIPE_SHARES), "fixed_time_us": np.array(1.0)})
    with pytest.raises(ValueError, match=r"ideal_cycle_features \['bogus_cycle'\] are not among its features"):
        NumpyMLP(exported_arrays(model, names, PIPE_SHARES, 1.0, ("bogus_cycle",)))


def test_the_registry_fixed_time_is_the_pipeweave_recipe_s_only():
    """The pipeweave recipe takes the registry's fixed time out of every GEMM; the reference and quantile recipes
    follow docs/METHOD.md and take none; element-wise operators have none."""
    from pipeweave.modeling import fixed_time_us
    from pipeweave.training import TrainConfig

    assert fixed_time_us("gemm", TrainConfig()) == get_operator("gemm").fixed_time_us > 0
    assert fixed_time_us("gemm", TrainConfig(recipe="reference")) == 0.0
    assert fixed_time_us("gemm", TrainConfig(recipe="quantile")) == 0.0
    assert fixed_time_us("rmsnorm", TrainConfig()) == 0.0


@pytest.mark.parametrize("op", ["gemm", "gemm_fp8"])
def test_shipped_gemms_never_take_less_than_their_fixed_time(op):
    """The shipped BF16 and FP8 GEMM models take the registry's fixed time out of every kernel (docs/METHOD.md §4.3):
    their weight files record it, and no shape on any GPU with a calculator is predicted below it, tiny ones
    included, while a large GEMM's prediction is dominated by its work."""
    from analytical_model.hardware import hardware_registry
    from pipeweave.predictor import KernelPredictor

    predictor = KernelPredictor()
    model, metadata, _ = predictor.model(op)
    assert model.fixed_time_us == metadata["model_info"]["fixed_time_us"] == get_operator(op).fixed_time_us == 1.0
    shapes = {"M": [1, 1, 16, 8192], "N": [1, 128, 128, 8192], "K": [1, 128, 64, 8192]}
    checked = 0
    for gpu in hardware_registry().known():
        try:
            us = predictor.predict_columns(op, shapes, [gpu] * 4)
        except ValueError as exc:  # a GPU without an FP8 rate (Ampere); any other error fails
            if "no FP8 tensor-core rate" not in str(exc):
                raise
            continue
        assert (us[:3] >= 1.0).all() and us[3] > 50, (gpu, us)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("op, shapes, fixed", [
    ("attn", {"attention_type": ["fa2_paged", "fa2_paged", "fa2_ragged"], "bs": [1, 2, 1], "q_lengths": ["[1]", "[1,1]",
              "[8192]"], "kv_lengths": ["[2]", "[16,16]", "[8192]"], "nh": [32] * 3, "nkv": [8] * 3, "hd": [128] * 3},
     6.0),
    ("moe", {"weight_type": ["layer"] * 3, "M": [1, 4, 8192], "E": [8] * 3, "topk": [2] * 3, "H": [4096] * 3,
             "N": [14336] * 3}, 20.0),
])
def test_shipped_attention_and_moe_never_take_less_than_their_fixed_time(op, shapes, fixed):
    """Attention's and MoE's own fixed times (docs/METHOD.md §4.3): recorded by the shipped ensembles, and no
    kernel on any shipped GPU is predicted below them, while a large one is dominated by its work."""
    from analytical_model.hardware import hardware_registry
    from pipeweave.predictor import KernelPredictor

    predictor = KernelPredictor()
    model, metadata, _ = predictor.model(op)
    assert model.fixed_time_us == metadata["model_info"]["fixed_time_us"] == get_operator(op).fixed_time_us == fixed
    for gpu in hardware_registry().known():
        us = predictor.predict_columns(op, shapes, [gpu] * 3)
        assert (us >= fixed).all() and us[2] > 5 * fixed, (gpu, us)


def test_api_records_an_ignored_memory_check_as_the_aggregator_does(tmp_path):
    """predict_workload(..., ignore_memory=True) returned no memory_check, although the aggregator's --ignore_memory
    writes one into the same object; and a workload without model_params went unchecked without a word (the
    aggregator prints a note)."""
    import pipeweave
    from pipeweave.aggregate import main
    from pipeweave.workload import build_workload, load_model_config, serialize_workload

    path = tmp_path / "llama70b_tp1.json"  # 141 GB of weights on one 48 GB GPU
    path.write_bytes(serialize_workload(build_workload(load_model_config("Llama-3.1-70B"), [64, 64], 2,
                                                       prefill_attn="fa2_ragged")))
    out = tmp_path / "pred.json"
    main(["--workload", str(path), "--hardware", "L40S", "--ignore_memory", "--output", str(out)])
    written = json.loads(out.read_text())
    with pytest.warns(UserWarning, match="does not fit in GPU memory at TP 1.*predicted anyway"):
        result = pipeweave.predict_workload(path, "L40S", ignore_memory=True)
    assert result["memory_check"] == written["memory_check"]
    assert written["memory_check"]["fits"] is False and written["memory_check"]["ignored"] is True
    assert result == written
    with pytest.raises(ValueError, match=r"does not fit in GPU memory at TP 1.*\(ignore_memory=True predicts anyway\)"):
        pipeweave.predict_workload(path, "L40S")
    data = json.loads(path.read_text())
    del data["model_params"]
    with pytest.warns(UserWarning, match="no model_params, so GPU memory was not checked"):
        unchecked = pipeweave.predict_workload(data, "L40S")
    assert "memory_check" not in unchecked


@pytest.mark.parametrize("op, shapes, message", [
    ("attn", {"attention_type": ["fa2_ragged"] * 2, "bs": [1, 3], "q_lengths": [[5], [1, 2]],
              "kv_lengths": [[5], [1, 2]], "nh": [8, 8], "nkv": [8, 8], "hd": [128, 128]},
     "kernel 1: q_lengths has 2 entries but batch_size is 3"),
    ("attn", {"attention_type": ["fa2_ragged"] * 2, "bs": [1, 1], "q_lengths": [[5], [9]],
              "kv_lengths": [[5], [4]], "nh": [8, 8], "nkv": [8, 8], "hd": [128, 128]},
     "kernel 1: q_lengths entry 9 exceeds its kv_lengths entry 4"),
    ("moe", {"weight_type": ["layer"] * 2, "M": [16, 16], "E": [8, 8], "topk": [2, 99], "H": [4096] * 2,
             "N": [14336] * 2}, "kernel 1: topk = 99 exceeds E = 8"),
    ("moe", {"weight_type": ["layer", "w3"], "M": [16, 16], "E": [8, 8], "topk": [2, 2], "H": [4096] * 2,
             "N": [14336] * 2}, "kernel 1: weight_type must be one of w13, w2, layer, got 'w3'"),
])
def test_api_kernel_shape_errors_name_the_kernel(op, shapes, message):
    """A shape the calculator refuses as a whole (attention lengths per request, MoE top-k) was reported without
    the kernel it came from: the features are computed per GPU, where a row's position is not its own."""
    import pipeweave

    with pytest.raises(ValueError) as error:
        pipeweave.predict_kernels(op, shapes, ["H100", "A100"])
    assert str(error.value).startswith(message)


def test_api_kernel_shapes_are_read_by_position_and_as_predict_kernels_reads_them(tmp_path):
    """A pandas frame with another index paired the results with the wrong kernels (a filtered one raised KeyError);
    a dataset's source column changed the GEMM prediction, which predict_kernels.py ignores; scalars, a missing
    column, absurd tiles and a damaged model raised TypeError, KeyError or a zip error, or gave 10¹¹ µs."""
    pd = pytest.importorskip("pandas")
    import pipeweave

    frame = pd.DataFrame({"M": [1, 4096, 128], "N": [8192, 8192, 1024], "K": [8192, 8192, 1024]})
    one_by_one = [pipeweave.predict_kernels("gemm", {c: [frame[c][i]] for c in "MNK"}, "H100")[0] for i in range(3)]
    shuffled = frame.sort_values("M", ascending=False)
    np.testing.assert_allclose(pipeweave.predict_kernels("gemm", shuffled, "H100"),
                               [one_by_one[i] for i in shuffled.index], rtol=1e-12)
    np.testing.assert_allclose(pipeweave.predict_kernels("gemm", frame[frame.M > 1], "H100"), one_by_one[1:],
                               rtol=1e-12)
    gpus = pd.Series(["A100", "H100"], index=[7, 3])
    assert pipeweave.predict_kernels("gemm", frame.iloc[:2], gpus)[1] == pytest.approx(one_by_one[1], rel=1e-12)
    assert pipeweave.predict_kernels("gemm", {"M": 1, "N": 8192, "K": 8192}, "H100")[0] == pytest.approx(one_by_one[0])
    source = {"M": [4096], "N": [8192], "K": [8192], "source": ["vidur 7d47513 a100/x.csv"]}
    assert pipeweave.predict_kernels("gemm", source, "A100")[0] == pipeweave.predict_kernels(
        "gemm", {"M": [4096], "N": [8192], "K": [8192]}, "A100")[0]
    with pytest.raises(ValueError, match="lacks column.s. K needed by gemm"):
        pipeweave.predict_kernels("gemm", {"M": [1], "N": [1]}, "H100")
    tile = {"M": [5], "N": [8192], "K": [8192], "tile_M": [64], "tile_N": [64], "tile_K": [64], "is_split_k": [0]}
    with pytest.raises(ValueError, match="cta_count = 10+ exceeds the limit 2,147,483,647"):
        pipeweave.predict_kernels("gemm", {**tile, "cta_count": [10 ** 30]}, "H100")
    with pytest.raises(ValueError, match="tile_M = 7 is not a multiple of 8"):
        pipeweave.predict_kernels("gemm", {**tile, "tile_M": [7], "cta_count": [100]}, "H100")
    with pytest.raises(ValueError, match="hardware must be a GPU name or one per kernel"):
        pipeweave.predict_kernels("gemm", frame, None)
    with pytest.raises(ValueError, match="cta_count = 2147483647 exceeds the 1,024 CTAs the tiles allow"):
        pipeweave.predict_kernels("gemm", {**tile, "M": [1024], "N": [1024], "K": [1024], "tile_N": [128],
                                           "tile_M": [128], "cta_count": [2 ** 31 - 1]}, "H100")
    one = {"attention_type": "fa2_paged", "bs": 2, "nh": 32, "nkv": 8, "hd": 128}
    assert pipeweave.predict_kernels("attn", {**one, "q_lengths": [1, 1], "kv_lengths": [128, 256]}, "H100") == \
        pytest.approx(pipeweave.predict_kernels("attn", {**one, "q_lengths": [[1, 1]], "kv_lengths": [[128, 256]]},
                                                "H100"))  # one kernel's per-request lists, flat
    damaged = tmp_path / "models"
    shutil.copytree(latest_model_dir(DEFAULT_MODEL_DIR, "gemm"), damaged / "gemm" / "20990101_000000")
    weights_path(damaged / "gemm" / "20990101_000000", "gemm").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match="cannot be loaded"):
        pipeweave.predict_kernels("gemm", frame, "H100", model_dir=damaged)


def test_api_workload_inputs_that_are_not_workloads_are_value_errors_and_warnings_are_warnings():
    """None, a number or a JSON text raised TypeError or OSError; a numpy number in a workload dict a TypeError from
    json; and the aggregator's WARNING for a FlashAttention-3 workload on A100 was dropped without a word."""
    import warnings

    import pipeweave

    for workload in (None, 5, json.dumps({"iterations": []}) * 20):
        with pytest.raises(ValueError, match="workload"):
            pipeweave.predict_workload(workload, "H100")
    with pytest.raises(FileNotFoundError, match="workload file not found"):  # as documented, not a ValueError
        pipeweave.predict_workload("no_such_workload.json", "H100")
    root = Path(__file__).resolve().parent.parent
    plain = json.loads((root / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json").read_text())
    expected = pipeweave.predict_workload(plain, "A100")["summary"]
    assert pipeweave.predict_workload({**plain, "tp_size": np.int64(1)}, "A100")["summary"] == expected
    pipeweave.api._engine.cache_clear()  # the engine warns once per workload and GPU
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipeweave.predict_workload("Qwen2.5-14B_arxiv_8_fa3_tp1_pp1", "A100")
    assert any("FlashAttention-3, Hopper only" in str(w.message) for w in caught)
    assert not any("Loaded" in str(w.message) for w in caught)
    # each call is a run of its own: the cached engine gives the warning again, for an unnamed workload too
    fa3 = json.loads((root / "workload" / "Qwen2.5-14B_arxiv_8_fa3_tp1_pp1.json").read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            pipeweave.predict_workload(fa3, "A100")
        pipeweave.predict_kernels("attn", {"attention_type": ["fa3_paged"], "bs": [1], "q_lengths": [[1]],
                                           "kv_lengths": [[1024]], "nh": [16], "nkv": [2], "hd": [128]}, "H100")
    messages = [str(w.message) for w in caught]
    assert sum("FlashAttention-3, Hopper only" in m for m in messages) == 2
    assert sum("uses fa3_paged, which no GPU's attention measurements hold" in m for m in messages) == 1


def test_scoring_own_runs_needs_no_pandas(tmp_path):
    """pipeweave-compare runs scores the runs calibrate.py --e2e reads, which the base install calibrates from; it
    went through pipeweave.compare, which imports pandas."""
    runs = tmp_path / "runs.csv"
    runs.write_text("workload,prefill_ms,decode_step_ms,total_ms\nQwen2.5-14B_arxiv_8_fa2_tp1_pp1,3400,27,\n")
    script = ("import builtins, sys\n"
              "real = builtins.__import__\n"
              "def guard(name, *args, **kwargs):\n"
              "    if name.split('.')[0] in ('pandas', 'torch', 'sklearn'):\n"
              "        raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
              "    return real(name, *args, **kwargs)\n"
              "builtins.__import__ = guard\n"
              f"sys.argv = ['pipeweave-compare', 'runs', '--hardware', 'A100', '--runs', {str(runs)!r}]\n"
              "from pipeweave.commands import compare\n"
              "sys.exit(compare())\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "1 run(s): mean error" in proc.stdout
    # its --help lists the commands there too (it said the training extras were missing)
    argv = f"['pipeweave-compare', 'runs', '--hardware', 'A100', '--runs', {str(runs)!r}]"
    helped = subprocess.run([sys.executable, "-c", script.replace(argv, "['pipeweave-compare', '--help']")],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert helped.returncode == 0 and "usage: pipeweave-compare {summarize-real,static,vllm,runs}" in helped.stdout


def test_an_installed_copys_messages_name_its_console_scripts(monkeypatch, tmp_path):
    """An installed copy has no calibrate.py; its messages named it (a user audit, 2026-12-05). They name the console
    script there, each one's pyproject entry, and the script in a checkout."""
    from pipeweave import commands, paths
    from pipeweave.calibration import load_calibration

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for script, console in paths.CONSOLE_SCRIPTS.items():
        assert (REPO / script).is_file() and console in scripts
        assert f"({script}" in getattr(commands, scripts[console].split(":")[1]).__doc__
    with pytest.raises(FileNotFoundError, match=r"\(write one with calibrate\.py\)"):
        load_calibration(tmp_path / "missing.json")
    monkeypatch.setattr(paths, "CHECKOUT", False)
    with pytest.raises(FileNotFoundError, match=r"\(write one with pipeweave-calibrate\)"):
        load_calibration(tmp_path / "missing.json")
