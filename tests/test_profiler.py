"""Operator profiler: grids, resume, CSV schema, hardware-JSON skeleton and CLI, all on the CPU.

The one test that needs a GPU is marked ``cuda`` and skipped (reason "no CUDA GPU") elsewhere.
"""
from __future__ import annotations

from functools import partial

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeweave.cli import UserError

import profile_operators
from analytical_model.hardware import hardware_registry, parse_hardware
from pipeweave.cli import program_name, run_cli
from pipeweave.profiler import csvio, grids
from pipeweave.profiler.device import (NO_CUDA_MESSAGE, DeviceInfo, capability_refusal, gpu_dir_name, measured_dir,
                                      hardware_skeleton, no_cuda_message, sanitize)
from pipeweave.profiler.launch import Prepared, Unsupported, kernel_label, short_kernel_name
from pipeweave.profiler.session import measure_grid
from pipeweave.profiler.timing import FakeTimer, summarize

REPO = Path(__file__).resolve().parent.parent

# docs/METHOD.md §2 values of the paper's three models.
PAPER_CONFIGS = {
    "Qwen2.5-14B": {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "intermediate_size": 13824, "vocab_size": 152064,
                    "num_hidden_layers": 48},
    "Qwen3-32B": {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 5120, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600, "vocab_size": 151936,
                  "num_hidden_layers": 64},
    "Llama-3.1-70B": {"architectures": ["LlamaForCausalLM"], "hidden_size": 8192, "num_attention_heads": 64,
                      "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
                      "num_hidden_layers": 80},
}


@pytest.fixture
def config_dir(tmp_path):
    folder = tmp_path / "config"
    folder.mkdir()
    for stem, data in PAPER_CONFIGS.items():
        (folder / f"{stem}.json").write_text(json.dumps(data))
    return folder


@pytest.fixture
def models(config_dir):
    return grids.load_models(grids.DEFAULT_CONFIGS, config_dir)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# ----------------------------------------------------------------------------------------------
# Grids


def test_grids_read_configs_with_the_workload_loader(models):
    by_stem = {m.stem: m for m in models}
    assert by_stem["Qwen3-32B"].head_dim == 128  # explicit head_dim, not 5120 / 64
    assert by_stem["Llama-3.1-70B"].num_key_value_heads == 8


def test_missing_config_names_the_available_ones(config_dir):
    with pytest.raises(UserError, match=r"unknown model config 'Nope-7B' \(known: .*Llama-3.1-70B"):
        grids.load_models(["Nope-7B"], config_dir)


def test_quick_grid_sizes(models):
    grid = grids.build_grid(models, grids.DEFAULT_TP, quick=True, num_gpus=1)
    assert grid.sizes() == {"gemm": 239, "gemm_fp8": 239, "attn": 240, "rmsnorm": 240, "siluandmul": 240,
                            "all_reduce": 0}
    # what keeps --quick within minutes on one GPU: at most 0.25 s of timed kernels per row (its --max_row_seconds)
    assert grid.total <= 1200
    assert any("all_reduce needs at least 2 visible GPUs" in n for n in grid.notes)
    eight = grids.build_grid(models, grids.DEFAULT_TP, quick=True, num_gpus=8)
    assert len(eight.rows["all_reduce"]) == 3 * 10
    assert {r["num_workers"] for r in eight.rows["all_reduce"]} == {2, 4, 8}


def test_full_grid_is_larger_and_unique(models):
    quick = grids.build_grid(models, quick=True, num_gpus=1)
    full = grids.build_grid(models, quick=False, num_gpus=1)
    for op in ("gemm", "attn", "rmsnorm", "siluandmul"):
        assert len(full.rows[op]) > (1 if op in grids.QUICK_DRAWN_OPS else 3) * len(quick.rows[op])
        keys = [tuple(r[c] for c in grids.SHAPE_COLUMNS[op]) for r in full.rows[op]]
        assert len(keys) == len(set(keys))
    # the quick shapes are a subset of the full grid, so a full run after a quick one resumes
    for op in ("gemm", "attn", "rmsnorm", "siluandmul"):
        full_keys = {tuple(r[c] for c in grids.SHAPE_COLUMNS[op]) for r in full.rows[op]}
        assert all(tuple(r[c] for c in grids.SHAPE_COLUMNS[op]) in full_keys for r in quick.rows[op])


def test_quick_attention_rows_are_enough_for_the_fine_tuning_choice(models):
    """The workloads' four batches per head layout, then a seeded draw from the full grid up to QUICK_DRAWN_ROWS:
    enough attention kernels for calibrate.py's held-out-fifth choice, the same on every call."""
    from pipeweave.finetune import MIN_SELECTION_KERNELS

    rows = grids.build_grid(models, quick=True, ops=["attn"]).rows["attn"]
    assert len(rows) == grids.QUICK_DRAWN_ROWS >= MIN_SELECTION_KERNELS
    assert rows == grids.build_grid(models, quick=True, ops=["attn"]).rows["attn"]
    heads = {(r["nh"], r["nkv"], r["hd"]) for r in rows}
    workload = [(r["attention_type"], r["bs"], r["kv_lengths"]) for r in rows[:4 * len(heads)]]
    assert ("fa2_ragged", 4, "[4096,4096,4096,4096]") in workload
    assert ("fa2_paged", 64, grids.list_text([4096] * 64)) in workload
    drawn = rows[4 * len(heads):]
    assert {r["attention_type"] for r in drawn} == {"fa2_ragged", "fa2_paged"}
    assert len({r["kv_lengths"] for r in drawn}) > 50  # drawn over the grid, not a few batches
    one = grids.build_grid(models[:1], [8], quick=True, ops=["attn"]).rows["attn"]
    full = grids.build_grid(models[:1], [8], quick=False, ops=["attn"]).rows["attn"]
    assert len(one) == len(full) < grids.QUICK_DRAWN_ROWS  # a small grid is measured whole
    norms = grids.build_grid(models, quick=True, ops=["rmsnorm"]).rows["rmsnorm"]
    assert norms[:10] == grids.rmsnorm_grid(models, grids.QUICK_TOKENS, sweep=False)  # the workloads' rows first
    assert len({r["dim"] for r in norms}) > 10  # then the sweep's widths


def test_llm_shapes_are_divided_by_tp(models):
    for model in models:
        for tp in (1, 2, 4, 8):
            shapes = {name: (M, N, K) for name, M, N, K in grids.llm_gemms(model, tp, 64)}
            hd, nh, nkv = model.head_dim, model.num_attention_heads, model.num_key_value_heads
            assert shapes["qkv_proj"][1] * tp == (nh + 2 * nkv) * hd
            assert shapes["o_proj"][2] * tp == nh * hd
            assert shapes["gate_up_proj"][1] * tp == 2 * model.intermediate_size
            assert shapes["down_proj"][2] * tp == model.intermediate_size
            assert shapes["lm_head"][1:] == (model.vocab_size, model.hidden_size)
            assert grids.siluandmul_dim(model, tp) * tp == 2 * model.intermediate_size


def test_expected_llm_shapes_present(models):
    grid = grids.build_grid(models, quick=True, num_gpus=1)
    gemm = {(r["M"], r["N"], r["K"]) for r in grid.rows["gemm"]}
    for t in grids.QUICK_TOKENS:
        # Llama-3.1-70B at TP 4 (docs/METHOD.md A.15): qkv, o, gate_up, down
        assert (t, 2560, 8192) in gemm
        assert (t, 8192, 2048) in gemm
        assert (t, 14336, 8192) in gemm
        assert (t, 8192, 7168) in gemm
    assert (16, 128256, 8192) in gemm          # lm_head, M = batch
    assert (8192, 128256, 8192) not in gemm    # ... never M = prefill tokens
    silu = {(r["seq"], r["dim"]) for r in grid.rows["siluandmul"]}
    assert (1024, 14336) in silu               # input width 2·I/TP for Llama TP 4
    assert {(r["seq"], r["dim"]) for r in grid.rows["rmsnorm"]} >= {(1, 5120), (8192, 8192)}
    heads = {(r["nh"], r["nkv"], r["hd"]) for r in grid.rows["attn"]}
    assert heads == {(40, 8, 128), (20, 4, 128), (10, 2, 128), (5, 1, 128),
                     (64, 8, 128), (32, 4, 128), (16, 2, 128), (8, 1, 128)}
    full = grids.build_grid(models, quick=False, num_gpus=8)
    assert (35152, 2560, 8192) in {(r["M"], r["N"], r["K"]) for r in full.rows["gemm"]}  # arxiv_16 prefill
    assert {"size_bytes": 575930368, "num_workers": 4} in full.rows["all_reduce"]       # A.15 all-reduce


def test_attention_rows_are_well_formed(models):
    traces = {"t": ([100, 3000, 20], 5)}
    grid = grids.build_grid(models, quick=False, num_gpus=1, traces=traces)
    rows = grid.rows["attn"]
    assert {r["attention_type"] for r in rows} == {"fa2_ragged", "fa2_paged"}
    for r in rows:
        q = json.loads(r["q_lengths"])
        kv = json.loads(r["kv_lengths"])
        assert " " not in r["q_lengths"] and len(q) == len(kv) == r["bs"]
        assert all(1 <= a <= b for a, b in zip(q, kv))
        if r["attention_type"].endswith("paged"):
            assert set(q) == {1}
            assert sum(kv) <= grids.ATTN_DECODE_MAX_KV
        else:
            assert q == kv and sum(q) <= grids.ATTN_PREFILL_MAX_TOKENS
    # the trace's batches: prefill, and decode after 1, 2 and 4 steps (output_tokens 5)
    kvs = {(r["attention_type"], r["kv_lengths"]) for r in rows if r["nh"] == 16}
    assert ("fa2_ragged", "[100,3000,20]") in kvs
    assert {("fa2_paged", "[101,3001,21]"), ("fa2_paged", "[102,3002,22]"), ("fa2_paged", "[104,3004,24]")} <= kvs
    fa3 = grids.build_grid(models, quick=True, ops=["attn"], prefill_attention_type="fa3_ragged")
    assert {r["attention_type"] for r in fa3.rows["attn"]} == {"fa3_ragged", "fa2_paged"}


def test_fp8_grid_and_caps(models):
    grid = grids.build_grid(models, quick=False, num_gpus=1)
    assert all(r["K"] % 16 == 0 and r["N"] % 16 == 0 for r in grid.rows["gemm_fp8"])
    assert all(2 * (r["M"] * r["K"] + r["N"] * r["K"] + r["M"] * r["N"]) <= grids.GEMM_MAX_BYTES
               for r in grid.rows["gemm"])
    assert all(r["seq"] * r["dim"] <= grids.ELEMENTWISE_MAX_ELEMENTS for r in grid.rows["siluandmul"])


def test_tp_that_does_not_divide_is_left_out(models):
    grid = grids.build_grid(models, [3], quick=True, ops=["gemm"])
    assert grid.rows["gemm"] == []
    assert any("Qwen2.5-14B TP 3" in n for n in grid.notes)
    with pytest.raises(ValueError, match="unknown operator"):
        grids.build_grid(models, quick=True, ops=["conv"])


def test_log_space():
    assert grids.log_space(1, 16, 1) == [1, 2, 4, 8, 16]
    values = grids.log_space(256, 32768, 2, multiple=64)
    assert values[0] == 256 and values[-1] == 32768 and all(v % 64 == 0 for v in values)
    assert values == sorted(set(values))


# ----------------------------------------------------------------------------------------------
# Measurement loop with a fake timer: resume, schema


def _fake_prepare(calls: list | None = None):
    def prepare(op, row):
        if calls is not None:
            calls.append((op, dict(row)))
        dtype = "float8_e4m3fn" if op == "gemm_fp8" else "bfloat16"
        return Prepared(fn=lambda: None, backend=f"fake-{op}", dtype=dtype)
    return prepare


FAKE_DEVICE = DeviceInfo(name="NVIDIA Fake GPU", versions={"torch_version": "2.x", "cuda_version": "12.4"},
                         clocks=lambda: (1980, 2619))


def _run(rows, out_dir, timer, prepare=None, **kwargs):
    return measure_grid(rows, out_dir=out_dir, device=FAKE_DEVICE, prepare=prepare or _fake_prepare(), timer=timer,
                        repeats=4, warmup=1, progress=False, log=lambda msg: None, **kwargs)


def _small_rows(models):
    grid = grids.build_grid(models, [4], quick=True, ops=["gemm", "attn", "rmsnorm"], num_gpus=1)
    return {op: rows[:6] for op, rows in grid.rows.items()}


def test_second_run_measures_nothing_new(models, tmp_path):
    rows = _small_rows(models)
    first = FakeTimer()
    summary = _run(rows, tmp_path, first)
    assert summary.measured == 18 and first.calls == 18
    second = FakeTimer()
    again = _run(rows, tmp_path, second)
    assert second.calls == 0 and again.measured == 0
    assert all(s.already_done == 6 for s in again.ops.values())
    for op in rows:
        with (tmp_path / f"{op}.csv").open() as handle:
            assert len(list(csv.DictReader(handle))) == 6


def test_interrupted_file_resumes(models, tmp_path):
    rows = _small_rows(models)
    calls = []

    def interrupt_on_fourth(op, row):
        if len(calls) == 3:
            raise KeyboardInterrupt
        return _fake_prepare(calls)(op, row)

    with pytest.raises(KeyboardInterrupt):
        _run(rows, tmp_path, FakeTimer(), prepare=interrupt_on_fourth)
    path = tmp_path / "gemm.csv"
    assert len(path.read_text().splitlines()) == 1 + 3  # header + the rows finished before the interrupt
    with path.open("a") as handle:  # a row cut off mid-write
        handle.write("gemm,1,2560,81")
    timer = FakeTimer()
    summary = _run(rows, tmp_path, timer)
    assert summary.ops["gemm"].already_done == 3 and summary.ops["gemm"].measured == 3
    assert timer.calls == 3 + 6 + 6
    lines = path.read_text().splitlines()
    assert len(lines) == 7 and all(len(next(csv.reader([line]))) == len(csvio.columns_for("gemm")) for line in lines)
    keys = [tuple(line.split(",")[:4]) for line in lines[1:]]
    assert len(set(keys)) == 6


def test_deadline_stops_before_new_rows(models, tmp_path):
    rows = _small_rows(models)
    timer = FakeTimer()
    summary = _run(rows, tmp_path, timer, deadline=time.monotonic() - 1)
    assert summary.stopped_early and timer.calls == 0
    assert sum(s.left for s in summary.ops.values()) == 18


def test_unsupported_and_failed_rows_are_not_written(models, tmp_path):
    rows = {"gemm": [{"M": 1, "N": 128, "K": 128}, {"M": 2, "N": 128, "K": 128}, {"M": 3, "N": 128, "K": 128}]}
    cleaned = []

    def prepare(op, row):
        if row["M"] == 1:
            raise Unsupported("not on this backend")
        if row["M"] == 2:
            raise RuntimeError("CUDA out of memory\nmore details")
        return _fake_prepare()(op, row)

    summary = _run(rows, tmp_path, FakeTimer(), prepare=prepare, after_error=lambda: cleaned.append(1))
    s = summary.ops["gemm"]
    assert (s.measured, s.unsupported, s.failed) == (1, 1, 1) and cleaned == [1]
    assert len((tmp_path / "gemm.csv").read_text().splitlines()) == 2


def _stand_in_prepare(modelled: bool):
    """SiLU*Mul and decode attention as a run without (``modelled`` False) or with FlashInfer and flash-attn runs
    them: the labels the runners give."""
    def prepare(op, row):
        if op == "siluandmul":
            backend = "flashinfer silu_and_mul" if modelled else "torch silu(gate)*up"
            return Prepared(fn=lambda: None, backend=backend, dtype="bfloat16", elementwise=True, fused=modelled)
        backend = "flash_attn.flash_attn_with_kvcache(FA2,paged,page=256)" if modelled else "torch.sdpa(flash backend)"
        return Prepared(fn=lambda: None, backend=backend, dtype="bfloat16")
    return prepare


def test_rerun_measures_stand_in_rows_again_and_replaces_them(tmp_path):
    """Rows that timed a stand-in kernel (eager SiLU*Mul, SDPA decode) are what calibrate.py and dataset.build leave
    out, telling the user to install FlashInfer / flash-attn and re-measure: the rerun must not skip them as done,
    and every reader must take the new row, which is appended after the old one (the file is never rewritten, so
    two runs on two GPUs of one kind may append to it at once)."""
    decode = {"attention_type": "fa2_paged", "bs": 2, "q_lengths": "[1,1]", "kv_lengths": "[300,300]", "nh": 8,
              "nkv": 8, "hd": 128}
    rows = {"siluandmul": [{"seq": s, "dim": 512} for s in (1, 16, 256)], "attn": [decode]}
    _run(rows, tmp_path, FakeTimer(), prepare=_stand_in_prepare(False))
    assert csvio.MeasurementCsv(tmp_path / "siluandmul.csv", "siluandmul").done_keys() == set()
    timer = FakeTimer()
    unchanged = _run(rows, tmp_path, timer, prepare=_stand_in_prepare(False))  # still no FlashInfer: kept, not timed
    assert timer.calls == 0 and unchanged.ops["siluandmul"].still_unmodelled == 3
    assert "3 still of a stand-in kernel" in unchanged.lines()[0]
    timer = FakeTimer()
    summary = _run(rows, tmp_path, timer, prepare=_stand_in_prepare(True))
    assert timer.calls == 4 and summary.ops["siluandmul"].replaced == 3 and summary.ops["attn"].replaced == 1
    for op, count in (("siluandmul", 3), ("attn", 1)):
        with (tmp_path / f"{op}.csv").open() as handle:
            assert len(list(csv.DictReader(handle))) == 2 * count  # the old rows stay, superseded
        read = csvio.read_measured(tmp_path / f"{op}.csv", op)
        assert len(read) == count
        assert all(csvio.unmodelled_kernel(op, r.get("attention_type"), r["kernel"]) is None
                   for r in read.to_dict("records"))
    assert _run(rows, tmp_path, FakeTimer(), prepare=_stand_in_prepare(True)).measured == 0  # now done


def test_csv_schema(models, tmp_path):
    rows = _small_rows(models)
    gpu_dir = tmp_path / "NVIDIA_Fake_GPU"  # the measured-data layout: <root>/<gpu>/<op>.csv
    _run(rows, gpu_dir, FakeTimer(duration_us=20.0))
    expected_tail = ["hardware", "avg_duration", "median_us", "min_us", "std_us", "repeats", "dtype", "kernel",
                     "torch_version", "cuda_version", "flash_attn_version", "sm_clock_mhz", "mem_clock_mhz",
                     "timestamp", "timing"]
    assert list(csvio.columns_for("gemm")) == ["op", "M", "N", "K", *expected_tail]
    assert list(csvio.columns_for("attn")) == ["op", "attention_type", "bs", "q_lengths", "kv_lengths", "nh", "nkv",
                                                "hd", *expected_tail]
    assert list(csvio.columns_for("all_reduce")) == ["op", "size_bytes", "num_workers", *expected_tail]
    with (gpu_dir / "gemm.csv").open() as handle:
        reader = csv.DictReader(handle)
        assert reader.fieldnames == list(csvio.columns_for("gemm"))
        first = next(reader)
    assert first["op"] == "gemm" and first["hardware"] == "NVIDIA Fake GPU"
    # fake durations 20.0, 20.1, 20.2, 20.3 µs
    assert float(first["avg_duration"]) == pytest.approx(20.15)
    assert float(first["median_us"]) == pytest.approx(20.15)
    assert float(first["min_us"]) == pytest.approx(20.0)
    assert float(first["std_us"]) == pytest.approx(summarize([20.0, 20.1, 20.2, 20.3]).std_us, abs=1e-4)
    assert first["repeats"] == "4" and first["dtype"] == "bfloat16" and first["kernel"] == "fake-gemm"
    assert (first["sm_clock_mhz"], first["mem_clock_mhz"], first["flash_attn_version"]) == ("1980", "2619", "")
    assert first["timestamp"].endswith("Z") and first["timing"] == "fake"
    frames = csvio.read_all_measured(tmp_path)
    assert set(frames) == {"gemm", "attn", "rmsnorm"}
    attn = frames["attn"]
    assert attn["q_lengths"].str.startswith("[").all() and attn["bs"].dtype.kind == "i"
    assert list(csvio.iter_measured_files(tmp_path))[0][0] == gpu_dir.name


class _FakeCuda:
    """A simulated GPU for the CUDA-event timers. Every call the host makes (a launch, an event, a spin) costs it
    ``host_us`` and enters a stream of at most ``queue`` pending entries (a host meeting a full queue waits for the
    oldest to finish), which the GPU runs in order: a launch takes ``cold_us``, or ``warm_us`` where an LRU L2 of
    ``l2_bytes`` still holds its copy's operands; an event ``event_us``; a spin its cycles at 1,980 MHz. The timing
    module's ``time.perf_counter`` reads the host clock."""

    def __init__(self, l2_bytes: int, cold_us: float, warm_us: float, event_us: float = 0.0, host_us: float = 0.0,
                 queue: int = 10 ** 9):
        from collections import OrderedDict, deque
        from contextlib import nullcontext

        self.l2_bytes, self.cold_us, self.warm_us, self.event_us = l2_bytes, cold_us, warm_us, event_us
        self.host_us, self.queue = host_us, queue
        self.host = self.gpu_free = 0.0  # µs
        self.pending, self.cached, self.launched = deque(), OrderedDict(), []
        gpu = self

        class Event:
            def __init__(self, enable_timing=True):
                self.at = None

            def record(self):
                self.at = gpu.enqueue(gpu.event_us)

            def query(self):
                return self.at <= gpu.host

            def elapsed_time(self, other):
                return (other.at - self.at) / 1000

        def synchronize(*args):
            gpu.host = max(gpu.host, gpu.gpu_free)

        self.torch = SimpleNamespace(
            device=lambda *args: args, no_grad=nullcontext, int8="int8",
            empty=lambda n, dtype=None, device=None: SimpleNamespace(zero_=self.flush),
            cuda=SimpleNamespace(Event=Event, synchronize=synchronize, current_device=lambda: 0,
                                 device=lambda d: nullcontext(), _sleep=lambda cycles: self.enqueue(cycles / 1980),
                                 get_device_properties=lambda d: SimpleNamespace(L2_cache_size=l2_bytes)))
        self.time = SimpleNamespace(perf_counter=lambda: self.host / 1e6)

    def enqueue(self, duration_us: float) -> float:
        """Queue one entry of the stream; the GPU time at which it ends."""
        self.host += self.host_us
        while self.pending and self.pending[0] <= self.host:
            self.pending.popleft()
        if len(self.pending) >= self.queue:  # a full queue: the host waits for the oldest entry
            self.host = self.pending.popleft()
        self.gpu_free = max(self.gpu_free, self.host) + duration_us
        self.pending.append(self.gpu_free)
        return self.gpu_free

    def flush(self):
        self.cached.clear()
        self.enqueue(self.cold_us)

    def launch(self, copy: int, nbytes: int):
        warm = copy in self.cached
        self.cached.pop(copy, None)
        self.cached[copy] = nbytes
        while sum(self.cached.values()) > self.l2_bytes:
            self.cached.popitem(last=False)
        self.launched.append(copy)
        self.enqueue(self.warm_us if warm else self.cold_us)


def _timer(cls, gpu: _FakeCuda, monkeypatch, **kwargs):
    import pipeweave.profiler.timing as timing_module

    monkeypatch.setattr(timing_module, "time", gpu.time)
    return cls("cuda", torch=gpu.torch, **kwargs)


def test_rotating_timer_launches_copies_whose_operands_are_cold_and_spreads_the_events_cost(monkeypatch):
    """The rotate timing (the default): every launch of a block reads operands the L2 no longer holds, as a layer
    reads its weights after the other layers', and the events' cost is spread over a block of at least 200 µs. The
    flush timing pays an event's cost on every launch (on an H100 it timed small GEMMs up to 1.8x the training
    data's harness)."""
    from pipeweave.profiler.timing import CudaEventTimer, RotatingTimer

    mib = 2 ** 20
    gpu = _FakeCuda(l2_bytes=50 * mib, cold_us=10.0, warm_us=4.0, event_us=3.0, host_us=5.0)
    timer = _timer(RotatingTimer, gpu, monkeypatch, max_row_seconds=1.0)
    assert timer.cold_bytes == 100 * mib and timer.copies(100 * mib) == 1 and timer.copies(400 * mib) == 1
    assert timer.copies(3 * mib) == 34 and timer.copies(1) == RotatingTimer.MAX_COPIES and timer.copies(0) == 1
    durations = timer.measure([partial(gpu.launch, i, 3 * mib) for i in range(34)], repeats=20, warmup=3)
    # blocks of one pass (34 launches, 340 µs); the host (5 µs a launch) never shows
    assert len(durations) == 20 and durations == pytest.approx([10.0 + 3.0 / 34] * 20)
    assert gpu.launched[-20 * 34:] == list(range(34)) * 20  # the rotation goes on across blocks
    one = _FakeCuda(l2_bytes=50 * mib, cold_us=10.0, warm_us=4.0, host_us=5.0)
    durations = _timer(RotatingTimer, one, monkeypatch).measure([partial(one.launch, 0, 3 * mib)], 20, 3)
    assert durations == pytest.approx([4.0] * 20)  # what a single copy would have measured: a warm L2
    flushed = _FakeCuda(l2_bytes=50 * mib, cold_us=10.0, warm_us=4.0, event_us=3.0, host_us=5.0)
    durations = _timer(CudaEventTimer, flushed, monkeypatch).measure([partial(flushed.launch, 0, 3 * mib)], 20, 3)
    assert durations == pytest.approx([13.0] * 20)  # cold, but each launch pays an event


def test_rotating_timer_keeps_the_host_out_of_the_blocks_behind_a_finite_queue(monkeypatch):
    """A stream holds about a thousand pending entries: a host that queued a shape's 4,000 launches behind one spin
    would wait on the full queue and enqueue the rest inside the timed blocks (a 2 µs kernel, 10 µs of host time a
    launch: up to 10 µs measured). Groups of at most 512 launches, each behind its own spin, keep it out, and a group
    the spin did not cover is found by its first event and timed again with fewer blocks (a longer spin alone cannot
    help a host blocked on the full queue), or refused, never timed."""
    from pipeweave.profiler import timing as timing_module
    from pipeweave.profiler.timing import RotatingTimer

    gpu = _FakeCuda(l2_bytes=50 * 2 ** 20, cold_us=2.0, warm_us=2.0, host_us=10.0, queue=1024)
    durations = _timer(RotatingTimer, gpu, monkeypatch).measure([partial(gpu.launch, i, 1) for i in range(256)], 50, 3)
    assert len(durations) == RotatingTimer.MAX_LAUNCHES // 256 and durations == pytest.approx([2.0] * len(durations))
    monkeypatch.setattr(timing_module.RotatingTimer, "MAX_QUEUED", 4000)  # one group of 15 blocks behind one spin
    gpu = _FakeCuda(l2_bytes=50 * 2 ** 20, cold_us=2.0, warm_us=2.0, host_us=10.0, queue=1024)
    durations = _timer(RotatingTimer, gpu, monkeypatch).measure([partial(gpu.launch, i, 1) for i in range(256)], 50, 3)
    assert len(durations) == 15 and durations == pytest.approx([2.0] * 15)  # timed in groups of 3 blocks
    gpu = _FakeCuda(l2_bytes=50 * 2 ** 20, cold_us=2.0, warm_us=2.0, host_us=10.0, queue=128)  # under one block
    with pytest.raises(RuntimeError, match="the host could not queue 256 launches while the GPU waited"):
        _timer(RotatingTimer, gpu, monkeypatch).measure([partial(gpu.launch, i, 1) for i in range(256)], 50, 3)


def test_rotating_timer_times_a_launch_of_several_kernels_behind_a_finite_queue(monkeypatch):
    """A launch may be several kernels, each an entry of the stream's queue: cuBLAS's split-K GEMM and its reduction
    kernel. Twenty blocks of 25 such 8 µs launches (1,041 entries with the events and the spin) overflow a queue of
    1,024: every spin, however long, found the host blocked on the full queue, and the shape was refused. Half as
    many blocks behind the next spin fit."""
    from pipeweave.profiler.timing import RotatingTimer

    gpu = _FakeCuda(l2_bytes=50 * 2 ** 20, cold_us=7.5, warm_us=7.5, host_us=5.0, queue=1024)

    def split_k():
        gpu.launch(0, 2 ** 30)  # the GEMM, its operands larger than twice the L2: one copy
        gpu.enqueue(0.5)  # the split-K reduction

    durations = _timer(RotatingTimer, gpu, monkeypatch, max_row_seconds=0.25).measure([split_k], 20, 3)
    assert durations == pytest.approx([8.0] * 20)


def test_rotating_timer_keeps_a_long_kernel_within_its_budget(monkeypatch):
    """A kernel of at least the block length is one launch a block: with a 1 s budget a 100 ms kernel gets about ten
    repeats, after one warm-up and one probe launch (blocks of eight launches took 5.3 s)."""
    from pipeweave.profiler.timing import RotatingTimer

    gpu = _FakeCuda(l2_bytes=50 * 2 ** 20, cold_us=100_000.0, warm_us=100_000.0)
    durations = _timer(RotatingTimer, gpu, monkeypatch, max_row_seconds=1.0).measure(
        [partial(gpu.launch, 0, 2 ** 30)], 50, 0)
    assert 5 <= len(durations) <= 10 and durations == pytest.approx([100_000.0] * len(durations))
    assert len(gpu.launched) == 1 + 1 + len(durations)  # warm-up (every copy once), probe, repeats


def test_rows_record_their_timing_and_a_rerun_with_another_one_measures_them_again(models, tmp_path):
    rows = {"gemm": _small_rows(models)["gemm"][:3]}

    class Copying(FakeTimer):
        name = "rotate"

        def copies(self, input_bytes):
            return 3

        def measure(self, fns, repeats, warmup):
            assert len(fns) == 3
            return super().measure(fns, repeats, warmup)

    calls = []
    _run(rows, tmp_path, FakeTimer(), prepare=_fake_prepare(calls))
    assert len(calls) == 3
    again = _run(rows, tmp_path, Copying(), prepare=_fake_prepare(calls))
    assert again.measured == 3 and again.ops["gemm"].retimed == 3 and len(calls) == 3 + 9  # three copies a row
    assert "3 of them replacing rows of the other timing" in "\n".join(again.lines())
    measured = csvio.read_measured(tmp_path / "gemm.csv")
    assert len(measured) == 3 and (measured["timing"] == "rotate").all()  # the later rows supersede
    assert _run(rows, tmp_path, Copying(), prepare=_fake_prepare(calls)).measured == 0
    # and back: a key is judged by its last row, the one every reader keeps (an earlier row of this run's timing
    # made it count as done, so that the rows of the other timing stayed the ones read)
    assert _run(rows, tmp_path, FakeTimer(), prepare=_fake_prepare(calls)).ops["gemm"].retimed == 3
    assert _run(rows, tmp_path, Copying(), prepare=_fake_prepare(calls)).ops["gemm"].retimed == 3
    assert (csvio.read_measured(tmp_path / "gemm.csv")["timing"] == "rotate").all()


def test_a_stand_in_never_supersedes_a_modelled_row_of_the_other_timing(tmp_path):
    """A fused SiLU*Mul row of one timing, rerun with the other where this run has only torch's two kernels: the
    stand-in row was appended and, read as the key's last row, dropped the shape from calibrate.py."""
    rows = {"siluandmul": [{"seq": 16, "dim": 8192}]}
    _run(rows, tmp_path, FakeTimer(), prepare=_stand_in_prepare(True))

    class Other(FakeTimer):
        name = "rotate"

    summary = _run(rows, tmp_path, Other(), prepare=_stand_in_prepare(False))
    assert summary.measured == 0 and summary.ops["siluandmul"].kept_timing == 1
    assert "1 kept at the other timing: this run has only a stand-in kernel for them" in "\n".join(summary.lines())
    kept = csvio.read_measured(tmp_path / "siluandmul.csv")
    assert kept["kernel"].tolist() == ["flashinfer silu_and_mul [fused]"] and kept["timing"].tolist() == ["fake"]


def test_a_file_written_before_the_timing_column_is_read_as_flush_and_not_appended_to(tmp_path):
    path = tmp_path / "gemm.csv"
    old = [c for c in csvio.columns_for("gemm") if c != "timing"]
    path.write_text(",".join(old) + "\n" + "gemm,1,4096,4096,NVIDIA H100,10.0,10.0,9.0,0.1,20,bfloat16,k,2.11,13.0,,"
                    "1980,2619,2026-12-05T19:31:32Z\n")
    assert csvio.read_measured(path)["timing"].tolist() == ["flush"]
    with pytest.raises(ValueError, match="written before the timing column"):
        csvio.MeasurementCsv(path, "gemm", "rotate").done_keys()

def test_header_mismatch_is_an_error(tmp_path):
    path = tmp_path / "gemm.csv"
    path.write_text("M,N,K,avg_duration\n1,2,3,4.0\n")
    with pytest.raises(ValueError, match="unexpected columns"):
        csvio.MeasurementCsv(path, "gemm").done_keys()


def test_summarize_and_fake_timer():
    stats = summarize([3.0, 1.0, 2.0])
    assert (stats.mean_us, stats.median_us, stats.min_us, stats.std_us, stats.repeats) == (2.0, 2.0, 1.0, 1.0, 3)
    assert summarize([5.0]).std_us == 0.0
    with pytest.raises(ValueError, match="no durations to summarize"):
        summarize([])
    ran = []
    timer = FakeTimer(duration_us=lambda call: 7.0 * call, call=True)
    assert timer.measure([lambda: ran.append(1)], 2, 10) == [7.0, 7.1] and ran == [1]


# ----------------------------------------------------------------------------------------------
# Kernel labels and CPU smoke runs of the torch runners


def test_kernel_labels():
    name = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
            "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)")
    assert short_kernel_name(name) == \
        "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
    eager = Prepared(fn=lambda: None, backend="torch silu(gate)*up", dtype="bfloat16", elementwise=True)
    assert kernel_label(eager, ["void silu_kernel(float*)", "void mul_kernel(float*)"]) == \
        "torch silu(gate)*up [eager, 2 kernels]: silu_kernel | mul_kernel"
    assert kernel_label(eager, ["void rms(x)"]).startswith("torch silu(gate)*up [fused]")
    assert "unknown" in kernel_label(eager, None)
    gemm = Prepared(fn=lambda: None, backend="torch.nn.functional.linear", dtype="bfloat16")
    assert kernel_label(gemm, None) == "torch.nn.functional.linear"


def test_torch_runners_on_cpu():
    torch = pytest.importorskip("torch")
    from pipeweave.profiler.runners import TorchRunners

    runners = TorchRunners("cpu", attn_backend="sdpa")
    assert runners.prefill_attention_type == "fa2_ragged" and runners.decode_attention_type == "fa2_paged"
    out = runners.prepare("gemm", {"M": 3, "N": 32, "K": 64}).fn()
    assert tuple(out.shape) == (3, 32) and out.dtype == torch.bfloat16
    assert runners.check_op("gemm") is None
    prefill = {"attention_type": "fa2_ragged", "bs": 2, "q_lengths": "[16,16]", "kv_lengths": "[16,16]",
               "nh": 4, "nkv": 2, "hd": 64}
    assert tuple(runners.prepare("attn", prefill).fn().shape) == (2, 4, 16, 64)
    decode = dict(prefill, q_lengths="[1,1]", kv_lengths="[40,40]")
    decode["attention_type"] = "fa2_paged"
    assert tuple(runners.prepare("attn", decode).fn().shape) == (2, 4, 1, 64)
    with pytest.raises(Unsupported):
        runners.prepare("attn", dict(prefill, q_lengths="[16,8]", kv_lengths="[16,8]"))
    with pytest.raises(Unsupported):
        runners.prepare("attn", dict(prefill, attention_type="fa3_ragged"))
    assert tuple(runners.prepare("rmsnorm", {"seq": 5, "dim": 256}).fn().shape) == (5, 256)
    prepared = runners.prepare("siluandmul", {"seq": 5, "dim": 256})
    assert tuple(prepared.fn().shape) == (5, 128) and prepared.elementwise
    with pytest.raises(ValueError):
        runners.prepare("siluandmul", {"seq": 5, "dim": 255})
    if runners.check_op("gemm_fp8") is None:  # CPU torch._scaled_mm exists in recent torch
        assert tuple(runners.prepare("gemm_fp8", {"M": 3, "N": 32, "K": 64}).fn().shape) == (3, 32)
    assert runners.kernel_names(lambda: None) is None  # no profiler run off-GPU


def test_runners_measured_with_fake_timer(models, tmp_path):
    pytest.importorskip("torch")
    from pipeweave.profiler.runners import TorchRunners

    runners = TorchRunners("cpu", attn_backend="sdpa")
    rows = {"gemm": [{"M": 2, "N": 64, "K": 32}],
            "attn": [{"attention_type": "fa2_paged", "bs": 2, "q_lengths": "[1,1]", "kv_lengths": "[30,30]",
                      "nh": 4, "nkv": 1, "hd": 64},
                     {"attention_type": "fa2_ragged", "bs": 2, "q_lengths": "[9,30]", "kv_lengths": "[9,30]",
                      "nh": 4, "nkv": 1, "hd": 64}],
            "siluandmul": [{"seq": 3, "dim": 64}]}
    timer = FakeTimer(call=True)
    summary = _run(rows, tmp_path, timer, prepare=runners.prepare)
    assert summary.measured == 3 and summary.ops["attn"].unsupported == 1  # ragged needs flash-attn
    with (tmp_path / "siluandmul.csv").open() as handle:
        assert next(csv.DictReader(handle))["kernel"] == "torch silu(gate)*up [eager]"  # two kernels, always


def test_torch_silu_and_mul_is_never_taken_for_the_fused_kernel():
    """torch's silu(gate)*up is two kernels whatever the profiler sees: labelled eager without the profiler (or
    when it sees no kernel), and an older row labelled 'unknown' is left out of training and calibration too."""
    pytest.importorskip("torch")
    from pipeweave.profiler.runners import TorchRunners

    prepared = TorchRunners("cpu").prepare("siluandmul", {"seq": 3, "dim": 64})
    for names in (None, [], ["void fused_like_kernel(int)"]):
        label = kernel_label(prepared, names)
        assert "[eager" in label and csvio.unmodelled_kernel("siluandmul", "", label)
    old = "torch silu(gate)*up [fused or eager: unknown, no profiler]"
    assert "install flashinfer" in csvio.unmodelled_kernel("siluandmul", "", old)
    assert csvio.unmodelled_kernel("rmsnorm", "", "torch.nn.functional.rms_norm [fused or eager: unknown, "
                                                  "no profiler]") is None  # F.rms_norm may well be one kernel


# ----------------------------------------------------------------------------------------------
# Hardware JSON skeleton


def _h100_like_props(**overrides):
    props = dict(name="NVIDIA Test GPU 80GB", major=9, minor=0, multi_processor_count=132,
                 total_memory=84929216512, L2_cache_size=50 * 2 ** 20, shared_memory_per_multiprocessor=233472,
                 regs_per_multiprocessor=65536, clock_rate=1980000, memory_clock_rate=2619000,
                 memory_bus_width=5120)
    props.update(overrides)
    return SimpleNamespace(**props)


def test_hardware_skeleton_rejected_until_filled():
    data = hardware_skeleton(_h100_like_props(), today="2026-01-01")
    json.dumps(data)  # serializable
    assert data["name"] == "NVIDIA Test GPU 80GB" and data["numSms"] == 132
    assert (data["computeMajor"], data["computeMinor"], data["architecture"]) == (9, 0, "hopper")
    assert data["memBandwidth"] == pytest.approx(3352.32)  # the convention of hardware/H100.json
    assert (data["l2CacheSize"], data["sharedMemorySize"], data["registerFileSize"]) == (51200, 228, 256)
    assert (data["smFreq"], data["FmaFp32"], data["xuFp32"], data["sharedMemoryBandwidth"]) == (1980, 128, 16, 128)
    link = ["memoryType", "linkType", "linkGbps", "linkLatencyUs"]
    assert data["TODO"] == ["l2CacheBandwidth", "tcBf16", "tcFp8", *link]
    assert all(str(data[f]).startswith("TODO") for f in data["TODO"])
    assert "memBandwidth" in data["CHECK"] and "smFreq" in data["CHECK"]
    assert set(data["provenance"]) == set(data) - {"provenance", "TODO", "CHECK"}
    with pytest.raises(ValueError, match="still has the skeleton's TODO and CHECK list"):
        parse_hardware(data, "Test", "Test.json")
    with pytest.raises(ValueError, match="must be a positive number"):
        parse_hardware({k: v for k, v in data.items() if k not in ("TODO", "CHECK")}, "Test", "Test.json")
    filled = dict(data, l2CacheBandwidth=8820, tcBf16=4096, tcFp8=8192, memoryType="HBM3", linkType="nvlink4",
                  linkGbps=450, linkLatencyUs=6)
    with pytest.raises(ValueError, match="still has the skeleton's TODO and CHECK list"):  # values done, lists not
        parse_hardware(filled, "Test", "Test.json")
    del filled["TODO"], filled["CHECK"]
    with pytest.raises(ValueError, match="'provenance' has no source for field"):  # TODO sources left
        parse_hardware(filled, "Test", "Test.json")
    filled["provenance"] = {k: "datasheet" if str(v).startswith("TODO") else v for k, v in data["provenance"].items()}
    spec = parse_hardware(filled, "Test", "Test.json")
    assert (spec.num_sms, spec.tc_bf16, spec.tc_fp8, spec.architecture) == (132, 4096, 8192, "hopper")


def test_hardware_skeleton_without_clock_fields_and_old_gpus():
    bare = _h100_like_props(major=8, minor=0)
    for attr in ("clock_rate", "memory_clock_rate", "memory_bus_width", "regs_per_multiprocessor"):
        delattr(bare, attr)
    data = hardware_skeleton(bare)
    assert data["TODO"] == ["memBandwidth", "l2CacheBandwidth", "tcBf16", "smFreq", "memoryType", "linkType",
                            "linkGbps", "linkLatencyUs"]
    assert "tcFp8" not in data and data["FmaFp32"] == 64 and data["architecture"] == "ampere"
    assert data["registerFileSize"] is None
    # a driver without the L2 and shared-memory sizes: both are required, so both are asked for (the L2 size was
    # written as null and failed only once every listed field was filled)
    data = hardware_skeleton(_h100_like_props(L2_cache_size=0, shared_memory_per_multiprocessor=0))
    assert {"l2CacheSize", "sharedMemorySize"} <= set(data["TODO"])
    # filled in but for those two sizes, the loader refuses it for them (not for the lists left in)
    filled = {key: value for key, value in data.items() if key not in ("TODO", "CHECK")}
    filled.update(l2CacheBandwidth=8820, tcBf16=4096, tcFp8=8192, memoryType="HBM3", linkType="nvlink4",
                  linkGbps=450, linkLatencyUs=6, memBandwidth=3352.32, smFreq=1980)
    filled["provenance"] = {key: "datasheet" for key in data["provenance"]}
    with pytest.raises(ValueError, match=r"'(sharedMemorySize|l2CacheSize)' must be a positive number"):
        parse_hardware(filled, "x", "x.json")
    # NVML values win over the properties
    assert hardware_skeleton(bare, max_sm_clock_mhz=1410, max_mem_clock_mhz=1593, memory_bus_width=5120)[
        "memBandwidth"] == pytest.approx(2039.04)
    turing = hardware_skeleton(_h100_like_props(major=7, minor=5))
    assert "architecture" in turing["TODO"] and turing["FmaFp32"] == 64


@pytest.mark.parametrize("major,minor", [(7, 0), (7, 5), (8, 7)])
def test_skeleton_of_a_gpu_pipeweave_cannot_model_is_refused(major, minor, tmp_path, monkeypatch):
    """V100, T4 (no architecture class) and Orin's 8.7 (an Ampere class, but no occupancy limit): the loader refuses
    any file of theirs, so the skeleton must not ask the user to "pick the closest" and fill it in."""
    from pipeweave.profiler import device, measure

    assert "cannot model this GPU's SM design" in capability_refusal(major, minor)
    data = hardware_skeleton(_h100_like_props(major=major, minor=minor), today="2026-01-01")
    assert "pick the closest" not in data["architecture"] and "refuses" in data["architecture"]
    monkeypatch.setattr(device, "local_hardware_skeleton", lambda index: data)
    with pytest.raises(UserError, match=r"cannot model this GPU's SM design.*none was written"):
        measure.write_hardware_json(tmp_path / "mine.json", 0)
    assert not (tmp_path / "mine.json").exists()
    assert all(capability_refusal(*cc) is None for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)))


def test_skeleton_instructions_name_what_the_loader_cannot_check(tmp_path, monkeypatch, capsys):
    from pipeweave.profiler import device, measure

    monkeypatch.setattr(device, "local_hardware_skeleton",
                        lambda index: hardware_skeleton(_h100_like_props(), today="2026-01-01"))
    assert measure.write_hardware_json(tmp_path / "mine.json", 0) == 0
    out = capsys.readouterr().out
    assert 'replace every "TODO: ..." entry' in out and '"p2p": false' in out and "hardware/RTX 4090.json" in out
    assert "FP32 accumulate" in out and 'README "Hardware audit"' in out
    assert '"boostClock"' in out and "1980 MHz here" in out


def test_gpu_dir_name():
    assert gpu_dir_name("NVIDIA H100 80GB HBM3") == "H100"  # alias in hardware/H100.json
    assert gpu_dir_name("NVIDIA GeForce RTX 4090") == "RTX 4090"  # hardware/RTX 4090.json
    assert gpu_dir_name("NVIDIA GeForce RTX 5090") == "NVIDIA_GeForce_RTX_5090"  # no hardware JSON yet


def test_a_gpu_measured_before_its_hardware_json_resumes_in_its_first_folder(tmp_path):
    """Measured under its driver name, then described by a hardware JSON: a rerun resumes in the folder that holds
    its rows instead of measuring the whole grid again into a second one."""
    assert measured_dir(tmp_path, "NVIDIA H100 80GB HBM3") == tmp_path / "H100"
    (tmp_path / "NVIDIA_H100_80GB_HBM3").mkdir()
    assert measured_dir(tmp_path, "NVIDIA H100 80GB HBM3") == tmp_path / "NVIDIA_H100_80GB_HBM3"
    (tmp_path / "H100").mkdir()  # both exist: the hardware JSON's stem, as on a fresh GPU
    assert measured_dir(tmp_path, "NVIDIA H100 80GB HBM3") == tmp_path / "H100"
    assert sanitize("a/b c") == "a_b_c"


# ----------------------------------------------------------------------------------------------
# CLI on the CPU


def test_cli_dry_run(config_dir, capsys):
    code = run_cli(profile_operators.main, ["--dry_run", "--quick", "--config_dir", str(config_dir)])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"^  gemm +239 rows$", out, re.M) and re.search(r"^  total +\d+ rows$", out, re.M)


def test_cli_measurement_without_gpu_exits_2(config_dir, capsys, monkeypatch):
    monkeypatch.setattr(profile_operators, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(profile_operators, "no_cuda_reason", lambda: "no CUDA GPU visible: x")
    monkeypatch.setattr(profile_operators, "no_cuda_message", lambda: NO_CUDA_MESSAGE)
    code = run_cli(profile_operators.main, ["--quick", "--config_dir", str(config_dir)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [f"{program_name()}: error: {NO_CUDA_MESSAGE}"]
    code = run_cli(profile_operators.main, ["--hardware_json", "x.json"])
    assert code == 2 and "no CUDA GPU visible" in capsys.readouterr().err


def test_no_cuda_message_names_the_fix(monkeypatch):
    """Three causes, three fixes: torch missing (pip), a CPU build of torch (another wheel), no GPU for the driver."""
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert no_cuda_message().startswith("torch is not installed (pip install '.[train]')")
    cpu = SimpleNamespace(__version__="2.13.0+cpu", version=SimpleNamespace(cuda=None))
    monkeypatch.setitem(sys.modules, "torch", cpu)
    assert no_cuda_message().startswith("torch 2.13.0+cpu was built without CUDA (torch.version.cuda is None)")
    cuda = SimpleNamespace(__version__="2.13.0", version=SimpleNamespace(cuda="12.8"))
    monkeypatch.setitem(sys.modules, "torch", cuda)
    assert no_cuda_message() == NO_CUDA_MESSAGE and "the driver reports none" in NO_CUDA_MESSAGE
    assert all(message.endswith("use --dry_run to see the grid") for message in (no_cuda_message(), NO_CUDA_MESSAGE))


def test_docstring_example_of_hardware_json_is_accepted(monkeypatch):
    """The example of profile_operators.py's docstring must be a path --hardware_json writes (not in hardware/)."""
    from analytical_model.hardware import DEFAULT_HARDWARE_DIR

    example = re.search(r'--hardware_json "([^"]+)"', profile_operators.__doc__).group(1)
    monkeypatch.chdir(REPO)
    assert Path(example).resolve().parent != Path(DEFAULT_HARDWARE_DIR).resolve()


def test_hardware_skeleton_is_written_outside_the_hardware_folder(tmp_path, monkeypatch, capsys):
    """An unfinished skeleton in hardware/ would stop every command (each loads every file there): refused; written
    elsewhere, a GPU the folder already describes is named before the write."""
    from analytical_model.hardware import DEFAULT_HARDWARE_DIR
    from pipeweave.profiler import device, measure

    with pytest.raises(UserError, match="write the skeleton outside"):
        measure.write_hardware_json(Path(DEFAULT_HARDWARE_DIR) / "My GPU.json", 0)
    monkeypatch.setattr(device, "local_hardware_skeleton",
                        lambda index: hardware_skeleton(_h100_like_props(name="NVIDIA H100"), today="2026-01-01"))
    assert measure.write_hardware_json(tmp_path / "mine.json", 0) == 0
    out = capsys.readouterr().out
    assert "'NVIDIA H100' is already described by" in out and "then move it into" in out
    assert json.loads((tmp_path / "mine.json").read_text())["TODO"]


def test_cli_bad_flags(config_dir, capsys):
    for argv in (["--ops", "conv"], ["--tp", "0"], ["--repeats", "0"], ["--configs", "Nope", "--dry_run",
                                                                          "--config_dir", str(config_dir)],
                 ["--dry_run", "--max_minutes", "nan"], ["--dry_run", "--max_row_seconds", "nan"]):
        assert run_cli(profile_operators.main, argv) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


class _FakeRunners:
    """Stands in for TorchRunners so the CLI's measurement path runs on the CPU."""

    prefill_attention_type = "fa2_ragged"
    decode_attention_type = "fa2_paged"

    def __init__(self, device, attn_backend="auto", elementwise_backend="auto"):
        self.notes = ["attention prefill: fa3 failed (fake); using fa2"]

    def check_op(self, op):
        return "FP8 GEMM needs compute capability 8.9 or newer" if op == "gemm_fp8" else None

    def describe_backends(self):
        return "fake backends"

    def prepare(self, op, row):
        return _fake_prepare()(op, row)

    def kernel_names(self, fn):
        return ["void fake_kernel<1>(int)"]


def _fake_gpu(monkeypatch, runners=_FakeRunners) -> None:
    """One fake GPU for profile_operators.py's measurement path: ``runners`` instead of TorchRunners, a fake timer."""
    torch = pytest.importorskip("torch")
    import pipeweave.profiler.device as device_module
    import pipeweave.profiler.measure as measure_module
    import pipeweave.profiler.runners as runners_module
    import pipeweave.profiler.timing as timing_module

    class Timer(FakeTimer):
        cold_bytes = 100 * 2 ** 20
        BLOCK_US = 200.0

        def __init__(self, device, max_row_seconds):
            super().__init__()

    monkeypatch.setattr(profile_operators, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(measure_module, "warm_up_gpu", lambda torch, device: None)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(device_module, "local_device_info", lambda index: FAKE_DEVICE)
    monkeypatch.setattr(runners_module, "TorchRunners", runners)
    monkeypatch.setattr(timing_module, "TIMERS", {"rotate": Timer, "flush": Timer})


def test_cli_measurement_path_with_fakes(config_dir, tmp_path, monkeypatch, capsys):
    _fake_gpu(monkeypatch)
    argv = ["--quick", "--configs", "Llama-3.1-70B", "--tp", "8", "--config_dir", str(config_dir),
            "--output_dir", str(tmp_path), "--no_progress"]
    assert run_cli(profile_operators.main, argv) == 0
    out = capsys.readouterr().out
    assert "gemm_fp8: skipped, cannot run on this GPU" in out and "all_reduce: skipped" in out
    assert "note: attention prefill: fa3 failed" in out
    folder = tmp_path / "NVIDIA_Fake_GPU"
    assert sorted(p.name for p in folder.glob("*.csv")) == ["attn.csv", "gemm.csv", "rmsnorm.csv", "siluandmul.csv"]
    gemm = csvio.read_measured(folder / "gemm.csv")
    assert len(gemm) == 23 and (gemm["kernel"] == "fake-gemm: fake_kernel<1>").all()
    assert run_cli(profile_operators.main, argv) == 0  # resume: nothing new
    assert "measured 0 rows" in capsys.readouterr().out
    assert len(csvio.read_measured(folder / "gemm.csv")) == 23


def test_cli_measures_the_designed_kernels_most_informative_first(config_dir, tmp_path, monkeypatch, capsys):
    """--kernels K measures, of each kernel operator's full grid, the K shapes pipeweave.kernel_design chooses for
    the GPU of --hardware, in its order; a GPU without a hardware JSON is an error naming the known ones."""
    _fake_gpu(monkeypatch)
    argv = ["--kernels", "5", "--configs", "Llama-3.1-70B", "--tp", "8", "--config_dir", str(config_dir),
            "--output_dir", str(tmp_path), "--no_progress", "--ops", "rmsnorm,siluandmul"]
    assert run_cli(profile_operators.main, argv) == 2  # the fake GPU has no hardware JSON
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kernels reads the GPU's hardware JSON: unknown GPU 'NVIDIA Fake GPU'" in err[0]
    assert "L40S" in err[0] and "--hardware_json PATH" in err[0]
    assert run_cli(profile_operators.main, argv + ["--hardware", "L40"]) == 0
    out = capsys.readouterr().out
    assert "designed (5 per operator) grid:" in out and re.search(r"^  rmsnorm +5 rows$", out, re.M)
    full = grids.build_grid(grids.load_models(["Llama-3.1-70B"], config_dir), [8], ops=["rmsnorm", "siluandmul"])
    designed = grids.informative_grid(full, hardware_registry().get("L40"), 5)
    for op in ("rmsnorm", "siluandmul"):
        measured = csvio.read_measured(tmp_path / "NVIDIA_Fake_GPU" / f"{op}.csv")
        assert measured[["seq", "dim"]].astype(int).values.tolist() == [[r["seq"], r["dim"]]
                                                                       for r in designed.rows[op]]


def test_cli_kernels_flag_errors(config_dir, capsys):
    for argv, message in ((["--kernels", "8", "--quick"], "--kernels chooses from the full grid; drop --quick"),
                          (["--hardware", "L40", "--dry_run"], "give --kernels K too"),
                          (["--kernels", "8", "--dry_run", "--hardware", "Nope"], "known GPUs"),
                          (["--kernels", "0", "--dry_run"], "must be at least 1")):
        assert run_cli(profile_operators.main, argv + ["--config_dir", str(config_dir)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    assert run_cli(profile_operators.main, ["--dry_run", "--kernels", "7", "--hardware", "L40", "--ops", "rmsnorm",
                                            "--config_dir", str(config_dir)]) == 0
    assert re.search(r"^  rmsnorm +7 rows$", capsys.readouterr().out, re.M)


class _NoKernelImage(_FakeRunners):
    """A GPU this torch has no kernels for: every operator fails its smoke test."""

    def check_op(self, op):
        return "CUDA error: no kernel image is available for execution on the device"


class _EveryRowUnsupported(_FakeRunners):
    def prepare(self, op, row):
        raise Unsupported("this backend runs none of these shapes")


def test_a_run_that_measures_nothing_exits_2_saying_why(config_dir, tmp_path, monkeypatch, capsys):
    """Every operator skipped, or every row unsupported, with nothing measured before: status 0 and "total 0 rows"
    would pass for a measured GPU; it is an error naming the reasons. A rerun of a measured grid stays status 0."""
    argv = ["--quick", "--configs", "Llama-3.1-70B", "--tp", "8", "--config_dir", str(config_dir),
            "--output_dir", str(tmp_path), "--no_progress", "--ops", "gemm,attn,all_reduce"]
    _fake_gpu(monkeypatch, _NoKernelImage)
    assert run_cli(profile_operators.main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{program_name()}: error: nothing could be measured on NVIDIA Fake GPU: gemm, attn: cannot run on "
                   f"this GPU (CUDA error: no kernel image is available for execution on the device); all_reduce: "
                   f"needs at least 2 visible GPUs"]
    _fake_gpu(monkeypatch, _EveryRowUnsupported)
    assert run_cli(profile_operators.main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "nothing could be measured on NVIDIA Fake GPU: all_reduce: needs at least 2 visible GPUs; gemm " \
           "unsupported: this backend runs none of these shapes" in err
    _fake_gpu(monkeypatch)
    assert run_cli(profile_operators.main, argv) == 0
    _fake_gpu(monkeypatch, _EveryRowUnsupported)
    assert run_cli(profile_operators.main, argv) == 0  # the rows are there from the run before


@pytest.mark.skipif(_cuda_available(), reason="checks the message printed where no GPU is visible")
def test_script_without_gpu_prints_one_line(config_dir):
    proc = subprocess.run([sys.executable, str(REPO / "profile_operators.py"), "--quick", "--config_dir",
                           str(config_dir)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"profile_operators.py: error: {no_cuda_message()}"


# ----------------------------------------------------------------------------------------------
# all_reduce plumbing on CPU (gloo), and the real thing on a GPU


def test_allreduce_plumbing_with_gloo(tmp_path):
    pytest.importorskip("torch")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from pipeweave.profiler.collective import AllReduceOptions, measure_allreduce

    rows = [{"size_bytes": 4096, "num_workers": 2}, {"size_bytes": 65536, "num_workers": 2}]
    path = tmp_path / "all_reduce.csv"
    options = AllReduceOptions(repeats=2, warmup=1, backend="gloo", device="cpu")
    measure_allreduce(rows, csv_path=path, hardware="cpu-test", versions={}, options=options)
    with path.open() as handle:
        written = list(csv.DictReader(handle))
    assert [(r["size_bytes"], r["num_workers"]) for r in written] == [("4096", "2"), ("65536", "2")]
    assert all(float(r["avg_duration"]) > 0 and r["kernel"] == "torch.distributed.all_reduce(gloo)" for r in written)
    assert csvio.MeasurementCsv(path, "all_reduce").done_keys() == {
        csvio.row_key("all_reduce", r, "cpu-test") for r in rows}


@pytest.mark.cuda
@pytest.mark.skipif(not _cuda_available(), reason="no CUDA GPU")
def test_quick_gemm_on_gpu(config_dir, tmp_path):
    argv = ["--quick", "--ops", "gemm", "--configs", "Llama-3.1-70B", "--tp", "8", "--config_dir", str(config_dir),
            "--output_dir", str(tmp_path), "--repeats", "5", "--warmup", "1", "--no_progress", "--max_minutes", "3"]
    assert run_cli(profile_operators.main, argv) == 0
    files = list(tmp_path.glob("*/gemm.csv"))
    assert len(files) == 1
    frame = csvio.read_measured(files[0])
    models = grids.load_models(["Llama-3.1-70B"], config_dir)
    expected = len(grids.build_grid(models, [8], quick=True, ops=["gemm"]).rows["gemm"])
    assert len(frame) == expected == 23 and (frame["avg_duration"] > 0).all()
    assert (frame["min_us"] <= frame["median_us"]).all() and (frame["repeats"] >= 1).all()
    assert frame["kernel"].str.startswith("torch.nn.functional.linear").all()
    # a second run measures nothing new
    assert run_cli(profile_operators.main, argv) == 0
    assert len(csvio.read_measured(files[0])) == expected


def test_crosscheck_sets_measured_kernels_beside_the_reference_rows(tmp_path, capsys):
    import pandas as pd

    from pipeweave.profiler import crosscheck
    from pipeweave.profiler.csvio import columns_for

    shapes = [(8, 4096, 4096), (16, 4096, 4096), (4096, 4096, 4096)]
    reference = pd.DataFrame([{"M": m, "N": n, "K": k, "hardware": "NVIDIA H200", "dtype": "bfloat16",
                               "avg_duration": 10.0 * (i + 1) ** 3, "source": "aiconfigurator-core 0.12.0 x"}
                              for i, (m, n, k) in enumerate(shapes)])
    other_source = reference.assign(source="vidur 1 y", avg_duration=1.0)  # never the reference
    pd.concat([reference, other_source]).to_csv(tmp_path / "gemm_train.csv", index=False)
    measured = pd.DataFrame([{**dict.fromkeys(columns_for("gemm"), ""), "op": "gemm", "M": m, "N": n, "K": k,
                              "hardware": "NVIDIA H200", "dtype": "bfloat16", "avg_duration": duration}
                             for (m, n, k), duration in [(shapes[0], 12.0), (shapes[1], 80.0 * 1.5),
                                                         (shapes[2], 270.0 * 0.9), ((32, 32, 32), 5.0)]])
    (tmp_path / "measured" / "H200").mkdir(parents=True)
    measured.to_csv(tmp_path / "measured" / "H200" / "gemm.csv", index=False)
    report = tmp_path / "report.md"
    assert crosscheck.main(["--measured_dir", str(tmp_path / "measured"), "--dataset_dir", str(tmp_path),
                            "--output", str(report)]) == 0
    row = next(line for line in report.read_text().splitlines() if line.startswith("| gemm |"))
    # the unmatched shape is left out
    assert "| gemm | NVIDIA H200 | 3 | 1.200 | 1.050–1.350 | 0.900 – 1.500 |" in row
    assert "[10.0, 30.0) µs: 1.200 (1); [30.0, 100.0) µs: 1.500 (1); [100.0, 1000.0) µs: 0.900 (1)" in row
    assert report.read_text() == capsys.readouterr().out
    assert run_cli(crosscheck.main, ["--measured_dir", str(tmp_path / "measured"), "--dataset_dir",
                                     str(tmp_path / "absent")]) == 2
    assert "python3 -m dataset.build" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run_cli(crosscheck.main, ["--measured_dir", str(tmp_path / "empty"), "--dataset_dir", str(tmp_path)]) == 2
    assert "profile_operators.py --quick" in capsys.readouterr().err


def test_crosscheck_says_why_a_gpu_has_no_matched_row(tmp_path, capsys):
    import pandas as pd

    from pipeweave.profiler import crosscheck
    from pipeweave.profiler.csvio import columns_for

    pd.DataFrame([{"M": 16, "N": 4096, "K": 4096, "hardware": "NVIDIA H200", "dtype": "bfloat16", "avg_duration": 10.0,
                   "source": "aiconfigurator-core 0.12.0 x"}]).to_csv(tmp_path / "gemm_train.csv", index=False)
    for folder, name, m in (("H200", "NVIDIA H200", 32), ("L40", "NVIDIA L40", 16)):
        (tmp_path / "measured" / folder).mkdir(parents=True)
        pd.DataFrame([{**dict.fromkeys(columns_for("gemm"), ""), "op": "gemm", "M": m, "N": 4096, "K": 4096,
                       "hardware": name, "dtype": "bfloat16", "avg_duration": 12.0}]).to_csv(
            tmp_path / "measured" / folder / "gemm.csv", index=False)
    assert run_cli(crosscheck.main, ["--measured_dir", str(tmp_path / "measured"), "--dataset_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| gemm | NVIDIA H200 | 0 of 1 (no shape in common) |" in out
    assert "| gemm | NVIDIA L40 | 0 of 1 (aiconfigurator-core has no gemm rows of this GPU) |" in out


def test_crosscheck_skips_a_gpu_without_hardware_json(tmp_path, capsys):
    """A GPU just measured, whose hardware JSON is not written yet, must not stop the report of the others."""
    import pandas as pd

    from pipeweave.profiler import crosscheck
    from pipeweave.profiler.csvio import columns_for

    pd.DataFrame([{"M": 16, "N": 4096, "K": 4096, "hardware": "NVIDIA H200", "dtype": "bfloat16", "avg_duration": 10.0,
                   "source": "aiconfigurator-core 0.12.0 x"}]).to_csv(tmp_path / "gemm_train.csv", index=False)
    for folder, name in (("H200", "NVIDIA H200"), ("NVIDIA_Mystery_GPU", "NVIDIA Mystery GPU")):
        (tmp_path / "measured" / folder).mkdir(parents=True)
        pd.DataFrame([{**dict.fromkeys(columns_for("gemm"), ""), "op": "gemm", "M": 16, "N": 4096, "K": 4096,
                       "hardware": name, "dtype": "bfloat16", "avg_duration": 12.0}]).to_csv(
            tmp_path / "measured" / folder / "gemm.csv", index=False)
    argv = ["--measured_dir", str(tmp_path / "measured"), "--dataset_dir", str(tmp_path)]
    assert run_cli(crosscheck.main, argv) == 0
    captured = capsys.readouterr()
    assert "| gemm | NVIDIA H200 | 1 | 1.200 |" in captured.out and "Mystery" not in captured.out
    assert "note: measured rows of 'NVIDIA Mystery GPU' skipped: no hardware JSON describes it; write one with " \
           "python3 profile_operators.py --hardware_json PATH" in captured.err
    (tmp_path / "measured" / "H200" / "gemm.csv").unlink()
    assert run_cli(crosscheck.main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: no measured GPU under" in err and "(NVIDIA Mystery GPU); write one with" in err
    # one GPU's folder given instead of the folder of GPU folders
    folder = tmp_path / "measured" / "NVIDIA_Mystery_GPU"
    assert run_cli(crosscheck.main, ["--measured_dir", str(folder), "--dataset_dir", str(tmp_path)]) == 2
    assert f"holds one GPU's <op>.csv; give the folder above it, --measured_dir {folder.parent}" in \
        capsys.readouterr().err


def test_onboard_leaves_out_a_file_of_stand_in_kernels(tmp_path, capsys):
    """dataset/measured/<gpu>/*.csv of a GPU measured without FlashInfer holds a siluandmul.csv of eager rows only:
    the documented glob must still score the other files, leaving that one out with a WARNING."""
    import pandas as pd

    from pipeweave.predictor import KernelPredictor
    from pipeweave.profiler import onboard
    from pipeweave.profiler.csvio import columns_for

    shapes = pd.DataFrame({"M": [1, 8, 64, 512, 2048, 8192], "N": 4096, "K": 4096, "hardware": "H100"})
    predicted = KernelPredictor().predict_frame("gemm", shapes)["predicted_us"].to_numpy()
    gemm = pd.DataFrame([{**dict.fromkeys(columns_for("gemm"), ""), "op": "gemm", "M": m, "N": 4096, "K": 4096,
                          "hardware": "NVIDIA H100", "dtype": "bfloat16", "avg_duration": t}
                         for m, t in zip(shapes["M"], predicted)])
    gemm.to_csv(tmp_path / "gemm.csv", index=False)
    eager = pd.DataFrame([{**dict.fromkeys(columns_for("siluandmul"), ""), "op": "siluandmul", "seq": s,
                           "dim": 28672, "hardware": "NVIDIA H100", "dtype": "bfloat16", "avg_duration": 9.0,
                           "kernel": "torch silu(gate)*up [eager, 2 kernels]: a | b"} for s in (1, 16, 256, 1024)])
    eager.to_csv(tmp_path / "siluandmul.csv", index=False)
    files = [str(path) for path in sorted(tmp_path.glob("*.csv"))]
    assert run_cli(onboard.main, ["--hardware", "H100", "--kernels", *files]) == 0
    out = capsys.readouterr().out
    assert f"WARNING: --kernels {tmp_path / 'siluandmul.csv'}: every row timed another kernel" in out
    assert "install flashinfer); file left out" in out
    assert "| gemm |" in out and "| siluandmul |" not in out
    assert run_cli(onboard.main, ["--hardware", "H100", "--kernels", str(tmp_path / "siluandmul.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: no measured kernel is left: --kernels" in err[0]


def test_onboard_scores_zero_shot_and_a_calibration_on_the_other_half(tmp_path, capsys):
    import pandas as pd

    from pipeweave.predictor import KernelPredictor
    from pipeweave.profiler import onboard
    from pipeweave.profiler.csvio import columns_for

    shapes = pd.DataFrame({"M": [1, 8, 64, 512, 2048, 8192] * 2, "N": [4096] * 6 + [14336] * 6,
                           "K": [4096] * 6 + [5120] * 6, "hardware": "H100"})
    predicted = KernelPredictor().predict_frame("gemm", shapes)["predicted_us"].to_numpy()
    measured = pd.DataFrame([{**dict.fromkeys(columns_for("gemm"), ""), "op": "gemm", "M": m, "N": n, "K": k,
                              "hardware": "NVIDIA H100", "dtype": "bfloat16", "avg_duration": 1.3 * t}
                             for (m, n, k), t in zip(shapes[["M", "N", "K"]].itertuples(index=False), predicted)])
    path = tmp_path / "gemm.csv"
    measured.to_csv(path, index=False)
    assert onboard.main(["--hardware", "H100", "--kernels", str(path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| gemm |"))
    zero_shot, calibrated = (float(cell.split(" / ")[0]) for cell in row.strip("| ").split(" | ")[3:5])
    assert zero_shot == pytest.approx(100 * (1 - 1 / 1.3), abs=0.1)  # every kernel 1.3x slower than predicted
    assert calibrated < 8.0  # a GPU-wide 1.3x is what a calibration learns from the other half
    measured.head(3).to_csv(path, index=False)
    assert run_cli(onboard.main, ["--hardware", "H100", "--kernels", str(path)]) == 2
    assert "at least 4 are needed" in capsys.readouterr().err
    # a file in ms was scored at errors of 10^5 %; it is refused as calibrate.py refuses it, naming file and line
    measured.assign(avg_duration=measured["avg_duration"] / 1000).to_csv(path, index=False)
    assert run_cli(onboard.main, ["--hardware", "H100", "--kernels", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"--kernels {path}: line " in err and "times the zero-shot prediction" in err and "check the unit" in err


def test_paged_decode_calls_flash_attention_with_its_own_table_argument_and_page():
    """On Hopper with FlashAttention-3 the decode rows time its paged kernel (16-token pages, ``page_table``), the
    kernels the Hopper data and the analytical model describe; FlashAttention-2 takes ``block_table`` and pages of
    256 tokens (a review of the CUDA paths, 2026-12-05). Checked with fake modules that record the call."""
    import torch

    from pipeweave.profiler.runners import TorchRunners

    calls = []

    def record(q, k_cache, v_cache, **kwargs):
        calls.append((q.shape, k_cache.shape, v_cache.shape, kwargs))
        return q

    row = {"attention_type": "fa2_paged", "bs": 2, "q_lengths": "[1,1]", "kv_lengths": "[300,40]", "nh": 8,
           "nkv": 2, "hd": 64}
    for backend, module, table, page in (("fa3", "fa3", "page_table", 16), ("fa2", "fa2", "block_table", 256)):
        runners = TorchRunners("cpu", attn_backend="sdpa")
        setattr(runners, module, SimpleNamespace(flash_attn_with_kvcache=record))
        runners.decode_backend = backend
        prepared = runners.prepare("attn", row)
        prepared.fn()
        q_shape, k_shape, v_shape, kwargs = calls[-1]
        blocks = -(-300 // page) + -(-40 // page)
        assert q_shape == (2, 1, 8, 64) and k_shape == v_shape == (blocks, page, 2, 64)
        assert set(kwargs) == {"cache_seqlens", "causal", table} and kwargs["causal"] is True
        assert kwargs["cache_seqlens"].dtype == kwargs[table].dtype == torch.int32
        assert kwargs[table].shape == (2, -(-300 // page))
        assert f"page={page}" in prepared.backend


def test_clocks_are_read_from_the_gpu_with_the_devices_uuid(monkeypatch):
    """CUDA numbers GPUs fastest first and NVML by PCI bus, so NVML's handle of the same index can be another GPU's
    (a review of the CUDA paths, 2026-12-05): the handle is looked up by UUID, then PCI address, else no clocks."""
    import torch

    from pipeweave.profiler.device import nvml_handle

    asked = []

    def by_uuid(uuid):
        asked.append(uuid)
        if uuid != "GPU-1234":
            raise RuntimeError("not found")
        return "handle-by-uuid"

    def by_pci(address):
        asked.append(address)
        return "handle-by-pci"

    nvml = SimpleNamespace(nvmlDeviceGetHandleByUUID=by_uuid, nvmlDeviceGetHandleByPciBusId=by_pci,
                           nvmlDeviceGetHandleByIndex=lambda index: pytest.fail("looked up by index"))
    for uuid, expected in (("1234", "handle-by-uuid"), ("GPU-1234", "handle-by-uuid"), ("99", "handle-by-pci")):
        props = SimpleNamespace(uuid=uuid, pci_domain_id=0, pci_bus_id=0x41, pci_device_id=0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index, props=props: props)
        assert nvml_handle(nvml, 1) == expected
    assert asked[-1] == "00000000:41:00.0"
    nvml.nvmlDeviceGetHandleByPciBusId = lambda address: (_ for _ in ()).throw(RuntimeError("no"))
    assert nvml_handle(nvml, 1) is None  # no clocks rather than another GPU's


def test_a_row_that_breaks_the_cuda_context_ends_the_run_and_is_skipped_by_the_next(models, tmp_path):
    """An illegal memory access leaves the CUDA context unusable: the clean-up after the failed row raised again and
    ended the run with a traceback, and every rerun met the same row first (a review of the CUDA paths, 2026-12-05).
    The row is now recorded, the run ends with one message, and the next run skips it."""
    from pipeweave.profiler.session import BROKEN_ROWS_FILE, ContextBroken

    rows = {"gemm": [{"M": m, "N": 128, "K": 128} for m in (1, 2, 3)]}

    def prepare(op, row):
        if row["M"] == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return _fake_prepare()(op, row)

    def broken_context():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(ContextBroken, match=rf"gemm M=2 N=128 K=128 failed and left the GPU unable to run anything "
                                            rf"more \(RuntimeError: CUDA error: an illegal memory access was "
                                            rf"encountered\); it is recorded in .*{BROKEN_ROWS_FILE}, which the next "
                                            rf"run skips"):
        _run(rows, tmp_path, FakeTimer(), prepare=prepare, after_error=broken_context)
    again = _run(rows, tmp_path, FakeTimer(), prepare=prepare, after_error=broken_context)
    s = again.ops["gemm"]
    assert (s.already_done, s.broke_context, s.measured, s.failed) == (1, 1, 1, 0)
    assert "1 skipped: they broke the CUDA context in an earlier run" in again.lines()[0]
    assert len((tmp_path / "gemm.csv").read_text().splitlines()) == 3  # header + rows 1 and 3
