"""pipeweave: GPU performance prediction for LLM inference (analytical features + learned efficiency).

The Python API (:mod:`pipeweave.api`): ``predict_workload(workload, hardware)`` and
``predict_kernels(op, shapes, hardware)``.
"""
from pipeweave.api import predict_kernels, predict_workload

__all__ = ["predict_kernels", "predict_workload"]
