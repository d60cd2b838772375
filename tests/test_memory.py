"""Model configs beyond the paper's (MoE), the refusal of unmodelled architectures, and the memory check.

Expected numbers are first-principles facts published with the models (parameter counts) and spec-sheet memory
sizes, not values read back from the code.
"""
from __future__ import annotations

import json
import re

import pytest

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry, load_hardware
from pipeweave.memory import (GPU_MEMORY_UTILIZATION, check_memory, kv_cache_bytes_per_gpu, parameter_count,
                              shard_problem, weight_bytes_per_gpu, weight_bytes_read)
from pipeweave.workload import WorkloadError, load_model_config, model_config_from_dict

GPUS = hardware_registry(DEFAULT_HARDWARE_DIR)
ARXIV_16 = [2197] * 16  # the shape of the arxiv_16 batch used by the paper's 70B runs, 403 output tokens


@pytest.mark.parametrize("stem, total, active", [
    # exact published counts (Hugging Face safetensors metadata) for the dense ones, model-card figures for MoE
    ("Llama-3.1-8B", 8_030_261_248, None),
    ("Llama-3.1-70B", 70_553_706_496, None),
    ("Mixtral-8x7B", 46_702_792_704, 12.9e9),
    ("Qwen3-30B-A3B", 30.5e9, 3.3e9),
    ("Qwen3-235B-A22B", 235e9, 22e9),
    ("Qwen2-57B-A14B", 57.4e9, 14e9),
])
def test_parameter_counts_match_the_published_ones(stem, total, active):
    cfg = load_model_config(stem)
    assert parameter_count(cfg) == pytest.approx(total, rel=0.005)
    if active is not None:
        assert parameter_count(cfg, active=True) == pytest.approx(active, rel=0.02)


def test_moe_configs_are_parsed_as_moe():
    mixtral = load_model_config("Mixtral-8x7B")
    assert (mixtral.moe.num_experts, mixtral.moe.top_k, mixtral.moe.expert_intermediate_size) == (8, 2, 14336)
    qwen2 = load_model_config("Qwen2-57B-A14B")
    assert qwen2.moe.shared_expert_intermediate_size == 20480 and qwen2.moe.shared_expert_gate
    assert load_model_config("Qwen3-30B-A3B").moe.shared_expert_intermediate_size == 0
    assert load_model_config("Llama-3.1-8B").moe is None


BASE = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1024,
        "vocab_size": 100, "num_hidden_layers": 2}


@pytest.mark.parametrize("extra, message", [
    ({"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512}, "multi-head latent attention"),
    ({"architectures": ["DeepseekV2ForCausalLM"]}, "MLA"),
    ({"architectures": ["GPTNeoXForCausalLM"]}, "architecture GPTNeoXForCausalLM is not modelled"),
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, "mixture-of-experts keys"),
    ({"architectures": ["LlamaForCausalLM"], "num_experts": 8}, "dense architecture"),
    ({"architectures": ["MixtralForCausalLM"], "num_experts_per_tok": 2}, "needs key 'num_local_experts'"),
    ({"architectures": ["Qwen2MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 64}, "needs key 'shared_expert_intermediate_size'"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 64, "mlp_only_layers": [0]}, "mixes dense and MoE layers"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 9,
      "moe_intermediate_size": 64}, "exceeds the 8 experts"),
    ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096, "use_sliding_window": True},
     "sliding-window attention"),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 4096}, "sliding-window attention"),  # v0.1
])
def test_unmodelled_architectures_are_refused(extra, message):
    with pytest.raises(WorkloadError, match=message):
        model_config_from_dict({**BASE, **extra})


def test_mistral_without_a_sliding_window_is_the_llama_it_runs_as_in_vllm():
    """Mistral-7B-v0.3 and later (sliding_window null) were refused by architecture name."""
    mistral = model_config_from_dict({**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": None})
    llama = model_config_from_dict({**BASE, "architectures": ["LlamaForCausalLM"]})
    assert mistral.moe is None and mistral.head_dim == llama.head_dim == 64
    assert weight_bytes_per_gpu(mistral, tp=1) == weight_bytes_per_gpu(llama, tp=1)


def test_weights_are_sharded_and_dtype_aware():
    llama = load_model_config("Llama-3.1-70B")
    full = weight_bytes_per_gpu(llama, tp=1)
    assert full == pytest.approx(2 * 70.55e9, rel=1e-3)
    assert weight_bytes_per_gpu(llama, tp=4) == pytest.approx(full / 4, rel=0.01)  # KV heads 8 >= 4: all split
    # PP2: half the layers and one of the two vocabulary tables (embedding or lm_head)
    table = 128256 * 8192 * 2
    assert weight_bytes_per_gpu(llama, tp=1, pp=2) == pytest.approx((full - 2 * table) / 2 + table, rel=1e-3)
    # FP8: linear layers at one byte, embedding and lm_head BF16
    assert weight_bytes_per_gpu(llama, tp=1, dtype="fp8") == pytest.approx((full - 2 * table) / 2 + 2 * table,
                                                                           rel=1e-3)
    mixtral = load_model_config("Mixtral-8x7B")
    # expert bytes per GPU do not depend on how the TP group is split into expert groups
    assert weight_bytes_per_gpu(mixtral, tp=8, ep=8) == weight_bytes_per_gpu(mixtral, tp=8, ep=1)
    assert "ep 3 must divide tp 8" in shard_problem(mixtral, 8, 3)
    with pytest.raises(WorkloadError, match="dtype"):
        weight_bytes_per_gpu(mixtral, tp=1, dtype="int4")


def test_kv_cache_first_principles():
    llama = load_model_config("Llama-3.1-70B")  # 80 layers, 8 KV heads of 128: 320 KiB per token in BF16
    assert kv_cache_bytes_per_gpu(llama, [16], tp=1) == 16 * 2 * 80 * 8 * 128 * 2
    assert kv_cache_bytes_per_gpu(llama, [17], tp=1) == 2 * kv_cache_bytes_per_gpu(llama, [16], tp=1)  # blocks
    assert kv_cache_bytes_per_gpu(llama, [16], tp=16) == kv_cache_bytes_per_gpu(llama, [16], tp=8)  # replicated


def test_llama_70b_does_not_fit_one_l40s():
    check = check_memory(load_model_config("Llama-3.1-70B"), GPUS.get("L40S"), ARXIV_16, 403, tp=1)
    assert not check.fits
    assert check.weights / 1e9 == pytest.approx(141.1, abs=0.1)  # 70.55 B parameters x 2 bytes
    assert check.available_gb == pytest.approx(GPU_MEMORY_UTILIZATION * 48.3, abs=0.1)
    assert check.smallest_tp == 4  # 141 GB / 4 = 35 GB + KV + activations < 43.5 GB; TP2 (71 GB) cannot
    text = check.message(1)
    assert "does not fit in GPU memory" in text and "163." in text and "43.5 GB" in text and "TP that fits is 4" in text


def test_fitting_deployments():
    qwen = check_memory(load_model_config("Qwen2.5-14B"), GPUS.get("A100"), [3496] * 8, 122, tp=1)
    assert qwen.fits and qwen.smallest_tp == 1 and 29 < qwen.weights / 1e9 < 30
    # Qwen3-235B-A22B in BF16 (470 GB) needs a full 8 x H100 node; in FP8 (~236 GB) 4 x H200 are enough
    big = load_model_config("Qwen3-235B-A22B")
    assert check_memory(big, GPUS.get("H100"), ARXIV_16, 403, tp=4).smallest_tp == 8
    assert check_memory(big, GPUS.get("H200"), ARXIV_16, 403, tp=4, dtype="fp8").fits
    # a batch whose KV cache alone exceeds an 80 GB GPU: 64 x 32k tokens of Llama-3.1-8B = 275 GB
    assert not check_memory(load_model_config("Llama-3.1-8B"), GPUS.get("H100"), [32768] * 64, 2).fits


def test_moe_decode_reads_only_the_routed_experts():
    """A decode step of one token reads the active parameters; a dense model of the same total size reads all."""
    moe = load_model_config("Qwen3-30B-A3B")
    dense_bytes = 2 * parameter_count(moe)
    one_token = weight_bytes_read(moe, tokens=1)
    assert one_token == pytest.approx(2 * 3.35e9, rel=0.01)  # 3.3 B active parameters
    assert one_token / dense_bytes < 0.12
    # balanced routing: 16 tokens x top-8 = 128 slots touch all 128 experts, as much as the dense model
    assert weight_bytes_read(moe, tokens=16) == dense_bytes
    mixtral = load_model_config("Mixtral-8x7B")
    assert weight_bytes_read(mixtral, tokens=1) == pytest.approx(2 * 12.9e9, rel=0.01)
    assert weight_bytes_read(load_model_config("Llama-3.1-70B"), tokens=1) == 2 * parameter_count(
        load_model_config("Llama-3.1-70B"))


def test_moe_prefill_activations_hold_the_routed_token_copies():
    """Mixtral-8x7B (hidden 4096, 32 query / 8 KV heads of 128, 8 experts of width 14336, top 2; vocabulary 32000),
    one prompt of 8192 tokens at TP1: the fused-MoE layer holds every token twice (top 2), each copy with its gate
    and up output (2 x 14336; vLLM's fused_experts writes the hidden output, 4096, into the same buffer once they
    are consumed) and its activated intermediate (14336), more than attention's Q, O, K and V; beside them the
    layer's input and residual (2 x hidden per token), all BF16, plus the last token's FP32 logits."""
    from pipeweave.memory import activation_bytes_per_gpu

    tokens = 8192
    moe_layer = tokens * 2 * (2 * 14336 + 14336)  # 86,016 per token, attention's Q, O, K, V: (2·32 + 2·8)·128 = 10,240
    expected = (2 * tokens * 4096 + moe_layer) * 2 + 32000 * 4
    assert activation_bytes_per_gpu(load_model_config("Mixtral-8x7B"), tokens, 1, tp=1) == expected
    # Two prompts of 40,000 tokens in all at TP2 x EP2: the fused MoE holds one chunk of 32,768 tokens' copies with
    # whole experts (TP2 / EP2 leaves them unsplit); each prompt's last token has the whole vocabulary's FP32 logits
    # on every rank: vLLM V1 all-gathers them, so that every rank samples (half of it before 2026-12-05)
    chunk_layer = 32768 * 2 * (2 * 14336 + 14336)
    expected = (2 * 40000 * 4096 + chunk_layer) * 2 + 2 * 32000 * 4
    assert activation_bytes_per_gpu(load_model_config("Mixtral-8x7B"), 40000, 2, tp=2, ep=2) == expected
    # Qwen3-30B-A3B (hidden 2048, 128 experts of width 768, top 8; 32 query / 4 KV heads of 128): the w2 output (2048)
    # is wider than the w13 output (2 x 768), so the shared buffer is the hidden width; the routed copies beat the
    # attention projections (2 x 32 + 2 x 4) x 128 = 9,216 per token
    qwen = load_model_config("Qwen3-30B-A3B")
    moe_layer = tokens * 8 * (2048 + 768)
    assert activation_bytes_per_gpu(qwen, tokens, 1, tp=1) == (2 * tokens * 2048 + moe_layer) * 2 + qwen.vocab_size * 4


def test_every_measured_run_fits_its_gpu(repo_root):
    """The 28 measured end-to-end runs did run, so the check must not refuse any of them (L40 / A40 / RTX A6000
    with Qwen2.5-14B TP1 are within 5 % of the limit: the allowance is not loose)."""
    import csv

    from pipeweave.aggregate import load_workload
    from pipeweave.memory import config_from_model_params

    runs = list(csv.DictReader((repo_root / "e2e" / "real" / "measured_runs.csv").open()))
    assert len(runs) == 28
    for run in runs:
        pattern = f"{run['model']}_{run['trace']}_*_tp{run['tp']}_pp{run['pp']}.json"
        path = sorted((repo_root / "workload").glob(pattern))[0]
        workload = load_workload(path)
        check = check_memory(config_from_model_params(workload.model_params, workload.model), GPUS.get(run["gpu"]),
                             workload.prompt_lengths, len(workload.phases), tp=workload.tp_size, pp=workload.pp_size)
        assert check.fits, (run["gpu"], path.name, check.required_gb, check.available_gb)


def test_aggregator_refuses_a_workload_that_does_not_fit(tmp_path, repo_root):
    import json
    import subprocess
    import sys

    from pipeweave.workload import build_workload, serialize_workload

    workload = tmp_path / "llama70b_tp1.json"
    workload.write_bytes(serialize_workload(build_workload(load_model_config("Llama-3.1-70B"), ARXIV_16, 2)))
    out = tmp_path / "pred.json"
    run = lambda *extra: subprocess.run([sys.executable, "aggregator.py", "--workload", str(workload),  # noqa: E731
                                         "--hardware", "L40S", "--output", str(out), *extra], cwd=repo_root,
                                        capture_output=True, text=True, timeout=300)
    refused = run()
    assert refused.returncode == 2 and not out.exists()
    assert refused.stderr.startswith("aggregator.py: error: ") and len(refused.stderr.splitlines()) == 1
    needles = ("does not fit in GPU memory", "needs 161.0 GB", "43.5 GB is available", "smallest TP that fits is 4")
    for needle in needles:
        assert needle in refused.stderr
    forced = run("--ignore_memory")
    assert forced.returncode == 0, forced.stderr
    assert "WARNING" in forced.stdout and "--ignore_memory" in forced.stdout
    record = json.loads(out.read_text())["memory_check"]
    assert record["fits"] is False and record["ignored"] is True and record["smallest_tp"] == 4


def test_a_workload_of_decode_steps_alone_is_not_charged_a_prefill(tmp_path):
    """Llama-3.1-8B, 96 requests of 4,000 prompt tokens on H100 (76.4 GB usable): the static batch's prefill of
    384,000 tokens holds 39.4 GB of activations and does not fit, but the same workload's two decode steps alone run
    96 tokens each; their weights (16.1 GB) and KV cache (50.5 GB) fit, and the check charged them that prefill."""
    from pipeweave.aggregate import Job, load_workload, memory_check, workload_memory
    from pipeweave.cli import UserError
    from pipeweave.memory import activation_bytes_per_gpu
    from pipeweave.workload import build_workload

    cfg, h100 = load_model_config("Llama-3.1-8B"), GPUS.get("H100")
    data = build_workload(cfg, [4000] * 96, 3).to_dict()
    (tmp_path / "batch.json").write_text(json.dumps(data))
    (tmp_path / "decode.json").write_text(json.dumps({**data, "iterations": data["iterations"][1:]}))
    with pytest.raises(UserError, match="does not fit in GPU memory at TP 1"):
        memory_check(Job(load_workload(tmp_path / "batch.json"), h100), False, log=None)
    decode = load_workload(tmp_path / "decode.json")
    assert memory_check(Job(decode, h100), False, log=None) is None
    check = workload_memory(decode, h100)
    assert check.activations == activation_bytes_per_gpu(cfg, 96, 96, tp=1)
    assert check.kv_cache == kv_cache_bytes_per_gpu(cfg, [4002] * 96, tp=1)


def test_fp8_on_a_gpu_without_an_fp8_rate_is_refused_for_that_alone(tmp_path):
    """Llama-3.1-70B FP8 at TP 4 on A10 or A30 (no FP8 tensor rate; too large too) was refused with "the smallest TP
    that fits is 8", a fix that would not make it run: the missing FP8 rate is the one reason given, also with
    --ignore_memory (here and in an --hardware all sweep); a GPU with the rate still gets the memory check."""
    from pipeweave.aggregate import Job, load_workload, memory_check
    from pipeweave.cli import UserError
    from pipeweave.workload import build_workload, serialize_workload

    path = tmp_path / "llama70b_fp8_tp4.json"
    path.write_bytes(serialize_workload(build_workload(load_model_config("Llama-3.1-70B"), ARXIV_16, 2, tp=4,
                                                       dtype="fp8")))
    workload = load_workload(path)
    for gpu in ("A10", "A30"):
        for ignore in (False, True):
            with pytest.raises(UserError) as error:
                memory_check(Job(workload, GPUS.get(gpu)), ignore, log=None)
            assert str(error.value) == (f"llama70b_fp8_tp4 on {gpu}: {gpu} has no FP8 tensor-core rate (tcFp8) in its "
                                        f"hardware JSON (add the dense FP8 rate with FP32 accumulation and its source "
                                        f"if the GPU has FP8 tensor cores)")
    with pytest.raises(UserError, match="L4: does not fit in GPU memory at TP 4: .*; the smallest TP that fits is 8"):
        memory_check(Job(workload, GPUS.get("L4")), False, log=None)


# ------------------------------------------------------------------------------------------------
# configs a user writes: what the reader must not get silently wrong
# ------------------------------------------------------------------------------------------------

QWEN3_4B = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 2560, "intermediate_size": 9728,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 36,
            "vocab_size": 151936, "tie_word_embeddings": True}


def test_tied_embeddings_survive_the_workload():
    """Qwen3-4B ties its embeddings: 4.02 B parameters (model card), not the 4.41 B of two tables. The memory check
    of a generated workload (which reads model_params) must count one table, as the config's own check does."""
    from pipeweave.memory import config_from_model_params
    from pipeweave.workload import build_workload

    cfg = model_config_from_dict(QWEN3_4B, "Qwen3-4B")
    assert parameter_count(cfg) == pytest.approx(4.02e9, rel=0.005)
    workload = build_workload(cfg, [4096] * 4, 8)
    assert workload.model_params["tie_word_embeddings"] is True
    rebuilt = config_from_model_params(workload.model_params, cfg.model)
    assert weight_bytes_per_gpu(rebuilt, 1, 1, 1, "bf16") == weight_bytes_per_gpu(cfg, 1, 1, 1, "bf16")
    untied = build_workload(model_config_from_dict({**QWEN3_4B, "tie_word_embeddings": False}), [4096] * 4, 8)
    assert "tie_word_embeddings" not in untied.model_params  # untied workloads keep their bytes


@pytest.mark.parametrize("edit, message", [
    ({"architectures": "LlamaForCausalLM"},
     r"'architectures' must be a non-empty list of names such as \[\"LlamaForCausalLM\"\]"),
    ({"architectures": []}, r"'architectures' must be a non-empty list of names .*, got \[\]"),
    # a third audit: Gemma-2 was refused for its sliding window, and without it for its architecture
    ({"architectures": ["Gemma2ForCausalLM"], "sliding_window": 4096},
     "architecture Gemma2ForCausalLM is not modelled"),
    # a config audit: Gemma-2's own config.json (hidden_act gelu_pytorch_tanh) was refused for its activation, which
    # reads as if a SiLU Gemma-2 were modelled
    ({"architectures": ["Gemma2ForCausalLM"], "sliding_window": 4096, "hidden_act": "gelu_pytorch_tanh",
      "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256},
     "architecture Gemma2ForCausalLM is not modelled"),
    ({"architectures": ["PhiForCausalLM"], "hidden_act": "gelu_new"}, "architecture PhiForCausalLM is not modelled"),
    ({"head_dims": 128}, "unknown key 'head_dims'; did you mean 'head_dim'"),
    # a config audit: a multimodal config without architectures (its language model's keys under text_config) was
    # told only "missing key 'hidden_size'"
    ({"architectures": None, "hidden_size": None, "text_config": {"hidden_size": 5120, "model_type": "mistral"}},
     r"missing key 'hidden_size' \(the config nests its language model's keys under text_config: a multimodal "
     r"model, which is not modelled\)"),
    ({"hiden_size": 2560, "hidden_size": None}, r"missing key 'hidden_size' \(found 'hiden_size': a misspelling"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4}},
     r"quantization_config \(quant_method 'awq'\) is not an FP8 format pipeweave recognises"),
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, "is not an FP8 format"),
    # a config audit: a quantization_config that is not an object was "(quant_method 'fp8') is not an FP8 format
    # pipeweave recognises (fp8, ...)", and one without a quant_method "(quant_method None)"
    ({"quantization_config": "fp8"}, r"^config model: quantization_config must be an object with a quant_method "
                                     r"\(as Hugging Face writes it\), got 'fp8'$"),
    ({"quantization_config": [{"quant_method": "fp8"}]}, "quantization_config must be an object with a quant_method"),
    ({"quantization_config": {"activation_scheme": "static"}}, r"^config model: quantization_config has no "
                                                               r"quant_method \(fp8, awq, gptq, \.\.\.\)"),
    ({"head_dim": 72}, "head_dim 72 is not a head size the attention kernels and their model support"),
    ({"head_dim": None, "hidden_size": 2400, "num_attention_heads": 32, "architectures": ["LlamaForCausalLM"]},
     r"head_dim 75 .* \(hidden_size / num_attention_heads\)"),
])
def test_config_mistakes_are_named(edit, message):
    cfg = {key: value for key, value in {**QWEN3_4B, **edit}.items() if value is not None}
    with pytest.raises(WorkloadError, match=message):
        model_config_from_dict(cfg)


def test_model_type_and_activation_are_read():
    """Without 'architectures', model_type named nothing: a Gemma-2 config was costed as a dense Llama; a GELU MLP
    was costed as SiLU*Mul."""
    bare = {key: value for key, value in QWEN3_4B.items() if key != "architectures"}
    assert model_config_from_dict({**bare, "model_type": "qwen3"}).has_qk_norm
    assert model_config_from_dict({**bare, "model_type": "llama", "hidden_act": "silu"}).architecture == \
        "LlamaForCausalLM"
    with pytest.raises(WorkloadError, match="model_type 'gemma2' is not modelled"):
        model_config_from_dict({**bare, "model_type": "gemma2"})
    with pytest.raises(WorkloadError, match="multi-head latent attention"):
        model_config_from_dict({**bare, "model_type": "deepseek_v3"})
    with pytest.raises(WorkloadError, match="hidden_act 'gelu_pytorch_tanh' is not modelled"):
        model_config_from_dict({**QWEN3_4B, "hidden_act": "gelu_pytorch_tanh"})
    moe = {**bare, "model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8,
           "moe_intermediate_size": 768}
    assert model_config_from_dict(moe).moe.num_experts == 128


def test_missing_kv_heads_mean_multi_head_attention_as_in_transformers():
    """Configs written before grouped-query attention (Llama-2-7B's first release) have no num_key_value_heads;
    transformers reads them as one KV head per query head, and so does pipeweave. A misspelt key is still named."""
    llama = {**QWEN3_4B, "architectures": ["LlamaForCausalLM"]}  # LlamaConfig's reading (Qwen3Config's default: 32)
    cfg = {key: value for key, value in llama.items() if key != "num_key_value_heads"}
    assert model_config_from_dict(cfg).num_key_value_heads == 32
    with pytest.raises(WorkloadError, match=r"missing key 'num_key_value_heads' \(found 'num_key_value_head'"):
        model_config_from_dict({**cfg, "num_key_value_head": 8})


@pytest.mark.parametrize("arch, default", [("MistralForCausalLM", 8), ("MixtralForCausalLM", 8),
                                           ("Qwen2ForCausalLM", 32), ("Qwen3ForCausalLM", 32),
                                           ("Qwen2MoeForCausalLM", 16), ("Qwen3MoeForCausalLM", 4),
                                           ("LlamaForCausalLM", 64)])
def test_a_missing_kv_head_count_is_the_architectures_default(arch, default):
    """A config audit: only LlamaConfig reads a missing num_key_value_heads as one per query head; MistralConfig and
    MixtralConfig default to 8, Qwen2Config and Qwen3Config to 32, Qwen2MoeConfig to 16, Qwen3MoeConfig to 4
    (transformers 4.55), and vLLM serves what the config class says. A hand-written Mistral-7B config without the key
    was costed with 32 KV heads, four times its KV cache. A null one is one per query head, as before."""
    moe = {"MixtralForCausalLM": {"num_local_experts": 8, "num_experts_per_tok": 2},
           "Qwen2MoeForCausalLM": {"num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 1024,
                                   "shared_expert_intermediate_size": 4096},
           "Qwen3MoeForCausalLM": {"num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 1024}}
    cfg = {"architectures": [arch], "hidden_size": 8192, "num_attention_heads": 64, "intermediate_size": 8192,
           "vocab_size": 32000, "num_hidden_layers": 2, "sliding_window": None, **moe.get(arch, {})}
    assert model_config_from_dict(cfg).num_key_value_heads == default
    assert model_config_from_dict({**cfg, "num_key_value_heads": None}).num_key_value_heads == 64
    if default != 64:  # the default that does not divide the heads is named as the default
        with pytest.raises(WorkloadError, match=rf"num_key_value_heads \({default}, {arch}'s default where the "
                                                r"config has no such key"):
            model_config_from_dict({**cfg, "num_attention_heads": 30, "head_dim": 128})


def test_keys_a_config_leaves_out_take_transformers_defaults():
    """A hand-written or trimmed config is read as transformers reads it: Qwen3Config's head_dim is 128 (Qwen3-32B's
    5120 / 64 would give 80, 30.5 B parameters instead of 32.8 B; Qwen3MoeConfig has no default, its model takes
    hidden / heads), a null num_key_value_heads is one per query head, MistralConfig's window is 4096 where the key
    is absent (vLLM applies it), and the Qwen configs leave their window off unless use_sliding_window says so."""
    qwen3 = {key: value for key, value in json_config("Qwen3-32B").items() if key != "head_dim"}
    assert model_config_from_dict(qwen3).head_dim == 128
    qwen3_moe = {key: value for key, value in json_config("Qwen3-30B-A3B").items() if key != "head_dim"}
    assert model_config_from_dict(qwen3_moe).head_dim == 2048 // 32
    assert model_config_from_dict({**QWEN3_4B, "num_key_value_heads": None}).num_key_value_heads == 32
    with pytest.raises(WorkloadError, match=r"sliding-window attention \(sliding_window 4096, MistralForCausalLM's "
                                            r"default where the config has no such key\) is not modelled"):
        model_config_from_dict({**BASE, "architectures": ["MistralForCausalLM"]})
    for arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):  # Qwen2.5-7B's config: sliding_window 131072, no switch
        assert model_config_from_dict({**BASE, "architectures": [arch], "sliding_window": 131072}).moe is None
    with pytest.raises(WorkloadError, match="sliding-window attention"):
        model_config_from_dict({**BASE, "architectures": ["LlamaForCausalLM"], "sliding_window": 4096})
    # a config audit: the switch on without a window key was read as no window, where the Qwen config classes default
    # to 4096 (transformers 4.55), which vLLM applies
    moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256}
    for arch, extra in (("Qwen2ForCausalLM", {}), ("Qwen3ForCausalLM", {}), ("Qwen3MoeForCausalLM", moe),
                        ("Qwen2MoeForCausalLM", {**moe, "shared_expert_intermediate_size": 512})):
        with pytest.raises(WorkloadError, match=rf"sliding-window attention \(sliding_window 4096, {arch}'s default "
                                                r"where the config has no such key\)"):
            model_config_from_dict({**BASE, **extra, "architectures": [arch], "use_sliding_window": True})
        assert model_config_from_dict({**BASE, **extra, "architectures": [arch], "use_sliding_window": True,
                                       "sliding_window": None}).architecture == arch


def test_unquantised_linear_layers_of_an_fp8_checkpoint_are_refused():
    """Meta's Llama-3.1-405B-FP8 keeps every attention projection (and layers 0 and 125's MLP) in BF16
    (fbgemm_fp8's modules_to_not_convert): it was predicted, and memory-checked, as FP8 throughout. Lists that keep
    only lm_head, the embeddings or an MoE router stay FP8 checkpoints."""
    from pipeweave.workload_inputs import names_decoder_linear

    meta = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": [
        "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
        "lm_head"]}
    with pytest.raises(WorkloadError, match=r"^config model: quantization_config.modules_to_not_convert keeps decoder "
                                            r"linear layers in BF16 \(model.layers.0.mlp.down_proj, "
                                            r"model.layers.0.self_attn.q_proj and 1 more\); a mixture of BF16 and "
                                            r"FP8 linear layers is not modelled"):
        model_config_from_dict({**QWEN3_4B, "quantization_config": meta})
    for key in ("ignore", "ignored_layers", "exclude_modules"):
        with pytest.raises(WorkloadError, match=rf"quantization_config.{key} keeps decoder linear layers"):
            model_config_from_dict({**QWEN3_4B, "quantization_config": {"quant_method": "fp8",
                                                                         key: ["re:.*self_attn.*"]}})
    kept = {"quant_method": "fp8", "modules_to_not_convert": ["lm_head", "model.embed_tokens", "re:.*mlp.gate$"]}
    assert model_config_from_dict({**QWEN3_4B, "quantization_config": kept}).checkpoint_dtype == "fp8"
    assert [names_decoder_linear(name) for name in (
        "model.layers.3", "model.layers.0.mlp", "model.layers.2.block_sparse_moe.experts.1.w2", "layers.7.mlp.gate",
        "lm_head", "re:.*mlp.gate$", "model.layers.0.mlp.shared_expert_gate")] == [
        True, True, True, False, False, False, False]
    with pytest.raises(WorkloadError, match=r"quantization_config.ignore must be a list of module names, "
                                            r"got 'lm_head'"):
        model_config_from_dict({**QWEN3_4B, "quantization_config": {"quant_method": "fp8", "ignore": "lm_head"}})


@pytest.mark.parametrize("groups, field", [
    ({"g": "x"}, r"config_groups.g must be an object, got 'x'"),
    ({"g": {"weights": "fp8"}}, r"config_groups.g.weights must be an object, got 'fp8'"),
    ({"g": {"weights": {"num_bits": 8, "type": "float"}, "input_activations": 8}},
     r"config_groups.g.input_activations must be an object, got 8"),
    (["g"], r"config_groups must be an object of quantisation groups"),
])
def test_a_malformed_compressed_tensors_group_is_one_error(groups, field):
    """An AttributeError traceback before."""
    with pytest.raises(WorkloadError, match=rf"^config model: quantization_config.{field}"):
        model_config_from_dict({**QWEN3_4B, "quantization_config": {"quant_method": "compressed-tensors",
                                                                     "config_groups": groups}})


def test_real_hf_keys_next_to_read_ones_are_not_misspellings():
    """Keys of real configs that extend a key the reader uses are not taken for typos."""
    cfg = model_config_from_dict({**QWEN3_4B, "v_head_dim": 128, "swa_num_key_value_heads": 4,
                                  "moe_shared_expert_intermediate_size": 0, "rope_theta": 1e6, "hidden_act": "silu"})
    assert cfg.head_dim == 128


@pytest.mark.parametrize("quantization", [
    {"quant_method": "fp8", "fmt": "e4m3"},
    {"quant_method": "FP8", "activation_scheme": "static"},  # vLLM lower-cases the method (was refused)
    {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0},  # meta-llama/Llama-3.1-405B-Instruct-FP8
    {"quant_method": "modelopt", "quant_algo": "FP8"},  # nvidia/*-FP8
    {"quant_method": "compressed-tensors", "config_groups": {"group_0": {  # RedHatAI/*-FP8-dynamic
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}},
])
def test_fp8_checkpoint_formats_are_recognised(quantization):
    assert model_config_from_dict({**QWEN3_4B, "quantization_config": quantization}).checkpoint_dtype == "fp8"


def test_fp8_moe_checkpoint_is_told_the_one_fix_that_works():
    from pipeweave.workload import build_workload

    moe = model_config_from_dict({**json_config("Qwen3-30B-A3B"), "quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(WorkloadError, match="FP8 mixture-of-experts layers are not modelled: remove quantization"):
        build_workload(moe, [512], 4)
    # Qwen's own FP8 MoE checkpoints are block-scaled: the message said to drop the block size for per-tensor FP8,
    # which then met the refusal above
    block = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    with pytest.raises(WorkloadError, match=r"block-scaled FP8 \(weight_block_size \[128, 128\]\), and FP8 "
                                            r"mixture-of-experts layers are not modelled: remove the quantization"):
        model_config_from_dict({**json_config("Qwen3-30B-A3B"), "quantization_config": block})
    # asked for as FP8, the same fix (it said "use --dtype bf16", which the first check then refuses)
    with pytest.raises(WorkloadError, match="not modelled .*; remove quantization_config to predict its BF16 version"):
        build_workload(moe, [512], 4, dtype="fp8")


def test_architecture_not_the_checkpoint_path_decides_qk_norm():
    local = model_config_from_dict({**QWEN3_4B, "_name_or_path": "/ckpt/sft-run-7"})
    assert local.model == "/ckpt/sft-run-7" and local.has_qk_norm
    assert not model_config_from_dict({**QWEN3_4B, "architectures": ["LlamaForCausalLM"],
                                       "_name_or_path": "me/Qwen3-distilled-llama"}).has_qk_norm


def json_config(stem: str) -> dict:
    import json

    from pipeweave.paths import DEFAULT_CONFIG_DIR
    return json.loads((DEFAULT_CONFIG_DIR / f"{stem}.json").read_text())


def test_fp8_checkpoint_and_context_limit_reach_the_workload():
    from pipeweave.workload import build_workload

    fp8 = model_config_from_dict({**QWEN3_4B, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}})
    with pytest.raises(WorkloadError, match="is an FP8 checkpoint.*--dtype fp8"):
        build_workload(fp8, [512], 4)
    assert build_workload(fp8, [512], 4, dtype="fp8").dtype == "fp8"
    short = model_config_from_dict({**QWEN3_4B, "max_position_embeddings": 4096})
    with pytest.raises(WorkloadError, match=r"\(4090 prompt \+ 8 output tokens\) exceeds max_position_embeddings 4096"):
        build_workload(short, [100, 4090], 8)
    build_workload(short, [4088], 8)  # exactly the limit
    # rope scaling extends the context as vLLM sizes it (its _get_and_verify_max_len): a yarn factor 4 over 4096
    scaled = model_config_from_dict({**QWEN3_4B, "max_position_embeddings": 4096,
                                     "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    build_workload(scaled, [16000], 8)
    with pytest.raises(WorkloadError, match=r"exceeds the length its yarn rope scaling gives .* 16384"):
        build_workload(scaled, [16380], 8)  # used to take any length, 500,000 tokens included
    v5 = {**QWEN3_4B, "max_position_embeddings": 4096}  # transformers 5 writes rope_parameters in every config
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    assert model_config_from_dict({**v5, "rope_parameters": yarn}).max_sequence == 8192
    for unscaled in ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                     {"rope_scaling": {"rope_type": "default"}}, {"rope_scaling": None}):
        with pytest.raises(WorkloadError, match="exceeds max_position_embeddings 4096"):
            build_workload(model_config_from_dict({**v5, **unscaled}), [8192], 8)
    build_workload(model_config_from_dict({**v5, "rope_scaling": {"type": "linear", "factor": 2.0}}), [8000], 8)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert model_config_from_dict({**v5, "max_position_embeddings": 131072, "rope_scaling": llama3}).max_sequence \
        == 131072  # llama3's max_position_embeddings already is the extended length
    assert model_config_from_dict({**v5, "rope_scaling": {"rope_type": "dynamic"}}).max_sequence is None
    # a config audit: a rope scaling of the wrong type (transformers cannot read it) silently turned the length check
    # off, as a scaling without a factor does
    for key in ("rope_scaling", "rope_parameters"):
        for bad in ("llama3", [8.0], {"type": "linear", "factor": "2"}, {"rope_type": "yarn", "factor": 0},
                    {"rope_type": "yarn", "factor": True}):
            for config in ({**v5, key: bad}, {**QWEN3_4B, key: bad}):  # with and without max_position_embeddings
                with pytest.raises(WorkloadError, match=rf"^config model: {key}[ .]"):
                    model_config_from_dict(config)


def test_tensor_parallel_layouts_vllm_refuses():
    from pipeweave.workload import RankShapes

    three_kv = model_config_from_dict({**QWEN3_4B, "num_attention_heads": 24, "num_key_value_heads": 3,
                                       "intermediate_size": 9216})
    with pytest.raises(WorkloadError, match=r"num_key_value_heads \(3\) neither divides over tp 8 nor is replicated "
                                            r"by it .*TP sizes up to 64 that fit the heads: 1, 3, 6, 12, 24\)$"):
        RankShapes.of(three_kv, 8)
    # a third audit: 3 KV heads at TP 2 named only 1 and 3, though TP 6 replicates each head over two ranks
    with pytest.raises(WorkloadError, match=r"fit the heads: 1, 3, 6, 12, 24\)$"):
        RankShapes.of(three_kv, 2)
    assert RankShapes.of(three_kv, 6).nkv == 1
    assert RankShapes.of(three_kv, 3).nkv == 1  # each rank one of the three KV heads
    assert RankShapes.of(model_config_from_dict(QWEN3_4B), 16).nkv == 1  # 8 KV heads, each on two ranks
    seven = model_config_from_dict({**QWEN3_4B, "num_attention_heads": 28, "num_key_value_heads": 4})
    with pytest.raises(WorkloadError, match=r"num_attention_heads \(28\) is not divisible by tp 8 \(TP sizes up to "
                                            r"64 that divide it: 1, 2, 4, 7, 14, 28\)"):
        RankShapes.of(seven, 8)
    qwen2_moe = model_config_from_dict({  # Qwen1.5-MoE-A2.7B's layout with a 5640-wide shared expert
        "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
        "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24, "vocab_size": 151936,
        "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5640})
    with pytest.raises(WorkloadError, match=r"^shared_expert_intermediate_size \(5640\) is not divisible by tp 16"):
        RankShapes.of(qwen2_moe, 16)


def test_quantisation_beside_config_json_and_fp8_variants_are_not_predicted_as_bf16_or_w8a8(tmp_path):
    """Only config.json was read: an NVFP4 checkpoint exported by ModelOpt 0.29 (hf_quant_config.json beside it) or an
    old AWQ / GPTQ one was predicted as BF16, 3.3x its weights; block-scaled FP8 (Qwen3's official FP8 checkpoints,
    DeepSeek) and weight-only FP8 were predicted as the per-tensor W8A8 kernels the FP8 model was trained on."""
    from pipeweave.workload_inputs import load_model_config

    beside = "beside its config.json .quant_method"
    for sidecar, content, message in (
            ("hf_quant_config.json", {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}},
             f"hf_quant_config.json {beside} 'modelopt', quant_algo 'NVFP4'. is not an FP8 format"),
            ("quant_config.json", {"w_bit": 4, "q_group_size": 128}, f"quant_config.json {beside} 'awq'"),
            ("quantize_config.json", {"bits": 4, "group_size": 128}, f"quantize_config.json {beside} 'gptq'")):
        folder = tmp_path / sidecar.split(".")[0]
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(QWEN3_4B))
        (folder / sidecar).write_text(json.dumps(content))
        with pytest.raises(WorkloadError, match=message):
            load_model_config(folder)
    fp8 = tmp_path / "modelopt_fp8"
    fp8.mkdir()
    (fp8 / "config.json").write_text(json.dumps(QWEN3_4B))
    (fp8 / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    assert load_model_config(fp8).checkpoint_dtype == "fp8"
    from pipeweave.workload import build_workload  # the fix names the file, config.json has no quantization_config
    with pytest.raises(WorkloadError, match="checkpoint .hf_quant_config.json beside its config.json.: generate it "
                                            "with --dtype fp8, or remove hf_quant_config.json"):
        build_workload(load_model_config(fp8), [64], 2)
    block = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    with pytest.raises(WorkloadError, match=r"block-scaled FP8 \(weight_block_size \[128, 128\]\)"):
        model_config_from_dict({**QWEN3_4B, "quantization_config": block})
    weight_only = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "input_activations": None}}}
    with pytest.raises(WorkloadError, match="FP8 weights with BF16 activations"):
        model_config_from_dict({**QWEN3_4B, "quantization_config": weight_only})
    w8a8 = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}}
    assert model_config_from_dict({**QWEN3_4B, "quantization_config": w8a8}).checkpoint_dtype == "fp8"


def test_a_malformed_modelopt_file_beside_a_config_is_one_error(tmp_path):
    from pipeweave.workload_inputs import load_model_config

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": "FP8"}))
    with pytest.raises(WorkloadError, match="hf_quant_config.json beside its config.json .quant_method 'modelopt'"):
        load_model_config(tmp_path)


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "intermediate_size", "vocab_size", "num_hidden_layers", "num_experts",
                                 "num_experts_per_tok", "moe_intermediate_size"])
def test_a_workloads_model_params_of_size_zero_are_refused(key):
    """A user audit (2026-12-05): num_key_value_heads 0 raised ZeroDivisionError; hidden_size, num_hidden_layers or
    head_dim 0 let the memory check pass on 0 GB of weights or KV cache. A shared expert of width 0 is no shared
    expert (Qwen3-MoE)."""
    from pipeweave.memory import config_from_model_params

    params = load_model_config("Qwen3-30B-A3B").model_params()
    assert config_from_model_params(params).moe.shared_expert_intermediate_size == 0
    with pytest.raises(WorkloadError, match=rf"^model_params.{key} must be a positive integer, got 0$"):
        config_from_model_params({**params, key: 0})


def test_a_workloads_query_heads_must_group_over_its_kv_heads():
    from pipeweave.memory import config_from_model_params

    params = load_model_config("Llama-3.1-8B").model_params()
    with pytest.raises(WorkloadError, match=r"^model_params.num_attention_heads 32 is not a multiple of "
                                            r"model_params.num_key_value_heads 5"):
        config_from_model_params({**params, "num_key_value_heads": 5})


def test_requests_times_iterations_are_bounded():
    """256 requests x 65,536 output tokens passed both separate limits, wrote a 1.1 GB workload and took 8.4 GB of
    memory; 1,024 of them died with a MemoryError traceback."""
    from pipeweave.workload import build_workload

    with pytest.raises(WorkloadError, match=r"256 requests x output_tokens = 65536 is 16,777,216 request-iterations, "
                                            r"above the limit 4,194,304"):
        build_workload(load_model_config("Llama-3.1-8B"), [16] * 256, 65536)


@pytest.mark.parametrize("key, value", [("hidden_size", 10**12), ("num_hidden_layers", 10**9), ("vocab_size", 10**9),
                                        ("num_key_value_heads", 4096), ("num_experts", 10**9)])
def test_oversized_config_values_are_named_by_their_config_key(key, value):
    """They were refused as the workload field they became (GemmOp('qkv_proj').K, GemmOp('router').N)."""
    with pytest.raises(WorkloadError, match=rf"^config model: {key} = {value} exceeds the limit "):
        model_config_from_dict({**json_config("Qwen3-30B-A3B"), key: value})


@pytest.mark.parametrize("kwargs, message", [
    ({"pp": -1}, "pp must be a positive integer, got -1"),
    ({"pp": 200}, "pp 200 exceeds the 80 layers of Llama-3.1-70B"),
    ({"tp": 0}, "tp must be a positive integer, got 0"),
    ({"prompt_tokens": [-10_000_000]}, "prompt_tokens must be a positive integer, got -10000000"),
    ({"output_tokens": 0}, "output_tokens must be a positive integer, got 0"),
])
def test_check_memory_refuses_sizes_no_deployment_has(kwargs, message):
    """check_memory is offered to other tools: pp=-1 returned a negative requirement that "fits", tp=0 raised
    ZeroDivisionError (the command lines check their flags first)."""
    from pipeweave.serving.kv_cache import kv_cache_blocks

    arguments = {"prompt_tokens": [100], "output_tokens": 10, **kwargs}
    with pytest.raises(WorkloadError, match=re.escape(message)):
        check_memory(load_model_config("Llama-3.1-70B"), load_hardware("H100"), **arguments)
    layout = {k: v for k, v in kwargs.items() if k in ("tp", "pp")}
    if layout:
        with pytest.raises(WorkloadError, match=re.escape(message)):
            kv_cache_blocks(load_model_config("Llama-3.1-70B"), 80 * 2**30, layout.get("tp", 1), layout.get("pp", 1),
                            8192, 1024)


def test_kv_blocks_of_another_block_size_hold_their_own_tokens():
    from pipeweave.serving.kv_cache import kv_cache_blocks

    cfg = load_model_config("Llama-3.1-8B")
    sixteen = kv_cache_blocks(cfg, 80 * 2**30, 1, 1, 8192, 1024)
    assert kv_cache_blocks(cfg, 80 * 2**30, 1, 1, 8192, 1024, block_size=8) in (2 * sixteen, 2 * sixteen + 1)


def test_a_misspelt_model_params_key_is_named_not_ignored():
    from pipeweave.memory import config_from_model_params

    params = load_model_config("Llama-3.1-8B").model_params()
    assert config_from_model_params(params).num_hidden_layers == 32
    with pytest.raises(WorkloadError, match="model_params: unknown key 'tie_word_embedding'; did you mean "
                                            "'tie_word_embeddings'"):
        config_from_model_params({**params, "tie_word_embedding": True})
