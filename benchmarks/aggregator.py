"""End-to-end prediction speed and memory of the aggregator.

    python3 -m benchmarks.aggregator [--workload W.json] [--hardware H20] [--runs 15] [--model_dir mlp_models]
    python3 -m benchmarks.aggregator --python /path/to/venv/bin/python    # whole process of an installed copy
    python3 -m benchmarks.aggregator --moe       # the largest MoE workload (MOE_WORKLOAD) on H200
    python3 -m benchmarks.aggregator --hardware L40 --workload W.json --calibration CAL.json   # calibrated

Loads the models once, then times the in-process prediction of one workload (default: the 403-iteration
``Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2``) — everything from the parsed workload to the finished
output object: dedup, features, MLP passes, collectives, scatter and summary; not the JSON file read
(timed separately) nor the output write — as the median of ``--runs`` runs.

Whole process: the wall time and peak resident memory (``ru_maxrss`` of the child, measured from a small launcher
process) of ``python3 aggregator.py ...`` (includes interpreter start, imports, model loading and writing the
output), interleaved with ``python3 -c "import numpy"`` as the baseline, medians over ``--process_runs``. With
``--python``, both children run that interpreter in a scratch directory, importing its installed pipeweave
(``pipeweave-aggregate``) and its shipped models. The summary of the output is compared with the committed
prediction of the same pair in ``e2e/pipeweave_pred/`` when there is one.

``--calibration``: every prediction, in process and whole process, applies that calibration file (its GPU must be
``--hardware``); a calibration that fine-tuned a class runs that class's shipped and fine-tuned ensembles.
``python3 -m benchmarks.calibration --keep DIR`` writes some. The summary is then not compared with the committed
(zero-shot) prediction.

If ``--model_dir`` lacks a model for an operator class, untrained models of the same architecture are
written to a temporary directory and used instead (timing does not depend on the weights); the
output says so. The last line is ``in_process_ms=<float> whole_process_s=<float> numpy_import_s=<float>
ratio=<float> peak_mb=<float>``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analytical_model.registry import workload_operators
from pipeweave.aggregate import output_name
from pipeweave.mlp import weights_path
from pipeweave.paths import DEFAULT_MODEL_DIR, DEFAULT_WORKLOAD_DIR, REPO_ROOT

DEFAULT_WORKLOAD = DEFAULT_WORKLOAD_DIR / "Llama-3.1-70B_vllm_arxiv16_fa3_tp4_pp2.json"
KERNEL_OPS = tuple(dict.fromkeys(op.model_op for op in workload_operators().values()))  # model directories
#: the largest MoE workload: the most layers (94) and iterations (403), every MoE operator kind, EP
MOE_WORKLOAD = {"model_config": "Qwen3-235B-A22B", "trace": "vllm_arxiv16", "tp": 8, "ep": 8}


def write_untrained_models(root: str | Path, ops=KERNEL_OPS, seed: int = 0, efficiency: dict | None = None,
                           stamp: str = "20000101_000000", quantile: bool = False) -> Path:
    """Untrained MLP_v2 models in the real directory layout (``<root>/<op>/<stamp>/``), for tests and timing.

    The last layer is scaled down and its bias set so that the predicted efficiency is about
    ``efficiency[op]`` (defaults: 0.5 for GEMM/attention, 1e-4 for the element-wise ops, their usual scale).
    ``quantile`` labels them as ``train_mlp_quantile.py`` labels its models, for a ``quantile_dir``.
    """
    import numpy as np
    import pandas as pd
    import torch

    from analytical_model.registry import get_operator
    from pipeweave.mlp import transformed_names
    from pipeweave.torch_mlp import build_model
    from pipeweave.modeling import input_transform, write_model_dir
    from pipeweave.training import TrainConfig

    defaults = {"gemm": 0.5, "attn": 0.5, "rmsnorm": 1e-4, "siluandmul": 1e-4}
    defaults.update(efficiency or {})
    torch.manual_seed(seed)
    root = Path(root)
    for op in ops:
        names = list(get_operator(op).input_names())
        model = build_model("MLP_v2", len(transformed_names(names, input_transform(op, TrainConfig()))))
        with torch.no_grad():
            last = model.network[-1]
            last.weight.mul_(0.01)
            last.bias.fill_(float(np.log(defaults.get(op, 0.5))))
        model.eval()
        train = pd.DataFrame(np.ones((2, len(names))), columns=names).assign(hardware="untrained")
        history = {"best_epoch": 0, "best_train_loss": 0.0, "best_val_loss": 0.0}
        write_model_dir(root / op / stamp, op, model, history, TrainConfig(recipe="pipeweave"), train, None, None,
                        {"paths": "untrained (benchmarks.aggregator.write_untrained_models)"}, extra=None)
        if quantile:
            metadata = root / op / stamp / "metadata.json"
            data = json.loads(metadata.read_text())
            data["training"]["recipe"] = "quantile"
            metadata.write_text(json.dumps(data, indent=2))
    return root


def models_present(model_dir: Path) -> bool:
    return all(any(weights_path(d, op).is_file() for d in (model_dir / op).glob("*")) for op in KERNEL_OPS)


INSTALLED_AGGREGATE = "import sys; from pipeweave.commands import aggregate; sys.exit(aggregate())"


# Measures one command from a small launcher process: a child forked from this (large) process would count the
# parent's pages in its ru_maxrss until it execs.
LAUNCHER = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def child_run(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak resident MB (``ru_maxrss``) of one run of ``command``."""
    done = subprocess.run([sys.executable, "-c", LAUNCHER, *command], cwd=cwd, check=True, capture_output=True,
                          text=True)
    wall, max_rss_kb = done.stdout.split()
    return float(wall), float(max_rss_kb) / 1024


def summary_difference(output: Path, committed: Path) -> str:
    """'identical' or the largest relative difference of the summary values."""
    got = json.loads(output.read_text())["summary"]
    want = json.loads(committed.read_text())["summary"]
    if got == want:
        return "identical"
    worst = max((abs(got[k] / want[k] - 1.0), k) for k in want if want[k])
    return f"max relative difference {worst[0]:.1e} ({worst[1]})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.aggregator",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=str(DEFAULT_WORKLOAD))
    parser.add_argument("--hardware", default=None, help="default H20 (H200 with --moe)")
    parser.add_argument("--moe", action="store_true", help=f"time the generated MoE workload {MOE_WORKLOAD}")
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR))
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--process_runs", type=int, default=5)
    parser.add_argument("--python", help="interpreter of an installed pipeweave for the whole-process runs "
                                         "(default: this one, running the checkout's aggregator.py)")
    parser.add_argument("--calibration", metavar="JSON", help="a calibration file of --hardware to apply")
    args = parser.parse_args(argv)

    from pipeweave.aggregate import Aggregator, Job, dumps_result, load_workload
    from pipeweave.calibration import load_calibration

    with tempfile.TemporaryDirectory() as tmp:
        if args.moe:
            from pipeweave.generate import WorkloadSpec, generate, write_workloads

            args.workload = str(write_workloads([generate(WorkloadSpec(**MOE_WORKLOAD))], tmp)[0])
        args.hardware = args.hardware or ("H200" if args.moe else "H20")
        model_dir = Path(args.model_dir)
        untrained = not models_present(model_dir)
        if untrained:
            model_dir = write_untrained_models(Path(tmp) / "models")
            print(f"note: {args.model_dir} lacks a model for some operator class; timing with untrained models "
                  f"of the same architecture in {model_dir} (speed does not depend on the weights)")
        started = time.perf_counter()
        calibration = load_calibration(args.calibration) if args.calibration else None
        if calibration is not None:
            calibration.check_hardware([args.hardware])
        aggregator = Aggregator(model_dir=model_dir, log=None, calibration=calibration)
        workload = load_workload(args.workload)
        job = Job(workload, aggregator.gpu(args.hardware))
        aggregator.predict([job])  # loads the models, warms caches of the hardware registry
        print(f"setup (models + first prediction): {time.perf_counter() - started:.2f} s")

        parse = []
        for _ in range(5):
            t0 = time.perf_counter()
            load_workload(args.workload)
            parse.append(time.perf_counter() - t0)
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            result = aggregator.predict([Job(workload, job.hardware)])[0].result
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        text = dumps_result(result)
        dump_s = time.perf_counter() - t0
        in_process_ms = statistics.median(times) * 1000
        print(f"workload: {Path(args.workload).name} ({len(workload.numbers)} iterations) on {job.hardware.stem}")
        if calibration is not None:
            tuned = ", ".join(calibration.fine_tuned) or "none"
            print(f"calibration: {args.calibration} (fine-tuned classes: {tuned})")
        print(f"read + validate workload JSON: {statistics.median(parse) * 1000:.2f} ms (median of 5)")
        print(f"in-process prediction: median {in_process_ms:.2f} ms, min {min(times) * 1000:.2f} ms, "
              f"max {max(times) * 1000:.2f} ms over {args.runs} runs")
        print(f"serialise output JSON ({len(text) / 1e6:.1f} MB): {dump_s * 1000:.1f} ms")

        out = Path(tmp) / "out.json"
        flags = ["--workload", str(Path(args.workload).resolve()), "--hardware", args.hardware, "--output", str(out)]
        if untrained or not args.python:  # an installed copy uses its own shipped models
            flags += ["--model_dir", str(model_dir.resolve())]
        if calibration is not None:
            flags += ["--calibration", str(Path(args.calibration).resolve())]
        python = args.python or sys.executable
        command = ([python, "-c", INSTALLED_AGGREGATE, *flags] if args.python
                   else [python, str(REPO_ROOT / "aggregator.py"), *flags])
        label = f"{python} -c 'pipeweave-aggregate'" if args.python else "python3 aggregator.py"
        runs = {"numpy": [], "aggregate": []}
        for _ in range(args.process_runs):  # interleaved, so that both see the same machine load
            runs["numpy"].append(child_run([python, "-c", "import numpy"], Path(tmp)))
            runs["aggregate"].append(child_run(command, Path(tmp)))
        numpy_s, numpy_mb = (statistics.median(v) for v in zip(*runs["numpy"]))
        whole_s = statistics.median(wall for wall, _ in runs["aggregate"])
        peak_mb = max(mb for _, mb in runs["aggregate"])
        print(f"whole process ({label} ...): median {whole_s:.2f} s over {args.process_runs} runs, "
              f"peak memory {peak_mb:.0f} MB")
        print(f"python -c 'import numpy': median {numpy_s:.2f} s, peak memory {numpy_mb:.0f} MB; "
              f"whole process / import numpy = {whole_s / numpy_s:.1f}x")
        committed = REPO_ROOT / "e2e" / "pipeweave_pred" / output_name(Path(args.workload).stem, job.hardware)
        if (committed.is_file() and not untrained and calibration is None
                and model_dir.resolve() == (REPO_ROOT / "mlp_models").resolve()):
            print(f"summary vs committed {committed.relative_to(REPO_ROOT)}: {summary_difference(out, committed)}")
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"in_process_ms={in_process_ms:.3f} whole_process_s={whole_s:.3f} numpy_import_s={numpy_s:.3f} "
          f"ratio={whole_s / numpy_s:.2f} peak_mb={peak_mb:.1f}")


if __name__ == "__main__":
    main()
