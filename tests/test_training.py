"""Dataset builder, splits, training recipes, model directories and the training CLIs on small synthetic data."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch", reason="training needs torch (pip install '.[train]')")

from analytical_model.registry import get_operator  # noqa: E402 - after the torch check
from pipeweave.paths import DATASET_DIR  # noqa: E402
from dataset.build import CalculatorRejectedRows, build_operator, fp8_rows_for_gemm, split  # noqa: E402
from pipeweave.mlp import latest_model_dir, weights_path  # noqa: E402
from pipeweave.predictor import KernelPredictor  # noqa: E402
from pipeweave.torch_mlp import MLP, MLP_v2, count_parameters, load_model_dir  # noqa: E402
from pipeweave.splits import shape_holdout_mask, shape_keys  # noqa: E402
from pipeweave.training import TrainConfig, fit, validation_split  # noqa: E402


def synthetic_gemm(n=400, seed=0, gpus=("H100", "A100")) -> pd.DataFrame:
    """Measurements with a smooth, learnable efficiency (a fraction of the roofline)."""
    rng = np.random.default_rng(seed)
    rows = []
    for gpu in gpus:
        m = rng.integers(1, 8192, n)
        nn = rng.choice([1024, 2048, 4096, 8192], n)
        k = rng.choice([1024, 4096, 8192], n)
        flops = 2.0 * m * nn * k
        rows.append(pd.DataFrame({"M": m, "N": nn, "K": k, "hardware": gpu,
                                  "avg_duration": 3.0 + flops / (400e12 if gpu == "H100" else 200e12) * 1e6,
                                  "source": "synthetic", "dtype": "bfloat16"}))
    return pd.concat(rows, ignore_index=True)


@pytest.fixture(scope="module")
def gemm_dataset(tmp_path_factory):
    frame = build_operator("gemm", synthetic_gemm(), log=lambda *a: None)
    train, test = split(frame, "gemm", 0.2)
    root = tmp_path_factory.mktemp("dataset")
    train.to_csv(root / "gemm_train.csv", index=False)
    test.to_csv(root / "gemm_test.csv", index=False)
    return root, train, test


def test_parameter_counts_match_method():
    assert count_parameters(MLP(11)) == 45185 and count_parameters(MLP(15)) == 46209
    assert count_parameters(MLP(7)) == 44161 and count_parameters(MLP(4)) == 43393
    assert count_parameters(MLP_v2(11)) == 45185  # same body, no parameters in the sigmoid


def test_build_schema_and_shape_split(gemm_dataset):
    _, train, test = gemm_dataset
    operator = get_operator("gemm")
    expected = (["M", "N", "K", "tile_M", "tile_N", "tile_K", "is_split_k", "cta_count", "avg_duration", "hardware",
                 "tc_bf16", "xu_fp32", "fma_fp32", "num_sms", "sm_freq", "mem_bandwidth", "l2_cache_bandwidth",
                 "shared_memory_bandwidth"] + list(operator.feature_names) + list(operator.descriptor_names)
                + ["overall_perf", "source", "dtype"])
    assert list(train.columns) == expected
    assert set(train["hardware"]) == {"NVIDIA H100", "NVIDIA A100-SXM4-80GB"}  # canonical driver names
    assert not set(shape_keys(train, "gemm")) & set(shape_keys(test, "gemm"))
    assert 0.1 < len(test) / (len(train) + len(test)) < 0.3
    perf = train["tensor_all_cycle"] / (train["avg_duration"] * train["sm_freq"])
    np.testing.assert_allclose(train["overall_perf"], perf, rtol=1e-6)


def test_build_drops_and_logs_invalid_rows():
    raw = synthetic_gemm(100).copy()
    raw.loc[0, "avg_duration"] = -1.0
    raw.loc[1, "hardware"] = "V100"
    raw.loc[2, "M"] = 0
    messages = []
    out = build_operator("gemm", raw, log=messages.append)
    assert len(out) == len(raw) - 3
    text = "\n".join(messages)
    assert "GPU without a hardware JSON" in text and "non-positive duration" in text and "calculator rejected" in text


def test_build_stops_when_the_calculators_reject_more_than_a_few_rows():
    """A calculator that rejects many rows is broken: the build must not write a dataset without them."""
    raw = synthetic_gemm(100).copy()
    raw.loc[:9, "M"] = 0  # about 5 % of the rows (repeats of a shape are averaged first)
    rejected = r"gemm: the calculators rejected \d+ of \d+ rows .*M must be a positive"
    with pytest.raises(CalculatorRejectedRows, match=rejected):
        build_operator("gemm", raw, log=lambda *a: None)
    one_gpu_rejected = synthetic_gemm(100)
    one_gpu_rejected.loc[one_gpu_rejected["hardware"] == "A100", "M"] = 0
    one_gpu_rejected = pd.concat([synthetic_gemm(1000, gpus=("H100",)), one_gpu_rejected.iloc[-1:]], ignore_index=True)
    with pytest.raises(CalculatorRejectedRows, match=r"every row of NVIDIA A100-SXM4-80GB"):
        build_operator("gemm", one_gpu_rejected, log=lambda *a: None)


def test_repeated_keys_are_averaged():
    raw = synthetic_gemm(5)
    doubled = pd.concat([raw, raw.assign(avg_duration=raw["avg_duration"] * 3)], ignore_index=True)
    out = build_operator("gemm", doubled, log=lambda *a: None)
    assert len(out) == len(raw.drop_duplicates(["M", "N", "K", "hardware"]))
    merged = out.merge(raw, on=["M", "N", "K"], suffixes=("", "_raw"))
    np.testing.assert_allclose(merged["avg_duration"], 2 * merged["avg_duration_raw"])


def test_fp8_rows_stand_in_as_the_bf16_gemm_of_half_the_k_for_gpus_without_bf16():
    gemm = build_operator("gemm", synthetic_gemm(10), log=lambda *a: None)
    fp8_raw = synthetic_gemm(60, gpus=("H100", "H20", "H800")).assign(dtype="fp8")
    fp8_raw = pd.concat([fp8_raw, fp8_raw.assign(M=2), fp8_raw.assign(M=64)],  # memory-bound; padded to 128
                        ignore_index=True)
    fp8 = build_operator("gemm_fp8", fp8_raw, log=lambda *a: None)
    extra = fp8_rows_for_gemm(gemm, fp8, log=lambda *a: None)
    # H800 has H100's compute and memory spec: H100's BF16 rows describe it, no stand-ins
    assert set(extra["hardware"]) == {"NVIDIA H20"} and list(extra.columns) == list(gemm.columns)
    assert len(extra) >= 5 and (extra["dtype"] == "fp8").all()
    # each row is the BF16 calculator's row of (M, N, K/2) on H20 with the FP8 kernel's measured duration, so it
    # sits exactly where H20's own BF16 query of that shape does
    keys = ["M", "N", "K"]
    h20 = fp8[fp8["hardware"] == "NVIDIA H20"].assign(K=lambda f: f["K"] // 2).set_index(keys)
    as_bf16 = build_operator("gemm", extra[keys + ["hardware", "avg_duration", "source", "dtype"]],
                             log=lambda *a: None).set_index(keys)
    extra = extra.set_index(keys)
    pd.testing.assert_frame_equal(extra.sort_index(), as_bf16.loc[extra.index].sort_index()[extra.columns])
    np.testing.assert_allclose(extra["avg_duration"], h20.loc[extra.index, "avg_duration"])
    # kept: compute-bound rows whose FP8 tiles divide the work as the BF16 tile rule does
    assert (extra["exact_tensor_cycle"] >= extra["exact_dram_cycle"]).all()
    for column in ("tensor_all_cycle", "tensor_sm_max_cycle"):
        assert np.allclose(extra[column], h20.loc[extra.index, column], rtol=0.05)
    padded = h20[(h20.index.get_level_values("M") == 64) & (h20["exact_tensor_cycle"] >= h20["exact_dram_cycle"])]
    assert len(padded) and not extra.index.isin(padded.index).any()
    assert not (extra.index.get_level_values("M") == 2).any()


def test_shape_split_is_deterministic_and_order_free():
    keys = np.array([f"{i}|{i * 7}" for i in range(2000)], dtype=object)
    mask = shape_holdout_mask(keys)
    assert np.array_equal(mask[::-1], shape_holdout_mask(keys[::-1]))
    assert 0.15 < mask.mean() < 0.25


def test_one_gemm_shape_in_two_dtypes_falls_on_one_side():
    raw = synthetic_gemm(300)
    both = pd.concat([raw, raw.assign(dtype="float16", source="other")], ignore_index=True)
    train, test = split(build_operator("gemm", both, log=lambda *a: None), "gemm", 0.2)
    train_shapes, test_shapes = (set(map(tuple, frame[["M", "N", "K", "hardware"]].to_numpy().tolist()))
                                 for frame in (train, test))
    assert test_shapes and not train_shapes & test_shapes


@pytest.mark.data
def test_built_gemm_files_share_no_shape_across_the_split():
    paths = {(op, part): DATASET_DIR / f"{op}_{part}.csv" for op in ("gemm", "gemm_fp8") for part in ("train", "test")}
    if not all(path.is_file() for path in paths.values()):
        pytest.skip("dataset not built (python3 -m dataset.build)")
    shapes = {key: set(map(tuple, pd.read_csv(path, usecols=["M", "N", "K"]).to_numpy().tolist()))
              for key, path in paths.items()}
    train = shapes["gemm", "train"] | shapes["gemm_fp8", "train"]
    test = shapes["gemm", "test"] | shapes["gemm_fp8", "test"]
    assert test and not train & test


def test_reference_validation_split_semantics():
    n = 103
    train_idx, val_idx = validation_split(n, TrainConfig(recipe="reference"), None)
    perm = np.random.RandomState(42).permutation(n)
    assert set(val_idx) == set(perm[:21]) and len(train_idx) == n - 21  # ceil(0.2 n) validation rows


def test_grouped_validation_keeps_shapes_together():
    keys = np.repeat(np.array([f"s{i}" for i in range(50)], dtype=object), 3)
    train_idx, val_idx = validation_split(len(keys), TrainConfig(), keys)
    assert not set(keys[train_idx]) & set(keys[val_idx])


def test_training_is_deterministic_and_learns(gemm_dataset):
    _, train, test = gemm_dataset
    names = list(get_operator("gemm").input_names())
    x = np.log1p(train[names].to_numpy(np.float32))
    config = TrainConfig(epochs=40, patience=40, progress=False)
    model_a, hist_a = fit(x, train["overall_perf"].to_numpy(), config, shape_keys(train, "gemm"))
    model_b, hist_b = fit(x, train["overall_perf"].to_numpy(), config, shape_keys(train, "gemm"))
    for key, value in model_a.state_dict().items():
        assert torch.equal(value, model_b.state_dict()[key])
    assert hist_a["val_loss"] == hist_b["val_loss"]
    assert hist_a["best_val_loss"] < hist_a["val_loss"][0]


@pytest.mark.slow
def test_train_mlp_cli_writes_model_dir_and_predictor_loads_it(gemm_dataset, tmp_path, repo_root):
    root, _, test = gemm_dataset
    result = subprocess.run([sys.executable, "train_mlp.py", "--op", "gemm", "--epochs", "5", "--dataset_dir", str(root),
                             "--output_dir", str(tmp_path), "--no_progress"], cwd=repo_root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    directory = latest_model_dir(tmp_path, "gemm")
    meta = json.loads((directory / "metadata.json").read_text())
    assert meta["model_info"]["features"] == list(get_operator("gemm").input_names())
    assert meta["model_info"]["architecture"] == "MLP_v2" and meta["evaluation_results"]["by_hardware"]
    machine = meta["training"]["machine"]  # which processor trained it: tables say whose models they score
    assert machine["cpu"] and machine["torch"] == torch.__version__ and machine["cpu_capability"]
    from pipeweave.calibration import file_digest

    assert meta["data_info"]["digest"] == {"train_path": file_digest(root / "gemm_train.csv"),  # which data, exactly
                                           "test_path": file_digest(root / "gemm_test.csv")}
    ranges = meta["network_input_ranges"]  # the pipe-share model's edges (pipeweave.edges), from its training rows
    assert ranges["log(busiest_cycles)"][0] < ranges["log(busiest_cycles)"][1]
    assert all(high < 1e-5 for name, (_, high) in ranges.items() if name.startswith("share("))  # log(1 + 1e-6)
    worst = pd.read_csv(directory / "worst_cases_top100.csv")
    assert list(worst.columns[-2:]) == ["predicted", "rel_error"] and worst["rel_error"].is_monotonic_decreasing
    model, _ = load_model_dir(directory, "gemm")
    assert not model.training and weights_path(directory, "gemm").is_file()  # training exports the numpy weights
    out = KernelPredictor(tmp_path).predict_frame("gemm", test[["M", "N", "K", "hardware"]].head(5))
    assert (out["predicted_us"] > 0).all()


@pytest.mark.slow
def test_ensemble_cli_writes_members_and_the_predictor_averages_them(gemm_dataset, tmp_path, repo_root):
    from pipeweave import torch_mlp
    from pipeweave.ensemble import member_dirs
    from analytical_model.registry import get_operator
    from pipeweave.mlp import NumpyMLP, total_efficiency
    from pipeweave.torch_mlp import predict_efficiency

    root, _, test = gemm_dataset
    result = subprocess.run([sys.executable, "train_mlp.py", "--op", "gemm", "--epochs", "3", "--dataset_dir", str(root),
                             "--output_dir", str(tmp_path), "--no_progress", "--ensemble_seeds", "7,3"],
                            cwd=repo_root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    directory = latest_model_dir(tmp_path, "gemm")
    meta = json.loads((directory / "metadata.json").read_text())
    assert meta["ensemble"]["seeds"] == [7, 3] and meta["training"]["ensemble_seeds"] == [7, 3]
    assert [m["seed"] for m in meta["ensemble"]["members"]] == [7, 3] and meta["evaluation_results"]["by_hardware"]
    assert all(m["machine"]["torch"] == torch.__version__ for m in meta["ensemble"]["members"])
    frame = test[["M", "N", "K", "hardware"]].head(20)
    members = [load_model_dir(member, "gemm")[0] for member in member_dirs(directory)]
    ensemble = NumpyMLP.load(weights_path(directory, "gemm"))
    x = test[meta["model_info"]["features"]].to_numpy(np.float64)[:20]
    sm_freq = test["sm_freq"].to_numpy(np.float64)[:20]
    work = np.exp(np.median([np.log(predict_efficiency(member, ensemble.inputs(x))) for member in members], axis=0))
    assert ensemble.fixed_time_us == meta["model_info"]["fixed_time_us"] == 1.0  # the members' (docs/METHOD.md §4.3)
    np.testing.assert_allclose(ensemble.efficiency(x, sm_freq),
                               total_efficiency(work, get_operator("gemm").ideal_us(x, sm_freq), 1.0), rtol=2e-5)
    with pytest.raises(ValueError, match="ensemble of 2 members"):
        torch_mlp.load_model_dir(directory, "gemm")
    before = weights_path(directory, "gemm").read_bytes()
    torch_mlp.export_roots([tmp_path], log=lambda *a: None)  # re-export rebuilds the same ensemble file
    assert np.load(weights_path(directory, "gemm"))["members"] == 2 and len(before) > 0
    assert NumpyMLP.load(weights_path(directory, "gemm")).fixed_time_us == 1.0  # re-exported from the metadata
    out = KernelPredictor(tmp_path).predict_frame("gemm", frame)
    assert (out["predicted_us"] > 0).all()


@pytest.mark.slow
def test_reference_recipe_uses_method_features(gemm_dataset, tmp_path, repo_root):
    root, _, _ = gemm_dataset
    result = subprocess.run([sys.executable, "train_mlp.py", "--op", "gemm", "--recipe", "reference", "--epochs", "3",
                             "--dataset_dir", str(root), "--output_dir", str(tmp_path), "--no_progress"],
                            cwd=repo_root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    meta = json.loads((latest_model_dir(tmp_path, "gemm") / "metadata.json").read_text())
    assert meta["model_info"]["features"] == list(get_operator("gemm").feature_names)
    assert meta["model_info"]["architecture"] == "MLP" and meta["model_info"]["model_parameters"]["dropout_rate"] == 0.1


@pytest.mark.slow
def test_quantile_cli_reports(gemm_dataset, tmp_path, repo_root):
    root, _, _ = gemm_dataset
    result = subprocess.run([sys.executable, "train_mlp_quantile.py", "--op", "gemm", "--epochs", "3", "--topk", "5",
                             "--dataset_dir", str(root), "--output_dir", str(tmp_path), "--no_progress"],
                            cwd=repo_root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    directory = latest_model_dir(tmp_path, "gemm")
    summary = pd.read_csv(directory / "kernel_reports" / "summary.csv")
    assert set(summary["hardware"]) == {"NVIDIA H100", "NVIDIA A100-SXM4-80GB"}
    assert (summary["topk_count"] <= 5).all()
    meta = json.loads((directory / "metadata.json").read_text())
    assert meta["model_info"]["model_type"] == "GEMM_MLP_QUANTILE" and "val_loss" not in torch.load(
        directory / "gemm_mlp_model.pth", weights_only=True)


@pytest.mark.parametrize("args,message", [
    (["--op", "conv"], "invalid choice"),
    (["--op", "gemm", "--dataset_dir", "/nonexistent"], "python3 -m dataset.build"),
])
def test_train_mlp_bad_input(args, message, repo_root, tmp_path):
    result = subprocess.run([sys.executable, "train_mlp.py", *args, "--output_dir", str(tmp_path)], cwd=repo_root,
                            capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())


def test_missing_model_names_file_and_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"python3 train_mlp.py --op attn"):
        KernelPredictor(tmp_path).model("attn")



def test_shipped_ensembles_are_trained_and_evaluated_alike():
    """train_all.sh trains the ensembles of pipeweave.ensemble.SHIPPED_SEEDS, and leave-one-GPU-out evaluates
    the same members (one seed for the single models)."""
    import re
    from pathlib import Path

    from pipeweave.ensemble import SHIPPED_SEEDS
    from pipeweave.logo_cache import logo_config, logo_seeds

    script = (Path(__file__).resolve().parent.parent / "train_all.sh").read_text()
    ops = re.search(r"if \[\[ (.*?) \]\]; then", script).group(1)
    assert set(re.findall(r"\$op == (\w+)", ops)) == set(SHIPPED_SEEDS)
    seeds = re.search(r"--ensemble_seeds ([\d,]+)", script).group(1)
    assert all(tuple(map(int, seeds.split(","))) == s for s in SHIPPED_SEEDS.values())
    assert logo_seeds("gemm") == SHIPPED_SEEDS["gemm"] and logo_seeds("rmsnorm") == (logo_config().seed,)


def test_input_transform_follows_the_registry_only_for_the_pipeweave_recipe_on_its_own_inputs():
    from pipeweave.mlp import LOG1P, PIPE_SHARES
    from pipeweave.modeling import input_transform

    assert input_transform("gemm", TrainConfig()) == PIPE_SHARES
    assert input_transform("attn", TrainConfig()) == PIPE_SHARES
    assert input_transform("moe", TrainConfig()) == PIPE_SHARES
    assert input_transform("gemm_fp8", TrainConfig()) == LOG1P  # lower on 4 of its 10 GPUs: docs/METHOD.md §4.1
    assert input_transform("rmsnorm", TrainConfig()) == LOG1P
    assert input_transform("gemm", TrainConfig(recipe="reference")) == LOG1P  # the artifact's recipe
    assert input_transform("gemm", TrainConfig(recipe="quantile")) == LOG1P
    ablation = TrainConfig(features=tuple(get_operator("gemm").feature_names))  # the paper's feature ablations
    assert input_transform("gemm", ablation) == LOG1P


@pytest.mark.slow
def test_logo_cache_in_worker_processes_equals_the_sequential_one(tmp_path):
    """logo_cache --workers trains held-out GPUs in parallel processes; every member is seeded and single-threaded,
    so the cached predictions are the same as one process writes."""
    from pipeweave.logo_cache import cache_directory, logo_seeds, main, train_all

    frame = build_operator("gemm", synthetic_gemm(60), log=lambda *a: None)
    train, test = split(frame, "gemm", 0.2)
    train.to_csv(tmp_path / "gemm_train.csv", index=False)
    test.to_csv(tmp_path / "gemm_test.csv", index=False)
    train_all(["gemm"], tmp_path, tmp_path / "sequential", log=lambda *a: None)
    assert main(["--ops", "gemm", "--dataset_dir", str(tmp_path), "--cache", str(tmp_path / "parallel"),
                 "--workers", "2"]) == 0
    for gpu in ("NVIDIA H100", "NVIDIA A100-SXM4-80GB"):
        for seed in logo_seeds("gemm"):
            one, two = (np.load(cache_directory(tmp_path / name, "gemm", gpu) / f"seed{seed}" / "predicted.npy")
                        for name in ("sequential", "parallel"))
            assert len(one) == (frame["hardware"] == gpu).sum()
            np.testing.assert_array_equal(one, two)


def test_a_cached_logo_member_of_another_machine_is_said_when_reused(tmp_path):
    """The cache's fingerprint holds the data, recipe and float path, not the machine, and two machines train different
    models from the same setup: a member trained elsewhere is reused with a line saying so, one of this machine
    without it."""
    from pipeweave.logo_cache import _member_predictions
    from pipeweave.torch_mlp import training_machine

    directory = tmp_path / "seed42"
    (directory / "model").mkdir(parents=True)
    np.save(directory / "predicted.npy", np.ones(3))
    (directory / "logo.json").write_text(json.dumps({"fingerprint": "f", "rows": 3, "history": {"train_rows": 9}}))
    test = pd.DataFrame({"hardware": ["NVIDIA A40"] * 3})
    for machine, said in (({"cpu": "Another CPU", "torch": "0", "cpu_capability": "AVX2"}, True),
                          (training_machine(), False)):
        (directory / "model" / "metadata.json").write_text(json.dumps({"training": {"machine": machine}}))
        lines = []
        predicted, history = _member_predictions("gemm", "NVIDIA A40", 42, test, test, directory, "f", lines.append)
        np.testing.assert_array_equal(predicted, np.ones(3))
        assert history == {"train_rows": 9}
        assert any("Another CPU" in line for line in lines) == said and bool(lines) == said, lines


FLOAT_PATH_PROBE = """
import hashlib, numpy as np, torch
from pipeweave.training import TrainConfig, fit
rng = np.random.default_rng(0)
x = rng.normal(size=(600, 12)).astype(np.float32)
perf = 1.0 / (1.0 + np.exp(-x[:, 0] - 0.5 * x[:, 1]))
model, _ = fit(x, perf, TrainConfig(epochs=4, patience=4, batch_size=128, progress=False))
digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.state_dict().values())).hexdigest()
print(TrainConfig().as_dict()["mkl_cbwr"], digest)
"""


def train_on_float_path(repo_root, **environment) -> tuple[str, str]:
    """(the MKL path a training subprocess records, a digest of its weights) under ``environment``."""
    env = {key: value for key, value in os.environ.items() if key not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    result = subprocess.run([sys.executable, "-c", FLOAT_PATH_PROBE], cwd=repo_root, capture_output=True, text=True,
                            env={**env, **environment})
    assert result.returncode == 0, result.stderr
    recorded, digest = result.stdout.split()
    return recorded, digest


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="needs an AVX-512 CPU to run both the AVX2 and the AVX-512 code paths on one machine")
def test_training_gives_the_same_weights_on_the_avx2_and_avx512_code_paths(repo_root):
    """What an AVX2 and an AVX-512 machine run: the reproducible path (the default) trains one model, whichever
    vector width torch's own kernels use."""
    avx2 = train_on_float_path(repo_root, ATEN_CPU_CAPABILITY="avx2")
    avx512 = train_on_float_path(repo_root, ATEN_CPU_CAPABILITY="avx512")
    assert avx2 == avx512 and avx2[0] == "COMPATIBLE"


def intel_cpu() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and "GenuineIntel" in cpuinfo.read_text()


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512" or not intel_cpu(),
                    reason="needs an Intel AVX-512 CPU: MKL runs its AVX-512 code path on Intel CPUs only (on an AMD "
                           "EPYC, MKL_CBWR=AVX2 and AVX512 train the same weights)")
def test_mkl_left_to_choose_trains_different_models_on_avx2_and_avx512(repo_root):
    """Why the reproducible path is needed: MKL's AVX2 and AVX-512 code paths train two different models."""
    assert train_on_float_path(repo_root, MKL_CBWR="AVX2")[1] != train_on_float_path(repo_root, MKL_CBWR="AVX512")[1]


def test_training_records_its_float_path_and_keeps_the_users(repo_root):
    assert train_on_float_path(repo_root)[0] == "COMPATIBLE"
    assert train_on_float_path(repo_root, MKL_CBWR="AUTO")[0] == "AUTO"


def test_two_runs_in_one_second_get_their_own_folders(tmp_path, monkeypatch):
    """Model folders are named to the second: a second run started in the same second used to write into the
    first one's folder."""
    import datetime as real

    from pipeweave import modeling

    class Frozen(real.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 12, 4, 11, 37, 41)

    monkeypatch.setattr(modeling, "datetime", Frozen)
    first, second = modeling.timestamp_dir(tmp_path, "gemm"), modeling.timestamp_dir(tmp_path, "gemm")
    assert (first.name, second.name) == ("20261204_113741", "20261204_113741_2")
    assert first.is_dir() and second.is_dir()
    assert modeling.saved_note(second, "gemm") == f"saved {second}"  # nothing exported there: not the newest model


def test_an_interrupted_training_leaves_no_model_that_predictions_pick(tmp_path):
    """Training interrupted after the weights but before metadata.json (written last) left a folder the predictor
    took as the newest model, so every prediction failed on "metadata.json is missing"; such a folder is passed
    over, and a note says when a newly saved model is not the one predictions use."""
    import shutil

    from pipeweave.modeling import saved_note
    from pipeweave.paths import DEFAULT_MODEL_DIR

    shipped = latest_model_dir(DEFAULT_MODEL_DIR, "rmsnorm")
    complete = tmp_path / "rmsnorm" / "20260101_000000"
    shutil.copytree(shipped, complete)
    interrupted = tmp_path / "rmsnorm" / "20260102_000000"
    interrupted.mkdir()
    shutil.copy(weights_path(shipped, "rmsnorm"), weights_path(interrupted, "rmsnorm"))
    assert latest_model_dir(tmp_path, "rmsnorm") == complete
    assert (KernelPredictor(tmp_path).predict_frame("rmsnorm", pd.DataFrame(
        {"seq": [8], "dim": [4096], "hardware": ["H100"]}))["predicted_us"] > 0).all()
    later = tmp_path / "rmsnorm" / "20260103_000000"
    shutil.copytree(shipped, later)
    note = saved_note(complete, "rmsnorm")
    assert "do NOT use it" in note and later.name in note
    assert f"which predictions read only with --model_dir {tmp_path}" in saved_note(later, "rmsnorm")  # e.g. runs/


def test_the_saved_note_says_the_default_model_folder_now_serves_the_new_model(tmp_path, monkeypatch):
    import shutil

    from pipeweave import paths
    from pipeweave.modeling import saved_note

    shipped = latest_model_dir(paths.DEFAULT_MODEL_DIR, "rmsnorm")
    newest = tmp_path / "rmsnorm" / "20260103_000000"
    shutil.copytree(shipped, newest)
    monkeypatch.setattr(paths, "DEFAULT_MODEL_DIR", tmp_path)
    assert "so every prediction reading that folder now uses it" in saved_note(newest, "rmsnorm")
    # the quantile models' folder is named by --quantile_dir, whose default --quantiles reads
    assert "now uses it" not in saved_note(newest, "rmsnorm", flag="--quantile_dir")
    monkeypatch.setattr(paths, "DEFAULT_QUANTILE_DIR", tmp_path)
    assert "now uses it" in saved_note(newest, "rmsnorm", flag="--quantile_dir")


def test_the_bandwidth_fit_is_rewritten_from_the_rows_a_capped_training_drew(tmp_path):
    """python3 -m pipeweave.memory_model compared the rows left after --max_rows_per_gpu with the training file's
    count in the metadata, so a model trained with a binding cap was refused with "rebuild the dataset"."""
    from pipeweave import memory_model
    from pipeweave.modeling import network_inputs, write_model_dir

    rng = np.random.default_rng(0)
    for op in ("rmsnorm", "siluandmul"):
        raw = pd.concat([pd.DataFrame({"seq": rng.integers(1, 8192, 40), "dim": rng.choice([4096, 8192], 40),
                                       "hardware": gpu, "source": "synthetic", "dtype": "bfloat16"})
                         for gpu in ("H100", "A100")], ignore_index=True)
        raw["avg_duration"] = 2.0 + raw["seq"] * raw["dim"] * 4 / 2e6
        train = build_operator(op, raw, log=lambda *a: None)
        train.to_csv(tmp_path / f"{op}_train.csv", index=False)
        config = TrainConfig(max_rows_per_gpu=10, seed=3, progress=False)
        model = MLP_v2(network_inputs(train, op, config).shape[1]).eval()
        history = {"best_epoch": 0, "best_train_loss": 1.0, "best_val_loss": 1.0}
        write_model_dir(tmp_path / "models" / op / "20260101_000000", op, model, history, config, train, None, None,
                        {})
    directory = tmp_path / "models" / "rmsnorm" / "20260101_000000"
    fitted = json.loads((directory / "metadata.json").read_text())
    assert sum(fitted["data_info"]["train_hardware_distribution"].values()) > 2 * 10  # the cap binds
    memory_model.main(["--model_dir", str(tmp_path / "models"), "--dataset_dir", str(tmp_path)])
    assert json.loads((directory / "metadata.json").read_text())["memory_model"] == fitted["memory_model"]


@pytest.mark.parametrize("content,message", [
    ("", "not a readable CSV"),
    ("seq,dim,overall_perf\n", "no rows"),
    ("BAD\n1\n", "no column"),
])
def test_a_damaged_dataset_file_names_itself_and_the_remedy(tmp_path, content, message):
    """An empty or header-only split failed deep in training ("No columns to parse", "No objects to concatenate"),
    and a non-number in a feature column as "could not convert string to float", naming neither file nor fix."""
    from pipeweave.modeling import read_dataset

    path = tmp_path / "rmsnorm_train.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"rmsnorm_train.csv: {message}.*python3 -m dataset.build --ops rmsnorm"):
        read_dataset(path)


@pytest.mark.data
def test_a_non_number_in_a_feature_column_names_row_and_column(tmp_path):
    from pipeweave.modeling import read_dataset

    if not (DATASET_DIR / "rmsnorm_test.csv").is_file():
        pytest.skip("rmsnorm dataset not built (python3 -m dataset.build; needs the shared data)")
    frame = pd.read_csv(DATASET_DIR / "rmsnorm_test.csv").head(3)
    frame = frame.astype({"global_in_flight": object})
    frame.loc[1, "global_in_flight"] = "abc"
    path = tmp_path / "rmsnorm_test.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"row 2 \(CSV line 3\), column 'global_in_flight': 'abc' is not a finite"):
        read_dataset(path)
    assert read_dataset(DATASET_DIR / "rmsnorm_test.csv")["overall_perf"].dtype == np.float64


@pytest.mark.parametrize("column", ["shape_dim", "sm_freq"])
def test_a_non_number_in_a_descriptor_or_the_clock_names_row_and_column(tmp_path, column):
    """The check covered the docs/METHOD.md features only: a damaged shape descriptor, which the default recipe
    reads as an input, or SM clock failed in training as "could not convert string to float", naming no file."""
    from pipeweave.modeling import read_dataset

    raw = pd.DataFrame({"seq": [1, 16, 256], "dim": [4096] * 3, "hardware": "H100", "avg_duration": [2.0, 3.0, 9.0],
                        "source": "synthetic", "dtype": "bfloat16"})
    frame = build_operator("rmsnorm", raw, log=lambda *a: None).astype({column: object})
    frame.loc[1, column] = "abc"
    path = tmp_path / "rmsnorm_train.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(ValueError, match=rf"row 2 \(CSV line 3\), column '{column}': 'abc' is not a finite"):
        read_dataset(path)
    frame.drop(columns=[column]).to_csv(path, index=False)
    with pytest.raises(ValueError, match=f"no column '{column}'"):
        read_dataset(path)


@pytest.mark.data
def test_a_bad_output_dir_fails_before_training(tmp_path, repo_root):
    """train_mlp_quantile.py trained for minutes before finding that --output_dir was a file."""
    if not (DATASET_DIR / "moe_train.csv").is_file():  # the data is read before the folder is made
        pytest.skip("moe dataset not built (python3 -m dataset.build; needs the shared data)")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    result = subprocess.run([sys.executable, "train_mlp_quantile.py", "--op", "moe", "--epochs", "1", "--output_dir",
                             str(blocker), "--no_progress"], cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and f"--output_dir {blocker}: cannot hold model folders" in result.stderr
    assert "best training loss" not in result.stdout


@pytest.mark.data
def test_training_that_never_finds_a_finite_loss_is_one_error_and_leaves_no_folder(tmp_path, repo_root):
    """A learning rate that diverges kept no epoch: load_state_dict(None) raised a TypeError traceback and the run
    left an empty model folder behind."""
    if not (DATASET_DIR / "rmsnorm_train.csv").is_file():
        pytest.skip("rmsnorm dataset not built (python3 -m dataset.build; needs the shared data)")
    result = subprocess.run([sys.executable, "train_mlp.py", "--op", "rmsnorm", "--epochs", "2", "--max_rows_per_gpu",
                             "200", "--lr", "1e6", "--output_dir", str(tmp_path), "--no_progress"], cwd=repo_root,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "training kept no epoch: the validation loss was never finite over 2 epoch(s)" in result.stderr
    assert "Traceback" not in result.stderr and not any((tmp_path / "rmsnorm").iterdir())


def test_a_quantile_training_that_never_finds_a_finite_loss_leaves_no_folder(gemm_dataset, tmp_path, repo_root):
    """train_mlp_quantile.py stopped with the same error but left its empty model folder behind, and named a
    validation loss that the quantile recipe (no validation split) does not have."""
    root, _, _ = gemm_dataset
    result = subprocess.run([sys.executable, "train_mlp_quantile.py", "--op", "gemm", "--epochs", "2", "--lr", "1e36",
                             "--batch_size", "16", "--dataset_dir", str(root), "--output_dir", str(tmp_path),
                             "--no_progress"], cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "training kept no epoch: the training loss was never finite over 2 epoch(s)" in result.stderr
    assert "Traceback" not in result.stderr and not any((tmp_path / "gemm").iterdir())


@pytest.mark.data
def test_a_leave_one_gpu_out_ensemble_predicts(tmp_path, repo_root):
    """Its test split is the held-out GPU's rows, so the members' spread was not written, and every prediction
    reading the folder failed on the missing member_spread."""
    if not (DATASET_DIR / "moe_train.csv").is_file():
        pytest.skip("moe dataset not built (python3 -m dataset.build; needs the shared data)")
    result = subprocess.run([sys.executable, "train_mlp.py", "--op", "moe", "--ensemble_seeds", "1,2", "--epochs", "2",
                             "--max_rows_per_gpu", "200", "--holdout_hardware", "L40S", "--output_dir",
                             str(tmp_path), "--no_progress"], cwd=repo_root, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    shapes = "weight_type,M,E,topk,H,N,hardware\nlayer,16,128,8,4096,1536,H100\n"
    predicted = subprocess.run([sys.executable, "predict_kernels.py", "--op", "moe", "--input", "-", "--output", "-",
                                "--model_dir", str(tmp_path)], input=shapes, cwd=repo_root, capture_output=True,
                               text=True, timeout=120)
    assert predicted.returncode == 0, predicted.stderr
    assert float(predicted.stdout.splitlines()[1].split(",")[7]) > 0
