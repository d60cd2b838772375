"""One serving simulation from its settings: the glue shared by serve_sim.py, search_config.py and the report."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from pipeweave.engine import Engine
from pipeweave.cli import UserError
from pipeweave.serving.kv_cache import GPU_MEMORY_UTILIZATION, BlockManager, kv_cache_blocks
from pipeweave.serving.requests import load_serving_trace, make_requests
from pipeweave.serving.schedulers import StaticScheduler, VllmScheduler, vllm_defaults
from pipeweave.serving.simulator import Simulation, SimulationStuck, simulate
from pipeweave.serving.step_cost import KernelStepCost
from pipeweave.workload import DECODE_ATTN_DEFAULT, load_model_config

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
    usage: str = "serve"
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    per_request_outputs: bool = False
    mixed_attention: str = "split"
    decode_bucket: int = 0  # 0: exact decode attention; > 0: the approximation of step_cost.KernelStepCost
    prefill_attn: str | None = None
    decode_attn: str = DECODE_ATTN_DEFAULT
    qk_norm_rmsnorm: bool = False
    collective_hardware: str | None = None
    max_concurrent_batches: int | None = None  # micro-batches in flight (vLLM V1: pp)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ServingRun:
    config: ServingConfig
    simulation: Simulation
    settings: dict  # the scheduler settings in force (defaults resolved) and the KV capacity
    engine_calls: int


def _positive(value, flag: str) -> None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise UserError(f"{flag} must be >= 1, got {value}")


def check(config: ServingConfig) -> None:
    if config.scheduler not in SCHEDULERS:
        raise UserError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {config.scheduler!r}")
    if config.usage not in USAGES:
        raise UserError(f"--usage must be one of {', '.join(USAGES)}, got {config.usage!r}")
    for value, flag in ((config.tp, "--tp"), (config.pp, "--pp"), (config.num_requests, "--num_requests"),
                        (config.max_num_seqs, "--max_num_seqs"),
                        (config.max_num_batched_tokens, "--max_num_batched_tokens"),
                        (config.max_concurrent_batches, "--max_concurrent_batches")):
        _positive(value, flag)
    if config.scheduler == "static" and config.max_num_batched_tokens is not None:
        raise UserError("--max_num_batched_tokens applies to --scheduler vllm (the static batch has no token budget)")
    if config.qps is not None and not config.qps > 0:
        raise UserError(f"--qps must be > 0, got {config.qps}")
    if isinstance(config.decode_bucket, bool) or config.decode_bucket < 0:
        raise UserError(f"--decode_bucket must be >= 0, got {config.decode_bucket}")
    if not 0 < config.gpu_memory_utilization <= 1:
        raise UserError(f"--gpu_memory_utilization must be in (0, 1], got {config.gpu_memory_utilization}")


def simulate_config(config: ServingConfig, engine: Engine, progress=None) -> ServingRun:
    """Build requests, scheduler and step cost from ``config`` and run the simulation."""
    check(config)
    cfg = load_model_config(config.model_config)
    hardware = engine.gpu(config.hardware)
    cost = KernelStepCost(engine, cfg, config.hardware, config.tp, config.pp,
                          collective_hardware=config.collective_hardware, prefill_attn=config.prefill_attn,
                          decode_attn=config.decode_attn, qk_norm_rmsnorm=config.qk_norm_rmsnorm,
                          mixed_attention=config.mixed_attention, decode_bucket=config.decode_bucket)
    requests = make_requests(load_serving_trace(config.trace), config.num_requests, config.qps, config.seed,
                             config.per_request_outputs)
    if config.scheduler == "static":
        scheduler = StaticScheduler(config.max_num_seqs)
        settings = {"max_num_seqs": config.max_num_seqs}
    else:
        settings = vllm_defaults(hardware.total_global_mem, config.usage)
        for key in settings:
            if getattr(config, key) is not None:
                settings[key] = getattr(config, key)
        blocks = kv_cache_blocks(cfg, hardware.total_global_mem, config.tp, config.pp,
                                 settings["max_num_batched_tokens"], settings["max_num_seqs"],
                                 config.gpu_memory_utilization)
        manager = BlockManager(blocks)
        largest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
        if manager.blocks_for(largest.prompt_tokens + largest.output_tokens) > blocks:
            raise UserError(f"request {largest.rid} needs {largest.prompt_tokens + largest.output_tokens} tokens of "
                            f"KV cache but {config.hardware} TP{config.tp} x PP{config.pp} holds "
                            f"{blocks * manager.block_size}")
        scheduler = VllmScheduler(manager, settings["max_num_seqs"], settings["max_num_batched_tokens"])
        settings.update(kv_cache_blocks=blocks, kv_cache_tokens=blocks * manager.block_size)
    try:
        simulation = simulate(requests, scheduler, cost, pp=config.pp, progress=progress,
                              max_in_flight=config.max_concurrent_batches)
    except SimulationStuck as exc:
        raise UserError(str(exc)) from None
    return ServingRun(config, simulation, settings, cost.engine_calls)
