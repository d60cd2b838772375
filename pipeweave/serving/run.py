"""One serving simulation from its settings: the glue shared by serve_sim.py, search_config.py and the report."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from analytical_model.gemm_fp8 import missing_rate
from analytical_model.pipes import HardwareSpec
from pipeweave.cli import UserError
from pipeweave.engine import Engine
from pipeweave.flatten import KERNEL_CATEGORIES
from pipeweave.memory import check_memory
from pipeweave.moe import expert_parallel_problem
from pipeweave.serving.kv_cache import (GPU_MEMORY_UTILIZATION, kv_cache_blocks, smallest_tp_holding,
                                        vllm_block_manager)
from pipeweave.serving.requests import MAX_NUM_REQUESTS, load_serving_trace, make_requests
from pipeweave.serving.schedulers import StaticScheduler, VllmScheduler, vllm_defaults
from pipeweave.serving.simulator import Simulation, SimulationStuck, simulate
from pipeweave.serving.step_cost import KernelStepCost
from pipeweave.workload import (DECODE_ATTN_DEFAULT, DTYPES, ModelConfig, RankShapes, iteration_operators,
                                load_model_config, pipeline_stage_layers)

SCHEDULERS = ("static", "vllm")
USAGES = ("serve", "offline")


@dataclass(frozen=True)
class ServingConfig:
    """Everything that determines one simulation (``None`` = the scheduler's default)."""

    model_config: str
    trace: str
    hardware: str
    tp: int = 1
    pp: int = 1
    scheduler: str = "vllm"
    qps: float | None = None
    num_requests: int | None = None
    seed: int = 0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    usage: str | None = None  # vllm: "serve"
    gpu_memory_utilization: float | None = None  # vllm: GPU_MEMORY_UTILIZATION
    per_request_outputs: bool = False
    mixed_attention: str = "split"
    decode_bucket: int = 0  # 0: exact decode attention; > 0: the approximation of step_cost.KernelStepCost
    prefill_attn: str | None = None
    decode_attn: str = DECODE_ATTN_DEFAULT
    qk_norm_rmsnorm: bool = False
    collective_hardware: str | None = None
    max_concurrent_batches: int | None = None  # vllm: micro-batches in flight (vLLM V1: pp)
    dtype: str | None = None  # of the linear layers; None: the checkpoint's (quantization_config), else bf16
    ep: int = 1  # expert groups of an MoE model's TP ranks (the workload generator's --ep)
    max_model_len: int | None = None  # vllm: the longest request served; None: the config's (vLLM's default)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ServingRun:
    config: ServingConfig
    simulation: Simulation
    settings: dict  # the scheduler settings in force (defaults resolved) and the KV capacity
    engine_calls: int
    unmeasured_gpu: list  # kernel categories whose model has no measurement of the GPU (zero-shot)
    #: share of the simulated kernel time that is extrapolated, overall and per category (KernelStepCost.extrapolation)
    extrapolation: dict
    #: with ``interval_end`` low or high: whether a collective entered at its point value (not in the interval)
    collectives_at_point: bool = False


def _positive(value, flag: str) -> None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise UserError(f"{flag} must be >= 1, got {value}")


#: flags only the vLLM scheduler reads, and why the static batch (the aggregator's workload) has no use for them
VLLM_ONLY = {
    "max_num_batched_tokens": "the static batch has no token budget",
    "usage": "it selects vLLM's defaults",
    "gpu_memory_utilization": "the static batch is held to the aggregator's memory check, "
                              f"{GPU_MEMORY_UTILIZATION:g} x totalGlobalMem",
    "max_concurrent_batches": "the static batch runs one micro-batch at a time",
    "max_model_len": "the static batch is held to the aggregator's memory check",
}


def check(config: ServingConfig) -> None:
    if config.scheduler not in SCHEDULERS:
        raise UserError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {config.scheduler!r}")
    if config.usage is not None and config.usage not in USAGES:
        raise UserError(f"--usage must be one of {', '.join(USAGES)}, got {config.usage!r}")
    for value, flag in ((config.tp, "--tp"), (config.pp, "--pp"), (config.num_requests, "--num_requests"),
                        (config.max_num_seqs, "--max_num_seqs"),
                        (config.max_num_batched_tokens, "--max_num_batched_tokens"),
                        (config.max_concurrent_batches, "--max_concurrent_batches"), (config.ep, "--ep"),
                        (config.max_model_len, "--max_model_len")):
        _positive(value, flag)
    if config.num_requests is not None and config.num_requests > MAX_NUM_REQUESTS:
        raise UserError(f"--num_requests must be at most {MAX_NUM_REQUESTS:,}, got {config.num_requests:,}: every "
                        f"request stays in memory (about 1 KiB each) and the exact simulation takes about 0.8 ms of "
                        f"CPU per request")
    if config.scheduler == "static":
        for key, why in VLLM_ONLY.items():
            if getattr(config, key) is not None:
                raise UserError(f"--{key} applies to --scheduler vllm ({why})")
        if config.mixed_attention != "split":
            raise UserError("--mixed_attention applies to --scheduler vllm (a static batch never mixes prefill and "
                            "decode in one step)")
    if config.max_concurrent_batches is not None and config.max_concurrent_batches > config.pp:
        raise UserError(f"--max_concurrent_batches must be between 1 and --pp ({config.pp}), got "
                        f"{config.max_concurrent_batches}: vLLM's batch queue holds one micro-batch per pipeline stage")
    if config.qps is not None and not (math.isfinite(config.qps) and config.qps > 0):
        raise UserError(f"--qps must be a finite number > 0, got {config.qps}")
    if isinstance(config.seed, bool) or not isinstance(config.seed, int) or config.seed < 0:
        raise UserError(f"--seed must be an integer >= 0, got {config.seed}")
    if isinstance(config.decode_bucket, bool) or config.decode_bucket < 0:
        raise UserError(f"--decode_bucket must be >= 0, got {config.decode_bucket}")
    if config.gpu_memory_utilization is not None and not 0 < config.gpu_memory_utilization <= 1:
        raise UserError(f"--gpu_memory_utilization must be in (0, 1], got {config.gpu_memory_utilization}")
    if config.dtype is not None and config.dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")


def vllm_settings(config: ServingConfig, hardware: HardwareSpec) -> dict:
    """The vLLM scheduler limits in force: the flags given, else vLLM's defaults for the GPU and usage, the default
    max_num_seqs capped by the token budget (v0.10.1 ``EngineArgs._set_default_args_v1``)."""
    usage = config.usage or "serve"
    defaults = vllm_defaults(hardware.total_global_mem, hardware.name, usage)
    tokens = config.max_num_batched_tokens or defaults["max_num_batched_tokens"]
    seqs = config.max_num_seqs or min(defaults["max_num_seqs"], tokens)
    if tokens < seqs:  # vLLM's SchedulerConfig refuses it at start-up: a step must fit a token per sequence
        budget = ("--max_num_batched_tokens" if config.max_num_batched_tokens else
                  f"vLLM's default max_num_batched_tokens on {hardware.stem} with --usage {usage}")
        raise UserError(f"{budget} ({tokens}) must be >= --max_num_seqs ({seqs}), as vLLM requires")
    return {"max_num_batched_tokens": tokens, "max_num_seqs": seqs, "usage": usage}


def static_memory_check(cfg: ModelConfig, hardware: HardwareSpec, config: ServingConfig):
    """The aggregator's memory check (:func:`pipeweave.memory.check_memory`) of each batch the static scheduler admits;
    per-request outputs are held to the batch's longest, as the workload generator's single output length."""
    dtype = weight_dtype(cfg, config.dtype)

    def admit(batch: list) -> None:
        memory = check_memory(cfg, hardware, [r.prompt_tokens for r in batch], max(r.output_tokens for r in batch),
                              tp=config.tp, pp=config.pp, ep=config.ep, dtype=dtype)
        if not memory.fits:
            raise UserError(f"{cfg.stem} on {hardware.stem} (static batch of {len(batch)} requests, PP {config.pp}) "
                            f"{memory.message(config.tp)}")
    return admit


def weight_dtype(cfg: ModelConfig, requested: str | None) -> str:
    """The dtype of the linear layers: ``requested``, else the checkpoint's (its ``quantization_config``), else BF16;
    refused where the workload generator refuses it (another dtype than the checkpoint's, FP8 mixture-of-experts
    layers, which the fused-MoE model was not trained on)."""
    dtype = requested or cfg.checkpoint_dtype or "bf16"
    if cfg.moe is not None and "fp8" in (dtype, cfg.checkpoint_dtype):
        fix = (f"remove {cfg.quantization_source} to simulate its BF16 version" if cfg.checkpoint_dtype
               else "use --dtype bf16")
        raise UserError(f"config {cfg.stem}: FP8 mixture-of-experts layers are not modelled (the fused-MoE model is "
                        f"trained on BF16 layers only); {fix}")
    if cfg.checkpoint_dtype is not None and dtype != cfg.checkpoint_dtype:
        raise UserError(f"config {cfg.stem} is an {cfg.checkpoint_dtype.upper()} checkpoint "
                        f"({cfg.quantization_source}): simulate it with --dtype {cfg.checkpoint_dtype}, or remove "
                        f"{cfg.quantization_source} to simulate its {dtype.upper()} version")
    return dtype


def kernel_categories(cfg: ModelConfig, dtype: str) -> list[str]:
    """The kernel categories of a workload (``gemm``, ``attention``...; :data:`KERNEL_CATEGORIES` names their models)
    a simulation of ``cfg`` with ``dtype`` weights runs: those the workload generator lists for one iteration."""
    operators = iteration_operators(cfg, RankShapes.of(cfg, 1), 1, 1, [2], [2], 2, DECODE_ATTN_DEFAULT, 1,
                                    dtype=dtype)
    return [category for category in KERNEL_CATEGORIES if operators.get(category)]


def check_model_and_requests(cfg: ModelConfig, requests, dtype: str | None = None,
                             max_model_len: int | None = None) -> None:
    """What the simulator cannot run for any GPU or parallelism: weights in a dtype it cannot model for ``cfg``
    (:func:`weight_dtype`), a ``max_model_len`` beyond the config's, a request longer than the model serves."""
    weight_dtype(cfg, dtype)
    limit, source = cfg.max_sequence, f"{cfg.max_sequence_source} {cfg.max_sequence} of config {cfg.stem}"
    if max_model_len is not None:
        if limit is not None and max_model_len > limit:
            raise UserError(f"--max_model_len {max_model_len} exceeds {source}, which vLLM refuses at start-up")
        limit, source = max_model_len, f"--max_model_len {max_model_len}"
    longest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
    if limit is not None and longest.prompt_tokens + longest.output_tokens > limit:
        raise UserError(f"request {longest.rid} of the stream (from 0, as in the per-request CSV; "
                        f"{longest.prompt_tokens} prompt + {longest.output_tokens} output tokens) exceeds "
                        f"{source}, which vLLM refuses")


def simulate_config(config: ServingConfig, engine: Engine, progress=None, interval_end: str = "point"
                    ) -> ServingRun:
    """Build requests, scheduler and step cost from ``config`` and run the simulation (``interval_end`` ``"low"`` or
    ``"high"``: every kernel at that end of its measured interval, :class:`KernelStepCost`)."""
    check(config)
    cfg = load_model_config(config.model_config)
    if config.pp > cfg.num_hidden_layers:
        raise UserError(f"--pp {config.pp} exceeds the {cfg.num_hidden_layers} layers of {cfg.stem} (a pipeline stage "
                        f"holds at least one layer)")
    hardware = engine.gpu(config.hardware)
    dtype = weight_dtype(cfg, config.dtype)
    if config.ep != 1:
        problem = (f"{cfg.stem} is dense: expert parallelism needs a mixture-of-experts model" if cfg.moe is None
                   else expert_parallel_problem(cfg.moe, config.tp, config.ep))
        if problem:
            raise UserError(f"--ep {config.ep}: {problem}")
    if dtype == "fp8" and missing_rate(hardware):
        given = "--dtype fp8" if config.dtype else f"FP8 weights ({cfg.quantization_source} of {cfg.stem})"
        raise UserError(f"{given}: {missing_rate(hardware)}, so no FP8 layer can be simulated on it")
    cost = KernelStepCost(engine, cfg, config.hardware, config.tp, config.pp,
                          collective_hardware=config.collective_hardware, prefill_attn=config.prefill_attn,
                          decode_attn=config.decode_attn, qk_norm_rmsnorm=config.qk_norm_rmsnorm,
                          mixed_attention=config.mixed_attention, decode_bucket=config.decode_bucket, dtype=dtype,
                          ep=config.ep, interval_end=interval_end)
    requests = make_requests(load_serving_trace(config.trace), config.num_requests, config.qps, config.seed,
                             config.per_request_outputs)
    check_model_and_requests(cfg, requests, dtype, config.max_model_len)
    if config.scheduler == "static":
        scheduler = StaticScheduler(config.max_num_seqs, admit=static_memory_check(cfg, hardware, config))
        settings = {"max_num_seqs": config.max_num_seqs, "dtype": dtype}
    else:
        settings = vllm_settings(config, hardware)
        utilization = (GPU_MEMORY_UTILIZATION if config.gpu_memory_utilization is None
                       else config.gpu_memory_utilization)
        model_len = config.max_model_len or cfg.max_sequence
        blocks = kv_cache_blocks(cfg, hardware.total_global_mem, config.tp, config.pp,
                                 settings["max_num_batched_tokens"], settings["max_num_seqs"], utilization, dtype=dtype,
                                 ep=config.ep, model_len=model_len)
        manager = vllm_block_manager(blocks)
        if model_len is not None and manager.blocks_for(model_len) > blocks:
            # vLLM's start-up check (v1/core/kv_cache_utils.check_enough_kv_cache_memory): one request of the
            # longest length the engine serves must fit in the KV cache
            given = ("--max_model_len" if config.max_model_len
                     else f"max_model_len (by default {cfg.max_sequence_source})")
            raise UserError(f"vLLM would not start: {given} {model_len} needs {manager.blocks_for(model_len)} KV "
                            f"blocks for one request, but {config.hardware} TP{config.tp} x PP{config.pp} holds "
                            f"{blocks} ({blocks * manager.block_size} tokens); give --max_model_len "
                            f"{blocks * manager.block_size} or less, or more GPUs (it needs "
                            + smallest_tp_holding(cfg, hardware.total_global_mem, config.pp,
                                                  settings["max_num_batched_tokens"], settings["max_num_seqs"],
                                                  utilization, model_len, dtype, config.ep) + f" at PP{config.pp})")
        largest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
        # the last output token is never fed back, so its KV is never stored (as pipeweave/memory.py counts)
        needed = largest.prompt_tokens + largest.output_tokens - 1
        if manager.blocks_for(needed) > manager.num_blocks:
            raise UserError(f"request {largest.rid} of the stream (from 0, as in the per-request CSV) needs {needed} "
                            f"tokens of KV cache ({largest.prompt_tokens} prompt + {largest.output_tokens} output "
                            f"tokens, less the last, whose KV is never stored) but "
                            f"{config.hardware} TP{config.tp} x PP{config.pp} holds "
                            f"{manager.num_blocks * manager.block_size} (vLLM's null block aside)")
        scheduler = VllmScheduler(manager, settings["max_num_seqs"], settings["max_num_batched_tokens"])
        settings.update(dtype=dtype, gpu_memory_utilization=utilization, kv_cache_blocks=blocks,
                        kv_cache_tokens=blocks * manager.block_size, max_model_len=model_len)
    try:
        simulation = simulate(requests, scheduler, cost, pp=config.pp, progress=progress,
                              max_in_flight=config.max_concurrent_batches,
                              stage_layers=pipeline_stage_layers(cfg.num_hidden_layers, config.pp))
    except SimulationStuck as exc:
        raise UserError(str(exc)) from None
    return ServingRun(config, simulation, settings, cost.engine_calls,
                      engine.unmeasured(hardware, kernel_categories(cfg, dtype)), cost.extrapolation(),
                      cost.collectives_at_point)


def serving_interval(config: ServingConfig, engine: Engine, progress=None) -> dict:
    """The output's ``interval`` block: the summaries of the simulation with every kernel at the low and at the high
    end of its measured 80 % interval (``levels``), as the aggregator's ``interval`` block sums a workload's kernels
    (perfectly correlated errors); ``note`` where a collective entered at its point value. Each end is simulated
    afresh: a faster step also changes what the scheduler batches next, so a latency percentile of an end may lie
    on the other side of the point simulation's (a scenario, not a bound: README "Serving simulation")."""
    from pipeweave.intervals import COMMUNICATION_NOTE, LEVELS
    from pipeweave.serving.simulator import summarize

    runs = [simulate_config(config, engine, progress, end) for end in ("low", "high")]
    block = {"levels": list(LEVELS), "low": summarize(runs[0].simulation), "high": summarize(runs[1].simulation)}
    if any(run.collectives_at_point for run in runs):
        block["note"] = COMMUNICATION_NOTE
    return block
