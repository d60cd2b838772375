"""Serving simulation (continuous batching) on pipeweave's per-iteration predictions, and a configuration search.

Layers, each usable alone:

* :mod:`.requests` - requests, Poisson or recorded arrivals drawn from a trace;
* :mod:`.kv_cache` - the paged KV-cache block manager and its capacity from GPU memory;
* :mod:`.schedulers` - ``static`` (the static batch of the workload generator) and ``vllm`` (vLLM V1);
* :mod:`.simulator` - the event loop (pipeline-parallel micro-batches in flight) and the metrics;
* :mod:`.step_cost` - the duration of one iteration from pipeweave's kernel predictor, memoised;
* :mod:`.run` - one simulation from its settings (``ServingConfig``), shared by the commands below;
* :mod:`.cli` / :mod:`.search` - ``serve_sim.py`` and ``search_config.py``; :mod:`.report` - docs/SERVING.md, with
  :mod:`.peers`, aiconfigurator's step latencies as a second step cost.

The simulator only sees a *step cost*: a callable ``cost(new_tokens, context_lens) -> ms`` giving the duration
of one iteration of the whole model (all pipeline stages) whose batch holds, per request, the tokens it
computes in this step and its KV length after the step.
"""
