"""The speed benchmarks' options (benchmarks/): what they time, not how fast it is (timings are quoted in the README,
never asserted)."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import aggregator as aggregator_benchmark
from benchmarks import calibration as calibration_benchmark
from pipeweave import aggregate, calibration_fit
from pipeweave.cli import run_cli

from workload_copies import first_iterations

REPO = Path(__file__).resolve().parent.parent
TP1 = REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json"


@pytest.fixture(scope="module")
def a100_run(tmp_path_factory):
    """A truncated TP1 workload and an A100 calibration fitted on it, measured 20 % slower than predicted."""
    tmp = tmp_path_factory.mktemp("bench")
    workload = first_iterations(TP1, tmp, 4)
    engine = aggregate.Aggregator(log=None)
    job = aggregate.Job(aggregate.load_workload(workload), engine.gpu("A100"))
    prefill_ms = engine.predict([job])[0].result["summary"]["prefill_duration_ms"] * 1.2
    csv = tmp / "measured.csv"
    csv.write_text(f"workload,prefill_ms,decode_step_ms,total_ms\n{workload},{prefill_ms},,\n")
    calibration = tmp / "cal.json"
    assert run_cli(calibration_fit.main, ["--hardware", "A100", "--e2e", str(csv), "--output", str(calibration)]) == 0
    return workload, calibration


def benchmark(*flags) -> list[str]:
    return ["--runs", "1", "--process_runs", "1", *flags]


def test_aggregator_benchmark_applies_a_calibration(a100_run, capsys, monkeypatch):
    """In process and in the timed whole process (aggregator.py's flag)."""
    workload, calibration = a100_run
    engines, commands = [], []

    def recording_engine(*args, **kwargs):
        engines.append(kwargs.get("calibration"))
        return aggregate.Engine(*args, **kwargs)

    def recording_run(command, cwd):
        commands.append(command)
        return 0.1, 10.0

    monkeypatch.setattr(aggregate, "Aggregator", recording_engine)
    monkeypatch.setattr(aggregator_benchmark, "child_run", recording_run)
    aggregator_benchmark.main(benchmark("--workload", str(workload), "--hardware", "A100",
                                        "--calibration", str(calibration)))
    out = capsys.readouterr().out
    assert f"calibration: {calibration} (fine-tuned classes: none)" in out
    assert [c.hardware for c in engines] == ["A100"]
    whole_process = [c for c in commands if c[1].endswith("aggregator.py")]
    assert len(whole_process) == 1 and whole_process[0][-2:] == ["--calibration", str(calibration.resolve())]
    assert "summary vs committed" not in out  # a calibrated summary is not the committed zero-shot one


def test_aggregator_benchmark_refuses_another_gpus_calibration(a100_run):
    workload, calibration = a100_run
    with pytest.raises(ValueError, match="fitted for A100"):
        aggregator_benchmark.main(benchmark("--workload", str(workload), "--hardware", "H100",
                                            "--calibration", str(calibration)))


def test_calibration_benchmark_keeps_each_cases_file(tmp_path, monkeypatch, capsys):
    """--keep DIR writes the calibration of every timed case as DIR/<case>.json (the fit itself is stubbed: this
    checks which files are kept, not the minutes of fine-tuning)."""
    class Fitted:
        fine_tuned = {}

        def __init__(self, kernels):
            self.kernels = kernels

        def save(self, path):
            Path(path).write_text(",".join(Path(k).name for k in self.kernels))

    monkeypatch.setattr(calibration_benchmark, "calibrate", lambda gpu, runs, kernels, **_: Fitted(kernels))
    monkeypatch.setattr("sys.argv", ["benchmarks.calibration", "--workers", "1", "--keep", str(tmp_path / "kept")])
    calibration_benchmark.main()
    kept = {path.name: path.read_text() for path in (tmp_path / "kept").iterdir()}
    assert kept == {"e2e_run.json": "", "gemm_quick.json": "gemm_quick.csv", "gemm_full.json": "gemm_full.csv",
                    "attn_200.json": "attn.csv", "moe_200.json": "moe.csv"}
    assert capsys.readouterr().out.count("| no |") == 5
