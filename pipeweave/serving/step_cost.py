"""Step cost from pipeweave's kernel predictor: the duration of one iteration of a given batch composition.

The iteration's operators are those the workload generator builds (``pipeweave.workload.iteration_operators``,
the code behind every workload JSON), for per-request ``q_lengths`` = new tokens and ``kv_lengths`` = context
lengths, and their durations are the aggregator engine's (:class:`pipeweave.engine.Engine`). Attention of a step
whose requests all decode uses the decode backend, of a step whose requests all prefill the prefill backend (as
the generator's decode and prefill iterations). A mixed step (chunked prefill beside decodes) is, with
``mixed_attention="split"`` (default), one prefill-backend launch over the prefilling requests plus one
decode-backend launch over the decoding ones (how PipeWeave models vLLM's kernels, and how vLLM's FlashInfer
backend runs); with ``"single"``, one prefill-backend launch over the whole batch (vLLM V1's FlashAttention
backend). ``benchmarks/serving.py`` reports how much the two differ and how much slower "single" is (its
compositions never repeat).

``interval_end`` ``"low"`` or ``"high"`` costs every kernel at that end of its measured 80 % interval (the ends the
aggregator's ``interval`` block sums, :meth:`pipeweave.engine.Engine.shape_ms`) instead of its point prediction:
the serving simulator's interval runs (``serve_sim.py --interval``).

``decode_bucket`` (default 0: exact) is the one approximation offered for very long runs: a decode launch is
predicted as if every request had the batch's mean context rounded up to a multiple of ``decode_bucket``, so
launches repeat and the memo hits; ``benchmarks/serving.py`` measures what it costs in TTFT/TPOT.

**Memoised, exactly.** Every operator but attention depends only on the step's token count and number of
sequences: per (tokens, sequences) the memo keeps the products single duration × count of those operators, in
the generator's order, and per attention shape its single duration; a step costs the same left-to-right sum as
Σ count × single over the generator's operator list (bit for bit), which equals the aggregator's iteration total
up to its 10⁻⁶ ms output rounding. Nothing is bucketed. A miss on the token-dependent operators predicts the
whole block of ``token_block`` token counts around it in one engine call; attention shapes are predicted many at
once by :meth:`prefetch`, which the simulator feeds with the steps it foresees (``pipeweave.serving.simulator``),
scheduling them ahead with :meth:`estimate`.

**Extrapolation.** The memo also keeps, per kernel term, whether its prediction is extrapolated (the flag of
``predict_kernels.py --extrapolation``: its GPU's SM design or its inputs outside the model's training data, or the
ensemble's members disagreeing), and counts how often each memo entry served a simulated step (only :meth:`known`
counts: the look-ahead's :meth:`estimate` does not), so :meth:`extrapolation` gives the share of the simulated
kernel time that is extrapolated, as the aggregator's ``extrapolation`` block does for a workload (collectives are
not kernels and count in neither part), at the cost of one counter per step and launch.
"""
from __future__ import annotations

import operator
from collections import defaultdict
from dataclasses import replace
from typing import Iterable, Sequence

import numpy as np

from pipeweave.engine import INTERVAL_ENDS, Engine, Job
from pipeweave.flatten import CATEGORIES, KERNEL_CATEGORIES, FlatWorkload
from pipeweave.report import round6, rounded_share
from pipeweave.schema import CollectiveOp, Iteration, Workload
from pipeweave.workload import DECODE_ATTN_DEFAULT, ModelConfig, RankShapes, iteration_operators, rmsnorm_launches

TOKEN_BLOCK = 256
EMPTY_ITERATION = Iteration("decode")  # which operator categories an iteration lists
ESTIMATOR_ROWS = 8  # predicted launches of a backend from which estimate() fits its linear model
#: the operators sized by the step's number of sequences, not of tokens (the last token of each sequence)
SEQUENCE_SIZED = ("lm_head", "logits_all_gather")


def default_prefill_attention(hardware) -> str:
    """FA3 on Hopper, FA2 elsewhere: the backends of the paper's workloads (tp*.sh, vllm_tp4_pp2.sh)."""
    return "fa3_ragged" if hardware.architecture == "hopper" else "fa2_ragged"


MIXED_ATTENTION = ("split", "single")


class TokenTerms:
    """The memo of one (tokens, sequences): the sum of the terms before attention, the terms after it, the sum of all
    terms, (category, term, extrapolated) of each kernel term, and the simulated steps it served."""

    __slots__ = ("before", "after", "every", "kernels", "uses")

    def __init__(self, before: float, after: tuple[float, ...], every: float, kernels: tuple):
        self.before, self.after, self.every, self.kernels, self.uses = before, after, every, kernels, 0


class Launch:
    """The memo of one attention launch: its single duration, whether it is extrapolated, the steps it served."""

    __slots__ = ("ms", "extrapolated", "uses")

    def __init__(self, ms: float, extrapolated: bool):
        self.ms, self.extrapolated, self.uses = ms, extrapolated, 0


def _work(shape: tuple) -> int:
    """Σ q·kv of an attention shape (:meth:`KernelStepCost.estimate`)."""
    return sum(map(operator.mul, shape[2], shape[3]))


class KernelStepCost:
    """``cost(new_tokens, context_lens) -> ms`` for one model on one GPU with TP × PP (all stages summed)."""

    def __init__(self, engine: Engine, cfg: ModelConfig, hardware: str, tp: int = 1, pp: int = 1,
                 collective_hardware: str | None = None, prefill_attn: str | None = None,
                 decode_attn: str = DECODE_ATTN_DEFAULT, qk_norm_rmsnorm: bool = False,
                 mixed_attention: str = "split", decode_bucket: int = 0, dtype: str = "bf16", ep: int = 1,
                 interval_end: str = "point"):
        if mixed_attention not in MIXED_ATTENTION:
            raise ValueError(f"mixed_attention must be one of {', '.join(MIXED_ATTENTION)}, got {mixed_attention!r}")
        if interval_end not in INTERVAL_ENDS:
            raise ValueError(f"interval_end must be one of {', '.join(INTERVAL_ENDS)}, got {interval_end!r}")
        self.interval_end = interval_end
        #: whether a collective entered an interval run at its point value (the aggregator's ``interval.note``)
        self.collectives_at_point = False
        self.engine = engine
        self.cfg = cfg
        self.hardware = engine.gpu(hardware)
        self.tp, self.pp = tp, pp
        self.shard = RankShapes.of(cfg, tp)
        self.collective_hardware = collective_hardware
        self.prefill_attn = prefill_attn or default_prefill_attention(self.hardware)
        self.decode_attn = decode_attn
        self.split = mixed_attention == "split"
        self.decode_bucket = decode_bucket
        self.dtype = dtype  # of the linear layers: "fp8" costs them as the generator's FP8 GEMMs + quantisation
        self.ep = ep  # expert groups of an MoE model's TP ranks, as the generator's --ep
        self.rmsnorm_count = rmsnorm_launches(cfg, qk_norm_rmsnorm)  # the generator's (docs/METHOD.md §6.3)
        self.heads = (self.shard.nh, self.shard.nkv, cfg.head_dim)
        self.single_ms: dict[tuple, float] = {}  # non-attention operator key -> single duration
        self.single_extrapolated: dict[tuple, bool] = {}  # non-attention kernel key -> extrapolated
        self.token_terms: dict[tuple[int, int], TokenTerms] = {}  # (tokens, sequences) -> its terms
        self.attention_memo: dict[tuple, Launch] = {}  # attention shape -> its launch
        self._estimator: dict[str, tuple[float, float, float]] = {}  # per backend: ms ≈ a + b·batch + c·Σ q·kv
        self.engine_calls = 0

    # ---------------------------------------------------------------------------------------------
    def _generated(self, new_tokens: Sequence[int], context_lens: Sequence[int], attention: str) -> dict:
        return iteration_operators(self.cfg, self.shard, self.tp, self.pp, list(new_tokens), list(context_lens),
                                    sum(new_tokens), attention, self.rmsnorm_count, ep=self.ep, dtype=self.dtype)

    def _shape(self, attention: str, q: tuple, kv: tuple) -> tuple:
        """The engine's attention shape key (``AttentionOp.shape``)."""
        return (attention, len(q), q, kv, *self.heads)

    def attention_shapes(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> tuple[tuple, ...]:
        """The step's attention launches in the order their durations are summed (one, or two for a split step)."""
        if max(new_tokens) == 1:
            return (self._shape(self.decode_attn, (1,) * len(new_tokens), self._decode_context(context_lens)),)
        if not self.split or min(new_tokens) > 1:
            return (self._shape(self.prefill_attn, tuple(new_tokens), tuple(context_lens)),)
        prefill = [(n, c) for n, c in zip(new_tokens, context_lens) if n > 1]
        decode = [c for n, c in zip(new_tokens, context_lens) if n == 1]
        return (self._shape(self.prefill_attn, *map(tuple, zip(*prefill))),
                self._shape(self.decode_attn, (1,) * len(decode), self._decode_context(decode)))

    def _decode_context(self, context_lens: Sequence[int]) -> tuple:
        """Context lengths of a decode launch: exact, or with ``decode_bucket`` every request at the batch's mean
        rounded up to a multiple of it (so that launches repeat; error measured by ``benchmarks/serving.py``), but
        never beyond the longest context of the launch: a bucket larger than the contexts would charge every
        request KV it does not have (4 short requests at a 10^9-token bucket took hours)."""
        if not self.decode_bucket:
            return tuple(context_lens)
        bucket = self.decode_bucket
        rounded = -(-sum(context_lens) // (len(context_lens) * bucket)) * bucket
        return (min(rounded, max(context_lens)),) * len(context_lens)

    @staticmethod
    def _instances(operators: dict) -> Iterable[tuple[tuple, int, str, object]]:
        """(shape key, count, category, operator) of every operator of a generator operator dict."""
        for category, value in operators.items():
            for op in value if isinstance(value, list) else (value,):
                if op is None:
                    continue
                shape = (op.kind, op.volume_bytes) if isinstance(op, CollectiveOp) else op.shape
                yield (category, shape), op.count, category, op

    # ---------------------------------------------------------------------------------------------
    def __call__(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        ms = self.known(new_tokens, context_lens)
        if ms is None:
            self.prefetch([(new_tokens, context_lens)])
            ms = self.known(new_tokens, context_lens)
        return ms

    def known(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float | None:
        """The step's duration if its attention shapes are memoised (None otherwise); a step it returns counts as
        simulated (:meth:`extrapolation`)."""
        launches = [self.attention_memo.get(shape) for shape in self.attention_shapes(new_tokens, context_lens)]
        if None in launches:
            return None
        terms = self._token_terms(sum(new_tokens), len(new_tokens))
        terms.uses += 1
        for launch in launches:
            launch.uses += 1
        return self._sum(terms, [launch.ms for launch in launches])

    def estimate(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        """The step's duration, an unknown attention launch estimated from its batch size and Σ q·kv by a linear fit
        to the last predicted launches of its backend (for scheduling steps ahead before they are predicted:
        :meth:`prefetch`; a poor estimate only makes that look-ahead foresee fewer steps)."""
        attention = []
        for shape in self.attention_shapes(new_tokens, context_lens):
            launch = self.attention_memo.get(shape)
            if launch is None:
                a, b, c = self._estimator.get(shape[0], (0.0, 0.0, 0.0))
                attention.append(a + b * shape[1] + c * _work(shape))
            else:
                attention.append(launch.ms)
        return self._sum(self._token_terms(sum(new_tokens), len(new_tokens)), attention)

    def _sum(self, terms: TokenTerms, attention: list[float]) -> float:
        """Σ count × single over the generator's operator order: the terms before attention, attention, the rest;
        a split step's two launches come after every other operator (as they did when listed as instances)."""
        layers = self.cfg.num_hidden_layers
        if len(attention) == 1:
            total = terms.before + attention[0] * layers
            for term in terms.after:
                total += term
            return total
        return terms.every + attention[0] * layers + attention[1] * layers

    def _token_terms(self, tokens: int, seqs: int) -> TokenTerms:
        found = self.token_terms.get((tokens, seqs))
        if found is None:
            new = [1] * (seqs - 1) + [tokens - seqs + 1]
            instances = list(self._instances(self._generated(new, new, self.prefill_attn)))
            self._ensure([i for i in instances if i[2] != "attention"], seqs, tokens)
            terms = [self.single_ms[key] * count if category != "attention" else None
                     for key, count, category, _ in instances]
            cut = terms.index(None)
            after = tuple(terms[cut + 1:])
            kernels = tuple((category, term, self.single_extrapolated[key])
                            for (key, _, category, _), term in zip(instances, terms)
                            if category in KERNEL_CATEGORIES and category != "attention")
            found = self.token_terms[(tokens, seqs)] = TokenTerms(sum(terms[:cut]), after,
                                                                  sum(terms[:cut] + list(after)), kernels)
        return found

    def extrapolation(self) -> dict:
        """The share (0–1) of the kernel time of the steps simulated so far that is extrapolated, overall and per
        operator category (``share``, ``by_operator``: the aggregator's ``extrapolation`` block without phases, which
        a step mixing prefill chunks and decodes does not have)."""
        time: dict[str, float] = defaultdict(float)
        flagged: dict[str, float] = defaultdict(float)
        for terms in self.token_terms.values():
            if terms.uses:
                for category, term, extrapolated in terms.kernels:
                    time[category] += term * terms.uses
                    flagged[category] += term * terms.uses * extrapolated
        layers = self.cfg.num_hidden_layers
        for launch in self.attention_memo.values():
            time["attention"] += launch.ms * layers * launch.uses
            flagged["attention"] += launch.ms * layers * launch.uses * launch.extrapolated
        order = [category for category in CATEGORIES if time.get(category, 0.0) > 0]
        return {"share": rounded_share(sum(flagged[c] for c in order), sum(time[c] for c in order)),
                "by_operator": {category: rounded_share(flagged[category], time[category]) for category in order}}

    def prefetch(self, steps: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
        """Predict the unknown attention shapes of the ``(new_tokens, context_lens)`` steps in one engine call."""
        todo = {shape: None for new, context in steps for shape in self.attention_shapes(new, context)
                if shape not in self.attention_memo}
        if not todo:
            return
        shapes = list(todo)
        ms, extrapolated = self.engine.shape_ms("attn", shapes, self.hardware, f"{self.cfg.stem} serving",
                                                self.interval_end)
        ms = round6(ms)
        self.engine_calls += 1
        for shape, value, flag in zip(shapes, ms, extrapolated):
            self.attention_memo[shape] = Launch(value, bool(flag))
        for backend in dict.fromkeys(shape[0] for shape in shapes):
            rows = np.array([(1.0, shape[1], _work(shape), value) for shape, value in zip(shapes, ms)
                             if shape[0] == backend])
            if len(rows) >= ESTIMATOR_ROWS:
                self._estimator[backend] = tuple(np.linalg.lstsq(rows[:, :3], rows[:, 3], rcond=None)[0])
            else:  # too few to fit: proportional to the last one
                self._estimator[backend] = (0.0, 0.0, rows[-1, 3] / rows[-1, 2])

    # ---------------------------------------------------------------------------------------------
    def _ensure(self, instances, num_seqs: int, num_tokens: int) -> None:
        """Predict whatever ``instances`` lack, with the whole token block of ``num_tokens``; if all that is missing
        is sized by the number of sequences, not of tokens (``lm_head`` and the gather of its logits), with the block
        of sequence counts of ``num_seqs`` instead (busy servers see many sequence counts per token count)."""
        missing = [i for i in instances if i[0] not in self.single_ms]
        if not missing:
            return
        if all(getattr(op, "name", None) in SEQUENCE_SIZED for *_, op in missing):
            start = (num_seqs - 1) // TOKEN_BLOCK * TOKEN_BLOCK + 1
            block = [instance for seqs in range(start, start + TOKEN_BLOCK)
                     for instance in self._instances(self._generated([1] * seqs, [1] * seqs, self.decode_attn))
                     if getattr(instance[3], "name", None) in SEQUENCE_SIZED]
            self._predict(missing + block)
        else:
            self._predict(missing + self._token_block(num_seqs, num_tokens))

    def _token_block(self, num_seqs: int, num_tokens: int) -> list:
        """Token-dependent operators for every token count of ``num_tokens``'s block (attention excluded)."""
        start = (num_tokens - 1) // TOKEN_BLOCK * TOKEN_BLOCK + 1
        instances = []
        for tokens in range(max(start, num_seqs), start + TOKEN_BLOCK):
            new = [1] * (num_seqs - 1) + [tokens - num_seqs + 1]
            operators = self._generated(new, new, self.prefill_attn)
            del operators["attention"]
            instances.extend(self._instances(operators))
        return instances

    def _predict(self, instances) -> None:
        """Predict the unknown shapes among ``instances`` in one engine call, one synthetic iteration each."""
        todo: dict[tuple, tuple[str, object]] = {}
        for key, _, category, op in instances:
            if key not in self.single_ms and key not in todo:
                todo[key] = (category, op)
        iterations = []
        for category, op in todo.values():
            single = replace(op, count=1)
            listed = isinstance(getattr(EMPTY_ITERATION, category), list)  # gemm, moe, communication...
            iterations.append(Iteration("decode", **{category: [single] if listed else single}))
        workload = FlatWorkload.of(Workload(iterations, model=self.cfg.model, tp_size=self.tp, pp_size=self.pp,
                                            ep_size=self.ep, dtype=self.dtype))
        prediction = self.engine.predict([Job(workload, self.hardware, self.collective_hardware)])[0]
        self.engine_calls += 1
        # one instance per iteration: the flattened instances are the iterations, in order
        if self.interval_end == "point":
            ms = [iteration["total_duration_ms"] for iteration in prediction.result["iterations"]]
        else:
            ms = round6(prediction.interval[self.interval_end == "high"])
            self.collectives_at_point |= "note" in prediction.result["interval"]
        for key, value, extrapolated in zip(todo, ms, prediction.extrapolated):
            self.single_ms[key] = value
            self.single_extrapolated[key] = bool(extrapolated)
