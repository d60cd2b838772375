"""Shape grids for the operator profiler: pure functions, no torch.

Every grid is a list of *rows*: dicts holding the operator's shape columns in the raw-dataset order
(:data:`SHAPE_COLUMNS`). Two sources feed each grid:

* the LLM shapes of the paper's workloads (docs/METHOD.md §6.3): every model config × TP size × token
  count gives the per-rank GEMM, attention, RMSNorm, SiLU*Mul and all-reduce shapes;
* a log-spaced sweep that covers the space between and around them (full grid only).

``--quick`` keeps a handful of token counts and no sweep, so it finishes in minutes on one GPU. Its attention,
RMSNorm and SiLU*Mul rows are the workloads' shapes plus a seeded draw from the full grid (:data:`QUICK_DRAWN_ROWS`).
"""
from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from analytical_model.registry import get_operator, operator_keys
from pipeweave.workload import ModelConfig, RankShapes, WorkloadError, load_model_config

#: the registry's profiled kernels, then the collective (not a registry operator: no analytical features)
OPS = (*operator_keys(profiled=True), "all_reduce")

SHAPE_COLUMNS: dict[str, tuple[str, ...]] = {
    **{op: get_operator(op).shape_columns for op in operator_keys(profiled=True)},
    "all_reduce": ("size_bytes", "num_workers"),
}

DEFAULT_CONFIGS = ("Qwen2.5-14B", "Qwen3-32B", "Llama-3.1-70B")
#: the MoE configs whose fused-MoE layers make the MoE grid (:func:`moe_grid`)
DEFAULT_MOE_CONFIGS = ("Qwen3-30B-A3B", "Qwen3-235B-A22B", "Mixtral-8x7B", "Qwen2-57B-A14B")
DEFAULT_TP = (1, 2, 4, 8)

# Token counts T of one iteration (GEMM M, norm/activation rows, all-reduce T·H·2).
DECODE_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 72, 96, 128, 192, 256)
PREFILL_TOKENS = (384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
                  49152, 65536)
# Σ prompt tokens of the shipped traces (docs/METHOD.md §6.1): the exact prefill M of the paper's workloads.
PAPER_PREFILL_TOKENS = (16266, 27966, 32350, 33950, 35152, 57664, 60296, 84891, 89471)
QUICK_TOKENS = (1, 16, 128, 1024, 8192)
#: rows of the quick grid per class of :data:`QUICK_DRAWN_OPS`: the workloads' shapes, then a seeded draw from the
#: full grid up to this many. Attention's four workload batches give 32 rows (one per head layout), too few for
#: calibrate.py's held-out-fifth choice between the corrections and fine-tuning, which needs 200 kernels of a class
#: (pipeweave.finetune.MIN_SELECTION_KERNELS); 240 leave a margin for rows a backend cannot run. Random rows of the
#: full grid are the condition the evaluation measured (leave-one-GPU-out, mean over the five attention GPUs: 239
#: random kernels 5.7 %, 32 7.2 %; docs/ACCURACY.md, "Calibration on many kernels: attn, k = 239" and the k-shot
#: table). RMSNorm's 10 and SiLU*Mul's 60 workload rows are topped up likewise: their kernels take microseconds, and
#: more kernels still help (RMSNorm with 8, 32, 128 kernels: A100 8.4, 5.2, 3.1 %; the k-shot table).
QUICK_DRAWN_ROWS = 240
QUICK_DRAWN_OPS = ("attn", "rmsnorm", "siluandmul")
QUICK_SAMPLE_SEED = 20261205

# Memory guards: keep single problems within a few GiB so they fit any GPU worth profiling.
GEMM_MAX_BYTES = 2 ** 33          # A + B + C in BF16
GEMM_SWEEP_MAX_FLOP = 2 ** 42     # ≈ 4.4 TFLOP: a few ms on a large GPU
ELEMENTWISE_MAX_ELEMENTS = 2 ** 32  # seq · dim (input) for RMSNorm / SiLU*Mul
ATTN_PREFILL_MAX_TOKENS = 131072  # Σ q of one prefill batch
ATTN_DECODE_MAX_KV = 2 ** 21      # Σ kv of one decode batch
ALLREDUCE_MIN_BYTES = 2 * 1024
ALLREDUCE_MAX_BYTES = 2 ** 30


def load_models(stems: Sequence[str], config_dir: str | Path) -> list[ModelConfig]:
    """The model configs of ``stems`` (the workload generator's loader: unknown stems list the known ones)."""
    return [load_model_config(stem, config_dir) for stem in stems]


def load_trace_prompts(trace_dir: str | Path, problems: list[str] | None = None) -> dict[str, tuple[list[int], int]]:
    """``{trace stem: (prompt lengths, output_tokens)}`` for every trace CSV (docs/METHOD.md §6.1); {} if none.

    The prompt column may be ``num_prefill_tokens`` or ``prompt_tokens``. Files that are not traces are
    skipped (and named in ``problems``): traces only add rows to the attention grid.
    """
    trace_dir = Path(trace_dir)
    traces: dict[str, tuple[list[int], int]] = {}
    if not trace_dir.is_dir():
        return traces
    for path in sorted(trace_dir.glob("*.csv")):
        try:
            with path.open(newline="") as handle:
                rows = list(csv.DictReader(handle))
            column = next(c for c in ("num_prefill_tokens", "prompt_tokens") if rows and c in rows[0])
            prompts = [int(r[column]) for r in rows]
            output = int(rows[0]["output_tokens"])
        except (StopIteration, KeyError, ValueError, TypeError, OSError, csv.Error):
            if problems is not None:
                problems.append(f"{path}: not a trace CSV (num_prefill_tokens or prompt_tokens, "
                                "output_tokens); skipped")
            continue
        if prompts and output >= 1 and min(prompts) >= 1:
            traces[path.stem] = (prompts, output)
    return traces


# ----------------------------------------------------------------------------------------------
# Per-rank LLM shapes (docs/METHOD.md §6.3)


def tp_problem(model: ModelConfig, tp: int) -> str | None:
    """Why ``model`` cannot be split ``tp`` ways (every /TP of §6.3 must be exact), or None."""
    try:
        RankShapes.of(model, tp)
    except WorkloadError as exc:
        return str(exc)
    return None


def llm_gemms(model: ModelConfig, tp: int, tokens: int) -> list[tuple[str, int, int, int]]:
    """``(name, M, N, K)`` of the five GEMMs of one iteration with T = ``tokens``, lm_head at M = T as in a decode
    step (the grid's token counts cover the sequence counts of other steps)."""
    rank = RankShapes.of(model, tp)
    hidden = model.hidden_size
    return [
        ("qkv_proj", tokens, rank.qkv_n, hidden),
        ("o_proj", tokens, hidden, rank.o_k),
        ("gate_up_proj", tokens, rank.gate_up_n, hidden),
        ("down_proj", tokens, hidden, rank.down_k),
        ("lm_head", tokens, model.vocab_size, hidden),
    ]


def attention_heads(model: ModelConfig, tp: int) -> tuple[int, int, int]:
    """Per-rank ``(nh, nkv, hd)``: KV heads are replicated when nkv < TP."""
    rank = RankShapes.of(model, tp)
    return rank.nh, rank.nkv, model.head_dim


def siluandmul_dim(model: ModelConfig, tp: int) -> int:
    """SiLU*Mul ``dim`` is the INPUT width 2·I/TP (gate | up concatenated), as the workloads pass it."""
    return RankShapes.of(model, tp).gate_up_n


# ----------------------------------------------------------------------------------------------
# Helpers


def log_space(lo: int, hi: int, per_octave: int, multiple: int = 1) -> list[int]:
    """Integers from lo to hi (both included), ``per_octave`` points per doubling, rounded to ``multiple``."""
    if lo <= 0 or hi < lo or per_octave < 1:
        raise ValueError("log_space needs 0 < lo <= hi and per_octave >= 1")
    steps = round(math.log2(hi / lo) * per_octave)
    values = []
    for i in range(steps + 1):
        v = lo * 2 ** (i / per_octave)
        v = max(multiple, int(round(v / multiple)) * multiple)
        values.append(min(max(v, lo), hi))
    return sorted(set(values))


def list_text(values: Iterable[int]) -> str:
    """Serialize a length list as the datasets do: "[a,b,…]" without spaces."""
    return "[" + ",".join(str(int(v)) for v in values) + "]"


def _unique(rows: Iterable[dict], columns: Sequence[str]) -> list[dict]:
    seen = set()
    out = []
    for row in rows:
        key = tuple(row[c] for c in columns)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def _log_uniform_lengths(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [int(round(math.exp(math.log(lo) + rng.random() * (math.log(hi) - math.log(lo))))) for _ in range(n)]


# ----------------------------------------------------------------------------------------------
# Grids per operator


def _tp_pairs(models: Sequence[ModelConfig], tps: Sequence[int]) -> list[tuple[ModelConfig, int]]:
    return [(m, tp) for m in models for tp in tps if tp_problem(m, tp) is None]


def gemm_grid(models, tps, tokens, *, sweep: bool) -> list[dict]:
    rows = []
    for model, tp in _tp_pairs(models, tps):
        for t in tokens:
            for name, M, N, K in llm_gemms(model, tp, t):
                if name == "lm_head" and t not in DECODE_TOKENS:
                    continue  # lm_head runs on the last token of each request: M = batch size
                rows.append({"M": M, "N": N, "K": K})
    if sweep:
        for M in log_space(1, 65536, 2):
            for N in log_space(256, 32768, 1):
                for K in log_space(256, 32768, 1):
                    if 2 * M * N * K <= GEMM_SWEEP_MAX_FLOP:
                        rows.append({"M": M, "N": N, "K": K})
    rows = [r for r in rows if 2 * (r["M"] * r["K"] + r["N"] * r["K"] + r["M"] * r["N"]) <= GEMM_MAX_BYTES]
    return _unique(rows, SHAPE_COLUMNS["gemm"])


def gemm_fp8_grid(gemm_rows: Sequence[dict]) -> list[dict]:
    """The BF16 grid restricted to what ``torch._scaled_mm`` accepts (K and N multiples of 16)."""
    return [dict(r) for r in gemm_rows if r["K"] % 16 == 0 and r["N"] % 16 == 0]


def attn_grid(models, tps, *, quick: bool, prefill_type: str = "fa2_ragged", decode_type: str = "fa2_paged",
              traces: dict[str, tuple[list[int], int]] | None = None) -> list[dict]:
    heads = []
    for model, tp in _tp_pairs(models, tps):
        h = attention_heads(model, tp)
        if h not in heads:
            heads.append(h)
    batches: list[tuple[str, list[int], list[int]]] = []  # (type, q, kv)
    if quick:
        for bs, length in ((1, 1024), (4, 4096)):
            batches.append((prefill_type, [length] * bs, [length] * bs))
        for bs, kv in ((16, 1024), (64, 4096)):
            batches.append((decode_type, [1] * bs, [kv] * bs))
    else:
        for length in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
            for bs in (1, 2, 4, 8, 16, 32, 64):
                if bs * length <= ATTN_PREFILL_MAX_TOKENS:
                    batches.append((prefill_type, [length] * bs, [length] * bs))
        for kv in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
            for bs in (1, 2, 4, 8, 16, 32, 48, 64, 72, 128):
                if bs * kv <= ATTN_DECODE_MAX_KV:
                    batches.append((decode_type, [1] * bs, [kv] * bs))
        # Heterogeneous (ragged) batches with a fixed seed: what real traces look like.
        rng = random.Random(20260101)
        for bs in (4, 8, 16, 32, 64):
            for _ in range(2):
                lengths = _log_uniform_lengths(rng, bs, 64, 8192)
                if sum(lengths) <= ATTN_PREFILL_MAX_TOKENS:
                    batches.append((prefill_type, lengths, lengths))
                kvs = _log_uniform_lengths(rng, bs, 128, 16384)
                batches.append((decode_type, [1] * bs, kvs))
        # The paper's traces: prefill q = kv = prompts; decode after 1 step, half-way, and at the last step.
        for prompts, output in (traces or {}).values():
            if sum(prompts) <= ATTN_PREFILL_MAX_TOKENS:
                batches.append((prefill_type, list(prompts), list(prompts)))
            for step in sorted({1, max(1, (output - 1) // 2), max(1, output - 1)}):
                kvs = [p + step for p in prompts]
                if sum(kvs) <= ATTN_DECODE_MAX_KV:
                    batches.append((decode_type, [1] * len(prompts), kvs))
    rows = []
    for nh, nkv, hd in heads:
        for kind, q, kv in batches:
            rows.append({
                "attention_type": kind,
                "bs": len(q),
                "q_lengths": list_text(q),
                "kv_lengths": list_text(kv),
                "nh": nh,
                "nkv": nkv,
                "hd": hd,
            })
    return _unique(rows, SHAPE_COLUMNS["attn"])


def _elementwise_grid(llm_dims: Sequence[int], sweep_dims: Sequence[int], tokens, *, sweep: bool) -> list[dict]:
    rows = [{"seq": t, "dim": d} for d in llm_dims for t in tokens]
    if sweep:
        rows += [{"seq": s, "dim": d} for d in sweep_dims for s in log_space(1, 131072, 1)]
    rows = [r for r in rows if r["seq"] * r["dim"] <= ELEMENTWISE_MAX_ELEMENTS]
    return _unique(rows, ("seq", "dim"))


def rmsnorm_grid(models, tokens, *, sweep: bool) -> list[dict]:
    dims = list(dict.fromkeys(m.hidden_size for m in models))
    sweep_dims = (128, 256, 512, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 12288, 16384)
    return _elementwise_grid(dims, sweep_dims, tokens, sweep=sweep)


def siluandmul_grid(models, tps, tokens, *, sweep: bool) -> list[dict]:
    dims = list(dict.fromkeys(siluandmul_dim(m, tp) for m, tp in _tp_pairs(models, tps)))
    sweep_dims = tuple(2 ** k for k in range(8, 17))  # 256 … 65536 (input width 2·d)
    return _elementwise_grid(dims, sweep_dims, tokens, sweep=sweep)


def moe_grid(models, tps, tokens) -> list[dict]:
    """Whole fused-MoE layers (the registry's ``moe`` shape columns, ``weight_type`` "layer") of every MoE model
    among ``models`` x TP size x token count, as the workload generator lays them out on a rank
    (:func:`pipeweave.moe.expert_operators`: an expert-parallel rank is the TP shard, so EP adds no shape). The
    profiler does not measure the fused-MoE kernel; this grid is the replay set of an MoE fine-tuning
    (:mod:`pipeweave.finetune`)."""
    from pipeweave.moe import expert_operators

    rows = []
    for model in (m for m in models if m.moe is not None):
        for tp in tps:
            for t in tokens:
                layer = expert_operators(model.moe, model.hidden_size, t, tp, 1, 1)[0]
                rows.append({"weight_type": "layer", "M": layer.M, "E": layer.E, "topk": layer.topk,
                             "H": layer.H, "N": layer.N})
    return _unique(rows, get_operator("moe").shape_columns)


def replay_rows(op: str, config_dir: str | Path) -> list[dict]:
    """The full grid of ``op`` (the profiler's; for ``moe``, :func:`moe_grid` of the default MoE configs)."""
    if op == "moe":
        return moe_grid(load_models(DEFAULT_MOE_CONFIGS, config_dir), DEFAULT_TP, grid_tokens(quick=False))
    return build_grid(load_models(DEFAULT_CONFIGS, config_dir), ops=[op]).rows[op]


def allreduce_worker_counts(num_gpus: int) -> list[int]:
    counts = [w for w in (2, 4, 8) if w <= num_gpus]
    if num_gpus >= 2 and num_gpus not in counts:
        counts.append(num_gpus)
    return counts


def allreduce_sizes(models, tokens, *, sweep: bool) -> list[int]:
    sizes = {t * m.hidden_size * 2 for m in models for t in tokens}  # volume_bytes = T·H·2 (§6.3)
    if sweep:
        sizes |= {b for b in log_space(ALLREDUCE_MIN_BYTES, ALLREDUCE_MAX_BYTES, 2, multiple=256)}
    return sorted(s for s in sizes if s <= ALLREDUCE_MAX_BYTES)


def allreduce_grid(models, tokens, num_gpus: int, *, sweep: bool) -> list[dict]:
    sizes = allreduce_sizes(models, tokens, sweep=sweep)
    return [{"size_bytes": s, "num_workers": w} for w in allreduce_worker_counts(num_gpus) for s in sizes]


# ----------------------------------------------------------------------------------------------
# The whole grid


@dataclass
class Grid:
    rows: dict[str, list[dict]]
    notes: list[str]

    def sizes(self) -> dict[str, int]:
        return {op: len(rows) for op, rows in self.rows.items()}

    @property
    def total(self) -> int:
        return sum(len(r) for r in self.rows.values())


def grid_tokens(quick: bool) -> tuple[int, ...]:
    if quick:
        return QUICK_TOKENS
    return tuple(sorted(set(DECODE_TOKENS) | set(PREFILL_TOKENS) | set(PAPER_PREFILL_TOKENS)))


def build_grid(
    models: Sequence[ModelConfig],
    tps: Sequence[int] = DEFAULT_TP,
    *,
    quick: bool = False,
    ops: Sequence[str] = OPS,
    num_gpus: int = 1,
    prefill_attention_type: str = "fa2_ragged",
    decode_attention_type: str = "fa2_paged",
    traces: dict[str, tuple[list[int], int]] | None = None,
) -> Grid:
    """All rows to measure, per operator; ``notes`` explains (model, TP) pairs and ops left out."""
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"unknown operator(s) {', '.join(unknown)}; choose from {', '.join(OPS)}")
    notes = []
    for model in models:
        for tp in tps:
            problem = tp_problem(model, tp)
            if problem:
                notes.append(f"{model.stem} TP {tp} left out: {problem}")
    tokens = grid_tokens(quick)
    sweep = not quick
    rows: dict[str, list[dict]] = {}
    gemm_rows = gemm_grid(models, tps, tokens, sweep=sweep) if ("gemm" in ops or "gemm_fp8" in ops) else []
    for op in OPS:
        if op not in ops:
            continue
        if op == "gemm":
            rows[op] = gemm_rows
        elif op == "gemm_fp8":
            rows[op] = gemm_fp8_grid(gemm_rows)
        elif op == "attn":
            rows[op] = attn_grid(models, tps, quick=quick, prefill_type=prefill_attention_type,
                                 decode_type=decode_attention_type, traces=traces)
        elif op == "rmsnorm":
            rows[op] = rmsnorm_grid(models, tokens, sweep=sweep)
        elif op == "siluandmul":
            rows[op] = siluandmul_grid(models, tps, tokens, sweep=sweep)
        elif op == "all_reduce":
            rows[op] = allreduce_grid(models, tokens, num_gpus, sweep=sweep)
            if num_gpus < 2:
                per_count = len(allreduce_sizes(models, tokens, sweep=sweep))
                notes.append(f"all_reduce needs at least 2 visible GPUs ({num_gpus} visible); "
                             f"it would measure {per_count} sizes per worker count")
        else:  # registered as profiled, but nothing here says which shapes to measure or how to run them
            notes.append(f"{op}: no shape grid to measure (a registered operator needs one here, in "
                         f"pipeweave/profiler/grids.py, and a runner in pipeweave/profiler/runners.py)")
    drawn = [op for op in QUICK_DRAWN_OPS if op in rows]
    if quick and drawn:
        full = build_grid(models, tps, ops=drawn, prefill_attention_type=prefill_attention_type,
                          decode_attention_type=decode_attention_type, traces=traces)
        for op in drawn:
            rows[op] = quick_draw(rows[op], full.rows[op], SHAPE_COLUMNS[op])
        if "attn" in drawn:
            from pipeweave.finetune import MIN_SELECTION_KERNELS

            if len(rows["attn"]) < MIN_SELECTION_KERNELS:
                notes.append(f"attn: the full grid of these configs and TP sizes has only {len(rows['attn'])} rows, "
                             f"all measured; calibrate.py chooses a fine-tuning from {MIN_SELECTION_KERNELS} kernels "
                             f"of a class (add --configs or --tp for more)")
    return Grid(rows=rows, notes=notes)


def informative_grid(grid: Grid, spec, k: int, prior=None) -> Grid:
    """``grid`` with every kernel operator's rows cut to the ``k`` whose measurements teach ``calibrate.py
    --kernels`` most on the GPU of ``spec`` (:func:`pipeweave.kernel_design.informative_kernels`, under ``prior``,
    by default the shipped calibration prior), in the order chosen: the most informative first, so an operator that
    ``--max_minutes`` stops part-way has its best shapes measured. All-reduce rows are kept (no kernel
    calibration)."""
    from pipeweave.calibration import load_prior
    from pipeweave.kernel_design import informative_kernels, kernel_terms

    prior = prior or load_prior()
    rows, notes = dict(grid.rows), list(grid.notes)
    for op, op_rows in grid.rows.items():
        if op == "all_reduce" or not op_rows:
            continue
        columns = SHAPE_COLUMNS[op]
        features = get_operator(op).features({c: [row[c] for row in op_rows] for c in columns}, spec)
        shapes = [tuple(row[c] for c in columns) for row in op_rows]
        chosen = informative_kernels(*kernel_terms(op, features, shapes, prior), prior, k)
        rows[op] = [op_rows[i] for i in chosen]
        notes.append(f"{op}: all its {len(op_rows)} grid shapes (--kernels {k} is not fewer)" if k >= len(op_rows)
                     else f"{op}: the {k} of its {len(op_rows)} grid shapes that teach a calibration of {spec.name} "
                          f"most (pipeweave.kernel_design), most informative first")
    return Grid(rows=rows, notes=notes)


def quick_draw(rows: list[dict], full: list[dict], columns: Sequence[str]) -> list[dict]:
    """``rows``, then a seeded random draw of the other rows of ``full`` up to :data:`QUICK_DRAWN_ROWS` (all of them
    when fewer), in the full grid's order."""
    chosen = {tuple(r[c] for c in columns) for r in rows}
    others = [r for r in full if tuple(r[c] for c in columns) not in chosen]
    wanted = min(max(0, QUICK_DRAWN_ROWS - len(rows)), len(others))
    return rows + [others[i] for i in sorted(random.Random(QUICK_SAMPLE_SEED).sample(range(len(others)), wanted))]
