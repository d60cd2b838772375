"""Per-kernel duration prediction: registry features → float32 → log1p → MLP → duration (METHOD.md §4.3).

``KernelPredictor`` loads the newest model directory per operator class once and predicts whole
frames of shapes in one batched forward pass per operator.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import compute_features, get_operator, model_inputs
from mlp_model import latest_model_dir, load_model_dir, predict_efficiency

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = REPO_ROOT / "mlp_models"


def duration_us(ideal_cycles: np.ndarray, efficiency: np.ndarray, sm_freq_mhz: np.ndarray) -> np.ndarray:
    """C_ideal / (overall_perf × f): cycles over (efficiency × MHz) gives microseconds."""
    return np.asarray(ideal_cycles, dtype=np.float64) / (np.asarray(efficiency) * np.asarray(sm_freq_mhz))


class KernelPredictor:
    """Loads ``<model_dir>/<op>/<latest timestamp>/`` per operator on first use."""

    def __init__(
        self,
        model_dir: str | Path = DEFAULT_MODEL_DIR,
        device: str = "cpu",
        hardware_dir: str | Path = DEFAULT_HARDWARE_DIR,
    ):
        self.model_dir = Path(model_dir)
        self.device = device
        self.hardware_dir = Path(hardware_dir)
        self.hardware = hardware_registry(self.hardware_dir)
        self._models: dict[str, tuple] = {}

    def model(self, op: str):
        """(model, metadata, directory) for ``op``; a missing model is an error naming the file."""
        if op not in self._models:
            get_operator(op)
            directory = latest_model_dir(self.model_dir, op)
            model, metadata = load_model_dir(directory, op, self.device)
            expected = list(get_operator(op).feature_names)
            if metadata["model_info"]["features"] != expected:
                raise ValueError(f"{directory}/metadata.json: features differ from the registry's {op} features")
            self._models[op] = (model, metadata, directory)
        return self._models[op]

    def efficiency_from_features(self, op: str, features: np.ndarray) -> np.ndarray:
        model, _, _ = self.model(op)
        return predict_efficiency(model, model_inputs(features), self.device)

    def predict_frame(self, op: str, frame: pd.DataFrame) -> pd.DataFrame:
        """Features, ideal cycles, predicted efficiency and ``predicted_us`` for rows of shapes + ``hardware``."""
        features = compute_features(op, frame, self.hardware_dir)
        operator = get_operator(op)
        values = features[list(operator.feature_names)].to_numpy()
        efficiency = self.efficiency_from_features(op, values)
        sm_freq = frame["hardware"].map(lambda name: self.hardware.get(name).sm_freq).to_numpy(np.float64)
        features["predicted_perf"] = efficiency
        features["predicted_us"] = duration_us(features["ideal_cycles"].to_numpy(), efficiency, sm_freq)
        return features
