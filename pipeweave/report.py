"""The prediction report: the docs/METHOD.md §7.5 output object of one (workload, GPU) pair and its summary.

Iteration duration = Σ single × count (unrounded); the summary holds the prefill time (Σ of the prefill
iterations: several are summed, quirk §11.3.22 fixed), the mean and total of the decode iterations and the total.
Values are rounded to 6 decimals only when written.
"""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np

#: share of the predicted kernel time that is extrapolated above which the aggregator prints a note
EXTRAPOLATED_NOTE_SHARE = 0.5
SUMMARY_KEYS = ("prefill_duration_ms", "decode_avg_duration_ms", "decode_total_duration_ms", "total_duration_ms")

def round6(values: np.ndarray) -> list[float]:
    """Round to 6 decimals, vectorised: rint(x·10⁶) / 10⁶ is the double nearest to the 6-decimal value
    (prints cleanly); it can differ from Python's round() only for values within an ulp of a tie."""
    return (np.rint(np.asarray(values, dtype=np.float64) * 1e6) / 1e6).tolist()


def build_result(job, single: np.ndarray, optimistic: np.ndarray | None = None,
                 extrapolated: np.ndarray | None = None, interval: tuple[np.ndarray, np.ndarray] | None = None
                 ) -> dict:
    """The §7.5 output object of a :class:`pipeweave.engine.Job` from per-instance single durations (ms,
    unrounded; ``optimistic``: the quantile models' durations, added as ``summary.optimistic_*``; ``extrapolated``:
    per instance, whether its kernel prediction is extrapolated, summarised in the ``extrapolation`` block;
    ``interval``: per instance the low and high durations of :mod:`pipeweave.intervals`, summed into the
    ``interval`` block)."""
    workload = job.workload
    n_iter = len(workload.numbers)
    weighted = single * workload.inst_count
    # bincount accumulates in input order: the same sequence of additions as Σ over an iteration's operators
    iter_total = np.bincount(workload.inst_iter, weights=weighted, minlength=n_iter).tolist()
    singles = round6(single)
    totals = round6(weighted)
    iter_rounded = round6(iter_total)
    counts = workload.counts_int
    iterations = []
    for position in range(n_iter):
        durations: dict = {"gemm": {}}
        for category, name, i in workload.layout[position]:
            entry = {"single_duration_ms": singles[i], "count": counts[i], "total_duration_ms": totals[i]}
            if name is None:
                durations[category] = entry
            else:  # named entries: GEMMs, MoE passes, quantisation, collectives
                durations.setdefault(category, {})[name] = entry
        iterations.append({  # layout entries are in CATEGORIES order, so the keys are too
            "iteration": workload.numbers[position],
            "phase": workload.phases[position],
            "operator_durations": durations,
            "total_duration_ms": iter_rounded[position],
        })
    summary = summarize(workload.phases, iter_total)
    if optimistic is not None:
        best_total = np.bincount(workload.inst_iter, weights=optimistic * workload.inst_count, minlength=n_iter)
        for key, value in summarize(workload.phases, best_total.tolist()).items():
            summary[f"optimistic_{key}"] = value
    result = {
        "model": workload.model,
        "hardware": job.hardware.name,
        "tp_size": workload.tp_size,
        "pp_size": workload.pp_size,
        "iterations": iterations,
        "summary": summary,
    }
    if extrapolated is not None:
        result["extrapolation"] = extrapolation_shares(workload, weighted, extrapolated)
    if interval is not None:
        result["interval"] = interval_block(workload, *interval)
    return result


def interval_block(workload, low: np.ndarray, high: np.ndarray, point_collectives: bool | None = None) -> dict:
    """The summary of the per-instance interval ends (kernel intervals summed as perfectly correlated errors;
    :mod:`pipeweave.intervals`). ``point_collectives``: whether some collective entered at its point value
    (default: any collective)."""
    from pipeweave.intervals import COMMUNICATION_NOTE, LEVELS

    n_iter = len(workload.numbers)
    block = {"levels": list(LEVELS)}
    for name, ends in (("low", low), ("high", high)):
        totals = np.bincount(workload.inst_iter, weights=ends * workload.inst_count, minlength=n_iter)
        block[name] = summarize(workload.phases, totals.tolist())
    if workload.has_communication if point_collectives is None else point_collectives:
        block["note"] = COMMUNICATION_NOTE
    return block


def extrapolation_shares(workload, weighted: np.ndarray, extrapolated: np.ndarray) -> dict:
    """Share (0–1) of the predicted kernel time that is extrapolated: overall, per operator category and per phase
    (collectives are not kernels and count in neither part of a share)."""
    from pipeweave.flatten import CATEGORIES, COMMUNICATION_CODE

    kernel = workload.inst_code != COMMUNICATION_CODE
    codes = workload.inst_code[kernel]
    time = weighted[kernel]
    flagged_time = time * extrapolated[kernel]
    by_category = np.bincount(codes, weights=time, minlength=len(CATEGORIES))
    flagged = np.bincount(codes, weights=flagged_time, minlength=len(CATEGORIES))
    prefill = np.array([phase == "prefill" for phase in workload.phases], dtype=bool)[workload.inst_iter[kernel]]
    phase_time = {"prefill": time[prefill].sum(), "decode": time[~prefill].sum()}
    phase_flag = {"prefill": flagged_time[prefill].sum(), "decode": flagged_time[~prefill].sum()}

    return {
        "share": rounded_share(flagged.sum(), by_category.sum()),
        "by_operator": {CATEGORIES[c]: rounded_share(flagged[c], by_category[c])
                        for c in np.flatnonzero(by_category > 0)},
        "by_phase": {phase: rounded_share(phase_flag[phase], phase_time[phase]) for phase in phase_time
                     if phase_time[phase] > 0},
    }


def extrapolated_note(extrapolation: dict, what: str = "predicted kernel time") -> str | None:
    """The console's note when more than :data:`EXTRAPOLATED_NOTE_SHARE` of ``what`` is extrapolated (an
    ``extrapolation`` block: ``share``, ``by_operator``), else None."""
    if extrapolation.get("share", 0.0) <= EXTRAPOLATED_NOTE_SHARE:
        return None
    operators = ", ".join(op for op, part in extrapolation["by_operator"].items() if part > 0)
    return (f"Note: {extrapolation['share'] * 100:.0f} % of the {what} is extrapolated ({operators}: GPU "
            f"architecture or shapes outside the models' training data, or ensemble members that disagree); treat it "
            f"as a rough estimate")


def rounded_share(part: float, whole: float) -> float:
    """``part / whole`` rounded to 6 decimals (0 for an empty whole): an ``extrapolation`` share."""
    return round(float(part / whole), 6) if whole > 0 else 0.0


def summarize(phases: Sequence[str], totals: Sequence[float]) -> dict:
    """Prefill = Σ of the prefill iterations (quirk §11.3.22 fixed), decode = all other iterations."""
    prefill = 0.0
    decode = []
    for phase, total in zip(phases, totals):
        if phase == "prefill":
            prefill += total
        else:
            decode.append(total)
    decode_total = sum(decode, 0.0)  # a float even without decode iterations, as the other fields
    return {
        "prefill_duration_ms": round(prefill, 6),
        "decode_avg_duration_ms": round(decode_total / len(decode), 6) if decode else 0.0,
        "decode_total_duration_ms": round(decode_total, 6),
        "total_duration_ms": round(sum(totals), 6),
    }


def dumps_result(result: dict) -> str:
    return json.dumps(result, indent=2, allow_nan=False) + "\n"  # NaN/Infinity are not JSON


def output_name(workload_stem: str, hardware) -> str:
    """``<workload stem>_<GPU stem, spaces as _>.json``."""
    return f"{workload_stem}_{hardware.stem.replace(' ', '_')}.json"


def describe(workload) -> str:
    """What a prediction is of, for the printed summary: model, requests, prompt and output tokens, TP/PP."""
    parts = [workload.model]
    prefill = next((p for p, phase in enumerate(workload.phases) if phase == "prefill"), None)
    attention = [i for category, _, i in workload.layout[prefill] if category == "attention"] if prefill is not None \
        else []
    if attention:
        shape = workload.shapes["attn"][int(workload.inst_local[attention[0]])]
        prompts = shape[2]
        low, high = min(prompts), max(prompts)
        parts.append(f"{len(prompts)} request{'s' if len(prompts) != 1 else ''} of "
                     f"{low if low == high else f'{low}-{high}'} prompt tokens")
        parts.append(f"{1 + workload.phases.count('decode')} output tokens")
    else:
        parts.append(f"{len(workload.phases)} iterations")
    parts.append(f"TP{workload.tp_size} PP{workload.pp_size}")
    return ", ".join(parts)
