"""Step cost from pipeweave's kernel predictor: the duration of one iteration of a given batch composition.

The iteration's operators are built by the workload generator (``pipeweave.workload._operators``, the code that
writes every workload JSON), for per-request ``q_lengths`` = new tokens and ``kv_lengths`` = context lengths,
with the prefill attention backend when any request computes more than one token and the decode backend
otherwise (as the generator's prefill and decode iterations). Durations come from the aggregator's engine.

**Memoised, exactly.** Each operator instance is keyed by its full shape; a step costs Σ count × single duration
of its operators, and only shapes never seen are predicted, batched into one engine call. Nothing is bucketed:
the sum equals the aggregator's iteration total up to its 10⁻⁶ ms output rounding. Two batching devices keep the
engine calls few: a miss on a token-count-dependent operator (GEMMs, RMSNorm, SiLU*Mul, collectives depend only
on the number of tokens and, for ``lm_head``, of sequences) predicts the whole block of ``token_block`` token
counts around it; and :meth:`KernelStepCost.lookahead` predicts the attention of the next decode steps of an
unchanged batch (context + 1 per step) in one call.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from pipeweave.aggregate import Aggregator, Job, parse_workload
from pipeweave.workload import DECODE_ATTN_DEFAULT, ModelConfig, RankShapes, _operators

TOKEN_BLOCK = 256
LOOKAHEAD_MAX = 64


def default_prefill_attention(hardware) -> str:
    """FA3 on Hopper, FA2 elsewhere: the backends of the paper's workloads (tp*.sh, vllm_tp4_pp2.sh)."""
    return "fa3_ragged" if hardware.architecture == "hopper" else "fa2_ragged"


class KernelStepCost:
    """``cost(new_tokens, context_lens) -> ms`` for one model on one GPU with TP × PP (all stages summed)."""

    def __init__(self, aggregator: Aggregator, cfg: ModelConfig, hardware: str, tp: int = 1, pp: int = 1,
                 collective_hardware: str | None = None, prefill_attn: str | None = None,
                 decode_attn: str = DECODE_ATTN_DEFAULT, qk_norm_rmsnorm: bool = False,
                 token_block: int = TOKEN_BLOCK):
        self.aggregator = aggregator
        self.cfg = cfg
        self.hardware = aggregator.gpu(hardware)
        self.tp, self.pp = tp, pp
        self.shard = RankShapes.of(cfg, tp)
        self.collective_hardware = collective_hardware
        self.prefill_attn = prefill_attn or default_prefill_attention(self.hardware)
        self.decode_attn = decode_attn
        # the generator's RMSNorm count (METHOD.md §6.3; 4L + 1 with the Qwen3 QK-norm approximation)
        self.rmsnorm_count = (4 if qk_norm_rmsnorm else 2) * cfg.num_hidden_layers + 1
        self.token_block = token_block
        self.single_ms: dict[tuple, float] = {}
        self.engine_calls = 0

    # ---------------------------------------------------------------------------------------------
    def operators(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> dict:
        """The generator's operator lists of the iteration."""
        attention = self.prefill_attn if max(new_tokens) > 1 else self.decode_attn
        return _operators(self.cfg, self.shard, self.tp, self.pp, list(new_tokens), list(context_lens),
                          sum(new_tokens), attention, self.rmsnorm_count)

    @staticmethod
    def _instances(operators: dict) -> Iterable[tuple[tuple, int, str, dict]]:
        """(shape key, count, category, operator) of every operator instance."""
        for category, value in operators.items():
            for op in value if isinstance(value, list) else (value,):
                key = (category,) + tuple(tuple(v) if isinstance(v, list) else v
                                          for k, v in op.items() if k != "count")
                yield key, op["count"], category, op

    def __call__(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        instances = list(self._instances(self.operators(new_tokens, context_lens)))
        if any(key not in self.single_ms for key, *_ in instances):
            if any(key not in self.single_ms for key, _, category, _ in instances if category != "attention"):
                self._predict_token_block(len(new_tokens), sum(new_tokens))
            self._predict(instances)
        return sum(self.single_ms[key] * count for key, count, *_ in instances)

    def lookahead(self, entries, horizon: int) -> None:
        """Predict the attention of the next ``horizon`` decode steps of an unchanged batch (simulator hook)."""
        context = [e[2] for e in entries]
        ones = [1] * len(context)
        attention = [self.operators(ones, context)["attention"]]
        if next(self._instances({"attention": attention[0]}))[0] in self.single_ms:
            return  # predicted by an earlier lookahead
        for j in range(1, min(horizon, LOOKAHEAD_MAX)):
            attention.append(self.operators(ones, [c + j for c in context])["attention"])
        self._predict([i for op in attention for i in self._instances({"attention": op})])

    # ---------------------------------------------------------------------------------------------
    def _predict_token_block(self, num_seqs: int, num_tokens: int) -> None:
        """Token-dependent operators for every token count of ``num_tokens``'s block (attention excluded)."""
        start = (num_tokens - 1) // self.token_block * self.token_block + 1
        instances = []
        for tokens in range(max(start, num_seqs), start + self.token_block):
            new = [1] * (num_seqs - 1) + [tokens - num_seqs + 1]
            ops = self.operators(new, new)
            ops.pop("attention")
            instances.extend(self._instances(ops))
        self._predict(instances)

    def _predict(self, instances) -> None:
        """Predict the unknown shapes among ``instances`` in one engine call, one synthetic iteration each."""
        todo: dict[tuple, tuple[str, dict]] = {}
        for key, _, category, op in instances:
            if key not in self.single_ms and key not in todo:
                todo[key] = (category, op)
        if not todo:
            return
        iterations = []
        for category, op in todo.values():
            single = dict(op, count=1)
            iterations.append({"phase": "decode",
                               "operators": {category: [single] if category in ("gemm", "communication") else single}})
        workload = parse_workload({"model": self.cfg.model, "tp_size": self.tp, "pp_size": self.pp,
                                   "iterations": iterations}, source=f"{self.cfg.stem} step")
        result = self.aggregator.predict([Job(workload, self.hardware, self.collective_hardware)])[0].result
        self.engine_calls += 1
        for key, iteration in zip(todo, result["iterations"]):
            self.single_ms[key] = iteration["total_duration_ms"]
