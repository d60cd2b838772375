"""Speed of the serving simulator (serve_sim.py), and what the faster mixed-step attention model costs.

    OMP_NUM_THREADS=1 python3 -m benchmarks.serving [--runs 2000:0,2000:16,100000:0,100000:16] [--qps 20]
        [--trace splitwise_48] [--single 2000]

Llama-3.1-8B on H100 (TP1, vLLM scheduler with vLLM's serving defaults), Poisson arrivals (seed 0), requests drawn
from the trace in order with their own output lengths. Per run: CPU seconds of the simulation (one thread; model
loading excluded and timed once), wall seconds, steps and engine calls. ``--runs`` lists ``requests:decode_bucket``
pairs (bucket 0: exact, what serve_sim.py does by default); a bucketed run (``--decode_bucket``, the optional
approximation) is compared with the exact run of the same size when there is one. ``--single N`` also runs N requests with
``mixed_attention="single"`` (one attention launch over a mixed batch: exact compositions that never repeat) and
prints how far its TTFT/TPOT/makespan are from the default "split" model. The last line is machine-readable.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

from pipeweave.engine import Engine
from pipeweave.serving.run import ServingConfig, simulate_config
from pipeweave.serving.simulator import summarize


def timed(config: ServingConfig, engine: Engine):
    cpu, wall = time.process_time(), time.perf_counter()
    run = simulate_config(config, engine)
    return run, time.process_time() - cpu, time.perf_counter() - wall


def compare(a: dict, b: dict, name_a: str, name_b: str) -> None:
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        for p in ("p50", "p99"):
            print(f"  {key[:-3]} {p}: {name_a} {a[key][p]:.3f} ms, {name_b} {b[key][p]:.3f} ms "
                  f"({100 * (a[key][p] - b[key][p]) / b[key][p]:+.2f} %)")
    print(f"  makespan: {100 * (a['makespan_ms'] - b['makespan_ms']) / b['makespan_ms']:+.3f} %")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.serving", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="2000:0,2000:16,100000:0,100000:16",
                        help="requests:decode_bucket pairs")
    parser.add_argument("--qps", type=float, default=20.0)
    parser.add_argument("--trace", default="splitwise_48")
    parser.add_argument("--single", type=int, default=2000, help="requests of the split-vs-single comparison (0: no)")
    parser.add_argument("--model_dir", default=None)
    args = parser.parse_args(argv)
    started = time.process_time()
    engine = Engine(**({"model_dir": args.model_dir} if args.model_dir else {}), log=None)
    base = ServingConfig("Llama-3.1-8B", args.trace, "H100", qps=args.qps, per_request_outputs=True)
    simulate_config(replace(base, num_requests=1), engine)  # loads the models
    print(f"setup (models, first step): {time.process_time() - started:.2f} s CPU")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    results, exact = {}, {}
    for item in args.runs.split(","):
        n, bucket = (int(x) for x in item.split(":"))
        run, cpu, wall = timed(replace(base, num_requests=n, decode_bucket=bucket), engine)
        s = summarize(run.simulation)
        results[item] = cpu
        print(f"{n} requests at {args.qps:g} req/s, decode_bucket {bucket}: {cpu:.2f} s CPU, {wall:.2f} s wall, "
              f"{s['num_steps']} steps, {run.engine_calls} engine calls; TTFT p50 {s['ttft_ms']['p50']:.1f} ms, "
              f"TPOT p50 {s['tpot_ms']['p50']:.2f} ms, makespan {s['makespan_ms'] / 1000:.1f} s")
        if bucket == 0:
            exact[n] = s
        elif n in exact:
            compare(s, exact[n], f"decode_bucket {bucket}", "exact")
    if args.single:
        split, split_cpu, _ = timed(replace(base, num_requests=args.single), engine)
        single, single_cpu, _ = timed(replace(base, num_requests=args.single, mixed_attention="single"), engine)
        print(f"mixed attention, {args.single} requests: split {split_cpu:.2f} s CPU, single {single_cpu:.2f} s CPU")
        compare(summarize(split.simulation), summarize(single.simulation), "split", "single")
    print(" ".join(f"cpu_s_{item.replace(':', '_b')}={cpu:.2f}" for item, cpu in results.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
