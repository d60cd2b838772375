"""Fit a calibration of pipeweave's predictions for one GPU from measurements made on it.

    python3 calibrate.py --hardware L40 --e2e measured.csv --output L40_calibration.json
    python3 calibrate.py --hardware L40 --kernels dataset/measured/L40/*.csv --output L40_calibration.json
    python3 aggregator.py --workload W.json --hardware L40 --calibration L40_calibration.json --output pred.json

``measured.csv`` has the columns workload,prefill_ms,decode_step_ms,total_ms. Logic in
pipeweave/calibration_fit.py (inputs) and pipeweave/calibration.py (the method).
"""
from __future__ import annotations

import sys

from pipeweave.calibration_fit import main
from pipeweave.cli import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(main))
