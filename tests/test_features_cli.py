"""python3 -m analytical_model features: output schema and user errors (one line, exit 2, no file)."""
from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from analytical_model.registry import ATTENTION_FEATURES, ELEMENTWISE_FEATURES, GEMM_FEATURES


def run(repo_root, *args):
    return subprocess.run([sys.executable, "-m", "analytical_model", *map(str, args)], cwd=repo_root,
                          capture_output=True, text=True)


@pytest.mark.parametrize(
    "op,rows,features",
    [
        ("gemm", {"M": [3, 4096], "N": [2560, 4096], "K": [8192, 4096], "hardware": ["A40", "NVIDIA H100"],
                  "tile_M": [64, None], "tile_N": [128, None], "tile_K": [64, None], "is_split_k": [1, None],
                  "cta_count": [60, None]}, GEMM_FEATURES),
        ("gemm_fp8", {"M": [108], "N": [8192], "K": [1024], "hardware": ["H20"]}, GEMM_FEATURES),
        ("attn", {"attention_type": ["fa2_ragged"], "bs": [1], "q_lengths": ["[8]"], "kv_lengths": ["[225]"],
                  "nh": [5], "nkv": [1], "hd": [128], "hardware": ["A40"]}, ATTENTION_FEATURES),
        ("rmsnorm", {"seq": [2], "dim": [128], "hardware": ["H20"]}, ELEMENTWISE_FEATURES),
        ("siluandmul", {"seq": [8097], "dim": [768], "hardware": ["H200"]}, ELEMENTWISE_FEATURES),
    ],
)
def test_features_command(tmp_path, repo_root, op, rows, features):
    src = tmp_path / "in.csv"
    pd.DataFrame(rows).assign(extra="kept").to_csv(src, index=False)
    dst = tmp_path / "out.csv"
    result = run(repo_root, "features", "--op", op, "--input", src, "--output", dst)
    assert result.returncode == 0, result.stderr
    out = pd.read_csv(dst)
    inputs = list(pd.read_csv(src).columns)
    assert list(out.columns) == inputs + list(features) + ["ideal_cycles"]
    assert (out[list(features)] >= 0).all().all()
    if op == "gemm":
        assert out["tensor_all_cycle"].iloc[0] == pytest.approx(31207.619, rel=1e-6)  # Appendix A.1 tiles given
    if op == "attn":
        assert out["tensor_all_ops"].iloc[0] == 8650752  # Appendix A.5


@pytest.mark.parametrize(
    "args,message",
    [
        (["features", "--op", "conv"], "invalid choice"),
        (["features", "--op", "gemm", "--input", "missing.csv"], "input file not found"),
        (["features", "--op", "gemm", "--input", "{bad_columns}"], "lacks column"),
        (["features", "--op", "gemm", "--input", "{bad_gpu}"], "unknown GPU 'V100'"),
        (["features", "--op", "gemm", "--input", "{bad_value}"], "positive integer"),
        (["features", "--op", "attn", "--input", "{bad_attn}"], "nh"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, repo_root, args, message):
    files = {
        "bad_columns": pd.DataFrame({"M": [1], "hardware": ["A100"]}),
        "bad_gpu": pd.DataFrame({"M": [1], "N": [1], "K": [1], "hardware": ["V100"]}),
        "bad_value": pd.DataFrame({"M": [0], "N": [1], "K": [1], "hardware": ["A100"]}),
        "bad_attn": pd.DataFrame({"attention_type": ["fa2_paged"], "bs": [1], "q_lengths": ["[1]"],
                                  "kv_lengths": ["[9]"], "nh": [6], "nkv": [4], "hd": [128], "hardware": ["A100"]}),
    }
    resolved = []
    for arg in args:
        if arg.startswith("{"):
            path = tmp_path / f"{arg[1:-1]}.csv"
            files[arg[1:-1]].to_csv(path, index=False)
            arg = str(path)
        resolved.append(arg)
    dst = tmp_path / "out.csv"
    if "--input" in resolved:
        resolved += ["--output", str(dst)]
    else:
        resolved += ["--input", "x.csv", "--output", str(dst)]
    result = run(repo_root, *resolved)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr
    assert not dst.exists()


def test_partial_tile_columns_are_one_error_line(tmp_path, repo_root):
    """python3 -m analytical_model features --op gemm with only tile_M wrote the tile rule's features and rewrote the
    column as 7.0, without a word."""
    src = tmp_path / "in.csv"
    pd.DataFrame({"M": [4096], "N": [8192], "K": [8192], "hardware": ["H100"], "tile_M": [128]}).to_csv(src,
                                                                                                       index=False)
    dst = tmp_path / "out.csv"
    result = run(repo_root, "features", "--op", "gemm", "--input", src, "--output", dst)
    assert result.returncode == 2 and not dst.exists()
    assert result.stderr.strip().splitlines() == [
        f"python3 -m analytical_model: error: {src}: tile column(s) tile_M without tile_N, tile_K, is_split_k, "
        f"cta_count: the tile columns override the tile rule together (give all of tile_M, tile_N, tile_K, "
        f"is_split_k, cta_count, or none)"]


def test_input_is_read_as_predict_kernels_reads_it(tmp_path, repo_root):
    """pandas took a first column without a header name as the index: a row with one field more than the header
    ("1,4096,4096,4096,H100") was computed as M=4096, N=4096, K=4096, with exit 0. Header names with spaces around
    them ("M, N, K, hardware") were refused as lacking N, K and hardware, and a column named twice was read as its
    first. The command now reads the CSV as predict_kernels.py does, and writes the input cells back as read."""
    src, dst = tmp_path / "in.csv", tmp_path / "out.csv"
    for text, message in (("M,N,K,hardware\n1,4096,4096,4096,H100\n", "row 1 (CSV line 2) has 5 fields, the header 4"),
                          ("M,N,K,hardware,M\n1,4096,4096,H100,2\n", "repeated column(s) M")):
        src.write_text(text)
        result = run(repo_root, "features", "--op", "gemm", "--input", src, "--output", dst)
        assert result.returncode == 2 and not dst.exists()
        assert result.stderr.strip().splitlines() == [f"python3 -m analytical_model: error: {src}: {message}"]
    src.write_text("M, N, K, hardware, tile_M, tile_N, tile_K, is_split_k, cta_count, note\n"
                   "3,2560,8192,A40,64,128,64,1,60,x\n16,4096,4096,H100,,,,,,\n")
    result = run(repo_root, "features", "--op", "gemm", "--input", src, "--output", dst)
    assert result.returncode == 0, result.stderr
    lines = dst.read_text().splitlines()
    assert lines[0].startswith("M,N,K,hardware,tile_M,tile_N,tile_K,is_split_k,cta_count,note,tensor_all_ops,")
    assert lines[1].startswith("3,2560,8192,A40,64,128,64,1,60,x,") and lines[2].startswith("16,4096,4096,H100,,,,,,,")
    assert pd.read_csv(dst)["ideal_cycles"].iloc[0] == pytest.approx(31207.619, rel=1e-6)  # Appendix A.1 tiles given


def test_dash_is_standard_input_and_output(tmp_path, repo_root):
    """`--output -` wrote a file named '-' in the working folder (predict_kernels.py writes standard output), and
    `--input -` was "input file not found"."""
    text = "M,N,K,hardware\n16,4096,4096,H100\n"
    result = subprocess.run([sys.executable, "-m", "analytical_model", "features", "--op", "gemm", "--input", "-",
                             "--output", "-"], cwd=tmp_path, input=text, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "-").exists() and result.stderr == "wrote 1 rows to standard output\n"
    src, dst = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_text(text)
    assert run(repo_root, "features", "--op", "gemm", "--input", src, "--output", dst).returncode == 0
    assert result.stdout == dst.read_text()


def test_an_input_with_the_feature_columns_is_refused(tmp_path, repo_root):
    """A dataset CSV or an earlier output as input wrote a second column of every feature name after the first: a
    reader (pandas) took the input's stale values under the names and renamed the new ones tensor_all_ops.1, ..."""
    src, dst = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_text("M,N,K,hardware\n16,4096,4096,H100\n")
    assert run(repo_root, "features", "--op", "gemm", "--input", src, "--output", dst).returncode == 0
    again = tmp_path / "again.csv"
    result = run(repo_root, "features", "--op", "gemm", "--input", dst, "--output", again)
    assert result.returncode == 2 and not again.exists()
    assert result.stderr.strip().splitlines() == [
        f"python3 -m analytical_model: error: {dst}: has column(s) {', '.join(GEMM_FEATURES)}, ideal_cycles, which "
        f"this command writes: give the shapes without them (a dataset CSV or an output of this command?)"]
    pd.read_csv(dst).drop(columns=[*GEMM_FEATURES, "ideal_cycles"]).assign(shape_M=7).to_csv(src, index=False)
    assert run(repo_root, "features", "--op", "gemm", "--input", src, "--output", again).returncode == 0  # passes
    result = run(repo_root, "features", "--op", "gemm", "--input", src, "--output", again, "--descriptors")
    assert result.returncode == 2 and "has column(s) shape_M, which this command writes" in result.stderr


def test_list_runs_without_pandas_and_features_says_what_it_needs(monkeypatch, capsys):
    """`python3 -m analytical_model list` failed with a pandas traceback on the base install (no pandas), though it
    only prints the registry; `features` now says it needs pandas and how to install it, in one line."""
    from analytical_model.__main__ import main
    from pipeweave.cli import UserError

    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    assert main(["list", "--keys"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["gemm", "gemm_fp8"]
    with pytest.raises(UserError, match=r"needs pandas \(pip install '\.\[train\]'\)"):
        main(["features", "--op", "gemm", "--input", "in.csv", "--output", "out.csv"])
