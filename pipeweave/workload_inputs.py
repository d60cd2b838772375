"""The workload generator's inputs: a model config and a request trace, parsed and validated.

Model configs are HF ``config.json`` files (docs/METHOD.md §2); a name is a path, a Hugging Face model directory
(its ``config.json``) or a stem under ``config/``.
Traces are CSV files with one request per row, by path or by stem under ``workload/traces/``. Two header
layouts are accepted:

* this project's format: ``request,prompt_tokens,decode_tokens,output_tokens`` (``request`` optional);
* the PipeWeave artifact's format: ``num_prefill_tokens,num_decode_tokens,output_tokens``.

``decode_tokens`` (the request's output length in the source trace) is kept for reference but not used;
``output_tokens`` is the number of generated tokens of the measured run and must be the same on every row.
Every problem is a :class:`WorkloadError` (a one-line CLI error). :mod:`pipeweave.workload` builds the workload
from these inputs and re-exports them.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipeweave.cli import UserError
from pipeweave.moe import MODEL_TYPES, MOE_KEYS, MoeConfig, moe_config_from_dict
from pipeweave.paths import DEFAULT_CONFIG_DIR, DEFAULT_TRACE_DIR
from pipeweave.validation import HEAD_DIM_STEP, MAX_COUNT, MAX_HEAD_DIM, MAX_HEADS, MAX_WIDTH

#: Column layouts of a trace CSV: name -> (prompt column, decode column, output column).
TRACE_FORMATS = {
    "pipeweave": ("prompt_tokens", "decode_tokens", "output_tokens"),
    "artifact": ("num_prefill_tokens", "num_decode_tokens", "output_tokens"),
}
TRACE_HEADER = ("request", "prompt_tokens", "decode_tokens", "output_tokens")

_MODEL_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
               "vocab_size", "num_hidden_layers")


class WorkloadError(UserError):
    """Invalid model config, trace or generator option (reported as a one-line CLI error)."""


# --------------------------------------------------------------------------------------------------
# Model configuration (docs/METHOD.md §2)
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    """The subset of an HF ``config.json`` the generator reads, with ``head_dim`` resolved."""

    stem: str
    model: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_hidden_layers: int
    tie_word_embeddings: bool = False
    #: the routed/shared experts of a mixture-of-experts model (every layer is MoE); None for a dense model
    moe: MoeConfig | None = None
    #: "fp8" for a checkpoint whose ``quantization_config`` is FP8 (its workloads must be generated as FP8)
    checkpoint_dtype: str | None = None
    #: where that quantisation is set: ``quantization_config``, or a file beside a model directory's config.json
    quantization_source: str = "quantization_config"
    #: the longest sequence vLLM serves the model at (``max_position_embeddings``, extended by a rope scaling;
    #: None: not known) and what it is, for messages
    max_sequence: int | None = None
    max_sequence_source: str = "max_position_embeddings"
    #: ``architectures[0]`` of the config (None for one rebuilt from a workload's ``model_params``)
    architecture: str | None = None

    @property
    def has_qk_norm(self) -> bool:
        """Qwen3 normalises q and k per head in every layer. Read from the architecture, since ``model`` may be a
        local checkpoint path; a config rebuilt from a workload has only its model name."""
        return self.architecture.startswith("Qwen3") if self.architecture else "Qwen3" in self.model

    def model_params(self) -> dict:
        return {
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "num_hidden_layers": self.num_hidden_layers,
            # only when tied, so that the workloads of untied models keep their bytes
            **({"tie_word_embeddings": True} if self.tie_word_embeddings else {}),
            **({} if self.moe is None else {
                "num_experts": self.moe.num_experts,
                "num_experts_per_tok": self.moe.top_k,
                "moe_intermediate_size": self.moe.expert_intermediate_size,
                "shared_expert_intermediate_size": self.moe.shared_expert_intermediate_size,
            }),
        }


def positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"{what} must be a positive integer, got {value!r}")
    return value


#: transformers' head_dim of an architecture whose config class has its own default instead of hidden_size /
#: num_attention_heads, for a config without the key (Qwen3Config: 128, where Qwen3-32B's 5120 / 64 would give 80;
#: Qwen3MoeConfig has none, and its model takes hidden_size / num_attention_heads)
HEAD_DIM_DEFAULTS = {"Qwen3ForCausalLM": 128}
#: transformers' num_key_value_heads of an architecture whose config class has its own default, for a config without
#: the key (transformers 4.55; LlamaConfig has none: one KV head per query head). A null key is one per query head in
#: every config class that reads it.
KV_HEADS_DEFAULTS = {"MistralForCausalLM": 8, "MixtralForCausalLM": 8, "Qwen2ForCausalLM": 32, "Qwen3ForCausalLM": 32,
                     "Qwen2MoeForCausalLM": 16, "Qwen3MoeForCausalLM": 4}

#: every key the reader acts on; an unknown key one edit away from one of them is taken for a misspelling
READ_KEYS = (*_MODEL_KEYS, "head_dim", "tie_word_embeddings", "architectures", "model_type", "hidden_act",
             "_name_or_path", *MOE_KEYS,
             "shared_expert_intermediate_size", "kv_lora_rank", "q_lora_rank", "sliding_window", "use_sliding_window",
             "mlp_only_layers", "decoder_sparse_step", "quantization_config", "max_position_embeddings",
             "rope_scaling", "rope_parameters")


def one_edit_apart(a: str, b: str) -> bool:
    """One character inserted, deleted, replaced, or two neighbours swapped. Real HF keys that extend a read key
    (v_head_dim, swa_num_key_value_heads, moe_shared_expert_intermediate_size) are further away."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diffs = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diffs) == 1 or (len(diffs) == 2 and diffs[1] == diffs[0] + 1
                                   and a[diffs[0]] == b[diffs[1]] and a[diffs[1]] == b[diffs[0]])
    shorter, longer = sorted((a, b), key=len)
    return any(longer[:i] + longer[i + 1:] == shorter for i in range(len(longer)))


def _is_fp8(quantization: dict) -> bool:
    """Whether an HF ``quantization_config`` stores FP8 weights, in the formats checkpoints ship: ``fp8``
    (vLLM / transformers), ``fbgemm_fp8`` (Meta's Llama-3.1-405B-FP8), ``modelopt`` with ``quant_algo`` FP8 (NVIDIA),
    ``compressed-tensors`` whose weight groups are 8-bit floats (Neural Magic / Red Hat). The method's case is
    ignored, as vLLM lower-cases it."""
    method = str(quantization.get("quant_method", "")).lower()
    if method in ("fp8", "fbgemm_fp8"):
        return True
    if method == "modelopt":
        return str(quantization.get("quant_algo", "")).upper() == "FP8"
    if method == "compressed-tensors":
        groups = quantization.get("config_groups")
        weights = [g.get("weights") or {} for g in groups.values()] if isinstance(groups, dict) else []
        return bool(weights) and all(w.get("num_bits") == 8 and w.get("type") == "float" for w in weights)
    return False


def _fp8_variant(quantization: dict) -> str | None:
    """Why an FP8 ``quantization_config`` is not the per-tensor W8A8 FP8 that pipeweave's FP8 GEMM model was
    trained on (None when it is): block-scaled weights (``weight_block_size``, compressed-tensors ``strategy``
    block) run vLLM's blockwise FP8 GEMM, and FP8 weights without FP8 activations a weight-only kernel."""
    if quantization.get("weight_block_size") is not None:
        return f"block-scaled FP8 (weight_block_size {quantization['weight_block_size']})"
    groups = quantization.get("config_groups")
    for group in (groups.values() if isinstance(groups, dict) else ()):
        weights = group.get("weights") or {}
        if weights.get("strategy") == "block" or weights.get("block_structure"):
            return "block-scaled FP8 (compressed-tensors strategy block)"
        if str(quantization.get("quant_method", "")).lower() == "compressed-tensors" and \
                not group.get("input_activations"):
            return "FP8 weights with BF16 activations (compressed-tensors without input_activations)"
    return None


def _check_config_groups(quantization: dict, source: str, stem: str) -> None:
    """compressed-tensors' ``config_groups``: an object of groups, each an object whose ``weights`` and
    ``input_activations`` are objects (or absent)."""
    groups = quantization.get("config_groups")
    if groups is None:
        return
    if not isinstance(groups, dict):
        raise WorkloadError(f"config {stem}: {source}.config_groups must be an object of quantisation groups, "
                            f"got {groups!r}")
    for name, group in groups.items():
        if not isinstance(group, dict):
            raise WorkloadError(f"config {stem}: {source}.config_groups.{name} must be an object, got {group!r}")
        for part in ("weights", "input_activations"):
            if group.get(part) is not None and not isinstance(group[part], dict):
                raise WorkloadError(f"config {stem}: {source}.config_groups.{name}.{part} must be an object, got "
                                    f"{group[part]!r}")


#: where FP8 formats list the modules they leave unquantised: fbgemm_fp8 and transformers' fp8
#: (modules_to_not_convert), compressed-tensors (ignore), vLLM's fp8 (ignored_layers), modelopt (exclude_modules)
UNQUANTISED_KEYS = ("modules_to_not_convert", "ignore", "ignored_layers", "exclude_modules")
#: names of the decoder's linear layers (Llama / Qwen projections, Mixtral's expert w1 / w2 / w3) and of the modules
#: that hold them; lm_head, the embeddings and an MoE router (mlp.gate) are BF16 in pipeweave's FP8 workloads too
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                   "gate_up_proj", "w1", "w2", "w3")
DECODER_MODULES = ("self_attn", "mlp", "block_sparse_moe", "experts", "shared_expert", "layers")


def names_decoder_linear(entry: str) -> bool:
    """Whether a module name (or compressed-tensors ``re:`` pattern) of an unquantised list covers a decoder linear
    layer: it names one, or ends at a module holding some (``model.layers.0.mlp``, ``re:.*self_attn.*``,
    ``model.layers.3``)."""
    text = entry[3:] if entry.startswith("re:") else entry
    tokens = [token for token in re.split(r"[^A-Za-z0-9_]+", text) if token]
    if not tokens:
        return False
    if any(token in DECODER_LINEARS for token in tokens):
        return True
    last = tokens[-1]
    return last in DECODER_MODULES or (last.isdigit() and len(tokens) > 1 and tokens[-2] == "layers")


def _unquantised_linears(quantization: dict, source: str, stem: str) -> tuple[str, list[str]] | None:
    """(key, entries) of the first unquantised-module list that keeps decoder linear layers in BF16, else None."""
    for key in UNQUANTISED_KEYS:
        entries = quantization.get(key)
        if entries is None:
            continue
        if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
            raise WorkloadError(f"config {stem}: {source}.{key} must be a list of module names, got {entries!r}")
        linear = [entry for entry in entries if names_decoder_linear(entry)]
        if linear:
            return key, linear
    return None


def _checkpoint_dtype(cfg: dict, stem: str, moe: bool) -> str | None:
    quantization = cfg.get("quantization_config")
    if quantization is None:
        return None
    source = cfg.get(QUANT_SOURCE_KEY, "quantization_config")
    if not isinstance(quantization, dict):
        raise WorkloadError(f"config {stem}: {source} must be an object with a quant_method (as Hugging Face writes "
                            f"it), got {quantization!r}")
    if quantization.get("quant_method") is None:
        raise WorkloadError(f"config {stem}: {source} has no quant_method (fp8, awq, gptq, ...), so its "
                            f"quantisation is not known")
    _check_config_groups(quantization, source, stem)
    if not _is_fp8(quantization):
        method = quantization.get("quant_method")
        algo = f", quant_algo {quantization['quant_algo']!r}" if quantization.get("quant_algo") else ""
        raise WorkloadError(f"config {stem}: {source} (quant_method {method!r}{algo}) is not an FP8 format "
                            f"pipeweave recognises (fp8, fbgemm_fp8, modelopt FP8, compressed-tensors float8), and "
                            f"other quantisations are not modelled; pipeweave predicts BF16 and FP8 (W8A8) linear "
                            f"layers (--dtype fp8)")
    variant = _fp8_variant(quantization)
    if variant and moe:  # dropping the variant would only meet the refusal of FP8 MoE layers (workload.py)
        raise WorkloadError(f"config {stem}: {source} is {variant}, and FP8 mixture-of-experts layers are not "
                            f"modelled: remove the quantization to predict its BF16 version")
    if variant:
        raise WorkloadError(f"config {stem}: {source} is {variant}, whose kernels are not the per-tensor FP8 GEMMs "
                            f"pipeweave's FP8 model was trained on; remove that setting to predict it as per-tensor "
                            f"FP8 (W8A8), or the quantization to predict its BF16 version")
    kept = _unquantised_linears(quantization, source, stem)
    if kept:  # Meta's Llama-3.1-405B-FP8 keeps every attention projection and two layers' MLPs in BF16
        key, linear = kept
        shown = ", ".join(linear[:2]) + (f" and {len(linear) - 2} more" if len(linear) > 2 else "")
        raise WorkloadError(f"config {stem}: {source}.{key} keeps decoder linear layers in BF16 ({shown}); "
                            f"a mixture of BF16 and FP8 linear layers is not modelled: remove {key} to predict every "
                            f"linear layer as FP8, or the quantization to predict the BF16 version")
    return "fp8"


def _max_sequence(cfg: dict, stem: str) -> tuple[int | None, str]:
    """The longest sequence vLLM serves the model at by default (``ModelConfig._get_and_verify_max_len``, 0.10.1):
    ``max_position_embeddings``; with a rope scaling that has a ``factor``, times that factor, except for the llama3,
    su and longrope types (their ``max_position_embeddings`` already is the extended length), YaRN from its
    ``original_max_position_embeddings``; with what it is. None without ``max_position_embeddings``, or for a
    scaling without a factor (not checked)."""
    for key in ("rope_scaling", "rope_parameters"):  # a malformed one is refused, as transformers cannot read it
        rope = cfg.get(key)
        if rope is not None and not isinstance(rope, dict):
            raise WorkloadError(f"config {stem}: {key} must be an object (or null), got {rope!r}")
        factor = rope.get("factor") if rope else None
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not factor > 0):
            raise WorkloadError(f"config {stem}: {key}.factor must be a positive number, got {factor!r}")
    source = "max_position_embeddings"
    if cfg.get("max_position_embeddings") is None:
        return None, source
    limit = positive_int(cfg["max_position_embeddings"], f"config {stem}: max_position_embeddings")
    for key in ("rope_scaling", "rope_parameters"):
        rope = cfg.get(key)
        if not _rope_scaled(rope):
            continue
        kind = rope.get("rope_type", rope.get("type"))
        if kind in ("su", "longrope", "llama3"):
            return limit, source
        if rope.get("factor") is None:  # a scaling without a factor: not checked
            return None, source
        base_key = "original_max_position_embeddings" if kind == "yarn" and \
            rope.get("original_max_position_embeddings") is not None else "max_position_embeddings"
        base = positive_int(rope.get(base_key, limit), f"config {stem}: {key}.{base_key}")
        return int(base * rope["factor"]), f"the length its {kind} rope scaling gives ({base_key} x factor)"
    return limit, source


def _rope_scaled(rope: dict | None) -> bool:
    """Whether a ``rope_scaling`` (``type`` or ``rope_type``) or transformers 5's ``rope_parameters`` (written in
    every config) extends the context: any rope type but "default"."""
    if not rope:
        return False
    return rope.get("rope_type", rope.get("type", "default")) != "default"


def model_config_from_dict(cfg: dict, stem: str = "model") -> ModelConfig:
    """Validate a parsed config dict and resolve ``head_dim`` and the ``model`` string."""
    if not isinstance(cfg, dict):
        raise WorkloadError(f"config {stem}: expected a JSON object")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise WorkloadError(f"config {stem}: 'architectures' must be a non-empty list of names such as "
                            f"[\"LlamaForCausalLM\"], got {archs!r}")
    if archs is None and cfg.get("model_type") is not None:  # a config naming its model by model_type only
        model_type = cfg["model_type"]
        if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
            raise WorkloadError(f"config {stem}: model_type {model_type!r} is not modelled (modelled: "
                                f"{', '.join(t for t in MODEL_TYPES if not t.startswith('deepseek'))})")
        archs = [MODEL_TYPES[model_type]]
        cfg = {**cfg, "architectures": archs}
    try:  # before the keys: an unmodelled architecture is refused as such, not for a key it names otherwise
        moe = moe_config_from_dict(cfg)
    except ValueError as exc:
        raise WorkloadError(f"config {stem}: {exc}") from None
    activation = cfg.get("hidden_act")  # after the architecture: Gemma-2's GELU is not all that is not modelled
    if activation is not None and str(activation).lower() not in ("silu", "swish"):
        raise WorkloadError(f"config {stem}: hidden_act {activation!r} is not modelled; pipeweave's MLP is the gated "
                            f"SiLU (SiLU*Mul) of the modelled architectures")
    values = {}
    kv_default = KV_HEADS_DEFAULTS.get(archs[0]) if archs else None
    kv_source = ""  # how a num_key_value_heads the config does not give was read, for messages
    for key in _MODEL_KEYS:
        typo = [found for found in cfg if one_edit_apart(found, key)] if key not in cfg else []
        if key == "num_key_value_heads" and key not in cfg and not typo and kv_default is not None:
            # the config class's own default (MistralConfig: 8), which vLLM serves
            values[key], kv_source = kv_default, f", {archs[0]}'s default where the config has no such key"
            continue
        if key == "num_key_value_heads" and cfg.get(key) is None and not typo and "num_attention_heads" in cfg:
            # transformers' reading of a null key, and LlamaConfig's of an absent one: multi-head attention, as in
            # the configs written before grouped-query attention (Llama-2-7B, Vicuna)
            values[key] = positive_int(cfg["num_attention_heads"], f"config {stem}: num_attention_heads")
            continue
        if key not in cfg:
            nested = isinstance(cfg.get("text_config"), dict) and key in cfg["text_config"]
            raise WorkloadError(f"config {stem}: missing key '{key}'"
                                + (f" (found '{typo[0]}': a misspelling?)" if typo else "")
                                + (" (the config nests its language model's keys under text_config: a multimodal "
                                   "model, which is not modelled)" if nested and not typo else ""))
        values[key] = positive_int(cfg[key], f"config {stem}: {key}")
    limits = {"hidden_size": MAX_WIDTH, "intermediate_size": MAX_WIDTH, "vocab_size": MAX_WIDTH,
              "num_attention_heads": MAX_HEADS, "num_key_value_heads": MAX_HEADS, "num_hidden_layers": MAX_COUNT}
    sizes = {**values, **({} if moe is None else {"num_experts": moe.num_experts,
                                                   "moe_intermediate_size": moe.expert_intermediate_size})}
    for key, value in sizes.items():  # named as the config's key, not as the workload field it would become
        limit = limits.get(key, MAX_WIDTH)
        if value > limit:
            raise WorkloadError(f"config {stem}: {key} = {value} exceeds the limit {limit:,}")
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    if heads % values["num_key_value_heads"]:  # before any tool sizes memory with such heads
        raise WorkloadError(f"config {stem}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads "
                            f"({values['num_key_value_heads']}{kv_source}) (grouped-query attention)")
    default_head_dim = HEAD_DIM_DEFAULTS.get(archs[0]) if archs else None
    if cfg.get("head_dim") is not None:
        head_dim = positive_int(cfg["head_dim"], f"config {stem}: head_dim")
    elif default_head_dim is not None:
        head_dim = default_head_dim
    else:
        if hidden % heads:
            raise WorkloadError(f"config {stem}: no head_dim and hidden_size {hidden} is not divisible by "
                                f"num_attention_heads {heads}")
        head_dim = hidden // heads
    if "_name_or_path" in cfg:
        model = str(cfg["_name_or_path"])
    elif isinstance(cfg.get("architectures"), list) and cfg["architectures"]:
        model = str(cfg["architectures"][0])
    else:
        model = "unknown"
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise WorkloadError(f"config {stem}: tie_word_embeddings must be true or false, got {tie!r}")
    if head_dim % HEAD_DIM_STEP or head_dim > MAX_HEAD_DIM:
        raise WorkloadError(f"config {stem}: head_dim {head_dim} is not a head size the attention kernels and their "
                            f"model support (a multiple of {HEAD_DIM_STEP} up to {MAX_HEAD_DIM})"
                            + ("" if "head_dim" in cfg else " (hidden_size / num_attention_heads)"))
    for key in cfg:  # after the refusals of unmodelled architectures, whose own keys may be one edit apart
        close = [known for known in READ_KEYS if key not in READ_KEYS and one_edit_apart(key, known)]
        if close:
            raise WorkloadError(f"config {stem}: unknown key '{key}'; did you mean '{close[0]}'?")
    max_sequence, max_source = _max_sequence(cfg, stem)
    return ModelConfig(stem=stem, model=model, head_dim=head_dim, tie_word_embeddings=tie, moe=moe,
                       checkpoint_dtype=_checkpoint_dtype(cfg, stem, moe is not None), max_sequence=max_sequence,
                       max_sequence_source=max_source,
                       quantization_source=cfg.get(QUANT_SOURCE_KEY, "quantization_config"),
                       architecture=archs[0] if archs else None, **values)


def _known_stems(directory: Path, suffix: str) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.iterdir() if p.suffix == suffix and not p.name.startswith("."))


def resolve_named_file(name: str | Path, directory: Path, suffix: str, what: str) -> Path:
    """A path to an existing file, or a stem looked up in ``directory``; unknown stems list the known ones."""
    text = str(name)
    path = Path(text)
    if path.is_file():
        return path
    if "/" in text or "\\" in text:
        raise WorkloadError(f"{what} {text} is a directory; give a {suffix} file" if path.is_dir()
                            else f"{what} file not found: {text}")
    stem = text[: -len(suffix)] if text.endswith(suffix) else text
    candidate = Path(directory) / f"{stem}{suffix}"
    if stem and candidate.is_file():
        return candidate
    known = _known_stems(Path(directory), suffix)
    listing = ", ".join(known) if known else f"none in {directory}"
    raise WorkloadError(f"unknown {what} '{text}' (known: {listing})")


#: the file a Hugging Face model directory (a checkpoint, a ``huggingface-cli download``) keeps its config in
HF_CONFIG_FILE = "config.json"


def resolve_model_config(name: str | Path, config_dir: str | Path = DEFAULT_CONFIG_DIR) -> Path:
    """The config file ``name`` means: a file path, a stem of ``config_dir``, or a Hugging Face model directory's
    ``config.json`` (users point at the checkpoint they serve, not at a file inside it). A bare name that is a stem
    of ``config_dir`` means that config even where the current folder has a model directory of the same name (a
    download named Qwen2.5-14B would otherwise replace the shipped config, the paper set's included): such a
    directory is given as a path, ``./Qwen2.5-14B``."""
    path = Path(str(name))
    if path.is_dir():
        if "/" not in str(name) and "\\" not in str(name):  # a bare name: the shipped config first
            try:
                return resolve_named_file(name, Path(config_dir), ".json", "model config")
            except WorkloadError:
                pass
        if (path / HF_CONFIG_FILE).is_file():
            return path / HF_CONFIG_FILE
        raise WorkloadError(f"model config directory {name} has no {HF_CONFIG_FILE} (a Hugging Face model directory "
                            f"holds one); give the directory that does, or the config JSON file")
    return resolve_named_file(name, Path(config_dir), ".json", "model config")


def config_stem(path: Path) -> str:
    """The name a config file goes by in messages and output file names: its stem, but for a Hugging Face
    ``config.json`` the model's name, i.e. its directory's (``Llama-3.1-8B/config.json``: Llama-3.1-8B), or in the
    Hugging Face cache (``models--meta-llama--Llama-3.1-8B/snapshots/<revision>/``) the name before the revision.
    The path is made absolute without following links: the cache's ``config.json`` links into ``blobs/``."""
    if path.name != HF_CONFIG_FILE:
        return path.stem
    folder = Path(os.path.abspath(path)).parent
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.split("--")[-1]
    return folder.name or path.stem


def load_model_config(name: str | Path, config_dir: str | Path = DEFAULT_CONFIG_DIR) -> ModelConfig:
    """Load a model config by path, Hugging Face model directory or stem (``config/<stem>.json``)."""
    path = resolve_model_config(name, config_dir)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkloadError(f"config {path}: not valid JSON ({exc})") from None
    if path.name == HF_CONFIG_FILE and isinstance(cfg, dict) and "quantization_config" not in cfg:
        cfg = with_sidecar_quantization(cfg, path.parent)
    return model_config_from_dict(cfg, stem=config_stem(path))


#: quantisation settings a checkpoint keeps beside its config.json instead of in it (ModelOpt's exports up to 0.29,
#: GPTQ's and AutoAWQ's older ones), read as the quantization_config they stand for: an NVFP4 or int4 checkpoint
#: predicted as BF16 would be 3-4x its size
QUANT_SIDECARS = {
    "hf_quant_config.json": lambda data: {"quant_method": "modelopt", "quant_algo": (
        data["quantization"].get("quant_algo") if isinstance(data.get("quantization"), dict) else None)},
    "quantize_config.json": lambda data: {"quant_method": "gptq", **data},
    "quant_config.json": lambda data: {"quant_method": "awq", **data},
}
#: where a config's quantization_config came from, for messages (not a Hugging Face key)
QUANT_SOURCE_KEY = "_pipeweave_quantization_source"


def with_sidecar_quantization(cfg: dict, folder: Path) -> dict:
    """``cfg`` with the ``quantization_config`` of the first quantisation file beside it (:data:`QUANT_SIDECARS`)."""
    for name, translate in QUANT_SIDECARS.items():
        sidecar = folder / name
        if sidecar.is_file():
            try:
                data = json.loads(sidecar.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise WorkloadError(f"{sidecar}: not valid JSON ({exc})") from None
            if not isinstance(data, dict):
                raise WorkloadError(f"{sidecar}: expected a JSON object")
            return {**cfg, "quantization_config": translate(data), QUANT_SOURCE_KEY: f"{name} beside its config.json"}
    return cfg


# --------------------------------------------------------------------------------------------------
# Traces
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trace:
    """A request batch: prompt and source-trace decode length per request, plus the run's output_tokens."""

    stem: str
    prompt_tokens: tuple[int, ...]
    decode_tokens: tuple[int, ...]
    output_tokens: int

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)


def trace_table(text: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(header cells, [(line number in the file, cells)] of the other rows) of trace CSV text: blank rows skipped,
    header cells stripped, a byte-order mark dropped; empty lists for an empty file."""
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    rows = [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    if not rows:
        return [], []
    return [cell.strip() for cell in rows[0][1]], rows[1:]


def parse_trace(text: str, stem: str = "trace") -> Trace:
    """Parse trace CSV text in this project's format or the PipeWeave artifact's format."""
    header, rows = trace_table(text)
    if not header:
        raise WorkloadError(f"trace {stem}: empty file")
    columns = None
    for names in TRACE_FORMATS.values():
        if set(names) <= set(header):
            columns = names
            break
    if columns is None:
        raise WorkloadError(
            f"trace {stem}: unrecognised header {','.join(header)!r}; expected "
            f"'{','.join(TRACE_HEADER)}' or '{','.join(TRACE_FORMATS['artifact'])}'")
    index = [header.index(name) for name in columns]
    if not rows:
        raise WorkloadError(f"trace {stem}: no requests (header only)")
    prompts, decodes, outputs = [], [], []
    for line_no, row in rows:
        if len(row) != len(header):
            raise WorkloadError(f"trace {stem}: line {line_no} has {len(row)} fields, expected {len(header)}")
        parsed = []
        for name, i in zip(columns, index):
            cell = row[i].strip()
            try:
                parsed.append(int(cell))
            except ValueError:
                raise WorkloadError(f"trace {stem}: line {line_no}: {name} is not an integer: {cell!r}") from None
        prompt, decode, output = parsed
        if prompt < 1:
            raise WorkloadError(f"trace {stem}: line {line_no}: {columns[0]} must be >= 1, got {prompt}")
        if decode < 0:
            raise WorkloadError(f"trace {stem}: line {line_no}: {columns[1]} must be >= 0, got {decode}")
        if output < 1:
            raise WorkloadError(f"trace {stem}: line {line_no}: output_tokens must be >= 1, got {output}")
        prompts.append(prompt)
        decodes.append(decode)
        outputs.append(output)
    if len(set(outputs)) != 1:
        raise WorkloadError(f"trace {stem}: output_tokens differs between rows ({sorted(set(outputs))}); "
                            "it is a property of the run (the generation length the workload generator uses) and "
                            "must be the same on every row; each request's own output length goes in decode_tokens, "
                            "which serve_sim.py and search_config.py read with --per_request_outputs")
    return Trace(stem=stem, prompt_tokens=tuple(prompts), decode_tokens=tuple(decodes), output_tokens=outputs[0])


def load_trace(name: str | Path, trace_dir: str | Path = DEFAULT_TRACE_DIR) -> Trace:
    """Load a trace by path or by stem (``workload/traces/<stem>.csv``)."""
    path = resolve_named_file(name, Path(trace_dir), ".csv", "trace")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"trace {path}: not UTF-8 text ({exc})") from None
    return parse_trace(text, stem=path.stem)


def format_trace(trace: Trace) -> str:
    """This project's trace CSV text (LF line endings, requests numbered from 1)."""
    lines = [",".join(TRACE_HEADER)]
    for i, (prompt, decode) in enumerate(zip(trace.prompt_tokens, trace.decode_tokens), start=1):
        lines.append(f"{i},{prompt},{decode},{trace.output_tokens}")
    return "\n".join(lines) + "\n"
