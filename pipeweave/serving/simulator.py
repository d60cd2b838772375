"""The serving event loop and its metrics.

Time advances from one event to the next: an arrival or the end of a micro-batch. While fewer than ``pp``
micro-batches are in flight the scheduler is asked for another (vLLM V1's batch queue holds ``pp`` of them,
``max_concurrent_batches``), so with pipeline parallelism the stages work on different micro-batches at once. When
it has nothing to launch and a micro-batch is in flight, the engine waits for the oldest one to end before it reads
new requests (``EngineCore.step_with_batch_queue``): a request arriving meanwhile is first scheduled after that. A micro-batch of step cost ``T``
(the whole model, every stage) spends on each stage the share of ``T`` its decoder layers are of the model's
(``T / pp`` where the layers divide evenly; where they do not, vLLM gives one layer more to each of the ``L mod pp``
stages before the last: 11, 11 and 10 of 32 over 3, :func:`pipeweave.workload.pipeline_stage_layers`); a stage
takes one micro-batch at a time (flow shop), and the micro-batch ends when its last stage does. With ``pp = 1``
steps simply follow one another.

Step durations are memoised by the step cost; when one is unknown, a copy of the simulation runs ahead on
estimated durations to find the steps that follow, and their durations are predicted together (one engine call
instead of one per step). The copy only chooses what to predict: the simulation itself uses exact durations only.

Metrics per request: TTFT = first token − arrival, TPOT = (finish − first token) / (output tokens − 1) (requests
with one output token have none), E2E = finish − arrival.
"""
from __future__ import annotations

import heapq
import math
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


#: steps scheduled ahead (with estimated durations) when a step's attention is unknown, to predict them together
SPECULATION_STEPS = 64


def simulate(requests: list, scheduler, step_cost: StepCost, pp: int = 1, progress=None,
             max_in_flight: int | None = None, speculation_steps: int = SPECULATION_STEPS,
             stage_layers: Sequence[int] | None = None) -> Simulation:
    """Run ``requests`` (sorted by arrival) through ``scheduler`` with iteration durations from ``step_cost``.

    A step cost with ``known``, ``estimate`` and ``prefetch`` (:class:`pipeweave.serving.step_cost.KernelStepCost`)
    is memoised: when a step's cost is unknown, a copy of the simulation schedules the next
    ``speculation_steps`` steps on estimated durations and the unknown steps among them are predicted in one batch.
    The copy only chooses what to predict; every duration used is the exact one (a step the copy did not foresee is
    predicted when it comes). ``max_in_flight`` (default ``pp``) caps the micro-batches in flight. ``stage_layers``
    (default: equal) are the decoder layers of each of the ``pp`` stages, whose shares of a step's cost they are.
    """
    stage_layers = [1] * pp if stage_layers is None else list(stage_layers)
    if len(stage_layers) != pp or min(stage_layers) < 1:
        raise ValueError(f"stage_layers {stage_layers} must give each of the {pp} stages at least one layer")
    common = math.gcd(*stage_layers)  # an even split is 1 of pp parts: cost * 1 / pp is cost / pp to the bit
    order = sorted(requests, key=lambda r: r.arrival_ms)
    loop = EventLoop(order, scheduler, [layers // common for layers in stage_layers], max_in_flight or pp)
    if all(hasattr(step_cost, name) for name in ("known", "estimate", "prefetch")) and speculation_steps > 0:
        loop.cost = lambda new, context, entries: loop.exact(step_cost, new, context, entries, speculation_steps)
    else:
        loop.cost = lambda new, context, entries: step_cost(new, context)
    loop.run(progress=progress)
    return Simulation(order, loop.steps)


class EventLoop:
    """The simulation state between events, and the loop that advances it (see the module docstring)."""

    def __init__(self, order: list, scheduler, stage_parts: list[int], max_in_flight: int):
        self.order = order
        self.scheduler = scheduler
        self.stage_parts, self.parts = stage_parts, sum(stage_parts)  # stage s takes parts[s] / parts of a step
        self.max_in_flight = max_in_flight
        self.next_arrival = 0
        self.now = order[0].arrival_ms if order else 0.0
        self.stage_free = [self.now] * len(stage_parts)
        self.in_flight: list = []  # heap of (finish time, sequence, entries)
        self.steps = 0
        self.done = 0
        self.cost: Callable = None  # (new tokens, context lengths, entries) -> ms
        self.copies_arrivals = False  # a speculative copy schedules copies of the requests it admits

    def run(self, progress=None, max_steps: int | None = None) -> None:
        order, scheduler, in_flight = self.order, self.scheduler, self.in_flight
        total = len(order)
        stop = None if max_steps is None else self.steps + max_steps
        while self.done < total:
            while self.next_arrival < total and order[self.next_arrival].arrival_ms <= self.now:
                request = order[self.next_arrival]
                scheduler.add(request.copy() if self.copies_arrivals else request)
                self.next_arrival += 1
            entries = scheduler.schedule() if len(in_flight) < self.max_in_flight and scheduler.has_work() else []
            if entries:
                if self.steps == stop:
                    return
                new = [e[1] for e in entries]
                context = [e[2] for e in entries]
                self.launch(entries, self.cost(new, context, entries))
                continue
            # nothing to launch: vLLM V1's engine blocks on its oldest micro-batch in flight (step_with_batch_queue)
            # and reads new requests only once it has ended, so an arrival meanwhile waits for it
            if in_flight:
                self.now, _, finished_entries = heapq.heappop(in_flight)
                finished = scheduler.complete(finished_entries, self.now)
                self.done += len(finished)
                if progress is not None and finished:
                    progress(len(finished))
            elif self.next_arrival < total:
                self.now = max(self.now, order[self.next_arrival].arrival_ms)
            else:
                raise SimulationStuck(f"{total - self.done} requests cannot be scheduled: one needs more KV cache "
                                      f"than the GPU memory leaves (or more than the token budget allows)")

    def launch(self, entries: list, cost: float) -> None:
        """Start a micro-batch of duration ``cost``: its share of ``cost`` on each stage, each stage free in turn."""
        t = self.now
        for s, part in enumerate(self.stage_parts):
            t = max(t, self.stage_free[s]) + cost * part / self.parts
            self.stage_free[s] = t
        heapq.heappush(self.in_flight, (t, self.steps, entries))
        self.steps += 1

    def exact(self, step_cost, new: list, context: list, entries: list, ahead: int) -> float:
        """The memoised step cost; on a miss, first predict the steps a speculative copy schedules next."""
        ms = step_cost.known(new, context)
        if ms is None:
            foreseen = [(new, context)]

            def foresee(new_tokens, context_lens, _entries):
                foreseen.append((new_tokens, context_lens))
                return step_cost.estimate(new_tokens, context_lens)

            shadow, pending = self.speculative_copy(entries)
            shadow.cost = foresee
            shadow.launch(pending, step_cost.estimate(new, context))
            try:
                shadow.run(max_steps=ahead)
            except SimulationStuck:
                pass  # the real run reports it when it gets there
            step_cost.prefetch(foreseen)
            ms = step_cost.known(new, context)
        return ms

    def speculative_copy(self, pending: list) -> tuple["EventLoop", list]:
        """An independent copy of the state (requests copied, arrivals copied when admitted) and of ``pending``."""
        copies: dict[int, object] = {}

        def copy_of(request):
            found = copies.get(id(request))
            if found is None:
                found = copies[id(request)] = request.copy()
            return found

        def entries_of(entries):
            return [(copy_of(e[0]), *e[1:]) for e in entries]

        other = EventLoop.__new__(EventLoop)
        other.__dict__.update(self.__dict__)
        other.scheduler = self.scheduler.speculative_copy(copy_of)
        other.stage_free = list(self.stage_free)
        other.in_flight = [(t, seq, entries_of(entries)) for t, seq, entries in self.in_flight]  # still a heap
        other.copies_arrivals = True
        return other, entries_of(pending)


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
