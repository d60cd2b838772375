"""End-to-end aggregator (pipeweave/aggregate.py, aggregator.py), the batched FA2 path and predict_kernels.py.

Models are untrained MLP_v2 networks written to a temporary directory in the real layout
(benchmarks.aggregator.write_untrained_models): the tests check plumbing, not accuracy.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analytical_model import fa2, fa2_batch, fa3
from analytical_model.attention import attention_problem
from analytical_model.hardware import load_hardware
from analytical_model.registry import compute_features, get_operator
from benchmarks.aggregator import write_untrained_models
from pipeweave import aggregate
from pipeweave.aggregate import Aggregator, Job, WorkloadFormatError, load_workload, parse_workload
from pipeweave.cli import UserError
from pipeweave.bounds import cold_fastest_us

from workload_copies import first_iterations

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "workload"
TP1 = WORKLOADS / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json"
TP1_FA3 = WORKLOADS / "Qwen2.5-14B_arxiv_8_fa3_tp1_pp1.json"
PP2 = WORKLOADS / "Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2.json"
TP2 = WORKLOADS / "Qwen3-32B_arxiv_12_fa2_tp2_pp1.json"



def small(path: Path, tmp_path: Path, iterations: int = 6, edit=None, name: str | None = None) -> Path:
    return first_iterations(path, tmp_path, iterations, edit, name)


def run_aggregator(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "aggregator.py"), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------------
# batched FA2 features: bit-identical to the per-launch calculator
# ---------------------------------------------------------------------------------------------------

def random_problems(rng, n):
    problems = []
    for i in range(n):
        bs = int(rng.integers(1, 24))
        nkv = int(rng.choice([1, 2, 4, 8]))
        nh = nkv * int(rng.choice([1, 2, 4, 8]))
        hd = int(rng.choice([64, 128, 256]))
        if i % 3 == 0:
            q, kv, kind = np.ones(bs, int), rng.integers(1, 40000, bs), "fa2_paged"
        elif i % 3 == 1:
            q = rng.integers(1, 4000, bs)
            kv, kind = q + rng.integers(0, 700, bs), "fa2_ragged"
        else:
            q = rng.integers(1, 64, bs)
            kv, kind = q + rng.integers(0, 9000, bs), "fa2_paged"
        _, p = attention_problem(kind, bs, q.tolist(), kv.tolist(), nh, nkv, hd, causal=bool(i % 5),
                                 data_size_q=int(rng.choice([1, 2])), data_size_kv=int(rng.choice([1, 2])))
        problems.append(p)
    return problems


@pytest.mark.parametrize("gpu", ["H100", "A100", "L40", "RTX PRO 6000 S", "H20"])
def test_fa2_batch_is_bit_identical(gpu):
    hw = load_hardware(gpu)
    problems = random_problems(np.random.default_rng(hash(gpu) % 2**32), 120)
    expected = np.vstack([fa2.features(p, hw) for p in problems])
    assert np.array_equal(fa2_batch.features_many(problems, hw), expected)
    # single problems and the empty batch
    assert np.array_equal(fa2_batch.features_many(problems[:1], hw), expected[:1])
    assert fa2_batch.features_many([], hw).shape == (0, 15)


def test_fa2_batch_matches_on_paper_workload_decode_steps():
    data = json.loads(PP2.read_text())
    hw = load_hardware("H800")
    problems = [attention_problem(a["attention_type"], a["bs"], a["q_lengths"], a["kv_lengths"], a["nh"], a["nkv"],
                                  a["hd"])[1]
                for a in (it["operators"]["attention"] for it in data["iterations"][1:60])]
    expected = np.vstack([fa2.features(p, hw) for p in problems])
    assert np.array_equal(fa2_batch.features_many(problems, hw), expected)


def test_registry_attention_rows_unchanged_by_fast_path():
    rows = [("fa2_paged", 3, "[1,1,1]", "[10,500,9000]"), ("fa3_ragged", 2, "[300,20]", "[300,20]"),
            ("fa2_ragged", 2, "[300,20]", "[310,20]")]
    frame = pd.DataFrame(rows, columns=["attention_type", "bs", "q_lengths", "kv_lengths"]).assign(
        nh=32, nkv=8, hd=128, hardware="H100")
    got = compute_features("attn", frame)[list(get_operator("attn").feature_names)].to_numpy()
    hw = load_hardware("H100")
    expected = []
    for kind, bs, q, kv in rows:
        key, p = attention_problem(kind, bs, json.loads(q), json.loads(kv), 32, 8, 128)
        expected.append((fa2 if key == "fa2" else fa3).features(p, hw))
    assert np.array_equal(got, np.vstack(expected))


# ---------------------------------------------------------------------------------------------------
# output schema, dedup vs naive, sweep
# ---------------------------------------------------------------------------------------------------

def test_output_schema_and_key_order(models, tmp_path):
    workload = load_workload(small(PP2, tmp_path))
    agg = Aggregator(model_dir=models, log=None)
    result = agg.predict([Job(workload, agg.gpu("H20"))])[0].result
    assert list(result) == ["model", "hardware", "tp_size", "pp_size", "iterations", "summary", "extrapolation",
                            "interval"]
    assert result["hardware"] == "NVIDIA H20" and (result["tp_size"], result["pp_size"]) == (4, 2)
    assert list(result["summary"]) == list(aggregate.SUMMARY_KEYS)
    first = result["iterations"][0]
    assert list(first) == ["iteration", "phase", "operator_durations", "total_duration_ms"]
    assert list(first["operator_durations"]) == ["gemm", "attention", "rmsnorm", "siluandmul", "communication"]
    assert list(first["operator_durations"]["gemm"]) == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"]
    assert list(first["operator_durations"]["communication"]) == ["all_reduce", "send_recv"]
    entry = first["operator_durations"]["attention"]
    assert list(entry) == ["single_duration_ms", "count", "total_duration_ms"]
    # total = round(single × count) with the unrounded single: within count × 0.5e-6 of rounded single × count
    assert entry["total_duration_ms"] == pytest.approx(entry["single_duration_ms"] * entry["count"],
                                                       abs=entry["count"] * 1e-6)
    for it in result["iterations"]:
        gemms = it["operator_durations"]["gemm"].values()
        for value in (it["total_duration_ms"], *(e["single_duration_ms"] for e in gemms)):
            assert value > 0 and round(value, 6) == value
    text = aggregate.dumps_result(result)
    assert text.startswith('{\n  "model": ') and json.loads(text) == result
    # no communication key in TP1 workloads
    tp1 = agg.predict([Job(load_workload(small(TP1, tmp_path)), agg.gpu("A100"))])[0].result
    assert "communication" not in tp1["iterations"][0]["operator_durations"]


def naive_prediction(agg: Aggregator, path: Path, gpu: str) -> dict:
    """The reference's structure: every operator of every iteration on its own (batch of 1), per-launch
    calculators, Python sums; collectives with the same predictor."""
    data = json.loads(path.read_text())
    hw = load_hardware(gpu)
    predictor = agg.predictor
    coll = agg.collective_predictor(Job(load_workload(path), hw)) if data["iterations"][0]["operators"].get(
        "communication") else None

    def kernel_ms(op, frame):
        if op == "attn":
            row = frame.iloc[0]
            key, p = attention_problem(row["attention_type"], int(row["bs"]), list(row["q_lengths"]),
                                       list(row["kv_lengths"]), int(row["nh"]), int(row["nkv"]), int(row["hd"]))
            feats = (fa2 if key == "fa2" else fa3).features(p, hw)[None, :]
        else:
            feats = get_operator(op).features(frame, hw)
        described = get_operator(op).describe(frame, hw)
        ideal = get_operator(op).ideal_cycles(feats.astype(np.float32)).astype(np.float64)
        eff = predictor.kernel_efficiency(op, feats, described, hw)
        cold_us = cold_fastest_us(op, frame, hw.mem_bandwidth)[0]  # weights and cached KV come from DRAM
        return max(float(ideal[0] / (eff[0] * hw.sm_freq) / 1000.0), cold_us / 1000.0)

    totals, phases, singles = [], [], []
    for it in data["iterations"]:
        ops = it["operators"]
        total = 0.0
        for g in ops["gemm"]:
            ms = kernel_ms("gemm", pd.DataFrame([{"M": g["M"], "N": g["N"], "K": g["K"]}]))
            singles.append(ms)
            total += ms * g["count"]
        a = ops["attention"]
        ms = kernel_ms("attn", pd.DataFrame([{k: a[k] for k in ("attention_type", "bs", "q_lengths", "kv_lengths",
                                                                 "nh", "nkv", "hd")}]))
        singles.append(ms)
        total += ms * a["count"]
        for name in ("rmsnorm", "siluandmul"):
            ms = kernel_ms(name, pd.DataFrame([{"seq": ops[name]["seq"], "dim": ops[name]["dim"]}]))
            singles.append(ms)
            total += ms * ops[name]["count"]
        for c in ops.get("communication", []):
            kind = "all_reduce" if "all_reduce" in c["name"] else "send_recv"
            workers = data["tp_size"] if kind == "all_reduce" else 2
            ms = float(coll.predict_ms(kind, c["volume_bytes"], workers))
            singles.append(ms)
            total += ms * c["count"]
        totals.append(total)
        phases.append(it["phase"])
    return {"totals": totals, "singles": singles, "summary": aggregate.summarize(phases, totals)}


@pytest.mark.parametrize("path,gpu", [(PP2, "H20"), (TP1, "L40"), (TP1_FA3, "H100")])
def test_dedup_batched_equals_naive_per_iteration(models, tmp_path, path, gpu):
    workload_path = small(path, tmp_path, iterations=8)
    agg = Aggregator(model_dir=models, log=None)
    result = agg.predict([Job(load_workload(workload_path), agg.gpu(gpu))])[0].result
    naive = naive_prediction(agg, workload_path, gpu)
    got_totals = [it["total_duration_ms"] for it in result["iterations"]]
    # features are bit-identical (tested above); the MLP runs in float32, where batch-1 and batched matrix
    # products may differ in the last bits (~1e-7 relative): that is the only tolerance needed
    np.testing.assert_allclose(got_totals, np.round(naive["totals"], 6), rtol=1e-6, atol=2e-6)
    got_singles = [e["single_duration_ms"] for it in result["iterations"]
                   for cat in it["operator_durations"].values()
                   for e in (cat.values() if "count" not in cat else [cat])]
    np.testing.assert_allclose(got_singles, np.round(naive["singles"], 6), rtol=1e-6, atol=2e-6)
    for key in aggregate.SUMMARY_KEYS:
        assert result["summary"][key] == pytest.approx(naive["summary"][key], rel=1e-6)


def test_dedup_features_identical_to_per_row(models, tmp_path):
    workload = load_workload(small(PP2, tmp_path, iterations=12))
    agg = Aggregator(model_dir=models, log=None)
    hw = load_hardware("H20")
    keys = [("H20", s) for s in workload.shapes["attn"]]
    batched, _ = agg.kernel_features("attn", keys)
    per_row = []
    for kind, bs, q, kv, nh, nkv, hd in workload.shapes["attn"]:
        key, p = attention_problem(kind, bs, q, kv, nh, nkv, hd)
        per_row.append((fa2 if key == "fa2" else fa3).features(p, hw))
    assert np.array_equal(batched, np.vstack(per_row))


def test_sweep_mode_matches_single_runs(models, tmp_path):
    w1 = small(TP1, tmp_path, 5)
    w2 = small(TP1_FA3, tmp_path, 4)
    out_dir = tmp_path / "sweep"
    proc = run_aggregator("--workload", w1, w2, "--hardware", "A100,RTX 6000 Ada", "--model_dir", models,
                          "--output", out_dir)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == sorted(f"{w.stem}_{g}.json" for w in (w1, w2) for g in ("A100", "RTX_6000_Ada"))
    assert proc.stdout.count("Prefill duration:") == 4 and "Predicted 4 pairs" in proc.stdout
    agg = Aggregator(model_dir=models, log=None)
    single = agg.predict([Job(load_workload(w2), agg.gpu("RTX 6000 Ada"))])[0].result
    swept = json.loads((out_dir / f"{w2.stem}_RTX_6000_Ada.json").read_text())
    np.testing.assert_allclose([it["total_duration_ms"] for it in swept["iterations"]],
                               [it["total_duration_ms"] for it in single["iterations"]], rtol=1e-6)
    # --pairs: explicit matrix from standard input, per-pair collective hardware
    pairs = f"workload,hardware,collective_hardware\n# comment\n{w1},A40,\n{small(TP2, tmp_path, 3)},H100,H100\n"
    proc = subprocess.run([sys.executable, str(REPO / "aggregator.py"), "--pairs", "-", "--model_dir", str(models),
                           "--output", str(tmp_path / "pairs")], input=pairs, capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "pairs").iterdir()) == sorted(
        [f"{w1.stem}_A40.json", f"{TP2.stem}_H100.json"])
    assert "Communication: H100 collective models (all_reduce)" in proc.stdout


def test_prefill_iterations_are_summed_and_decode_is_the_rest(models, tmp_path):
    def two_prefills(data):
        second = copy.deepcopy(data["iterations"][0])
        second["iteration"] = 2
        data["iterations"].insert(1, second)
        for i, it in enumerate(data["iterations"], start=1):
            it["iteration"] = i

    path = small(TP1, tmp_path, 4, name="two_prefills.json", edit=two_prefills)
    agg = Aggregator(model_dir=models, log=None)
    result = agg.predict([Job(load_workload(path), agg.gpu("A100"))])[0].result
    totals = [it["total_duration_ms"] for it in result["iterations"]]
    assert result["iterations"][0]["total_duration_ms"] == result["iterations"][1]["total_duration_ms"]
    assert result["summary"]["prefill_duration_ms"] == pytest.approx(totals[0] + totals[1], abs=2e-6)
    assert result["summary"]["decode_avg_duration_ms"] == pytest.approx(np.mean(totals[2:]), abs=2e-6)
    assert result["summary"]["total_duration_ms"] == pytest.approx(sum(totals), abs=5e-6)


def test_collective_workers_all_reduce_tp_and_send_recv_two(models, tmp_path, monkeypatch):
    calls = []

    class Fake:
        hardware = "H20"
        used_analytical: set = set()

        def available(self, kind):
            return True

        def worker_counts(self, kind):
            return [2, 4, 8]

        def predict_ms(self, kind, size, workers):
            calls.append((kind, workers))
            return np.full(np.shape(size), 0.5)

        def borrowed(self, kind, workers):
            return None

    agg = Aggregator(model_dir=models, log=None)
    monkeypatch.setattr(agg, "collective_predictor", lambda job: Fake())
    result = agg.predict([Job(load_workload(small(PP2, tmp_path, 3)), agg.gpu("H20"))])[0].result
    assert sorted(set(calls)) == [("all_reduce", 4), ("send_recv", 2)]
    comm = result["iterations"][1]["operator_durations"]["communication"]
    assert comm["all_reduce"] == {"single_duration_ms": 0.5, "count": 160, "total_duration_ms": 80.0}
    assert comm["send_recv"]["single_duration_ms"] == 0.5


def test_analytical_collective_estimate_is_explicit_and_warned(models, tmp_path):
    empty = tmp_path / "no_collectives"
    empty.mkdir()
    path = small(TP2, tmp_path, 3)
    with pytest.raises(UserError, match="--collective_estimate analytical"):
        Aggregator(model_dir=models, collective_dir=empty, collective_estimate="model", log=None).predict(
            [Job(load_workload(path), load_hardware("L20"))])
    lines = []
    agg = Aggregator(model_dir=models, collective_dir=empty, log=lines.append)  # analytical is the default
    prediction = agg.predict([Job(load_workload(path), agg.gpu("L20"))])[0]
    warnings = [line for line in lines if line.startswith("WARNING") and "collective" in line]
    assert len(warnings) == 1 and "ANALYTICAL" in warnings[0] and "CollectivePredictor.analytical_ms" in warnings[0]
    assert "ANALYTICAL" in prediction.collective_source
    assert prediction.result["iterations"][0]["operator_durations"]["communication"]["all_reduce"][
        "single_duration_ms"] > 0
    # the output says so too, and only where it happened (a TP1 job beside it has no collectives)
    assert prediction.result["extrapolation"]["analytical_collectives"] == {
        "kinds": ["all_reduce"], "link_of": "L20", "ring_efficiency": {"all_reduce": {
            "factor": 1.0, "basis": f"textbook ring: {empty} has no trained collective models"}},
        "interval": {"all_reduce": None}}
    assert "point value" in prediction.result["interval"]["note"]  # nothing evaluated the estimate here
    # with the committed models, the bandwidth term carries the ring efficiency measured on other PCIe 4 GPUs
    lines.clear()
    trained = Aggregator(model_dir=models, log=lines.append).predict([Job(load_workload(path), agg.gpu("L20"))])[0]
    ring = trained.result["extrapolation"]["analytical_collectives"]["ring_efficiency"]["all_reduce"]
    assert ring["basis"].endswith("(pcie4, 2 workers)") and 1.2 < ring["factor"] < 4
    low, high = trained.result["extrapolation"]["analytical_collectives"]["interval"]["all_reduce"]
    assert low < 1 < high and "note" not in trained.result["interval"]  # every collective carries the interval
    warning = next(line for line in lines if "ANALYTICAL" in line)
    assert f"x {ring['factor']:.2f}, the ring efficiency {ring['basis']}" in warning
    both = agg.predict([Job(load_workload(small(TP1, tmp_path, 2)), agg.gpu("L20")),
                        Job(load_workload(path), agg.gpu("L20"))])
    assert "analytical_collectives" not in both[0].result["extrapolation"]
    assert "analytical_collectives" in both[1].result["extrapolation"]


def test_quantile_models_give_optimistic_summary(models, tmp_path):
    quantile = write_untrained_models(tmp_path / "quantile", ops=("gemm", "attn"),
                                      efficiency={"gemm": 0.9, "attn": 0.9}, quantile=True)
    agg = Aggregator(model_dir=models, quantile_dir=quantile, log=None)
    summary = agg.predict([Job(load_workload(small(TP1, tmp_path, 4)), agg.gpu("A100"))])[0].result["summary"]
    assert list(summary)[:4] == list(aggregate.SUMMARY_KEYS)
    assert [k for k in summary if k.startswith("optimistic_")] == [f"optimistic_{k}" for k in aggregate.SUMMARY_KEYS]
    assert 0 < summary["optimistic_total_duration_ms"] < summary["total_duration_ms"]
    assert agg.quantile_ops == {"gemm": True, "attn": True, "rmsnorm": False, "siluandmul": False}
    # a model of the other kind in either folder would silently stand in for the one asked for
    for point, quantiles in ((quantile, quantile), (models, models)):
        swapped = Aggregator(model_dir=point, quantile_dir=quantiles, log=None)
        with pytest.raises(Exception, match="holds a (quantile|point) model, where (point|quantile) models are read"):
            swapped.predict([Job(load_workload(small(TP1, tmp_path, 4)), swapped.gpu("A100"))])


# ---------------------------------------------------------------------------------------------------
# validation messages (in-process) and CLI errors (subprocess: one line, exit 2, no output file)
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("edit,message", [
    (lambda d: d["iterations"][2]["operators"]["gemm"][1].update(M=-5),
     "iteration 3: operators.gemm[1].M must be a positive integer, got -5"),
    (lambda d: d["iterations"][1]["operators"]["attention"].update(q_lengths=[1, 2]),
     "iteration 2: operators.attention.q_lengths has 2 entries but bs is 8"),
    (lambda d: d["iterations"][0]["operators"]["attention"].update(attention_type="xformers"),
     "iteration 1: operators.attention.attention_type: unknown attention_type"),
    (lambda d: d["iterations"][3]["operators"].update(mamba={"M": 1}),
     "iteration 4: unknown operator class operators.mamba"),
    (lambda d: d["iterations"][3]["operators"].update(moe={"M": 1}), "iteration 4: operators.moe must be a list"),
    (lambda d: d["iterations"][3]["operators"].update(moe=[{"name": "x", "weight_type": "w3", "M": 1}]),
     "iteration 4: operators.moe[0].weight_type must be one of w13, w2, layer, got 'w3'"),
    (lambda d: d.update(dtype="fp16"), "dtype must be one of bf16, fp8, got 'fp16'"),
    (lambda d: d["iterations"][0]["operators"]["rmsnorm"].update(count=1.5),
     "iteration 1: operators.rmsnorm.count must be a positive integer"),
    (lambda d: d["iterations"][1].update(phase="warmup"), "iteration 2: phase must be"),
    (lambda d: d["iterations"][0]["operators"].update(communication=[{"name": "all_to_all", "type": "collective",
                                                                     "volume_bytes": 4, "count": 1}]),
     "iteration 1: operators.communication[0]: unknown collective 'all_to_all'"),
    (lambda d: d.update(tp_size=0), "tp_size must be a positive integer"),
    (lambda d: d.update(iterations=[]), "'iterations' must be a non-empty list"),
    # the iteration's description of its batch is not predicted from, but nonsense there was read without a word
    (lambda d: d["iterations"][1].update(batch_size="8"),
     "iteration 2: batch_size must be a positive integer up to 65,536, got '8'"),
    (lambda d: d["iterations"][0].update(num_tokens=-3), "iteration 1: num_tokens must be a positive integer"),
    (lambda d: d["iterations"][0].update(q_lengths=[-1] * 8),
     "iteration 1: q_lengths entries must be positive integers, got -1"),
    (lambda d: d["iterations"][2].update(kv_lengths=[5]), "iteration 3: kv_lengths has 1 entries but batch_size is 8"),
    (lambda d: d["iterations"][2].update(kv_lengths="5,5"),
     "iteration 3: kv_lengths must be a non-empty list of positive integers"),
    # a misspelt or misplaced field would be ignored without a word: refused, naming it and what the entry takes
    (lambda d: d["iterations"][0]["operators"]["gemm"][0].update(dtype="fp8"),
     "iteration 1: operators.gemm[0]: unknown field 'dtype' (a typo, or a field of another level?); this entry takes "
     "count, K, M, N, name, type"),
    (lambda d: d.update(dtyp="fp8"), "workload: unknown field 'dtyp'"),
    (lambda d: d["iterations"][1].update(tokens=3), "iteration 2: unknown field 'tokens'"),
    (lambda d: d["iterations"][0]["operators"]["attention"].update(causal=True),
     "iteration 1: operators.attention: unknown field 'causal'"),
    (lambda d: d["iterations"][0]["operators"]["rmsnorm"].update(eps=1e-6),
     "iteration 1: operators.rmsnorm: unknown field 'eps'"),
    (lambda d: d["iterations"][0]["operators"]["communication"].append(
        {"name": "all_reduce", "type": "all_reduce", "volume_bytes": 4, "count": 1, "workers": 2}),
     "iteration 1: operators.communication[0]: unknown field 'workers'"),
])
def test_malformed_workload_names_iteration_and_field(edit, message):
    data = json.loads(TP1.read_text())
    data["iterations"] = data["iterations"][:5]
    edit(data)
    with pytest.raises(WorkloadFormatError) as info:
        parse_workload(data, "w.json")
    assert message in str(info.value)


def assert_cli_error(proc: subprocess.CompletedProcess, *needles: str, output: Path | None = None):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aggregator.py: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0]
    if output is not None:
        assert not output.exists()


def test_cli_unknown_gpu_lists_known(models, tmp_path):
    out = tmp_path / "out.json"
    proc = run_aggregator("--workload", small(TP1, tmp_path, 3), "--hardware", "Z100", "--model_dir", models,
                          "--output", out)
    assert_cli_error(proc, "unknown GPU 'Z100'", "H100", "RTX 6000 Ada", output=out)


def test_cli_malformed_workload(models, tmp_path):
    path = small(TP1, tmp_path, 4, edit=lambda d: d["iterations"][2]["operators"]["gemm"][1].update(M=-5))
    out = tmp_path / "out.json"
    proc = run_aggregator("--workload", path, "--hardware", "A100", "--model_dir", models, "--output", out)
    assert_cli_error(proc, "iteration 3: operators.gemm[1].M must be a positive integer", output=out)


def test_cli_refuses_to_overwrite_its_workload(models, tmp_path):
    path = small(TP1, tmp_path, 3)
    before = path.read_bytes()
    proc = run_aggregator("--workload", path, "--hardware", "A100", "--model_dir", models, "--output", path)
    assert_cli_error(proc, f"--output {path} would overwrite the workload {path}")
    assert path.read_bytes() == before


def test_cli_finishes_its_work_when_the_reader_of_its_log_goes(models, tmp_path):
    """``aggregator.py ... | head -1``: the log's reader leaves early, and the prediction file is written anyway."""
    out = tmp_path / "out.json"
    command = (f'"{sys.executable}" "{REPO / "aggregator.py"}" --workload "{small(TP1, tmp_path, 3)}" --hardware A100 '
               f'--model_dir "{models}" --output "{out}" | true; exit "${{PIPESTATUS[0]}}"')
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert json.loads(out.read_text())["summary"]["total_duration_ms"] > 0


def test_cli_warns_of_attention_types_no_gpu_measured(models, tmp_path):
    """Hopper's FA3 decode kernels are measured under fa2_paged: a workload decoding with fa3_paged is predicted from
    extrapolated features (66 % slower on H100 for Llama-3.1-8B), never without a word."""
    path = small(TP1, tmp_path, 3, edit=lambda d: [it["operators"]["attention"].update(attention_type="fa3_paged")
                                                   for it in d["iterations"][1:]])
    proc = run_aggregator("--workload", path, "--hardware", "H100", "--model_dir", models, "--output",
                          tmp_path / "out.json")
    assert proc.returncode == 0, proc.stderr
    assert "uses fa3_paged, which no GPU's attention measurements hold" in proc.stdout
    plain = run_aggregator("--workload", small(TP1, tmp_path, 3), "--hardware", "A100", "--model_dir", models,
                           "--output", tmp_path / "plain.json")
    assert plain.returncode == 0 and "no GPU's attention measurements" not in plain.stdout


def test_cli_communication_without_collective_model(models, tmp_path):
    empty = tmp_path / "no_collectives"
    empty.mkdir()
    out = tmp_path / "out.json"
    proc = run_aggregator("--workload", small(TP2, tmp_path, 3), "--hardware", "A100", "--model_dir", models,
                          "--collective_dir", empty, "--collective_estimate", "model", "--output", out)
    # a folder without models: no --collective_hardware can help, only the estimate
    assert_cli_error(proc, "communication", "no GPU has measured models", "--collective_estimate analytical",
                     output=out)
    proc = run_aggregator("--workload", small(TP2, tmp_path, 3), "--hardware", "A100", "--model_dir", models,
                          "--collective_dir", empty, "--output", out)  # default: warned estimate, no crash
    assert proc.returncode == 0 and "WARNING" in proc.stdout + proc.stderr and out.is_file()
    assert "plain ring estimate" in proc.stdout + proc.stderr  # the empty folder has no custom all-reduce fit


def test_cli_missing_model_names_file_and_training_command(tmp_path):
    out = tmp_path / "out.json"
    proc = run_aggregator("--workload", small(TP1, tmp_path, 3), "--hardware", "A100", "--model_dir",
                          tmp_path / "nothing", "--output", out)
    assert_cli_error(proc, "gemm_mlp_weights.npz", "python3 train_mlp.py --op gemm", output=out)


def test_cli_sweep_needs_output_directory(models, tmp_path):
    proc = run_aggregator("--workload", small(TP1, tmp_path, 3), "--hardware", "A100,H100", "--model_dir", models,
                          "--output", tmp_path / "x.json")
    assert_cli_error(proc, "must be a directory", output=tmp_path / "x.json")


def test_one_pair_into_a_folder_named_with_a_trailing_slash(tmp_path):
    from pipeweave.aggregate import output_targets

    job = Job(load_workload(TP1), load_hardware("A100"))
    folder = tmp_path / "new_folder"
    assert output_targets([job], f"{folder}/") == [folder / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_A100.json"]
    assert output_targets([job], str(folder)) == [folder]  # without the slash: the file's own name


def test_sweep_lists_pairs_that_do_not_fit_or_cannot_run_and_writes_the_others(models, tmp_path):
    """One pair too large for its GPU's memory, or an FP8 workload on a GPU without FP8 tensor cores, is one
    failure of the sweep: the other pairs are written, the failures listed, the exit status 2."""
    def fp8(data):
        data["dtype"] = "fp8"
        for iteration in data["iterations"]:
            iteration["operators"]["gemm_fp8"] = iteration["operators"].pop("gemm")

    big = small(TP2, tmp_path, 3, edit=lambda d: d["model_params"].update(num_hidden_layers=640), name="big.json")
    quantised = small(TP1_FA3, tmp_path, 3, edit=fp8, name="fp8.json")
    out_dir = tmp_path / "sweep"
    proc = run_aggregator("--workload", big, quantised, "--hardware", "A100,H100", "--model_dir", models,
                          "--output", out_dir)
    assert proc.returncode == 2
    assert "not predicted: big on A100: does not fit in GPU memory" in proc.stderr
    assert "not predicted: fp8 on A100: A100 has no FP8 tensor-core rate" in proc.stderr
    assert "3 of 4 pairs could not be predicted" in proc.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["fp8_H100.json"]


def test_predict_kernels_checks_attention_lengths(models, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text('attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd,hardware\n'
                   'fa2_paged,1,[1],[1000],32,8,128,H100\nfa2_paged,1,[1],[100000000000],32,8,128,H100\n')
    out = tmp_path / "out.csv"
    proc = subprocess.run([sys.executable, str(REPO / "predict_kernels.py"), "--op", "attn", "--input", str(src),
                           "--output", str(out), "--model_dir", str(models)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "row 2 (CSV line 3): a kv_length of 100000000000 exceeds" in proc.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------
# predict_kernels.py
# ---------------------------------------------------------------------------------------------------

def test_predict_kernels_passes_columns_through(models, tmp_path, monkeypatch):
    from pipeweave.kernels import main

    src = tmp_path / "in.csv"
    src.write_text('M,N,K,hardware,note\n16,4096,4096,H100,"a,b"\n4096,4096,4096,RTX_6000_Ada,x\n')
    out = tmp_path / "out.csv"
    assert main(["--op", "gemm", "--input", str(src), "--output", str(out), "--model_dir", str(models)]) == 0
    frame = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(frame.columns) == ["M", "N", "K", "hardware", "note", "predicted_us", "low_us", "high_us",
                                   "extrapolation"]
    assert frame["note"].tolist() == ["a,b", "x"] and frame["hardware"].tolist() == ["H100", "RTX_6000_Ada"]
    assert (frame["predicted_us"].astype(float) > 0).all()
    agg = Aggregator(model_dir=models, log=None)
    keys = [("H100", (16, 4096, 4096))]
    # predict_kernels predicts the benchmark, which may find the weights in the L2; a workload reads them from DRAM
    monkeypatch.setattr(Aggregator, "cold_floor_ms", lambda self, op, rows: np.zeros(len(rows)))
    expected = agg.kernel_durations("gemm", keys, *agg.kernel_features("gemm", keys))[0][0] * 1000
    assert float(frame["predicted_us"][0]) == pytest.approx(expected, rel=1e-6)


def test_predict_kernels_unknown_gpu_names_row(models, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("seq,dim,hardware\n8,4096,A100\n8,4096,Z9\n")
    out = tmp_path / "out.csv"
    proc = subprocess.run([sys.executable, str(REPO / "predict_kernels.py"), "--op", "rmsnorm", "--input", str(src),
                           "--output", str(out), "--model_dir", str(models)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        proc.stderr.strip()] and "row 2 (CSV line 3): unknown GPU 'Z9'" in proc.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------
# with the shipped trained models
# ---------------------------------------------------------------------------------------------------

def test_paper_workload_with_trained_models(tmp_path):
    """The shipped models on a paper workload: a decode step reads every BF16 weight of Qwen2.5-14B once, so it
    takes at least their bytes over A100's 2039 GB/s, and no more than a few times that (measured: 1.6x)."""
    from pipeweave.memory import parameter_count
    from pipeweave.workload import load_model_config

    agg = Aggregator(log=None)
    result = agg.predict([Job(load_workload(small(TP1, tmp_path, 10)), agg.gpu("A100"))])[0].result
    summary = result["summary"]
    assert 0 < summary["decode_avg_duration_ms"] < summary["prefill_duration_ms"] < summary["total_duration_ms"]
    weights_ms = 2 * parameter_count(load_model_config("Qwen2.5-14B")) / 2039.04e9 * 1e3
    assert weights_ms < summary["decode_avg_duration_ms"] < 3 * weights_ms


def test_a_summary_without_decode_iterations_holds_floats_as_with_them():
    """A prefill-only workload's decode_total_duration_ms was the int 0 beside float fields."""
    from pipeweave.report import summarize

    summary = summarize(["prefill"], [12.5])
    assert summary["decode_total_duration_ms"] == 0.0 and all(isinstance(v, float) for v in summary.values())


def test_a_misspelt_collective_dir_is_an_error(models, tmp_path):
    """A --collective_dir that does not exist gave the textbook ring estimate with one WARNING and exit 0 (9853.5
    against 9826.3 ms for a TP2 run on A100), and calibrate.py fitted its communication factors against it."""
    import pipeweave

    out = tmp_path / "p.json"
    proc = run_aggregator("--workload", TP2, "--hardware", "A100", "--model_dir", models,
                          "--collective_dir", tmp_path / "collective_modles", "--output", out)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and not out.exists()
    assert "--collective_dir: collective model directory not found" in proc.stderr
    with pytest.raises(FileNotFoundError, match="^collective_dir: collective model directory not found"):
        pipeweave.predict_workload(TP2, "A100", model_dir=models, collective_dir=tmp_path / "nowhere")


def test_output_dash_writes_the_prediction_to_standard_output(models, tmp_path):
    """--output - wrote a file named '-' (predict_kernels.py already took it for standard output)."""
    proc = run_aggregator("--workload", TP2, "--hardware", "A100", "--model_dir", models, "--output", "-",
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"]["total_duration_ms"] > 0 and not list(tmp_path.iterdir())
    assert "Predictions saved to standard output" in proc.stderr
    several = run_aggregator("--workload", TP2, "--hardware", "A100,H100", "--model_dir", models, "--output", "-",
                             cwd=tmp_path)
    assert several.returncode == 2 and "with 2 (workload, GPU) pairs give --output DIRECTORY" in several.stderr


def test_predict_kernels_reads_standard_input_and_folders_are_named_as_folders(models, tmp_path):
    """--input - was "input CSV not found: -" although --output - writes to standard output; a folder given as a
    file was reported as "not found" (predict_kernels, aggregator, calibrate)."""
    shapes = "M,N,K,hardware\n4096,4096,4096,H100\n"
    piped = subprocess.run([sys.executable, str(REPO / "predict_kernels.py"), "--op", "gemm", "--input", "-",
                            "--output", "-", "--model_dir", str(models)], input=shapes, capture_output=True,
                           text=True, cwd=tmp_path, timeout=120)
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert lines[0].startswith("M,N,K,hardware,predicted_us") and len(lines) == 2
    for script, args, message in (
            ("predict_kernels.py", ["--op", "gemm", "--input", str(tmp_path), "--output", "x.csv"], "input CSV"),
            ("aggregator.py", ["--workload", str(tmp_path), "--hardware", "A100"], "workload"),
            ("calibrate.py", ["--hardware", "A100", "--e2e", str(tmp_path), "--output", "c.json"], "--e2e file")):
        proc = subprocess.run([sys.executable, str(REPO / script), *args], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)
        assert proc.returncode == 2 and f"{message} {tmp_path} is a directory" in proc.stderr, (script, proc.stderr)


def test_a_worker_count_no_gpu_measured_says_so_and_offers_the_estimate(models):
    """"GPUs with measured models for all_reduce with 16 workers: none; give --collective_hardware one of them"."""
    from pipeweave.serving.run import ServingConfig, simulate_config
    from pipeweave.engine import Engine

    with pytest.raises(UserError, match="no GPU has measured models for all_reduce with 16 workers; give "
                                        "--collective_estimate analytical for the warned estimate"):
        simulate_config(ServingConfig("Llama-3.1-70B", "splitwise_48", "H100", tp=16, num_requests=2),
                        Engine(model_dir=models, collective_estimate="model", log=None))


def test_predict_kernels_warns_of_attention_the_aggregator_would_warn_of(models, tmp_path):
    """FA3 on a GPU that cannot run it and an attention type no GPU measured were predicted without a word by
    predict_kernels.py, although the aggregator warns of both in a workload."""
    shapes = tmp_path / "attn.csv"
    shapes.write_text("attention_type,bs,q_lengths,kv_lengths,nh,nkv,hd,hardware\n"
                      "fa3_ragged,1,[1024],[1024],16,2,128,A100\nfa3_paged,1,[1],[1024],16,2,128,H100\n"
                      "fa2_paged,1,[1],[1024],16,2,128,H100\n")
    proc = subprocess.run([sys.executable, str(REPO / "predict_kernels.py"), "--op", "attn", "--input", str(shapes),
                           "--output", str(tmp_path / "out.csv"), "--model_dir", str(models)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("WARNING") and "uses fa3" in line]
    assert len(warnings) == 2, proc.stdout
    assert "uses fa3_ragged (FlashAttention-3, Hopper only) but A100 is ampere" in warnings[0]
    assert "uses fa3_paged, which no GPU's attention measurements hold" in warnings[1]


def test_a_split_without_its_communication_is_warned_of(models, tmp_path):
    """tp_size 2 on a workload without an all-reduce (a hand edit) was predicted as TP1 while the memory check took
    TP2, without a word."""
    edited = small(TP1, tmp_path, 3, edit=lambda d: d.update(tp_size=2, pp_size=2), name="split")
    proc = run_aggregator("--workload", edited, "--hardware", "A100", "--model_dir", models, "--output",
                          tmp_path / "out.json")
    assert proc.returncode == 0, proc.stderr
    assert ("WARNING: split has tp_size 2 without an all_reduce (TP ranks sum their partial results) and pp_size 2 "
            "without a send/recv") in proc.stdout
    consistent = run_aggregator("--workload", small(TP2, tmp_path, 3), "--hardware", "A100", "--model_dir", models,
                                "--collective_estimate", "analytical", "--output", tmp_path / "tp2.json")
    assert consistent.returncode == 0 and "without an all_reduce" not in consistent.stdout


@pytest.mark.parametrize("edit, message", [
    # a third user audit (2026-12-05): each of these was predicted without a word
    (lambda d: d.update(tp_size=1), r"iteration 1: operators.communication\[0\] is an all_reduce of the TP group, but "
                                    r"tp_size is 1 \(over one GPU it would cost nothing\)"),
    (lambda d: d.update(pp_size=65), r"pp_size 65 exceeds model_params.num_hidden_layers 64"),
    (lambda d: d.update(dtype="fp8"), r"dtype is 'fp8' but no iteration has an operators.gemm_fp8 entry"),
])
def test_top_level_fields_that_contradict_the_entries_are_refused(tmp_path, edit, message):
    """tp_size 1 on a TP2 workload costed its all-reduces at 0 ms; pp_size beyond the layers and dtype fp8 on BF16
    GEMMs (the memory check counting them at one byte) went through."""
    from pipeweave.schema import Workload, WorkloadFormatError

    data = json.loads(TP2.read_text())
    edit(data)
    with pytest.raises(WorkloadFormatError, match=rf"^w.json: {message}"):
        Workload.from_dict(data, "w.json")


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["model_params"].pop("num_experts"),
     r"iteration 1: operators.moe\[0\] is a fused-MoE layer, but model_params has no num_experts"),
    (lambda d: d["model_params"].update(num_experts=4),
     r"iteration 1: operators.moe\[0\] routes top-2 of E = 8 experts, but model_params says num_experts 4, "
     r"num_experts_per_tok 2"),
    (lambda d: [it["operators"].pop("moe") for it in d["iterations"]],
     r"model_params.num_experts is 8, but no iteration has an operators.moe entry"),
])
def test_model_params_that_contradict_the_fused_moe_entries_are_refused(edit, message):
    """A user audit (2026-12-05): without num_experts in model_params the memory check counted an MoE model as
    dense (Qwen3-235B-A22B passed on one H100 at 44 GB of weights instead of 470 GB); without the MoE entries its
    experts would not be predicted."""
    from pipeweave.schema import Workload, WorkloadFormatError
    from pipeweave.workload import build_workload, load_model_config

    data = build_workload(load_model_config("Mixtral-8x7B"), [10], 2, tp=2).to_dict()
    Workload.from_dict(data, "w.json")
    edit(data)
    with pytest.raises(WorkloadFormatError, match=rf"^w.json: {message}"):
        Workload.from_dict(data, "w.json")


def test_fp8_on_fused_moe_layers_is_refused():
    from pipeweave.schema import Workload, WorkloadFormatError
    from pipeweave.workload import build_workload, load_model_config

    data = build_workload(load_model_config("Mixtral-8x7B"), [10], 2, tp=2).to_dict()
    data["dtype"] = "fp8"
    data["iterations"][0]["operators"]["gemm_fp8"] = [dict(data["iterations"][0]["operators"]["gemm"][0])]
    with pytest.raises(WorkloadFormatError, match=r"iteration 1: dtype is 'fp8' but operators.moe holds fused-MoE "
                                                  r"layers, which pipeweave models in BF16 only"):
        Workload.from_dict(data, "w.json")
