"""Workload files: the specification of one workload, its file name, the paper's 25 workloads (docs/METHOD.md
§6.5, §9), and generating and writing them (the logic behind ``workload_generator.py``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

from pipeweave.paths import DEFAULT_CONFIG_DIR, DEFAULT_TRACE_DIR, command
from pipeweave.validation import MAX_BATCH
from pipeweave.workload import (DECODE_ATTN_DEFAULT, LM_HEAD_DEFAULT, PREFILL_ATTN_DEFAULT, Trace, WorkloadError,
                                build_workload, load_model_config, load_trace, positive_int, serialize_workload)

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that determines one workload file.

    ``single_sequence`` merges the trace's prompts into one request (prompt = their sum);
    ``prompt_tokens`` then replaces every request's prompt length (after merging);
    ``output_tokens`` replaces the trace's value; ``name`` replaces the trace stem in the file name (default:
    :func:`workload_label`). Without a trace, ``requests`` identical requests of ``prompt_tokens`` and
    ``output_tokens`` are generated. ``lm_head`` is its layout over the TP ranks
    (:data:`pipeweave.workload.LM_HEAD_LAYOUTS`).
    """

    model_config: str
    trace: str | None
    tp: int = 1
    pp: int = 1
    prefill_attn: str = PREFILL_ATTN_DEFAULT
    decode_attn: str = DECODE_ATTN_DEFAULT
    qk_norm_rmsnorm: bool = False
    single_sequence: bool = False
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    name: str | None = None
    ep: int = 1
    dtype: str = "bf16"
    requests: int | None = None
    lm_head: str = LM_HEAD_DEFAULT


def output_name(config_stem: str, label: str, prefill_attn: str, tp: int, pp: int, ep: int = 1,
                dtype: str = "bf16") -> str:
    """``<config stem>_<trace stem>_<prefill backend prefix>_tp<TP>_pp<PP>[_ep<EP>][_<dtype>].json`` (docs/METHOD.md
    §6.4; the EP and dtype parts only when they are not the defaults 1 and bf16)."""
    extra = (f"_ep{ep}" if ep != 1 else "") + (f"_{dtype}" if dtype != "bf16" else "")
    return f"{config_stem}_{label}_{prefill_attn.split('_', 1)[0]}_tp{tp}_pp{pp}{extra}.json"


def workload_label(spec: WorkloadSpec, trace_stem: str) -> str:
    """The label of the file name: ``name`` if given, else the trace stem plus ``_single``, ``_p<prompt tokens>``,
    ``_o<output tokens>``, ``_qknorm``, ``_prefill-<type>`` (a paged prefill), ``_decode-<type>`` and
    ``_lmhead-<layout>`` for the overrides
    and variants given, so that a workload that is not the trace's never takes the name (and overwrites the file) of
    the trace's own workload, such as a paper workload."""
    if spec.name is not None:
        return spec.name
    parts = [trace_stem, "single"] if spec.single_sequence else [trace_stem]
    if spec.trace is not None:  # without a trace the stem, r<requests>_p<prompt>_o<output>, holds these already
        parts += [f"{prefix}{value}" for prefix, value in (("p", spec.prompt_tokens), ("o", spec.output_tokens))
                  if value is not None]
    if spec.qk_norm_rmsnorm:
        parts.append("qknorm")
    if spec.prefill_attn is not None and not spec.prefill_attn.endswith("_ragged"):  # the name keeps fa2/fa3 only
        parts.append(f"prefill-{spec.prefill_attn}")
    if spec.decode_attn != DECODE_ATTN_DEFAULT:
        parts.append(f"decode-{spec.decode_attn}")
    if spec.lm_head != LM_HEAD_DEFAULT:
        parts.append(f"lmhead-{spec.lm_head}")
    return "_".join(parts)


@dataclass
class GeneratedWorkload:
    file_name: str
    content: bytes = field(repr=False)


def generate(spec: WorkloadSpec, config_dir: str | Path = DEFAULT_CONFIG_DIR,
             trace_dir: str | Path = DEFAULT_TRACE_DIR, paper_variant: bool = False) -> GeneratedWorkload:
    """Resolve a spec's config and trace, build the workload and serialize it. A workload that differs from the
    paper workload of its file name is refused, unless ``paper_variant`` (a paper spec in another ``lm_head``
    layout, :func:`paper_set`, which the caller writes outside the paper's folder)."""
    cfg = load_model_config(spec.model_config, config_dir)
    trace = load_trace(spec.trace, trace_dir) if spec.trace is not None else uniform_trace(spec)
    prompts = list(trace.prompt_tokens)
    if spec.single_sequence:
        prompts = [sum(prompts)]
    if spec.prompt_tokens is not None:
        positive_int(spec.prompt_tokens, "prompt_tokens")
        prompts = [spec.prompt_tokens] * len(prompts)
    output_tokens = trace.output_tokens if spec.output_tokens is None else spec.output_tokens
    label = workload_label(spec, trace.stem)
    if not _LABEL.match(label):
        raise WorkloadError(f"name {label!r} must start with a letter or digit and contain only letters, digits, "
                            "'.', '_' and '-'")
    workload = build_workload(cfg, prompts, output_tokens, tp=spec.tp, pp=spec.pp, prefill_attn=spec.prefill_attn,
                              decode_attn=spec.decode_attn, qk_norm_rmsnorm=spec.qk_norm_rmsnorm, ep=spec.ep,
                              dtype=spec.dtype, lm_head=spec.lm_head)
    generated = GeneratedWorkload(output_name(cfg.stem, label, spec.prefill_attn, spec.tp, spec.pp, spec.ep,
                                              spec.dtype), serialize_workload(workload))
    if not paper_variant:
        _refuse_paper_name_clash(spec, generated, config_dir, trace_dir)
    return generated


def _refuse_paper_name_clash(spec: WorkloadSpec, generated: GeneratedWorkload, config_dir, trace_dir) -> None:
    """The paper workloads hold variants under the plain names the artifact gave them (every one replicates
    ``lm_head``, two hold the QK-norm approximation), so the same command without their flags (or with another config
    or trace of that name) would silently write a different workload under a paper file's name. A paper spec read
    from the default folders is the paper's own; anything else is compared byte for byte (only when the name is a
    paper file's). The refusal names the paper's flags and the ``--name`` that writes the paper's own."""
    paper = dict(zip(paper_set_names(), PAPER_SET)).get(generated.file_name)
    if paper is None:
        return
    default_folders = (Path(config_dir).resolve() == Path(DEFAULT_CONFIG_DIR).resolve()
                       and Path(trace_dir).resolve() == Path(DEFAULT_TRACE_DIR).resolve())
    if (spec == paper and default_folders) or generate(paper).content == generated.content:
        return
    if spec == paper:  # the paper's own spec (--paper_set, or the same single command), from other folders
        raise WorkloadError(f"{generated.file_name}: read from another --config_dir or --trace_dir, this workload "
                            f"differs from the paper workload of that name; use the default folders, or (a single "
                            f"workload) give --name with another label")
    flags = [flag for flag, differs in (("--qk_norm_rmsnorm", paper.qk_norm_rmsnorm and not spec.qk_norm_rmsnorm),
                                        (f"--lm_head {paper.lm_head}", paper.lm_head != spec.lm_head)) if differs]
    flag = f" (the paper's was generated with {' and '.join(flags)})" if flags else ""
    own = f" (the paper's own: add {' '.join(flags)} --name {paper.name})" if flags else ""
    raise WorkloadError(f"{generated.file_name} is the name of a paper workload "
                        f"({command('workload_generator.py')} --paper_set writes it) and this workload differs from "
                        f"it{flag}; give --name with another label to write it under another name{own}")


def uniform_trace(spec: WorkloadSpec) -> Trace:
    """``requests`` requests of ``prompt_tokens`` each, generating ``output_tokens``: the common question, without
    writing a trace file."""
    missing = [f"--{name}" for name in ("requests", "prompt_tokens", "output_tokens") if getattr(spec, name) is None]
    if missing:
        raise WorkloadError(f"without --trace, give --requests, --prompt_tokens and --output_tokens "
                            f"(missing {', '.join(missing)})")
    for name in ("requests", "prompt_tokens", "output_tokens"):
        positive_int(getattr(spec, name), name)
    if spec.requests > MAX_BATCH:
        raise WorkloadError(f"--requests {spec.requests} exceeds the limit {MAX_BATCH:,} per batch")
    stem = f"r{spec.requests}_p{spec.prompt_tokens}_o{spec.output_tokens}"
    return Trace(stem=stem, prompt_tokens=(spec.prompt_tokens,) * spec.requests,
                 decode_tokens=(spec.output_tokens,) * spec.requests, output_tokens=spec.output_tokens)


def _paper_set() -> tuple[WorkloadSpec, ...]:
    """The 25 workloads of the PipeWeave artifact (docs/METHOD.md sections 6.3, 6.5 and 9)."""
    specs: list[WorkloadSpec] = []
    both = ("fa2_ragged", "fa3_ragged")
    # tp1.sh: Qwen2.5-14B, TP1, fa2 (Ampere/Ada/Blackwell) and fa3 (Hopper) files.
    for trace in ("arxiv_8", "splitwise_32"):
        specs += [WorkloadSpec("Qwen2.5-14B", trace, tp=1, prefill_attn=a) for a in both]
    # tp2.sh: Qwen3-32B, TP2; arxiv_16 / splitwise_64 were generated with the QK-norm variant (RMSNorm 4L+1 = 257),
    # under the plain names the artifact gave them (name=trace: no _qknorm).
    for trace, qk_norm in (("arxiv_12", False), ("arxiv_16", True), ("splitwise_48", False), ("splitwise_64", True)):
        specs += [WorkloadSpec("Qwen3-32B", trace, tp=2, prefill_attn=a, qk_norm_rmsnorm=qk_norm,
                               name=trace if qk_norm else None) for a in both]
    # tp4.sh: Llama-3.1-70B, TP4, fa2 (A100) and fa3 (H100).
    for trace in ("arxiv_16", "splitwise_64"):
        specs += [WorkloadSpec("Llama-3.1-70B", trace, tp=4, prefill_attn=a) for a in both]
    # tp8.sh: Llama-3.1-70B, TP8, fa3 (H800/H20), including the commented-out arxiv_32 / splitwise_72.
    for trace in ("arxiv_16", "arxiv_32", "splitwise_64", "splitwise_72"):
        specs.append(WorkloadSpec("Llama-3.1-70B", trace, tp=8, prefill_attn="fa3_ragged"))
    # vllm_tp4_pp2.sh: uniformised traces, TP4 x PP2, fa3.
    for trace in ("vllm_arxiv16", "vllm_splitwise64"):
        specs.append(WorkloadSpec("Llama-3.1-70B", trace, tp=4, pp=2, prefill_attn="fa3_ragged"))
    # Orphan single-sequence files (docs/METHOD.md 6.5): one request holding a trace's total prompt; the trace's
    # output_tokens. The 32,720-token prompt of vllm_s32 is not splitwise_32's sum (33,950): given explicitly.
    specs.append(WorkloadSpec("Llama-3.1-70B", "arxiv_16", tp=4, pp=2, single_sequence=True, name="vllm_a16"))
    specs.append(WorkloadSpec("Qwen2.5-14B", "arxiv_8", tp=1, single_sequence=True, name="vllm_a8"))
    specs.append(WorkloadSpec("Qwen2.5-14B", "splitwise_32", tp=1, single_sequence=True, prompt_tokens=32720,
                              name="vllm_s32"))
    # every rank computes the whole vocabulary's logits in the artifact's files (docs/METHOD.md §11.3.21), under the
    # plain names it gave them
    return tuple(replace(s, lm_head="replicated", name=workload_label(s, s.trace)) for s in specs)


PAPER_SET: tuple[WorkloadSpec, ...] = _paper_set()


def paper_set_names() -> list[str]:
    """Output file names of the 25 paper workloads (the specs name configs by stem)."""
    return [output_name(s.model_config, workload_label(s, s.trace), s.prefill_attn, s.tp, s.pp) for s in PAPER_SET]


def paper_set(lm_head: str = "replicated") -> list[WorkloadSpec]:
    """The paper's 25 specs with ``lm_head`` laid out as given (the artifact's files: "replicated"), under their
    names: the paper's runs predicted with vLLM's layout are these workloads with "vocab_parallel"."""
    return [replace(spec, lm_head=lm_head) for spec in PAPER_SET]


def generate_many(specs: Iterable[WorkloadSpec], config_dir: str | Path = DEFAULT_CONFIG_DIR,
                  trace_dir: str | Path = DEFAULT_TRACE_DIR, paper_variant: bool = False) -> list[GeneratedWorkload]:
    """Generate several workloads in memory (all are validated before any is written)."""
    return [generate(spec, config_dir, trace_dir, paper_variant) for spec in specs]


def write_workloads(workloads: Iterable[GeneratedWorkload], output_dir: str | Path) -> list[Path]:
    """Write each workload atomically into ``output_dir``; returns the paths written."""
    from pipeweave.cli import write_atomically

    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise WorkloadError(f"output_dir {output_dir} exists and is not a directory")
    paths = []
    for item in workloads:
        path = output_dir / item.file_name
        write_atomically(path, lambda tmp, data=item.content: tmp.write_bytes(data))
        paths.append(path)
    return paths
