"""Workload generator (docs/METHOD.md section 6): model config + request trace + parallelism -> workload JSON.

A workload is a static batch: one prefill iteration holding every request of the trace, then one decode
iteration per further generated token (``output_tokens`` iterations in all). Each iteration lists the
operators of the whole model (GEMMs, attention, RMSNorm, SiLU*Mul, collectives) with per-TP-rank shapes and
repeat counts. The JSON text is written exactly as the PipeWeave artifact writes it, so regenerating the
paper's 25 workloads reproduces the artifact's files byte for byte. Operators are the typed entities of
:mod:`pipeweave.schema`; workload specifications, file names and the paper set are in :mod:`pipeweave.generate`.
The inputs (model config, trace) are parsed in :mod:`pipeweave.workload_inputs` and re-exported here, so this
module is the generator's whole Python API.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pipeweave import validation
from pipeweave.moe import MoeConfig, expert_operators, expert_parallel_problem, moe_gate_gemms
from pipeweave.paths import DEFAULT_CONFIG_DIR, DEFAULT_TRACE_DIR
from pipeweave.paths import DEFAULT_WORKLOAD_OUTPUT_DIR as DEFAULT_OUTPUT_DIR
from pipeweave.schema import (DTYPES, AttentionOp, CollectiveOp, ElementwiseOp, GemmOp, Iteration, QuantizeOp,
                              Workload)
from pipeweave.workload_inputs import (ModelConfig, Trace, WorkloadError, format_trace, load_model_config, load_trace,
                                       model_config_from_dict, parse_trace, positive_int)

PREFILL_ATTN_DEFAULT = "fa3_ragged"
DECODE_ATTN_DEFAULT = "fa2_paged"
#: Attention type strings the aggregator understands ("fa2"/"fa3" family x "ragged"/"paged" layout).
ATTENTION_BACKENDS = ("fa2_ragged", "fa3_ragged", "fa2_paged", "fa3_paged")
#: How the TP ranks hold ``lm_head``: "vocab_parallel" as vLLM's ParallelLMHead (each rank the logits of
#: 1/TP of the vocabulary padded to VOCAB_PADDING, then an all-gather of the logits; its embedding is split the
#: same way, which adds one all-reduce of the hidden states), "replicated" as the artifact's workloads (the whole
#: vocabulary on every rank, no gather, no embedding all-reduce; docs/METHOD.md §11.3.21)
LM_HEAD_LAYOUTS = ("vocab_parallel", "replicated")
LM_HEAD_DEFAULT = "vocab_parallel"
#: vLLM pads the vocabulary of its vocabulary-parallel embedding and lm_head to a multiple of this
#: (vllm.model_executor.layers.vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE)
VOCAB_PADDING = 64
LOGITS_BYTES = 2  # logits leave lm_head in the activation dtype (BF16) and are gathered before sampling

# --------------------------------------------------------------------------------------------------
# Workload construction (docs/METHOD.md sections 6.2 and 6.3)
# --------------------------------------------------------------------------------------------------

def _div(value: int, tp: int, what: str) -> int:
    if value % tp:
        fitting = [str(size) for size in range(1, min(value, 64) + 1) if value % size == 0]
        raise WorkloadError(f"{what} is not divisible by tp {tp} (TP sizes up to 64 that divide it: "
                            f"{', '.join(fitting)})")
    return value // tp


def _check_backend(value: str, flag: str) -> str:
    if value not in ATTENTION_BACKENDS:
        raise WorkloadError(f"{flag} '{value}' is not one of {', '.join(ATTENTION_BACKENDS)}")
    return value


@dataclass(frozen=True)
class RankShapes:
    """Per-TP-rank sizes of docs/METHOD.md §6.3; computing them validates every exact division by TP.

    ``gate_up_n`` / ``down_k`` belong to the MLP every token runs: the dense MLP, or an MoE model's shared
    expert (0 when it has none; the routed experts are sized in :mod:`pipeweave.moe`).
    Shared by the workload generator and the profiler's shape grids.
    """

    qkv_n: int
    o_k: int
    gate_up_n: int
    down_k: int
    nh: int
    nkv: int

    @classmethod
    def of(cls, cfg: ModelConfig, tp: int) -> "RankShapes":
        nh, nkv, hd, inter = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
        inter_key = "intermediate_size"
        if cfg.moe is not None:
            inter, inter_key = cfg.moe.shared_expert_intermediate_size, "shared_expert_intermediate_size"
        heads = _div(nh, tp, f"num_attention_heads ({nh})")
        # KV heads are split when there are at least TP of them, else replicated: each rank holds one (as vLLM
        # does; the artifact wrote all of them, which makes nh per rank smaller than nkv, an invalid attention)
        if (nkv < tp and tp % nkv) or (nkv >= tp and nkv % tp):
            fitting = [str(size) for size in range(1, 65) if nh % size == 0
                       and (nkv % size == 0 if size <= nkv else size % nkv == 0)]
            raise WorkloadError(f"num_key_value_heads ({nkv}) neither divides over tp {tp} nor is replicated by it "
                                f"(vLLM replicates each KV head over tp / num_key_value_heads ranks when tp is a "
                                f"multiple of it; TP sizes up to 64 that fit the heads: {', '.join(fitting)})")
        kv_heads = nkv // tp if nkv >= tp else 1
        inter_shard = _div(inter, tp, f"{inter_key} ({inter})")
        return cls(
            # the rank's query heads and its K and V heads (a replicated KV head is computed on every rank that holds
            # it, as vLLM's QKVParallelLinear does; the artifact divided the full (nh + 2 nkv) hd by TP there)
            qkv_n=(heads + 2 * kv_heads) * hd,
            o_k=_div(nh * hd, tp, f"num_attention_heads*head_dim ({nh * hd})"),
            gate_up_n=_div(2 * inter, tp, f"2*intermediate_size ({2 * inter})"),
            down_k=inter_shard,
            nh=heads,
            nkv=kv_heads,
        )


def lm_head_width(cfg: ModelConfig, tp: int, lm_head: str = LM_HEAD_DEFAULT) -> int:
    """The vocabulary columns of ``lm_head`` on one TP rank (:data:`LM_HEAD_LAYOUTS`); raises WorkloadError for an
    unknown layout or a padded vocabulary that TP does not divide (vLLM refuses it too)."""
    if lm_head not in LM_HEAD_LAYOUTS:
        raise WorkloadError(f"lm_head must be one of {', '.join(LM_HEAD_LAYOUTS)}, got {lm_head!r}")
    if lm_head == "replicated":
        return cfg.vocab_size
    padded = padded_vocab_size(cfg)
    return _div(padded, tp, f"vocab_size ({cfg.vocab_size}, padded to {padded} as vLLM does)")


def padded_vocab_size(cfg: ModelConfig) -> int:
    """The vocabulary of vLLM's vocabulary-parallel embedding and lm_head: padded to :data:`VOCAB_PADDING`."""
    return -(-cfg.vocab_size // VOCAB_PADDING) * VOCAB_PADDING


def pipeline_stage_layers(num_layers: int, pp: int) -> list[int]:
    """The decoder layers of each of ``pp`` pipeline stages as vLLM splits them (``get_pp_indices`` without
    ``VLLM_PP_LAYER_PARTITION``): ``num_layers // pp`` each, one more on each of the ``num_layers % pp`` stages
    before the last (which also holds ``lm_head``), e.g. 32 layers over 3 stages: 11, 11, 10."""
    stages = [num_layers // pp] * pp
    for extra in range(num_layers % pp):
        stages[-2 - extra] += 1
    return stages


def iteration_operators(cfg: ModelConfig, shard: RankShapes, tp: int, pp: int, q: list[int], kv: list[int],
                        tokens: int, attention_type: str, rmsnorm_count: int, ep: int = 1,
                        dtype: str = "bf16", lm_head: str = LM_HEAD_DEFAULT) -> dict:
    """The typed operators of one iteration (keyword arguments of :class:`pipeweave.schema.Iteration`)."""
    hidden, layers, batch = cfg.hidden_size, cfg.num_hidden_layers, len(q)
    head_n = lm_head_width(cfg, tp, lm_head)
    communication = []
    if tp > 1:
        volume = tokens * hidden * 2
        # vLLM's vocabulary-parallel embedding sums its ranks' lookups with one more all-reduce of the hidden states
        embedding = 1 if lm_head == "vocab_parallel" else 0
        if cfg.moe is None:
            communication.append(CollectiveOp("all_reduce", volume, 2 * layers + embedding, type="collective"))
        else:  # the MoE output is summed over the TP group's expert shards (EP inside TP: no all-to-all)
            communication += [CollectiveOp("all_reduce", volume, layers + embedding, type="collective"),
                              CollectiveOp("moe_all_reduce", volume, layers, type="collective")]
        if lm_head == "vocab_parallel":  # each rank computed its vocabulary slice of every sequence's logits
            communication.append(CollectiveOp("logits_all_gather", batch * head_n * tp * LOGITS_BYTES, 1,
                                              type="all_gather"))
    if pp > 1:
        communication.append(CollectiveOp("send_recv", 2 * tokens * hidden * 2, pp - 1, type="p2p"))
    linear = [
        GemmOp("qkv_proj", tokens, shard.qkv_n, hidden, layers, type="ColumnParallelLinear"),
        GemmOp("o_proj", tokens, hidden, shard.o_k, layers, type="RowParallelLinear"),
    ]
    prefix = "" if cfg.moe is None else "shared_expert_"
    if shard.gate_up_n:  # the dense MLP, or an MoE model's shared expert
        linear += [
            GemmOp(f"{prefix}gate_up_proj", tokens, shard.gate_up_n, hidden, layers, type="MergedColumnParallelLinear"),
            GemmOp(f"{prefix}down_proj", tokens, hidden, shard.down_k, layers, type="RowParallelLinear"),
        ]
    kept_bf16 = [] if cfg.moe is None else moe_gate_gemms(cfg.moe, hidden, tokens, layers)
    kept_bf16.append(GemmOp("lm_head", batch, head_n, hidden, 1, type="Linear"))
    fp8 = dtype == "fp8"
    return {
        "gemm": kept_bf16 if fp8 else linear + kept_bf16,
        "gemm_fp8": linear if fp8 else [],
        "attention": AttentionOp(attention_type, batch, tuple(q), tuple(kv), shard.nh, shard.nkv, cfg.head_dim, layers),
        "rmsnorm": ElementwiseOp(tokens, hidden, rmsnorm_count),
        "siluandmul": ElementwiseOp(tokens, shard.gate_up_n, layers) if shard.gate_up_n else None,
        "moe": [] if cfg.moe is None else expert_operators(cfg.moe, hidden, tokens, tp, ep, layers),
        "quantize": _fp8_activation_quantisation(linear, tokens) if fp8 else [],
        "communication": communication,
    }


def _fp8_activation_quantisation(linear: list[GemmOp], tokens: int) -> list[QuantizeOp]:
    """The BF16 -> FP8 conversion of every FP8 GEMM's input (one memory-bound pass over tokens x K each).

    GEMMs that share an input width share an entry (qkv_proj and gate_up_proj both read the hidden state).
    """
    widths: dict[int, int] = {}
    for gemm in linear:
        widths[gemm.K] = widths.get(gemm.K, 0) + gemm.count
    return [QuantizeOp(tokens, width, count, name=f"quantize_k{width}") for width, count in widths.items()]


#: what the generator, serve_sim.py and search_config.py say when a Qwen3 model is costed without its q/k RMSNorms
QK_NORM_NOTE = ("Note: Qwen3 normalises q and k in every layer, two more RMSNorm kernels per layer; --qk_norm_rmsnorm "
                "counts them (the default leaves them out, as the artifact's Qwen3-32B arxiv_12 and splitwise_48 files "
                "do)")


def rmsnorm_launches(cfg: ModelConfig, qk_norm_rmsnorm: bool) -> int:
    """RMSNorm launches of one forward pass: two per layer and the final norm, four per layer with the Qwen3 QK-norm
    approximation (docs/METHOD.md §6.3), which a model without QK-norm refuses: it has no q/k norms to count."""
    if qk_norm_rmsnorm and not cfg.has_qk_norm:
        raise WorkloadError(f"--qk_norm_rmsnorm counts the q and k RMSNorms of Qwen3's QK-norm, and {cfg.stem} "
                            f"({cfg.architecture or cfg.model}) has none; leave the flag out")
    return (4 if qk_norm_rmsnorm else 2) * cfg.num_hidden_layers + 1


def build_workload(cfg: ModelConfig, prompt_tokens: Sequence[int], output_tokens: int, tp: int = 1, pp: int = 1,
                   prefill_attn: str = PREFILL_ATTN_DEFAULT, decode_attn: str = DECODE_ATTN_DEFAULT,
                   qk_norm_rmsnorm: bool = False, ep: int = 1, dtype: str = "bf16",
                   lm_head: str = LM_HEAD_DEFAULT) -> Workload:
    """The workload (:class:`pipeweave.schema.Workload`) of a static batch of ``prompt_tokens`` requests.

    ``qk_norm_rmsnorm`` selects the artifact's Qwen3 QK-norm approximation (RMSNorm count 4L + 1 instead of 2L + 1).
    ``lm_head`` is its layout over the TP ranks (:data:`LM_HEAD_LAYOUTS`; "replicated" for the artifact's files).
    ``ep`` spreads an MoE model's experts over groups of the TP ranks (it must divide ``tp``); ``dtype="fp8"``
    turns the linear layers (not the router or ``lm_head``) into FP8 GEMMs plus the activation quantisation.
    Non-default ``ep`` and ``dtype`` are recorded as ``ep_size`` and ``dtype`` keys.
    """
    for value, what in ((tp, "tp"), (pp, "pp"), (ep, "ep"), (output_tokens, "output_tokens")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkloadError(f"{what} must be an integer >= 1, got {value!r}")
    prompts = list(prompt_tokens)
    if not prompts:
        raise WorkloadError("the batch has no requests")
    for p in prompts:
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise WorkloadError(f"prompt lengths must be integers >= 1, got {p!r}")
    if pp > cfg.num_hidden_layers:
        raise WorkloadError(f"pp = {pp} exceeds the model's {cfg.num_hidden_layers} layers (a pipeline stage holds "
                            f"at least one layer)")
    problem = validation.batch_problem(prompts, output_tokens)  # before building: a huge batch exhausts memory
    if problem:
        raise WorkloadError(problem)
    _check_backend(prefill_attn, "prefill_attn")
    _check_backend(decode_attn, "decode_attn")
    if dtype not in DTYPES:
        raise WorkloadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if cfg.checkpoint_dtype is not None and dtype != cfg.checkpoint_dtype:
        source = cfg.quantization_source
        fix = (f"FP8 mixture-of-experts layers are not modelled: remove {source} to predict its BF16 version"
               if cfg.moe is not None else
               f"generate it with --dtype {cfg.checkpoint_dtype}, or remove {source} to predict its "
               f"{dtype.upper()} version")
        raise WorkloadError(f"config {cfg.stem} is an {cfg.checkpoint_dtype.upper()} checkpoint ({source}): "
                            f"{fix}")
    if cfg.max_sequence is not None and max(prompts) + output_tokens > cfg.max_sequence:
        raise WorkloadError(f"the longest request ({max(prompts)} prompt + {output_tokens} output tokens) exceeds "
                            f"{cfg.max_sequence_source} {cfg.max_sequence} of config {cfg.stem}, which vLLM refuses")
    if cfg.moe is None and ep != 1:
        raise WorkloadError(f"ep {ep} needs a mixture-of-experts model; {cfg.stem} is dense")
    if cfg.moe is not None:
        if dtype == "fp8":  # an FP8 checkpoint's fix is its quantisation: --dtype bf16 is refused above
            fix = (f"remove {cfg.quantization_source} to predict its BF16 version" if cfg.checkpoint_dtype
                   else "use --dtype bf16")
            raise WorkloadError(f"config {cfg.stem}: FP8 mixture-of-experts layers are not modelled (the fused-MoE "
                                f"model is trained on BF16 layers only); {fix}")
        problem = expert_parallel_problem(cfg.moe, tp, ep)
        if problem:
            raise WorkloadError(f"config {cfg.stem}: {problem}")
    shard = RankShapes.of(cfg, tp)
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise WorkloadError(f"num_attention_heads ({cfg.num_attention_heads}) must be a multiple of "
                            f"num_key_value_heads ({cfg.num_key_value_heads}) (grouped-query attention)")
    rmsnorm_count = rmsnorm_launches(cfg, qk_norm_rmsnorm)
    batch = len(prompts)

    iterations = []
    for step in range(output_tokens):
        if step == 0:
            phase, q, kv, tokens, attn = "prefill", list(prompts), list(prompts), sum(prompts), prefill_attn
        else:
            phase, q, kv, tokens, attn = "decode", [1] * batch, [p + step for p in prompts], batch, decode_attn
        iterations.append(Iteration(
            phase, step + 1, batch_size=batch, q_lengths=q, kv_lengths=kv, num_tokens=tokens,
            **iteration_operators(cfg, shard, tp, pp, q, kv, tokens, attn, rmsnorm_count, ep, dtype, lm_head),
        ))
    workload = Workload(iterations, model=cfg.model, tp_size=tp, pp_size=pp, model_params=cfg.model_params(),
                        ep_size=ep, dtype=dtype)
    # the aggregator's reader checks every field (head sizes, limits...): never write a file it would reject
    Workload.from_dict({**workload.to_dict(), "iterations": [it.to_dict() for it in iterations[:2]]},
                       f"{cfg.stem} workload")
    return workload


def serialize_workload(workload: Workload) -> bytes:
    """The artifact's serialization: 2-space indent, "," line ends without spaces, ": ", ASCII, no final newline."""
    return workload.to_json_bytes()


__all__ = [
    "ATTENTION_BACKENDS", "DEFAULT_CONFIG_DIR", "DEFAULT_OUTPUT_DIR", "DEFAULT_TRACE_DIR", "DTYPES", "LM_HEAD_DEFAULT",
    "LM_HEAD_LAYOUTS", "ModelConfig",
    "MoeConfig", "RankShapes", "Trace", "WorkloadError", "build_workload", "format_trace", "load_model_config",
    "load_trace", "model_config_from_dict", "parse_trace", "positive_int", "serialize_workload",
]
