"""Mixture-of-experts layers: how the workload generator lists them and how their passes get durations.

**Which models** (``moe_config_from_dict``): Mixtral, Qwen2-MoE (shared expert) and Qwen3-MoE configs whose
every layer is MoE; anything else that is not one of the modelled dense architectures is refused.

**Layer layout** (``expert_operators``, ``moe_gate_gemms``). Every decoder layer of an MoE model runs the
router GEMM (H x E, replicated on every rank), the fused-MoE kernel's two passes over the routed experts
(w13: gate/up, H -> 2N; w2: down, N -> H; SiLU*Mul and the top-k reduction are inside the fused kernel), and,
for models with a shared expert (Qwen2-MoE), that expert as ordinary TP-sharded GEMMs + SiLU*Mul behind an
H x 1 sigmoid gate. Routing is assumed balanced (docs/METHOD.md §11.1.10): each expert gets tokens x top_k / E
slots. Expert parallelism ``ep`` divides ``tp``: the TP group's GPUs form ``ep`` groups, each holding E / ep
experts, each expert split over ``tp / ep`` ranks (aiconfigurator's ``moe_tp x moe_ep = tp``; vLLM's
``--enable-expert-parallel`` is ep = tp). A rank's fused-MoE launch is described as the TP shard of the same
layer, whatever ``ep``: every token routed top-k over all E experts of width ceil(N / tp) (``expert_operators``).
It does the same FLOPs and reads the same expert bytes as the rank's E / ep experts of width N / (tp / ep), and
vLLM's expert-parallel kernel does not run as a smaller layer: it takes all the rank's tokens with an expert map
that masks the other ranks' experts, so its token alignment, its grid and its top-k reduction still span every
token's k slots. Measured, an expert-parallel layer takes about what the TP shard of the same width takes:
on aiconfigurator-core's expert-parallel rows (EP 2, 4, 8; nothing is trained on them; ``expert_parallel_errors``,
table in docs/ACCURACY.md) the TP shard is predicted within 10.4 % mean, where the description before, ceil(tokens
/ ep) tokens over E / ep experts, was 19.7 % off (26.3 % above 256 tokens, always too fast) when this was chosen.
The tokens are already on every rank of the TP group (attention is TP-sharded), so EP needs no all-to-all:
each rank's partial output is summed by one all-reduce over the TP group, as the TP MLP's is.

**Pass durations** (``split_layer``). The only MoE measurements (aiconfigurator-core's vLLM tables) time a
**whole fused-MoE layer** (token alignment, w13 pass, SiLU*Mul, w2 pass, top-k reduction): ``weight_type =
"layer"`` rows, whose features are the sum of the two passes' (``analytical_model.registry``). So the MoE
model knows layers, not passes. pipeweave predicts the ``layer`` row, exactly what the model was trained and
validated on, and attributes it to the passes in proportion to each pass's roofline, max(FLOPs at the tensor
peak, DRAM bytes at the spec bandwidth) (w13 has twice w2's FLOPs and weights; their activation rows differ);
the two always sum to the layer prediction. The calculator's tile-level features are not used for the split:
they charge w13 for whole padded BN tiles, which for narrow experts would hand w13 up to 98 % of the layer.
Predicting each pass as its own row instead asks the model for inputs it never saw (one pass is about half a
layer): on the held-out shapes that is 1.8–3x less accurate (``pass_choice_errors``; table in
docs/ACCURACY.md). The split itself cannot be validated: no public source times the passes separately.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from analytical_model import descriptors
from analytical_model.pipes import HardwareSpec
from pipeweave.schema import GemmOp, MoeOp

if TYPE_CHECKING:
    import pandas as pd

SHAPE_COLUMNS = ("M", "E", "topk", "H", "N")
#: the shape descriptor (analytical_model.descriptors.MOE_DESCRIPTORS) that holds each shape column
MOE_SHAPE_DESCRIPTORS = dict(zip(SHAPE_COLUMNS, descriptors.MOE_DESCRIPTORS))


@dataclass(frozen=True)
class MoeConfig:
    """The expert layout of a mixture-of-experts model whose every decoder layer is an MoE layer.

    ``expert_intermediate_size`` is one routed expert's FFN width (Mixtral's ``intermediate_size``, Qwen-MoE's
    ``moe_intermediate_size``); ``shared_expert_intermediate_size`` is the always-active shared expert's width
    (0 when there is none); ``shared_expert_gate`` is Qwen2-MoE's sigmoid gate (an H x 1 GEMM) on that expert.
    """

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False


#: Architectures whose every operator pipeweave models (dense: docs/METHOD.md §2; MoE: fused-MoE layers). vLLM
#: runs MistralForCausalLM with its Llama model; Mistral's sliding window (v0.1) is refused as any other.
DENSE_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
#: transformers' sliding window of a config without the key (MistralConfig: 4096; the Qwen configs' 4096, which applies
#: only where use_sliding_window is true; MixtralConfig: none)
SLIDING_WINDOW_DEFAULTS = {"MistralForCausalLM": 4096, "Qwen2ForCausalLM": 4096, "Qwen3ForCausalLM": 4096,
                           "Qwen2MoeForCausalLM": 4096, "Qwen3MoeForCausalLM": 4096}
#: architectures whose config class turns the window off unless ``use_sliding_window`` says otherwise (Qwen2, Qwen3
#: and their MoE configs: use_sliding_window=False, whatever sliding_window says)
SLIDING_WINDOW_OFF_BY_DEFAULT = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
#: architectures whose attention is MLA (DeepSeek-V2/V3; the first DeepSeek-MoE is refused as an architecture)
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
#: transformers' ``model_type`` of each architecture, which names the model in a config without ``architectures``
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
               "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
               "deepseek_v3": "DeepseekV3ForCausalLM"}
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")


def moe_config_from_dict(cfg: dict) -> MoeConfig | None:
    """The MoE layout of an HF config dict, or None for a dense model; refuses what pipeweave does not model.

    Never falls back to a dense model: a config with MoE or MLA fields, or an architecture outside
    DENSE_ARCHITECTURES + MOE_ARCHITECTURES, is a ValueError naming what is missing.
    """
    archs = cfg.get("architectures")
    arch = str(archs[0]) if isinstance(archs, list) and archs else None
    if "kv_lora_rank" in cfg or "q_lora_rank" in cfg or arch in MLA_ARCHITECTURES:
        raise ValueError("multi-head latent attention (MLA: kv_lora_rank/q_lora_rank, DeepSeek-V2/V3) is not "
                         "modelled; pipeweave has no MLA attention operator")
    if arch is not None and arch not in DENSE_ARCHITECTURES + MOE_ARCHITECTURES:  # before the keys it names
        raise ValueError(f"architecture {arch} is not modelled (modelled: "
                         f"{', '.join(DENSE_ARCHITECTURES + MOE_ARCHITECTURES)})")
    window = cfg.get("sliding_window", SLIDING_WINDOW_DEFAULTS.get(arch))
    if window and cfg.get("use_sliding_window", arch not in SLIDING_WINDOW_OFF_BY_DEFAULT):
        default = "" if "sliding_window" in cfg else f", {arch}'s default where the config has no such key"
        raise ValueError(f"sliding-window attention (sliding_window {window}{default}) is not modelled; the "
                         "attention calculators attend to the whole context")
    moe_keys = ", ".join(key for key in MOE_KEYS if key in cfg)
    if arch is None:
        if moe_keys:
            raise ValueError(f"has mixture-of-experts keys ({moe_keys}) but no 'architectures'; name one of "
                             f"{', '.join(MOE_ARCHITECTURES)}")
        return None
    if arch in DENSE_ARCHITECTURES:
        if moe_keys:
            raise ValueError(f"dense architecture {arch} with mixture-of-experts keys ({moe_keys})")
        return None
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise ValueError("mixes dense and MoE layers (mlp_only_layers / decoder_sparse_step); only models whose "
                         "every layer is MoE are modelled")

    def need(key: str) -> int:
        if key not in cfg:
            raise ValueError(f"{arch} needs key '{key}'")
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
        return value

    if arch == "MixtralForCausalLM":
        experts, width, shared = need("num_local_experts"), need("intermediate_size"), 0
    else:
        experts, width = need("num_experts"), need("moe_intermediate_size")
        shared = need("shared_expert_intermediate_size") if arch == "Qwen2MoeForCausalLM" else 0
    top_k = need("num_experts_per_tok")
    if top_k > experts:
        raise ValueError(f"num_experts_per_tok {top_k} exceeds the {experts} experts")
    return MoeConfig(num_experts=experts, top_k=top_k, expert_intermediate_size=width,
                     shared_expert_intermediate_size=shared, shared_expert_gate=arch == "Qwen2MoeForCausalLM")


def expert_parallel_problem(moe: MoeConfig, tp: int, ep: int) -> str | None:
    """Why the experts cannot be laid out over ``tp`` ranks in ``ep`` expert groups (None if they can)."""
    if ep > tp or tp % ep:
        return f"ep {ep} must divide tp {tp} (the expert groups are made of the TP group's GPUs)"
    if moe.num_experts % ep:
        return f"the number of experts ({moe.num_experts}) is not divisible by ep {ep}"
    if moe.expert_intermediate_size % (tp // ep):
        return f"the expert width ({moe.expert_intermediate_size}) is not divisible by tp/ep = {tp // ep}"
    return None


def moe_gate_gemms(moe: MoeConfig, hidden: int, tokens: int, layers: int) -> list[GemmOp]:
    """The replicated gating GEMMs of an MoE layer: the router and (Qwen2-MoE) the shared-expert gate."""
    gemms = [GemmOp("router", tokens, moe.num_experts, hidden, layers, type="ReplicatedLinear")]
    if moe.shared_expert_gate:
        gemms.append(GemmOp("shared_expert_gate", tokens, 1, hidden, layers, type="ReplicatedLinear"))
    return gemms


def expert_operators(moe: MoeConfig, hidden: int, tokens: int, tp: int, ep: int, layers: int) -> list[MoeOp]:
    """The fused-MoE w13 and w2 passes one rank launches per layer: the TP shard of the layer, ``tokens`` routed
    top-k over all E experts of width ceil(N / tp), for every ``ep`` that divides ``tp`` (the module docstring
    says why; ``ep`` is checked by :func:`expert_parallel_problem`)."""
    shape = (tokens, moe.num_experts, moe.top_k, hidden, -(-moe.expert_intermediate_size // tp))
    return [MoeOp(f"experts_{kind}", kind, *shape, layers) for kind in ("w13", "w2")]


#: what a user who asked for expert parallelism is told: it changes no step cost (the module docstring)
EP_NOTE = ("Note: an expert-parallel rank's fused-MoE layer costs what the TP shard of the same layer costs (as "
           "measured: docs/ACCURACY.md), and EP inside the TP group adds no communication, so --ep changes no step "
           "time here; all-to-all dispatch with data-parallel attention is not modelled")

#: the expert-parallel sizes of one node's GPUs, the layouts the workload generator describes (ep divides tp)
NODE_EP_SIZES = (2, 4, 8)


def expert_parallel_errors(rows: pd.DataFrame, predictor) -> pd.DataFrame:
    """Per GPU, duration errors (%) on measured expert-parallel layers (:func:`dataset.aiconfigurator.
    expert_parallel_moe_rows`, one node's EP sizes: :data:`NODE_EP_SIZES`) of the rank as
    :func:`expert_operators` describes it (the TP shard of the same width) and as it was described before
    (ceil(tokens / ep) tokens over E / ep experts, top-k capped by the rank's experts and balanced slots)."""
    import pandas as pd

    rows = rows[rows["ep"].isin(NODE_EP_SIZES)].reset_index(drop=True)
    tokens, experts, top_k, ep = (rows[c].to_numpy(np.int64) for c in ("tokens", "experts", "topk", "ep"))
    width = rows["inter"].to_numpy(np.int64) // rows["moe_tp"].to_numpy(np.int64)
    used = [expert_operators(MoeConfig(int(e), int(k), int(n)), int(h), int(t), int(tp * p), int(p), 1)[0]
            for e, k, n, h, t, tp, p in zip(experts, top_k, rows["inter"], rows["hidden"], tokens, rows["moe_tp"], ep)]
    slots = -(-tokens * top_k // ep)
    local_top_k = np.minimum(np.minimum(top_k, experts // ep), slots)
    descriptions = {"tp_shard": tuple(np.array([getattr(op, f) for op in used]) for f in ("M", "E", "topk", "N")),
                    "smaller_layer": (-(-slots // local_top_k), experts // ep, local_top_k, width)}
    measured = rows["avg_duration"].to_numpy(np.float64)
    frame = pd.DataFrame({"hardware": rows["hardware"], "decode": tokens <= 256})
    for name, (m, e, k, n) in descriptions.items():
        shapes = pd.DataFrame({"weight_type": "layer", "M": m, "E": e, "topk": k, "H": rows["hidden"], "N": n,
                               "hardware": rows["hardware"]})
        frame[name] = np.abs(predictor.predict_frame("moe", shapes)["predicted_us"].to_numpy() / measured - 1) * 100
    out = []
    for gpu, group in list(frame.groupby("hardware")) + [("all", frame)]:
        out.append({"GPU": gpu, "n": len(group),
                    **{f"{name}_{stat}": getattr(group[name], stat)() for name in descriptions
                       for stat in ("mean", "median")},
                    **{f"{name}_{phase}": group.loc[group["decode"] == (phase == "decode"), name].mean()
                       for name in descriptions for phase in ("decode", "prefill")}})
    return pd.DataFrame(out)


def render_expert_parallel(table: pd.DataFrame) -> list[str]:
    """Markdown lines of the expert-parallel section of docs/ACCURACY.md."""
    lines = [
        "### moe: how a rank of an expert-parallel layer is described",
        "",
        "Scored on aiconfigurator-core's expert-parallel fused-MoE layers (vLLM, BF16, balanced routing, expert",
        f"parallelism {', '.join(map(str, NODE_EP_SIZES))}; the dataset leaves them out, so no model trained on them):",
        "the rank as the TP shard of the same width (used: `pipeweave/moe.py`) against the rank as a smaller layer,",
        "ceil(tokens / ep) tokens over experts / ep (the description before). Cells as above; the last columns",
        "split the mean by up to 256 tokens (decode-sized) and more.",
        "",
        "| GPU | n | TP shard (used) | smaller layer (before) | TP shard: ≤ 256 / > 256 tokens | "
        "smaller layer: ≤ 256 / > 256 tokens |",
        "|---|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        gpu = f"**{row.GPU}**" if row.GPU == "all" else row.GPU
        lines.append(f"| {gpu} | {row.n} | {row.tp_shard_mean:.1f} / {row.tp_shard_median:.1f} | "
                     f"{row.smaller_layer_mean:.1f} / {row.smaller_layer_median:.1f} | "
                     f"{row.tp_shard_decode:.1f} / {row.tp_shard_prefill:.1f} | "
                     f"{row.smaller_layer_decode:.1f} / {row.smaller_layer_prefill:.1f} |")
    lines.append("")
    return lines


#: token ranges of the unseen-GPU table: decode-sized, mid, prefill-sized layers (tokens entering the layer)
UNSEEN_TOKEN_RANGES = ((1, 64), (64, 1024), (1024, None))


def unseen_gpu_errors(rows: pd.DataFrame, model_dir) -> pd.DataFrame:
    """Per GPU and routing of ``rows`` (:func:`dataset.aiconfigurator.unseen_moe_rows`: layers of GPUs outside the MoE
    model's training data), the shipped model's predictions as a user gets them (:func:`pipeweave.predict_kernels`, with
    the models of ``model_dir``): n, mean and median duration error (%), the median signed error (predicted /
    measured - 1), the worst factor either way, the share of rows carrying an extrapolation flag, the share inside
    the 80 % interval, the mean error per :data:`UNSEEN_TOKEN_RANGES`, and the mean error of the roofline (the
    sum of the passes' :func:`pass_roofline_cycles`)."""
    import pandas as pd

    from analytical_model.hardware import hardware_registry
    from pipeweave.api import predict_kernels

    out = []
    for (gpu, routing), group in rows.groupby(["hardware", "routing"], sort=True):
        shapes = {column: group[column].tolist() for column in ("weight_type", "M", "E", "topk", "H", "N")}
        us, low, high, flags = predict_kernels("moe", shapes, gpu, model_dir=model_dir, interval=True,
                                               extrapolation=True)
        measured = group["avg_duration"].to_numpy(np.float64)
        error = np.abs(us / measured - 1) * 100
        tokens = group["M"].to_numpy(np.int64)
        hw = hardware_registry().get(gpu)
        roofline_us = sum(pass_roofline_cycles(*(group[c] for c in ("M", "E", "topk", "H", "N")), hw)) / hw.sm_freq
        out.append({"GPU": gpu, "routing": routing, "n": len(group), "mean": error.mean(),
                    "median": float(np.median(error)),
                    "signed": float(np.median(us / measured - 1) * 100),
                    "worst": float(np.max(np.maximum(us / measured, measured / us))),
                    "flagged": float(np.mean([flag != "" for flag in flags]) * 100),
                    "covered": float(np.mean((measured >= low) & (measured <= high)) * 100),
                    **{f"tokens_{first}": error[(tokens >= first) & (tokens < (last or np.inf))].mean()
                       for first, last in UNSEEN_TOKEN_RANGES},
                    "roofline": float(np.mean(np.abs(roofline_us / measured - 1)) * 100)})
    return pd.DataFrame(out)


def render_unseen_gpu(table: pd.DataFrame, tables: list[str], routing_floor: dict[str, float]) -> list[str]:
    """Markdown lines of the unseen-GPU section of docs/ACCURACY.md (``tables``: the aiconfigurator-core tables
    read; ``routing_floor``: :func:`dataset.aiconfigurator.routing_proxy_errors`)."""
    from dataset.aiconfigurator import ROUTING_PROXY

    ranges = " / ".join(f"{first}–{last - 1}" if last else f"≥ {first}" for first, last in UNSEEN_TOKEN_RANGES)
    floor = ", ".join(f"{gpu.replace('NVIDIA ', '')} {value:.1f} %" for gpu, value in sorted(routing_floor.items()))
    lines = [
        "### moe: GPUs and architectures outside the training data",
        "",
        "Scored on Triton fused-MoE layers (vLLM, BF16, no expert parallelism) of GPUs the dataset has none of",
        f"(docs/DATA.md; {', '.join(tables)}): balanced layers from an older table of a GPU whose table of the vLLM",
        "version pipeweave pins times FlashInfer's experts instead, and, on a GPU whose table has no balanced layer,",
        f"its `{ROUTING_PROXY}` layers against the balanced prediction (the routing's own share of the error: a",
        f"balanced layer's measured time is this far from the `{ROUTING_PROXY}` one of the same shape on the GPUs",
        f"that measured both: {floor or '—'}). No model was trained on them or on any GPU of their architecture: the",
        "shipped model's predictions as `predict_kernels.py` gives them.",
        "Cells: duration error in % (mean / median), the median signed error (< 0: predicted too fast), the worst",
        "factor either way, the share of rows that carry an extrapolation flag and the share inside the predicted 80 %",
        f"interval, the mean error by the tokens entering the layer ({ranges}), and the mean error of the roofline",
        "(the w13 and w2 passes' rooflines summed: the split's, above) on the same rows.",
        "",
        f"| GPU | routing | n | error | signed | worst factor | flagged | inside the 80 % interval | tokens {ranges} | "
        "roofline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        by_tokens = " / ".join(f"{getattr(row, f'tokens_{first}'):.1f}" for first, _ in UNSEEN_TOKEN_RANGES)
        lines.append(f"| {row.GPU} | {row.routing} | {row.n} | {row.mean:.1f} / {row.median:.1f} | {row.signed:+.1f} | "
                     f"{row.worst:.2f}x | {row.flagged:.0f} % | {row.covered:.0f} % | {by_tokens} | "
                     f"{row.roofline:.1f} |")
    lines.append("")
    return lines


def pass_roofline_cycles(m, experts, top_k, hidden, inter, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
    """Roofline cycles, max(FLOPs at the BF16 tensor peak, bytes at the DRAM bandwidth), of the w13 and w2 pass.

    Bytes: the weights of the experts that receive tokens (balanced routing) plus each routed slot's input
    and output rows (w13 reads H, writes 2N; w2 reads N, writes H), BF16.
    """
    m, e, k, h, n = (np.asarray(x, dtype=np.float64) for x in (m, experts, top_k, hidden, inter))
    routed = m * k
    active = np.minimum(e, routed)
    out = []
    for width, in_row, out_row in ((2 * n, h, 2 * n), (n, n, h)):
        flops = 2.0 * routed * h * width
        nbytes = 2.0 * (active * h * width + routed * (in_row + out_row))
        out.append(np.maximum(descriptors.tensor_cycles(flops, hw.tc_bf16, hw), descriptors.dram_cycles(nbytes, hw)))
    return out[0], out[1]


def w2_share(m, experts, top_k, hidden, inter, hw: HardwareSpec) -> np.ndarray:
    """The fraction of a layer's duration attributed to the w2 pass."""
    w13, w2 = pass_roofline_cycles(m, experts, top_k, hidden, inter, hw)
    return w2 / (w13 + w2)


def split_layer(layer_us, m, experts, top_k, hidden, inter, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
    """(w13, w2) durations attributing predicted layer durations in proportion to the passes' rooflines."""
    share = w2_share(m, experts, top_k, hidden, inter, hw)
    layer_us = np.asarray(layer_us, dtype=np.float64)
    return layer_us * (1.0 - share), layer_us * share


def pass_shares(keys: list[tuple[str, tuple]], registry) -> np.ndarray:
    """Fraction of the layer prediction each (GPU stem, (weight_type, M, E, topk, H, N)) key stands for:
    1 − w2 share for w13, the w2 share for w2, 1 for a whole layer."""
    out = np.ones(len(keys))
    stems = [stem for stem, _ in keys]
    for stem in dict.fromkeys(stems):
        rows = [i for i, s in enumerate(stems) if s == stem]
        dims = np.array([keys[i][1][1:] for i in rows], dtype=np.int64)
        share = w2_share(*dims.T, registry.get(stem))
        kinds = np.array([keys[i][1][0] for i in rows])
        out[rows] = np.where(kinds == "w2", share, np.where(kinds == "w13", 1.0 - share, 1.0))
    return out


def pass_fastest_us(keys: list[tuple[str, tuple]], registry, layer_fastest_us: np.ndarray,
                    shares: np.ndarray | None = None) -> np.ndarray:
    """The fastest each (GPU stem, (weight_type, M, E, topk, H, N)) key may run, in µs, given the fastest its whole
    layer may (``layer_fastest_us``, the physical band's): its share of that (``shares``, :func:`pass_shares` of the
    keys where not given), and no less than the pass's own FLOPs at the spec peak, since the share follows FLOPs and
    DRAM bytes and, where the bytes weigh (H = N = 64), fell below them."""
    shares = pass_shares(keys, registry) if shares is None else shares
    return np.maximum(np.asarray(layer_fastest_us) * shares, _pass_exact_us(keys, registry))


def _pass_exact_us(keys: list[tuple[str, tuple]], registry) -> np.ndarray:
    """Per key, the FLOPs of the pass itself at the spec peak in µs (0 for a whole layer, which its band bounds)."""
    from analytical_model.registry import get_operator
    from pipeweave.bounds import EXACT_WORK_DESCRIPTOR

    operator = get_operator("moe")
    out = np.zeros(len(keys))
    stems = [stem for stem, shape in keys]
    for stem in dict.fromkeys(stems):
        rows = [i for i, s in enumerate(stems) if s == stem and keys[i][1][0] != "layer"]
        if not rows:
            continue
        hw = registry.get(stem)
        columns = {name: [keys[i][1][j] for i in rows] for j, name in enumerate(operator.shape_columns)}
        work = operator.descriptors(columns, hw)[:, operator.descriptor_names.index(EXACT_WORK_DESCRIPTOR)]
        out[rows] = work / hw.sm_freq
    return out


def pass_choice_errors(test: pd.DataFrame, predictor) -> pd.DataFrame:
    """Per GPU, duration errors (%) on measured layer rows of: the layer prediction, and the sum of separate
    w13 and w2 predictions (the rejected alternative); plus the w2 share the split gives."""
    import pandas as pd

    shapes = test[[*SHAPE_COLUMNS, "hardware"]].reset_index(drop=True)
    measured = test["avg_duration"].to_numpy(np.float64)
    layer = predictor.predict_frame("moe", shapes.assign(weight_type="layer"))
    w13 = predictor.predict_frame("moe", shapes.assign(weight_type="w13"))
    w2 = predictor.predict_frame("moe", shapes.assign(weight_type="w2"))
    share = np.zeros(len(shapes))
    for gpu in pd.unique(shapes["hardware"]):
        rows = (shapes["hardware"] == gpu).to_numpy()
        share[rows] = w2_share(*(shapes.loc[rows, c].to_numpy() for c in SHAPE_COLUMNS), predictor.hardware.get(gpu))
    frame = pd.DataFrame({
        "hardware": shapes["hardware"],
        "layer": np.abs(layer["predicted_us"].to_numpy() / measured - 1) * 100,
        "passes": np.abs((w13["predicted_us"].to_numpy() + w2["predicted_us"].to_numpy()) / measured - 1) * 100,
        "w2_share": share * 100,
    })
    rows = []
    for gpu, group in list(frame.groupby("hardware")) + [("all", frame)]:
        rows.append({"GPU": gpu, "n": len(group), "layer_mean": group["layer"].mean(),
                     "layer_median": group["layer"].median(), "passes_mean": group["passes"].mean(),
                     "passes_median": group["passes"].median(), "w2_share_min": group["w2_share"].min(),
                     "w2_share_max": group["w2_share"].max()})
    return pd.DataFrame(rows)


def render_pass_choice(table: pd.DataFrame) -> list[str]:
    """Markdown lines of the w13/w2 section of docs/ACCURACY.md."""
    lines = [
        "### moe: how the w13 and w2 passes are predicted",
        "",
        "Every MoE measurement times a whole fused-MoE layer (w13 pass, SiLU*Mul, w2 pass, top-k reduction), so",
        "the model predicts the `layer` row (the table above) and the aggregator attributes it to w13 and w2 in",
        "proportion to each pass's roofline (FLOPs and DRAM bytes, `pipeweave/moe.py`); w2's share is given",
        "below. The rejected alternative, predicting each pass as its own row and summing, is scored on the",
        "same held-out layer rows (cells as above). The split itself is not measured anywhere.",
        "",
        "| GPU | n test | layer row (used) | w13 row + w2 row (rejected) | w2 share of the layer |",
        "|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        gpu = f"**{row.GPU}**" if row.GPU == "all" else row.GPU
        lines.append(f"| {gpu} | {row.n} | {row.layer_mean:.1f} / {row.layer_median:.1f} | "
                     f"{row.passes_mean:.1f} / {row.passes_median:.1f} | "
                     f"{row.w2_share_min:.0f}–{row.w2_share_max:.0f} % |")
    lines.append("")
    return lines
