"""The workload generator's command line (``workload_generator.py``, ``pipeweave-generate-workload``): flags ->
:class:`pipeweave.generate.WorkloadSpec` -> files. The generation itself is :mod:`pipeweave.generate` and
:mod:`pipeweave.workload`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from analytical_model.gemm_fp8 import missing_rate
from analytical_model.hardware import DEFAULT_HARDWARE_DIR, HardwareSpec, load_hardware
from pipeweave.cli import ArgumentParser, UserError, check_output_folder, positive_int
from pipeweave.generate import PAPER_SET, WorkloadSpec, generate_many, paper_set, write_workloads
from pipeweave.validation import fa3_mismatch, unmeasured_attention_warning
from pipeweave.workload import (ATTENTION_BACKENDS, DECODE_ATTN_DEFAULT, DEFAULT_CONFIG_DIR, DEFAULT_OUTPUT_DIR,
                                DEFAULT_TRACE_DIR, DTYPES, LM_HEAD_DEFAULT, LM_HEAD_LAYOUTS, PREFILL_ATTN_DEFAULT,
                                QK_NORM_NOTE, load_model_config)

# Flags that describe a single workload (not allowed together with --paper_set).
_SINGLE_FLAGS = ("model_config", "trace", "tp", "pp", "ep", "dtype", "prefill_attn", "decode_attn", "qk_norm_rmsnorm",
                 "single_sequence", "prompt_tokens", "output_tokens", "name",
                 "requests", "hardware")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="workload_generator.py",
        description="Turn a model config and a request trace into a static-batch workload JSON "
                    "(one prefill iteration, then one decode iteration per further output token).")
    p.add_argument("--model_config", help="config JSON path, a Hugging Face model directory (its config.json), or "
                                          "a stem of config/ (e.g. Llama-3.1-70B)")
    p.add_argument("--trace", help="trace CSV path, or a stem of workload/traces/ (e.g. arxiv_16); default: none, "
                                   "then --requests, --prompt_tokens and --output_tokens describe the batch")
    p.add_argument("--requests", type=positive_int,
                   help="without --trace: number of identical requests in the batch (default: none)")
    p.add_argument("--tp", type=positive_int,
                   help="tensor-parallel size (default 1); must divide the sharded widths exactly")
    p.add_argument("--pp", type=positive_int,
                   help="pipeline-parallel size (default 1); adds a send_recv entry when > 1")
    p.add_argument("--hardware", metavar="GPU",
                   help="GPU the workload is for (default: none): chooses the prefill attention family its "
                        "architecture runs (fa3_ragged on Hopper, fa2_ragged elsewhere) and refuses a mismatch")
    p.add_argument("--hardware_dir", default=str(DEFAULT_HARDWARE_DIR),
                   help="where --hardware is looked up (default: hardware), e.g. a folder with your own GPU's JSON")
    p.add_argument("--ep", type=positive_int,
                   help="expert-parallel size of an MoE model (default 1); must divide --tp: the TP group's GPUs form "
                        "EP groups of E/EP experts, each expert split over TP/EP ranks")
    p.add_argument("--dtype", choices=DTYPES,
                   help="weight dtype of the linear layers (default bf16); fp8 writes them as FP8 GEMMs plus the "
                        "activation quantisation (dense models only)")
    p.add_argument("--prefill_attn", help=f"prefill attention type (default {PREFILL_ATTN_DEFAULT}, or per "
                                          f"--hardware; one of {', '.join(ATTENTION_BACKENDS)})")
    p.add_argument("--decode_attn", help=f"decode attention type (default {DECODE_ATTN_DEFAULT}; an FA3 type is "
                                         f"refused for a --hardware GPU that cannot run it)")
    p.add_argument("--qk_norm_rmsnorm", action="store_true", default=None,
                   help="Qwen3 QK-norm approximation: RMSNorm count 4L+1 instead of 2L+1")
    p.add_argument("--lm_head", choices=LM_HEAD_LAYOUTS,
                   help=f"how the TP ranks hold lm_head (default {LM_HEAD_DEFAULT}: each rank the logits of 1/TP of "
                        f"the vocabulary and an all-gather of them, as vLLM runs it; replicated: the whole vocabulary "
                        f"on every rank, as the artifact's workloads, which --paper_set writes; --paper_set with "
                        f"vocab_parallel writes the paper's workloads in vLLM's layout into another --output_dir)")
    p.add_argument("--single_sequence", action="store_true", default=None,
                   help="merge the trace's prompts into one request whose prompt is their sum")
    p.add_argument("--prompt_tokens", type=positive_int,
                   help="prompt length of every request (with --trace: replaces the trace's, after "
                        "--single_sequence; default: the trace's)")
    p.add_argument("--output_tokens", type=positive_int,
                   help="number of iterations: one prefill plus output_tokens - 1 decode steps (default: the trace's)")
    p.add_argument("--name", help="label used in place of the trace stem in the output file name (default: the "
                                  "trace stem plus _single, _p<prompt>, _o<output>, _qknorm, _prefill-<type> for a "
                                  "paged prefill, _decode-<type> and _lmhead-<layout> for the variants given, or "
                                  "r<requests>_p<prompt>_o<output> without a trace)")
    p.add_argument("--paper_set", action="store_true",
                   help=f"regenerate the {len(PAPER_SET)} workloads of the PipeWeave paper")
    p.add_argument("--output_dir", default=str(DEFAULT_OUTPUT_DIR), help="output directory (default: workload/)")
    p.add_argument("--config_dir", default=str(DEFAULT_CONFIG_DIR), help="where config stems are looked up (default: config)")
    p.add_argument("--trace_dir", default=str(DEFAULT_TRACE_DIR), help="where trace stems are looked up (default: workload/traces)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_output_folder(args.output_dir, f"--output_dir {args.output_dir}", config_dir=args.config_dir)
    paper_variant = False  # the paper's workloads in another lm_head layout (written outside workload/)
    spec = None  # the --hardware GPU
    if args.paper_set:
        given = [f"--{name}" for name in _SINGLE_FLAGS if getattr(args, name) is not None]
        if given:
            raise UserError(f"--paper_set cannot be combined with {', '.join(given)}")
        layout = args.lm_head or "replicated"
        paper_variant = layout != "replicated"
        if paper_variant and Path(args.output_dir).resolve() == Path(DEFAULT_OUTPUT_DIR).resolve():
            raise UserError(f"--paper_set --lm_head {layout} would replace the paper's workloads in "
                            f"{DEFAULT_OUTPUT_DIR} (the artifact's, which docs/E2E.md predicts); give another "
                            f"--output_dir")
        specs = paper_set(layout)
    else:
        if args.model_config is None:
            raise UserError("missing --model_config (or use --paper_set)")
        if args.trace is None and args.requests is None:
            raise UserError("missing --trace (or --requests with --prompt_tokens and --output_tokens)")
        if args.trace is not None and args.requests is not None:
            raise UserError("give --trace or --requests, not both")
        if args.requests is not None and args.single_sequence:
            raise UserError("--single_sequence merges a trace's requests into one; without a trace give --requests 1 "
                            "with the merged --prompt_tokens")
        spec = load_hardware(args.hardware, args.hardware_dir) if args.hardware is not None else None
        specs = [WorkloadSpec(
            model_config=args.model_config, trace=args.trace,
            tp=1 if args.tp is None else args.tp, pp=1 if args.pp is None else args.pp,
            ep=1 if args.ep is None else args.ep, dtype=args.dtype or "bf16",
            prefill_attn=prefill_attention(args.prefill_attn, spec),
            decode_attn=args.decode_attn or DECODE_ATTN_DEFAULT,
            qk_norm_rmsnorm=bool(args.qk_norm_rmsnorm), single_sequence=bool(args.single_sequence),
            prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, name=args.name,
            requests=args.requests, lm_head=args.lm_head or LM_HEAD_DEFAULT)]
    if spec is not None and args.decode_attn and fa3_mismatch(args.decode_attn, spec.architecture):
        raise UserError(f"--decode_attn {args.decode_attn}: FlashAttention-3 runs only on Hopper GPUs, and {spec.stem} "
                        f"is {spec.architecture}; use fa2_paged (or leave --decode_attn out)")
    missing = missing_rate(spec) if spec is not None and args.dtype == "fp8" else None
    if missing:
        raise UserError(f"--dtype fp8: {missing}, so no FP8 workload can be predicted on it; use --dtype bf16")
    workloads = generate_many(specs, args.config_dir, args.trace_dir, paper_variant=paper_variant)
    for path in write_workloads(workloads, args.output_dir):
        print(path)
    if not args.paper_set and not args.qk_norm_rmsnorm and load_model_config(args.model_config,
                                                                              args.config_dir).has_qk_norm:
        print(QK_NORM_NOTE, file=sys.stderr)  # stdout holds only the written paths, for scripts
    if not args.paper_set:  # what the aggregator will warn of, said where the attention type is chosen
        warning = unmeasured_attention_warning("the workload", [specs[0].prefill_attn, specs[0].decode_attn])
        if warning:
            print(warning, file=sys.stderr)
    return 0


def prefill_attention(given: str | None, spec: HardwareSpec | None) -> str:
    """The prefill attention type: as given, else the family the --hardware GPU runs, else the default."""
    if spec is None:
        return given or PREFILL_ATTN_DEFAULT
    if given is None:
        return "fa2_ragged" if fa3_mismatch("fa3_ragged", spec.architecture) else "fa3_ragged"
    if fa3_mismatch(given, spec.architecture):
        raise UserError(f"--prefill_attn {given}: FlashAttention-3 runs only on Hopper GPUs, and {spec.stem} is "
                        f"{spec.architecture}; use fa2_ragged (or leave --prefill_attn out)")
    return given

