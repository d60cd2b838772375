"""Operator profiler: measure the kernels the predictor models on the local CUDA GPU.

Rows land in ``dataset/measured/<gpu>/<op>.csv`` (raw schema: op, shape columns, hardware,
avg_duration in µs, median/min/std, repeats, dtype, kernel, library versions, clocks, timestamp), which the
dataset builder reads as one more source (:func:`read_all_measured`). The CLI is ``profile_operators.py``.

Modules: :mod:`.grids` (pure shape grids), :mod:`.timing` (CUDA-event timers: rotating copies, or an L2 flush;
a fake timer), :mod:`.runners` (torch code, imported lazily), :mod:`.launch` (what a runner returns, the kernel label),
:mod:`.csvio` (schema, resumable writer, reader), :mod:`.device` (device info, hardware-JSON skeleton),
:mod:`.session` (measurement loop), :mod:`.collective` (NCCL all-reduce across local GPUs).
"""
from .csvio import (
    MEASUREMENT_COLUMNS,
    MeasurementCsv,
    columns_for,
    iter_measured_files,
    key_columns,
    read_all_measured,
    read_measured,
    row_key,
)
from .device import NO_CUDA_MESSAGE, DeviceInfo, gpu_dir_name, hardware_skeleton
from .grids import DEFAULT_CONFIGS, DEFAULT_TP, OPS, SHAPE_COLUMNS, Grid, build_grid, load_models
from .session import RunSummary, measure_grid
from .timing import CudaEventTimer, FakeTimer, RotatingTimer, Stats, Timer, summarize

__all__ = [
    "MEASUREMENT_COLUMNS", "MeasurementCsv", "columns_for", "iter_measured_files", "key_columns",
    "read_all_measured", "read_measured", "row_key", "NO_CUDA_MESSAGE", "DeviceInfo", "gpu_dir_name",
    "hardware_skeleton", "DEFAULT_CONFIGS", "DEFAULT_TP", "OPS", "SHAPE_COLUMNS", "Grid",
    "build_grid", "load_models", "RunSummary", "measure_grid", "CudaEventTimer", "RotatingTimer", "FakeTimer",
    "Stats", "Timer", "summarize",
]
