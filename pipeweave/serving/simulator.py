"""The serving event loop and its metrics.

Time advances from one event to the next: an arrival or the end of a micro-batch. While fewer than ``pp``
micro-batches are in flight the scheduler is asked for another (vLLM V1's batch queue holds ``pp`` of them,
``max_concurrent_batches``), so with pipeline parallelism the stages work on different micro-batches at once. A micro-batch of step cost ``T``
(the whole model, every stage) spends ``T / pp`` on each stage; a stage takes one micro-batch at a time (flow
shop), and the micro-batch ends when its last stage does. With ``pp = 1`` steps simply follow one another.

Metrics per request: TTFT = first token − arrival, TPOT = (finish − first token) / (output tokens − 1) (requests
with one output token have none), E2E = finish − arrival.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

StepCost = Callable[[Sequence[int], Sequence[int]], float]

PERCENTILES = (50, 90, 99)


class SimulationStuck(RuntimeError):
    """Nothing can run and nothing will arrive (a request needs more KV cache than exists)."""


@dataclass
class Simulation:
    requests: list
    steps: int

    @property
    def makespan_ms(self) -> float:
        return max(r.finish_ms for r in self.requests) - min(r.arrival_ms for r in self.requests)


def simulate(requests: list, scheduler, step_cost: StepCost, pp: int = 1, progress=None,
             lookahead: Callable | None = None, max_in_flight: int | None = None) -> Simulation:
    """Run ``requests`` (sorted by arrival) through ``scheduler`` with iteration durations from ``step_cost``.

    ``lookahead(entries, horizon_steps)``, if given, is told each micro-batch before it is costed, and how many
    steps probably follow before an arrival changes the batch (None: no arrival left), so that a memoising step cost can predict them in
    one batch. ``max_in_flight`` (default ``pp``) caps the micro-batches in flight.
    """
    max_in_flight = max_in_flight or pp
    order = sorted(requests, key=lambda r: r.arrival_ms)
    next_arrival = 0
    now = order[0].arrival_ms if order else 0.0
    stage_free = [now] * pp
    in_flight: list = []  # heap of (finish time, sequence, entries)
    steps = 0
    done = 0
    last_cost = None
    while done < len(order):
        while next_arrival < len(order) and order[next_arrival].arrival_ms <= now:
            scheduler.add(order[next_arrival])
            next_arrival += 1
        entries = scheduler.schedule() if len(in_flight) < max_in_flight and scheduler.has_work() else []
        if entries:
            new = [e[1] for e in entries]
            context = [e[2] for e in entries]
            if lookahead is not None:
                horizon = None  # until a request finishes (the step cost knows which do)
                if next_arrival < len(order) and last_cost:  # or an arrival changes the batch
                    horizon = int((order[next_arrival].arrival_ms - now) / last_cost) + 2
                lookahead(entries, horizon)
            cost = step_cost(new, context)
            last_cost = cost
            stage_ms = cost / pp
            t = now
            for s in range(pp):
                t = max(t, stage_free[s]) + stage_ms
                stage_free[s] = t
            heapq.heappush(in_flight, (t, steps, entries))
            steps += 1
            continue
        if in_flight and (next_arrival >= len(order) or in_flight[0][0] <= order[next_arrival].arrival_ms):
            now, _, finished_entries = heapq.heappop(in_flight)
            finished = scheduler.complete(finished_entries, now)
            done += len(finished)
            if progress is not None and finished:
                progress(len(finished))
        elif next_arrival < len(order):
            now = max(now, order[next_arrival].arrival_ms)
        else:
            raise SimulationStuck(f"{len(order) - done} requests cannot be scheduled: one needs more KV cache "
                                  f"than the GPU memory leaves (or more than the token budget allows)")
    return Simulation(order, steps)


def request_metrics(requests: list) -> dict[str, np.ndarray]:
    """Per-request arrays (ms) in request-id order."""
    ordered = sorted(requests, key=lambda r: r.rid)
    arrival = np.array([r.arrival_ms for r in ordered])
    first = np.array([r.first_token_ms for r in ordered])
    finish = np.array([r.finish_ms for r in ordered])
    outputs = np.array([r.output_tokens for r in ordered])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs > 1, (finish - first) / (outputs - 1), np.nan)
    return {
        "request": np.array([r.rid for r in ordered]),
        "prompt_tokens": np.array([r.prompt_tokens for r in ordered]),
        "output_tokens": outputs,
        "arrival_ms": arrival,
        "first_token_ms": first,
        "finish_ms": finish,
        "ttft_ms": first - arrival,
        "tpot_ms": tpot,
        "e2e_ms": finish - arrival,
        "preemptions": np.array([r.preemptions for r in ordered]),
    }


def percentiles(values: np.ndarray) -> dict:
    values = values[~np.isnan(values)]
    if not values.size:
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None}
    out = {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}
    out["mean"] = float(values.mean())
    return out


def summarize(simulation: Simulation) -> dict:
    metrics = request_metrics(simulation.requests)
    makespan_s = simulation.makespan_ms / 1000.0
    output_tokens = int(metrics["output_tokens"].sum())
    prompt_tokens = int(metrics["prompt_tokens"].sum())
    return {
        "num_requests": len(simulation.requests),
        "num_steps": simulation.steps,
        "makespan_ms": simulation.makespan_ms,
        "ttft_ms": percentiles(metrics["ttft_ms"]),
        "tpot_ms": percentiles(metrics["tpot_ms"]),
        "e2e_ms": percentiles(metrics["e2e_ms"]),
        "throughput_tokens_per_s": (output_tokens + prompt_tokens) / makespan_s if makespan_s > 0 else None,
        "output_tokens_per_s": output_tokens / makespan_s if makespan_s > 0 else None,
        "requests_per_s": len(simulation.requests) / makespan_s if makespan_s > 0 else None,
        "preemptions": int(metrics["preemptions"].sum()),
    }
