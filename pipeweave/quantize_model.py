"""python3 -m pipeweave.quantize_model: the bandwidth model of the BF16 -> FP8 activation quantisation.

An FP8 workload runs one quantisation pass before each FP8 GEMM input (``operators.quantize``). That kernel was
predicted with the RMSNorm model, the kernel of the same structure (read a row, reduce it to a scale, write it
scaled), because nothing measured it. aiconfigurator-core has since measured it on eight GPUs (vLLM's dynamic
per-token pass, :func:`dataset.aiconfigurator.quantize_rows`), and those measurements put the RMSNorm model 33–150 %
off (always too slow: vLLM's RMSNorm kernel streams at a fraction of the bandwidth the quantisation reaches).

So the quantisation takes the bandwidth model of the memory-bound operators (:mod:`pipeweave.memory_model`, three
parameters every GPU shares: launch latency, fraction of the spec DRAM bandwidth, bytes per SM cycle and resident
thread) fitted on those measurements, on every GPU: a physics model with three numbers transfers to a GPU nobody
measured, where an MLP trained on eight GPUs would extrapolate. It is scored leave-one-GPU-out (fitted on the other
seven GPUs) in docs/ACCURACY.md, beside the RMSNorm model it replaced.

The fit, the GPUs and shapes it covers (for the extrapolation flag) and the scores are stored in
``pipeweave/quantize_bandwidth.json``; ``python3 -m pipeweave.quantize_model`` rewrites it and the section.
"""
from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import get_operator

OP = "quantize"
BANDWIDTH_FILE = Path(__file__).with_name(get_operator(OP).bandwidth_model_file)
REWRITE = "python3 -m pipeweave.quantize_model"


@lru_cache(maxsize=4)
def load(name: str = BANDWIDTH_FILE.name) -> dict:
    """A stored fit of the ``pipeweave`` package (``parameters``, ``fitted_on``, ``coverage``, ``logo``)."""
    path = Path(__file__).with_name(name)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the quantisation's bandwidth model; write it with {REWRITE} "
                                f"(needs the training extras and aiconfigurator-core)")
    return json.loads(path.read_text())


def _inputs(frame, hardware_dir: Path = DEFAULT_HARDWARE_DIR):
    """(feature rows, descriptor rows, SM clock, resident threads) of quantisation rows (seq, dim, hardware)."""
    from analytical_model.registry import compute_features

    operator = get_operator(OP)
    features = compute_features(OP, frame[["seq", "dim", "hardware"]], hardware_dir)
    registry = hardware_registry(hardware_dir)
    specs = frame["hardware"].map(registry.get)
    return (features[list(operator.feature_names)].to_numpy(np.float64),
            features[list(operator.descriptor_names)].to_numpy(np.float64),
            specs.map(lambda hw: hw.sm_freq).to_numpy(np.float64),
            specs.map(lambda hw: hw.max_threads_per_sm).to_numpy(np.float64))


def fit(frame) -> dict:
    """:func:`pipeweave.memory_model.fit` on measured quantisation rows (``avg_duration`` in µs)."""
    from pipeweave import memory_model

    features, _, freq, threads = _inputs(frame)
    return memory_model.fit(OP, features, freq, threads, frame["avg_duration"].to_numpy(np.float64))


def predict_us(parameters: dict, frame) -> np.ndarray:
    from pipeweave import memory_model

    features, _, freq, threads = _inputs(frame)
    return memory_model.duration_us(parameters, OP, features, freq, threads)


def coverage(frame) -> dict:
    """What the fit saw: the GPUs' compute capabilities and the range of each feature and descriptor."""
    features, described, _, _ = _inputs(frame)
    operator = get_operator(OP)
    inputs = np.concatenate([features, described], axis=1)
    registry = hardware_registry()
    return {"compute_capabilities": [list(c) for c in sorted({tuple(registry.get(g).compute_capability)
                                                                for g in frame["hardware"].unique()})],
            "inputs": list(operator.feature_names + operator.descriptor_names),
            "min": inputs.min(axis=0).tolist(), "max": inputs.max(axis=0).tolist()}


def held_out_predictions(frame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per GPU: (its rows, as a mask of ``frame``; their durations by the fit on the other GPUs)."""
    out = {}
    for gpu in sorted(frame["hardware"].unique()):
        held = (frame["hardware"] == gpu).to_numpy()
        out[gpu] = held, predict_us(fit(frame[~held]), frame[held])
    return out


def interval_entries(frame, held_out: dict) -> dict:
    """The fit's 80 % intervals per state, measured as :mod:`pipeweave.interval_eval` measures the MLPs'
    (:func:`pipeweave.interval_eval.table_entry` of log(measured / predicted) per GPU): ``trained`` by the fit on
    every GPU (three parameters over thousands of rows: its in-sample errors are its errors on new shapes),
    ``unseen_gpu`` / ``unseen_architecture`` by the fit without the GPU (``held_out``:
    :func:`held_out_predictions`), by whether one of the other GPUs shares its compute capability. Before, a
    quantisation took RMSNorm's intervals and training GPUs: A100, outside the fit, had the narrowest interval."""
    from pipeweave.interval_eval import table_entry
    from pipeweave.intervals import TRAINED, UNSEEN_ARCHITECTURE, UNSEEN_GPU

    measured = frame["avg_duration"].to_numpy(np.float64)
    everywhere = predict_us(fit(frame), frame)
    registry = hardware_registry(DEFAULT_HARDWARE_DIR)
    capability = {gpu: registry.get(gpu).compute_capability for gpu in held_out}
    ratios = {TRAINED: {}, UNSEEN_GPU: {}, UNSEEN_ARCHITECTURE: {}}
    for gpu, (held, predicted) in held_out.items():
        ratios[TRAINED][gpu] = np.log(measured[held] / everywhere[held])
        sibling = any(capability[other] == capability[gpu] for other in held_out if other != gpu)
        ratios[UNSEEN_GPU if sibling else UNSEEN_ARCHITECTURE][gpu] = np.log(measured[held] / predicted)
    entry = table_entry(ratios)
    # a GPU outside the fit is no better known than one inside it: the fit's per-GPU biases (three parameters for
    # every GPU) are the trained state's spread, which the six sibling GPUs' held-out errors alone undercut
    trained = entry["trained"]
    for state in ("unseen_gpu", "unseen_architecture"):
        entry[state]["log_low"] = min(entry[state]["log_low"], trained["log_low"])
        entry[state]["log_high"] = max(entry[state]["log_high"], trained["log_high"])
    return entry


def logo_table(frame, held_out: dict | None = None) -> list[dict]:
    """Per GPU: duration errors (%) of the bandwidth model fitted on the other GPUs (``held_out``:
    :func:`held_out_predictions`, computed when not given) and of the RMSNorm model (the prediction before, as the
    shipped RMSNorm predictor gives the same shapes)."""
    from pipeweave.predictor import KernelPredictor

    before = KernelPredictor().predict_frame("rmsnorm", frame[["seq", "dim", "hardware"]])["predicted_us"].to_numpy()
    measured = frame["avg_duration"].to_numpy(np.float64)
    rows = []
    for gpu, (held, predicted) in (held_out or held_out_predictions(frame)).items():
        errors = np.abs(predicted / measured[held] - 1) * 100
        old = np.abs(before[held] / measured[held] - 1) * 100
        rows.append({"gpu": gpu, "n": int(held.sum()), "mean": float(errors.mean()),
                     "median": float(np.median(errors)), "before_mean": float(old.mean()),
                     "before_median": float(np.median(old))})
    return rows


def render(record: dict) -> str:
    lines = [
        "## quantize: the BF16 → FP8 activation pass",
        "",
        f"Generated by `{REWRITE}`. The pass before each FP8 GEMM input is predicted on every GPU by the bandwidth",
        "model of the memory-bound operators (docs/METHOD.md §4.3) fitted on aiconfigurator-core's measurements of",
        "vLLM's dynamic per-token quantisation (`pipeweave/quantize_model.py`); before, the RMSNorm model predicted",
        "it. Leave-one-GPU-out: the model fitted on the other GPUs, scored on every measured shape of the GPU (duration",
        "error `mean / median` in %). L40S and RTX PRO 6000 (96 and 128 MB of L2) time many shapes faster than their",
        "DRAM allows: the harness's input stays in the L2, which a DRAM model does not describe.",
        "",
        "| GPU | n | bandwidth model, GPU held out (used) | RMSNorm model (before) |",
        "|---|---|---|---|",
    ]
    for row in record["logo"]:
        lines.append(f"| {row['gpu']} | {row['n']} | {row['mean']:.1f} / {row['median']:.1f} | "
                     f"{row['before_mean']:.1f} / {row['before_median']:.1f} |")
    p = record["parameters"]
    lines += ["", f"Fitted on all {sum(record['fitted_on'].values()):,} rows: latency {p['latency_us']:.2f} µs, "
                  f"{p['dram_fraction']:.3f} of the spec DRAM bandwidth, {p['bytes_per_thread_cycle']:.5f} bytes per "
                  f"SM cycle and resident thread."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from dataset.aiconfigurator import quantize_rows
    from pipeweave.cli import ArgumentParser, UserError, write_atomically, write_marked_section
    from pipeweave.paths import DOCS_DIR

    parser = ArgumentParser(prog=REWRITE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(BANDWIDTH_FILE), help="the fit's JSON (default: %(default)s)")
    parser.add_argument("--markdown", default=str(DOCS_DIR / "ACCURACY.md"),
                        help="document whose 'quantize' section gets the scores (default: docs/ACCURACY.md)")
    args = parser.parse_args(argv)
    frame = quantize_rows(log=lambda line: None)
    if frame.empty:
        raise UserError("no quantisation measurements: install aiconfigurator-core (pip install '.[train]')")
    held_out = held_out_predictions(frame)
    record = {"parameters": fit(frame), "fitted_on": {g: int(n) for g, n in frame["hardware"].value_counts(
                  sort=False).sort_index().items()},
              "source": sorted(frame["source"].unique()), "coverage": coverage(frame),
              "logo": logo_table(frame, held_out), "intervals": interval_entries(frame, held_out)}
    write_atomically(Path(args.output), lambda tmp: tmp.write_text(json.dumps(record, indent=1) + "\n"))
    write_marked_section(args.markdown, "quantize", render(record))
    print(f"wrote {args.output} and the quantize section of {args.markdown}")
    return 0


if __name__ == "__main__":
    from pipeweave.cli import run_cli

    sys.exit(run_cli(main))
