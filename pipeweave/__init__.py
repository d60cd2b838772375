"""pipeweave: GPU performance prediction for LLM inference (analytical features + learned efficiency).

The Python API (:mod:`pipeweave.api`): ``predict_workload(workload, hardware)``,
``predict_kernels(op, shapes, hardware)``, ``simulate_serving(model_config, trace, hardware)`` and
``search_configurations(model_config, trace, hardware, gpu_budget)``.
"""
from pipeweave.api import predict_kernels, predict_workload, search_configurations, simulate_serving

__all__ = ["predict_kernels", "predict_workload", "search_configurations", "simulate_serving"]
