"""Comparison of predictions with measured runs (pipeweave/compare.py, compare_pred_real.py,
compare_vllm_pred_real.py) on small synthetic files, plus the roofline baseline."""
from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analytical_model.hardware import load_hardware
from pipeweave import baselines, compare, measured_runs
from pipeweave.aggregate import load_workload

REPO = Path(__file__).resolve().parent.parent
TP2 = REPO / "workload" / "Qwen3-32B_arxiv_12_fa2_tp2_pp1.json"


def record(run, rep, prefill_s, decode_s, total_s):
    return json.dumps({"run_name": run, "batch_size": 8, "input_len": 100, "output_len": 10,
                       "total_prefill_tokens": 800, "total_decode_tokens": 80, "iteration": rep,
                       "prefill_latency": prefill_s, "prefill_throughput": 1.0, "median_decode_latency": decode_s,
                       "median_decode_throughput": 1.0, "total_latency": total_s, "overall_throughput": 1.0})


@pytest.fixture()
def synthetic(tmp_path):
    """Five repetitions of one TP1 and one TP2 run, one vLLM run, and matching predictions."""
    real = tmp_path / "real"
    real.mkdir()
    prefill = [1.0, 1.1, 1.2, 1.3, 5.0]  # median 1.2 s, best-of-repetitions would pick 1.0
    decode = [0.010, 0.011, 0.012, 0.013, 0.050]
    total = [2.0, 2.1, 2.2, 2.3, 9.0]
    (real / "e2e_A100.jsonl").write_text("\n".join(
        record("Qwen2.5-14B-arxiv_8", i, p, d, t) for i, (p, d, t) in enumerate(zip(prefill, decode, total))) + "\n")
    (real / "e2e_tp2_RTX_6000_Ada.jsonl").write_text("\n".join(
        record("Qwen3-32B-arxiv_12", i, 2.0 + i, 0.02, 4.0 + i) for i in range(5)) + "\n")
    # median 11.0 s, mean (and the file's avg_latency) 11.5 s: a mean taken for the median shows
    (real / "vllm_arxiv16_H800_llama70B.json").write_text(json.dumps(
        {"avg_latency": 11.5, "latencies": [10.0, 10.5, 11.0, 12.0, 14.0], "percentiles": {}}))
    pred = tmp_path / "pred"
    pred.mkdir()

    def write(name, prefill_ms, decode_ms, total_ms):
        (pred / name).write_text(json.dumps({"model": "m", "hardware": "h", "tp_size": 1, "pp_size": 1,
                                             "iterations": [], "summary": {
                                                 "prefill_duration_ms": prefill_ms, "decode_avg_duration_ms": decode_ms,
                                                 "decode_total_duration_ms": 0.0, "total_duration_ms": total_ms}}))

    write("Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_A100.json", 1000.0, 10.0, 2000.0)  # = the best repetition
    write("Qwen3-32B_arxiv_12_fa2_tp2_pp1_RTX_6000_Ada.json", 4000.0, 20.0, 6000.0)
    write("Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2_H800.json", 0.0, 0.0, 12000.0)
    write("not_a_prediction.json", 1.0, 1.0, 1.0)
    return real, pred


def test_summaries_are_median_min_max_over_repetitions(synthetic):
    real_dir, _ = synthetic
    summary = measured_runs.load_real(real_dir)
    row = summary[(summary["gpu"] == "A100")].iloc[0]
    assert (row["tp"], row["pp"], row["model"], row["trace"], row["repeats"]) == (1, 1, "Qwen2.5-14B", "arxiv_8", 5)
    assert row["prefill_ms_median"] == pytest.approx(1200.0)
    assert (row["prefill_ms_min"], row["prefill_ms_max"]) == pytest.approx((1000.0, 5000.0))
    assert row["decode_ms_median"] == pytest.approx(12.0) and row["total_ms_median"] == pytest.approx(2200.0)
    tp2 = summary[summary["gpu"] == "RTX 6000 Ada"].iloc[0]
    assert (tp2["tp"], tp2["model"], tp2["trace"]) == (2, "Qwen3-32B", "arxiv_12")
    vllm = summary[summary["kind"] == "vllm"].iloc[0]
    assert (vllm["gpu"], vllm["tp"], vllm["pp"], vllm["model"], vllm["trace"]) == (
        "H800", 4, 2, "Llama-3.1-70B", "vllm_arxiv16")
    assert vllm["total_ms_median"] == pytest.approx(11000.0) and np.isnan(vllm["prefill_ms_median"])


def test_error_uses_median_not_best_repetition(synthetic):
    real_dir, pred_dir = synthetic
    table = compare.compare(measured_runs.load_real(real_dir), compare.load_predictions(pred_dir), "static",
                            roofline=False)
    row = table[table["gpu"] == "A100"].iloc[0]
    # the prediction equals the best repetition exactly; the reference scripts would report 0 % here
    assert row["err_prefill_pct"] == pytest.approx(abs(1000 - 1200) / 1200 * 100)
    assert row["err_decode_pct"] == pytest.approx(abs(10 - 12) / 12 * 100)
    assert row["err_total_pct"] == pytest.approx(abs(2000 - 2200) / 2200 * 100)
    assert row["err_mean_pct"] == pytest.approx(np.mean([200 / 1200, 2 / 12, 200 / 2200]) * 100)
    other = table[table["gpu"] == "RTX 6000 Ada"].iloc[0]
    assert other["err_prefill_pct"] == pytest.approx(0.0) and other["err_total_pct"] == pytest.approx(0.0)
    vllm = compare.compare(measured_runs.load_real(real_dir), compare.load_predictions(pred_dir), "vllm", roofline=False)
    assert vllm.iloc[0]["err_total_pct"] == pytest.approx(1000 / 11000 * 100)
    summary = measured_runs.error_summary(table)
    assert summary[0]["runs"] == 2 and summary[0]["worst_run"].startswith("A100 TP1 Qwen2.5-14B arxiv_8")


def test_summary_csv_round_trip(synthetic, tmp_path):
    real_dir, _ = synthetic
    out = tmp_path / "summary" / measured_runs.REAL_SUMMARY_NAME
    assert compare.main_summarize(["--source", str(real_dir), "--output", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == measured_runs.SUMMARY_COLUMNS and len(frame) == 3
    from_csv = measured_runs.load_real(out.parent)
    from_raw = measured_runs.load_real(real_dir)
    for column in ("prefill_ms_median", "decode_ms_median", "total_ms_median", "total_ms_max"):
        np.testing.assert_allclose(from_csv[column], from_raw[column], rtol=1e-6, atol=1e-3)


def test_prediction_names():
    names = ["Llama-3.1-70B", "Qwen2.5-14B", "Qwen3-32B"]
    parsed = compare.parse_prediction_name("Qwen2.5-14B_splitwise_32_fa3_tp1_pp1_RTX_PRO_6000_S", names)
    assert (parsed.model, parsed.trace, parsed.fa, parsed.tp, parsed.pp, parsed.gpu_tag) == (
        "Qwen2.5-14B", "splitwise_32", "fa3", 1, 1, "RTX_PRO_6000_S")
    assert parsed.workload_stem == "Qwen2.5-14B_splitwise_32_fa3_tp1_pp1"
    vllm = compare.parse_prediction_name("Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2_H800", names)
    assert (vllm.trace, vllm.tp, vllm.pp, vllm.gpu_tag) == ("vllm_arxiv16", 4, 2, "H800")
    assert compare.parse_prediction_name("summary", names) is None


def test_roofline_kernels_non_negative_and_exact():
    h100 = load_hardware("H100")
    gemm = baselines.shape_roofline_kernel_ms("gemm", [(4096, 4096, 4096), (1, 1, 1)], h100)
    peak = h100.tc_bf16 * h100.num_sms * h100.sm_freq * 1e6
    assert gemm[0] == pytest.approx(2 * 4096**3 / peak * 1e3)  # compute bound
    assert gemm[1] == pytest.approx(2 * 3 / (h100.mem_bandwidth * 1e9) * 1e3)  # memory bound
    attn = baselines.shape_roofline_kernel_ms("attn", [("fa2_paged", 2, (1, 1), (100, 200), 32, 8, 128),
                                               ("fa3_ragged", 1, (4096,), (4096,), 32, 8, 128)], h100)
    decode_bytes = 2 * 128 * (2 * 32 * 2 + 2 * 8 * 300)
    assert attn[0] == pytest.approx(decode_bytes / (h100.mem_bandwidth * 1e9) * 1e3)
    assert attn[1] == pytest.approx(4 * 128 * 32 * (4096 * 4097 // 2) / peak * 1e3)  # causal prefill: compute bound
    for op in ("rmsnorm", "siluandmul"):
        values = baselines.shape_roofline_kernel_ms(op, [(1, 8), (4096, 8192)], h100)
        assert (values > 0).all() and values[1] > values[0]


@pytest.mark.parametrize("gpu", ["A100", "H100", "RTX PRO 6000 S", "L20"])
def test_roofline_workload_is_positive_and_copies_communication(gpu, tmp_path):
    data = json.loads(TP2.read_text())
    data["iterations"] = data["iterations"][:4]
    path = tmp_path / TP2.name
    path.write_text(json.dumps(data))
    workload = load_workload(path)
    fake = {"iterations": [{"operator_durations": {"communication": {"all_reduce": {"single_duration_ms": 0.25}}}}
                           for _ in workload.numbers]}
    result = baselines.shape_roofline_prediction(path, gpu, fake)
    for it in result["iterations"]:
        assert it["total_duration_ms"] > 0
        for category in ("attention", "rmsnorm", "siluandmul"):
            assert it["operator_durations"][category]["single_duration_ms"] >= 0
        assert it["operator_durations"]["communication"]["all_reduce"]["single_duration_ms"] == 0.25
    assert result["summary"]["prefill_duration_ms"] > result["summary"]["decode_avg_duration_ms"] > 0
    with pytest.raises(Exception, match="communication"):
        baselines.shape_roofline_prediction(path, gpu, None)


def test_compare_scripts_write_csv_markdown_and_plot(synthetic, tmp_path):
    real_dir, pred_dir = synthetic
    base = tmp_path / "baselines"
    base.mkdir()
    (base / "pipeweave_comparison.csv").write_text(
        "Hardware,TP,PP,Model,Workload,FA_Version,pred_prefill_ms,real_prefill_ms,MAPE_prefill(%),pred_decode_ms,"
        "real_decode_ms,MAPE_decode(%),pred_total_ms,real_total_ms,MAPE_total(%),avg_MAPE(%)\n"
        "A100,1,1,Qwen2.5-14B,arxiv_8,fa2,1100,1000,10,11,10,10,2100,2000,5,8\n")
    (base / "roofline_comparison.csv").write_text(
        (base / "pipeweave_comparison.csv").read_text().replace(",11,10,10,", ",0,10,100,"))
    (base / "vllm_comparison.csv").write_text("Method,Hardware,Workload,Model,pred_e2e_ms,real_e2e_ms,MAPE_e2e(%)\n"
                                              "pipeweave,H800,arxiv16,Llama-3.1-70B,11100,11028,0.6\n")
    out = tmp_path / "out"
    common = ["--pred_dir", str(pred_dir), "--real_dir", str(real_dir), "--baselines_dir", str(base),
              "--no_roofline"]
    proc = subprocess.run([sys.executable, str(REPO / "compare_pred_real.py"), *common, "--output",
                           str(out / "cmp.csv"), "--vllm_output", str(out / "vllm_in_report.csv"), "--plot",
                           str(out / "cmp.png"), "--markdown", str(out / "E2E.md")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out / "cmp.csv")
    row = table[table["gpu"] == "A100"].iloc[0]
    assert row["artifact_pipeweave_err_prefill_pct"] == pytest.approx(100 / 1200 * 100, abs=0.01)
    assert np.isnan(row["artifact_roofline_err_decode_pct"])  # the artifact's roofline has no decode prediction
    assert not [c for c in table.columns if c.startswith("artifact_") and c.endswith("_ms")]  # errors only
    assert (out / "cmp.png").read_bytes()[:4] == b"\x89PNG"
    text = (out / "E2E.md").read_text()
    assert "| A100 | 1 | Qwen2.5-14B | arxiv_8 |" in text and "cmp.png" in text and "vLLM" in text
    assert "Nothing in these predictions was fitted on end-to-end measurements" in text
    proc = subprocess.run([sys.executable, str(REPO / "compare_vllm_pred_real.py"), *common, "--output",
                           str(out / "v.csv"), "--plot", str(out / "v.png")], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    vllm = pd.read_csv(out / "v.csv")
    # the report's command writes the vLLM table it shows, as compare_vllm_pred_real.py does
    assert (out / "vllm_in_report.csv").read_text() == (out / "v.csv").read_text()
    assert vllm.iloc[0]["real_total_median_ms"] == pytest.approx(11000.0)
    assert vllm.iloc[0]["artifact_pipeweave_err_total_pct"] == pytest.approx(100 / 11000 * 100, abs=0.01)


def test_missing_baselines_are_skipped_with_a_note(tmp_path):
    static, vllm, notes = baselines.read_artifact_baselines(tmp_path / "absent")
    assert static.empty and vllm.empty and "not found" in notes[0]


@pytest.mark.data
def test_committed_summary_matches_shared_data(shared_data, tmp_path):
    out = tmp_path / measured_runs.REAL_SUMMARY_NAME
    compare.main_summarize(["--source", str(shared_data / "pipeweave" / "e2e" / "real"), "--output", str(out)])
    assert out.read_text() == (REPO / "e2e" / "real" / measured_runs.REAL_SUMMARY_NAME).read_text()


@pytest.mark.data
def test_committed_comparisons_are_of_the_committed_predictions(shared_data, tmp_path):
    """e2e/pipeweave_comparison.csv and e2e/vllm_comparison.csv (docs/E2E.md and docs/PAPER.md read them) are what
    the comparison of the committed predictions gives: neither may be left from older predictions."""
    static, vllm = tmp_path / "static.csv", tmp_path / "vllm.csv"
    assert compare.main_static(["--output", str(static), "--vllm_output", str(vllm), "--plot",
                                str(tmp_path / "p.png")]) == 0
    assert static.read_text() == (REPO / "e2e" / "pipeweave_comparison.csv").read_text()
    assert vllm.read_text() == (REPO / "e2e" / "vllm_comparison.csv").read_text()


def test_a_plot_not_named_png_is_refused_before_any_output(tmp_path, capsys):
    """The figure is PNG whatever its name: --plot comparison.pdf wrote PNG bytes under a .pdf name."""
    from pipeweave.cli import run_cli

    outputs = [tmp_path / "s.csv", tmp_path / "v.csv"]
    assert run_cli(compare.main_static, ["--output", str(outputs[0]), "--vllm_output", str(outputs[1]), "--plot",
                                         str(tmp_path / "p.pdf")]) == 2
    assert "the figure is written as PNG; give a .png file name" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.data
def test_committed_e2e_report_is_what_the_comparison_writes(shared_data, tmp_path):
    """docs/E2E.md (its tables, and the sections it includes: the peers' table, the calibration's) is what
    compare_pred_real.py --markdown docs/E2E.md writes now: the peers' table once moved without it (2026-12-05). The
    copy is rendered beside the test's outputs, so only its command line and figure link differ."""
    report = tmp_path / "E2E.md"
    shutil.copy(REPO / "docs" / "E2E.md", report)  # the generated sections of other tools are kept from it
    assert compare.main_static(["--output", str(tmp_path / "s.csv"), "--vllm_output", str(tmp_path / "v.csv"),
                                "--plot", str(tmp_path / "p.png"), "--markdown", str(report)]) == 0
    same = lambda text: [line for line in text.splitlines()  # noqa: E731
                         if "Generated by `python3 compare_pred_real.py" not in line and ".png" not in line]
    assert same(report.read_text()) == same((REPO / "docs" / "E2E.md").read_text())

@pytest.mark.parametrize("script", ["tp1.sh", "tp2.sh", "tp4.sh", "tp8.sh", "vllm_tp4_pp2.sh"])
def test_committed_predictions_are_what_the_batch_scripts_give(script, tmp_path):
    """e2e/pipeweave_pred/ (the comparisons above and docs/E2E.md read it) is what the shipped models, band and
    interval table give now, byte for byte: a change to any of them that was not followed by the batch scripts
    left stale interval blocks there once (2026-12-05)."""
    import os

    run = subprocess.run(["bash", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PIPEWEAVE_PRED_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    written = sorted(tmp_path.iterdir())
    assert written, f"{script} wrote no prediction"
    stale = [path.name for path in written
             if path.read_bytes() != (REPO / "e2e" / "pipeweave_pred" / path.name).read_bytes()]
    assert not stale, f"regenerate with ./{script}: {stale}"

@pytest.mark.data
def test_artifact_baselines_parse(shared_data):
    static, vllm, notes = baselines.read_artifact_baselines(shared_data / "pipeweave" / "e2e" / "baselines")
    assert set(static["method"]) == set(baselines.ARTIFACT_METHODS) and not notes
    assert static[static["method"] == "roofline"]["pred_decode_ms"].isna().all()
    assert set(vllm["trace"]) == {"vllm_arxiv16", "vllm_splitwise64"}


def test_your_own_runs_are_scored_against_the_median_of_their_repeats(tmp_path, capsys):
    """A user's measured runs (calibrate.py's --e2e CSV, one row per repeat) could only be compared by renaming
    files to the project's naming scheme, where another GPU's prediction, an alias or an underscore in a model name
    went wrong without a word. `python3 -m pipeweave.compare runs` reads the workload files the runs name."""
    import pipeweave
    from pipeweave.calibration_fit import main as calibrate_main
    from pipeweave.cli import run_cli

    workload = REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json"
    predicted = pipeweave.predict_workload(workload, "A100")["summary"]
    # median 1.175x; the repeat closest to the prediction 1.05x, the fastest 0.7x, the mean 1.1375x: all differ
    prefill = [predicted["prefill_duration_ms"] * f for f in (1.5, 1.3, 1.05, 0.7)]
    runs = tmp_path / "runs.csv"
    runs.write_text("workload,prefill_ms,decode_step_ms,total_ms\n" + "".join(
        f"{workload},{p},{predicted['decode_avg_duration_ms'] * 0.9},\n" for p in prefill))
    out = tmp_path / "scores.csv"
    assert run_cli(compare.main, ["runs", "--hardware", "NVIDIA A100-SXM4-80GB", "--runs", str(runs),
                                  "--output", str(out)]) == 0
    row = pd.read_csv(out).iloc[0]
    assert row["repeats"] == 4 and row["error_prefill_ms_pct"] == pytest.approx(100 * (1 - 1 / 1.175), rel=1e-4)
    assert row["error_decode_step_ms_pct"] == pytest.approx(100 / 9, rel=1e-4) and np.isnan(row["error_total_ms_pct"])
    assert row["mean_error_pct"] == pytest.approx((row["error_prefill_ms_pct"] + row["error_decode_step_ms_pct"]) / 2,
                                                  abs=1e-3)  # the CSV keeps three decimals
    assert "1 run(s): mean error" in capsys.readouterr().out
    calibration = tmp_path / "cal.json"
    assert run_cli(calibrate_main, ["--hardware", "A100", "--e2e", str(runs), "--output", str(calibration),
                                    "--no_fine_tune"]) == 0
    capsys.readouterr()
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(runs), "--calibration",
                                  str(calibration)]) == 0
    assert "errors are in-sample" in capsys.readouterr().out
    assert run_cli(compare.main, ["runs", "--hardware", "H100", "--runs", str(runs), "--calibration",
                                  str(calibration)]) == 2
    bad = tmp_path / "bad.csv"
    bad.write_text(f"workload,prefill_ms,decode_step_ms,total_ms\n{workload},-5,,\n")
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(bad)]) == 2
    assert "line 2: prefill_ms must be a positive number" in capsys.readouterr().err
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(runs), "--output", str(runs)]) == 2


def test_a_prediction_of_another_gpu_and_impossible_or_aliased_measured_runs(synthetic, tmp_path):
    """A prediction file named for one GPU but predicted on another was scored as the first (74 % off); a negative
    median made its run vanish from the summary; a CSV row naming the GPU by its driver name matched nothing."""
    real, pred = synthetic
    target = next(p for p in sorted(Path(pred).glob("*_H800.json")))
    output = json.loads(target.read_text())
    target.write_text(json.dumps({**output, "hardware": "NVIDIA H100"}))
    with pytest.raises(compare.UserError, match="named for H800 but predicted on NVIDIA H100"):
        compare.load_predictions(pred)
    summary_text = measured_runs.format_summary_csv(measured_runs.summarize_repeats(
        measured_runs.read_artifact_repeats(real)))
    (tmp_path / "summary.csv").write_text(summary_text)
    summary = pd.read_csv(tmp_path / "summary.csv")
    bad = tmp_path / "bad"
    bad.mkdir()
    summary.assign(prefill_ms_median=-summary["prefill_ms_median"].abs()).to_csv(bad / "measured_runs.csv",
                                                                                    index=False)
    with pytest.raises(compare.UserError, match="expected a positive number of ms"):
        measured_runs.load_real(bad)
    # a row whose every median is empty was listed as "— / — / —" and scored nowhere; min > median was read as given
    medians = [f"{metric}_ms_median" for metric in ("prefill", "decode", "total")]
    summary.assign(**{column: [np.nan] + summary[column].tolist()[1:] for column in medians}).to_csv(
        bad / "measured_runs.csv", index=False)
    with pytest.raises(compare.UserError, match="row 1 .*no measured median"):
        measured_runs.load_real(bad)
    summary.assign(total_ms_min=summary["total_ms_max"] * 2).to_csv(bad / "measured_runs.csv", index=False)
    with pytest.raises(compare.UserError, match="total min .* are not in order"):
        measured_runs.load_real(bad)
    alias = tmp_path / "alias"
    alias.mkdir()
    summary.assign(gpu=["NVIDIA A100-SXM4-80GB" if g == "A100" else g for g in summary["gpu"]]).to_csv(
        alias / "measured_runs.csv", index=False)
    assert "NVIDIA A100-SXM4-80GB" in (alias / "measured_runs.csv").read_text()
    assert measured_runs.load_real(alias)["gpu"].tolist() == summary["gpu"].tolist()


def test_a_run_summarised_twice_or_of_an_unknown_kind_is_an_error(synthetic, tmp_path):
    """A backup copy of the summary beside it counted every run twice; kind 'Static' dropped the row silently."""
    real, _ = synthetic
    text = measured_runs.format_summary_csv(measured_runs.summarize_repeats(measured_runs.read_artifact_repeats(real)))
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / "measured_runs.csv").write_text(text)
    (twice / "measured_runs_backup.csv").write_text(text)
    with pytest.raises(compare.UserError, match="summarised more than once .in measured_runs.csv, "
                                                "measured_runs_backup.csv."):
        measured_runs.load_real(twice)
    kinds = tmp_path / "kinds"
    kinds.mkdir()
    (kinds / "measured_runs.csv").write_text(text.replace(",static,", ",Static,", 1))
    with pytest.raises(compare.UserError, match="kind 'Static' is not one of static, vllm"):
        measured_runs.load_real(kinds)


@pytest.mark.parametrize("file, old, new, message", [
    ("e2e_A100.jsonl", '"prefill_latency": 1.0,', '"prefill_latency": -1.0,',
     r"e2e_A100.jsonl:1: prefill_latency is -1.0, not a positive number of seconds"),
    ("e2e_A100.jsonl", '"total_latency": 2.0,', '"total_latency": NaN,',
     r"e2e_A100.jsonl:1: total_latency is nan, not a positive number of seconds"),
    ("vllm_arxiv16_H800_llama70B.json", "[10.0,", "[-10.0,",
     r"vllm_arxiv16_H800_llama70B.json: latency 1 is -10.0, not a positive number of seconds"),
])
def test_a_repetition_with_a_negative_or_nan_time_is_an_error(synthetic, tmp_path, capsys, file, old, new, message):
    """The artifact's files were read without a check: a negative prefill was summarised as the run's minimum and
    left the median where the other four put it; a NaN total was dropped from the median while the run still
    counted five repeats."""
    from pipeweave.cli import run_cli

    real, pred = synthetic
    path = Path(real) / file
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(compare.UserError, match=message):
        measured_runs.load_real(real)
    out = tmp_path / "out.csv"
    assert run_cli(compare.main, ["static", "--real_dir", str(real), "--pred_dir", str(pred), "--no_roofline",
                                  "--output", str(out), "--plot", str(tmp_path / "out.png"),
                                  "--vllm_output", str(tmp_path / "vllm.csv")]) == 2
    assert message in capsys.readouterr().err and not out.exists()
    assert run_cli(compare.main, ["summarize-real", "--source", str(real), "--output", str(out)]) == 2
    assert not out.exists()


@pytest.mark.parametrize("text, message", [
    ('{"latencies": 11.0}', "no 'latencies' list"), ("[11.0, 12.0]", "no 'latencies' list"),
    ('{"latencies": [11.0,', "not a JSON file"),
])
def test_a_vllm_result_that_is_not_a_latency_benchmark_is_an_error_naming_it(synthetic, tmp_path, capsys, text,
                                                                             message):
    """A vLLM result file whose latencies were one number, or that was a list, stopped the comparison with a
    traceback (TypeError, AttributeError); a truncated one gave the JSON parser's message without the file."""
    from pipeweave.cli import run_cli

    real, pred = synthetic
    (Path(real) / "vllm_arxiv16_H800_llama70B.json").write_text(text)
    out = tmp_path / "out.csv"
    assert run_cli(compare.main, ["vllm", "--real_dir", str(real), "--pred_dir", str(pred), "--no_roofline",
                                  "--output", str(out), "--plot", str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert f"vllm_arxiv16_H800_llama70B.json: {message}" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_repetition_read_twice_is_an_error(synthetic, tmp_path):
    """A record pasted twice into a jsonl file moved the median (6 repeats: prefill 1200 -> 1250 ms); a copy of
    e2e_A100.jsonl as e2e_tp1_A100.jsonl counted every repetition twice (10 repeats), where the summary CSV's
    reader refuses a run summarised twice."""
    real, _ = synthetic
    path = Path(real) / "e2e_A100.jsonl"
    text = path.read_text()
    path.write_text(text + text.splitlines()[-1] + "\n")
    with pytest.raises(compare.UserError, match=r"repetition 4 of the run A100 TP1 PP1 Qwen2.5-14B arxiv_8 \(static\) "
                                                r"is read more than once \(in e2e_A100.jsonl\)"):
        measured_runs.load_real(real)
    path.write_text(text)
    (Path(real) / "e2e_tp1_A100.jsonl").write_text(text)
    with pytest.raises(compare.UserError, match=r"read more than once \(in e2e_A100.jsonl, e2e_tp1_A100.jsonl\)"):
        compare.main_summarize(["--source", str(real), "--output", str(tmp_path / "summary.csv")])
    assert not (tmp_path / "summary.csv").exists()


def test_a_run_measured_without_a_metric_is_scored_on_the_others_not_dropped(synthetic, tmp_path):
    """A summary CSV row with an empty decode cell (which its reader accepts) gave the run a NaN mean error, so it
    vanished from PipeWeave's and the roofline's mean and run count without a note, while the artifact's columns
    counted it."""
    real, pred = synthetic
    summary = measured_runs.summarize_repeats(measured_runs.read_artifact_repeats(real))
    static = summary["kind"] == "static"
    summary.loc[static & (summary["gpu"] == "A100"), ["decode_ms_median", "decode_ms_min", "decode_ms_max"]] = np.nan
    folder = tmp_path / "summary"
    folder.mkdir()
    (folder / measured_runs.REAL_SUMMARY_NAME).write_text(measured_runs.format_summary_csv(summary))
    table = compare.compare(measured_runs.load_real(folder), compare.load_predictions(pred), "static",
                            roofline=False)
    row = table[table["gpu"] == "A100"].iloc[0]
    assert np.isnan(row["err_decode_pct"])
    assert row["err_mean_pct"] == pytest.approx(np.mean([200 / 1200, 200 / 2200]) * 100)
    assert measured_runs.error_summary(table)[0]["runs"] == 2


def test_a_run_predicted_twice_under_two_names_of_its_gpu_is_an_error(synthetic, tmp_path, capsys):
    """A second prediction of the A100 run named by the GPU's driver name (NVIDIA_A100-SXM4-80GB) matched the same
    measured run; the comparison scored whichever sorted first, without a word."""
    from pipeweave.cli import run_cli

    real, pred = synthetic
    source = Path(pred) / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_A100.json"
    (Path(pred) / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_NVIDIA_A100-SXM4-80GB.json").write_text(
        source.read_text().replace("1000.0", "1500.0"))
    out = tmp_path / "out.csv"
    assert run_cli(compare.main, ["static", "--real_dir", str(real), "--pred_dir", str(pred), "--no_roofline",
                                  "--output", str(out), "--plot", str(tmp_path / "out.png"),
                                  "--vllm_output", str(tmp_path / "vllm.csv")]) == 2
    assert ("Qwen2.5-14B_arxiv_8_fa2_tp1_pp1 is predicted more than once for A100 (Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_A100"
            ".json, Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_NVIDIA_A100-SXM4-80GB.json)") in capsys.readouterr().err
    assert not out.exists()


def test_scoring_own_runs_refuses_a_decode_time_without_decode_and_warns_in_sample_from_any_folder(tmp_path, capsys,
                                                                                                 monkeypatch):
    """A decode cell of a prefill-only workload was scored against 0 ms (100 % error); the in-sample WARNING was
    lost when the scoring ran from another folder than the calibration (relative run paths)."""
    from pipeweave.calibration_fit import main as calibrate_main
    from pipeweave.cli import run_cli

    source = json.loads((REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json").read_text())
    (tmp_path / "prefill_only.json").write_text(json.dumps({**source, "iterations": source["iterations"][:1]}))
    (tmp_path / "four.json").write_text(json.dumps({**source, "iterations": source["iterations"][:4]}))
    bad = tmp_path / "bad.csv"
    bad.write_text("workload,prefill_ms,decode_step_ms,total_ms\nprefill_only.json,3000,20,\n")
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(bad)]) == 2
    assert "no decode iteration" in capsys.readouterr().err
    runs = tmp_path / "runs.csv"
    runs.write_text("workload,prefill_ms,decode_step_ms,total_ms\nfour.json,3400,27,\n")
    monkeypatch.chdir(tmp_path)
    assert run_cli(calibrate_main, ["--hardware", "A100", "--e2e", "runs.csv", "--output", "cal.json",
                                    "--no_fine_tune"]) == 0
    other = tmp_path / "other.csv"  # the same run in another file, scored from another folder
    other.write_text(f"workload,prefill_ms,decode_step_ms,total_ms\n{tmp_path / 'four.json'},3500,28,\n")
    monkeypatch.chdir(REPO)
    capsys.readouterr()
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(other), "--calibration",
                                  str(tmp_path / "cal.json")]) == 0
    assert "was fitted from the run(s) four: these errors are in-sample" in capsys.readouterr().out


def test_scoring_own_runs_never_overwrites_a_run_and_warns_only_in_sample(tmp_path, capsys, monkeypatch):
    """--output naming a workload the runs CSV names replaced it (calibrate.py too); and nothing checked that a
    calibration fitted on other runs gets no in-sample WARNING."""
    from pipeweave.calibration_fit import main as calibrate_main
    from pipeweave.cli import run_cli

    source = json.loads((REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json").read_text())
    for name, iterations in (("a.json", 4), ("b.json", 3)):
        (tmp_path / name).write_text(json.dumps({**source, "iterations": source["iterations"][:iterations]}))
    (tmp_path / "a.csv").write_text("workload,prefill_ms,decode_step_ms,total_ms\na.json,3400,27,\n")
    (tmp_path / "b.csv").write_text("workload,prefill_ms,decode_step_ms,total_ms\nb.json,3300,26,\n")
    monkeypatch.chdir(tmp_path)
    before = (tmp_path / "a.json").read_bytes()
    for main, flags in ((compare.main, ["runs", "--hardware", "A100", "--runs", "a.csv"]),
                        (calibrate_main, ["--hardware", "A100", "--e2e", "a.csv", "--no_fine_tune"])):
        assert run_cli(main, [*flags, "--output", "a.json"]) == 2
        assert "would overwrite the workload" in capsys.readouterr().err
    assert (tmp_path / "a.json").read_bytes() == before
    assert run_cli(calibrate_main, ["--hardware", "A100", "--e2e", "a.csv", "--output", "cal.json",
                                    "--no_fine_tune"]) == 0
    capsys.readouterr()
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", "b.csv", "--calibration", "cal.json"]) == 0
    assert "WARNING" not in capsys.readouterr().out  # fitted on a.json, scored on b.json: out of sample


def test_predictions_of_expert_parallel_or_fp8_workloads_are_left_out_saying_so(synthetic, capsys):
    """The aggregator names such a prediction <workload>_ep<E>_fp8_<GPU>: it was read as a GPU named "fp8_H100"
    and stopped the whole comparison; no measured run is of one, so it is left out, with a note."""
    _, pred = synthetic
    before = compare.load_predictions(pred)
    source = Path(pred) / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_A100.json"
    for suffix in ("fp8", "ep4", "ep4_fp8"):
        (Path(pred) / f"Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_{suffix}_A100.json").write_text(
            source.read_text().replace('"h"', '"NVIDIA A100-SXM4-80GB"'))
    capsys.readouterr()
    after = compare.load_predictions(pred)
    assert after.equals(before)
    assert "Note: 3 prediction(s) of expert-parallel or FP8 workloads left out" in capsys.readouterr().out


def test_a_report_of_other_predictions_says_which_command_and_layout_made_it(tmp_path):
    """README's vLLM-layout run wrote runs/vllm_layout/E2E.md saying it was docs/E2E.md of the paper's files."""
    from pipeweave.compare import lm_head_layout
    from pipeweave.e2e_report import WORKLOAD_NOTES, command_flags
    from pipeweave.paths import REPO_ROOT

    split = '{"communication": {"logits_all_gather": {"count": 1}}}'
    whole = '{"communication": {"all_reduce": {"count": 1}}}'
    assert (lm_head_layout(split), lm_head_layout(whole)) == ("vocab_parallel", "replicated")
    assert "--lm_head vocab_parallel" in WORKLOAD_NOTES["vocab_parallel"]
    assert command_flags(REPO_ROOT / "docs" / "E2E.md") == "--markdown docs/E2E.md"
    assert command_flags(REPO_ROOT / "runs" / "E2E.md", {"--pred_dir": REPO_ROOT / "e2e", "--no_roofline": True}) == \
        "--pred_dir e2e --no_roofline --markdown runs/E2E.md"
    # the recorded line of a report of other predictions names every flag that made it, outputs included (run as
    # recorded it read the workloads of workload/ and overwrote e2e/'s committed tables); TP1 runs, which have no
    # lm_head collective in either layout, no longer make such a report "mixed"
    pred, work = tmp_path / "pred", tmp_path / "workload"
    pred.mkdir()
    work.mkdir()
    for name in ("Llama-3.1-70B_arxiv_16_fa3_tp8_pp1_H800.json", "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1_A100.json"):
        output = json.loads((REPO_ROOT / "e2e" / "pipeweave_pred" / name).read_text())
        if "tp8" in name:  # as a prediction of the workload in vLLM's layout reads
            output["iterations"][0]["communication"] = {"logits_all_gather": {"count": 1}}
        (pred / name).write_text(json.dumps(output))
        shutil.copy(REPO_ROOT / "workload" / (name.rsplit("_", 1)[0] + ".json"), work)
    outputs = {flag: tmp_path / f"out{flag}{'.png' if flag == '--plot' else ''}"
               for flag in ("--output", "--vllm_output", "--plot")}
    argv = ["--pred_dir", str(pred), "--workload_dir", str(work), *(str(v) for pair in outputs.items() for v in pair),
            "--markdown", str(tmp_path / "E2E.md")]
    assert compare.main_static(argv) == 0
    text = (tmp_path / "E2E.md").read_text()
    recorded = re.search(r"Generated by `python3 compare_pred_real.py ([^`]*)`", text).group(1)
    words = recorded.split()
    assert dict(zip(words[::2], words[1::2])) == dict(zip(argv[::2], argv[1::2])), recorded
    assert WORKLOAD_NOTES["vocab_parallel"] in text and WORKLOAD_NOTES["mixed"] not in text


def test_scoring_own_runs_marks_in_sample_runs_by_file_or_content_and_refuses_what_cannot_be_scored(tmp_path, capsys):
    """From an audit of the path: a prefill time of a workload without prefill was scored against 0 ms; an
    identical runs CSV elsewhere (the same-file branch) and a copy of a calibrated run's workload under another name
    went unnoticed as in-sample, and nothing in the table said a calibration was applied; 1e308 ms overflowed the
    median to inf; repeats split over rows escaped the total-versus-parts check; two runs whose files share a name
    could not be told apart; '--output -' wrote a file named '-'; a hand-edited calibration gave a traceback."""
    from pipeweave.calibration_fit import main as calibrate_main
    from pipeweave.cli import run_cli

    source = json.loads((REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json").read_text())
    header = "workload,prefill_ms,decode_step_ms,total_ms\n"
    fitted, other, copies = tmp_path / "fitted", tmp_path / "other", tmp_path / "copies"
    for folder in (fitted, other, copies):
        folder.mkdir()
    (fitted / "a.json").write_text(json.dumps({**source, "iterations": source["iterations"][:4]}))
    (other / "a.json").write_text(json.dumps({**source, "iterations": source["iterations"][:3]}))
    (copies / "renamed.json").write_bytes((fitted / "a.json").read_bytes())
    for folder in (fitted, other):
        (folder / "runs.csv").write_text(header + "a.json,3400,27,\n")
    calibration = tmp_path / "cal.json"
    assert run_cli(calibrate_main, ["--hardware", "A100", "--e2e", str(fitted / "runs.csv"), "--output",
                                    str(calibration), "--no_fine_tune"]) == 0
    capsys.readouterr()
    out = tmp_path / "scores.csv"
    # the same CSV bytes elsewhere, naming another workload: in-sample by the file alone
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(other / "runs.csv"),
                                  "--calibration", str(calibration), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"was fitted from this file {other / 'runs.csv'}" in printed and "(calibrated)" in printed
    row = pd.read_csv(out).iloc[0]
    assert row["in_sample"] == "yes" and row["calibration"] == str(calibration)
    # a byte-identical copy of the calibrated run's workload, under another name: in-sample by content
    (copies / "runs.csv").write_text(header + "renamed.json,3300,26,\n" + f"{other / 'a.json'},3300,26,\n")
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(copies / "runs.csv"),
                                  "--calibration", str(calibration), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "was fitted from the run(s) renamed" in printed and "the 1 run(s) it was not fitted from" in printed
    assert pd.read_csv(out)["in_sample"].tolist() == ["yes", "no"]
    # two files named a.json: the rows name their paths
    (copies / "both.csv").write_text(header + f"{fitted / 'a.json'},3400,27,\n{other / 'a.json'},3300,26,\n")
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(copies / "both.csv"), "--output",
                                  "-"]) == 0
    captured = capsys.readouterr()
    table = pd.read_csv(io.StringIO(captured.out))
    assert table["workload"].tolist() == [str(fitted / "a.json"), str(other / "a.json")]
    assert "run(s): mean error" in captured.err and not (REPO / "-").exists()
    # refused, one line each
    decode_only = tmp_path / "decode_only.json"
    decode_only.write_text(json.dumps({**source, "iterations": source["iterations"][1:4]}))
    for cells, fragment in ((f"{decode_only},3400,27,", "prefill_ms was given, but the workload has no prefill"),
                            (f"{fitted / 'a.json'},1e308,27,", "prefill_ms must be a positive number of ms from")):
        bad = tmp_path / "bad.csv"
        bad.write_text(header + cells + "\n")
        assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(bad)]) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.count("\n") == 1, err
    # repeats split over rows: the medians' total (in seconds by mistake) is checked against their parts
    split = tmp_path / "split.csv"
    split.write_text(header + f"{fitted / 'a.json'},3400,27,\n{fitted / 'a.json'},,,3.5\n")
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(split)]) == 0
    printed = capsys.readouterr().out
    assert "lines 2, 3 (medians): total_ms 3.5 is far from" in printed
    assert "| 2 (prefill 1, decode_step 1, total 1) |" in printed
    edited = json.loads(calibration.read_text())
    edited["fitted_from"]["e2e"] = "runs.csv"
    calibration.write_text(json.dumps(edited))
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(split), "--calibration",
                                  str(calibration)]) == 2
    assert "fitted_from.e2e must be an object" in capsys.readouterr().err


def test_scoring_own_runs_refuses_an_fp8_run_on_a_gpu_without_fp8_naming_its_line(tmp_path, capsys):
    from pipeweave.cli import run_cli
    from tests.test_calibration import generated

    fp8 = generated(tmp_path, "Llama-3.1-8B", tp=1, dtype="fp8", attention="fa2")
    runs = tmp_path / "runs.csv"
    runs.write_text(f"workload,prefill_ms,decode_step_ms,total_ms\n{fp8},100,,\n")
    assert run_cli(compare.main, ["runs", "--hardware", "A100", "--runs", str(runs)]) == 2
    err = capsys.readouterr().err
    assert f"--runs {runs}: line 2: " in err and "has no FP8 tensor-core rate" in err and err.count("\n") == 1
