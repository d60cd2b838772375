"""The efficiency MLPs (MLP, MLP_v2; docs/METHOD.md §5.1), where users of the artifact expect them.

The torch modules, checkpoint loading and the numpy weight export live in :mod:`pipeweave.torch_mlp` (training
extras); prediction reads the exported weights with :mod:`pipeweave.mlp` and never imports torch. Run as a script,
this file (re-)exports the numpy weights beside every checkpoint under the given model roots:

    python3 mlp_model.py mlp_models mlp_models_quantile
"""
from __future__ import annotations

import sys

from pipeweave.cli import run_cli
from pipeweave.torch_mlp import MLP, MLP_v2, build_model, load_model_dir, main, predict_efficiency

__all__ = ["MLP", "MLP_v2", "build_model", "load_model_dir", "predict_efficiency"]

if __name__ == "__main__":
    sys.exit(run_cli(main))
