"""Spec-sheet inputs of the zero-shot experiments (pipeweave/transfer_ideas.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analytical_model.registry import get_operator
from pipeweave.cli import UserError
from pipeweave.mlp import PIPE_SHARES, model_inputs
from pipeweave.training import TrainConfig
from pipeweave.transfer_ideas import (FORM_IDEAS, IDEAS, ROW_IDEAS, TARGET_IDEAS, extra_inputs, target_offset_us,
                                      with_pipes)


def test_extra_inputs_are_per_gpu_constants_from_the_hardware_json():
    frame = pd.DataFrame({"hardware": ["NVIDIA H100", "NVIDIA A40", "NVIDIA H100"]})
    spec_ideas = tuple(idea for idea in IDEAS if idea not in (*ROW_IDEAS, *FORM_IDEAS))
    values = extra_inputs(frame, spec_ideas)
    assert values.shape == (3, len(spec_ideas))
    assert (values[0] == values[2]).all() and (values[0] != values[1]).any()
    power, hbm, l2, boost, balance, energy, sm_bandwidth, *architecture = values[0]
    assert power == pytest.approx(700 / (132 * 1830))
    assert (hbm, l2) == (1.0, 50.0) and values[1][1] == 0.0  # A40: GDDR6
    assert boost == pytest.approx(1980 / 1830)
    assert balance == pytest.approx(3352.32e9 / 989.4e12, rel=1e-3)
    assert energy == pytest.approx(700 / 989.4, rel=1e-3)  # W per dense BF16 TFLOP/s
    assert sm_bandwidth == pytest.approx(3352.32e9 / (132 * 1830e6))  # 13.9 DRAM bytes per SM-cycle
    assert architecture == [0.0, 0.0, 1.0, 0.0] and list(values[1][-4:]) == [1.0, 0.0, 0.0, 0.0]  # Hopper; A40 Ampere
    h20 = extra_inputs(pd.DataFrame({"hardware": ["NVIDIA H20"]}), ("power", "energy"))[0]
    assert h20[0] == pytest.approx(power, rel=0.05) and h20[1] > 3 * energy  # equal per SM-cycle, not per FLOP
    assert extra_inputs(frame, ()).shape == (3, 0)


def test_unknown_idea_is_an_error():
    with pytest.raises(ValueError, match="unknown idea 'color'"):
        extra_inputs(pd.DataFrame({"hardware": ["NVIDIA H100"]}), ("color",))


def test_the_command_refuses_an_unknown_idea_before_training(monkeypatch):
    """A typo in --ideas failed only after the baseline had been trained on every held-out GPU."""
    from pipeweave import transfer_ideas

    monkeypatch.setattr(transfer_ideas, "logo_error", lambda *args, **kwargs: pytest.fail("trained first"))
    with pytest.raises(UserError, match=r"unknown idea\(s\) 'bogus'; known: none, power"):
        transfer_ideas.main(["--ideas", "none,power+bogus", "--gpus", "H20"])


def test_harness_is_a_property_of_each_row_not_of_the_gpu():
    frame = pd.DataFrame({"hardware": ["NVIDIA H100", "NVIDIA H100", "NVIDIA A40"],
                          "source": ["vidur 7d47513 h100/mlp.csv", "aiconfigurator-core 0.12.0 h100_sxm/gemm",
                                     "vidur 7d47513 a40/mlp.csv"]})
    assert list(extra_inputs(frame, ("vidur_harness",))[:, 0]) == [1.0, 0.0, 1.0]
    both = extra_inputs(frame, ("hbm", "vidur_harness"))
    assert both.shape == (3, 2) and list(both[:, 0]) == [1.0, 1.0, 0.0]


def test_each_harness_idea_marks_only_its_own_family():
    frame = pd.DataFrame({"hardware": ["NVIDIA H100"] * 3,
                          "source": ["pipeweave fp8_gemm/h100.csv", "aiconfigurator-core 0.12.0 h100_sxm/gemm",
                                     "vidur 7d47513 h100/mlp.csv"]})
    marks = extra_inputs(frame, ("vidur_harness", "pipeweave_harness"))
    assert marks.tolist() == [[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]


def test_l2_fit_is_the_unique_dram_bytes_over_the_gpus_l2():
    """A GEMM whose A, B and C take exactly L40S's 96 MiB L2 is at 1 there and at 96/50 on H100's 50 MiB."""
    from analytical_model.descriptors import gemm
    from analytical_model.hardware import load_hardware

    m = n = 4096
    k = (96 * 2**20 - 2 * m * n) // (2 * (m + n))  # 2 (mK + nK) + 2 mn bytes = 96 MiB
    rows = []
    for name in ("NVIDIA L40S", "NVIDIA H100"):
        spec = load_hardware(name)
        rows.append({"hardware": name, "exact_dram_cycle": gemm(m, n, k, spec)[4], "sm_freq": spec.sm_freq,
                     "mem_bandwidth": spec.mem_bandwidth})
    fit = extra_inputs(pd.DataFrame(rows), ("l2_fit",))[:, 0]
    assert fit == pytest.approx([1.0, 96 / 50], rel=1e-9)


def test_a_pipe_idea_takes_part_in_the_pipe_shares():
    """launch_pipe: 2 us at the SM clock, a cycle column; below it, it is the busiest pipe (the size input), and it
    adds no extra input of its own."""
    frame = pd.DataFrame({"hardware": ["NVIDIA H100", "NVIDIA H100"], "sm_freq": [1830.0, 1830.0]})
    features = np.array([[100.0, 7.0], [10_000.0, 7.0]])
    extended, names = with_pipes(frame, features, ("global_cycle", "shape_M"), ("launch_pipe",))
    assert names == ("global_cycle", "shape_M", "launch_pipe_cycle")
    assert extended[:, 2].tolist() == [2 * 1830.0, 2 * 1830.0]
    assert extra_inputs(frame, ("launch_pipe",)).shape == (2, 0)
    shares = model_inputs(extended, names, PIPE_SHARES)  # shares (2 pipes), log busiest, log1p shape
    assert shares[0, 2] == pytest.approx(np.log(3660.0)) and shares[1, 2] == pytest.approx(np.log(10_000.0))
    assert shares[0, 1] == pytest.approx(0.0, abs=1e-6) and shares[1, 0] == pytest.approx(0.0, abs=1e-6)
    unchanged, same_names = with_pipes(frame, features, ("global_cycle", "shape_M"), ("power",))
    assert unchanged is features and same_names == ("global_cycle", "shape_M")


def test_a_drop_idea_takes_the_l2_cycles_out_of_the_inputs():
    """no_l2_pipe: the two L2 cycle columns leave the features (and so the pipe shares), the rest stays in order;
    it adds no extra input, and naming a column the model does not read is an error."""
    names = get_operator("gemm").feature_names
    features = np.arange(2 * len(names), dtype=np.float64).reshape(2, len(names))
    frame = pd.DataFrame({"hardware": ["NVIDIA H100"] * 2, "sm_freq": [1830.0] * 2})
    kept, kept_names = with_pipes(frame, features, names, ("no_l2_pipe",))
    assert "local_cycle" in names and "sm_max_local_cycle" in names
    assert kept_names == tuple(n for n in names if n not in ("local_cycle", "sm_max_local_cycle"))
    assert kept.tolist() == [[row[names.index(n)] for n in kept_names] for row in features.tolist()]
    assert extra_inputs(frame, ("no_l2_pipe",)).shape == (2, 0)
    with pytest.raises(ValueError, match="does not read: local_cycle, sm_max_local_cycle"):
        with_pipes(frame, features[:, :2], names[:2], ("no_l2_pipe",))


def test_a_target_idea_adds_to_the_operator_s_own_fixed_time():
    """launch_offset takes 1 us more than the registry's fixed time out of every duration; the ``none`` baseline
    is the shipped recipe, with the registry's alone (none for RMSNorm)."""
    config = TrainConfig()
    assert target_offset_us("gemm", (), config) == get_operator("gemm").fixed_time_us > 0
    assert target_offset_us("gemm", ("launch_offset", "l2"), config) == get_operator("gemm").fixed_time_us + 1.0
    assert target_offset_us("attn", (), config) == get_operator("attn").fixed_time_us > 0
    assert target_offset_us("moe", (), config) == get_operator("moe").fixed_time_us > 0
    assert target_offset_us("rmsnorm", ("launch_offset",), config) == TARGET_IDEAS["launch_offset"] == 1.0
