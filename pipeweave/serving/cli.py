"""``serve_sim.py``: simulate serving a request stream with a static or vLLM-style scheduler."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeweave.cli import ArgumentParser, UserError, check_output_path, require_png, save_png, write_atomically
from pipeweave.engine import uncalibrated, unmeasured_note
from pipeweave.moe import EP_NOTE
from pipeweave.paths import DEFAULT_CONFIG_DIR, DEFAULT_TRACE_DIR
from pipeweave.report import extrapolated_note
from pipeweave.serving.kv_cache import GPU_MEMORY_UTILIZATION
from pipeweave.serving.run import SCHEDULERS, USAGES, ServingConfig, check, serving_interval, simulate_config
from pipeweave.serving.simulator import request_metrics, summarize
from pipeweave.serving.step_cost import MIXED_ATTENTION
from pipeweave.workload import ATTENTION_BACKENDS, DECODE_ATTN_DEFAULT, DTYPES, load_model_config
from pipeweave.workload_inputs import resolve_model_config, resolve_named_file

CSV_COLUMNS = ("request", "prompt_tokens", "output_tokens", "arrival_ms", "first_token_ms", "finish_ms", "ttft_ms",
               "tpot_ms", "e2e_ms", "preemptions")


def add_engine_arguments(parser) -> None:
    """Flags of the kernel predictor (shared with search_config.py)."""
    from pipeweave.aggregate import COLLECTIVE_ESTIMATES

    parser.add_argument("--model_dir", default=None, help="trained MLPs (default: mlp_models)")
    parser.add_argument("--hardware_dir", default=None, help="directory of GPU spec JSONs (default: hardware)")
    parser.add_argument("--collective_hardware", default=None, metavar="GPU",
                        help="GPU whose collective models predict TP/PP communication (default: the GPU's own)")
    parser.add_argument("--collective_estimate", choices=COLLECTIVE_ESTIMATES, default="model",
                        help="'analytical' allows the documented analytical collective estimate where no measured "
                             "model covers a collective (printed as a WARNING); default 'model'")
    parser.add_argument("--calibration", default=None, metavar="JSON",
                        help="a calibration written by calibrate.py: corrects the step times of its GPU (only); "
                             "refused if no simulated GPU is that GPU (default: none)")


def add_scheduler_arguments(parser) -> None:
    """Flags of the model, the request stream and the scheduler (shared with search_config.py)."""
    parser.add_argument("--model_config", required=True, help="model config: JSON path, Hugging Face model directory "
                                                                   "(its config.json) or stem of config/")
    parser.add_argument("--trace", required=True, help="request trace: CSV path or stem of workload/traces/")
    parser.add_argument("--qps", type=float, default=None,
                        help="Poisson arrival rate (requests/s, seeded); without it every request arrives at t = 0, "
                             "or at the trace's arrival_time_s column if it has one")
    parser.add_argument("--num_requests", type=int, default=None,
                        help="requests drawn from the trace in order, cycling (default: the trace's rows)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals (default 0)")
    parser.add_argument("--per_request_outputs", action="store_true",
                        help="each request generates its own decode_tokens (at least 1) instead of the trace's "
                             "output_tokens (the measured run's length, the same for every request)")
    parser.add_argument("--max_num_batched_tokens", type=int, default=None,
                        help="token budget per step (vllm; default vLLM's: 8192 on GPUs with >= 70 GiB other than "
                             "the A100, else 2048; with --usage offline 16384 / 8192)")
    parser.add_argument("--usage", choices=USAGES, default=None,
                        help="whose vLLM defaults: 'serve' (vllm serve, default) or 'offline' (LLM class, the "
                             "latency benchmark); vllm only")
    parser.add_argument("--gpu_memory_utilization", type=float, default=None,
                        help=f"share of GPU memory vLLM may use (vllm only; default {GPU_MEMORY_UTILIZATION})")
    parser.add_argument("--mixed_attention", choices=MIXED_ATTENTION, default="split",
                        help="attention of a step mixing prefill chunks and decodes: 'split' (default) = one "
                             "prefill launch + one decode launch; 'single' = one prefill-backend launch over all")
    parser.add_argument("--decode_bucket", type=int, default=0, metavar="TOKENS",
                        help="approximate each decode attention launch by the batch's mean context rounded up to a "
                             "multiple of TOKENS (faster for very long runs; the error it adds: README, "
                             "\"Serving simulation\"); default 0 = exact")
    parser.add_argument("--prefill_attn", choices=ATTENTION_BACKENDS, default=None,
                        help="prefill attention backend (default fa3_ragged on Hopper, fa2_ragged elsewhere)")
    parser.add_argument("--decode_attn", choices=ATTENTION_BACKENDS, default=DECODE_ATTN_DEFAULT,
                        help=f"decode attention backend (default {DECODE_ATTN_DEFAULT})")
    parser.add_argument("--max_concurrent_batches", type=int, default=None,
                        help="micro-batches in flight, 1 to --pp (vllm only; default: --pp, as vLLM V1's batch "
                             "queue; 1 = no pipelining)")
    parser.add_argument("--max_model_len", type=int, default=None,
                        help="longest request (prompt + output tokens) the engine serves, as vLLM's flag (vllm only; "
                             "default: the config's max_position_embeddings, with its rope scaling, as vLLM's); vLLM "
                             "refuses to start when one request of that length does not fit in the KV cache")
    parser.add_argument("--qk_norm_rmsnorm", action="store_true",
                        help="Qwen3 QK-norm approximation of the workload generator (RMSNorm count 4L + 1)")


def build_parser():
    parser = ArgumentParser(
        prog="serve_sim.py",
        description="Simulate LLM serving (continuous batching) with iteration durations from pipeweave's kernel "
                    "predictor: TTFT, TPOT, end-to-end latency and throughput.")
    parser.add_argument("--hardware", required=True,
                        help="GPU name (hardware file stem, driver or aiconfigurator name) or the path of a GPU's JSON "
                             "file")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    parser.add_argument("--scheduler", choices=SCHEDULERS, default="vllm",
                        help="'vllm' (vLLM V1 continuous batching, default) or 'static' (the static batch of "
                             "aggregator.py: one prefill of every request, then lock-step decode)")
    parser.add_argument("--max_num_seqs", type=int, default=None,
                        help="most requests running at once (vllm default: 1024 on GPUs with >= 70 GiB other than "
                             "the A100, else 256, at most --max_num_batched_tokens; static: unlimited)")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="weight dtype of the linear layers: fp8 costs them as FP8 GEMMs plus the activation "
                             "quantisation and stores them in 1 byte (default: the checkpoint's quantization_config, "
                             "else bf16)")
    parser.add_argument("--ep", type=int, default=1,
                        help="expert-parallel size of an MoE model (default 1), as workload_generator.py's: must "
                             "divide --tp; the TP group's GPUs form EP groups of E/EP experts")
    add_scheduler_arguments(parser)
    add_engine_arguments(parser)
    parser.add_argument("--output", required=True,
                        help="output JSON (summary); the per-request CSV is written beside it (same stem, .csv)")
    parser.add_argument("--plot", default=None, metavar="PNG", help="write CDFs of TTFT and TPOT as a PNG")
    parser.add_argument("--interval", action="store_true",
                        help="also simulate with every kernel at the low and at the high end of its measured 80 %% "
                             "interval (output 'interval': their summaries; three simulations instead of one)")
    return parser


def config_from_args(args, **overrides) -> ServingConfig:
    """The ServingConfig of parsed flags; ``overrides`` replace flags the calling tool does not have."""
    get = lambda name: overrides[name] if name in overrides else getattr(args, name)  # noqa: E731
    config = ServingConfig(
        model_config=args.model_config, trace=args.trace, hardware=get("hardware"), tp=get("tp"), pp=get("pp"),
        scheduler=get("scheduler"), qps=args.qps, num_requests=args.num_requests, seed=args.seed,
        max_num_seqs=get("max_num_seqs"), max_num_batched_tokens=args.max_num_batched_tokens, usage=args.usage,
        gpu_memory_utilization=args.gpu_memory_utilization, per_request_outputs=args.per_request_outputs,
        mixed_attention=args.mixed_attention, decode_bucket=args.decode_bucket, prefill_attn=args.prefill_attn,
        decode_attn=args.decode_attn,
        qk_norm_rmsnorm=args.qk_norm_rmsnorm, collective_hardware=args.collective_hardware,
        max_concurrent_batches=args.max_concurrent_batches, dtype=get("dtype"), ep=get("ep"),
        max_model_len=args.max_model_len)
    check(config)
    return config


def check_paths(args, outputs: dict) -> None:
    """Before any work: each output (what names it -> path) writable, and none the same file as an input or as
    another output (serve_sim's per-request CSV takes --output's stem, so --output trace.json would replace trace.csv).
    Unknown --model_config or --trace names are reported here too."""
    from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_files
    from pipeweave.workload_inputs import QUANT_SIDECARS

    model = resolve_model_config(args.model_config, DEFAULT_CONFIG_DIR)
    trace = resolve_named_file(args.trace, DEFAULT_TRACE_DIR, ".csv", "trace")
    seen = {model.resolve(): "the --model_config file", trace.resolve(): "the --trace file"}
    # the quantisation files the config is read with (a GPU's spec is guarded by check_output_path: search_config's
    # OUT.json beside hardware/H100.csv would replace hardware/H100.json)
    seen |= {(model.parent / name).resolve(): f"the quantisation file {name} of --model_config"
             for name in QUANT_SIDECARS if (model.parent / name).is_file()}
    hardware_dir = Path(getattr(args, "hardware_dir", None) or DEFAULT_HARDWARE_DIR)
    seen |= {Path(path): f"the hardware file {path} of --hardware"
             for path in hardware_files(getattr(args, "hardware", None))}
    if getattr(args, "calibration", None):
        seen[Path(args.calibration).resolve()] = "the --calibration file"
    for name, path in outputs.items():
        check_output_path(path, name, hardware_dir)
        where = Path(path).resolve()
        if where in seen:
            raise UserError(f"{name} {path} would overwrite {seen[where]}; choose another path")
        # a flag names a file; a name that is not a flag ("the per-request CSV of --output") already says what it is
        seen[where] = f"the {name} file" if name.startswith("--") else name


#: flags of the kernel predictor; they change the prediction, so the output records them beside the ServingConfig
ENGINE_FLAGS = ("model_dir", "hardware_dir", "collective_estimate", "calibration")


def engine_settings(args) -> tuple[str, str, tuple[str, ...], str, tuple[str, str] | None]:
    """(model_dir, hardware_dir, the hardware JSON files among --hardware, collective_estimate, (calibration file,
    its digest)) in force: the flags given, else the defaults (a Dask worker builds its engine from them)."""
    from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_files
    from pipeweave.calibration import calibration_key
    from pipeweave.paths import DEFAULT_MODEL_DIR

    # with its digest, so that a worker never reuses the corrections of a rewritten file
    calibration = calibration_key(args.calibration) if args.calibration else None
    return (str(args.model_dir or DEFAULT_MODEL_DIR), str(args.hardware_dir or DEFAULT_HARDWARE_DIR),
            hardware_files(args.hardware), args.collective_estimate, calibration)


def engine_from_settings(settings: tuple, log=None):
    """The kernel predictor of :func:`engine_settings`, with its hardware files' GPUs and the calibration file's
    corrections where given."""
    from pipeweave.calibration import file_digest, load_calibration
    from pipeweave.engine import Engine

    model_dir, hardware_dir, files, collective_estimate, calibration = settings
    if calibration and (not Path(calibration[0]).is_file() or file_digest(calibration[0]) != calibration[1]):
        raise ValueError(f"--calibration {calibration[0]}: not the file the sweep was started with here (digest "
                         f"{calibration[1]}); give every Dask worker the same file at the same path")
    engine = Engine(model_dir=model_dir, hardware_dir=hardware_dir, collective_estimate=collective_estimate, log=log,
                    calibration=load_calibration(calibration[0]) if calibration else None)
    for path in files:  # a worker knows such a GPU by the stem the sweep's candidates carry
        engine.registry.add_file(path)
    return engine


def make_engine(args, log=None):
    return engine_from_settings(engine_settings(args), log or (lambda message: print(message, file=sys.stderr)))


def check_calibration(engine, gpus: list[str], model_config: str, communicates: bool,
                      collective_hardware: str | None = None, dtypes=(None,), say=print) -> None:
    """A calibration for none of the simulated GPUs is refused, and one fitted against other kernel models (of the
    operators the model runs with weights in each of ``dtypes``) or, where the simulated deployments communicate,
    other collective models says so (as aggregator.py does)."""
    calibration = engine.calibration
    if calibration is None:
        return
    calibration.check_hardware([engine.gpu(gpu).stem for gpu in gpus])
    say(f"Calibration: {calibration.path} ({calibration.hardware})")
    for warning in calibration_warnings(engine, model_config, communicates, collective_hardware, dtypes):
        say(warning)


def qk_norm_note(args, say=print) -> None:
    """The generator's note on a Qwen3 model costed without its q/k RMSNorms (flag not given)."""
    from pipeweave.workload import QK_NORM_NOTE, load_model_config

    if not args.qk_norm_rmsnorm and load_model_config(args.model_config).has_qk_norm:
        say(QK_NORM_NOTE)


def arrivals_note(trace: str, qps: float | None, searched: bool = False, say=print) -> None:
    """A note where a request rate replaces the arrival times the trace recorded (Poisson arrivals instead)."""
    from pipeweave.serving.requests import ARRIVAL_COLUMN, load_serving_trace

    if (qps is not None or searched) and load_serving_trace(trace).arrivals_s is not None:
        rate = "the searched rates" if searched else f"--qps {qps:g} requests/s"
        say(f"Note: the trace's recorded {ARRIVAL_COLUMN} are replaced by Poisson arrivals at {rate}")


def calibration_warnings(engine, model_config: str, communicates: bool, collective_hardware: str | None = None,
                         dtypes=(None,)) -> list[str]:
    """:meth:`pipeweave.engine.Engine.calibration_warnings` for the kernel models a simulation of ``model_config``
    uses with weights in each of ``dtypes``, and the collective models of ``collective_hardware`` (default: the
    calibrated GPU's) where the deployments communicate."""
    from pipeweave.flatten import KERNEL_CATEGORIES
    from pipeweave.serving.run import kernel_categories, weight_dtype
    from pipeweave.workload import load_model_config

    cfg = load_model_config(model_config)
    ops = [KERNEL_CATEGORIES[category] for dtype in dtypes
           for category in kernel_categories(cfg, weight_dtype(cfg, dtype))]
    collectives = engine.gpu(collective_hardware).stem if collective_hardware else engine.calibration.hardware
    return engine.calibration_warnings(ops, [collectives] if communicates else [])


def requests_csv(metrics: dict) -> str:
    lines = [",".join(CSV_COLUMNS)]
    for row in zip(*(metrics[c] for c in CSV_COLUMNS)):
        lines.append(",".join("" if v != v else (f"{v:.6f}" if isinstance(v, float) else str(v))
                              for v in (x.item() for x in row)))
    return "\n".join(lines) + "\n"


def new_figure(**kwargs):
    """A matplotlib figure on the non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(**kwargs)


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    save_png(fig, path, dpi=120)
    plt.close(fig)


def plot_cdfs(metrics: dict, path: Path, title: str) -> None:
    import numpy as np

    fig, axes = new_figure(ncols=2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")):
        values = np.sort(metrics[key][~np.isnan(metrics[key])])
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    save_figure(fig, path)


def interval_line(interval: dict) -> str:
    """The console's line of an ``interval`` block (:func:`pipeweave.serving.run.serving_interval`)."""
    low, high = interval["low"], interval["high"]
    parts = [f"{key[:-3].upper()} p50 {low[key]['p50']:.3f} / {high[key]['p50']:.3f} ms"
             for key in ("ttft_ms", "tpot_ms", "e2e_ms") if None not in (low[key]["p50"], high[key]["p50"])]
    parts.append(f"output {low['output_tokens_per_s']:.1f} / {high['output_tokens_per_s']:.1f} tokens/s")
    return (f"Every kernel at the low / high end of its {round((interval['levels'][1] - interval['levels'][0]) * 100)} "
            f"% interval (held-out kernel errors; two more simulations, whose batching may differ): "
            f"{', '.join(parts)}" + (" (some collectives at their point value: interval.note)" if "note" in interval
                                     else ""))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    output = Path(args.output)
    if output.suffix != ".json":
        raise UserError(f"--output {output}: expected a .json file")
    csv_path = output.with_suffix(".csv")
    outputs = {"--output": output, "the per-request CSV of --output": csv_path}
    if args.plot:
        outputs["--plot"] = Path(args.plot)
    check_paths(args, outputs)
    if args.plot:
        require_png(args.plot)
    from tqdm import tqdm

    from pipeweave.calibration import calibration_key

    engine = make_engine(args)
    for gpu in (args.hardware, args.collective_hardware):  # unknown GPU: error listing the known ones, before any work
        if gpu is not None:
            engine.gpu(gpu)
    qk_norm_note(args)
    arrivals_note(args.trace, args.qps)
    if config.ep > 1 and load_model_config(config.model_config).moe is not None:  # a dense model is refused below
        print(EP_NOTE)
    check_calibration(engine, [args.hardware], args.model_config, args.tp * args.pp > 1, args.collective_hardware,
                      [args.dtype])
    with tqdm(desc="requests", unit="req", disable=None, file=sys.stderr) as bar:
        run = simulate_config(config, engine, progress=bar.update)
        interval = serving_interval(config, engine, bar.update) if args.interval else None
    metrics = request_metrics(run.simulation.requests)
    summary = summarize(run.simulation)
    # the calibration's digest beside its path, as search_config records it: the file may be rewritten later
    digest = {"calibration_digest": calibration_key(args.calibration)[1] if args.calibration else None}
    result = {"config": config.as_dict() | {flag: getattr(args, flag) for flag in ENGINE_FLAGS} | digest
              | {"interval": args.interval},
              "settings": run.settings, "unmeasured_gpu": run.unmeasured_gpu, "extrapolation": run.extrapolation,
              "summary": summary}
    if interval is not None:
        result["interval"] = interval
    gpu = engine.gpu(args.hardware)
    record = engine.calibration_record(gpu)
    if record:  # what the aggregator records: the file, its GPU and what it was fitted from
        result["calibration"] = record
    text = json.dumps(result, indent=2) + "\n"
    write_atomically(csv_path, lambda tmp: tmp.write_text(requests_csv(metrics)))
    write_atomically(output, lambda tmp: tmp.write_text(text))
    if args.plot:
        plot_cdfs(metrics, Path(args.plot), f"{config.model_config} ({run.settings['dtype'].upper()}) on "
                                            f"{config.hardware} TP{config.tp} PP{config.pp}"
                                            f"{f' EP{config.ep}' if config.ep > 1 else ''} ({config.scheduler}, "
                                            f"{summary['num_requests']} requests)")
    print(f"Makespan: {summary['makespan_ms']:.3f} ms over {summary['num_steps']} steps")
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        p = summary[key]
        if p["p50"] is not None:
            print(f"{key[:-3].upper()} p50 / p90 / p99: {p['p50']:.3f} / {p['p90']:.3f} / {p['p99']:.3f} ms")
    print(f"Throughput: {summary['throughput_tokens_per_s']:.1f} tokens/s "
          f"({summary['output_tokens_per_s']:.1f} output tokens/s)")
    if interval is not None:
        print(interval_line(interval))
    zero_shot, calibrated = uncalibrated(run.unmeasured_gpu, record)
    if zero_shot:
        print(unmeasured_note(gpu.name, zero_shot, "step times", calibrated))
    note = extrapolated_note(run.extrapolation, "simulated kernel time")
    if note:
        print(note)
    saved = [str(output), str(csv_path), *([args.plot] if args.plot else [])]
    print(f"Results saved to {', '.join(saved[:-1])} and {saved[-1]}")
    return 0
