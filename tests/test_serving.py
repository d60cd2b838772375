"""Serving simulation (pipeweave/serving/, serve_sim.py, search_config.py).

Scheduler and simulator properties run on a cheap synthetic step cost; the kernel step cost and the static
reduction run on untrained models (benchmarks.aggregator.write_untrained_models): they check that the simulator
reproduces the aggregator's engine exactly, whatever the weights.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeweave.cli import UserError, run_cli
from pipeweave.engine import Engine
from pipeweave.memory import check_memory, kv_cache_bytes_per_gpu, weight_bytes_per_gpu
from pipeweave.paths import DEFAULT_CONFIG_DIR
from pipeweave.serving.kv_cache import BlockManager, kv_cache_blocks
from pipeweave.serving import run as serving_run
from pipeweave.serving.cli import check_paths
from pipeweave.serving.requests import MAX_NUM_REQUESTS, Request, load_serving_trace, make_requests
from pipeweave.serving.run import ServingConfig, check, check_model_and_requests, simulate_config, vllm_settings
from pipeweave.serving.schedulers import StaticScheduler, VllmScheduler, vllm_defaults
from pipeweave.serving.search import plot_pareto
from pipeweave.serving.simulator import request_metrics, simulate, summarize
from pipeweave.serving.step_cost import KernelStepCost
from pipeweave.schema import AttentionOp, Iteration
from pipeweave.workload import (RankShapes, Trace, WorkloadError, iteration_operators, build_workload,
                                load_model_config, load_trace)

REPO = Path(__file__).resolve().parent.parent


class LinearCost:
    """5 ms + 0.01 ms per new token + 0.0002 ms per context token; records every step."""

    def __init__(self):
        self.steps = []

    def __call__(self, new, context):
        self.steps.append((list(new), list(context)))
        return 5.0 + 0.01 * sum(new) + 0.0002 * sum(context)


def trace(prompts, output_tokens=20, decode=None):
    return Trace("t", tuple(prompts), tuple(decode or [output_tokens] * len(prompts)), output_tokens)


def vllm(blocks=10**6, seqs=256, budget=2048):
    return VllmScheduler(BlockManager(blocks), seqs, budget)


@pytest.fixture(scope="module")
def engine(models):
    return Engine(model_dir=models,
                      collective_estimate="analytical", log=None)


# ---------------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------------

def test_requests_cycle_through_trace_and_poisson_is_seeded():
    t = trace([100, 200, 300])
    requests = make_requests(t, num_requests=7, qps=5.0, seed=3)
    assert [r.prompt_tokens for r in requests] == [100, 200, 300, 100, 200, 300, 100]
    arrivals = [r.arrival_ms for r in requests]
    assert arrivals[0] == 0 and all(b > a for a, b in zip(arrivals, arrivals[1:]))
    assert arrivals == [r.arrival_ms for r in make_requests(t, num_requests=7, qps=5.0, seed=3)]
    assert arrivals != [r.arrival_ms for r in make_requests(t, num_requests=7, qps=5.0, seed=4)]
    long = make_requests(t, num_requests=20000, qps=5.0, seed=0)
    assert np.mean(np.diff([r.arrival_ms for r in long])) == pytest.approx(200.0, rel=0.03)
    assert all(r.arrival_ms == 0 for r in make_requests(t))


def test_recorded_arrivals_are_replayed(tmp_path):
    path = tmp_path / "timed.csv"
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens,arrival_time_s\n"
                    "1,10,5,4,0.5\n2,20,0,4,1.5\n")
    requests = make_requests(load_serving_trace(path), num_requests=3, per_request_outputs=True)
    assert [r.arrival_ms for r in requests] == [0.0, 1000.0, 2000.0]
    assert [r.output_tokens for r in requests] == [5, 1, 5]  # decode_tokens, at least 1


def test_arrivals_must_be_finite(tmp_path):
    """An infinite arrival is never reached: the event loop would wait for it forever."""
    t = trace([100, 200])
    for qps in (float("inf"), float("nan")):
        with pytest.raises(WorkloadError, match="qps must be a finite number"):
            make_requests(t, qps=qps)
    with pytest.raises(WorkloadError, match="overflow.*qps 1e-310"):
        make_requests(t, qps=1e-310)  # finite, but 1000 / qps is not
    path = tmp_path / "timed.csv"
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens,arrival_time_s\n1,10,5,4,0\n2,20,0,4,inf\n")
    with pytest.raises(WorkloadError, match="line 3: arrival_time_s must be a finite number"):
        load_serving_trace(path)
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens,arrival_time_s\n1,10,5,4,0\n2,20,0,4,1e306\n")
    with pytest.raises(WorkloadError, match="overflow.*arrival_time_s"):
        make_requests(load_serving_trace(path), num_requests=5)  # cycling adds the span: 1e309 s


def test_arrival_column_is_read_as_parse_trace_reads_the_trace(tmp_path):
    """Spaces after the header's commas and whitespace-only rows: parse_trace strips the one and skips the other, and
    the arrival column is read the same way (it was silently dropped, every request arriving at t = 0)."""
    path = tmp_path / "spaced.csv"
    path.write_text("request, prompt_tokens, decode_tokens, output_tokens, arrival_time_s\n"
                    "1, 10, 5, 4, 0.5\n   \n , , , , \n2, 20, 0, 4, 1.5\n")
    serving = load_serving_trace(path)
    assert serving.trace.prompt_tokens == (10, 20) and serving.arrivals_s == (0.5, 1.5)
    assert [r.arrival_ms for r in make_requests(serving)] == [0.0, 1000.0]
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens,arrival_time_s\n1,10,5,4,0.5\n2,20,0,4,x\n")
    with pytest.raises(WorkloadError, match="line 3: arrival_time_s is not a number: 'x'"):
        load_serving_trace(path)
    # blank lines count: the errors name the file's line, in the arrival column and in the token columns
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens,arrival_time_s\n\n1,10,5,4,0.5\n\n"
                    "2,20,0,4,x\n")
    with pytest.raises(WorkloadError, match="line 5: arrival_time_s is not a number: 'x'"):
        load_serving_trace(path)
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens\n\n1,10,5,4\n\n2,y,0,4\n")
    with pytest.raises(WorkloadError, match="line 5: prompt_tokens is not an integer: 'y'"):
        load_serving_trace(path)


@pytest.mark.parametrize("column", ["arrival_time", "arrival_time_ms", "arival_time_s", "Arrival_Time_s"])
def test_an_arrival_column_under_another_name_is_refused(tmp_path, column):
    """A trace whose arrival times sat in a column not named arrival_time_s was read as if it had none: every request
    arrived at t = 0, with no word of the column ignored."""
    path = tmp_path / "timed.csv"
    path.write_text(f"request,prompt_tokens,decode_tokens,output_tokens,{column}\n1,10,5,4,0\n2,20,0,4,50\n")
    with pytest.raises(WorkloadError, match=f"column '{column}' is not read: .* named arrival_time_s"):
        load_serving_trace(path)


def test_arrivals_coarser_than_the_engine_rounding_are_refused(tmp_path):
    """Beyond 2³³ ms doubles are spaced wider than the engine's 10⁻⁶ ms step times: `--qps 1e-300` gave TTFT, TPOT
    and E2E of 0.000 ms."""
    t = trace([100, 200])
    with pytest.raises(WorkloadError, match=r"request 1 would arrive at 1\.0\d+e\+303 ms, .* coarser than the "
                                            r"engine's 1e-06 ms rounding .*: use a larger --qps"):
        make_requests(t, qps=1e-300, num_requests=5)
    path = tmp_path / "timed.csv"
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens,arrival_time_s\n"
                    f"1,10,5,4,0\n2,20,0,4,{(2**33 - 1) / 1000}\n")
    assert make_requests(load_serving_trace(path))[1].arrival_ms == 2**33 - 1  # spacing 2⁻²⁰ ms: kept
    with pytest.raises(WorkloadError, match="request 2 would arrive .*: keep --num_requests <= 2 or rescale"):
        make_requests(load_serving_trace(path), num_requests=3)  # the second cycle starts beyond 2³³ ms


def test_num_requests_is_bounded():
    """A bound stated in one line instead of a process killed for memory (3·10⁹ requests: rc 137, no message)."""
    check(ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", num_requests=MAX_NUM_REQUESTS))
    with pytest.raises(UserError, match="--num_requests must be at most 1,000,000, got 3,000,000,000: every request "
                                        "stays in memory"):
        check(ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", num_requests=3_000_000_000))
    with pytest.raises(WorkloadError, match="num_requests must be between 1 and 1,000,000 .*, got 1,000,001"):
        make_requests(trace([100]), num_requests=MAX_NUM_REQUESTS + 1)


@pytest.mark.parametrize("overrides, message", [
    ({"scheduler": "static", "gpu_memory_utilization": 0.5}, "--gpu_memory_utilization applies to --scheduler vllm"),
    ({"scheduler": "static", "usage": "offline"}, "--usage applies to --scheduler vllm"),
    ({"scheduler": "static", "pp": 2, "max_concurrent_batches": 2}, "--max_concurrent_batches applies to --scheduler"),
    ({"pp": 2, "max_concurrent_batches": 3}, r"--max_concurrent_batches must be between 1 and --pp \(2\), got 3"),
    ({"seed": -1}, "--seed must be an integer >= 0, got -1"),
    ({"qps": float("inf")}, "--qps must be a finite number > 0"),
])
def test_config_check_refuses_ignored_and_impossible_settings(overrides, message):
    with pytest.raises(UserError, match=message):
        check(ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", **overrides))


# ---------------------------------------------------------------------------------------------------
# schedulers
# ---------------------------------------------------------------------------------------------------

def test_static_scheduler_is_one_prefill_then_lockstep_decode():
    cost = LinearCost()
    sim = simulate(make_requests(trace([30, 50, 70], output_tokens=4)), StaticScheduler(), cost)
    assert cost.steps[0] == ([30, 50, 70], [30, 50, 70])
    assert cost.steps[1:] == [([1, 1, 1], [30 + k, 50 + k, 70 + k]) for k in (1, 2, 3)]
    assert sim.makespan_ms == pytest.approx(sum(5.0 + 0.01 * sum(n) + 0.0002 * sum(c) for n, c in cost.steps))


def test_vllm_chunks_prefill_within_budget_and_mixes_with_decodes():
    cost = LinearCost()
    requests = make_requests(trace([3000, 100], output_tokens=5))
    simulate(requests, vllm(budget=2048), cost)
    assert all(sum(new) <= 2048 for new, _ in cost.steps)
    assert cost.steps[0] == ([2048], [2048])
    assert cost.steps[1] == ([952, 100], [3000, 100])  # the rest of the first prompt beside the second
    assert cost.steps[2] == ([1, 1], [3001, 101])


def test_vllm_respects_max_num_seqs():
    cost = LinearCost()
    simulate(make_requests(trace([10] * 9, output_tokens=3)), vllm(seqs=4), cost)
    assert max(len(new) for new, _ in cost.steps) == 4


def test_vllm_preempts_when_kv_is_full_and_recomputes():
    cost = LinearCost()
    requests = make_requests(trace([64, 64, 64], output_tokens=40))
    sim = simulate(requests, vllm(blocks=15), cost)  # 15 blocks of 16 tokens: not all three to the end
    assert sum(r.preemptions for r in sim.requests) > 0
    assert all(r.num_output == r.output_tokens for r in sim.requests)
    resumed = [new for new, _ in cost.steps if any(n > 64 for n in new)]
    assert resumed, "a preempted request recomputes its prompt and generated tokens"


@pytest.mark.parametrize("output_tokens, recomputed", [(40, 33), (56, 49), (80, 65)])
def test_a_preempted_request_recomputes_only_what_its_cache_lost(output_tokens, recomputed):
    """vLLM's prefix cache keeps a preempted request's freed blocks until new allocations take them, its last block
    first. Two 64-token prompts in 10 blocks of 16: both decode into a fifth block, then A needs a sixth and B (80
    tokens computed, 5 full blocks) is preempted. A takes one block of B's per 16 tokens it grows: finishing at
    104 tokens (7 blocks) it took 2, at 120 (8) 3, at 144 (9) 4 of them, so B, readmitted at 81 tokens, finds 3, 2
    or 1 of its blocks and recomputes 81 - 48, - 32 or - 16 tokens (it recomputed all 81 before)."""
    cost = LinearCost()
    sim = simulate(make_requests(trace([64, 64], output_tokens=output_tokens)), vllm(blocks=10), cost)
    assert [r.preemptions for r in sim.requests] == [0, 1]
    assert all(r.num_output == output_tokens for r in sim.requests)
    assert [(new, context) for new, context in cost.steps if max(new) > 1] == [
        ([64, 64], [64, 64]), ([recomputed], [81])]


def test_pipeline_keeps_micro_batches_in_flight():
    def run(pp):
        cost = LinearCost()
        sim = simulate(make_requests(trace([4000, 4000, 4000, 4000], output_tokens=50)), vllm(budget=4000), cost,
                       pp=pp)
        return sim, cost
    one, cost_one = run(1)
    two, cost_two = run(2)
    # with two stages, the second request's prefill starts while the first one's is in flight
    assert cost_two.steps[1] == ([4000], [4000]) and two.makespan_ms < one.makespan_ms
    assert all(r.num_output == r.output_tokens for r in two.requests)


def test_vllm_defaults_follow_gpu_memory():
    assert vllm_defaults(80 * 2**30, "NVIDIA H100") == {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    assert vllm_defaults(48 * 2**30, "NVIDIA L40S") == {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
    assert vllm_defaults(80 * 2**30, "NVIDIA H100", "offline")["max_num_batched_tokens"] == 16384


def test_vllm_defaults_exclude_a100_and_cap_max_num_seqs_by_the_token_budget(engine):
    # vLLM 0.10.1 keeps an 80 GB A100 on the small defaults, for `vllm serve` and the LLM class alike
    assert vllm_defaults(80 * 2**30, "NVIDIA A100-SXM4-80GB") == {"max_num_batched_tokens": 2048, "max_num_seqs": 256}
    assert vllm_defaults(80 * 2**30, "NVIDIA A100-SXM4-80GB", "offline") == {"max_num_batched_tokens": 8192,
                                                                            "max_num_seqs": 256}
    base = ServingConfig("Llama-3.1-8B", "splitwise_48", "H100")
    assert vllm_settings(base, engine.gpu("A100"))["max_num_seqs"] == 256
    capped = vllm_settings(replace(base, max_num_batched_tokens=512), engine.gpu("H100"))
    assert capped["max_num_batched_tokens"] == capped["max_num_seqs"] == 512  # min(1024, 512), as vLLM
    with pytest.raises(UserError, match=r"default max_num_batched_tokens on L40S .*\(2048\) must be >= --max_num_seqs"):
        vllm_settings(replace(base, max_num_seqs=4096), engine.gpu("L40S"))
    with pytest.raises(UserError, match=r"--max_num_batched_tokens \(32\) must be >= --max_num_seqs \(64\)"):
        vllm_settings(replace(base, max_num_seqs=64, max_num_batched_tokens=32), engine.gpu("H100"))


def test_kv_capacity_from_memory():
    cfg = load_model_config("Llama-3.1-8B")
    weights = weight_bytes_per_gpu(cfg, 1, 1)
    assert 15.5e9 < weights < 16.5e9  # 8.03 B parameters in BF16
    blocks = kv_cache_blocks(cfg, 80 * 2**30, 1, 1, 8192, 1024)
    # 128 KiB of KV per token (32 layers x 8 KV heads x 128 x K,V x 2 B)
    assert 50e9 < blocks * 16 * 131072 < 0.9 * 80 * 2**30 - weights
    assert kv_cache_blocks(cfg, 80 * 2**30, 2, 1, 8192, 1024) > 2 * blocks
    with pytest.raises(WorkloadError, match="does not fit"):
        kv_cache_blocks(load_model_config("Llama-3.1-70B"), 80 * 2**30, 1, 1, 8192, 1024)


def test_no_kv_cache_names_the_smallest_tp_that_fits(tmp_path):
    """serve_sim refused Llama-3.1-70B on an RTX 4090 ("leave no KV cache in the 23.2 GB available") without the
    smallest TP that would fit, which the aggregator's memory check names: it now does, from the same search
    (pipeweave.memory.smallest_fitting_tp), at the PP given."""
    cfg, rtx_4090 = load_model_config("Llama-3.1-70B"), 25757220864  # totalGlobalMem of hardware/RTX 4090.json
    with pytest.raises(WorkloadError, match=r"leave no KV cache in the 23\.2 GB available \(0\.9 x totalGlobalMem\); "
                                            r"the smallest TP that fits at PP1 is 8$"):
        kv_cache_blocks(cfg, rtx_4090, 1, 1, 2048, 256)
    with pytest.raises(WorkloadError, match="does not fit"):
        kv_cache_blocks(cfg, rtx_4090, 4, 1, 2048, 256)
    assert kv_cache_blocks(cfg, rtx_4090, 8, 1, 2048, 256) >= 1
    with pytest.raises(WorkloadError, match="the smallest TP that fits at PP2 is 4$"):
        kv_cache_blocks(cfg, rtx_4090, 1, 2, 2048, 256)
    with pytest.raises(WorkloadError, match="no TP up to 64 fits at PP1$"):
        kv_cache_blocks(cfg, 2**30, 1, 1, 2048, 256)
    result = run_script("serve_sim.py", "--model_config", "Llama-3.1-70B", "--trace", "vllm_arxiv16", "--hardware",
                        "RTX 4090", "--output", tmp_path / "out.json")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    # TP 8 leaves KV cache, but not one request of max_model_len, which vLLM checks at start-up: both are named
    assert result.stderr.rstrip().endswith("the smallest TP that fits at PP1 is 8, with a --max_model_len of 103136 "
                                           "or less (one request of max_model_len 131072, which vLLM checks at "
                                           "start-up, needs TP 16)")
    assert not (tmp_path / "out.json").exists()


def test_the_tp_named_for_a_model_that_does_not_fit_starts_or_says_what_else_it_needs(engine):
    """An audit (2026-12-05): serve_sim named TP 4 for Llama-3.1-70B on L40S, where vLLM then would not start (one
    request of max_model_len 131072 needs 8192 blocks; TP 4 holds 5215)."""
    config = ServingConfig("Llama-3.1-70B", "arxiv_16", "L40S", num_requests=4)
    with pytest.raises(WorkloadError, match=r"the smallest TP that fits at PP1 is 4, with a --max_model_len of 83440 "
                                            r"or less \(.*needs TP 8\)$"):
        simulate_config(config, engine)
    with pytest.raises(UserError, match=r"holds 5215 \(83440 tokens\); give --max_model_len 83440 or less, or more "
                                        r"GPUs \(it needs TP 8 at PP1\)$"):
        simulate_config(replace(config, tp=4), engine)
    assert simulate_config(replace(config, tp=4, max_model_len=83440), engine).settings["kv_cache_tokens"] == 83440
    assert simulate_config(replace(config, tp=8), engine).settings["max_model_len"] == 131072


def test_no_kv_cache_message_names_every_term_in_gb():
    cfg = load_model_config("Llama-3.1-8B")
    # the weights fit: a huge token budget's activations leave no room, and the message says so
    with pytest.raises(WorkloadError) as error:
        kv_cache_blocks(cfg, 80 * 2**30, 1, 1, 2**20, 1024)
    message = str(error.value)
    assert f"weights {weight_bytes_per_gpu(cfg, 1, 1) / 1e9:.1f}, activations " in message
    assert "runtime 1.1 GB per GPU" in message and "in the 77.3 GB available (0.9 x totalGlobalMem)" in message
    assert "GiB" not in message
    # a budget and a sequence limit of 10^12 are two numbers, not a list of 10^12 prompts (a MemoryError traceback)
    with pytest.raises(WorkloadError, match="does not fit"):
        kv_cache_blocks(cfg, 80 * 2**30, 1, 1, 10**12, 10**12)


# ---------------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------------

prompts_st = st.lists(st.integers(1, 3000), min_size=1, max_size=12)


def test_request_metrics_and_summary_by_hand():
    """The metrics on two requests worked out by hand (a user audit, 2026-12-05, found TPOT over all outputs instead
    of all but the first, output-only throughput, every percentile the median and E2E from the first token each
    passing every test). A: arrives at 100 ms, first token at 250, finishes at 650 after 5 tokens: TTFT 150, TPOT
    400 / 4 = 100, E2E 550. B: arrives at 0, one token at 50: TTFT 50, no TPOT, E2E 50."""
    from pipeweave.serving.simulator import Simulation

    a = Request(0, 100.0, 30, 5, first_token_ms=250.0, finish_ms=650.0)
    b = Request(1, 0.0, 70, 1, first_token_ms=50.0, finish_ms=50.0)
    metrics = request_metrics([b, a])
    assert metrics["request"].tolist() == [0, 1] and metrics["ttft_ms"].tolist() == [150.0, 50.0]
    assert metrics["e2e_ms"].tolist() == [550.0, 50.0]
    assert metrics["tpot_ms"][0] == 100.0 and np.isnan(metrics["tpot_ms"][1])
    summary = summarize(Simulation([a, b], steps=7))
    assert summary["makespan_ms"] == 650.0
    assert summary["ttft_ms"] == {"p50": 100.0, "p90": pytest.approx(140.0), "p99": pytest.approx(149.0),
                                  "mean": 100.0}  # np.percentile's linear interpolation, as vLLM's benchmark
    assert summary["tpot_ms"]["p50"] == summary["tpot_ms"]["mean"] == 100.0
    assert summary["throughput_tokens_per_s"] == pytest.approx((30 + 70 + 5 + 1) / 0.65)  # prompt + output
    assert summary["output_tokens_per_s"] == pytest.approx(6 / 0.65)
    assert summary["requests_per_s"] == pytest.approx(2 / 0.65)


@settings(max_examples=40, deadline=None)
@given(prompts=prompts_st, outputs=st.integers(1, 30), qps=st.floats(0.5, 200), seed=st.integers(0, 99),
       blocks=st.integers(400, 5000), pp=st.integers(1, 3), budget=st.integers(256, 4096))
def test_tokens_conserved_and_causality(prompts, outputs, qps, seed, blocks, pp, budget):
    cost = LinearCost()
    requests = make_requests(trace(prompts, outputs), num_requests=2 * len(prompts), qps=qps, seed=seed)
    sim = simulate(requests, vllm(blocks=blocks, budget=budget), cost, pp=pp)
    computed = sum(sum(new) for new, _ in cost.steps)
    recomputed = sum(r.preemptions for r in sim.requests)
    for r in sim.requests:
        assert r.num_output == r.output_tokens
        assert r.arrival_ms <= r.first_token_ms <= r.finish_ms
    if not recomputed:
        assert computed == sum(r.prompt_tokens + r.output_tokens - 1 for r in sim.requests)
    else:
        assert computed > sum(r.prompt_tokens + r.output_tokens - 1 for r in sim.requests)


@settings(max_examples=15, deadline=None)
@given(prompts=prompts_st, seed=st.integers(0, 99), pp=st.integers(1, 2))
def test_ttft_rises_with_load(prompts, seed, pp):
    def mean_ttft(qps):
        requests = make_requests(trace(prompts, 30), num_requests=60, qps=qps, seed=seed)
        return request_metrics(simulate(requests, vllm(), LinearCost(), pp=pp).requests)["ttft_ms"].mean()
    light, heavy = mean_ttft(1.0), mean_ttft(1000.0)
    assert heavy > light


def test_simulation_is_deterministic():
    def run():
        requests = make_requests(trace([500, 1500, 2500], 25), num_requests=50, qps=20.0, seed=7)
        return summarize(simulate(requests, vllm(blocks=600), LinearCost(), pp=2))
    assert run() == run()


# ---------------------------------------------------------------------------------------------------
# kernel step cost: the static reduction
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, trace_name, tp, pp, gpu, ep", [
    ("Qwen2.5-14B", "arxiv_8", 1, 1, "H100", 1),
    ("Llama-3.1-70B", "vllm_splitwise64", 4, 2, "H800", 1),
    ("Qwen2.5-14B", "splitwise_32", 1, 1, "A100", 1),
    ("Mixtral-8x7B", "arxiv_8", 2, 1, "H100", 1),  # MoE: no dense MLP, expert passes per token count
    ("Mixtral-8x7B", "arxiv_8", 2, 1, "H100", 2),  # experts in two groups (serve_sim --ep)
])
def test_static_scheduler_reproduces_aggregator_total(engine, model, trace_name, tp, pp, gpu, ep):
    cfg, t = load_model_config(model), load_trace(trace_name)
    workload = build_workload(cfg, list(t.prompt_tokens), t.output_tokens, tp=tp, pp=pp, ep=ep,
                              prefill_attn="fa3_ragged" if gpu != "A100" else "fa2_ragged")
    expected = engine.predict_workload(workload, gpu)
    cost = KernelStepCost(engine, cfg, gpu, tp, pp, ep=ep)
    sim = simulate(make_requests(t), StaticScheduler(), cost, pp=pp)
    assert sim.steps == len(workload.iterations)
    # each operator's single duration is memoised as the engine writes it (10⁻⁶ ms), and a decode step repeats the
    # same shapes, so the rounding adds up: 1.6·10⁻⁶ relative on the MoE case (docs/SERVING.md: up to 6.7·10⁻⁶)
    assert sim.makespan_ms == pytest.approx(expected["summary"]["total_duration_ms"], rel=1e-5)
    # the extrapolated share of the simulated kernel time is the aggregator's (phases aside: serving steps mix them)
    shares = cost.extrapolation()
    assert shares["by_operator"].keys() == expected["extrapolation"]["by_operator"].keys()
    for category, part in expected["extrapolation"]["by_operator"].items():
        assert shares["by_operator"][category] == pytest.approx(part, abs=1e-4), category
    assert shares["share"] == pytest.approx(expected["extrapolation"]["share"], abs=1e-4)


@pytest.mark.parametrize("model, trace_name, tp, pp, gpu", [
    ("Qwen2.5-14B", "arxiv_8", 1, 1, "B200"),  # attention, RMSNorm and SiLU*Mul outside their training GPUs
    ("Llama-3.1-70B", "vllm_splitwise64", 4, 2, "H800"),  # measured collectives: at their point value
])
def test_static_scheduler_interval_ends_are_the_aggregators(engine, model, trace_name, tp, pp, gpu):
    """Every kernel at the low (high) end of its interval: the static batch's makespan is the aggregator's interval
    end of the same workload, and the collectives' note is the aggregator's."""
    cfg, t = load_model_config(model), load_trace(trace_name)
    workload = build_workload(cfg, list(t.prompt_tokens), t.output_tokens, tp=tp, pp=pp,
                              prefill_attn="fa3_ragged" if gpu == "H800" else "fa2_ragged")
    expected = engine.predict_workload(workload, gpu)["interval"]
    makespans = []
    for end in ("low", "high"):
        cost = KernelStepCost(engine, cfg, gpu, tp, pp, interval_end=end)
        makespans.append(simulate(make_requests(t), StaticScheduler(), cost, pp=pp).makespan_ms)
        assert makespans[-1] == pytest.approx(expected[end]["total_duration_ms"], rel=1e-5)
        assert cost.collectives_at_point == ("note" in expected)
    assert makespans[0] < makespans[1]
    with pytest.raises(ValueError, match="interval_end must be one of point, low, high, got 'mid'"):
        KernelStepCost(engine, cfg, gpu, tp, pp, interval_end="mid")


def test_step_cost_memo_is_exact_and_split_attention_is_two_launches(engine):
    cfg = load_model_config("Llama-3.1-8B")
    cost = KernelStepCost(engine, cfg, "H100")
    new, context = [1, 1, 700], [300, 900, 700]
    assert cost.known(new, context) is None
    first = cost(new, context)
    calls = cost.engine_calls
    assert cost(new, context) == first == cost.known(new, context) and cost.engine_calls == calls
    attention = cost.attention_shapes(new, context)
    assert [(a[0], a[2]) for a in attention] == [("fa3_ragged", (700,)), ("fa2_paged", (1, 1))]
    single = KernelStepCost(engine, cfg, "H100", mixed_attention="single")
    [one] = single.attention_shapes(new, context)
    assert one[2] == tuple(new) and one[3] == tuple(context)
    # the generator's one-iteration workload, predicted by the engine's own per-iteration call, costs the same
    for step_cost, attention_type in ((single, "fa3_ragged"), (cost, None)):
        operators = iteration_operators(cfg, RankShapes.of(cfg, 1), 1, 1, new, context, sum(new), "fa3_ragged", 65)
        if attention_type is None:  # split: the two launches replace the one
            operators["attention"] = None
            expected = engine.iteration_ms(Iteration("prefill", **operators), "H100") + sum(
                engine.iteration_ms(Iteration("prefill", attention=AttentionOp(*shape, count=32)), "H100")
                for shape in attention)
        else:
            expected = engine.iteration_ms(Iteration("prefill", **operators), "H100")
        # the engine rounds each kernel to 1e-6 ms, and the memo sums rounded single-kernel costs
        assert step_cost(new, context) == pytest.approx(expected, rel=1e-5)


def test_estimate_scales_the_last_prediction_and_prefetch_batches(engine):
    cost = KernelStepCost(engine, load_model_config("Llama-3.1-8B"), "H100")
    steps = [([1, 1], [300 + j, 500 + j]) for j in range(5)]
    cost.prefetch(steps[:1])
    assert cost.engine_calls == 1 and cost.known(*steps[1]) is None
    assert cost.estimate(*steps[1]) == pytest.approx(cost(*steps[0]), rel=0.01)
    assert cost.engine_calls == 2  # the token block, on the first step costed
    cost.prefetch(steps)
    assert cost.engine_calls == 3 and all(cost.known(*step) is not None for step in steps)


class InstanceByInstanceCost:
    """The step cost the slow way (as the simulator computed it before memoising per token count): the generator's
    operators of the step, each predicted as its own one-operator iteration, Σ count × single in the generator's
    order; a split step's two attention launches last."""

    def __init__(self, engine, cfg, gpu, tp, pp):
        self.engine, self.cfg, self.gpu, self.tp, self.pp = engine, cfg, gpu, tp, pp
        self.steps = []  # (new, context, ms) of every step costed

    def operators(self, new, context, attention):
        return iteration_operators(self.cfg, RankShapes.of(self.cfg, self.tp), self.tp, self.pp, list(new),
                                   list(context), sum(new), attention, 2 * self.cfg.num_hidden_layers + 1)

    def __call__(self, new, context):
        extra = []
        if max(new) == 1:
            operators = self.operators(new, context, "fa2_paged")
        else:
            operators = self.operators(new, context, "fa3_ragged")
            if min(new) == 1:  # split: one prefill launch over the prefills, one decode launch over the decodes
                operators["attention"] = None
                prefill = list(zip(*[(n, c) for n, c in zip(new, context) if n > 1]))
                decode = [c for n, c in zip(new, context) if n == 1]
                extra = [self.operators(*prefill, "fa3_ragged")["attention"],
                         self.operators([1] * len(decode), decode, "fa2_paged")["attention"]]
        items = [(category, op) for category, value in operators.items()
                 for op in (value if isinstance(value, list) else [value]) if op is not None]
        ms = sum(self.single(category, op) * op.count for category, op in items + [("attention", a) for a in extra])
        self.steps.append((list(new), list(context), ms))
        return ms

    def single(self, category, op):
        one = replace(op, count=1)
        iteration = Iteration("decode", **{category: [one] if category in ("gemm", "communication") else one})
        return self.engine.iteration_ms(iteration, self.gpu, tp_size=self.tp)


def test_memoised_step_cost_and_speculation_reproduce_the_slow_path(engine):
    """Memo per (tokens, sequences) + attention shape, and predicting ahead on a speculative copy of the simulation,
    give bit for bit the run of the instance-by-instance step cost (chunked prefill, split steps, preemption, PP)."""
    cfg = load_model_config("Llama-3.1-8B")
    costs = [InstanceByInstanceCost(engine, cfg, "H100", 2, 2), KernelStepCost(engine, cfg, "H100", tp=2, pp=2),
             KernelStepCost(engine, cfg, "H100", tp=2, pp=2)]
    runs = []
    for cost, ahead in zip(costs, (0, 0, 64)):
        requests = make_requests(load_serving_trace("splitwise_48"), num_requests=40, qps=60.0, seed=2,
                                 per_request_outputs=True)
        sim = simulate(requests, vllm(blocks=300, seqs=32, budget=1024), cost, pp=2, speculation_steps=ahead)
        runs.append((request_metrics(sim.requests), sim.steps))
    (slow, steps), *fast = runs
    assert slow["preemptions"].sum() > 0
    for metrics, fast_steps in fast:
        assert fast_steps == steps and all(np.array_equal(slow[k], metrics[k], equal_nan=True) for k in slow)
    assert costs[2].engine_calls < costs[1].engine_calls / 4
    # vLLM's vocabulary-parallel lm_head: each step gathers its sequences' logits (memoised by sequence count)
    gathers = {key[1][1] for key in costs[1].single_ms if key[0] == "communication" and key[1][0] == "all_gather"}
    assert gathers and all(volume % (cfg.vocab_size * 2) == 0 for volume in gathers)
    split = [(new, context) for new, context, _ in costs[0].steps if min(new) == 1 < max(new)]
    assert split and [costs[1](new, context) for new, context, _ in costs[0].steps] == [ms for *_, ms in costs[0].steps]


def test_decode_bucket_approximates_only_decode_attention(engine):
    cfg = load_model_config("Llama-3.1-8B")
    exact = KernelStepCost(engine, cfg, "H100")
    bucketed = KernelStepCost(engine, cfg, "H100", decode_bucket=16)
    assert bucketed([1, 1], [320, 320]) == exact([1, 1], [320, 320])  # uniform, on a bucket boundary
    attention = bucketed.attention_shapes([1, 1, 500], [100, 301, 500])
    assert attention[0][3] == (500,) and attention[1][3] == (208, 208)  # mean 200.5 -> 208
    # never beyond the launch's longest context: a huge bucket would charge every request KV it does not have
    huge = KernelStepCost(engine, cfg, "H100", decode_bucket=10 ** 9)
    assert huge.attention_shapes([1, 1], [100, 301])[0][3] == (301, 301)
    assert bucketed.attention_shapes([1, 1], [1000, 1000])[0][3] == (1000, 1000)  # uniform: exact, not 1008


def test_the_qk_norm_approximation_is_refused_for_a_model_without_qk_norm(engine, capsys):
    with pytest.raises(UserError, match="Llama-3.1-8B \\(LlamaForCausalLM\\) has none"):
        KernelStepCost(engine, load_model_config("Llama-3.1-8B"), "H100", qk_norm_rmsnorm=True)
    qwen3 = load_model_config("Qwen3-14B")
    assert KernelStepCost(engine, qwen3, "H100", qk_norm_rmsnorm=True).rmsnorm_count == 4 * 40 + 1
    assert KernelStepCost(engine, qwen3, "H100").rmsnorm_count == 2 * 40 + 1


def test_static_scheduler_checks_memory_like_the_aggregator(engine):
    config = ServingConfig("Llama-3.1-70B", "splitwise_48", "L40S", scheduler="static", num_requests=6)
    t = load_trace("splitwise_48")
    expected = check_memory(load_model_config("Llama-3.1-70B"), engine.gpu("L40S"), list(t.prompt_tokens[:6]),
                            t.output_tokens).message(1)
    with pytest.raises(UserError) as error:
        simulate_config(config, engine)
    assert str(error.value).endswith(expected) and "the smallest TP that fits is 4" in expected
    assert simulate_config(replace(config, tp=4), engine).simulation.steps == t.output_tokens


def test_pp_beyond_the_layer_count_is_refused(engine):
    with pytest.raises(UserError, match="--pp 64 exceeds the 32 layers of Llama-3.1-8B"):
        simulate_config(ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", pp=64, num_requests=2), engine)


def test_overlong_requests_are_refused(engine, tmp_path):
    """A request beyond the config's max_position_embeddings is one vLLM would refuse."""
    base = json.loads((DEFAULT_CONFIG_DIR / "Llama-3.1-8B.json").read_text())
    short = tmp_path / "short.json"
    short.write_text(json.dumps({key: value for key, value in {**base, "max_position_embeddings": 128}.items()
                                 if key != "rope_scaling"}))
    with pytest.raises(UserError, match="exceeds max_position_embeddings 128"):
        simulate_config(ServingConfig(str(short), "splitwise_48", "H100", num_requests=2), engine)


@pytest.mark.parametrize("gpu, tp", [("H100", 1), ("H800", 2)])
def test_fp8_static_scheduler_reproduces_the_aggregators_fp8_workload(engine, gpu, tp):
    """--dtype fp8 costs each step as the workload generator's FP8 workload: FP8 linear layers and their activation
    quantisation, lm_head in BF16 (the simulator refused FP8 checkpoints: it modelled BF16 layers only)."""
    cfg, t = load_model_config("Llama-3.1-8B"), load_trace("arxiv_8")
    workload = build_workload(cfg, list(t.prompt_tokens), t.output_tokens, tp=tp, prefill_attn="fa3_ragged",
                              dtype="fp8")
    expected = engine.predict_workload(workload, gpu)
    sim = simulate(make_requests(t), StaticScheduler(), KernelStepCost(engine, cfg, gpu, tp, dtype="fp8"))
    assert sim.makespan_ms == pytest.approx(expected["summary"]["total_duration_ms"], rel=1e-5)
    bf16 = simulate(make_requests(t), StaticScheduler(), KernelStepCost(engine, cfg, gpu, tp))
    assert sim.makespan_ms != pytest.approx(bf16.makespan_ms, rel=1e-6)


def test_fp8_weights_free_kv_cache_and_fp8_checkpoints_are_simulated_as_fp8(engine, tmp_path):
    base = json.loads((DEFAULT_CONFIG_DIR / "Llama-3.1-8B.json").read_text())
    checkpoint = tmp_path / "fp8.json"
    checkpoint.write_text(json.dumps({**base, "quantization_config": {"quant_method": "fp8"}}))
    runs = {name: simulate_config(ServingConfig(config, "splitwise_48", "H100", num_requests=4, dtype=dtype), engine)
            for name, config, dtype in (("bf16", "Llama-3.1-8B", None), ("fp8", "Llama-3.1-8B", "fp8"),
                                        ("checkpoint", str(checkpoint), None))}
    assert runs["bf16"].settings["dtype"] == "bf16"
    assert runs["fp8"].settings["dtype"] == runs["checkpoint"].settings["dtype"] == "fp8"
    cfg = load_model_config("Llama-3.1-8B")
    saved = weight_bytes_per_gpu(cfg, 1) - weight_bytes_per_gpu(cfg, 1, dtype="fp8")  # linear layers at 1 byte
    more = runs["fp8"].settings["kv_cache_blocks"] - runs["bf16"].settings["kv_cache_blocks"]
    assert saved > 6e9 and abs(more - saved / kv_cache_bytes_per_gpu(cfg, [16], tp=1)) <= 1
    assert runs["fp8"].simulation.makespan_ms == runs["checkpoint"].simulation.makespan_ms
    with pytest.raises(UserError, match=r"FP8 checkpoint .*: simulate it with --dtype fp8, or remove"):
        simulate_config(ServingConfig(str(checkpoint), "splitwise_48", "H100", num_requests=2, dtype="bf16"), engine)
    with pytest.raises(UserError, match="--dtype fp8: A100 has no FP8 tensor-core rate"):
        simulate_config(ServingConfig("Llama-3.1-8B", "splitwise_48", "A100", num_requests=2, dtype="fp8"), engine)
    with pytest.raises(UserError, match="FP8 mixture-of-experts layers are not modelled.*; use --dtype bf16"):
        simulate_config(ServingConfig("Mixtral-8x7B", "splitwise_48", "H100", tp=2, num_requests=2, dtype="fp8"),
                        engine)
    moe = tmp_path / "moe_fp8.json"  # an FP8 MoE checkpoint: its fix is to drop the quantisation, whatever --dtype
    moe.write_text(json.dumps({**json.loads((DEFAULT_CONFIG_DIR / "Qwen3-30B-A3B.json").read_text()),
                               "quantization_config": {"quant_method": "fp8"}}))
    for dtype in (None, "bf16", "fp8"):
        with pytest.raises(UserError, match="FP8 mixture-of-experts layers are not modelled.*; remove "
                                            "quantization_config to simulate its BF16 version"):
            simulate_config(ServingConfig(str(moe), "splitwise_48", "H100", num_requests=2, dtype=dtype), engine)
    with pytest.raises(UserError, match=r"^FP8 weights \(quantization_config of fp8\): A100 has no FP8"):
        simulate_config(ServingConfig(str(checkpoint), "splitwise_48", "A100", num_requests=2), engine)
    from pipeweave.serving.search import main as search_main  # refused once, not as every candidate infeasible
    with pytest.raises(UserError, match="FP8 checkpoint"):
        search_main(["--model_config", str(checkpoint), "--dtype", "bf16", "--hardware", "H100", "--gpu_budget", "2",
                     "--trace", "splitwise_48", "--num_requests", "2", "--output", str(tmp_path / "search.csv")])
    assert not (tmp_path / "search.csv").exists()


@pytest.mark.parametrize("model, limit", [("Llama-3-8B", 8192), ("Llama-3-70B", 8192), ("Mixtral-8x7B", 32768),
                                          ("Qwen3-14B", 40960), ("Qwen3-32B", 40960), ("Qwen3-30B-A3B", 40960),
                                          ("Qwen3-235B-A22B", 40960), ("Qwen2-72B", 32768), ("Qwen2.5-14B", 32768),
                                          ("Qwen2.5-32B", 32768)])
def test_shipped_configs_refuse_requests_beyond_max_position_embeddings(model, limit):
    """The shipped configs carry their Hugging Face max_position_embeddings: the documented refusal fires for them."""
    cfg = load_model_config(model)
    check_model_and_requests(cfg, [Request(0, 0.0, limit - 10, 10)])
    with pytest.raises(UserError, match=rf"request 1 of the stream \(from 0, as in the per-request CSV; {limit - 10} "
                                        rf"prompt \+ 11 output tokens\) exceeds max_position_embeddings {limit} of "
                                        rf"config {model}"):
        check_model_and_requests(cfg, [Request(0, 0.0, 8, 2), Request(1, 0.0, limit - 10, 11)])


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Llama-3.1-70B"])
def test_llama3_rope_scaled_configs_refuse_requests_beyond_their_extended_length(model):
    """Llama-3.1's llama3 rope_scaling took any length (a 500,000-token request was simulated); its
    max_position_embeddings, 131,072, already is the extended length vLLM serves."""
    cfg = load_model_config(model)
    check_model_and_requests(cfg, [Request(0, 0.0, 131_062, 10)])
    with pytest.raises(UserError, match="exceeds max_position_embeddings 131072"):
        check_model_and_requests(cfg, [Request(0, 0.0, 500_000, 10)])


def test_a_config_without_max_position_embeddings_takes_any_length():
    """Qwen2-57B-A14B's config omits the key: its limit is not known to this project."""
    assert "max_position_embeddings" not in json.loads((DEFAULT_CONFIG_DIR / "Qwen2-57B-A14B.json").read_text())
    check_model_and_requests(load_model_config("Qwen2-57B-A14B"), [Request(0, 0.0, 500_000, 10)])


def test_kv_pre_check_counts_prompt_plus_output_minus_one(engine, tmp_path, monkeypatch):
    """A request never holds KV for its last output token: 60 prompt + 5 output tokens fit 4 blocks of 16, which a
    cache of 5 holds beside vLLM's null block. (A config without max_position_embeddings, whose max_model_len is
    unknown: with one, vLLM's start-up check comes first.)"""
    monkeypatch.setattr(serving_run, "kv_cache_blocks", lambda *args, **kwargs: 5)
    config = json.loads((DEFAULT_CONFIG_DIR / "Llama-3.1-8B.json").read_text())
    del config["max_position_embeddings"]
    model = tmp_path / "Llama-3.1-8B-no-length.json"
    model.write_text(json.dumps(config))
    path = tmp_path / "one.csv"
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens\n1,60,5,5\n")
    run = simulate_config(ServingConfig(str(model), str(path), "H100"), engine)
    assert run.settings["kv_cache_tokens"] == 80 and run.simulation.requests[0].num_output == 5
    assert run.settings["max_model_len"] is None
    path.write_text("request,prompt_tokens,decode_tokens,output_tokens\n1,61,5,5\n")
    with pytest.raises(UserError, match=r"request 0 of the stream \(from 0, as in the per-request CSV\) needs 65 "
                                        r"tokens of KV cache \(61 prompt \+ 5 output tokens, less the last, whose KV "
                                        r"is never stored\) but H100 TP1 x PP1 holds 64 \(vLLM's null block "
                                        r"aside\)"):
        simulate_config(ServingConfig(str(model), str(path), "H100"), engine)


def test_vllm_refuses_to_start_when_one_request_of_max_model_len_does_not_fit(engine):
    """vLLM checks at start-up that one request of max_model_len (by default the config's max_position_embeddings)
    fits in the KV cache: Llama-3.1-70B on two H100s leaves room for about 20,000 tokens, not 131,072 (80 layers x
    8 KV heads / 2 x 128 x K,V x 2 B = 160 KiB per token, about 21.5 GB for one such request)."""
    config = ServingConfig("Llama-3.1-70B", "splitwise_48", "H100", tp=2, num_requests=8)
    with pytest.raises(UserError) as error:
        simulate_config(config, engine)
    message = str(error.value)
    capacity = int(re.search(r"give --max_model_len (\d+) or less, or more GPUs \(it needs TP 4 at PP1\)$",
                             message).group(1))
    assert message.startswith("vLLM would not start: max_model_len (by default max_position_embeddings) 131072 needs "
                              "8192 KV blocks for one request, but H100 TP2 x PP1 holds ")
    assert 15_000 < capacity < 30_000 and capacity % 16 == 0
    run = simulate_config(replace(config, max_model_len=capacity), engine)
    assert run.settings["max_model_len"] == capacity and run.settings["kv_cache_tokens"] == capacity
    with pytest.raises(UserError, match=rf"needs {capacity // 16 + 1} KV blocks for one request"):
        simulate_config(replace(config, max_model_len=capacity + 1), engine)
    assert simulate_config(replace(config, tp=4), engine).settings["max_model_len"] == 131_072
    with pytest.raises(UserError, match=r"^--max_model_len 200000 exceeds max_position_embeddings 131072 of config "
                                        r"Llama-3.1-70B, which vLLM refuses at start-up$"):
        simulate_config(replace(config, tp=4, max_model_len=200_000), engine)
    with pytest.raises(UserError, match=r"; \d+ prompt \+ 143 output tokens\) exceeds --max_model_len 256, which "
                                        r"vLLM refuses$"):
        simulate_config(replace(config, tp=4, max_model_len=256), engine)
    with pytest.raises(UserError, match=r"^--max_model_len applies to --scheduler vllm"):
        simulate_config(replace(config, scheduler="static", max_model_len=4096), engine)


@pytest.fixture
def scheduled(monkeypatch):
    """The steps that the vLLM scheduler built by simulate_config hands the simulator, as (new tokens per sequence,
    KV blocks in use): the settings echo what was asked, only these show what the scheduler was given. The
    look-ahead's copies are not recorded: their steps run on estimated durations and may never happen."""
    steps = []

    class Recording(VllmScheduler):
        record = True

        def schedule(self):
            entries = super().schedule()
            if self.record and entries:
                steps.append(([e[1] for e in entries], self.blocks.num_blocks - self.blocks.free))
            return entries

        def speculative_copy(self, copy_of):
            other = super().speculative_copy(copy_of)
            other.record = False
            return other

    monkeypatch.setattr(serving_run, "VllmScheduler", Recording)
    return steps


def test_kv_limited_run_on_the_kernel_cost(engine, scheduled):
    config = ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", qps=50.0, num_requests=40, seed=1,
                           max_num_seqs=8, max_num_batched_tokens=256)
    run = simulate_config(config, engine)
    assert run.settings["max_num_seqs"] == 8 and run.settings["kv_cache_blocks"] > 1000
    summary = summarize(run.simulation)
    assert summary["num_requests"] == 40 and summary["ttft_ms"]["p50"] > 0
    assert len(scheduled) == run.simulation.steps
    # half the prompts exceed the budget (up to 410 tokens) and 50 req/s of 143-token outputs keep more than 8
    # requests wanting to run: both limits are reached, so a scheduler not given them exceeds them
    assert max(len(new) for new, _ in scheduled) == 8
    assert max(sum(new) for new, _ in scheduled) == 256


def test_gpu_memory_utilization_sizes_the_kv_cache_that_binds(engine, scheduled):
    """16 requests at once end up holding 315 blocks of 16 tokens: the default 0.9 x memory (~27,600 blocks) holds
    them all; a utilization that leaves 170 blocks beside the weights (each block one more block's bytes of memory
    below the default) makes the last running requests be preempted and recomputed, and the blocks in use never
    exceed the cache the settings report."""
    from pipeweave.memory import kv_cache_bytes_per_gpu

    # vLLM starts on so small a cache only with a max_model_len it holds
    config = ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", num_requests=16, max_model_len=2048)
    default = simulate_config(config, engine)
    assert summarize(default.simulation)["preemptions"] == 0
    block_bytes = kv_cache_bytes_per_gpu(load_model_config("Llama-3.1-8B"), [16], 1, 1)
    utilization = (default.settings["gpu_memory_utilization"] - (default.settings["kv_cache_blocks"] - 170.5)
                   * block_bytes / engine.gpu("H100").total_global_mem)
    scheduled.clear()
    small = simulate_config(replace(config, gpu_memory_utilization=utilization), engine)
    assert small.settings["gpu_memory_utilization"] == utilization
    assert abs(small.settings["kv_cache_blocks"] - 170) <= 1
    assert summarize(small.simulation)["preemptions"] > 0
    assert all(r.num_output == r.output_tokens for r in small.simulation.requests)
    # every block but vLLM's null block is used
    assert max(used for _, used in scheduled) == small.settings["kv_cache_blocks"] - 1


def test_max_concurrent_batches_caps_the_micro_batches_in_flight(engine):
    """With PP 2, two micro-batches in flight (the default, vLLM V1's batch queue) overlap the chunked prefills of a
    512-token budget across the stages; one at a time leaves a stage idle while the other works."""
    config = ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", pp=2, num_requests=16, max_num_seqs=64,
                           max_num_batched_tokens=512)
    runs = {batches: simulate_config(replace(config, max_concurrent_batches=batches), engine).simulation
            for batches in (None, 1, 2)}
    assert runs[None].makespan_ms == runs[2].makespan_ms
    # 7 % with these untrained models, 4 % with the shipped ones
    assert runs[1].makespan_ms > 1.03 * runs[2].makespan_ms


# ---------------------------------------------------------------------------------------------------
# command lines
# ---------------------------------------------------------------------------------------------------

def run_script(script, *args):
    return subprocess.run([sys.executable, str(REPO / script), *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_serve_sim_writes_summary_csv_and_plot(tmp_path, engine):
    out = tmp_path / "out.json"
    result = run_script("serve_sim.py", "--model_config", "Llama-3.1-8B", "--trace", "splitwise_48", "--hardware",
                        "H100", "--qps", "30", "--num_requests", "30", "--output", out, "--plot",
                        tmp_path / "cdf.png", "--model_dir", engine.model_dir, "--collective_estimate", "analytical")
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    summary = written["summary"]
    # the predictor's flags change the prediction: recorded as given, null when not given
    assert (written["config"]["model_dir"], written["config"]["hardware_dir"],
            written["config"]["collective_estimate"]) == (str(engine.model_dir), None, "analytical")
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert set(summary[key]) >= {"p50", "p90", "p99"}
    assert summary["makespan_ms"] > 0 and summary["throughput_tokens_per_s"] > 0
    rows = (tmp_path / "out.csv").read_text().splitlines()
    assert len(rows) == 31 and rows[0].startswith("request,prompt_tokens")
    assert (tmp_path / "cdf.png").stat().st_size > 1000


def test_serve_sim_and_search_config_apply_a_calibration_of_their_gpu_only(tmp_path, engine):
    """A calibration from calibrate.py could not be given to the serving tools: a user who measured one run of their
    GPU sized the deployment with the zero-shot step times."""
    from pipeweave.calibration import Calibration, file_digest, load_prior
    from pipeweave.calibration_design import INTERCEPTS, PARAMS
    from pipeweave.serving.cli import main as serve_main
    from pipeweave.serving.search import main as search_main

    theta = np.array([np.log(1.5) if name in INTERCEPTS else 0.0 for name in PARAMS])  # every kernel 1.5x slower
    calibration = tmp_path / "h100.json"
    Calibration("H100", "NVIDIA H100", theta, np.zeros(len(PARAMS)), {"e2e": {"runs": ["test.json"]}}, {}, {},
                load_prior().standardisation).save(calibration)
    flags = ["--model_config", "Llama-3.1-8B", "--trace", "splitwise_48", "--qps", "30", "--num_requests", "20",
             "--model_dir", str(engine.model_dir), "--collective_estimate", "analytical"]
    runs = {}
    for name, extra in (("plain", []), ("calibrated", ["--calibration", str(calibration)])):
        out = tmp_path / f"{name}.json"
        assert run_cli(serve_main, [*flags, "--hardware", "H100", "--output", str(out), *extra]) == 0
        runs[name] = json.loads(out.read_text())
    assert runs["calibrated"]["config"]["calibration"] == str(calibration)
    assert runs["calibrated"]["config"]["calibration_digest"] == file_digest(calibration)
    assert runs["plain"]["config"]["calibration_digest"] is None and "calibration" not in runs["plain"]
    assert runs["calibrated"]["calibration"]["hardware"] == "NVIDIA H100"  # the aggregator's record of it
    assert runs["calibrated"]["summary"]["tpot_ms"]["p50"] > 1.3 * runs["plain"]["summary"]["tpot_ms"]["p50"]
    assert run_cli(serve_main, [*flags, "--hardware", "A100", "--output", str(tmp_path / "a100.json"),
                                "--calibration", str(calibration)]) == 2
    tables = {}
    for name, extra in (("plain", []), ("calibrated", ["--calibration", str(calibration)])):
        out = tmp_path / f"{name}.csv"
        assert run_cli(search_main, [*flags, "--hardware", "H100,A100", "--gpu_budget", "1", "--max_num_seqs", "8",
                                     "--pp", "1", "--output", str(out), *extra]) == 0
        tables[name] = pd.read_csv(out).set_index("hardware")
    assert tables["calibrated"].loc["H100", "tpot_ms"] > 1.3 * tables["plain"].loc["H100", "tpot_ms"]
    assert tables["calibrated"].loc["A100", "tpot_ms"] == tables["plain"].loc["A100", "tpot_ms"]
    assert tables["calibrated"]["calibration"].fillna("").to_dict() == {"H100": str(calibration), "A100": ""}
    assert run_cli(serve_main, [*flags, "--hardware", "H100", "--output", str(calibration),
                                "--calibration", str(calibration)]) == 2  # it would replace the calibration


@pytest.mark.parametrize("args, message", [
    (["--hardware", "H999"], "known"),
    (["--qps", "-1"], "--qps must be a finite number > 0"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
    (["--scheduler", "static", "--mixed_attention", "single"], "--mixed_attention applies to --scheduler vllm"),
    (["--scheduler", "static", "--max_concurrent_batches", "1"], "--max_concurrent_batches applies to --scheduler vllm"),
    (["--tp", "3"], "not divisible by tp 3"),
    (["--trace", "nope"], "unknown trace"),
    (["--qps", "1e-300", "--num_requests", "5"], "use a larger --qps"),
    (["--collective_hardware", "H999"], "unknown GPU 'H999'"),  # at TP 1 it was recorded in the output unchecked
    (["--plot", "cdf.pdf"], "the figure is written as PNG; give a .png file name"),  # it held PNG bytes
])
def test_serve_sim_errors_are_one_line(tmp_path, args, message):
    out = tmp_path / "out.json"
    flags = {"--model_config": "Llama-3.1-8B", "--trace": "splitwise_48", "--hardware": "H100", "--output": out}
    flags.update(zip(args[::2], args[1::2]))
    result = run_script("serve_sim.py", *[x for pair in flags.items() for x in pair])
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not out.exists()


def test_serve_sim_refuses_an_output_over_its_trace(tmp_path):
    trace_path = tmp_path / "mine.csv"
    trace_path.write_text((REPO / "workload" / "traces" / "splitwise_48.csv").read_text())
    before = trace_path.read_text()
    result = run_script("serve_sim.py", "--model_config", "Llama-3.1-8B", "--trace", trace_path, "--hardware", "H100",
                        "--output", tmp_path / "mine.json")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "per-request CSV of --output" in result.stderr and "would overwrite the --trace file" in result.stderr
    assert trace_path.read_text() == before and not (tmp_path / "mine.json").exists()


def test_serving_takes_a_hugging_face_model_directory(tmp_path):
    """serve_sim.py and search_config.py check --model_config before any work: a downloaded model's directory
    (its config.json) passes, one without config.json is refused with that reason."""
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text((DEFAULT_CONFIG_DIR / "Llama-3.1-8B.json").read_text())
    check_paths(Namespace(model_config=str(folder), trace="splitwise_48"), {"--output": tmp_path / "out.json"})
    with pytest.raises(UserError, match=f"^model config directory {re.escape(str(tmp_path))} has no config.json"):
        check_paths(Namespace(model_config=str(tmp_path), trace="splitwise_48"), {"--output": tmp_path / "o.json"})


def test_output_over_another_output_names_it_once(tmp_path):
    args = Namespace(model_config="Llama-3.1-8B", trace="splitwise_48")
    outputs = {"--output": tmp_path / "out.json", "the per-request CSV of --output": tmp_path / "out.csv",
               "--plot": tmp_path / "out.csv"}
    with pytest.raises(UserError) as error:
        check_paths(args, outputs)
    assert str(error.value) == (f"--plot {tmp_path / 'out.csv'} would overwrite the per-request CSV of --output; "
                                f"choose another path")
    with pytest.raises(UserError, match=r"--plot \S+ would overwrite the --output file;"):
        check_paths(args, {"--output": tmp_path / "out.json", "--plot": tmp_path / "out.json"})


def test_search_on_a_dask_local_cluster_matches_in_process(engine):
    distributed = pytest.importorskip("distributed")
    from pipeweave.serving.search import candidates, run_sweep

    base = ServingConfig("Llama-3.1-8B", "splitwise_48", "H100", qps=20.0, num_requests=12)
    configs = candidates(base, ["H100"], 2, [1, 2, 3], [1], [4, 64])
    engine = (str(engine.model_dir), str(engine.hardware_dir), (), "analytical", None)
    targets = {"ttft_ms": 1e9, "ttft_percentile": 90, "tpot_ms": None, "tpot_percentile": 90}
    local = run_sweep(configs, engine, targets)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        remote = run_sweep(configs, engine, targets, scheduler_address=cluster.scheduler_address)
    assert len(local) == 4  # TP3 > budget 2 is not a candidate
    assert local.equals(remote)
    assert list(local["feasible"]) == [True] * 4
    best = local.iloc[0]
    assert best["rank"] == 1 and best["output_tokens_per_s_per_gpu"] == local["output_tokens_per_s_per_gpu"].max()


def test_a_tpot_target_of_a_stream_without_second_tokens_is_met_and_said_unchecked(tmp_path, engine):
    trace = tmp_path / "one_token.csv"
    trace.write_text("request,prompt_tokens,decode_tokens,output_tokens\n1,100,0,1\n2,10,0,1\n")
    out = tmp_path / "search.csv"
    result = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H100", "--gpu_budget", "1",
                        "--max_num_seqs", "32", "--trace", trace, "--tpot_ms", "30", "--ttft_ms", "1000",
                        "--model_dir", engine.model_dir, "--output", out)
    assert result.returncode == 0, result.stderr
    row = pd.read_csv(out).iloc[0]
    assert row["feasible"] and row["meets_targets"] and pd.isna(row["tpot_ms"])
    assert row["reason"] == "TPOT undefined (no request has a second output token): --tpot_ms not checked"


def test_search_config_cli_ranks_and_plots(tmp_path, engine):
    out = tmp_path / "search.csv"
    result = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H100", "--gpu_budget", "2",
                        "--pp", "1", "--max_num_seqs", "8", "--trace", "splitwise_48", "--qps", "20",
                        "--num_requests", "10", "--tpot_ms", "1e9", "--collective_estimate", "analytical",
                        "--model_dir", engine.model_dir, "--output", out)
    assert result.returncode == 0, result.stderr
    rows = out.read_text().splitlines()
    assert rows[0].startswith("rank,hardware,dtype,tp,pp,ep,gpus,max_num_seqs,feasible,meets_targets")
    # one GPU beats two per GPU at the same rate
    assert len(rows) == 3 and rows[1].startswith("1,H100,bf16,1,1,1,1,8,True,True")
    shares = pd.read_csv(out)["extrapolated_share"]  # of each row's simulated kernel time
    assert shares.between(0, 1).all()
    assert sorted(tmp_path.iterdir()) == [out, out.with_suffix(".json")]  # no plot without --plot
    recorded = json.loads(out.with_suffix(".json").read_text())  # the sweep's settings beside its table
    assert recorded["config"]["model_config"] == "Llama-3.1-8B" and recorded["config"]["qps"] == 20
    assert recorded["config"]["tpot_ms"] == 1e9 and recorded["candidates"] == 2
    assert recorded["engine"]["model_dir"] == str(engine.model_dir) and recorded["engine"]["calibration"] is None
    # OUT.json beside hardware/H100.csv would have replaced the H100 spec
    spec = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H100", "--gpu_budget", "1",
                      "--trace", "splitwise_48", "--output", REPO / "hardware" / "H100.csv")
    assert spec.returncode == 2 and "hardware holds the GPU spec JSONs" in spec.stderr
    plot_pareto(pd.read_csv(out), tmp_path / "pareto.png", {"tpot_ms": 1e9, "tpot_percentile": 90})
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    bad = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H999", "--gpu_budget", "2",
                     "--trace", "splitwise_48", "--output", tmp_path / "bad.csv")
    assert bad.returncode == 2 and "known" in bad.stderr and not (tmp_path / "bad.csv").exists()


def test_the_python_api_searches_as_search_config_does(tmp_path, engine):
    """pipeweave.search_configurations: search_config.py's table for the same options (lists as lists, prices as a
    dict), ValueErrors naming the option for what the command line refuses."""
    import pipeweave

    out = tmp_path / "search.csv"
    result = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H100,A100", "--gpu_budget",
                        "2", "--tp", "1,2", "--pp", "1", "--max_num_seqs", "8", "--trace", "splitwise_48",
                        "--num_requests", "6", "--qps", "20", "--ttft_ms", "500", "--gpu_cost", "H100=2.5,A100=1.25",
                        "--interval_end", "high", "--collective_estimate", "analytical", "--model_dir",
                        engine.model_dir, "--output", out)
    assert result.returncode == 0, result.stderr
    table = pipeweave.search_configurations(
        "Llama-3.1-8B", "splitwise_48", ["H100", "A100"], 2, tp=[1, 2], pp=[1], max_num_seqs=8, num_requests=6,
        qps=20, ttft_ms=500, gpu_cost={"H100": 2.5, "A100": 1.25}, interval_end="high",
        collective_estimate="analytical", model_dir=engine.model_dir)
    assert table.to_csv(index=False, float_format="%.6g") == out.read_text()
    assert list(table["rank"]) == [1, 2, 3, 4] and (table["interval_end"] == "high").all()  # the sweep says so
    with pytest.warns(UserWarning, match="Llama-3.1-8B search uses fa3_ragged .FlashAttention-3, Hopper only. "
                                         "but A100 is ampere"):
        pipeweave.search_configurations("Llama-3.1-8B", "splitwise_48", "A100", 1, pp=1, max_num_seqs=8,
                                        num_requests=2, prefill_attn="fa3_ragged", model_dir=engine.model_dir)
    for options, message in ((dict(tp="1,2"), "tp must be an integer, got '1,2'"),
                             (dict(gpu_cost=[2.5]), "gpu_cost must be a dict of GPU name -> USD per GPU-hour"),
                             (dict(capacity=1), "capacity must be True or False, got 1"),
                             (dict(tpp=2), "unknown option.* tpp; search_config.py's are capacity, "),
                             (dict(interval_end="mid"), "argument --interval_end: invalid choice: 'mid'"),
                             (dict(capacity=True), "--capacity needs --ttft_ms"),
                             (dict(tp=[]), "tp must list at least one value, got an empty list"),
                             (dict(tp={1, 2}), "tp must be a value or a list of values"),
                             (dict(dtype="bf16,fp8"), "dtype: give a list instead of the command line's comma"),
                             (dict(gpu_cost={"Z999": 1}), "--gpu_cost Z999=1.0: unknown GPU")):
        with pytest.raises(ValueError, match=message):
            pipeweave.search_configurations("Llama-3.1-8B", "splitwise_48", "H100", 1, model_dir=engine.model_dir,
                                            **options)
    with pytest.raises(ValueError, match="hardware must list at least one value"):
        pipeweave.search_configurations("Llama-3.1-8B", "splitwise_48", [], 1)
    with pytest.raises(ValueError, match="hardware: give a list instead of the command line's comma-separated"):
        pipeweave.search_configurations("Llama-3.1-8B", "splitwise_48", "H100,A100", 1)
    with pytest.raises(ValueError, match="unknown trace '-h'"):  # a value, not argparse's flag
        pipeweave.search_configurations("Llama-3.1-8B", "-h", "H100", 1)


def test_search_config_tries_each_weight_dtype(tmp_path, engine):
    """--dtype bf16,fp8 is one more dimension of the sweep; a GPU without an FP8 rate stays as infeasible for fp8."""
    out = tmp_path / "search.csv"
    result = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H100,A100",
                        "--gpu_budget", "1", "--dtype", "bf16,fp8,fp8", "--max_num_seqs", "8", "--trace",
                        "splitwise_48", "--qps", "20", "--num_requests", "6", "--model_dir", engine.model_dir,
                        "--output", out)
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out, keep_default_na=False).set_index(["hardware", "dtype"])
    assert sorted(table.index) == [("A100", "bf16"), ("A100", "fp8"), ("H100", "bf16"), ("H100", "fp8")]
    assert table["feasible"].tolist().count(False) == 1
    assert "no FP8 tensor-core rate" in table.loc[("A100", "fp8"), "reason"]
    tokens = table["kv_cache_tokens"]  # text: whole numbers, never 1.18973e+06 (a float column rounded them)
    assert all(cell.isdigit() for cell in tokens.drop(("A100", "fp8"))) and tokens[("A100", "fp8")] == ""
    assert int(tokens[("H100", "fp8")]) > int(tokens[("H100", "bf16")])
    # the token budget each row ran with: vLLM's default keeps the A100 on the small one
    budget = table["max_num_batched_tokens"]  # read as text: keep_default_na leaves the infeasible row's empty cell
    assert (budget[("H100", "bf16")], budget[("A100", "bf16")], budget[("A100", "fp8")]) == ("8192", "2048", "")
    bad = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H100", "--gpu_budget", "1",
                     "--dtype", "int4", "--trace", "splitwise_48", "--output", tmp_path / "bad.csv")
    assert bad.returncode == 2 and "--dtype must list dtypes among bf16, fp8, got 'int4'" in bad.stderr


def test_serving_says_which_step_times_are_zero_shot(tmp_path):
    """serve_sim and search_config ranked a GPU without any kernel measurement (RTX A6000) beside measured ones
    without a word; the shipped models know which GPUs they were trained on."""
    shipped = Engine(log=None)
    runs = {gpu: simulate_config(ServingConfig("Llama-3.1-8B", "splitwise_48", gpu, num_requests=2), shipped)
            for gpu in ("RTX A6000", "H100")}
    assert runs["RTX A6000"].unmeasured_gpu == ["gemm", "attention", "rmsnorm", "siluandmul"]
    assert runs["H100"].unmeasured_gpu == []
    # per kernel: the attention model saw no SM 8.6 GPU (A40 and RTX A6000 have no attention data), H100 it saw
    assert runs["RTX A6000"].extrapolation["by_operator"]["attention"] == 1.0
    assert runs["H100"].extrapolation["by_operator"]["attention"] == 0.0
    assert 0 < runs["RTX A6000"].extrapolation["share"] < 1
    out = tmp_path / "s.json"
    result = run_script("serve_sim.py", "--model_config", "Llama-3.1-8B", "--trace", "splitwise_48", "--hardware",
                        "RTX A6000", "--num_requests", "2", "--output", out)
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    assert written["unmeasured_gpu"] == runs["RTX A6000"].unmeasured_gpu
    assert written["extrapolation"] == runs["RTX A6000"].extrapolation
    assert "Note: no kernel of NVIDIA RTX A6000 is in the training data of gemm" in result.stdout


def test_search_notes_gpus_whose_rows_are_mostly_extrapolated():
    from pipeweave.serving.search import mostly_extrapolated_gpus

    table = pd.DataFrame({"hardware": ["B200", "B200", "H100", "L4"], "feasible": [True, True, True, False],
                          "extrapolated_share": [0.2, 0.6, 0.5, float("nan")]})
    assert mostly_extrapolated_gpus(table) == ["B200"]  # above half only, feasible rows only


def test_expert_parallelism_is_a_serving_setting_and_a_search_dimension(tmp_path, engine):
    """serve_sim and search_config take --ep and check it against the model and TP; an expert-parallel rank costs
    what the TP shard of its layer costs (pipeweave/moe.py: measured so), so EP 4 and EP 1 give the same steps."""
    shipped = Engine(collective_estimate="analytical", log=None)
    one, four = (simulate_config(ServingConfig("Qwen3-30B-A3B", "splitwise_48", "H100", tp=4, ep=ep, num_requests=4),
                                 shipped) for ep in (1, 4))
    assert four.config.ep == 4 and four.simulation.makespan_ms == one.simulation.makespan_ms
    for model, tp, ep, message in (("Llama-3.1-8B", 2, 2, "is dense"),
                                   ("Qwen3-30B-A3B", 2, 4, "ep 4 must divide tp 2")):
        config = ServingConfig(model, "splitwise_48", "H100", tp=tp, ep=ep)
        with pytest.raises(UserError, match=rf"--ep {config.ep}: .*{message}"):
            simulate_config(replace(config, num_requests=2), engine)
    out = tmp_path / "search.csv"
    result = run_script("search_config.py", "--model_config", "Qwen3-30B-A3B", "--hardware", "H100", "--gpu_budget",
                        "4", "--tp", "1,2,4", "--pp", "1", "--ep", "1,4", "--max_num_seqs", "8", "--trace",
                        "splitwise_48", "--num_requests", "4", "--collective_estimate", "analytical",
                        "--model_dir", engine.model_dir, "--output", out)
    assert result.returncode == 0, result.stderr
    assert "Note: an expert-parallel rank's fused-MoE layer costs what the TP shard" in result.stdout
    table = pd.read_csv(out)
    assert sorted(zip(table["tp"], table["ep"])) == [(1, 1), (2, 1), (4, 1), (4, 4)]  # EP 4 divides TP 4 only
    dense = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H100", "--gpu_budget",
                       "2", "--ep", "2", "--trace", "splitwise_48", "--output", tmp_path / "dense.csv")
    assert dense.returncode == 2 and "expert parallelism needs a mixture-of-experts model" in dense.stderr


@pytest.mark.filterwarnings("ignore:WARNING. the 80 % intervals")  # the untrained models' intervals
def test_the_python_api_simulates_as_serve_sim_does(tmp_path, engine):
    """pipeweave.simulate_serving: serve_sim.py's object for the same options, the per-request table on request,
    ValueErrors for what serve_sim refuses."""
    import pipeweave

    out = tmp_path / "s.json"
    flags = ["--model_config", "Qwen3-30B-A3B", "--trace", "splitwise_48", "--hardware", "H100", "--tp", "2", "--ep",
             "2", "--qps", "10", "--num_requests", "6", "--collective_estimate", "analytical", "--interval"]
    result = run_script("serve_sim.py", *flags, "--model_dir", engine.model_dir, "--output", out)
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    got = pipeweave.simulate_serving("Qwen3-30B-A3B", "splitwise_48", "H100", tp=2, ep=2, qps=10, num_requests=6,
                                     collective_estimate="analytical", model_dir=engine.model_dir, requests=True,
                                     interval=True)
    assert got["summary"] == written["summary"] and got["settings"] == written["settings"]
    # each end is its own simulation (its batching may differ: no order of its percentiles is asserted)
    assert got["interval"] == written["interval"] and got["interval"]["levels"] == [0.1, 0.9]
    assert got["interval"]["low"]["num_requests"] == got["interval"]["high"]["num_requests"] == 6
    assert "Every kernel at the low / high end of its 80 % interval" in result.stdout
    assert got["unmeasured_gpu"] == written["unmeasured_gpu"] and got["extrapolation"] == written["extrapolation"]
    assert got["config"] == written["config"]  # folders as given, null for the default, as the command line
    assert got["requests"]["request"] == list(range(6)) and len(got["requests"]["ttft_ms"]) == 6
    with pytest.raises(ValueError, match="unknown setting.* tpp; serve_sim.py's are tp, pp"):
        pipeweave.simulate_serving("Llama-3.1-8B", "splitwise_48", "H100", tpp=2)
    with pytest.raises(ValueError, match="--ep 2: Llama-3.1-8B is dense"):
        pipeweave.simulate_serving("Llama-3.1-8B", "splitwise_48", "H100", tp=2, ep=2, model_dir=engine.model_dir)
    # what argparse would have typed: "2" or 2.0 was a TypeError inside the simulation
    for setting, message in (({"tp": "2"}, "tp must be an integer, got '2'"), ({"tp": 2.0}, "tp must be an integer"),
                             ({"max_model_len": "4096"}, "max_model_len must be an integer"),
                             ({"qps": "10"}, "qps must be a number"), ({"decode_attn": "bogus"}, "decode_attn must "
                                                                                                 "be one of")):
        with pytest.raises(ValueError, match=message):
            pipeweave.simulate_serving("Llama-3.1-8B", "splitwise_48", "H100", model_dir=engine.model_dir, **setting)


def test_search_names_what_was_given_and_notes_fp8_slower_than_bf16(tmp_path, engine):
    """An FP8 checkpoint searched without --dtype was reported as '--dtype fp8: A100 has no FP8 ...'; rows where the
    FP8 model predicts a longer TPOT than BF16 (H20's measured FP8 kernels) are pointed out."""
    from pipeweave.serving.search import fp8_slower_than_bf16

    checkpoint = tmp_path / "fp8.json"
    checkpoint.write_text(json.dumps({**json.loads((DEFAULT_CONFIG_DIR / "Llama-3.1-8B.json").read_text()),
                                      "quantization_config": {"quant_method": "fp8"}}))
    out = tmp_path / "search.csv"
    result = run_script("search_config.py", "--model_config", checkpoint, "--hardware", "H100,A100", "--gpu_budget",
                        "1", "--max_num_seqs", "8", "--trace", "splitwise_48", "--num_requests", "4",
                        "--model_dir", engine.model_dir, "--output", out)
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out, keep_default_na=False).set_index("hardware")
    assert list(table["dtype"]) == ["fp8", "fp8"]
    assert table.loc["A100", "reason"].startswith("FP8 weights (quantization_config of fp8): A100 has no FP8")
    rows = pd.DataFrame({"hardware": ["H20", "H20", "H100", "H100"], "dtype": ["bf16", "fp8"] * 2, "tp": 1, "pp": 1,
                         "ep": 1, "max_num_seqs": 8, "feasible": True, "tpot_ms": [9.8, 13.9, 6.8, 5.5]})
    assert fp8_slower_than_bf16(rows) == ["H20"]


def test_search_finds_each_candidates_capacity(tmp_path, engine):
    """At one offered rate every candidate that keeps up delivers about the same tokens/s, so --capacity searches
    each one's highest rate meeting the targets and ranks by it per GPU; the rate just above it misses them."""
    from pipeweave.serving.search import CAPACITY_PRECISION, capacity, judge

    out = tmp_path / "search.csv"
    result = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "A100",
                        "--gpu_budget", "2", "--pp", "1", "--max_num_seqs", "32", "--trace", "splitwise_48",
                        "--per_request_outputs", "--num_requests", "24", "--ttft_ms", "400", "--tpot_ms", "60",
                        "--capacity", "--collective_estimate", "analytical", "--model_dir", engine.model_dir,
                        "--output", out)
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out)
    assert table["meets_targets"].all() and (table["qps"] > 0).all() and sorted(table["tp"]) == [1, 2]
    assert list(table["qps_per_gpu"]) == sorted(table["qps_per_gpu"], reverse=True)
    assert (table["qps_per_gpu"] == table["qps"] / table["gpus"]).all()
    assert "capacity" in result.stdout.splitlines()[-3]
    targets = {"ttft_ms": 400.0, "ttft_percentile": 90, "tpot_ms": 60.0, "tpot_percentile": 90}
    config = ServingConfig("Llama-3.1-8B", "splitwise_48", "A100", max_num_seqs=32, num_requests=24,
                           per_request_outputs=True)
    found, note = capacity(config, engine, targets)
    assert note == ""
    assert found.config.qps == pytest.approx(table.set_index(["hardware", "tp"]).loc[("A100", 1), "qps"], rel=1e-5)
    above = simulate_config(replace(config, qps=found.config.qps * (1 + CAPACITY_PRECISION) ** 2), engine)
    assert judge(found, targets)[0] and not judge(above, targets)[0]
    # conservative sizing: every kernel at the high end of its interval serves less than at its point prediction
    slow, note = capacity(replace(config, qps=found.config.qps), engine, {**targets, "interval_end": "high"})
    assert note == "" and slow.config.qps < found.config.qps
    # a target no rate meets
    _, note = capacity(config, engine, {**targets, "ttft_ms": 1e-3})
    assert note.startswith("misses the targets even at")
    # GPUs of different kinds cost differently: with prices, the cost of a million output tokens ranks
    priced = tmp_path / "priced.csv"
    result = run_script("search_config.py", "--model_config", "Llama-3.1-8B", "--hardware", "H100,A100",
                        "--gpu_budget", "1", "--max_num_seqs", "32", "--trace", "splitwise_48", "--per_request_outputs",
                        "--num_requests", "24", "--ttft_ms", "400", "--tpot_ms", "60", "--qps", "4", "--gpu_cost",
                        "H100=1e3,A100=1", "--model_dir", engine.model_dir, "--output", priced)
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(priced)
    assert list(table["hardware"]) == ["A100", "H100"] and list(table["usd_per_hour"]) == [1, 1000]
    assert table["usd_per_million_output_tokens"].to_numpy() == pytest.approx(
        table["usd_per_hour"] / (table["output_tokens_per_s"] * 3600) * 1e6, rel=1e-5)


def test_serving_notes_what_a_user_may_not_expect(tmp_path, engine):
    """A rate replacing a trace's recorded arrivals, a sweep without targets, TP sizes above the budget and FP8 among
    the dtypes of an MoE model were silent (or, the last, refused the whole sweep); the EP note preceded the refusal
    of a dense model."""
    recorded = tmp_path / "recorded.csv"
    recorded.write_text("request,prompt_tokens,decode_tokens,output_tokens,arrival_time_s\n1,100,4,4,0\n2,50,4,4,1\n")
    out = tmp_path / "s.json"
    common = ["--model_config", "Llama-3.1-8B", "--hardware", "H100", "--model_dir", engine.model_dir]
    result = run_script("serve_sim.py", *common, "--trace", recorded, "--qps", "5", "--output", out)
    assert result.returncode == 0, result.stderr
    assert "Note: the trace's recorded arrival_time_s are replaced by Poisson arrivals at --qps 5 requests/s" \
        in result.stdout
    dense = run_script("serve_sim.py", *common, "--trace", recorded, "--tp", "2", "--ep", "2", "--output", out)
    assert dense.returncode == 2 and "is dense" in dense.stderr and "expert-parallel rank" not in dense.stdout
    search = run_script("search_config.py", *common, "--trace", recorded, "--gpu_budget", "2", "--tp", "1,4", "--pp",
                        "1,4", "--max_num_seqs", "8", "--output", tmp_path / "s.csv")
    assert search.returncode == 0, search.stderr
    assert "Note: --tp 4: above --gpu_budget 2 with every --pp, not simulated" in search.stdout
    assert "Note: --pp 4: TP x PP is above --gpu_budget 2 with every --tp, not simulated" in search.stdout
    assert "Note: no --ttft_ms or --tpot_ms: every feasible candidate counts as meeting the targets" in search.stdout
    moe = run_script("search_config.py", "--model_config", "Qwen3-30B-A3B", "--hardware", "H100", "--model_dir",
                     engine.model_dir, "--trace", recorded, "--gpu_budget", "1", "--max_num_seqs", "8", "--dtype",
                     "bf16,fp8", "--output", tmp_path / "moe.csv")
    assert moe.returncode == 0, moe.stderr
    table = pd.read_csv(tmp_path / "moe.csv", keep_default_na=False).set_index("dtype")
    assert table.loc["bf16", "feasible"] and not table.loc["fp8", "feasible"]
    assert "FP8 mixture-of-experts layers are not modelled" in table.loc["fp8", "reason"]


def test_search_names_every_tp_pp_and_ep_value_it_drops():
    """--pp and --ep values that no candidate took were dropped unsaid (only --tp was named)."""
    from pipeweave.serving.search import candidates, unused_values_notes

    base = ServingConfig("Qwen3-30B-A3B", "splitwise_48", "H100")
    tps, pps, eps = [1, 2, 8], [1, 4], [1, 3, 8]
    configs = candidates(base, ["H100"], 4, tps, pps, [8], eps=eps)
    assert {(c.tp, c.pp, c.ep) for c in configs} == {(1, 1, 1), (2, 1, 1), (1, 4, 1)}
    assert unused_values_notes(configs, tps, pps, eps, 4) == [
        "Note: --tp 8: above --gpu_budget 4 with every --pp, not simulated",
        "Note: --ep 3: it divides no --tp within --gpu_budget 4 (1, 2, 8), not simulated",
        "Note: --ep 8: it divides no --tp within --gpu_budget 4 (1, 2, 8), not simulated"]
    assert unused_values_notes(candidates(base, ["H100"], 8, [4, 6], [1], [8], eps=[4]), [4, 6], [1], [4], 8) == [
        "Note: --tp 6: no --ep divides it (4), not simulated"]
    # a default list is not the user's ask: --pp 1,2 on one GPU said nothing before and says nothing now
    one_gpu = candidates(base, ["H100"], 1, [1], [1, 2], [8])
    assert unused_values_notes(one_gpu, [1], [1, 2], [1], 1, given=["tp"]) == []


def test_search_with_no_feasible_candidate_writes_the_table(tmp_path, engine):
    """Nothing fits: every metric column is there (empty), no plot, exit 0; repeated GPUs and values count once."""
    out, plot = tmp_path / "search.csv", tmp_path / "pareto.png"
    result = run_script("search_config.py", "--model_config", "Llama-3.1-70B", "--hardware", "L40S,NVIDIA L40S",
                        "--gpu_budget", "2", "--pp", "1,1", "--max_num_seqs", "8,8", "--trace", "splitwise_48",
                        "--num_requests", "4", "--model_dir", engine.model_dir, "--output", out, "--plot", plot)
    assert result.returncode == 0, result.stderr
    assert "2 candidates, 0 feasible, 0 meet the targets" in result.stdout and "not written" in result.stdout
    table = pd.read_csv(out)
    assert list(table[["hardware", "tp"]].itertuples(index=False)) == [("L40S", 1), ("L40S", 2)]
    assert not table["feasible"].any() and table["tpot_ms"].isna().all()
    assert table["reason"].str.contains("leave no KV cache").all() and not plot.exists()


@pytest.mark.parametrize("args, message", [
    (["--hardware", ","], "--hardware lists no GPU"),
    (["--ttft_ms", "-5"], "argument --ttft_ms: must be a finite number above 0"),
    (["--tpot_ms", "nan"], "argument --tpot_ms: must be a finite number above 0"),
    (["--output", "OUT.png"], "expected a .csv file"),
    (["--plot", "OUT.csv"], "--plot OUT.csv would overwrite the --output file"),
    (["--plot", "OUT.svg"], "--plot OUT.svg: the figure is written as PNG"),
    (["--max_concurrent_batches", "2"], r"--max_concurrent_batches must be between 1 and the smallest --pp (1)"),
    (["--scheduler", "static"], "--scheduler static: here it is the address of a Dask scheduler"),  # serve_sim's
    (["--capacity", ""], "--capacity needs --ttft_ms"),
    (["--collective_hardware", "H999"], "unknown GPU 'H999'"),  # at every TP: TP 1 recorded it unchecked
    (["--gpu_cost", "H100"], "--gpu_cost must list GPU=USD_PER_HOUR pairs"),
    (["--gpu_cost", "A100=1"], "--gpu_cost has no price for H100"),
    (["--gpu_cost", "H100=-1"], "--gpu_cost H100=-1: the price per GPU-hour must be a finite number > 0"),
    (["--gpu_cost", "H999=1"], "unknown GPU 'H999'"),
    (["--gpu_cost", "H100=1,NVIDIA H100=2"], "--gpu_cost prices H100 twice (1 and 2); give one"),
])
def test_search_config_errors_are_one_line(tmp_path, args, message):
    flags = {"--model_config": "Llama-3.1-8B", "--hardware": "H100", "--gpu_budget": "2", "--trace": "splitwise_48",
             "--output": "OUT.csv"}
    flags.update(zip(args[::2], args[1::2]))
    result = subprocess.run([sys.executable, str(REPO / "search_config.py"),
                             *[x for pair in flags.items() for x in pair if x != ""]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


def test_serve_sim_warns_of_a_calibration_fitted_against_other_collective_models(tmp_path, engine, capsys):
    """serve_sim and search_config checked only the kernel models of a calibration, so communication factors fitted
    against other collective models were applied without the aggregator's WARNING."""
    from pipeweave.calibration import Calibration, load_prior
    from pipeweave.calibration_design import PARAMS
    from pipeweave.serving.cli import main as serve_main

    fitted = {"e2e": {"runs": ["test.json"]},
              "collective_models": {"dir": "elsewhere", "serving_digest": "0", "gpu": "H100", "models_digest": "0"}}
    calibration = tmp_path / "h100.json"
    Calibration("H100", "NVIDIA H100", np.zeros(len(PARAMS)), np.zeros(len(PARAMS)), fitted, {}, {},
                load_prior().standardisation).save(calibration)
    flags = ["--model_config", "Llama-3.1-8B", "--trace", "splitwise_48", "--num_requests", "4", "--hardware", "H100",
             "--model_dir", str(engine.model_dir), "--collective_estimate", "analytical", "--calibration",
             str(calibration)]
    assert run_cli(serve_main, [*flags, "--tp", "2", "--output", str(tmp_path / "tp2.json")]) == 0
    assert "fitted its communication factors" in capsys.readouterr().out
    assert run_cli(serve_main, [*flags, "--output", str(tmp_path / "tp1.json")]) == 0  # no collective at TP1
    assert "fitted its communication factors" not in capsys.readouterr().out


def test_pipeline_stages_take_vllms_layer_split():
    """vLLM gives one layer more to each of the L mod PP stages before the last (not every one: 94 over 4 is 23, 24,
    24, 23) where PP does not divide the layers; the slowest stage then sets the pace of micro-batches in flight
    (each stage used to take 1/PP of a step)."""
    from pipeweave.serving.simulator import EventLoop
    from pipeweave.workload import pipeline_stage_layers

    assert pipeline_stage_layers(32, 3) == [11, 11, 10] and pipeline_stage_layers(94, 4) == [23, 24, 24, 23]
    assert pipeline_stage_layers(80, 2) == [40, 40] and pipeline_stage_layers(5, 5) == [1] * 5
    loop = EventLoop([], None, [11, 11, 10], max_in_flight=3)
    for _ in range(2):
        loop.launch([], 32.0)
    assert sorted(t for t, _, _ in loop.in_flight) == [32.0, 43.0]  # the second waits for the first's 11-layer stages
    even = EventLoop([], None, [1, 1, 1], max_in_flight=3)
    even.launch([], 10.0)
    assert even.stage_free == [10.0 / 3, 2 * (10.0 / 3), 3 * (10.0 / 3)]  # as cost / pp, to the bit
    with pytest.raises(ValueError, match="at least one layer"):
        simulate([], None, LinearCost(), pp=2, stage_layers=[3])


def test_an_arrival_waits_for_the_oldest_micro_batch_when_nothing_else_can_run():
    """vLLM V1's engine with a batch queue (PP > 1) blocks on its oldest micro-batch when it has nothing to launch,
    and reads new requests only once that one ends (EngineCore.step_with_batch_queue): B, arriving while A's prefill
    is in flight, is scheduled with A's decode at 10 ms, not on the idle first stage at 2 ms (first token at 15)."""
    requests = [Request(0, 0.0, 10, 3), Request(1, 2.0, 10, 2)]
    sim = simulate(requests, vllm(), lambda new, context: 10.0, pp=2)
    b = next(r for r in sim.requests if r.rid == 1)
    assert b.first_token_ms == 20.0
