"""Does a workload fit in GPU memory? Weights + KV cache + activations per GPU against ``totalGlobalMem``.

``check_memory`` answers for one model config, batch, parallelism (TP, PP, EP) and GPU, the way a vLLM
deployment would lay the model out, and names the smallest TP that would fit. Every term is per GPU:

* **weights**: parameters counted from the config (embedding, every decoder layer, final norm, ``lm_head``;
  no biases, which are < 0.01 % of these models). Linear layers are split over the TP ranks (query/output
  heads, MLP and expert widths, vocabulary padded to 64 entries as vLLM pads it); KV heads are split when there
  are at least TP of them, else one is kept per rank (vLLM replicates them). Norms and the MoE router are
  replicated. The stage sized is the one of most layers, ceil(L / PP) in vLLM's split
  (:func:`pipeweave.workload.pipeline_stage_layers`), with, when PP > 1, the larger of the embedding and ``lm_head``
  (both when PP = 1).
  Experts: EP must divide TP; each of the EP groups holds E / EP experts, each split over TP / EP ranks
  (``moe_tp × moe_ep = tp``, aiconfigurator's convention), so the expert bytes per GPU do not depend on EP.
  ``dtype="fp8"`` stores linear-layer weights in 1 byte; embeddings, ``lm_head``, norms and the router stay
  BF16 (as in public FP8 checkpoints); per-tensor scales are negligible.
* **KV cache**: K and V in BF16 (vLLM's default ``kv_cache_dtype="auto"`` follows the activation dtype, BF16
  also for FP8 weights) for every request at its longest length, ``prompt + output_tokens − 1`` tokens (the
  last decode iteration's ``kv_lengths``), rounded up to vLLM's 16-token blocks, over the stage's layers.
* **activations**: the largest live set of one layer during the prefill of all ``T`` prompt tokens (the workload's
  single prefill iteration; in a workload of decode steps alone, its largest step's tokens): residual and normalised
  hidden states (2·T·H), plus the larger of the attention projections (QKV and attention output) and the MLP
  intermediates (gate/up output and activation output; for MoE the fused kernel's per-slot caches,
  T·top_k·(max(2·I/moe_tp, H) + I/moe_tp): vLLM's ``fused_experts`` keeps the w13 output (2·I) and the w2 output (H)
  in one buffer, since the first is dead when the second is written, beside the SiLU*Mul output (I); T capped at
  vLLM's ``VLLM_FUSED_MOE_CHUNK_SIZE`` of 32,768 tokens), all BF16; plus FP32 logits of one token per request over
  the whole vocabulary (vLLM V1 all-gathers the TP ranks' logits, so that every rank samples; the sampler's own
  workspace, e.g. the sort of a top-k / top-p pass, is not counted).
* **runtime allowance** (``RUNTIME_OVERHEAD_BYTES``, 1 GiB): CUDA context, cuBLAS and NCCL workspaces and
  CUDA-graph pools, the "non-torch" memory that vLLM's start-up profiling measures (about 0.5–1.5 GB).

Available memory is ``GPU_MEMORY_UTILIZATION × totalGlobalMem`` with vLLM's default
``gpu_memory_utilization = 0.9``: vLLM refuses to start a model whose weights and activation peak leave no
room for the KV cache within that fraction. GB here are 10⁹ bytes.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

from analytical_model.pipes import HardwareSpec
from pipeweave.moe import MoeConfig, expert_parallel_problem
from pipeweave.workload import ModelConfig, RankShapes, WorkloadError, padded_vocab_size, pipeline_stage_layers
from pipeweave.workload_inputs import one_edit_apart

GPU_MEMORY_UTILIZATION = 0.9
RUNTIME_OVERHEAD_BYTES = 2 ** 30
KV_BLOCK_TOKENS = 16
FUSED_MOE_CHUNK_TOKENS = 32768
BF16_BYTES = 2
FP32_BYTES = 4
WEIGHT_BYTES = {"bf16": 2, "fp8": 1}  # bytes per linear-layer weight
#: candidate TP sizes for "the smallest TP that fits"
TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class LayerParameters:
    """Parameter counts of one decoder layer of the unsharded model, by how they are stored and split."""

    attention: int  # q, k, v, o projections
    norms: int  # input / post-attention RMSNorm (+ Qwen3 QK-norm weights)
    dense_mlp: int  # gate, up, down of a dense layer (0 for MoE)
    expert: int  # one routed expert's gate, up, down (0 for dense)
    shared_expert: int  # the shared expert (Qwen2-MoE), 0 if none
    router: int  # router (H x E) + shared-expert gate (H x 1)


def layer_parameters(cfg: ModelConfig) -> LayerParameters:
    h, hd = cfg.hidden_size, cfg.head_dim
    qk_norm = 2 * hd if cfg.has_qk_norm else 0
    attention = h * hd * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    moe = cfg.moe
    if moe is None:
        return LayerParameters(attention, 2 * h + qk_norm, 3 * h * cfg.intermediate_size, 0, 0, 0)
    return LayerParameters(
        attention=attention,
        norms=2 * h + qk_norm,
        dense_mlp=0,
        expert=3 * h * moe.expert_intermediate_size,
        shared_expert=3 * h * moe.shared_expert_intermediate_size,
        router=h * moe.num_experts + (h if moe.shared_expert_gate else 0),
    )


def parameter_count(cfg: ModelConfig, active: bool = False) -> int:
    """Total parameters of the model; ``active=True`` counts only the top-k routed experts of each layer."""
    layer = layer_parameters(cfg)
    experts = (cfg.moe.top_k if active else cfg.moe.num_experts) if cfg.moe else 0
    per_layer = (layer.attention + layer.norms + layer.dense_mlp + experts * layer.expert + layer.shared_expert
                 + layer.router)
    embeddings = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    return cfg.num_hidden_layers * per_layer + embeddings + cfg.hidden_size


def weight_bytes_read(cfg: ModelConfig, tokens: int, dtype: str = "bf16") -> float:
    """Bytes of weights one forward step over ``tokens`` tokens reads (whole model, one copy of each weight).

    A dense model reads every weight; an MoE layer reads the experts its tokens are routed to, min(E, tokens ×
    top_k) under the balanced routing the fused-MoE calculator assumes (docs/METHOD.md §11.1.10).
    """
    experts = min(cfg.moe.num_experts, tokens * cfg.moe.top_k) if cfg.moe else 0
    layer = layer_parameters(cfg)
    linear = cfg.num_hidden_layers * (layer.attention + layer.dense_mlp + experts * layer.expert + layer.shared_expert)
    kept_bf16 = (cfg.num_hidden_layers * (layer.norms + layer.router) + cfg.hidden_size
                 + cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2))
    return linear * _dtype_bytes(dtype) + kept_bf16 * BF16_BYTES


def _dtype_bytes(dtype: str) -> int:
    if dtype not in WEIGHT_BYTES:
        raise WorkloadError(f"dtype must be one of {', '.join(WEIGHT_BYTES)}, got {dtype!r}")
    return WEIGHT_BYTES[dtype]


def shard_problem(cfg: ModelConfig, tp: int, ep: int = 1) -> str | None:
    """Why ``cfg`` cannot be split over ``tp`` ranks with expert parallelism ``ep`` (None if it can)."""
    try:
        RankShapes.of(cfg, tp)
    except WorkloadError as exc:
        return str(exc)
    if cfg.moe is None:
        return None if ep == 1 else f"ep {ep} needs a mixture-of-experts model"
    return expert_parallel_problem(cfg.moe, tp, ep)


@dataclass(frozen=True)
class MemoryCheck:
    """Per-GPU memory need of a deployment; byte counts, with GB (10⁹ bytes) properties for messages."""

    weights: float
    kv_cache: float
    activations: float
    runtime: float
    available: float
    smallest_tp: int | None  # the smallest TP in TP_CANDIDATES that fits (same PP, EP, batch); None if none

    @property
    def required(self) -> float:
        return self.weights + self.kv_cache + self.activations + self.runtime

    @property
    def fits(self) -> bool:
        return self.required <= self.available

    @property
    def required_gb(self) -> float:
        return self.required / 1e9

    @property
    def available_gb(self) -> float:
        return self.available / 1e9

    def message(self, tp: int) -> str:
        """One line for a deployment that does not fit (the aggregator's error)."""
        hint = (f"the smallest TP that fits is {self.smallest_tp}" if self.smallest_tp is not None
                else f"no TP up to {TP_CANDIDATES[-1]} fits")
        return (f"does not fit in GPU memory at TP {tp}: needs {self.required_gb:.1f} GB per GPU (weights "
                f"{self.weights / 1e9:.1f}, KV cache {self.kv_cache / 1e9:.1f}, activations "
                f"{self.activations / 1e9:.1f}, runtime {self.runtime / 1e9:.1f}) but {self.available_gb:.1f} GB "
                f"is available ({GPU_MEMORY_UTILIZATION:g} x totalGlobalMem); {hint}")


def weight_bytes_per_gpu(cfg: ModelConfig, tp: int, pp: int = 1, ep: int = 1, dtype: str = "bf16") -> float:
    """Weight bytes on the busiest GPU (see the module docstring for the layout)."""
    problem = shard_problem(cfg, tp, ep)
    if problem:
        raise WorkloadError(f"config {cfg.stem}: {problem}")
    linear_bytes = _dtype_bytes(dtype)
    layer = layer_parameters(cfg)
    h, hd, nh, nkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    kv_heads = nkv // tp if nkv >= tp else 1
    attention = h * hd * (2 * nh // tp + 2 * kv_heads)
    experts = cfg.moe.num_experts * layer.expert // tp if cfg.moe else 0
    linear = attention + (layer.dense_mlp + layer.shared_expert) // tp + experts
    per_layer = linear * linear_bytes + (layer.norms + layer.router) * BF16_BYTES
    vocab_shard = math.ceil(padded_vocab_size(cfg) / tp) * h * BF16_BYTES
    tables = 1 if cfg.tie_word_embeddings or pp > 1 else 2
    return max(pipeline_stage_layers(cfg.num_hidden_layers, pp)) * per_layer + tables * vocab_shard + h * BF16_BYTES


def kv_cache_bytes_per_gpu(cfg: ModelConfig, longest_lengths: Sequence[int], tp: int, pp: int = 1) -> float:
    """BF16 K and V of every request at its longest length (16-token blocks), over one stage's layers."""
    nkv = cfg.num_key_value_heads
    kv_heads = nkv // tp if nkv >= tp else 1
    tokens = sum(math.ceil(n / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS for n in longest_lengths)
    return 2 * max(pipeline_stage_layers(cfg.num_hidden_layers, pp)) * kv_heads * cfg.head_dim * BF16_BYTES * tokens


def activation_bytes_per_gpu(cfg: ModelConfig, tokens: int, sequences: int, tp: int, ep: int = 1) -> float:
    """Peak live activations of one layer during the prefill of ``tokens`` prompt tokens over ``sequences`` prompts,
    plus the FP32 logits of each prompt's last token over the whole vocabulary (gathered on every TP rank)."""
    h, hd = cfg.hidden_size, cfg.head_dim
    kv_heads = cfg.num_key_value_heads // tp if cfg.num_key_value_heads >= tp else 1
    attention = tokens * ((2 * cfg.num_attention_heads // tp + 2 * kv_heads) * hd)
    if cfg.moe is None:
        mlp = tokens * 3 * cfg.intermediate_size // tp
    else:
        moe, moe_tp = cfg.moe, tp // ep
        chunk = min(tokens, FUSED_MOE_CHUNK_TOKENS)
        expert = moe.expert_intermediate_size // moe_tp
        mlp = (chunk * moe.top_k * (max(2 * expert, h) + expert)
               + tokens * 3 * moe.shared_expert_intermediate_size // tp)
    logits = sequences * cfg.vocab_size * FP32_BYTES  # all-gathered: every rank samples (vLLM V1's use_all_gather)
    return (2 * tokens * h + max(attention, mlp)) * BF16_BYTES + logits


def check_layout(cfg: ModelConfig, tp: int, pp: int, ep: int = 1, prompt_tokens: Sequence[int] = (),
                 output_tokens: int = 1) -> None:
    """A WorkloadError for sizes no deployment has (the command lines check their flags before; the Python entry
    points of this module check here): TP, PP, EP, output tokens and every prompt positive integers, PP at most
    the layers."""
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("output_tokens", output_tokens),
                        *(("prompt_tokens", p) for p in prompt_tokens)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise WorkloadError(f"{name} must be a positive integer, got {value!r}")
    if pp > cfg.num_hidden_layers:
        raise WorkloadError(f"pp {pp} exceeds the {cfg.num_hidden_layers} layers of {cfg.stem}: a stage holds at "
                            f"least one layer")


def check_memory(cfg: ModelConfig, hw: HardwareSpec, prompt_tokens: Sequence[int], output_tokens: int, tp: int = 1,
                 pp: int = 1, ep: int = 1, dtype: str = "bf16",
                 forward_lengths: Sequence[int] | None = None) -> MemoryCheck:
    """Per-GPU memory of a static batch (prompts, output_tokens) on ``hw`` and the smallest TP that fits.
    ``forward_lengths``: the query lengths of the largest forward pass, whose activations are the peak (default: the
    prompts, the static batch's prefill; a workload of decode steps alone passes its largest step's)."""
    check_layout(cfg, tp, pp, ep, prompt_tokens, output_tokens)
    forward = list(prompt_tokens if forward_lengths is None else forward_lengths)
    if not hw.total_global_mem:
        raise WorkloadError(f"{hw.stem}: the hardware JSON has no totalGlobalMem; the memory check needs it")
    available = GPU_MEMORY_UTILIZATION * hw.total_global_mem
    longest = [p + output_tokens - 1 for p in prompt_tokens]

    def need(size: int) -> tuple[float, float, float]:
        return (weight_bytes_per_gpu(cfg, size, pp, ep, dtype), kv_cache_bytes_per_gpu(cfg, longest, size, pp),
                activation_bytes_per_gpu(cfg, sum(forward), len(forward), size, ep))

    smallest = smallest_fitting_tp(cfg, lambda size: sum(need(size)) + RUNTIME_OVERHEAD_BYTES <= available, ep)
    weights, kv_cache, activations = need(tp)
    return MemoryCheck(weights, kv_cache, activations, RUNTIME_OVERHEAD_BYTES, available, smallest)


def smallest_fitting_tp(cfg: ModelConfig, fits: Callable[[int], bool], ep: int = 1) -> int | None:
    """The smallest TP in TP_CANDIDATES that can shard ``cfg`` (with EP ``ep``) and for which ``fits(tp)``; None if
    none. One search for every "does not fit" message (the aggregator's batch, the serving simulator's KV cache), so
    they never disagree on which TP sizes are candidates."""
    return next((size for size in TP_CANDIDATES if shard_problem(cfg, size, ep) is None and fits(size)), None)


#: the ``model_params`` keys :func:`config_from_model_params` reads
MODEL_PARAMS_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                     "vocab_size", "num_hidden_layers", "tie_word_embeddings", "num_experts", "num_experts_per_tok",
                     "moe_intermediate_size", "shared_expert_intermediate_size")


def config_from_model_params(params: dict, model: str = "model") -> ModelConfig:
    """The ModelConfig a generated workload's ``model_params`` describe (MoE keys included); a key one edit from
    one read here is an error (``tie_word_embedding`` would have been ignored)."""
    for key in params:
        close = [known for known in MODEL_PARAMS_KEYS if key not in MODEL_PARAMS_KEYS and one_edit_apart(key, known)]
        if close:
            raise WorkloadError(f"model_params: unknown key '{key}'; did you mean '{close[0]}'?")

    def need(key: str, default=None, least: int = 1) -> int:
        value = params.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            kind = "a positive integer" if least == 1 else "a non-negative integer"
            raise WorkloadError(f"model_params.{key} must be {kind}, got {value!r}")
        return value

    tied = params.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise WorkloadError(f"model_params.tie_word_embeddings must be true or false, got {tied!r}")
    moe = None
    if "num_experts" in params:
        shared = need("shared_expert_intermediate_size", 0, least=0)
        moe = MoeConfig(need("num_experts"), need("num_experts_per_tok"), need("moe_intermediate_size"), shared,
                        shared_expert_gate=shared > 0)  # Qwen2-MoE, the one modelled architecture with one
    heads, kv_heads = need("num_attention_heads"), need("num_key_value_heads")
    if heads % kv_heads:
        raise WorkloadError(f"model_params.num_attention_heads {heads} is not a multiple of "
                            f"model_params.num_key_value_heads {kv_heads} (each KV head serves a group of query heads)")
    return ModelConfig(stem=model, model=model, hidden_size=need("hidden_size"), num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=need("head_dim"),
                       intermediate_size=need("intermediate_size"), vocab_size=need("vocab_size"),
                       num_hidden_layers=need("num_hidden_layers"), tie_word_embeddings=tied, moe=moe)
