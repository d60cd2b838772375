"""Monotone bounds beyond a pipe-share model's training data (pipeweave.edges, docs/METHOD.md §4.3)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from analytical_model.hardware import hardware_registry
from analytical_model.registry import get_operator
from pipeweave.edges import METADATA_KEY, TrainingEdges, model_edges, share_groups
from pipeweave.mlp import DISCRETE_INPUTS_KEY, PIPE_SHARES, latest_model_dir, total_efficiency, transformed_names
from pipeweave.paths import DEFAULT_MODEL_DIR
from pipeweave.predictor import KernelPredictor


def test_the_ideal_pipe_is_the_tensor_pipe_of_the_tensor_operators():
    names = ("tensor_all_ops", "tensor_all_cycle", "tensor_sm_max_cycle", "global_cycle", "sm_max_local_cycle",
             "shape_M", "exact_tensor_cycle", "exact_dram_cycle")
    ideal, other = share_groups("gemm", names)
    columns = transformed_names(names, PIPE_SHARES)
    assert [c for c, i in zip(columns, ideal) if i] == ["share(tensor_all_cycle)", "share(tensor_sm_max_cycle)",
                                                         "share(exact_tensor_cycle)"]
    assert [c for c, o in zip(columns, other) if o] == ["share(global_cycle)", "share(sm_max_local_cycle)",
                                                         "share(exact_dram_cycle)"]
    ideal, other = share_groups("attn", ("tensor_all_cycle", "xu_all_cycle", "global_cycle"))
    assert ideal.tolist() == [True, False, False, False] and other.tolist() == [False, True, True, False]


# columns: the ideal pipe's share, another pipe's share, the size; training range [-2, -1] for both shares
EDGES = TrainingEdges(low=np.array([-2.0, -2.0, 0.0]), high=np.array([-1.0, -1.0, 10.0]),
                      ideal=np.array([True, False, False]), other=np.array([False, True, False]))


def wrong_way(rows):
    """A model that extrapolates against the physics: faster with more demand on the other pipe, slower with a
    larger share of the ideal pipe."""
    return 0.5 + 0.1 * rows[:, 1] - 0.1 * rows[:, 0]


@pytest.mark.parametrize("row, bound", [
    ([-1.5, -1.5, 5.0], None),   # inside: the model's value
    ([-1.5, -0.2, 5.0], "at most the edge"),    # the other pipe beyond its maximum: no faster than at the edge
    ([-1.5, -3.0, 5.0], "at least the edge"),   # the other pipe below its minimum: no slower
    ([-0.2, -1.5, 5.0], "at least the edge"),   # the ideal pipe beyond its maximum: no slower
    ([-3.0, -1.5, 5.0], "at most the edge"),    # the ideal pipe below its minimum: no faster
    ([-1.5, -1.5, 50.0], None),  # a size beyond the range is not a pipe share: no bound
])
def test_a_share_beyond_the_training_range_bounds_the_efficiency_by_the_edge(row, bound):
    rows = np.array([row])
    model = wrong_way(rows)
    bounded = EDGES.bound(rows, model, wrong_way)
    edge = wrong_way(np.clip(rows, EDGES.low, EDGES.high) * [1, 1, 0] + rows * [0, 0, 1])
    if bound is None:
        assert bounded == pytest.approx(model)
    elif bound == "at most the edge":
        assert model > edge and bounded == pytest.approx(edge)
    else:
        assert model < edge and bounded == pytest.approx(edge)
    right_way = 2 * edge - model  # a model that extrapolates the physical way keeps its own value
    assert EDGES.bound(rows, right_way, lambda r: np.full(len(r), edge[0])) == pytest.approx(right_way)


def test_shipped_pipe_share_models_carry_their_edges_and_the_predictor_applies_them():
    predictor = KernelPredictor()
    for op in ("gemm", "attn", "moe"):
        assert isinstance(predictor.model(op)[0].edges, TrainingEdges)
    assert predictor.model("gemm_fp8")[0].edges is None  # log1p inputs: no pipe shares to bound
    model, metadata, _ = predictor.model("gemm")
    names = transformed_names(model.features, model.input_transform)
    local = names.index("share(sm_max_local_cycle)")
    # features, descriptors, and the harness input (0: aiconfigurator's)
    row = np.array([[1e6, 2e6, 3e6, 4e6, 1.0, 1e6, 1e6, 1.0, 2e6, 1e6, 2e6, 1024, 1024, 1024, 2e6, 1e6, 0.0]])
    beyond = row[:, :model.input_dim].copy()
    beyond[0, model.features.index("sm_max_local_cycle")] = 1e9  # the L2 pipe far busier than any training row
    inputs = model.inputs(beyond)
    assert inputs[0, local] > metadata[METADATA_KEY]["share(sm_max_local_cycle)"][1]
    edge_row = inputs.copy()
    edge_row[0, model.edges.other] = np.clip(edge_row[0, model.edges.other], model.edges.low[model.edges.other],
                                             model.edges.high[model.edges.other])
    at_edge = model._median_efficiency(model.output(edge_row))
    sm_freq = 1755.0  # the bound holds in the network's terms, so also after the fixed time (docs/METHOD.md §4.3)
    bound = total_efficiency(at_edge, get_operator("gemm").ideal_us(beyond, sm_freq), model.fixed_time_us)
    assert model.efficiency(beyond, sm_freq)[0] <= bound[0] + 1e-12


def test_a_pipe_share_model_without_edges_is_refused_with_the_command_that_writes_them(tmp_path):
    source = latest_model_dir(DEFAULT_MODEL_DIR, "gemm")
    target = tmp_path / "gemm" / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("members"))
    metadata = json.loads((target / "metadata.json").read_text())
    del metadata[METADATA_KEY]
    (target / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match=f"lacks {METADATA_KEY}; write it with: python3 -m pipeweave.edges"):
        model_edges("gemm", metadata, str(target))
    with pytest.raises(ValueError, match="python3 -m pipeweave.edges"):
        KernelPredictor(tmp_path).model("gemm")


def test_edges_command_refuses_a_model_without_pipe_shares(tmp_path, repo_root):
    import subprocess
    import sys

    source = latest_model_dir(DEFAULT_MODEL_DIR, "gemm_fp8")
    target = tmp_path / "gemm_fp8" / source.name
    target.mkdir(parents=True)
    shutil.copy(source / "metadata.json", target / "metadata.json")
    result = subprocess.run([sys.executable, "-m", "pipeweave.edges", str(target)], cwd=repo_root,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "does not read pipe shares" in result.stderr


@pytest.mark.data
def test_shipped_edges_are_those_of_the_training_split(tmp_path):
    """python3 -m pipeweave.edges recomputes exactly what the shipped models store."""
    from pipeweave.edges import write_ranges
    from pipeweave.modeling import dataset_paths
    from pipeweave.paths import DATASET_DIR

    for op in ("gemm", "attn", "moe"):
        if not dataset_paths(op, DATASET_DIR)[0].is_file():
            pytest.skip(f"dataset/{op}_train.csv not built (python3 -m dataset.build; needs the shared data)")
        source = latest_model_dir(DEFAULT_MODEL_DIR, op)
        target = tmp_path / op / source.name
        target.mkdir(parents=True)
        shutil.copy(source / "metadata.json", target / "metadata.json")
        stored = json.loads((source / "metadata.json").read_text())
        assert write_ranges(target, op, DATASET_DIR) == stored[METADATA_KEY]
        if op == "moe":  # and the combinations of its discrete inputs (expert count, top-k)
            written = json.loads((target / "metadata.json").read_text())[DISCRETE_INPUTS_KEY]
            assert written == stored[DISCRETE_INPUTS_KEY] and written["inputs"] == ["experts", "top_k"]


def test_a_moe_model_without_its_discrete_combinations_names_the_command_that_writes_them(tmp_path):
    from pipeweave.predictor import training_coverage

    metadata = json.loads((latest_model_dir(DEFAULT_MODEL_DIR, "moe") / "metadata.json").read_text())
    # absent, not an object, or a table of another width or of non-numbers: one error naming the fix
    for damaged in (None, 5, {"inputs": ["experts", "top_k"], "seen": [[1, 2, 3]]},
                    {"inputs": ["experts", "top_k"], "seen": [["a", "b"]]}, {"inputs": ["experts", "top_k"]}):
        if damaged is None:
            metadata.pop(DISCRETE_INPUTS_KEY)
        else:
            metadata[DISCRETE_INPUTS_KEY] = damaged
        with pytest.raises(ValueError, match=f"m/metadata.json lacks a valid {DISCRETE_INPUTS_KEY} for experts, "
                                             f"top_k; write it with: python3 -m pipeweave.edges m"):
            training_coverage(metadata, hardware_registry(), "m/metadata.json", "moe")
