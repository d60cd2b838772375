"""The bandwidth model of the memory-bound operators (RMSNorm, SiLU*Mul; docs/METHOD.md §4.3): how they transfer
to GPUs outside their MLP's training set.

The MLPs of these operators are trained on three GPUs (A100, A40, H100); on a fourth they extrapolate freely
(leave-one-GPU-out 70–500 % off). Their duration instead follows three physical terms of the analytical memory
features (docs/METHOD.md §3), with three parameters shared by every GPU::

    t = L + C_dram / (η · f) + B_sm / (β · T · f)

* ``L`` (µs): the fixed cost of the kernel (launch, the first row's round trip);
* ``C_dram / (η · f)``: the loads at a fraction ``η`` of the spec DRAM bandwidth (``global_cycle`` = C_dram);
* ``B_sm / (β · T · f)``: the busiest SM's loads (``sm_max_in_flight`` KiB) at ``β`` bytes per SM cycle and
  resident thread, ``T`` = the SM's resident-thread limit (:attr:`HardwareSpec.max_threads_per_sm`: 1536 on
  compute capability 8.6/8.9/12.x, 2048 on 8.0/9.0/10.x). One CTA per token row keeps a bounded number of
  loads in flight per resident thread, so by Little's law an SM moves bytes in proportion to the threads it
  holds, whatever the DRAM can do. This term is what makes the model transfer between HBM and GDDR GPUs; the
  ``T`` factor halves the leave-one-GPU-out error on A40 (23.7 → 11.8 % RMSNorm, 16.2 → 7.9 % SiLU*Mul) and
  brings H100 SiLU*Mul from 21.0 to 18.9 % (docs/ACCURACY.md).

The parameters are fitted (least squares of log duration, fixed start: deterministic) on the training rows of
the model's GPUs and stored in the model's ``metadata.json`` under ``memory_model``. The predictor uses this model
instead of the MLP for a memory-bound operator on a GPU absent from the MLP's training data, and for a row with an
input outside the MLP's training range (:meth:`pipeweave.predictor.KernelPredictor.unbounded_efficiency`); inside
it, on a trained GPU, the MLP is more accurate.
"""
from __future__ import annotations

import numpy as np

from analytical_model.hardware import DEFAULT_HARDWARE_DIR, hardware_registry
from analytical_model.registry import DRAM_CYCLE_FEATURE, get_operator

SM_BYTES_FEATURE = "sm_max_in_flight"
PARAMETERS = ("latency_us", "dram_fraction", "bytes_per_thread_cycle")


def terms(op: str, features: np.ndarray, sm_freq_mhz, threads_per_sm) -> tuple[np.ndarray, np.ndarray]:
    """(DRAM time at spec bandwidth in µs, busiest-SM bytes per MHz and resident thread) of float64 feature rows
    on GPUs of SM clock ``sm_freq_mhz`` and resident-thread limit ``threads_per_sm`` (scalars or per row)."""
    names = get_operator(op).feature_names
    freq = np.asarray(sm_freq_mhz, dtype=np.float64)
    features = np.asarray(features, dtype=np.float64)
    sm_bytes = features[:, names.index(SM_BYTES_FEATURE)] * 1024
    return (features[:, names.index(DRAM_CYCLE_FEATURE)] / freq,
            sm_bytes / (freq * np.asarray(threads_per_sm, dtype=np.float64)))


def duration_us(parameters: dict, op: str, features: np.ndarray, sm_freq_mhz, threads_per_sm) -> np.ndarray:
    missing = [name for name in PARAMETERS if name not in parameters]
    if missing:
        raise ValueError(f"the {op} bandwidth model lacks {', '.join(missing)} (written by an older version); "
                         f"refit it: python3 -m pipeweave.memory_model")
    dram_us, sm_bytes = terms(op, features, sm_freq_mhz, threads_per_sm)
    return (parameters["latency_us"] + dram_us / parameters["dram_fraction"]
            + sm_bytes / parameters["bytes_per_thread_cycle"])


def fit(op: str, features: np.ndarray, sm_freq_mhz: np.ndarray, threads_per_sm: np.ndarray,
        measured_us: np.ndarray) -> dict:
    """The three parameters by least squares of log duration, η ≤ 1 (training extras: scipy)."""
    from scipy.optimize import least_squares

    dram_us, sm_bytes = terms(op, features, sm_freq_mhz, threads_per_sm)
    log_measured = np.log(np.asarray(measured_us, dtype=np.float64))

    def residual(log_p: np.ndarray) -> np.ndarray:
        p = np.exp(log_p)
        return np.log(p[0] + dram_us / p[1] + sm_bytes / p[2]) - log_measured

    # η ≤ 1: no kernel loads faster than the spec bandwidth
    solution = least_squares(residual, np.log([3.0, 0.5, 0.005]), bounds=([-np.inf, -np.inf, -np.inf], [np.inf, 0.0, np.inf]))
    return {name: float(value) for name, value in zip(PARAMETERS, np.exp(solution.x))}


def frame_threads_per_sm(frame, hardware_dir=DEFAULT_HARDWARE_DIR) -> np.ndarray:
    """The resident-thread limit of each row's GPU (the ``hardware`` column) of a dataset frame."""
    registry = hardware_registry(hardware_dir)
    limits = {name: registry.get(name).max_threads_per_sm for name in frame["hardware"].unique()}
    return frame["hardware"].map(limits).to_numpy(np.float64)


def frame_duration_us(parameters: dict, op: str, frame) -> np.ndarray:
    """:func:`duration_us` of the rows of a dataset frame (feature columns, ``sm_freq``, ``hardware``)."""
    names = list(get_operator(op).feature_names)
    return duration_us(parameters, op, frame[names].to_numpy(np.float64), frame["sm_freq"].to_numpy(np.float64),
                       frame_threads_per_sm(frame))


def fit_frame(op: str, frame) -> dict:
    """:func:`fit` on a dataset frame (feature columns, ``sm_freq``, ``hardware``, ``avg_duration``)."""
    names = list(get_operator(op).feature_names)
    return fit(op, frame[names].to_numpy(np.float64), frame["sm_freq"].to_numpy(np.float64),
               frame_threads_per_sm(frame), frame["avg_duration"].to_numpy(np.float64))


def main(argv=None) -> int:
    """Fit the bandwidth model of each memory-bound operator on its shipped MLP's training GPUs and store it in
    that model's metadata.json (training does this itself; this adds it to a model trained before)."""
    import json
    import sys

    from analytical_model.registry import operator_keys
    from pipeweave.cli import ArgumentParser, write_atomically
    from pipeweave.mlp import latest_model_dir, read_metadata
    from pipeweave.modeling import cap_rows_per_gpu, dataset_paths, read_dataset
    from pipeweave.paths import DATASET_DIR, DEFAULT_MODEL_DIR

    parser = ArgumentParser(prog="python3 -m pipeweave.memory_model", description=main.__doc__)
    parser.add_argument("--model_dir", default=str(DEFAULT_MODEL_DIR),
                        help="root of the trained MLPs whose metadata stores the fit (default: mlp_models)")
    parser.add_argument("--dataset_dir", default=str(DATASET_DIR), help="the built datasets (default: dataset)")
    args = parser.parse_args(argv)
    for op in (key for key in operator_keys(trainable=True) if get_operator(key).dram_bound):
        directory = latest_model_dir(args.model_dir, op)
        metadata = read_metadata(directory)
        trained = metadata["data_info"]["train_hardware_distribution"]
        train = read_dataset(dataset_paths(op, args.dataset_dir)[0])
        train = train[train["hardware"].isin(list(trained))]
        # the metadata counts the training file's rows of each GPU, before --max_rows_per_gpu drew from them
        if len(train) != sum(trained.values()):
            raise ValueError(f"{op}: {len(train)} training rows in {args.dataset_dir}, the model's training file had "
                             f"{sum(trained.values())}; rebuild the dataset (python3 -m dataset.build)")
        train = cap_rows_per_gpu(train, metadata["training"].get("max_rows_per_gpu"), metadata["training"]["seed"])
        metadata["memory_model"] = fit_frame(op, train)
        text = json.dumps(metadata, indent=2, ensure_ascii=False)
        write_atomically(directory / "metadata.json", lambda tmp: tmp.write_text(text))
        print(f"{directory}/metadata.json: memory_model {metadata['memory_model']}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    import sys

    from pipeweave.cli import run_cli

    sys.exit(run_cli(main))
