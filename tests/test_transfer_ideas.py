"""Spec-sheet inputs of the zero-shot experiments (pipeweave/transfer_ideas.py)."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeweave.transfer_ideas import IDEAS, extra_inputs


def test_extra_inputs_are_per_gpu_constants_from_the_hardware_json():
    frame = pd.DataFrame({"hardware": ["NVIDIA H100", "NVIDIA A40", "NVIDIA H100"]})
    values = extra_inputs(frame, IDEAS)
    assert values.shape == (3, len(IDEAS))
    assert (values[0] == values[2]).all() and (values[0] != values[1]).any()
    power, hbm, l2, boost, balance, energy, *architecture = values[0]
    assert power == pytest.approx(700 / (132 * 1830))
    assert (hbm, l2) == (1.0, 50.0) and values[1][1] == 0.0  # A40: GDDR6
    assert boost == pytest.approx(1980 / 1830)
    assert balance == pytest.approx(3352.32e9 / 989.4e12, rel=1e-3)
    assert energy == pytest.approx(700 / 989.4, rel=1e-3)  # W per dense BF16 TFLOP/s
    assert architecture == [0.0, 0.0, 1.0, 0.0] and list(values[1][-4:]) == [1.0, 0.0, 0.0, 0.0]  # Hopper; A40 Ampere
    h20 = extra_inputs(pd.DataFrame({"hardware": ["NVIDIA H20"]}), ("power", "energy"))[0]
    assert h20[0] == pytest.approx(power, rel=0.05) and h20[1] > 3 * energy  # equal per SM-cycle, not per FLOP
    assert extra_inputs(frame, ()).shape == (3, 0)


def test_unknown_idea_is_an_error():
    with pytest.raises(ValueError, match="unknown idea 'color'"):
        extra_inputs(pd.DataFrame({"hardware": ["NVIDIA H100"]}), ("color",))
