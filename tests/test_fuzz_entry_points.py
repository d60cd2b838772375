"""Fuzz (hypothesis): random workloads, hardware JSONs and shape CSVs fed to the entry points in-process. Every run
ends with exit 0 and finite, valid output, or exit 2 and one ``error:`` line (issue 9)."""
from __future__ import annotations

import csv
import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from analytical_model.__main__ import main as features_main
from pipeweave import aggregate
from pipeweave.cli import run_cli

REPO = Path(__file__).resolve().parent.parent
BASE = json.loads((REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json").read_text())
BASE["iterations"] = BASE["iterations"][:2]
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

numbers = st.one_of(st.integers(-3, 3), st.integers(-2 ** 70, 2 ** 70), st.sampled_from([0, 1, 7, 64, 128, 2 ** 20]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3), st.none())



def outcome(main, argv, capsys, output: Path) -> None:
    code = run_cli(main, [str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code == 0:
        assert output.exists()
        if output.suffix == ".json":
            result = json.loads(output.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in output"))
            assert result["summary"]["total_duration_ms"] > 0  # never a silent 0 ms
        else:
            assert "nan" not in output.read_text().lower().split(",")
            rows = list(csv.DictReader(output.read_text().splitlines()))
            assert rows and all(float(row["ideal_cycles"]) > 0 for row in rows)  # the features CLI
    else:
        assert code == 2, err
        assert len([line for line in err.splitlines() if line.strip()]) == 1 and ": error: " in err, err
        assert not output.exists()


@SETTINGS
@given(path=st.sampled_from([("gemm", 0, "M"), ("gemm", 1, "K"), ("attention", None, "hd"), ("attention", None, "nkv"),
                             ("rmsnorm", None, "seq"), ("siluandmul", None, "dim"), ("rmsnorm", None, "count")]),
       value=numbers, iteration=st.integers(0, 1))
def test_fuzz_workload(path, value, iteration, models, tmp_path, capsys):
    data = json.loads(json.dumps(BASE))
    category, index, key = path
    entry = data["iterations"][iteration]["operators"][category]
    (entry[index] if index is not None else entry)[key] = value
    source = tmp_path / "w.json"
    source.write_text(json.dumps(data))
    out = tmp_path / "p.json"
    out.unlink(missing_ok=True)
    outcome(aggregate.main, ["--workload", source, "--hardware", "A100", "--model_dir", models, "--output", out],
            capsys, out)


@SETTINGS
@given(key=st.sampled_from(["numSms", "memBandwidth", "l2CacheBandwidth", "tcBf16", "smFreq", "FmaFp32", "tcFp8"]),
       value=numbers)
@example(key="numSms", value=108)  # a valid file: the success branch runs at least once
def test_fuzz_hardware_json(key, value, models, tmp_path, capsys):
    # a folder per example: the CLI's hardware registry is cached by path within a process, so one folder rewritten
    # served every later example the first valid example's spec
    directory = Path(tempfile.mkdtemp(dir=tmp_path))
    data = json.loads((REPO / "hardware" / "A100.json").read_text())
    data[key] = value
    (directory / "A100.json").write_text(json.dumps(data))
    out = tmp_path / "p.json"
    out.unlink(missing_ok=True)
    outcome(aggregate.main, ["--workload", REPO / "workload" / "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json", "--hardware",
                             "A100", "--hardware_dir", directory, "--model_dir", models, "--output", out], capsys, out)


@SETTINGS
@given(cells=st.lists(st.one_of(st.integers(-5, 2 ** 64).map(str), st.sampled_from(["", "abc", "1e30", "nan", "7.5"])),
                      min_size=3, max_size=3),
       gpu=st.sampled_from(["H100", "", "nope", "A100"]))
@example(cells=["16", "4096", "4096"], gpu="H100")  # a valid row: the success branch runs at least once
def test_fuzz_shape_csv(cells, gpu, tmp_path, capsys):
    source = tmp_path / "in.csv"
    source.write_text("M,N,K,hardware\n" + ",".join([*cells, gpu]) + "\n")
    out = tmp_path / "out.csv"
    out.unlink(missing_ok=True)
    outcome(features_main, ["features", "--op", "gemm", "--input", source, "--output", out], capsys, out)
    if out.exists():
        values = out.read_text().splitlines()[1].split(",")[4:]
        assert all(math.isfinite(float(v)) for v in values)


@SETTINGS
@given(requests=numbers, prompt=numbers, output=numbers)
def test_fuzz_generator_requests(requests, prompt, output, tmp_path, capsys):
    """The generator's --requests/--prompt_tokens/--output_tokens: a file the aggregator accepts, or one line."""
    from pipeweave.generate_cli import main as generator_main

    out_dir = tmp_path / "gen"
    shutil.rmtree(out_dir, ignore_errors=True)
    code = run_cli(generator_main, ["--model_config", "Qwen2.5-14B", "--requests", str(requests), "--prompt_tokens",
                                    str(prompt), "--output_tokens", str(output), "--output_dir", str(out_dir)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == 0:
        from pipeweave.flatten import load_workload
        load_workload(out.strip())  # the aggregator's reader accepts what was written
    else:
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert not out_dir.exists() or not list(out_dir.iterdir())
