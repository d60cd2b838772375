"""dataset.sources: raw measurement frames from PipeWeave, Vidur, aiconfigurator-core and dataset/measured."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dataset import aiconfigurator
from dataset.sources import (COLLECTIVE_COLUMNS, COLUMNS, INT_COLUMNS, OPS, SHAPE_COLUMNS, aiconfigurator_data_dir,
                             load_aiconfigurator, load_collectives, load_measured, load_measurements, load_vidur)
from pipeweave.paths import existing_shared_data_dir, shared_data_dir


def _quiet(_message: str) -> None:
    pass


def _check_schema(op: str, frame: pd.DataFrame) -> None:
    assert list(frame.columns) == COLUMNS[op]
    for c in INT_COLUMNS[op]:
        assert frame[c].dtype == np.int64, (op, c, frame[c].dtype)
        assert (frame[c] > 0).all(), (op, c)
    assert frame["avg_duration"].dtype == np.float64
    for c in COLUMNS[op]:
        if c not in INT_COLUMNS[op] and c != "avg_duration":
            assert pd.api.types.is_string_dtype(frame[c]), (op, c, frame[c].dtype)
    assert not frame.isna().any().any(), op
    assert np.isfinite(frame["avg_duration"]).all() and (frame["avg_duration"] > 0).all()
    assert not frame.duplicated([*SHAPE_COLUMNS[op], "hardware", "dtype", "source"]).any(), op
    order = frame.sort_values(["hardware", "source", *SHAPE_COLUMNS[op], "dtype"], kind="mergesort")
    assert (order.index == frame.index).all(), f"{op} frame is not sorted deterministically"


# ------------------------------------------------------------------------------------------------
# no data needed
# ------------------------------------------------------------------------------------------------

def test_shared_data_dir_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEWEAVE_SHARED_DATA", str(tmp_path))
    assert shared_data_dir() == existing_shared_data_dir() == tmp_path
    monkeypatch.setenv("PIPEWEAVE_SHARED_DATA", str(tmp_path / "absent"))
    assert shared_data_dir() == tmp_path / "absent" and existing_shared_data_dir() is None


def test_measured_folder_absent_or_empty(tmp_path):
    assert load_measured(tmp_path / "absent", log=_quiet) == {}
    (tmp_path / "H100").mkdir()
    assert load_measured(tmp_path, log=_quiet) == {}


def _write(path: Path, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)


def test_measured_reader(tmp_path):
    base = tmp_path / "measured"
    _write(base / "H100" / "gemm.csv", pd.DataFrame({
        "op": ["gemm", "gemm", "gemm", "gemm", "gemm", "gemm_fp8", "conv"],
        "M": [4096, 4096, 1, 8, 16, 128, 1], "N": [4096, 4096, 4096, 4096, 4096, 256, 1],
        "K": [4096, 4096, 4096, 4096, 0, 512, 1],
        "hardware": ["NVIDIA H100 80GB HBM3"] * 7,
        "avg_duration": [160.0, 170.0, 10.0, 0.0, 5.0, 7.0, 1.0],
        "median_us": [1.0] * 7, "kernel": ["cublas"] * 7, "repeats": [20] * 7,
        "dtype": ["bf16", "bf16", None, "bfloat16", "bfloat16", "float8_e4m3fn", "bfloat16"],
    }))
    _write(base / "H100" / "attn.csv", pd.DataFrame({
        "op": ["attn", "attn", "attention", "attn"],
        "attention_type": ["fa3_ragged", "fa2_paged", "fa2_paged", "fa2_paged"],
        "bs": [2, 2, 1, 1], "q_lengths": ["[3, 4]", "[1,1]", "[1]", "[1]"],
        "kv_lengths": ["[3, 4]", "[5]", "[9]", "[9]"], "nh": [32, 32, 32, 30], "nkv": [8, 8, 8, 8], "hd": [128] * 4,
        "hardware": ["NVIDIA H100"] * 4, "avg_duration": [12.5, 3.0, 4.0, 4.0],
    }))
    _write(base / "H100" / "broken.csv", pd.DataFrame({"op": ["gemm"], "M": [1], "N": [1], "K": [1]}))
    _write(base / "A100" / "norm.csv", pd.DataFrame({
        "op": ["rmsnorm", "siluandmul", "rmsnorm"], "seq": [16, 16, 32], "dim": [4096, 28672, 4096],
        "hardware": ["NVIDIA A100-SXM4-80GB"] * 3, "avg_duration": [3.0, 9.0, np.nan]}))
    messages: list[str] = []
    out = load_measured(base, log=messages.append)
    assert set(out) == {"gemm", "gemm_fp8", "attn", "rmsnorm", "siluandmul"}
    for op, frame in out.items():
        _check_schema(op, frame)
    gemm = out["gemm"]
    assert len(gemm) == 2  # repeated 4096^3 averaged, zero latency and K=0 dropped
    big = gemm[gemm["M"] == 4096].iloc[0]
    assert big["avg_duration"] == pytest.approx(165.0)
    assert big["dtype"] == "bfloat16" and big["source"].endswith("H100/gemm.csv")
    assert gemm[gemm["M"] == 1].iloc[0]["dtype"] == "bfloat16"  # missing dtype -> op default
    assert out["gemm_fp8"].iloc[0]["dtype"] == "fp8"
    attn = out["attn"]
    assert len(attn) == 2  # wrong list length and nh % nkv != 0 dropped, "attention" alias accepted
    assert set(attn["q_lengths"]) == {"[3,4]", "[1]"} and set(attn["kv_lengths"]) == {"[3,4]", "[9]"}
    assert len(out["rmsnorm"]) == 1 and out["siluandmul"].iloc[0]["dim"] == 28672
    text = "\n".join(messages)
    assert "unknown op ['conv']" in text and "lacks required columns" in text
    assert "nh % nkv != 0" in text and "zero, negative or non-finite latency" in text


def test_a_shape_measured_again_with_another_timing_takes_the_later_timing_only(tmp_path):
    base = tmp_path / "measured"
    _write(base / "H100" / "gemm.csv", pd.DataFrame({
        "op": ["gemm"] * 5, "M": [16, 16, 16, 32, None], "N": [4096] * 5, "K": [4096] * 5,
        "hardware": ["NVIDIA H100"] * 5, "avg_duration": [30.0, 20.0, 22.0, 25.0, 9.0],
        "timing": ["flush", "rotate", "rotate", None, "rotate"]}))
    messages: list[str] = []
    gemm = load_measured(base, log=messages.append)["gemm"].sort_values("M")
    assert gemm["avg_duration"].tolist() == pytest.approx([21.0, 25.0])  # the rotate repeats averaged; M=32 kept
    assert "1 missing value" in "\n".join(messages)  # the row without M is dropped with a line, not unsaid
    # the flush row of M=16 was measured again; the row without a timing (M=32) was written before the column
    assert [m.split("] ")[1][:15] for m in messages if "--timing flush" in m] == ["1 gemm rows tim"]


def test_flush_timed_rows_are_kept_and_said(tmp_path):
    base = tmp_path / "measured"
    gemm = {"op": ["gemm"] * 2, "M": [16, 32], "N": [4096] * 2, "K": [4096] * 2, "hardware": ["NVIDIA H100"] * 2,
            "avg_duration": [30.0, 25.0]}
    _write(base / "H100" / "old.csv", pd.DataFrame(gemm))  # before the timing column: flush
    _write(base / "H100" / "new.csv", pd.DataFrame({**gemm, "timing": ["flush", "rotate"]}))
    messages: list[str] = []
    assert len(load_measured(base, log=messages.append)["gemm"]) == 4
    said = [m for m in messages if "--timing flush" in m]
    assert len(said) == 2 and "H100/old.csv] 2 gemm rows" in said[1] and "H100/new.csv] 1 gemm rows" in said[0]
    assert all("--timing rotate" in m for m in said)


def test_load_measurements_without_shared_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEWEAVE_SHARED_DATA", str(tmp_path / "absent"))
    monkeypatch.setattr(aiconfigurator, "aiconfigurator_data_dir", lambda: None)
    _write(tmp_path / "measured" / "L40" / "x.csv", pd.DataFrame({
        "op": ["rmsnorm"], "seq": [8], "dim": [5120], "hardware": ["NVIDIA L40"], "avg_duration": [2.5],
        "dtype": ["bfloat16"]}))
    out = load_measurements(log=_quiet, measured_dir=tmp_path / "measured")
    assert set(out) == set(OPS)
    for op, frame in out.items():
        assert list(frame.columns) == COLUMNS[op]
    assert len(out["rmsnorm"]) == 1 and all(len(out[op]) == 0 for op in OPS if op != "rmsnorm")
    assert set(load_measurements(ops=["gemm"], log=_quiet, measured_dir=tmp_path / "none")) == {"gemm"}
    with pytest.raises(ValueError, match="unknown operator"):
        load_measurements(ops=["conv"], log=_quiet)


# ------------------------------------------------------------------------------------------------
# real data
# ------------------------------------------------------------------------------------------------

def _need_data():
    if existing_shared_data_dir() is None:
        pytest.skip("shared measurement data not found (set PIPEWEAVE_SHARED_DATA to the shared/data folder)")
    if aiconfigurator_data_dir() is None:
        pytest.skip("aiconfigurator-core (0.12.0) is not installed")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    _need_data()
    return load_measurements(log=_quiet, measured_dir=tmp_path_factory.mktemp("no_measured"))


@pytest.fixture(scope="module")
def collectives():
    _need_data()
    return load_collectives(log=_quiet)


def _resolve(name: str) -> str:
    from analytical_model.hardware import load_hardware
    return load_hardware(name).stem


def test_measured_rows_of_another_kernel_are_left_out(tmp_path):
    """Eager SiLU*Mul (two kernels) and SDPA decode on a contiguous cache time other kernels than vLLM's: the
    builder leaves them out, with a line saying why (pipeweave.profiler.csvio.unmodelled_kernel)."""
    base = tmp_path / "measured"
    _write(base / "H200" / "siluandmul.csv", pd.DataFrame({
        "op": ["siluandmul"] * 3, "seq": [16, 32, 64], "dim": [28672] * 3, "hardware": ["NVIDIA H200"] * 3,
        "avg_duration": [9.0, 11.0, 15.0],
        "kernel": ["flashinfer silu_and_mul [fused]: act_and_mul_kernel", "torch silu(gate)*up [eager, 2 kernels]",
                   "torch silu(gate)*up [eager, 2 kernels]"]}))
    _write(base / "H200" / "attn.csv", pd.DataFrame({
        "op": ["attn"] * 2, "attention_type": ["fa2_ragged", "fa2_paged"], "bs": [1, 1], "q_lengths": ["[64]", "[1]"],
        "kv_lengths": ["[64]", "[4096]"], "nh": [32, 32], "nkv": [8, 8], "hd": [128, 128],
        "hardware": ["NVIDIA H200"] * 2, "avg_duration": [12.0, 20.0],
        "kernel": ["torch.sdpa(flash backend)", "torch.sdpa(flash backend)"]}))
    messages: list[str] = []
    out = load_measured(base, log=messages.append)
    assert out["siluandmul"]["seq"].tolist() == [16]
    assert out["attn"]["attention_type"].tolist() == ["fa2_ragged"]  # SDPA prefill is FA2's kernel: kept
    text = "\n".join(messages)
    assert "2 siluandmul rows ran as several eager torch kernels" in text
    assert "1 attn rows decode ran torch SDPA on a contiguous KV cache" in text


def test_all_ops_schema_and_hardware(measured):
    frames = measured
    assert set(frames) == set(OPS)
    for op, frame in frames.items():
        assert len(frame) > 1000, op
        _check_schema(op, frame)
        for name in frame["hardware"].unique():
            _resolve(name)  # every device string maps to a hardware JSON


@pytest.mark.data
def test_deterministic(measured):
    frames = measured
    again = load_measurements(ops=["attn", "moe", "rmsnorm"], log=_quiet, measured_dir=Path("/nonexistent"))
    for op, frame in again.items():
        pd.testing.assert_frame_equal(frame, frames[op])


@pytest.mark.data
def test_gemm_units(measured):
    gemm = measured["gemm"]
    cube = gemm[(gemm["M"] == 4096) & (gemm["N"] == 4096) & (gemm["K"] == 4096)]
    by_source = {(r.hardware, r.source.split()[0]): r.avg_duration for r in cube.itertuples()}
    assert by_source[("NVIDIA H100 80GB HBM3", "aiconfigurator-core")] == pytest.approx(166, rel=0.02)
    assert by_source[("NVIDIA A100-SXM4-80GB", "aiconfigurator-core")] == pytest.approx(539, rel=0.02)
    assert by_source[("NVIDIA H200", "aiconfigurator-core")] == pytest.approx(168, rel=0.02)
    # Vidur Llama-2-7B TP1 attn_post_proj at 4096 tokens: 0.193 / 0.195 ms (two repeated rows, averaged)
    vidur = cube[cube["source"].str.endswith("h100/meta-llama/Llama-2-7b-hf/mlp.csv")]
    assert vidur["avg_duration"].iloc[0] == pytest.approx(194, rel=0.01)
    assert set(gemm.loc[gemm["source"].str.startswith("vidur"), "dtype"]) == {"float16"}
    assert set(gemm.loc[gemm["source"].str.startswith("aiconfigurator"), "dtype"]) == {"bfloat16"}


@pytest.mark.data
def test_gemm_fp8(measured):
    fp8 = measured["gemm_fp8"]
    assert set(fp8["dtype"]) == {"fp8"}
    pw = fp8[fp8["source"].str.startswith("pipeweave")]
    assert len(pw) == 16818 + 8410
    row = pw[(pw["M"] == 108) & (pw["N"] == 8192) & (pw["K"] == 1024) & (pw["hardware"] == "NVIDIA H20")]
    assert row["avg_duration"].iloc[0] == pytest.approx(13.6596)
    aic = fp8[fp8["source"].str.startswith("aiconfigurator")]
    big = aic[(aic["M"] == 32768) & (aic["N"] == 8192) & (aic["K"] == 8192) & (aic["hardware"] == "NVIDIA H200")]
    tflops = 2 * 32768 * 8192 * 8192 / (big["avg_duration"].iloc[0] * 1e-6) / 1e12
    assert 900 < tflops < 1979  # below the FP8 dense peak


@pytest.mark.data
def test_attention_mapping(measured):
    attn = measured["attn"]
    types = attn.groupby("hardware")["attention_type"].unique().map(set).to_dict()
    assert types["NVIDIA A100-SXM4-80GB"] == {"fa2_ragged", "fa2_paged"}
    assert types["NVIDIA H100 80GB HBM3"] == {"fa3_ragged", "fa2_paged"}
    assert types["NVIDIA H200"] == {"fa3_ragged", "fa2_paged"}
    assert types["NVIDIA L40S"] == {"fa2_ragged", "fa2_paged"}
    assert "NVIDIA B200" not in types
    assert (attn["nh"] % attn["nkv"] == 0).all() and set(attn["dtype"]) == {"bfloat16"}
    first = attn["q_lengths"].str.extract(r"^\[(\d+)", expand=False).astype(int)
    count = attn["q_lengths"].str.count(",") + 1
    assert (count == attn["bs"]).all() and (attn["kv_lengths"].str.count(",") + 1 == attn["bs"]).all()
    assert not attn["q_lengths"].str.contains(" ").any()
    ragged = attn["attention_type"].str.endswith("ragged")
    assert (attn.loc[ragged, "q_lengths"] == attn.loc[ragged, "kv_lengths"]).all()  # prefill: kv = q (step 0)
    assert (first[~ragged] == 1).all()  # decode: one new token


@pytest.mark.data
def test_decode_kv_length_is_isl_plus_step(measured):
    attn = measured["attn"]
    h100 = attn[(attn["hardware"] == "NVIDIA H100 80GB HBM3") & (attn["attention_type"] == "fa2_paged")]
    kv = h100["kv_lengths"].str.extract(r"^\[(\d+)", expand=False).astype(int)
    assert set(kv) == {2 ** j for j in range(1, 18)}  # isl 1 + step 2^j - 1
    # KV-cache streaming rate at long contexts approaches but stays below the 3.35 TB/s HBM3 peak
    bytes_read = h100["bs"] * kv * h100["nkv"] * h100["hd"] * 2 * 2
    rate = bytes_read / (h100["avg_duration"] * 1e-6) / 1e12
    assert 2.5 < rate.max() < 3.4


@pytest.mark.data
def test_vidur_layers(measured):
    frames = measured
    for op in ("rmsnorm", "siluandmul"):
        assert not frames[op]["source"].str.contains("phi-2").any()
        assert set(frames[op]["dtype"]) == {"float16"}
    silu = frames["siluandmul"]
    llama = silu[silu["source"].str.endswith("a100/meta-llama/Llama-2-7b-hf/mlp.csv")]
    assert set(llama["dim"]) == {2 * 11008 // tp for tp in (1, 2, 4, 8)}
    norm = frames["rmsnorm"]
    assert set(norm.loc[norm["source"].str.contains("Llama-2-70b"), "dim"]) == {8192}
    gemm = frames["gemm"]
    qkv = gemm[gemm["source"].str.endswith("h100/meta-llama/Llama-2-70b-hf/mlp.csv") & (gemm["K"] == 8192)]
    assert {(64 + 2 * 8) * 128 // tp for tp in (1, 2, 4, 8)} <= set(qkv["N"])


@pytest.mark.data
def test_moe(measured):
    moe = measured["moe"]
    assert set(moe["weight_type"]) == {"layer"}
    assert set(moe["hardware"]) == {"NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA L40S"}
    mixtral = moe[(moe["hardware"] == "NVIDIA H100 80GB HBM3") & (moe["E"] == 8) & (moe["topk"] == 2)
                  & (moe["H"] == 4096)]
    assert {14336 // tp for tp in (1, 2, 4, 8)} <= set(mixtral["N"])
    wide = load_aiconfigurator(ops=["moe"], log=_quiet, systems=["a100_sxm"],
                               moe_distributions=("power_law_1.01",))
    assert len(wide["moe"]) > 0 and set(wide["moe"]["hardware"]) == {"NVIDIA A100-SXM4-80GB"}


@pytest.mark.data
def test_vidur_only_requested_ops():
    _need_data()
    out = load_vidur(ops=["rmsnorm"], log=_quiet)
    assert set(out) == {"rmsnorm"}


@pytest.mark.data
def test_collectives(collectives):
    df = collectives
    assert list(df.columns) == COLLECTIVE_COLUMNS
    assert not df.isna().any().any()
    for c in ("num_workers", "devices_per_node", "size_bytes"):
        assert df[c].dtype == np.int64
    assert (df["time_ms"] > 0).all() and (df["devices_per_node"] >= df["num_workers"]).all()
    assert set(df["collective"]) == {"all_reduce", "send_recv", "custom_all_reduce", "all_gather"}
    assert not df["source"].str.contains("pairwise_nvlink/all_reduce|h100_pairwise|a100_pairwise").any()
    for name in df["hardware"].unique():
        _resolve(name)
    pw = df[df["source"].str.endswith("dataset/collective/A100/all_reduce.csv") & (df["num_workers"] == 8)]
    assert pw.loc[pw["size_bytes"].idxmax(), "time_ms"] == pytest.approx(8.2, rel=0.05)  # ~1 GiB
    aic = df[df["source"].str.contains("h100_sxm/comm/nccl") & (df["num_workers"] == 8)]
    for collective, ms in (("all_reduce", 2.11), ("all_gather", 1.40)):  # 512 MiB: the gathered output's size
        rows = aic[aic["collective"] == collective]
        biggest = rows.loc[rows["size_bytes"].idxmax()]
        assert biggest["size_bytes"] == 268435456 * 2 and biggest["time_ms"] == pytest.approx(ms, rel=0.03)
    assert not df.duplicated(["collective", "hardware", "num_workers", "devices_per_node", "size_bytes",
                              "source"]).any()
    pd.testing.assert_frame_equal(df, load_collectives(log=_quiet))


@pytest.mark.data
def test_collectives_multinode_kept_on_request():
    _need_data()
    df = load_collectives(log=_quiet, intra_node_only=False, include_custom_allreduce=False)
    assert (df["devices_per_node"] < df["num_workers"]).any()
    assert "custom_all_reduce" not in set(df["collective"])


def test_builds_refuse_a_shared_folder_without_its_sources(tmp_path, monkeypatch):
    """PIPEWEAVE_SHARED_DATA naming an existing but unrelated folder let the dataset build finish without A40's and
    H20's rows (and train_collective_rf.py save 9 of 17 models); both now stop before reading anything."""
    from pipeweave.cli import UserError
    from pipeweave.paths import require_shared_data

    monkeypatch.setenv("PIPEWEAVE_SHARED_DATA", str(tmp_path))
    with pytest.raises(UserError, match="was found but lacks pipeweave/ and vidur/"):
        require_shared_data("python3 -m dataset.build")
    (tmp_path / "pipeweave").mkdir()
    with pytest.raises(UserError, match="was found but lacks vidur/;"):
        require_shared_data("train_collective_rf.py")
    (tmp_path / "vidur").mkdir()
    assert require_shared_data("python3 -m dataset.build") == tmp_path
    monkeypatch.setenv("PIPEWEAVE_SHARED_DATA", str(tmp_path / "absent"))
    with pytest.raises(UserError, match="not found at"):
        require_shared_data("python3 -m dataset.build")
