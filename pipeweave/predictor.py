"""Per-kernel duration prediction: registry features → float32 → log1p → MLP → duration (docs/METHOD.md §4.3).

``KernelPredictor`` loads the newest model directory per operator class once (the exported numpy weights of
:mod:`pipeweave.mlp`: no torch) and predicts whole batches of shapes in one forward pass per operator. pandas is
needed only by the frame methods (dataset CSVs, the accuracy report), not by :meth:`predict_columns` (the
``predict_kernels`` tool and the Python API) or the aggregator.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import compute_features, get_operator
from pipeweave.mlp import latest_model_dir, load_model_dir
from pipeweave.paths import DEFAULT_MODEL_DIR

if TYPE_CHECKING:
    import pandas as pd


def duration_us(ideal_cycles: np.ndarray, efficiency: np.ndarray, sm_freq_mhz: np.ndarray) -> np.ndarray:
    """C_ideal / (overall_perf × f): cycles over (efficiency × MHz) gives microseconds."""
    return np.asarray(ideal_cycles, dtype=np.float64) / (np.asarray(efficiency) * np.asarray(sm_freq_mhz))


class KernelPredictor:
    """Loads ``<model_dir>/<op>/<latest timestamp>/`` per operator on first use."""

    def __init__(
        self,
        model_dir: str | Path = DEFAULT_MODEL_DIR,
        hardware_dir: str | Path = DEFAULT_HARDWARE_DIR,
    ):
        self.model_dir = Path(model_dir)
        self.hardware_dir = Path(hardware_dir)
        self.hardware = hardware_registry(self.hardware_dir)
        self._models: dict[str, tuple] = {}

    def model(self, op: str):
        """(model, metadata, directory) for ``op``; a missing model is an error naming the file."""
        if op not in self._models:
            operator = get_operator(op)
            directory = latest_model_dir(self.model_dir, operator.model_op)
            model, metadata = load_model_dir(directory, operator.model_op)
            names = metadata["model_info"]["features"]
            if names not in (list(operator.input_names(True)), list(operator.input_names(False))):
                raise ValueError(f"{directory}/metadata.json: its features are not the registry's {op} inputs")
            self._models[op] = (model, metadata, directory)
        return self._models[op]

    def uses_descriptors(self, op: str) -> bool:
        _, metadata, _ = self.model(op)
        return len(metadata["model_info"]["features"]) > len(get_operator(op).feature_names)

    def efficiency_from_features(self, op: str, features: np.ndarray, described: np.ndarray | None = None) -> np.ndarray:
        """Efficiency from the pipe features and (for models trained with them) the shape descriptors."""
        model, _, directory = self.model(op)
        inputs = features
        if self.uses_descriptors(op):
            if described is None:
                raise ValueError(f"{directory} needs the {op} shape descriptors as well as the features")
            inputs = np.concatenate([features, described], axis=1)
        return model.efficiency(inputs)

    def efficiency_from_frame(self, op: str, frame: pd.DataFrame) -> np.ndarray:
        """Efficiency for a frame that holds the feature (and descriptor) columns, e.g. a dataset CSV."""
        model, metadata, _ = self.model(op)
        inputs = frame[metadata["model_info"]["features"]].to_numpy(np.float64)
        return model.efficiency(inputs)

    def predict_frame(self, op: str, frame: pd.DataFrame) -> pd.DataFrame:
        """Features, ideal cycles, predicted efficiency and ``predicted_us`` for rows of shapes + ``hardware``."""
        features = compute_features(op, frame, self.hardware_dir)
        efficiency = self.efficiency_from_frame(op, features)
        sm_freq = frame["hardware"].map(lambda name: self.hardware.get(name).sm_freq).to_numpy(np.float64)
        features["predicted_perf"] = efficiency
        features["predicted_us"] = duration_us(features["ideal_cycles"].to_numpy(), efficiency, sm_freq)
        return features

    def predict_columns(self, op: str, columns: Mapping[str, Sequence], hardware: Sequence[str],
                        calibration=None) -> np.ndarray:
        """Predicted µs per row of a column mapping (the operator's shape columns) on ``hardware[row]``; a
        ``calibration`` (:class:`pipeweave.calibration.Calibration`) corrects the rows of its own GPU only."""
        operator = get_operator(op)
        names = np.asarray(list(hardware), dtype=object)
        out = np.zeros(len(names))
        for name in dict.fromkeys(names.tolist()):
            rows = np.flatnonzero(names == name)
            hw = self.hardware.get(name)
            part = {column: [values[i] for i in rows] for column, values in columns.items()}
            features, described = operator.features(part, hw), operator.descriptors(part, hw)
            ideal = operator.ideal_cycles(features.astype(np.float32))
            out[rows] = duration_us(ideal, self.efficiency_from_features(op, features, described), hw.sm_freq)
            if calibration is not None:
                shapes = list(zip(*(part[column] for column in operator.shape_columns)))
                out[rows] = calibration.apply(op, hw, out[rows], features, shapes)
        return out
