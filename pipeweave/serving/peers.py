"""AIConfigurator's per-step estimate as a step cost, to run the same scheduler on a peer's predictions.

AIConfigurator (``aiconfigurator-core``, NVIDIA) estimates one iteration from uniform lengths only:
``decode_step_latency(gen_tokens, isl, osl)`` and ``mixed_step_latency(ctx_tokens, gen_tokens, isl, osl)``. A
batch is therefore described by its prefill token count, its number of decoding requests and its mean lengths
(decoding requests: mean context; prefill: mean context of the prefilling requests), memoised on those numbers.
This coarsening is the peer's, not pipeweave's, and is why the comparison is of TTFT/TPOT distributions, not steps.
"""
from __future__ import annotations

from typing import Sequence

#: pipeweave config stem -> the Hugging Face id whose config ships inside aiconfigurator-core
AICONFIGURATOR_MODELS = {
    "Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
}


class AIConfiguratorStepCost:
    def __init__(self, model_stem: str, system: str, tp: int):
        from aiconfigurator_core.sdk.engine import EngineHandle

        if model_stem not in AICONFIGURATOR_MODELS:
            raise ValueError(f"no aiconfigurator model for {model_stem} (known: {', '.join(AICONFIGURATOR_MODELS)})")
        self.engine = EngineHandle.compile(AICONFIGURATOR_MODELS[model_stem], system, "vllm", tp_size=tp)
        self.memo: dict[tuple, float] = {}

    def __call__(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        prefill = [(n, c) for n, c in zip(new_tokens, context_lens) if n > 1]
        decode = [c for n, c in zip(new_tokens, context_lens) if n == 1]
        gen_isl = round(sum(decode) / len(decode)) if decode else 0
        if not prefill:
            key = (0, len(decode), gen_isl)
        else:
            key = (sum(n for n, _ in prefill), len(decode), round(sum(c for _, c in prefill) / len(prefill)))
        if key not in self.memo:
            ctx_tokens, gen, isl = key
            self.memo[key] = (self.engine.decode_step_latency(gen, isl, 2) if not ctx_tokens
                              else self.engine.mixed_step_latency(ctx_tokens, gen, isl, 2))
        return self.memo[key]
