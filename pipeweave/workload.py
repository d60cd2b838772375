"""Workload generator (METHOD.md section 6): model config + request trace + parallelism -> workload JSON.

A workload is a static batch: one prefill iteration holding every request of the trace, then one decode
iteration per further generated token (``output_tokens`` iterations in all). Each iteration lists the
operators of the whole model (GEMMs, attention, RMSNorm, SiLU*Mul, collectives) with per-TP-rank shapes and
repeat counts. The JSON text is written exactly as the PipeWeave artifact writes it, so regenerating the
paper's 25 workloads reproduces the artifact's files byte for byte. Operators are the typed entities of
:mod:`pipeweave.schema`; workload specifications, file names and the paper set are in :mod:`pipeweave.generate`.

Traces are CSV files with one request per row. Two header layouts are accepted:

* this project's format: ``request,prompt_tokens,decode_tokens,output_tokens`` (``request`` optional);
* the PipeWeave artifact's format: ``num_prefill_tokens,num_decode_tokens,output_tokens``.

``decode_tokens`` (the request's output length in the source trace) is kept for reference but not used;
``output_tokens`` is the number of generated tokens of the measured run and must be the same on every row.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pipeweave import validation
from pipeweave.cli import UserError
from pipeweave.moe import (MoeConfig, expert_operators, expert_parallel_problem, moe_config_from_dict,
                           moe_gate_gemms)
from pipeweave.paths import DEFAULT_CONFIG_DIR, DEFAULT_TRACE_DIR
from pipeweave.paths import DEFAULT_WORKLOAD_OUTPUT_DIR as DEFAULT_OUTPUT_DIR
from pipeweave.schema import (DTYPES, AttentionOp, CollectiveOp, ElementwiseOp, GemmOp, Iteration, QuantizeOp,
                              Workload)

PREFILL_ATTN_DEFAULT = "fa3_ragged"
DECODE_ATTN_DEFAULT = "fa2_paged"
#: Attention type strings the aggregator understands ("fa2"/"fa3" family x "ragged"/"paged" layout).
ATTENTION_BACKENDS = ("fa2_ragged", "fa3_ragged", "fa2_paged", "fa3_paged")

#: Column layouts of a trace CSV: name -> (prompt column, decode column, output column).
TRACE_FORMATS = {
    "pipeweave": ("prompt_tokens", "decode_tokens", "output_tokens"),
    "artifact": ("num_prefill_tokens", "num_decode_tokens", "output_tokens"),
}
TRACE_HEADER = ("request", "prompt_tokens", "decode_tokens", "output_tokens")

_MODEL_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
               "vocab_size", "num_hidden_layers")


class WorkloadError(UserError):
    """Invalid model config, trace or generator option (reported as a one-line CLI error)."""


# --------------------------------------------------------------------------------------------------
# Model configuration (METHOD.md section 2)
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    """The subset of an HF ``config.json`` the generator reads, with ``head_dim`` resolved."""

    stem: str
    model: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_hidden_layers: int
    tie_word_embeddings: bool = False
    #: the routed/shared experts of a mixture-of-experts model (every layer is MoE); None for a dense model
    moe: MoeConfig | None = None

    def model_params(self) -> dict:
        return {
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "num_hidden_layers": self.num_hidden_layers,
            **({} if self.moe is None else {
                "num_experts": self.moe.num_experts,
                "num_experts_per_tok": self.moe.top_k,
                "moe_intermediate_size": self.moe.expert_intermediate_size,
                "shared_expert_intermediate_size": self.moe.shared_expert_intermediate_size,
            }),
        }


def positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"{what} must be a positive integer, got {value!r}")
    return value


def model_config_from_dict(cfg: dict, stem: str = "model") -> ModelConfig:
    """Validate a parsed config dict and resolve ``head_dim`` and the ``model`` string."""
    if not isinstance(cfg, dict):
        raise WorkloadError(f"config {stem}: expected a JSON object")
    values = {}
    for key in _MODEL_KEYS:
        if key not in cfg:
            raise WorkloadError(f"config {stem}: missing key '{key}'")
        values[key] = positive_int(cfg[key], f"config {stem}: {key}")
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if cfg.get("head_dim") is not None:
        head_dim = positive_int(cfg["head_dim"], f"config {stem}: head_dim")
    else:
        if hidden % heads:
            raise WorkloadError(f"config {stem}: no head_dim and hidden_size {hidden} is not divisible by "
                                f"num_attention_heads {heads}")
        head_dim = hidden // heads
    if "_name_or_path" in cfg:
        model = str(cfg["_name_or_path"])
    elif isinstance(cfg.get("architectures"), list) and cfg["architectures"]:
        model = str(cfg["architectures"][0])
    else:
        model = "unknown"
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise WorkloadError(f"config {stem}: tie_word_embeddings must be true or false, got {tie!r}")
    try:
        moe = moe_config_from_dict(cfg)
    except ValueError as exc:
        raise WorkloadError(f"config {stem}: {exc}") from None
    return ModelConfig(stem=stem, model=model, head_dim=head_dim, tie_word_embeddings=tie, moe=moe, **values)


def _known_stems(directory: Path, suffix: str) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.iterdir() if p.suffix == suffix and not p.name.startswith("."))


def _resolve(name: str | Path, directory: Path, suffix: str, what: str) -> Path:
    """A path to an existing file, or a stem looked up in ``directory``; unknown stems list the known ones."""
    text = str(name)
    path = Path(text)
    if path.is_file():
        return path
    if "/" in text or "\\" in text:
        raise WorkloadError(f"{what} file not found: {text}")
    stem = text[: -len(suffix)] if text.endswith(suffix) else text
    candidate = Path(directory) / f"{stem}{suffix}"
    if stem and candidate.is_file():
        return candidate
    known = _known_stems(Path(directory), suffix)
    listing = ", ".join(known) if known else f"none in {directory}"
    raise WorkloadError(f"unknown {what} '{text}' (known: {listing})")


def load_model_config(name: str | Path, config_dir: str | Path = DEFAULT_CONFIG_DIR) -> ModelConfig:
    """Load a model config by path or by stem (``config/<stem>.json``)."""
    path = _resolve(name, Path(config_dir), ".json", "model config")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"config {path}: not valid JSON ({exc})") from None
    return model_config_from_dict(cfg, stem=path.stem)


# --------------------------------------------------------------------------------------------------
# Traces
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trace:
    """A request batch: prompt and source-trace decode length per request, plus the run's output_tokens."""

    stem: str
    prompt_tokens: tuple[int, ...]
    decode_tokens: tuple[int, ...]
    output_tokens: int

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)


def parse_trace(text: str, stem: str = "trace") -> Trace:
    """Parse trace CSV text in this project's format or the PipeWeave artifact's format."""
    rows = [row for row in csv.reader(io.StringIO(text.lstrip("\ufeff"))) if any(cell.strip() for cell in row)]
    if not rows:
        raise WorkloadError(f"trace {stem}: empty file")
    header = [cell.strip() for cell in rows[0]]
    columns = None
    for names in TRACE_FORMATS.values():
        if set(names) <= set(header):
            columns = names
            break
    if columns is None:
        raise WorkloadError(
            f"trace {stem}: unrecognised header {','.join(header)!r}; expected "
            f"'{','.join(TRACE_HEADER)}' or '{','.join(TRACE_FORMATS['artifact'])}'")
    index = [header.index(name) for name in columns]
    if len(rows) == 1:
        raise WorkloadError(f"trace {stem}: no requests (header only)")
    prompts, decodes, outputs = [], [], []
    for line_no, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise WorkloadError(f"trace {stem}: line {line_no} has {len(row)} fields, expected {len(header)}")
        parsed = []
        for name, i in zip(columns, index):
            cell = row[i].strip()
            try:
                parsed.append(int(cell))
            except ValueError:
                raise WorkloadError(f"trace {stem}: line {line_no}: {name} is not an integer: {cell!r}") from None
        prompt, decode, output = parsed
        if prompt < 1:
            raise WorkloadError(f"trace {stem}: line {line_no}: {columns[0]} must be >= 1, got {prompt}")
        if decode < 0:
            raise WorkloadError(f"trace {stem}: line {line_no}: {columns[1]} must be >= 0, got {decode}")
        if output < 1:
            raise WorkloadError(f"trace {stem}: line {line_no}: output_tokens must be >= 1, got {output}")
        prompts.append(prompt)
        decodes.append(decode)
        outputs.append(output)
    if len(set(outputs)) != 1:
        raise WorkloadError(f"trace {stem}: output_tokens differs between rows ({sorted(set(outputs))}); "
                            "it is a property of the run and must be the same on every row")
    return Trace(stem=stem, prompt_tokens=tuple(prompts), decode_tokens=tuple(decodes), output_tokens=outputs[0])


def load_trace(name: str | Path, trace_dir: str | Path = DEFAULT_TRACE_DIR) -> Trace:
    """Load a trace by path or by stem (``workload/traces/<stem>.csv``)."""
    path = _resolve(name, Path(trace_dir), ".csv", "trace")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"trace {path}: not UTF-8 text ({exc})") from None
    return parse_trace(text, stem=path.stem)


def format_trace(trace: Trace) -> str:
    """This project's trace CSV text (LF line endings, requests numbered from 1)."""
    lines = [",".join(TRACE_HEADER)]
    for i, (prompt, decode) in enumerate(zip(trace.prompt_tokens, trace.decode_tokens), start=1):
        lines.append(f"{i},{prompt},{decode},{trace.output_tokens}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Workload construction (METHOD.md sections 6.2 and 6.3)
# --------------------------------------------------------------------------------------------------

def _div(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise WorkloadError(f"{what} is not divisible by tp {tp}")
    return value // tp


def _check_backend(value: str, flag: str) -> str:
    if value not in ATTENTION_BACKENDS:
        raise WorkloadError(f"{flag} '{value}' is not one of {', '.join(ATTENTION_BACKENDS)}")
    return value


@dataclass(frozen=True)
class RankShapes:
    """Per-TP-rank sizes of METHOD.md §6.3; computing them validates every exact division by TP.

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
        if cfg.moe is not None:
            inter = cfg.moe.shared_expert_intermediate_size
        heads = _div(nh, tp, f"num_attention_heads ({nh})")
        # KV heads are split when there are at least TP of them, else replicated: each rank holds one (as vLLM
        # does; the artifact wrote all of them, which makes nh per rank smaller than nkv, an invalid attention)
        kv_heads = _div(nkv, tp, f"num_key_value_heads ({nkv})") if nkv >= tp else 1
        inter_shard = _div(inter, tp, f"intermediate_size ({inter})")
        return cls(
            # Under KV replication the artifact still divides the full (nh + 2 nkv) hd by TP (METHOD.md 11.3 #23).
            qkv_n=_div((nh + 2 * nkv) * hd, tp,
                       f"qkv width (num_attention_heads + 2*num_key_value_heads)*head_dim ({(nh + 2 * nkv) * hd})"),
            o_k=_div(nh * hd, tp, f"num_attention_heads*head_dim ({nh * hd})"),
            gate_up_n=_div(2 * inter, tp, f"2*intermediate_size ({2 * inter})"),
            down_k=inter_shard,
            nh=heads,
            nkv=kv_heads,
        )


def _iteration_operators(cfg: ModelConfig, shard: RankShapes, tp: int, pp: int, q: list[int], kv: list[int],
                         tokens: int, attention_type: str, rmsnorm_count: int, ep: int = 1,
                         dtype: str = "bf16") -> dict:
    """The typed operators of one iteration (keyword arguments of :class:`pipeweave.schema.Iteration`)."""
    hidden, layers, batch = cfg.hidden_size, cfg.num_hidden_layers, len(q)
    communication = []
    if tp > 1:
        volume = tokens * hidden * 2
        if cfg.moe is None:
            communication.append(CollectiveOp("all_reduce", volume, 2 * layers, type="collective"))
        else:  # the MoE output is summed over the TP group's expert shards (EP inside TP: no all-to-all)
            communication += [CollectiveOp("all_reduce", volume, layers, type="collective"),
                              CollectiveOp("moe_all_reduce", volume, layers, type="collective")]
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
    kept_bf16.append(GemmOp("lm_head", batch, cfg.vocab_size, hidden, 1, type="Linear"))
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


def build_workload(cfg: ModelConfig, prompt_tokens: Sequence[int], output_tokens: int, tp: int = 1, pp: int = 1,
                   prefill_attn: str = PREFILL_ATTN_DEFAULT, decode_attn: str = DECODE_ATTN_DEFAULT,
                   qk_norm_rmsnorm: bool = False, ep: int = 1, dtype: str = "bf16") -> Workload:
    """The workload (:class:`pipeweave.schema.Workload`) of a static batch of ``prompt_tokens`` requests.

    ``qk_norm_rmsnorm`` selects the artifact's Qwen3 QK-norm approximation (RMSNorm count 4L + 1 instead of 2L + 1).
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
    problem = validation.batch_problem(prompts, output_tokens)  # before building: a huge batch exhausts memory
    if problem:
        raise WorkloadError(problem)
    _check_backend(prefill_attn, "prefill_attn")
    _check_backend(decode_attn, "decode_attn")
    if dtype not in DTYPES:
        raise WorkloadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if cfg.moe is None and ep != 1:
        raise WorkloadError(f"ep {ep} needs a mixture-of-experts model; {cfg.stem} is dense")
    if cfg.moe is not None:
        if dtype == "fp8":
            raise WorkloadError(f"config {cfg.stem}: FP8 mixture-of-experts layers are not modelled (the fused-MoE "
                                "model is trained on BF16 layers only); use --dtype bf16")
        problem = expert_parallel_problem(cfg.moe, tp, ep)
        if problem:
            raise WorkloadError(f"config {cfg.stem}: {problem}")
    shard = RankShapes.of(cfg, tp)
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise WorkloadError(f"num_attention_heads ({cfg.num_attention_heads}) must be a multiple of "
                            f"num_key_value_heads ({cfg.num_key_value_heads}) (grouped-query attention)")
    layers = cfg.num_hidden_layers
    rmsnorm_count = (4 if qk_norm_rmsnorm else 2) * layers + 1
    batch = len(prompts)

    iterations = []
    for step in range(output_tokens):
        if step == 0:
            phase, q, kv, tokens, attn = "prefill", list(prompts), list(prompts), sum(prompts), prefill_attn
        else:
            phase, q, kv, tokens, attn = "decode", [1] * batch, [p + step for p in prompts], batch, decode_attn
        iterations.append(Iteration(
            phase, step + 1, batch_size=batch, q_lengths=q, kv_lengths=kv, num_tokens=tokens,
            **_iteration_operators(cfg, shard, tp, pp, q, kv, tokens, attn, rmsnorm_count, ep, dtype),
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
    "ATTENTION_BACKENDS", "DEFAULT_CONFIG_DIR", "DEFAULT_OUTPUT_DIR", "DEFAULT_TRACE_DIR", "DTYPES", "ModelConfig",
    "MoeConfig", "RankShapes", "Trace", "WorkloadError", "build_workload", "format_trace", "load_model_config",
    "load_trace", "model_config_from_dict", "parse_trace", "serialize_workload",
]
