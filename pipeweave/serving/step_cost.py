"""Step cost from pipeweave's kernel predictor: the duration of one iteration of a given batch composition.

The iteration's operators are built by the workload generator (``pipeweave.workload.iteration_operators``, the
code behind every workload JSON, as typed :mod:`pipeweave.schema` entities), for per-request ``q_lengths`` = new
tokens and ``kv_lengths`` = context lengths. Durations come from :class:`pipeweave.engine.Engine`
(``predict_workload`` on an in-memory workload). Attention of a step whose requests all decode uses the decode
backend, of a step whose requests all prefill the prefill backend (as the generator's decode and prefill
iterations). A mixed step (chunked prefill beside decodes) is, with ``mixed_attention="split"`` (default), one
prefill-backend launch over the prefilling requests plus one decode-backend launch over the decoding ones (how
PipeWeave models vLLM's kernels, and how vLLM's FlashInfer backend runs); with ``"single"``, one prefill-backend
launch over the whole batch (vLLM V1's FlashAttention backend). ``benchmarks/serving.py`` reports how much the two
differ and how much slower "single" is (its compositions never repeat).

``decode_bucket`` (default 0: exact) is the one approximation offered for very long runs: a decode launch is
predicted as if every request had the batch's mean context rounded up to a multiple of ``decode_bucket``, so
launches repeat and the memo hits; ``benchmarks/serving.py`` measures what it costs in TTFT/TPOT.

**Memoised, exactly.** Each operator instance is keyed by its full shape; a step costs Σ count × single duration
of its operators, and only shapes never seen are predicted, batched into one engine call. Nothing is bucketed:
the sum equals the aggregator's iteration total up to its 10⁻⁶ ms output rounding. Two batching devices keep the
engine calls few: a miss on a token-count-dependent operator (GEMMs, RMSNorm, SiLU*Mul, collectives depend only
on the number of tokens and, for ``lm_head``, of sequences) predicts the whole block of ``token_block`` token
counts around it; and :meth:`KernelStepCost.lookahead` predicts the attention of the next decode steps of an
unchanged batch (context + 1 per step) together with the current step's unknown shapes, in one call.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from pipeweave.engine import Engine
from pipeweave.schema import Category, CollectiveOp, Iteration, Workload
from pipeweave.workload import DECODE_ATTN_DEFAULT, ModelConfig, RankShapes, iteration_operators

TOKEN_BLOCK = 256
LOOKAHEAD_MAX = 64


def default_prefill_attention(hardware) -> str:
    """FA3 on Hopper, FA2 elsewhere: the backends of the paper's workloads (tp*.sh, vllm_tp4_pp2.sh)."""
    return "fa3_ragged" if hardware.architecture == "hopper" else "fa2_ragged"


MIXED_ATTENTION = ("split", "single")


class KernelStepCost:
    """``cost(new_tokens, context_lens) -> ms`` for one model on one GPU with TP × PP (all stages summed)."""

    def __init__(self, engine: Engine, cfg: ModelConfig, hardware: str, tp: int = 1, pp: int = 1,
                 collective_hardware: str | None = None, prefill_attn: str | None = None,
                 decode_attn: str = DECODE_ATTN_DEFAULT, qk_norm_rmsnorm: bool = False,
                 mixed_attention: str = "split", decode_bucket: int = 0, token_block: int = TOKEN_BLOCK):
        if mixed_attention not in MIXED_ATTENTION:
            raise ValueError(f"mixed_attention must be one of {', '.join(MIXED_ATTENTION)}, got {mixed_attention!r}")
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
        # the generator's RMSNorm count (docs/METHOD.md §6.3; 4L + 1 with the Qwen3 QK-norm approximation)
        self.rmsnorm_count = (4 if qk_norm_rmsnorm else 2) * cfg.num_hidden_layers + 1
        self.token_block = token_block
        self.single_ms: dict[tuple, float] = {}
        self.engine_calls = 0
        self._last: tuple | None = None  # (new, context, instances) of the step lookahead() just saw

    # ---------------------------------------------------------------------------------------------
    def _generated(self, new_tokens: Sequence[int], context_lens: Sequence[int], attention: str) -> dict:
        return iteration_operators(self.cfg, self.shard, self.tp, self.pp, list(new_tokens), list(context_lens),
                                    sum(new_tokens), attention, self.rmsnorm_count)

    def instances(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> list[tuple[tuple, int, str, object]]:
        """(shape key, count, category, operator) of every operator instance of the iteration."""
        prefill = [i for i, n in enumerate(new_tokens) if n > 1]
        if not prefill:
            return list(self._instances(self._generated(new_tokens, self._decode_context(context_lens),
                                                        self.decode_attn)))
        operators = self._generated(new_tokens, context_lens, self.prefill_attn)
        if not self.split or len(prefill) == len(new_tokens):
            return list(self._instances(operators))
        decode = [i for i, n in enumerate(new_tokens) if n == 1]
        del operators["attention"]
        parts = [self._generated([new_tokens[i] for i in prefill], [context_lens[i] for i in prefill],
                                 self.prefill_attn)["attention"],
                 self._generated([1] * len(decode), self._decode_context([context_lens[i] for i in decode]),
                                 self.decode_attn)["attention"]]
        return list(self._instances(operators)) + [i for op in parts for i in self._instances({"attention": op})]

    def _decode_context(self, context_lens: Sequence[int]) -> list[int]:
        """Context lengths of a decode launch: exact, or with ``decode_bucket`` every request at the batch's mean
        rounded up to a multiple of it (so that launches repeat; error measured by ``benchmarks/serving.py``)."""
        if not self.decode_bucket:
            return list(context_lens)
        bucket = self.decode_bucket
        return [-(-sum(context_lens) // (len(context_lens) * bucket)) * bucket] * len(context_lens)

    @staticmethod
    def _instances(operators: dict) -> Iterable[tuple[tuple, int, str, object]]:
        """(shape key, count, category, operator) of every operator of a generator operator dict."""
        for category, value in operators.items():
            for op in value if isinstance(value, list) else (value,):
                shape = (op.kind, op.volume_bytes) if isinstance(op, CollectiveOp) else op.shape
                yield (category, shape), op.count, category, op

    def __call__(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        last = self._last
        if last is not None and last[0] == new_tokens and last[1] == context_lens:
            instances = last[2]
        else:
            instances = self.instances(new_tokens, context_lens)
        self._ensure(instances, len(new_tokens), sum(new_tokens))
        return sum(self.single_ms[key] * count for key, count, *_ in instances)

    def lookahead(self, entries, horizon: int | None) -> None:
        """Simulator hook, called before a step is costed: if the step has unknown shapes, predict them together
        with the attention of the next ``horizon`` steps in which the requests that go on decoding do so unchanged
        (context + 1 per step)."""
        new = [e[1] for e in entries]
        context = [e[2] for e in entries]
        instances = self.instances(new, context)
        self._last = (new, context, instances)
        if all(key in self.single_ms for key, *_ in instances):
            return
        # requests that decode next: this step yields a token and it is not their last
        going_on = [e for e in entries if e[4] and e[0].num_output + 1 < e[0].output_tokens]
        steps = min([horizon or LOOKAHEAD_MAX, LOOKAHEAD_MAX]
                    + [e[0].output_tokens - e[0].num_output for e in going_on]) if going_on else 0
        going_on = [e[2] for e in going_on]
        ones = [1] * len(going_on)
        ahead = []
        for j in range(1, steps):
            attention = self._generated(ones, self._decode_context([c + j for c in going_on]),
                                        self.decode_attn)["attention"]
            ahead.extend(self._instances({"attention": attention}))
        self._ensure(instances + ahead, len(new), sum(new))

    # ---------------------------------------------------------------------------------------------
    def _ensure(self, instances, num_seqs: int, num_tokens: int) -> None:
        """Predict whatever ``instances`` lack; a token-dependent miss brings its whole token block along."""
        missing = [i for i in instances if i[0] not in self.single_ms]
        if not missing:
            return
        if any(category != "attention" for _, _, category, _ in missing):
            missing += self._token_block(num_seqs, num_tokens)
        self._predict(missing)

    def _token_block(self, num_seqs: int, num_tokens: int) -> list:
        """Token-dependent operators for every token count of ``num_tokens``'s block (attention excluded)."""
        start = (num_tokens - 1) // self.token_block * self.token_block + 1
        instances = []
        for tokens in range(max(start, num_seqs), start + self.token_block):
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
        if not todo:
            return
        iterations = []
        for category, op in todo.values():
            single = replace(op, count=1)
            listed = category in (Category.GEMM.value, Category.COMMUNICATION.value)
            iterations.append(Iteration("decode", **{category: [single] if listed else single}))
        workload = Workload(iterations, model=self.cfg.model, tp_size=self.tp, pp_size=self.pp)
        result = self.engine.predict_workload(workload, self.hardware, self.collective_hardware)
        self.engine_calls += 1
        for key, iteration in zip(todo, result["iterations"]):
            self.single_ms[key] = iteration["total_duration_ms"]
