"""Workload generator (docs/METHOD.md section 6): byte identity with the artifact, committed files, facts, errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeweave.generate import PAPER_SET, WorkloadSpec, generate, generate_many, paper_set_names
from pipeweave.workload import (DEFAULT_CONFIG_DIR, DEFAULT_OUTPUT_DIR, DEFAULT_TRACE_DIR, WorkloadError, build_workload,
                                format_trace, load_model_config, load_trace, model_config_from_dict, parse_trace)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PIPEWEAVE_SHARED_DATA", REPO.parent / "shared" / "data"))
REFERENCE_DIR = SHARED / "pipeweave" / "workload" / "reference"
SHARED_TRACES = SHARED / "pipeweave" / "workload" / "traces"
SHARED_CONFIGS = SHARED / "pipeweave" / "config"
PAPER_NAMES = paper_set_names()
TRACE_NAMES = ("arxiv_8", "arxiv_12", "arxiv_16", "arxiv_32", "splitwise_32", "splitwise_48", "splitwise_64",
               "splitwise_72", "vllm_arxiv16", "vllm_splitwise64")
CLI = [sys.executable, "workload_generator.py"]


def _need(path: Path) -> None:
    if not path.is_dir():
        pytest.skip(f"shared PipeWeave data not found at {path} (set PIPEWEAVE_SHARED_DATA to the shared/data folder)")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------------------------------
# (a) 25/25 byte identity with the artifact's workload files
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def paper_dir(tmp_path_factory) -> Path:
    """The paper set generated through the CLI (from the repository root) into a fresh folder."""
    out = tmp_path_factory.mktemp("paper_set")
    result = _cli("--paper_set", "--output_dir", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return out


def test_paper_set_has_25_distinct_files():
    assert len(PAPER_SET) == 25
    assert len(set(PAPER_NAMES)) == 25


@pytest.mark.data
def test_paper_set_matches_reference_listing():
    _need(REFERENCE_DIR)
    assert sorted(PAPER_NAMES) == sorted(p.name for p in REFERENCE_DIR.glob("*.json"))


@pytest.mark.data
@pytest.mark.parametrize("name", PAPER_NAMES)
def test_byte_identical_to_reference(name, paper_dir):
    _need(REFERENCE_DIR)
    reference = REFERENCE_DIR / name
    assert reference.is_file(), f"{name} missing from {REFERENCE_DIR}"
    assert (paper_dir / name).read_bytes() == reference.read_bytes()


@pytest.mark.data
def test_artifact_inputs_give_identical_workloads():
    """The generator also reads the artifact's own configs and trace format (CRLF, num_prefill_tokens...)."""
    _need(SHARED_TRACES)
    _need(SHARED_CONFIGS)
    ours = generate_many(PAPER_SET)
    theirs = generate_many(PAPER_SET, config_dir=SHARED_CONFIGS, trace_dir=SHARED_TRACES)
    assert [w.file_name for w in ours] == [w.file_name for w in theirs]
    for a, b in zip(ours, theirs):
        assert a.content == b.content, a.file_name


# ------------------------------------------------------------------------------------------------
# Traces and configs agree with the artifact
# ------------------------------------------------------------------------------------------------

@pytest.mark.data
@pytest.mark.parametrize("name", TRACE_NAMES)
def test_trace_agrees_with_artifact(name):
    _need(SHARED_TRACES)
    ours = load_trace(name)
    theirs = load_trace(SHARED_TRACES / f"{name}.csv")
    assert (ours.prompt_tokens, ours.decode_tokens, ours.output_tokens) == (
        theirs.prompt_tokens, theirs.decode_tokens, theirs.output_tokens)


@pytest.mark.data
def test_make_traces_reproduces_committed_csvs(tmp_path):
    _need(SHARED_TRACES)
    result = subprocess.run([sys.executable, "workload/traces/make_traces.py", "--source", str(SHARED_TRACES),
                             "--dest", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in TRACE_NAMES:
        assert (tmp_path / f"{name}.csv").read_bytes() == (DEFAULT_TRACE_DIR / f"{name}.csv").read_bytes(), name


def test_make_traces_accepts_own_format(tmp_path):
    """Round trip: converting our own CSVs gives the same bytes (no shared data needed)."""
    result = subprocess.run([sys.executable, "workload/traces/make_traces.py", "--source", str(DEFAULT_TRACE_DIR),
                             "--dest", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in TRACE_NAMES:
        assert (tmp_path / f"{name}.csv").read_bytes() == (DEFAULT_TRACE_DIR / f"{name}.csv").read_bytes(), name


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_committed_trace_is_canonical(name):
    path = DEFAULT_TRACE_DIR / f"{name}.csv"
    assert path.read_text(encoding="ascii") == format_trace(load_trace(name))


@pytest.mark.data
def test_configs_agree_with_artifact():
    _need(SHARED_CONFIGS)
    shared = sorted(SHARED_CONFIGS.glob("*.json"))
    assert len(shared) == 9
    for path in shared:  # the artifact's nine (request length limits included); the MoE configs are our own
        assert load_model_config(DEFAULT_CONFIG_DIR / path.name) == load_model_config(path)


# ------------------------------------------------------------------------------------------------
# (b) committed workload/*.json are exactly what the generator produces
# ------------------------------------------------------------------------------------------------

def test_committed_workloads_are_generator_output():
    generated = {w.file_name: w.content for w in generate_many(PAPER_SET)}
    committed = {p.name for p in DEFAULT_OUTPUT_DIR.glob("*.json")}
    assert committed == set(generated), \
        "workload/ should hold exactly the paper set (python3 workload_generator.py --paper_set)"
    for name, content in generated.items():
        assert (DEFAULT_OUTPUT_DIR / name).read_bytes() == content, name


# ------------------------------------------------------------------------------------------------
# (c) docs/METHOD.md facts: section 2 configs, section 6.1 traces, Appendix A.15
# ------------------------------------------------------------------------------------------------

MODELS = {  # stem: (architecture, H, nh, nkv, hd, I, V, L)  -- docs/METHOD.md section 2
    "Llama-3-8B": ("LlamaForCausalLM", 4096, 32, 8, 128, 14336, 128256, 32),
    "Llama-3.1-8B": ("LlamaForCausalLM", 4096, 32, 8, 128, 14336, 128256, 32),
    "Llama-3-70B": ("LlamaForCausalLM", 8192, 64, 8, 128, 28672, 128256, 80),
    "Llama-3.1-70B": ("LlamaForCausalLM", 8192, 64, 8, 128, 28672, 128256, 80),
    "Qwen2-72B": ("Qwen2ForCausalLM", 8192, 64, 8, 128, 29568, 152064, 80),
    "Qwen2.5-14B": ("Qwen2ForCausalLM", 5120, 40, 8, 128, 13824, 152064, 48),
    "Qwen2.5-32B": ("Qwen2ForCausalLM", 5120, 40, 8, 128, 27648, 152064, 64),
    "Qwen3-14B": ("Qwen3ForCausalLM", 5120, 40, 8, 128, 17408, 151936, 40),
    "Qwen3-32B": ("Qwen3ForCausalLM", 5120, 64, 8, 128, 25600, 151936, 64),
}


@pytest.mark.parametrize("stem", sorted(MODELS))
def test_model_configs(stem):
    cfg = load_model_config(stem)
    assert (cfg.model, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers) == MODELS[stem]
    raw = json.loads((DEFAULT_CONFIG_DIR / f"{stem}.json").read_text())
    assert raw["name"] == stem and "_name_or_path" not in raw and raw["provenance"]
    assert ("head_dim" in raw) == stem.startswith("Qwen3")


TRACES = {  # name: (requests, sum of prompts, output_tokens)  -- docs/METHOD.md section 6.1
    "arxiv_8": (8, 27966, 122), "arxiv_12": (12, 32350, 182), "arxiv_16": (16, 35152, 41),
    "arxiv_32": (32, 89471, 68), "splitwise_32": (32, 33950, 48), "splitwise_48": (48, 16266, 143),
    "splitwise_64": (64, 60296, 18), "splitwise_72": (72, 84891, 18), "vllm_arxiv16": (16, 35152, 403),
    "vllm_splitwise64": (64, 57664, 169),
}


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_trace_facts(name):
    trace = load_trace(name)
    assert (trace.num_requests, sum(trace.prompt_tokens), trace.output_tokens) == TRACES[name]
    if name == "vllm_arxiv16":
        assert set(trace.prompt_tokens) == {2197} and set(trace.decode_tokens) == {403}
    if name == "vllm_splitwise64":
        assert set(trace.prompt_tokens) == {901} and set(trace.decode_tokens) == {169}


def _gemms(iteration):
    return {g["name"]: (g["M"], g["N"], g["K"], g["count"]) for g in iteration["operators"]["gemm"]}


def test_appendix_a15_llama70b_arxiv16_tp4():
    cfg = load_model_config("Llama-3.1-70B")
    trace = load_trace("arxiv_16")
    wl = build_workload(cfg, trace.prompt_tokens, trace.output_tokens, tp=4, pp=1, lm_head="replicated").to_dict()
    its = wl["iterations"]
    assert len(its) == 41 and [it["iteration"] for it in its] == list(range(1, 42))
    pre = its[0]
    assert pre["phase"] == "prefill" and pre["num_tokens"] == 35152 and pre["batch_size"] == 16
    assert [g["name"] for g in pre["operators"]["gemm"]] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj",
                                                            "lm_head"]
    assert _gemms(pre) == {
        "qkv_proj": (35152, 2560, 8192, 80), "o_proj": (35152, 8192, 2048, 80),
        "gate_up_proj": (35152, 14336, 8192, 80), "down_proj": (35152, 8192, 7168, 80),
        "lm_head": (16, 128256, 8192, 1)}
    attn = pre["operators"]["attention"]
    assert (attn["attention_type"], attn["nh"], attn["nkv"], attn["hd"], attn["count"]) == (
        "fa3_ragged", 16, 2, 128, 80)
    assert attn["q_lengths"] == attn["kv_lengths"] == list(trace.prompt_tokens)
    assert pre["operators"]["rmsnorm"] == {"seq": 35152, "dim": 8192, "count": 161}
    assert pre["operators"]["siluandmul"] == {"seq": 35152, "dim": 14336, "count": 80}
    assert pre["operators"]["communication"] == [
        {"name": "all_reduce", "type": "collective", "volume_bytes": 575930368, "count": 160}]
    last = its[-1]
    assert last["phase"] == "decode" and last["iteration"] == 41 and last["num_tokens"] == 16
    assert last["q_lengths"] == [1] * 16
    assert last["kv_lengths"] == [p + 40 for p in trace.prompt_tokens]
    assert last["kv_lengths"][0] == 3886 and trace.prompt_tokens[0] == 3846
    assert last["operators"]["attention"]["attention_type"] == "fa2_paged"
    assert _gemms(last)["lm_head"] == (16, 128256, 8192, 1)

    wl2 = build_workload(cfg, trace.prompt_tokens, trace.output_tokens, tp=4, pp=2, lm_head="replicated")
    assert [op.kind for op in wl2.iterations[0].communication] == ["all_reduce", "send_recv"]
    wl2 = wl2.to_dict()
    assert wl2["iterations"][0]["operators"]["communication"][1] == {
        "name": "send_recv", "type": "p2p", "volume_bytes": 1151860736, "count": 1}
    assert all(len(it["operators"]["communication"]) == 2 for it in wl2["iterations"])


def test_lm_head_is_vocabulary_parallel_with_a_gather_of_the_logits():
    """vLLM's ParallelLMHead: each TP rank the logits of 1/TP of the vocabulary padded to a multiple of 64, then one
    all-gather of every sequence's logits (BF16); the artifact's files give every rank the whole vocabulary."""
    cfg = load_model_config("Llama-3.1-70B")
    decode = build_workload(cfg, [100] * 16, 2, tp=8).iterations[1]
    assert _gemms(decode.to_dict())["lm_head"] == (16, 128256 // 8, 8192, 1)
    assert [c.to_dict() for c in decode.communication] == [  # 2 per layer + the vocabulary-parallel embedding's
        {"name": "all_reduce", "type": "collective", "volume_bytes": 16 * 8192 * 2, "count": 161},
        {"name": "logits_all_gather", "type": "all_gather", "volume_bytes": 16 * 128256 * 2, "count": 1}]
    assert [c.kind for c in decode.communication] == ["all_reduce", "all_gather"]
    prefill = build_workload(cfg, [100] * 16, 1, tp=4, pp=2).iterations[0]  # the logits of each sequence's last token
    assert [(c.name, c.volume_bytes) for c in prefill.communication][1:] == [
        ("logits_all_gather", 16 * 128256 * 2), ("send_recv", 2 * 1600 * 8192 * 2)]
    replicated = build_workload(cfg, [100] * 16, 2, tp=8, lm_head="replicated").iterations[1]
    assert _gemms(replicated.to_dict())["lm_head"] == (16, 128256, 8192, 1)
    assert [(c.name, c.count) for c in replicated.communication] == [("all_reduce", 160)]
    odd = model_config_from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 50257,
                                  "num_hidden_layers": 2}, "odd")
    one = build_workload(odd, [3], 2).iterations[1]
    assert _gemms(one.to_dict())["lm_head"] == (1, 50304, 64, 1) and one.communication == []  # padded, no gather
    assert _gemms(build_workload(odd, [3], 2, tp=2).iterations[1].to_dict())["lm_head"] == (1, 25152, 64, 1)
    assert _gemms(build_workload(odd, [3], 2, lm_head="replicated").iterations[1].to_dict())["lm_head"] == (
        1, 50257, 64, 1)
    with pytest.raises(WorkloadError, match="lm_head must be one of vocab_parallel, replicated"):
        build_workload(odd, [3], 2, lm_head="sharded")
    five = model_config_from_dict({"architectures": ["LlamaForCausalLM"], "hidden_size": 80, "num_attention_heads": 5,
                                   "num_key_value_heads": 5, "intermediate_size": 160, "vocab_size": 50257,
                                   "num_hidden_layers": 2}, "five")
    with pytest.raises(WorkloadError, match=r"vocab_size \(50257, padded to 50304 as vLLM does\) is not divisible "
                                            r"by tp 5"):
        build_workload(five, [3], 2, tp=5)
    assert _gemms(build_workload(five, [3], 2, tp=5, lm_head="replicated").iterations[1].to_dict())["lm_head"] == (
        1, 50257, 80, 1)


def test_the_paper_set_in_vllms_layout_goes_to_another_folder(tmp_path):
    """The paper's runs predicted with vLLM's lm_head (README "Workload generator"): --paper_set --lm_head vocab_parallel writes
    the 25 workloads under their names into another folder, and the batch scripts read that folder."""
    from pipeweave.cli import UserError
    from pipeweave.generate_cli import main

    with pytest.raises(UserError, match="would replace the paper's workloads"):
        main(["--paper_set", "--lm_head", "vocab_parallel"])
    assert main(["--paper_set", "--lm_head", "vocab_parallel", "--output_dir", str(tmp_path / "vllm")]) == 0
    assert main(["--paper_set", "--lm_head", "replicated", "--output_dir", str(tmp_path / "paper")]) == 0
    assert sorted(p.name for p in (tmp_path / "vllm").iterdir()) == sorted(PAPER_NAMES)
    for name in PAPER_NAMES:
        assert (tmp_path / "paper" / name).read_bytes() == (DEFAULT_OUTPUT_DIR / name).read_bytes(), name
    tp8 = json.loads((tmp_path / "vllm" / "Llama-3.1-70B_arxiv_16_fa3_tp8_pp1.json").read_text())
    decode = tp8["iterations"][1]["operators"]
    assert _gemms(tp8["iterations"][1])["lm_head"] == (16, 128256 // 8, 8192, 1)
    assert [c["name"] for c in decode["communication"]] == ["all_reduce", "logits_all_gather"]
    missing = subprocess.run(["bash", "tp4.sh"], cwd=REPO, capture_output=True, text=True,
                             env={**os.environ, "PIPEWEAVE_WORKLOAD_DIR": str(tmp_path / "none")})
    assert missing.returncode == 2 and "give PIPEWEAVE_PRED_DIR too" in missing.stderr  # not e2e/pipeweave_pred
    missing = subprocess.run(["bash", str(REPO / "tp4.sh")], cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "PIPEWEAVE_WORKLOAD_DIR": "none", "PIPEWEAVE_PRED_DIR": "pred"})
    assert missing.returncode == 2 and f"--output_dir '{tmp_path / 'none'}'" in missing.stderr  # from where it started
    assert not (tmp_path / "none").exists() and not (tmp_path / "pred").exists()


def test_qk_norm_variant_and_tp1_has_no_communication():
    cfg = load_model_config("Qwen3-32B")
    def rmsnorm_count(**kw):
        return build_workload(cfg, [5], 1, tp=2, **kw).iterations[0].rmsnorm.count

    assert rmsnorm_count(qk_norm_rmsnorm=True) == 257
    assert rmsnorm_count() == 129
    assert build_workload(load_model_config("Qwen2.5-14B"), [5], 2).iterations[1].communication == []


def test_kv_heads_replicated_when_fewer_than_tp():
    first = build_workload(load_model_config("Llama-3.1-70B"), [10], 1, tp=16).iterations[0]
    assert (first.attention.nh, first.attention.nkv) == (4, 1)  # one replicated KV head per rank
    # each rank's q heads plus its replicated K and V head (the artifact divided (64 + 2 * 8) * 128 by 16: 640)
    assert first.gemm[0].N == (4 + 2 * 1) * 128
    assert build_workload(load_model_config("Llama-3.1-70B"), [10], 1, tp=8).iterations[0].gemm[0].N == (
        (64 + 2 * 8) * 128 // 8)  # without replication the two agree


def test_single_sequence_and_overrides():
    w = generate(WorkloadSpec("Qwen2.5-14B", "splitwise_32", tp=1, single_sequence=True, prompt_tokens=32720,
                              name="vllm_s32"))
    assert w.file_name == "Qwen2.5-14B_vllm_s32_fa3_tp1_pp1.json"
    data = json.loads(w.content)
    assert len(data["iterations"]) == 48 and data["iterations"][0]["q_lengths"] == [32720]
    assert data["iterations"][-1]["kv_lengths"] == [32720 + 47]
    w = generate(WorkloadSpec("Qwen2.5-14B", "arxiv_8", single_sequence=True, output_tokens=3))
    data = json.loads(w.content)
    assert w.file_name == "Qwen2.5-14B_arxiv_8_single_o3_fa3_tp1_pp1.json"  # not the trace's own workload's name
    assert len(data["iterations"]) == 3 and data["iterations"][0]["kv_lengths"] == [27966]


def test_serialization_format():
    content = generate(WorkloadSpec("Qwen2.5-14B", "arxiv_8", output_tokens=2)).content
    text = content.decode("ascii")
    assert not text.endswith("\n") and text.startswith('{\n  "model": "Qwen2ForCausalLM",\n')
    assert '"communication": []' in text and not any(line.endswith(" ") for line in text.splitlines())


# ------------------------------------------------------------------------------------------------
# (d) errors
# ------------------------------------------------------------------------------------------------

def test_tp_not_dividing_heads_names_the_field():
    with pytest.raises(WorkloadError, match="num_attention_heads"):
        build_workload(load_model_config("Qwen2.5-14B"), [10], 1, tp=3)
    cfg = model_config_from_dict({"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 6,
                                  "intermediate_size": 1024, "vocab_size": 100, "num_hidden_layers": 2})
    with pytest.raises(WorkloadError, match="num_key_value_heads"):
        build_workload(cfg, [10], 1, tp=4)
    # a query-head count that is no multiple of the KV heads is refused where the config is read, before serve_sim
    # sized the KV cache with such heads (a memory audit, 2026-12-05)
    with pytest.raises(WorkloadError, match=r"config model: num_attention_heads \(8\) must be a multiple of "
                                            r"num_key_value_heads \(6\)"):
        model_config_from_dict({"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 6,
                                "intermediate_size": 1024, "vocab_size": 100, "num_hidden_layers": 2})
    cfg = model_config_from_dict({"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
                                  "intermediate_size": 1022, "vocab_size": 100, "num_hidden_layers": 2})
    with pytest.raises(WorkloadError, match="intermediate_size"):
        build_workload(cfg, [10], 1, tp=4)


def test_config_errors():
    base = {"hidden_size": 500, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1024,
            "vocab_size": 100, "num_hidden_layers": 2}
    with pytest.raises(WorkloadError, match="hidden_size 500 is not divisible by num_attention_heads 8"):
        model_config_from_dict(base)
    assert model_config_from_dict({**base, "head_dim": 64}).head_dim == 64
    assert model_config_from_dict({**base, "head_dim": 64, "_name_or_path": "x/y"}).model == "x/y"
    assert model_config_from_dict({**base, "head_dim": 64}).model == "unknown"
    with pytest.raises(WorkloadError, match="missing key 'vocab_size'"):
        model_config_from_dict({k: v for k, v in base.items() if k != "vocab_size"})
    with pytest.raises(WorkloadError, match="num_hidden_layers"):
        model_config_from_dict({**base, "head_dim": 64, "num_hidden_layers": "2"})


@pytest.mark.parametrize("tokens", [0, -1])
def test_output_tokens_below_one(tokens):
    with pytest.raises(WorkloadError, match="output_tokens"):
        build_workload(load_model_config("Qwen2.5-14B"), [10], tokens)
    with pytest.raises(WorkloadError, match="output_tokens"):
        parse_trace(f"prompt_tokens,decode_tokens,output_tokens\n10,5,{tokens}\n")


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("prompt_tokens,decode_tokens,output_tokens\n", "no requests"),
    ("a,b,c\n1,2,3\n", "unrecognised header"),
    ("prompt_tokens,decode_tokens,output_tokens\n10,x,3\n", "decode_tokens is not an integer"),
    ("prompt_tokens,decode_tokens,output_tokens\n10,5\n", "line 2 has 2 fields"),
    ("prompt_tokens,decode_tokens,output_tokens\n0,5,3\n", "prompt_tokens must be >= 1"),
    ("num_prefill_tokens,num_decode_tokens,output_tokens\n10,5,3\n11,5,4\n", "output_tokens differs"),
])
def test_bad_trace(text, message):
    with pytest.raises(WorkloadError, match=message):
        parse_trace(text, "t")


def test_both_trace_formats_parse():
    ours = parse_trace("request,prompt_tokens,decode_tokens,output_tokens\n1,10,5,3\n2,20,6,3\n")
    theirs = parse_trace("num_prefill_tokens,num_decode_tokens,output_tokens\r\n10,5,3\r\n20,6,3\r\n")
    assert ours.prompt_tokens == theirs.prompt_tokens == (10, 20) and ours.output_tokens == theirs.output_tokens == 3


def test_unknown_stems_list_known():
    with pytest.raises(WorkloadError, match=r"unknown model config 'Llama-9'.*Llama-3\.1-70B.*Qwen3-32B"):
        load_model_config("Llama-9")
    with pytest.raises(WorkloadError, match=r"unknown trace 'arxiv_9'.*arxiv_16.*vllm_splitwise64"):
        load_trace("arxiv_9")


def test_bad_backend():
    with pytest.raises(WorkloadError, match="prefill_attn 'fa3' is not one of"):
        build_workload(load_model_config("Qwen2.5-14B"), [10], 1, prefill_attn="fa3")


@pytest.mark.parametrize("args, message", [
    (["--model_config", "Qwen2.5-14B", "--trace", "arxiv_8", "--tp", "3"], "num_attention_heads (40) is not divisible"),
    (["--model_config", "Qwen2.5-14B", "--trace", "arxiv_8", "--output_tokens", "0"], "output_tokens"),
    (["--model_config", "Nope", "--trace", "arxiv_8"], "known: Llama-3-70B"),
    (["--model_config", "Qwen2.5-14B", "--trace", "nope"], "known: arxiv_12"),
    (["--model_config", "Qwen2.5-14B", "--trace", "arxiv_8", "--tp", "two"], "expected an integer"),
    (["--model_config", "Qwen2.5-14B", "--trace", "arxiv_8", "--bogus"], "unrecognized arguments"),
    (["--model_config", "Qwen2.5-14B"], "missing --trace"),
    (["--paper_set", "--tp", "2"], "cannot be combined with --tp"),
    (["--model_config", "Qwen2.5-14B", "--trace", "arxiv_8", "--name", "../x"], "name"),
    (["--model_config", "Qwen2.5-14B", "--trace", "missing/file.csv"], "trace file not found"),
    (["--model_config", "Llama-3.1-8B", "--requests", "4", "--prompt_tokens", "100", "--output_tokens", "3",
      "--single_sequence"], "without a trace give --requests 1"),
    (["--model_config", "Llama-3.1-8B", "--trace", "arxiv_8", "--qk_norm_rmsnorm"],
     "Llama-3.1-8B (LlamaForCausalLM) has none"),
])
def test_cli_errors(tmp_path, args, message):
    out = tmp_path / "out"
    result = _cli(*args, "--output_dir", str(out))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("workload_generator.py: error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("folder", ["hardware", "config"])
def test_cli_refuses_to_write_among_the_specs_or_configs(folder):
    """Every command reads each JSON of hardware/ and config/ as a GPU spec or a model config: one workload there
    stopped them all."""
    before = sorted((REPO / folder).iterdir())
    result = _cli("--model_config", "Llama-3.1-8B", "--requests", "1", "--prompt_tokens", "8", "--output_tokens", "2",
                  "--output_dir", str(REPO / folder))
    assert result.returncode == 2 and f"{folder} holds the" in result.stderr
    assert sorted((REPO / folder).iterdir()) == before


def test_cli_warns_of_an_attention_type_no_gpu_measured(tmp_path):
    result = _cli("--model_config", "Llama-3.1-8B", "--trace", "splitwise_64", "--hardware", "H100", "--decode_attn",
                  "fa3_paged", "--output_dir", str(tmp_path))
    assert result.returncode == 0 and "uses fa3_paged, which no GPU's attention measurements hold" in result.stderr
    # stdout is the written path alone, so that `f=$(workload_generator.py ... | tail -1)` gets the file
    assert result.stdout.strip().endswith(".json") and len(result.stdout.splitlines()) == 1


def test_cli_bad_trace_file_leaves_no_output(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("num_prefill_tokens,num_decode_tokens,output_tokens\n10,5,3\nabc,1,3\n")
    out = tmp_path / "out"
    result = _cli("--model_config", "Qwen2.5-14B", "--trace", str(bad), "--output_dir", str(out))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "num_prefill_tokens is not an integer" in result.stderr
    assert not out.exists() or not any(out.iterdir())


def test_cli_single_workload(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "_name_or_path": "X", "hidden_size": 64,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                               "vocab_size": 10, "num_hidden_layers": 2}))
    result = _cli("--model_config", str(cfg), "--trace", "arxiv_8", "--tp", "2", "--pp", "2", "--prefill_attn",
                  "fa2_ragged", "--output_tokens", "2", "--output_dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    path = tmp_path / "cfg_arxiv_8_o2_fa2_tp2_pp2.json"
    assert result.stdout.strip() == str(path)
    data = json.loads(path.read_text())
    assert data["model"] == "X" and data["model_params"]["head_dim"] == 16 and len(data["iterations"]) == 2
    assert [c["name"] for c in data["iterations"][1]["operators"]["communication"]] == [
        "all_reduce", "logits_all_gather", "send_recv"]


def _hf_directory(parent: Path, name: str = "Llama-3.1-8B") -> Path:
    """A Hugging Face model directory as a download leaves it: the config as config.json beside the weights."""
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((DEFAULT_CONFIG_DIR / "Llama-3.1-8B.json").read_text())
    (folder / "model.safetensors.index.json").write_text("{}")
    return folder


def test_a_hugging_face_model_directory_reads_its_config_json(tmp_path, monkeypatch):
    """--model_config DIR of a downloaded model said "model config file not found: DIR" although DIR exists: a
    directory now means its config.json, named after the model (the directory), not "config"."""
    shipped = load_model_config("Llama-3.1-8B")
    folder = _hf_directory(tmp_path)
    for name in (folder, f"{folder}/", folder / "config.json"):
        assert load_model_config(name) == shipped  # the stem too: Llama-3.1-8B
    # the Hugging Face cache: config.json links into blobs/, the snapshot folder is a revision hash
    repo = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "0b1c").write_text((folder / "config.json").read_text())
    snapshot = repo / "snapshots" / "d04e592bb4f6aa9cfee91e2e20afa771667e1d4b"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/0b1c")
    assert load_model_config(snapshot).stem == "Llama-3.1-8B"
    monkeypatch.chdir(folder)
    assert load_model_config(".").stem == "Llama-3.1-8B"
    # a directory without config.json says so; a bare name that is also a shipped stem still finds the stem
    (tmp_path / "weights").mkdir()
    (tmp_path / "Qwen3-14B").mkdir()
    with pytest.raises(WorkloadError, match=r"^model config directory \S+weights has no config\.json"):
        load_model_config(tmp_path / "weights")
    monkeypatch.chdir(tmp_path)
    assert load_model_config("Qwen3-14B") == load_model_config(DEFAULT_CONFIG_DIR / "Qwen3-14B.json")
    with pytest.raises(WorkloadError, match=r"^model config directory weights has no config\.json"):
        load_model_config("weights")


def test_cli_takes_a_hugging_face_model_directory(tmp_path):
    folder = _hf_directory(tmp_path / "models")
    result = _cli("--model_config", str(folder), "--trace", "arxiv_8", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["Llama-3.1-8B_arxiv_8_fa3_tp1_pp1.json"]
    result = _cli("--model_config", str(tmp_path / "models"), "--trace", "arxiv_8", "--output_dir", str(tmp_path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"error: model config directory {tmp_path / 'models'} has no config.json" in result.stderr


def test_generator_notes_qwen3_qk_norm(tmp_path, capsys):
    """A Qwen3 workload without --qk_norm_rmsnorm leaves the q/k RMSNorm kernels out; the generator says so."""
    from pipeweave.generate_cli import main

    main(["--model_config", "Qwen3-14B", "--requests", "1", "--prompt_tokens", "64", "--output_tokens", "2",
          "--output_dir", str(tmp_path)])
    said = capsys.readouterr()
    assert "Note: Qwen3 normalises q and k" in said.err and "Note" not in said.out  # stdout: the paths alone
    main(["--model_config", "Qwen3-14B", "--requests", "1", "--prompt_tokens", "64", "--output_tokens", "2",
          "--qk_norm_rmsnorm", "--output_dir", str(tmp_path)])
    main(["--model_config", "Llama-3.1-8B", "--requests", "1", "--prompt_tokens", "64", "--output_tokens", "2",
          "--output_dir", str(tmp_path)])
    assert "Note" not in capsys.readouterr().err


def test_overrides_of_a_trace_never_take_the_traces_file_name(tmp_path):
    """--prompt_tokens / --output_tokens / --single_sequence without --name wrote the file name of the trace's own
    workload (Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json, a paper workload) with other content: with the default
    --output_dir workload/ it overwrote the shipped file."""
    from pipeweave.generate_cli import main

    assert main(["--model_config", "Qwen2.5-14B", "--trace", "arxiv_8", "--prefill_attn", "fa2_ragged",
                 "--output_tokens", "2", "--prompt_tokens", "100", "--output_dir", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["Qwen2.5-14B_arxiv_8_p100_o2_fa2_tp1_pp1.json"]
    names = {generate(WorkloadSpec("Qwen2.5-14B", "arxiv_8", prefill_attn="fa2_ragged", output_tokens=2,
                                   **overrides)).file_name
             for overrides in ({}, {"single_sequence": True}, {"prompt_tokens": 100}, {"name": "mine"})}
    assert names == {"Qwen2.5-14B_arxiv_8_o2_fa2_tp1_pp1.json", "Qwen2.5-14B_arxiv_8_single_o2_fa2_tp1_pp1.json",
                     "Qwen2.5-14B_arxiv_8_p100_o2_fa2_tp1_pp1.json", "Qwen2.5-14B_mine_fa2_tp1_pp1.json"}
    assert "Qwen2.5-14B_arxiv_8_fa2_tp1_pp1.json" in paper_set_names()
    merged = generate(WorkloadSpec("Qwen2.5-14B", None, requests=2, prompt_tokens=64, output_tokens=2,
                                   single_sequence=True))
    assert merged.file_name == "Qwen2.5-14B_r2_p64_o2_single_fa3_tp1_pp1.json"  # not the two-request batch's name


def test_variants_enter_the_file_name_and_paper_names_are_not_overwritten(tmp_path):
    """--qk_norm_rmsnorm and --decode_attn did not enter the file name: Qwen3-32B arxiv_16 TP2 without the flag wrote
    the paper's QK-norm file name (Qwen3-32B_arxiv_16_fa2_tp2_pp1.json) with 64 fewer RMSNorm kernels per layer set."""
    from pipeweave.generate_cli import main

    plain = WorkloadSpec("Qwen3-32B", "arxiv_12", tp=2, prefill_attn="fa2_ragged", lm_head="replicated",
                         name="arxiv_12")
    names = {generate(WorkloadSpec("Qwen3-32B", "arxiv_12", tp=2, prefill_attn="fa2_ragged", lm_head="replicated",
                                   **variant)).file_name
             for variant in ({}, {"qk_norm_rmsnorm": True}, {"decode_attn": "fa3_paged"})}
    assert names == {"Qwen3-32B_arxiv_12_lmhead-replicated_fa2_tp2_pp1.json",
                     "Qwen3-32B_arxiv_12_qknorm_lmhead-replicated_fa2_tp2_pp1.json",
                     "Qwen3-32B_arxiv_12_decode-fa3_paged_lmhead-replicated_fa2_tp2_pp1.json"}
    # the name keeps only the prefill backend's family, so a paged prefill says so (it replaced the ragged one's file)
    paged = generate(WorkloadSpec("Qwen3-32B", "arxiv_12", tp=2, prefill_attn="fa2_paged", lm_head="replicated"))
    assert paged.file_name == "Qwen3-32B_arxiv_12_prefill-fa2_paged_lmhead-replicated_fa2_tp2_pp1.json"
    assert generate(plain).content == (DEFAULT_OUTPUT_DIR / "Qwen3-32B_arxiv_12_fa2_tp2_pp1.json").read_bytes()
    # vLLM's layout (the default) under a paper file's name is refused, naming the paper's layout
    with pytest.raises(WorkloadError, match=r"Qwen3-32B_arxiv_12_fa2_tp2_pp1.json is the name of a paper workload .*"
                                            r"generated with --lm_head replicated\); give --name"):
        main(["--model_config", "Qwen3-32B", "--trace", "arxiv_12", "--tp", "2", "--prefill_attn", "fa2_ragged",
              "--output_dir", str(tmp_path)])

    qk_paper = "Qwen3-32B_arxiv_16_fa2_tp2_pp1.json"
    assert qk_paper in paper_set_names()
    argv = ["--model_config", "Qwen3-32B", "--trace", "arxiv_16", "--tp", "2", "--prefill_attn", "fa2_ragged",
            "--output_dir", str(tmp_path)]
    with pytest.raises(WorkloadError, match=f"{qk_paper}.*--qk_norm_rmsnorm and --lm_head replicated.*--name"):
        main(argv)
    other_traces = tmp_path / "traces"  # the same trace name in another folder, another workload
    other_traces.mkdir()
    (other_traces / "arxiv_12.csv").write_text("request,prompt_tokens,decode_tokens,output_tokens\n1,100,10,10\n")
    with pytest.raises(WorkloadError, match="Qwen3-32B_arxiv_12_fa2_tp2_pp1.json: read from another --config_dir or "
                                            "--trace_dir, this workload differs from the paper workload"):
        main(["--model_config", "Qwen3-32B", "--trace", "arxiv_12", "--tp", "2", "--prefill_attn", "fa2_ragged",
              "--trace_dir", str(other_traces), "--output_dir", str(tmp_path), "--lm_head", "replicated",
              "--name", "arxiv_12"])
    assert main(["--model_config", "Qwen3-32B", "--trace", "arxiv_12", "--tp", "2", "--prefill_attn", "fa2_ragged",
                 "--trace_dir", str(DEFAULT_TRACE_DIR), "--output_dir", str(tmp_path), "--lm_head", "replicated",
                 "--name", "arxiv_12"]) == 0  # the paper's own
    assert not (tmp_path / qk_paper).exists()
    assert main(argv + ["--qk_norm_rmsnorm", "--lm_head", "replicated"]) == 0
    written = tmp_path / "Qwen3-32B_arxiv_16_qknorm_lmhead-replicated_fa2_tp2_pp1.json"
    assert written.read_bytes() == generate(PAPER_SET[PAPER_SET.index(
        WorkloadSpec("Qwen3-32B", "arxiv_16", tp=2, prefill_attn="fa2_ragged", qk_norm_rmsnorm=True,
                     name="arxiv_16", lm_head="replicated"))]).content


def test_a_folder_named_like_a_shipped_config_does_not_replace_it(tmp_path, monkeypatch):
    """A Hugging Face download in the current folder named like a shipped config (Qwen2.5-14B/config.json) replaced
    config/Qwen2.5-14B.json for every bare name, the paper set's included; a bare stem now means the shipped config
    and the folder is reached as a path."""
    from pipeweave.workload_inputs import resolve_model_config

    (tmp_path / "Qwen2.5-14B").mkdir()
    (tmp_path / "Qwen2.5-14B" / "config.json").write_text((DEFAULT_CONFIG_DIR / "Qwen2.5-14B.json").read_text())
    monkeypatch.chdir(tmp_path)
    assert resolve_model_config("Qwen2.5-14B") == DEFAULT_CONFIG_DIR / "Qwen2.5-14B.json"
    assert resolve_model_config("./Qwen2.5-14B") == Path("./Qwen2.5-14B") / "config.json"
    assert resolve_model_config(tmp_path / "Qwen2.5-14B") == tmp_path / "Qwen2.5-14B" / "config.json"
