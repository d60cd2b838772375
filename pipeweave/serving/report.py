"""docs/SERVING.md: how far the serving simulator can be checked, generated.

    python3 -m pipeweave.serving.report [--output docs/SERVING.md] [--model_dir mlp_models]

1. the static reduction: ``--scheduler static`` against ``aggregator.py`` on the paper's workloads, both with vLLM's
   vocabulary-parallel ``lm_head`` (the simulator's; the paper's files replicate it on every rank);
2. the only measured serving-engine runs in our data, vLLM's latency benchmark for Llama-3.1-70B TP4 × PP2 on H800:
   ``--scheduler vllm`` makespan against the median of the 5 measured latencies, beside the static prediction;
3. no online-serving measurements: TTFT/TPOT of the same scheduler on pipeweave's and on AIConfigurator's step
   estimates, side by side (where aiconfigurator-core is installed).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from pipeweave.cli import ArgumentParser, run_cli, write_atomically
from pipeweave.compare import DEFAULT_REAL_DIR, REAL_SUMMARY_NAME
from pipeweave.engine import Engine
from pipeweave.generate import PAPER_SET, output_name
from pipeweave.paths import DEFAULT_MODEL_DIR
from pipeweave.serving.run import ServingConfig, simulate_config
from pipeweave.serving.simulator import simulate, summarize
from pipeweave.workload import build_workload, load_model_config, load_trace

REPO = Path(__file__).resolve().parents[2]
VLLM_RUNS = ("vllm_arxiv16", "vllm_splitwise64")
ONLINE = ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", num_requests=500, seed=0, per_request_outputs=True)
ONLINE_QPS = (5.0, 10.0, 20.0, 40.0)


def _gpu_of(spec) -> str:
    """The GPU each paper workload was measured on (docs/METHOD.md §9): FA2 files on A100, FA3 on H100, TP8 on H20,
    the vLLM TP4 x PP2 files on H800."""
    if spec.pp == 2:
        return "H800"
    if spec.tp == 8:
        return "H20"
    return "A100" if spec.prefill_attn.startswith("fa2") else "H100"


def vllm_layout(spec):
    """The paper workload of ``spec`` with the layout the simulator runs (the generator's default ``lm_head``)."""
    trace = load_trace(spec.trace)
    return build_workload(load_model_config(spec.model_config), list(trace.prompt_tokens), trace.output_tokens,
                          tp=spec.tp, pp=spec.pp, prefill_attn=spec.prefill_attn, decode_attn=spec.decode_attn,
                          qk_norm_rmsnorm=spec.qk_norm_rmsnorm)


def static_reduction(engine: Engine) -> pd.DataFrame:
    rows = []
    for spec in PAPER_SET:
        if spec.single_sequence or spec.prompt_tokens is not None:
            continue  # merged-prompt files: not a trace of requests
        gpu = _gpu_of(spec)
        stem = output_name(spec.model_config, spec.trace, spec.prefill_attn, spec.tp, spec.pp)[:-5]
        expected = engine.predict_workload(vllm_layout(spec), gpu)["summary"]
        config = ServingConfig(spec.model_config, spec.trace, gpu, spec.tp, spec.pp, scheduler="static",
                               prefill_attn=spec.prefill_attn, qk_norm_rmsnorm=spec.qk_norm_rmsnorm)
        run = simulate_config(config, engine)
        total = expected["total_duration_ms"]
        rows.append({"workload": stem, "GPU": gpu, "aggregator total ms": total,
                     "static simulation ms": run.simulation.makespan_ms,
                     "difference %": 100 * (run.simulation.makespan_ms - total) / total})
    return pd.DataFrame(rows)


def vllm_benchmarks(engine: Engine, real_dir: Path = DEFAULT_REAL_DIR) -> pd.DataFrame:
    real = pd.read_csv(real_dir / REAL_SUMMARY_NAME)
    rows = []
    for trace in VLLM_RUNS:
        measured = real[(real["kind"] == "vllm") & (real["trace"] == trace)].iloc[0]
        median = float(measured["total_ms_median"])
        spec = next(s for s in PAPER_SET if s.trace == trace)
        static = engine.predict_workload(vllm_layout(spec), "H800")["summary"]
        base = ServingConfig("Llama-3.1-70B", trace, "H800", tp=4, pp=2, usage="offline")
        row = {"trace": trace, "measured median ms": median,
               "measured min–max ms": f"{measured['total_ms_min']:.0f}–{measured['total_ms_max']:.0f}",
               "static prediction ms": static["total_duration_ms"]}
        for label, config in (("vllm simulation ms", base),
                              ("vllm, one micro-batch in flight ms", replace(base, max_concurrent_batches=1))):
            row[label] = simulate_config(config, engine).simulation.makespan_ms
        for label in ("static prediction ms", "vllm simulation ms", "vllm, one micro-batch in flight ms"):
            row[f"error {label[:-3]} %"] = 100 * (row[label] - median) / median
        rows.append(row)
    return pd.DataFrame(rows)


def online_side_by_side(engine: Engine) -> tuple[pd.DataFrame | None, str]:
    try:
        from pipeweave.serving.peers import AIConfiguratorStepCost

        peer = AIConfiguratorStepCost(ONLINE.model_config, engine.gpu(ONLINE.hardware).aiconfigurator_system,
                                      ONLINE.tp)
    except ImportError as exc:
        return None, f"aiconfigurator-core is not installed ({exc}); no peer column."
    from pipeweave.serving.kv_cache import vllm_block_manager
    from pipeweave.serving.requests import load_serving_trace, make_requests
    from pipeweave.serving.schedulers import VllmScheduler

    rows = []
    for qps in ONLINE_QPS:
        config = replace(ONLINE, qps=qps)
        ours = simulate_config(config, engine)
        requests = make_requests(load_serving_trace(config.trace), config.num_requests, qps, config.seed,
                                 config.per_request_outputs)
        settings = ours.settings
        scheduler = VllmScheduler(vllm_block_manager(settings["kv_cache_blocks"]), settings["max_num_seqs"],
                                  settings["max_num_batched_tokens"])
        theirs = simulate(requests, scheduler, peer)
        for name, simulation in (("pipeweave", ours.simulation), ("AIConfigurator", theirs)):
            s = summarize(simulation)
            rows.append({"qps": qps, "step estimates": name, "TTFT p50 ms": s["ttft_ms"]["p50"],
                         "TTFT p90 ms": s["ttft_ms"]["p90"], "TPOT p50 ms": s["tpot_ms"]["p50"],
                         "TPOT p90 ms": s["tpot_ms"]["p90"], "E2E p50 ms": s["e2e_ms"]["p50"],
                         "makespan ms": s["makespan_ms"]})
    return pd.DataFrame(rows), ""


def _table(frame: pd.DataFrame) -> str:
    """A markdown table; floats with 2 decimals (differences of the static reduction in scientific notation)."""
    def cell(column, value):
        if isinstance(value, float):
            return f"{value:.1e}" if column == "difference %" else f"{value:,.2f}"
        return str(value)
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(cell(c, row[c]) for c in frame.columns) + " |")
    return "\n".join(lines)


def document(static: pd.DataFrame, vllm: pd.DataFrame, online: pd.DataFrame | None, online_note: str,
             model_dir: Path) -> str:
    worst = static["difference %"].abs().max()
    errors = vllm["error vllm simulation %"].abs()
    static_errors = vllm["error static prediction %"].abs()
    one = vllm["error vllm, one micro-batch in flight %"].abs()
    lines = [
        "# Serving simulation: what can be checked",
        "",
        "Generated by `python3 -m pipeweave.serving.report` (models: "
        f"`{model_dir.relative_to(REPO) if model_dir.is_relative_to(REPO) else model_dir}`; about 10 s). "
        "The simulator (`serve_sim.py`, README \"Serving simulation\") costs every iteration with pipeweave's kernel "
        "predictor; these checks say how far its results can be trusted.",
        "",
        "## 1. Static reduction",
        "",
        "`serve_sim.py --scheduler static` on a paper workload's trace (all requests at t = 0) must reproduce "
        "`aggregator.py`'s total for the same workload: one prefill of every request, then lock-step decode, each "
        "iteration built by the workload generator and predicted by the aggregator's engine. Both sides lay "
        "`lm_head` out as vLLM does, over the vocabulary with a gather of the logits (the generator's default and the "
        "simulator's; the paper's files replicate it on every rank, so their `aggregator.py` totals in docs/E2E.md "
        "differ at TP > 1). Target: within 1 %. "
        f"Largest difference over the {len(static)} workloads: **{worst:.2e} %** (per-operator durations are memoised "
        "with the engine's 10⁻⁶ ms output rounding, and float32 MLP outputs differ in the last bits between batches "
        "of different sizes). The three merged-prompt workloads (`vllm_a16`, `vllm_a8`, `vllm_s32`) are not request traces and "
        "are left out.",
        "",
        _table(static),
        "",
        "## 2. vLLM latency benchmark (Llama-3.1-70B, TP4 × PP2, H800)",
        "",
        "The only serving-engine measurements in our data: vLLM's latency benchmark (all requests at t = 0, "
        "5 repetitions; reference = their median). `--scheduler vllm --usage offline` follows vLLM V1 (v0.10.1) "
        "with the `LLM` class defaults (16,384 batched tokens, 1,024 sequences on an 80 GB GPU): the 16 × 2,197 and "
        "64 × 901 prompt tokens are prefilled in chunks, and with PP = 2 two micro-batches are in flight, so the "
        "second chunk's prefill overlaps the first and decodes alternate between two halves of the batch. "
        "Communication comes from the engine's collective models with `--collective_estimate analytical` allowed, as "
        "in `vllm_tp4_pp2.sh`; the static prediction column is the aggregator's on the same engine, for the workload "
        "with vLLM's `lm_head` layout (docs/E2E.md predicts the paper's file, whose every rank computes the whole "
        "vocabulary). "
        "Target: within 8 % on average, none above 12 %.",
        "",
        _table(vllm),
        "",
        f"**Result, reported as measured:** the vLLM simulation is off by {errors.mean():.1f} % on average "
        f"(worst {errors.max():.1f} %), against {static_errors.mean():.1f} % (worst {static_errors.max():.1f} %) for "
        f"the static prediction. With one micro-batch in flight (no pipelining) it is {one.mean():.1f} % "
        f"(worst {one.max():.1f} %). The target is {'met' if errors.mean() <= 8 and errors.max() <= 12 else 'missed'}"
        " by the default vLLM simulation. The measured latencies are longer than even the sequential (static) "
        "prediction: the measurement shows none of the overlap that two micro-batches in flight would give, which "
        "suggests the benchmarked vLLM (its version is not recorded) did not pipeline these batches, or lost the "
        "gain to per-step overheads the kernel model does not see (scheduling, sampling, stage transfers). The "
        "simulated pipelining was checked against vLLM 0.10.1's scheduler and engine-core source (the batch queue "
        "holds up to PP micro-batches; `num_computed_tokens` advances when a request is scheduled, so a request "
        "whose tokens are all in flight is skipped): it is vLLM V1's own behaviour, not a simulator bug. Nothing "
        "is fitted to these two runs; `--max_concurrent_batches 1` is shown as a diagnostic, not chosen for its "
        "error.",
        "",
        "## 3. Online serving",
        "",
        "**No online-serving measurements (TTFT/TPOT under a request rate) exist in our data**, so the simulated "
        "TTFT and TPOT are not validated against a measurement. The side by side below runs the same vLLM scheduler "
        "and request stream (Llama-3.1-8B, H100 TP1, `splitwise_48` prompts with their own output lengths, "
        f"{ONLINE.num_requests} Poisson requests, seed {ONLINE.seed}) with two step estimates: pipeweave's kernel "
        "predictor and AIConfigurator's `mixed_step_latency` / `decode_step_latency` (aiconfigurator-core 0.12.0, "
        "vLLM backend data of `h100_sxm`; it takes uniform lengths, so a batch is described to it by its mean "
        "lengths, `pipeweave/serving/peers.py`). Vidur is not on PyPI and needs its own profiling data, so it is "
        "not run.",
        "",
    ]
    lines += [_table(online), ""] if online is not None else [online_note, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python3 -m pipeweave.serving.report", description=__doc__.split("\n")[0])
    parser.add_argument("--output", default=str(REPO / "docs" / "SERVING.md"),
                        help="the report to write (default: docs/SERVING.md)")
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR),
                        help="root of the trained MLPs (default: mlp_models)")
    args = parser.parse_args(argv)
    engine = Engine(model_dir=args.model_dir, collective_estimate="analytical", log=None)
    load_model_config(ONLINE.model_config)
    static = static_reduction(engine)
    vllm = vllm_benchmarks(engine)
    online, note = online_side_by_side(engine)
    text = document(static, vllm, online, note, Path(args.model_dir).resolve())
    write_atomically(args.output, lambda tmp: tmp.write_text(text))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
