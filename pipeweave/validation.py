"""Checks where inputs enter and outputs leave: limits of every numeric input (workload JSON, shape CSV, generator
flags), head sizes, FlashAttention-3 on GPUs that cannot run it, damaged model files, non-finite durations.

Each limit is far above any real LLM inference shape and far below what breaks the arithmetic (float32
features, memory of the per-iteration lists): a value outside is an input error that names the limit, never a
NaN, an overflow or a process killed for memory minutes later. Hardware spec ranges are checked by
:mod:`analytical_model.hardware`.
"""
from __future__ import annotations

import math

from pipeweave.cli import UserError
from pipeweave.paths import command

#: tokens of one iteration: GEMM M, element-wise seq, the sum of an attention batch's query lengths
MAX_TOKENS = 2 ** 20
#: one request's context (an attention kv_length)
MAX_CONTEXT = 2 ** 21
#: a layer width: GEMM N and K, element-wise dim
MAX_WIDTH = 2 ** 20
#: requests in one attention batch
MAX_BATCH = 2 ** 16
#: attention heads (query or KV) per rank
MAX_HEADS = 1024
#: repeats of one operator entry in an iteration (layers × operators per layer)
MAX_COUNT = 2 ** 20
#: bytes of one collective message
MAX_VOLUME_BYTES = 2 ** 40
#: iterations of one workload (one prefill + output_tokens - 1 decode steps)
MAX_ITERATIONS = 2 ** 16
#: requests x iterations of one workload, the entries of its per-iteration length lists (2^22: ~300 MB of JSON; 256
#: requests x 65,536 output tokens wrote 1.1 GB and took 8.4 GB of memory)
MAX_REQUEST_ITERATIONS = 2 ** 22
#: tensor / pipeline parallel degree
MAX_PARALLEL = 1024

#: head sizes: FlashAttention kernels take multiples of 8 up to 256 (padding to their compiled sizes); the
#: analytical calculators count the head in 16-wide MMA tiles (FA2's d_vo = hd / 16), so a multiple of 16 is needed
HEAD_DIM_STEP, MAX_HEAD_DIM = 16, 256
#: architectures that run FlashAttention-3 (its kernels use Hopper's TMA and wgmma instructions)
FA3_ARCHITECTURES = ("hopper",)

#: a GEMM tile edge (tile_M / tile_N / tile_K): tensor-core MMAs tile in multiples of 8, and no GEMM kernel tiles
#: beyond 512 (the measured tiles are 8-256 by 64-256 by 32-128)
TILE_STEP, MAX_TILE = 8, 512
#: CTAs of one launch: CUDA's grid limit in x
MAX_CTAS = 2 ** 31 - 1

#: field name → (limit, what it counts), for the per-field checks of workloads and shape CSVs
FIELD_LIMITS = {
    "M": (MAX_TOKENS, "tokens of one iteration"),
    "seq": (MAX_TOKENS, "tokens of one iteration"),
    "N": (MAX_WIDTH, "layer width"),
    "K": (MAX_WIDTH, "layer width"),
    "dim": (MAX_WIDTH, "layer width"),
    "H": (MAX_WIDTH, "layer width"),
    "bs": (MAX_BATCH, "requests per batch"),
    "nh": (MAX_HEADS, "heads per rank"),
    "nkv": (MAX_HEADS, "heads per rank"),
    "E": (MAX_HEADS, "experts"),
    "topk": (MAX_HEADS, "experts per token"),
    "count": (MAX_COUNT, "repeats of one operator entry"),
    "volume_bytes": (MAX_VOLUME_BYTES, "bytes of one message"),
    "tp_size": (MAX_PARALLEL, "parallel degree"),
    "pp_size": (MAX_PARALLEL, "parallel degree"),
    "ep_size": (MAX_PARALLEL, "parallel degree"),
    "tile_M": (MAX_TILE, "GEMM tile edge"),
    "tile_N": (MAX_TILE, "GEMM tile edge"),
    "tile_K": (MAX_TILE, "GEMM tile edge"),
    "cta_count": (MAX_CTAS, "CTAs of one launch, CUDA's grid limit"),
}
#: optional integer columns of a shape table: checked where a row gives them
OPTIONAL_INT_COLUMNS = ("tile_M", "tile_N", "tile_K", "cta_count")


def limit_problem(field: str, value) -> str | None:
    """None if ``value`` is within the limit of ``field`` (fields without a limit always are), else the reason."""
    found = FIELD_LIMITS.get(field)
    if found is None or value <= found[0]:
        return None
    return f"{field} = {value} exceeds the limit {found[0]:,} ({found[1]}; pipeweave.validation)"


def head_dim_problem(family: str, hd: int) -> str | None:
    """None if head size ``hd`` is one the attention kernels and their analytical model support, else the reason."""
    if hd % HEAD_DIM_STEP == 0 and hd <= MAX_HEAD_DIM:
        return None
    return (f"hd = {hd} is not a head size the {family} model supports (a multiple of {HEAD_DIM_STEP} up to "
            f"{MAX_HEAD_DIM})")


def lengths_problem(q_lengths, kv_lengths) -> str | None:
    """None if an attention batch's lengths are within the limits, else the reason."""
    total = sum(q_lengths)
    if total > MAX_TOKENS:
        return f"the query lengths sum to {total}, above the limit {MAX_TOKENS:,} (tokens of one iteration)"
    longest = max(kv_lengths, default=0)
    if longest > MAX_CONTEXT:
        return f"a kv_length of {longest} exceeds the limit {MAX_CONTEXT:,} (context of one request)"
    return None


def batch_problem(prompts, output_tokens: int) -> str | None:
    """None if a static batch (prompt lengths, output tokens) is within the limits, else the reason."""
    if output_tokens > MAX_ITERATIONS:
        return f"output_tokens = {output_tokens} exceeds the limit {MAX_ITERATIONS:,} (one iteration per output token)"
    if len(prompts) > MAX_BATCH:
        return f"{len(prompts)} requests exceed the limit {MAX_BATCH:,} per batch"
    if len(prompts) * output_tokens > MAX_REQUEST_ITERATIONS:
        return (f"{len(prompts)} requests x output_tokens = {output_tokens} is {len(prompts) * output_tokens:,} "
                f"request-iterations, above the limit {MAX_REQUEST_ITERATIONS:,} (the workload lists each request's "
                f"length in every iteration: about 70 bytes each in the JSON, several times that in memory)")
    problem = lengths_problem(prompts, [p + output_tokens - 1 for p in prompts])
    return f"prompt_tokens: {problem}" if problem else None


def fa3_mismatch(attention_type: str, architecture: str) -> bool:
    """True when a FlashAttention-3 kernel is asked of a GPU that cannot run it."""
    return "fa3" in attention_type.lower() and architecture not in FA3_ARCHITECTURES


def fa3_mismatches(attention_types, architecture: str) -> list[str]:
    """The FlashAttention-3 kernels among ``attention_types`` that a GPU of ``architecture`` cannot run, sorted."""
    return sorted({kind for kind in attention_types if fa3_mismatch(kind, architecture)})


#: the attention types of the attention model's measurements (dataset/attn_*.csv; a data test keeps this equal to
#: them). Hopper's FA3 decode kernels were measured and are labelled fa2_paged, the decode type of every workload
#: (docs/DATA.md), so fa3_paged, FA-CK and FA-CUTLASS have no measured kernel: their features are extrapolated
MEASURED_ATTENTION_TYPES = ("fa2_paged", "fa2_ragged", "fa3_ragged")


def unmeasured_attention_warning(workload: str, attention_types) -> str | None:
    """The WARNING line for attention types no GPU's measurements hold (None if every type is measured)."""
    kinds = sorted({kind for kind in attention_types if kind.lower() not in MEASURED_ATTENTION_TYPES})
    if not kinds:
        return None
    return (f"WARNING: {workload} uses {', '.join(kinds)}, which no GPU's attention measurements hold (measured: "
            f"{', '.join(MEASURED_ATTENTION_TYPES)}): the model extrapolates its features; Hopper's FA3 decode kernels "
            f"were measured as fa2_paged, the default decode type (docs/DATA.md)")


def attention_warnings(workload: str, attention_types, hardware) -> list[tuple[str, str]]:
    """(what, WARNING line) for the attention types a workload or shape CSV uses on ``hardware``: FlashAttention-3
    where it cannot run (``"fa3"``), types no GPU's measurements hold (``"unmeasured"``)."""
    lines = (("fa3", fa3_warning(workload, attention_types, hardware)),
             ("unmeasured", unmeasured_attention_warning(workload, attention_types)))
    return [(what, line) for what, line in lines if line]


def fa3_warning(workload: str, attention_types, hardware) -> str | None:
    """The WARNING line for FlashAttention-3 kernels predicted on a GPU that cannot run them (None if none are):
    the number is for a kernel that does not exist on that GPU."""
    kinds = fa3_mismatches(attention_types, hardware.architecture)
    if not kinds:
        return None
    instead = ", ".join(f"{kind.lower().replace('fa3', 'fa2')} instead of {kind}" for kind in kinds)
    return (f"WARNING: {workload} uses {', '.join(kinds)} (FlashAttention-3, Hopper only) but {hardware.stem} is "
            f"{hardware.architecture}: the prediction is for a kernel that cannot run there; for this GPU use "
            f"{instead} (--prefill_attn / --decode_attn of {command('workload_generator.py')} or "
            f"{command('serve_sim.py')})")


def check_durations(op: str, keys: list, *durations) -> None:
    """Every predicted duration is finite and positive; otherwise a UserError naming the GPU and shape (never a
    NaN or 0 ms in the output). ``keys`` are the (GPU stem, shape) of the rows."""
    import numpy as np

    for ms in durations:
        bad = np.flatnonzero(~(np.isfinite(ms) & (ms > 0)))
        if bad.size:
            stem, shape = keys[int(bad[0])]
            raise UserError(f"{op} {shape} on {stem}: the predicted duration is {float(ms[bad[0]])!r} ms, not a "
                            f"finite positive number (check the shape and hardware/{stem}.json)")



def row_label(position: int) -> str:
    """How every CSV-reading tool names a data row: 1-based, with its line in the file (the header is line 1)."""
    return f"row {position + 1} (CSV line {position + 2})"


def line_labels(line_numbers: list[int]):
    """:func:`row_label` for rows read with blank lines skipped: row ``position`` is on CSV line
    ``line_numbers[position]``."""
    return lambda position: f"row {position + 1} (CSV line {line_numbers[position]})"


def check_shape_table(columns: dict, operator, label=row_label) -> None:
    """Shapes read from a CSV, before any feature is computed (``columns``: column name → cell values, text or
    numbers): every integer shape column holds positive integers within its limit (a head size the model
    supports), every ``hardware`` cell names something. Raises ValueError naming the row (``label(position)``)
    and column."""
    for column in operator.int_columns:
        for row, cell in enumerate(columns.get(column, ())):
            value = _as_int(cell)
            if value is None or value <= 0:
                raise ValueError(f"{label(row)}: column {column} must be a positive integer, got "
                                 f"{str(_shown(cell))!r}")
            problem = limit_problem(column, value) or (
                head_dim_problem(operator.key, value) if column == "hd" else None)
            if problem:
                raise ValueError(f"{label(row)}: {problem}")
    for column in (c for c in OPTIONAL_INT_COLUMNS if c in operator.optional_columns):
        for row, cell in enumerate(columns.get(column, ())):
            if cell is None or cell != cell or not str(cell).strip():
                continue  # the tile rule chooses this row's tile
            value = _as_int(cell)
            if value is None or value <= 0:
                raise ValueError(f"{label(row)}: column {column} must be a positive integer or empty, got "
                                 f"{str(_shown(cell))!r}")
            problem = limit_problem(column, value)
            if not problem and column != "cta_count" and value % TILE_STEP:
                problem = f"{column} = {value} is not a multiple of {TILE_STEP} (tensor-core MMAs tile in 8s)"
            if problem:
                raise ValueError(f"{label(row)}: {problem}")
    if "cta_count" in operator.optional_columns:
        _check_cta_counts(columns, label)
    for row, cell in enumerate(columns.get("hardware", ())):
        if cell is None or cell != cell or not str(cell).strip():
            raise ValueError(f"{label(row)}: the hardware cell is empty (give a GPU name such as H100)")
    if "q_lengths" in operator.shape_columns and "kv_lengths" in operator.shape_columns:
        from analytical_model.columns import parse_length_list

        for row, (q, kv) in enumerate(zip(columns.get("q_lengths", ()), columns.get("kv_lengths", ()))):
            try:
                problem = lengths_problem(parse_length_list(q, "q_lengths"), parse_length_list(kv, "kv_lengths"))
            except ValueError as exc:
                problem = str(exc)
            if problem:
                raise ValueError(f"{label(row)}: {problem}")
    from analytical_model.operator_features import check_rows

    check_rows(operator.key, columns, label)  # each row's whole shape, while its position is still known


def _check_cta_counts(columns: dict, label) -> None:
    """A GEMM's given ``cta_count`` is at most its output tiles times its K tiles (split-K over every K tile): more
    CTAs would have no work (a 1024³ GEMM of 64 tiles given 2³¹ − 1 CTAs was predicted at 2·10⁸ µs)."""
    given = [columns.get(c, ()) for c in ("M", "N", "K", "tile_M", "tile_N", "tile_K", "cta_count")]
    for row, cells in enumerate(zip(*given)):
        values = [_as_int(cell) for cell in cells]
        if None in values:
            continue  # an empty tile: the tile rule chooses it
        m, n, k, tile_m, tile_n, tile_k, ctas = values
        most = -(-m // tile_m) * -(-n // tile_n) * -(-k // tile_k)
        if ctas > most:
            raise ValueError(f"{label(row)}: cta_count = {ctas} exceeds the {most:,} CTAs the tiles allow "
                             f"(output tiles x K tiles of M={m}, N={n}, K={k} at {tile_m}x{tile_n}x{tile_k})")


def _as_int(cell) -> int | None:
    """An integer cell (text "4096", 4096 or 4096.0) as int; None for anything else (text, NaN, 7.5, inf)."""
    text = str(cell).strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number == int(number) else None


def _shown(cell):
    """A cell as the user wrote it (numpy scalars as plain numbers)."""
    return cell.item() if hasattr(cell, "item") else cell


def load_model_checked(predictor, op: str, trainer: str = "train_mlp.py"):
    """``predictor.model(op)``; a model file that cannot be read (truncated, empty, not a model, from another
    version) is a UserError naming the folder and the fix. Every exception type is caught on purpose: torch, pickle,
    zip and json each raise their own for a damaged file."""
    try:
        return predictor.model(op)
    except (FileNotFoundError, UserError):
        raise
    except Exception as exc:  # noqa: BLE001 - see the docstring
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise UserError(f"{predictor.model_dir}/{op}: the newest {op} model cannot be loaded ({type(exc).__name__}: "
                        f"{detail}); restore the shipped files or retrain with: python3 {trainer} --op {op}") from None
