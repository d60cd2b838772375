"""Issue 9: hostile and careless inputs get one ``error:`` line and exit 2 (or a correct answer), never a silent
wrong answer, a traceback or a destroyed file. Entry points are called in-process through ``run_cli`` (the same
path as the scripts) to stay fast; a few checks that need a real process (signals, program name) use one."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import train_mlp
import train_mlp_quantile
import workload_generator
from analytical_model.__main__ import main as features_main
from benchmarks.aggregator import write_untrained_models
from pipeweave import aggregate, compare, kernels
from pipeweave.cli import run_cli, write_atomically
from pipeweave.engine import Engine, Job
from pipeweave.flatten import load_workload

from workload_copies import first_iterations

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "workload"
TP1 = WORKLOADS / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json"
TP1_FA3 = WORKLOADS / "Qwen2.5-14B_arxiv_8_fa3_tp1_pp1.json"
TP2 = WORKLOADS / "Qwen3-32B_arxiv_12_fa2_tp2_pp1.json"



def cli(main, *args, capsys) -> tuple[int, str, str]:
    code = run_cli(main, [str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(code: int, err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and ": error: " in lines[0], err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def small(path: Path, tmp_path: Path, iterations: int = 3, edit=None, name: str | None = None) -> Path:
    return first_iterations(path, tmp_path, iterations, edit, name)


# ---------------------------------------------------------------------------------------------------
# 1. silent wrong answers
# ---------------------------------------------------------------------------------------------------

def test_optimistic_prediction_is_never_slower_on_any_gpu(tmp_path):
    """The shipped quantile models: per kernel, the optimistic duration never exceeds the point prediction."""
    engine = Engine(quantile_dir=REPO / "mlp_models_quantile", log=None)
    workload = load_workload(small(TP1, tmp_path, 4))
    jobs = [Job(workload, engine.gpu(stem)) for stem in engine.registry.known()]
    for prediction in engine.predict(jobs):
        summary = prediction.result["summary"]
        for key in ("prefill_duration_ms", "decode_avg_duration_ms", "total_duration_ms"):
            assert summary[f"optimistic_{key}"] <= summary[key], (prediction.job.hardware.stem, key)


def test_quantile_bound_below_point_model_is_replaced(models, tmp_path):
    """A quantile model predicting a LOWER efficiency than the point model cannot make a kernel slower."""
    low = write_untrained_models(tmp_path / "q", ops=("gemm",), efficiency={"gemm": 1e-3}, quantile=True)
    engine = Engine(model_dir=models, quantile_dir=low, log=None)
    result = engine.predict([Job(load_workload(small(TP1, tmp_path)), engine.gpu("A100"))])[0].result
    summary = result["summary"]
    # the untrained test models' training data covers nothing, so every kernel is extrapolated and its optimistic
    # efficiency is the point one widened (pipeweave.engine.EXTRAPOLATION_WIDENING): faster, never slower
    assert result["extrapolation"]["share"] == 1.0
    assert summary["optimistic_total_duration_ms"] < summary["total_duration_ms"]


@pytest.mark.parametrize("edit,fragment", [
    (lambda d: d["iterations"][0]["operators"]["gemm"][0].update(M=10 ** 18), "M = 1000000000000000000 exceeds"),
    (lambda d: d["iterations"][0]["operators"]["rmsnorm"].update(seq=2 ** 62, dim=2 ** 62), "seq = "),
    (lambda d: d["iterations"][0]["operators"]["attention"].update(q_lengths=[10 ** 9] * 8,
                                                                   kv_lengths=[10 ** 9] * 8), "above the limit"),
    (lambda d: d["iterations"][1]["operators"]["rmsnorm"].update(count=0), "count must be a positive integer"),
    (lambda d: d["iterations"][1]["operators"]["gemm"][0].update(count=10 ** 30), "count = "),
    (lambda d: d["iterations"][1].update(operators={}), "iteration 2: has no operators"),
    (lambda d: d["iterations"][0]["operators"]["attention"].update(hd=1), "hd = 1 is not a head size"),
    (lambda d: d.update(tp_size=10 ** 6), "tp_size = 1000000 exceeds"),
])
def test_out_of_range_workload_is_an_error(edit, fragment, models, tmp_path, capsys):
    path = small(TP1, tmp_path, edit=edit)
    out = tmp_path / "pred.json"
    code, _, err = cli(aggregate.main, "--workload", path, "--hardware", "A100", "--model_dir", models,
                       "--output", out, capsys=capsys)
    assert_one_error_line(code, err, fragment)
    assert not out.exists()


def test_zero_byte_all_reduce_is_an_error(models, tmp_path, capsys):
    def zero(d):
        d["iterations"][0]["operators"]["communication"][0]["volume_bytes"] = 0
    code, _, err = cli(aggregate.main, "--workload", small(TP2, tmp_path, edit=zero), "--hardware", "H100",
                       "--model_dir", models, "--output", tmp_path / "p.json", capsys=capsys)
    assert_one_error_line(code, err, "volume_bytes must be a positive integer")


def hardware_dir_with(tmp_path: Path, **fields) -> Path:
    directory = tmp_path / "hw"
    directory.mkdir(exist_ok=True)
    data = json.loads((REPO / "hardware" / "A100.json").read_text())
    data.update(fields)
    (directory / "A100.json").write_text(json.dumps(data))  # json writes NaN / Infinity bare, as a user might
    return directory


@pytest.mark.parametrize("fields,fragment", [
    ({"memBandwidth": float("nan")}, "'memBandwidth' must be a positive number"),
    ({"tcBf16": float("inf")}, "'tcBf16' must be a positive number"),
    ({"smFreq": 1e300}, "'smFreq' = 1e+300 is outside the plausible range"),
    ({"l2CacheBandwidth": 1e-9}, "'l2CacheBandwidth' = 1e-09 is outside the plausible range"),
    ({"numSms": 10 ** 9}, "'numSms' = 1000000000 is outside"),
])
def test_implausible_hardware_json_is_an_error(fields, fragment, models, tmp_path, capsys):
    code, _, err = cli(aggregate.main, "--workload", small(TP1, tmp_path), "--hardware", "A100",
                       "--hardware_dir", hardware_dir_with(tmp_path, **fields), "--model_dir", models,
                       "--output", tmp_path / "p.json", capsys=capsys)
    assert_one_error_line(code, err, fragment)


def test_output_json_is_valid_and_finite(models, tmp_path, capsys):
    out = tmp_path / "p.json"
    code, stdout, err = cli(aggregate.main, "--workload", small(TP1, tmp_path), "--hardware", "A100",
                            "--model_dir", models, "--output", out, capsys=capsys)
    assert code == 0, err
    text = out.read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-finite {c} in the output"))
    assert "Predicted: Qwen2ForCausalLM, 8 requests of 2648-3866 prompt tokens, 3 output tokens, TP1 PP1 on " \
           "NVIDIA A100" in stdout


class _Stop(Exception):
    pass


@pytest.mark.parametrize("flags,root", [(("--holdout_hardware", "H100"), "runs"), ((), "mlp_models"),
                                         (("--holdout_hardware", "H100", "--output_dir", "mlp_models"), "mlp_models")])
def test_holdout_models_go_to_runs_unless_promoted(flags, root, monkeypatch):
    """train_mlp.py --holdout_hardware writes under runs/ (never read by the predictor, which loads the newest model
    of mlp_models/); writing it into mlp_models/ takes an explicit --output_dir."""
    roots = []

    def stop(directory, op):
        roots.append(Path(directory))
        raise _Stop
    monkeypatch.setattr(train_mlp, "load_splits", lambda *args: (None, None))
    monkeypatch.setattr(train_mlp, "train_and_evaluate", lambda *args: (None, None, None, None))
    monkeypatch.setattr(train_mlp, "timestamp_dir", stop)
    with pytest.raises(_Stop):
        train_mlp.main(["--op", "gemm", *flags])
    assert roots[0].name == root


@pytest.mark.parametrize("script,flag", [(train_mlp, "--epochs"), (train_mlp, "--threads"),
                                         (train_mlp, "--batch_size"), (train_mlp_quantile, "--epochs"),
                                         (train_mlp_quantile, "--threads"), (train_mlp_quantile, "--batch_size")])
def test_training_counts_of_zero_are_errors(script, flag, capsys):
    code, _, err = cli(script.main, "--op", "gemm", flag, "0", capsys=capsys)
    least = 2 if flag == "--batch_size" else 1  # a one-row batch is skipped (BatchNorm): nothing would be trained
    assert_one_error_line(code, err, f"argument {flag}: must be at least {least}, got 0")
    if least == 2:
        code, _, err = cli(script.main, "--op", "gemm", flag, "1", capsys=capsys)
        assert_one_error_line(code, err, f"argument {flag}: must be at least 2, got 1")


def test_training_flags_without_meaning_are_errors(capsys):
    code, _, err = cli(train_mlp_quantile.main, "--op", "gemm", "--threshold", "nan", capsys=capsys)
    assert_one_error_line(code, err, "argument --threshold: must be a finite number, got nan")
    code, _, err = cli(train_mlp.main, "--op", "quantize", capsys=capsys)  # predicted by RMSNorm's model
    assert_one_error_line(code, err, "argument --op: invalid choice: 'quantize'")


@pytest.mark.data
def test_holding_out_every_gpu_is_an_error(built_datasets, tmp_path, capsys):
    flags = [arg for gpu in ("A100", "A40", "H100") for arg in ("--holdout_hardware", gpu)]
    code, _, err = cli(train_mlp.main, "--op", "rmsnorm", *flags, "--output_dir", tmp_path, capsys=capsys)
    assert_one_error_line(code, err, "holds out every GPU with rmsnorm training rows")
    assert not list(tmp_path.iterdir())


def prediction_dir(tmp_path: Path, total) -> Path:
    directory = tmp_path / "pred"
    directory.mkdir()
    summary = {"prefill_duration_ms": 1.0, "decode_avg_duration_ms": 1.0, "total_duration_ms": total}
    (directory / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_A100.json").write_text(json.dumps({"summary": summary}))
    return directory


def test_compare_missing_pred_dir_fails_without_writing(tmp_path, capsys):
    out, plot = tmp_path / "c.csv", tmp_path / "c.png"
    out.write_text("committed\n")
    code, _, err = cli(compare.main_static, "--pred_dir", tmp_path / "nonexistent", "--output", out, "--plot", plot,
                       capsys=capsys)
    assert_one_error_line(code, err, "--pred_dir", "not a directory")
    assert out.read_text() == "committed\n" and not plot.exists()


def test_compare_nan_total_is_an_error(tmp_path, capsys):
    code, _, err = cli(compare.main_static, "--pred_dir", prediction_dir(tmp_path, float("nan")),
                       "--output", tmp_path / "c.csv", "--plot", tmp_path / "c.png", capsys=capsys)
    assert_one_error_line(code, err, "summary.total_duration_ms is nan")
    assert not (tmp_path / "c.csv").exists()


def test_compare_checks_every_output_before_writing(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = cli(compare.main_static, "--pred_dir", prediction_dir(tmp_path, 5.0), "--output",
                       tmp_path / "c.csv", "--plot", tmp_path / "c.png", "--markdown", blocker / "E2E.md",
                       capsys=capsys)
    assert_one_error_line(code, err, "--markdown", "is not a directory")
    assert not (tmp_path / "c.csv").exists() and not (tmp_path / "c.png").exists()


def test_pairs_with_header_only_is_an_error(models, tmp_path, capsys):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("workload,hardware\n")
    code, _, err = cli(aggregate.main, "--pairs", pairs, "--model_dir", models, "--output", tmp_path / "o",
                       capsys=capsys)
    assert_one_error_line(code, err, "no pairs after the header")


def test_pairs_errors_name_the_line_of_the_file(models, tmp_path, capsys):
    """Comments and blank lines count: the unknown GPU is on line 5 of the file, the short row on line 4."""
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(f"workload,hardware\n# A100 first\n{TP1},A100\n\n{TP1},Z9\n")
    code, _, err = cli(aggregate.main, "--pairs", pairs, "--model_dir", models, "--output", tmp_path / "o",
                       capsys=capsys)
    assert_one_error_line(code, err, f"--pairs {pairs}: line 5: unknown GPU 'Z9'; known GPUs")
    pairs.write_text(f"workload,hardware\n# A100 first\n\n{TP1}\n")
    code, _, err = cli(aggregate.main, "--pairs", pairs, "--model_dir", models, "--output", tmp_path / "o",
                       capsys=capsys)
    assert_one_error_line(code, err, f"--pairs {pairs}: line 4 needs 2 fields, got 1")
    pairs.write_text(f'workload,hardware\n# a "quote" in a comment\n"{TP1}","H\n100"\n{TP1},Z9\n')
    code, _, err = cli(aggregate.main, "--pairs", pairs, "--model_dir", models, "--output", tmp_path / "o",
                       capsys=capsys)
    assert_one_error_line(code, err, f"--pairs {pairs}: line 4: a field spans lines")
    pairs.write_text("workload,hardware\n\nno_such_workload,H100\n")
    code, _, err = cli(aggregate.main, "--pairs", pairs, "--model_dir", models, "--output", tmp_path / "o",
                       capsys=capsys)
    assert_one_error_line(code, err, f"--pairs {pairs}: line 3: workload file not found: no_such_workload")


def test_generator_never_writes_what_the_aggregator_rejects(tmp_path, capsys):
    config = json.loads((REPO / "config" / "Qwen2.5-14B.json").read_text())
    config.update(num_attention_heads=40, num_key_value_heads=7)
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(config))
    code, _, err = cli(workload_generator.main, "--model_config", path, "--requests", "2", "--prompt_tokens", "64",
                       "--output_tokens", "3", "--output_dir", tmp_path / "out", capsys=capsys)
    assert_one_error_line(code, err, "num_attention_heads (40) must be a multiple of num_key_value_heads (7)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags,fragment", [
    (("--requests", "4", "--prompt_tokens", "1000", "--output_tokens", "100000000"), "output_tokens = 100000000"),
    (("--requests", "4", "--prompt_tokens", "1000000000", "--output_tokens", "3"), "above the limit 1,048,576"),
    (("--requests", "4", "--prompt_tokens", "100"), "missing --output_tokens"),
    (("--trace", "arxiv_8", "--prefill_attn", "fa3_ragged", "--hardware", "A100"), "FlashAttention-3 runs only"),
    (("--trace", "arxiv_8", "--decode_attn", "fa3_paged", "--hardware", "A100"),  # was written without a word
     "--decode_attn fa3_paged: FlashAttention-3 runs only on Hopper GPUs, and A100 is ampere"),
    (("--trace", "arxiv_8", "--pp", "49"), "pp = 49 exceeds the model's 48 layers"),
    (("--trace", "arxiv_8", "--dtype", "fp8", "--hardware", "A100"), "A100 has no FP8 tensor-core rate"),
])
def test_generator_rejects_implausible_or_mismatched_requests(flags, fragment, tmp_path, capsys):
    code, _, err = cli(workload_generator.main, "--model_config", "Qwen2.5-14B", *flags,
                       "--output_dir", tmp_path, capsys=capsys)
    assert_one_error_line(code, err, fragment)
    assert not list(tmp_path.iterdir())


def test_generator_requests_flags_and_attention_per_architecture(models, tmp_path, capsys):
    code, out, err = cli(workload_generator.main, "--model_config", "Qwen2.5-14B", "--requests", "3",
                         "--prompt_tokens", "500", "--output_tokens", "4", "--hardware", "L40S",
                         "--output_dir", tmp_path, capsys=capsys)
    assert code == 0, err
    path = Path(out.strip())
    assert path.name == "Qwen2.5-14B_r3_p500_o4_fa2_tp1_pp1.json"
    data = json.loads(path.read_text())
    assert len(data["iterations"]) == 4
    assert data["iterations"][0]["operators"]["attention"]["q_lengths"] == [500, 500, 500]
    code, out, err = cli(workload_generator.main, "--model_config", "Qwen2.5-14B", "--requests", "1",
                         "--prompt_tokens", "8", "--output_tokens", "2", "--hardware", "H100",
                         "--output_dir", tmp_path, capsys=capsys)
    assert code == 0 and "_fa3_" in out


def test_fa3_workload_on_pre_hopper_gpu_warns(models, tmp_path, capsys):
    code, out, err = cli(aggregate.main, "--workload", small(TP1_FA3, tmp_path), "--hardware", "A100",
                         "--model_dir", models, "--output", tmp_path / "p.json", capsys=capsys)
    assert code == 0, err
    assert "WARNING" in out and "FlashAttention-3, Hopper only" in out and "A100 is ampere" in out
    code, out, _ = cli(aggregate.main, "--workload", small(TP1_FA3, tmp_path), "--hardware", "H100",
                       "--model_dir", models, "--output", tmp_path / "p.json", capsys=capsys)
    assert code == 0 and "FlashAttention-3" not in out  # (the untrained test models' intervals warn, rightly)


def test_the_fa3_warning_names_the_fa2_kernel_of_each_layout():
    """A decode-only FA3 workload (--decode_attn fa3_paged) on A100 was told to regenerate with --prefill_attn
    fa2_ragged, which changes nothing of its decode."""
    from analytical_model.hardware import load_hardware
    from pipeweave.validation import fa3_warning

    a100 = load_hardware("A100")
    decode = fa3_warning("w", ["fa2_ragged", "fa3_paged"], a100)
    assert "fa2_paged instead of fa3_paged" in decode and "fa2_ragged instead" not in decode
    both = fa3_warning("w", ["fa3_ragged", "fa3_paged"], a100)
    assert "fa2_paged instead of fa3_paged" in both and "fa2_ragged instead of fa3_ragged" in both
    assert fa3_warning("w", ["fa3_paged"], load_hardware("H100")) is None


# ---------------------------------------------------------------------------------------------------
# 2. tracebacks -> one line
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rows,fragment", [
    ("1024,1024,abc,H100", "row 1 (CSV line 2): column K must be a positive integer, got 'abc'"),
    ("1024,1024,1024,", "row 1 (CSV line 2): the hardware cell is empty"),
    ("99999999999999999999999,1024,1024,H100", "exceeds the limit 1,048,576"),
    ("-5,1024,1024,H100", "column M must be a positive integer, got '-5'"),
])
@pytest.mark.parametrize("entry", ["features", "kernels"])
def test_bad_shape_csv_is_one_line(rows, fragment, entry, models, tmp_path, capsys):
    source = tmp_path / "in.csv"
    source.write_text(f"M,N,K,hardware\n{rows}\n")
    out = tmp_path / "out.csv"
    if entry == "features":
        code, _, err = cli(features_main, "features", "--op", "gemm", "--input", source, "--output", out, capsys=capsys)
    else:
        code, _, err = cli(kernels.main, "--op", "gemm", "--input", source, "--output", out, "--model_dir", models,
                           capsys=capsys)
    assert_one_error_line(code, err, str(source), fragment)
    assert "np.int64" not in err and not out.exists()


@pytest.mark.parametrize("op, text, fragment", [
    # a user audit (2026-12-05): an unclosed quote swallowed the rows after it (exit 0, "Predicted 1 kernels")
    ("gemm", 'M,N,K,hardware,note\n16,4096,4096,H100,"open\n32,4096,4096,H100,x\n',
     "line 2: a quoted cell runs over several lines (an unclosed quote?)"),
    # errors raised after the rows were grouped by GPU named another row, or none
    ("gemm", "M,N,K,tile_M,tile_N,tile_K,is_split_k,hardware\n16,4096,4096,,,,,H100\n16,4096,4096,,,,,A100\n"
             "16,4096,4096,64,64,64,maybe,H100\n",
     "is_split_k' must be 0/1 or true/false; row 3 (CSV line 4) has 'maybe'"),
    ("siluandmul", "seq,dim,hardware\n4,128,H100\n4,128,A100\n4,4,H100\n", "row 3 (CSV line 4): dim = 4 is below 8"),
    ("attn", "attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd,hardware\nfa2_ragged,1,[4],[4],8,8,128,H100\n"
             "fa2_ragged,1,[4],[4],8,8,128,A100\nfoo,1,[4],[4],8,8,128,H100\n",
     "row 3 (CSV line 4): unknown attention_type 'foo'"),
    ("attn", "attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd,hardware\nfa2_ragged,1,[4],[4],8,8,128,H100\n"
             ",1,[4],[4],8,8,128,H100\n", "row 2 (CSV line 3): the attention_type cell is empty"),
])
def test_shape_errors_name_their_row(op, text, fragment, models, tmp_path, capsys):
    source, out = tmp_path / "in.csv", tmp_path / "out.csv"
    source.write_text(text)
    code, _, err = cli(kernels.main, "--op", op, "--input", source, "--output", out, "--model_dir", models,
                       capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert not out.exists()


def test_header_names_with_spaces_and_an_output_among_the_specs(models, tmp_path, capsys):
    """"M, N, K, hardware" was refused as lacking N, K and hardware; a JSON written into --hardware_dir broke every
    later command that reads the folder."""
    import shutil

    source = tmp_path / "in.csv"
    source.write_text("M, N, K, hardware\n16, 4096, 4096, H100\n")
    code, _, err = cli(kernels.main, "--op", "gemm", "--input", source, "--output", tmp_path / "out.csv",
                       "--model_dir", models, capsys=capsys)
    assert code == 0, err
    assert (tmp_path / "out.csv").read_text().startswith("M,N,K,hardware,predicted_us,")  # names written stripped
    # attention's warnings look its type column up by name too (they failed after writing the output)
    attention = tmp_path / "attention.csv"
    attention.write_text("bs, attention_type, q_lengths, kv_lengths, nh, nkv, hd, hardware\n"
                         "1, fa2_paged, [1], [1024], 32, 8, 128, H100\n")
    code, _, err = cli(kernels.main, "--op", "attn", "--input", attention, "--output", tmp_path / "attention_out.csv",
                       "--model_dir", models, capsys=capsys)
    assert code == 0, err
    specs = tmp_path / "specs"
    specs.mkdir()
    from analytical_model.hardware import DEFAULT_HARDWARE_DIR

    shutil.copy(DEFAULT_HARDWARE_DIR / "H100.json", specs)
    code, _, err = cli(kernels.main, "--op", "gemm", "--input", source, "--output", specs / "pred.json",
                       "--model_dir", models, "--hardware_dir", specs, capsys=capsys)
    assert code == 2 and "holds the GPU spec JSONs" in err and not (specs / "pred.json").exists()


@pytest.mark.parametrize("damage", ["truncate", "empty", "metadata"])
def test_damaged_model_file_is_one_line(damage, models, tmp_path, capsys):
    import shutil
    copy = tmp_path / "models"
    shutil.copytree(models, copy)
    directory = next((copy / "gemm").iterdir())
    target = directory / ("metadata.json" if damage == "metadata" else "gemm_mlp_weights.npz")
    target.write_bytes(target.read_bytes()[:50] if damage == "truncate" else b"")
    code, _, err = cli(aggregate.main, "--workload", small(TP1, tmp_path), "--hardware", "A100", "--model_dir", copy,
                       "--output", tmp_path / "p.json", capsys=capsys)
    assert_one_error_line(code, err, "the newest gemm model cannot be loaded", "train_mlp.py --op gemm")


def test_device_without_hardware_and_deep_json(models, tmp_path, capsys):
    code, _, err = cli(aggregate.main, "--workload", small(TP1, tmp_path), "--hardware", "A100", "--device", "tpu",
                       "--model_dir", models, "--output", tmp_path / "p.json", capsys=capsys)
    assert_one_error_line(code, err, "--device tpu")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000)
    code, _, err = cli(aggregate.main, "--workload", deep, "--hardware", "A100", "--model_dir", models,
                       "--output", tmp_path / "p.json", capsys=capsys)
    assert_one_error_line(code, err, str(deep))


@pytest.mark.parametrize("kind", ["parent_is_file", "directory"])
def test_bad_output_path_is_one_line(kind, models, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "p.json" if kind == "parent_is_file" else tmp_path
    if kind == "directory":  # a directory output for one pair receives <workload>_<GPU>.json: fine, not an error
        code, _, err = cli(aggregate.main, "--workload", small(TP1, tmp_path), "--hardware", "A100",
                           "--model_dir", models, "--output", out, capsys=capsys)
        assert code == 0, err
        return
    code, _, err = cli(aggregate.main, "--workload", small(TP1, tmp_path), "--hardware", "A100", "--model_dir",
                       models, "--output", out, capsys=capsys)
    assert_one_error_line(code, err, "is not a directory")


# ---------------------------------------------------------------------------------------------------
# 3. files
# ---------------------------------------------------------------------------------------------------

def test_atomic_write_respects_umask_and_symlinks(tmp_path):
    old = os.umask(0o022)
    try:
        plain = tmp_path / "plain.txt"
        write_atomically(plain, lambda tmp: tmp.write_text("a"))
        assert stat.S_IMODE(plain.stat().st_mode) == 0o644
        real = tmp_path / "real.txt"
        real.write_text("old")
        link = tmp_path / "link.txt"
        link.symlink_to(real)
        write_atomically(link, lambda tmp: tmp.write_text("new"))
        assert link.is_symlink() and real.read_text() == "new"
    finally:
        os.umask(old)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_special_file_is_written_directly():
    write_atomically("/dev/null", lambda path: Path(path).write_text("discarded"))
    assert Path("/dev/null").is_char_device()


def test_sigterm_removes_temporary_files(tmp_path):
    script = (f"import time\nfrom pipeweave.cli import run_cli, write_atomically\n"
              f"def main(argv):\n    write_atomically({str(tmp_path / 'out.txt')!r}, lambda tmp: (tmp.write_text('x'), "
              f"time.sleep(120)))\nraise SystemExit(run_cli(main))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while time.time() < deadline and not list(tmp_path.glob(".out.txt.*")):
        time.sleep(0.05)
    assert list(tmp_path.glob(".out.txt.*")), "the temporary file never appeared: nothing to clean up"
    proc.send_signal(signal.SIGTERM)
    try:  # generous under a loaded suite (one fresh-clone run timed out at 20 s); an ignored signal still fails
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 128 + signal.SIGTERM and "interrupted (SIGTERM)" in err
    assert list(tmp_path.iterdir()) == []


def test_sweep_writes_what_it_can_and_names_the_rest(models, tmp_path, capsys):
    out = tmp_path / "sweep"
    code, stdout, err = cli(aggregate.main, "--workload", small(TP2, tmp_path), "--hardware", "H100,L20",
                            "--collective_estimate", "model", "--model_dir", models, "--output", out, capsys=capsys)
    assert code == 2
    assert sorted(p.name for p in out.iterdir()) == [f"{TP2.stem}_H100.json"]
    assert f"not predicted: {TP2.stem} on L20: " in err and "GPUs with measured models for all_reduce with 2" in err
    assert err.strip().splitlines()[-1].endswith("1 of 2 pairs could not be predicted (listed above); the other 1 "
                                                 "were written")


def test_program_name_of_a_module():
    proc = subprocess.run([sys.executable, "-m", "analytical_model", "features", "--op", "gemm", "--input",
                           "/nonexistent.csv", "--output", "/tmp/x.csv"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("python3 -m analytical_model: error: ")
    # a module of a package by its dotted name (it said "report.py", a file the user never typed)
    proc = subprocess.run([sys.executable, "-m", "pipeweave.serving.report", "--bogus"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == "python3 -m pipeweave.serving.report: error: unrecognized arguments: --bogus\n"


@pytest.mark.parametrize("command, argv, usage", [
    ("features", ["--help"], "usage: pipeweave-features [-h] {features,list}"),
    ("compare", ["static", "--help"], "usage: pipeweave-compare static [-h]"),
    ("compare", ["summarize-real", "--help"], "usage: pipeweave-compare summarize-real [-h]"),
])
def test_console_scripts_name_themselves(monkeypatch, capsys, command, argv, usage):
    """An installed user's help said `python3 -m analytical_model` and `python3 -m pipeweave.compare` (a user audit,
    2026-12-05); the scripts compare_pred_real.py and compare_vllm_pred_real.py keep their own names."""
    from pipeweave import commands

    monkeypatch.setattr(sys, "argv", [f"/usr/bin/pipeweave-{command}", *argv])
    with pytest.raises(SystemExit):
        getattr(commands, command)()
    assert capsys.readouterr().out.startswith(usage)
    proc = subprocess.run([sys.executable, "compare_pred_real.py", "--summarize_real", "--help"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.stdout.startswith("usage: compare_pred_real.py --summarize_real [-h]")


def test_a_missing_data_root_names_the_variable_that_chose_it():
    proc = subprocess.run([sys.executable, "aggregator.py", "--workload", "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1",
                           "--hardware", "H100"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PIPEWEAVE_DATA_ROOT": "/nonexistent"})
    assert proc.returncode == 2
    assert proc.stderr.endswith("hardware directory not found: /nonexistent/hardware (PIPEWEAVE_DATA_ROOT is "
                                "/nonexistent)\n")


# ---------------------------------------------------------------------------------------------------
# 4. friction
# ---------------------------------------------------------------------------------------------------

def test_readme_leave_one_gpu_out_gemm_range_matches_accuracy_doc():
    """The README quotes the GEMM leave-one-GPU-out range of docs/ACCURACY.md."""
    text = (REPO / "docs" / "ACCURACY.md").read_text()
    table = text.split("## gemm\n", 1)[1].split("\n## ", 1)[0]
    logo = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[0].startswith("NVIDIA"):
            logo[cells[0]] = float(cells[4].split("/")[0])
    readme = " ".join((REPO / "README.md").read_text().split())
    assert len(logo) >= 2
    assert f"GEMM {min(logo.values())} % (" in readme
    assert f"to {max(logo.values())} % (" in readme


def test_prefill_only_workload_says_there_is_no_decode(models, tmp_path, capsys):
    code, out, err = cli(aggregate.main, "--workload", small(TP1, tmp_path, 1), "--hardware", "A100",
                         "--model_dir", models, "--output", tmp_path / "p.json", capsys=capsys)
    assert code == 0, err
    assert "no decode iteration" in out and "1 output tokens" in out


def test_interrupted_sweep_says_it_is_incomplete(models, tmp_path, capsys, monkeypatch):
    calls = []

    def interrupted(path, write):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        write_atomically(path, write)
    monkeypatch.setattr(aggregate, "write_atomically", interrupted)
    code, _, err = cli(aggregate.main, "--workload", small(TP1, tmp_path), "--hardware", "A100,H100",
                       "--model_dir", models, "--output", tmp_path / "sweep", capsys=capsys)
    assert code == 130
    assert "wrote 1 of 2 predictions; the sweep is incomplete" in err and "interrupted" in err


def test_non_finite_duration_is_an_error_not_an_output():
    from pipeweave.cli import UserError
    from pipeweave.validation import check_durations

    keys = [("A100", (1, 2, 3)), ("H100", (4, 5, 6))]
    check_durations("gemm", keys, np.array([1.0, 2.0]))
    for bad in (np.nan, np.inf, 0.0):
        with pytest.raises(UserError, match=r"gemm \(4, 5, 6\) on H100: the predicted duration is"):
            check_durations("gemm", keys, np.array([1.0, bad]))


def test_unreadable_input_and_read_only_folder_are_one_line(tmp_path, capsys, monkeypatch):
    """Permission problems (simulated: the tests may run as root, for whom every file is readable)."""
    from pipeweave.cli import UserError, check_output_path

    def unreadable(argv):
        raise PermissionError(13, "Permission denied", str(tmp_path / "w.json"))
    code, _, err = cli(unreadable, capsys=capsys)
    assert_one_error_line(code, err, "w.json: Permission denied")
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(UserError, match="is not writable"):
        check_output_path(tmp_path / "out.json")


@pytest.mark.parametrize("content,fragment", [
    ("", "not a readable CSV (EmptyDataError"),
    ("tp_abc", "row 1 (CSV line 2): column tp has 'abc', expected a positive integer"),
])
def test_bad_measured_runs_csv_is_one_line(content, fragment, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    if content == "tp_abc":
        lines = (REPO / "e2e" / "real" / "measured_runs.csv").read_text().splitlines()[:2]
        cells = lines[1].split(",")
        cells[1] = "abc"
        content = "\n".join([lines[0], ",".join(cells)]) + "\n"
    (real / "measured_runs.csv").write_text(content)
    code, _, err = cli(compare.main_static, "--real_dir", real, "--pred_dir", prediction_dir(tmp_path, 5.0),
                       "--output", tmp_path / "c.csv", "--plot", tmp_path / "c.png", capsys=capsys)
    assert_one_error_line(code, err, "measured_runs.csv", fragment)
    assert not (tmp_path / "c.csv").exists()


def test_training_device_without_that_device_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: --device cuda is valid here")
    for device, fragment in (("cuda", "no CUDA device is visible"), ("tpu", "unknown device")):
        code, _, err = cli(train_mlp.main, "--op", "gemm", "--device", device, capsys=capsys)
        assert_one_error_line(code, err, f"--device {device}", fragment)


def test_binary_pairs_file_is_one_line(models, tmp_path, capsys):
    pairs = tmp_path / "pairs.csv"
    pairs.write_bytes(b"\xff\xfe\x00binary")
    code, _, err = cli(aggregate.main, "--pairs", pairs, "--model_dir", models, "--output", tmp_path / "o",
                       capsys=capsys)
    assert_one_error_line(code, err, str(pairs), "not UTF-8 text")


def test_a_file_open_cannot_find_is_named_not_its_errno(tmp_path, capsys):
    """FileNotFoundError raised by open() carries the errno as args[0]: the error line names the file instead."""
    def reads_a_missing_file(argv):
        (tmp_path / "missing.csv").read_text()

    assert run_cli(reads_a_missing_file, []) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'missing.csv'}: No such file or directory" in err and "error: 2" not in err


@pytest.mark.parametrize("module", ["pipeweave.accuracy", "pipeweave.logo_cache", "pipeweave.interval_eval"])
def test_unknown_operator_class_lists_the_known_ones(module, capsys):
    import importlib

    assert run_cli(importlib.import_module(module).main, ["--ops", "gemm,nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown operator class 'nope'; known: gemm, gemm_fp8, attn, rmsnorm, siluandmul, moe" in err


def test_predict_kernels_refuses_a_column_given_twice_and_its_own_output(tmp_path, capsys):
    """A header M,N,K,M predicted with the second M without a word, and an output fed back in gained a second set
    of prediction columns."""
    twice = tmp_path / "twice.csv"
    twice.write_text("M,N,K,M,hardware\n5,4096,4096,6,H100\n")
    code, _, err = cli(kernels.main, "--op", "gemm", "--input", twice, "--output", tmp_path / "o.csv", capsys=capsys)
    assert_one_error_line(code, err, "repeated column(s) M")
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,hardware\n5,4096,4096,H100\n")
    code, _, err = cli(kernels.main, "--op", "gemm", "--input", shapes, "--output", tmp_path / "o.csv", capsys=capsys)
    assert code == 0, err
    code, _, err = cli(kernels.main, "--op", "gemm", "--input", tmp_path / "o.csv", "--output", tmp_path / "o2.csv",
                       capsys=capsys)
    assert_one_error_line(code, err, "predicted_us", "which predict_kernels.py writes")


def test_predict_kernels_writes_to_standard_output_with_dash(tmp_path, capsys):
    """--output - wrote a file named '-' (and /dev/stdout fails on a pipe): it is standard output, the tool's own
    lines going to standard error."""
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K,hardware\n16,4096,4096,H100\n")
    code, out, err = cli(kernels.main, "--op", "gemm", "--input", shapes, "--output", "-", capsys=capsys)
    assert code == 0 and out.splitlines()[0].startswith("M,N,K,hardware,predicted_us") and len(out.splitlines()) == 2
    assert "Predicted 1 gemm kernels -> standard output" in err and not Path("-").exists()
