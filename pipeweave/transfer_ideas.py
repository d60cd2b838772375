"""Leave-one-GPU-out test of extra model inputs that might explain the per-GPU efficiency bias.

    python3 -m pipeweave.transfer_ideas [--op gemm] [--max_rows_per_gpu 2000] [--epochs 30] [--ideas a,b]
                                        [--inputs log1p|pipe_shares] [--seeds 42,1,2,3,4]

For every idea, the operator's model is trained with the idea's extra inputs appended (log1p) to its network
inputs (``--inputs``: METHOD's log1p of every input, which the GEMM model read when the spec-sheet ideas were
tested, or the pipe shares it reads now; docs/METHOD.md §4.1) and scored on the whole held-out GPU, once per
GPU (leave-one-GPU-out), with a reduced, fixed budget (defaults: 2,000 rows per GPU, 30 epochs; the shipped
models use 20,000 and 300); with several ``--seeds``, as the median of one member per seed, as the ensembles
ship. An idea is kept only if it lowers the LOGO duration error on most GPUs and on average;
docs/ZERO_SHOT.md reports every idea tried. The extra inputs are per-GPU constants from the hardware JSON
(audited, with sources):

* ``power``: board power per SM-cycle, tdpW / (numSms x smFreq): a small budget means the clock sags below
  smFreq under load (A40 300 W for 84 SMs at 1.74 GHz vs H100 700 W for 132 at 1.83 GHz);
* ``hbm``: 1 for HBM, 0 for GDDR (latency and bank behaviour differ at equal bandwidth);
* ``l2``: L2 size in MiB (6 MiB on GA102 to 128 MiB on GB202: how much of a GEMM's operands stay on chip);
* ``boost``: boostClock / smFreq (headroom between the tensor-peak clock and the maximum clock);
* ``balance``: DRAM bytes per dense tensor FLOP (memBandwidth / (tcBf16 x numSms x smFreq));
* ``energy``: board power per dense BF16 tensor FLOP/s, tdpW / (tcBf16 x numSms x smFreq): a GEMM's power
  draw scales with its tensor rate, so a part whose budget is small for its peak rate (B200 0.44 W per
  TFLOP/s) sustains less of it than one with headroom (H20 2.7); ``power`` cannot tell H20 from H100 (equal W
  per SM-cycle, 3.9x apart per tensor FLOP);
* ``sm_bandwidth``: DRAM bytes per SM-cycle at spec bandwidth, memBandwidth / (numSms x smFreq): what each SM
  must keep in flight to saturate the DRAM (Little's law). H20 needs 28.2, H200 20.4, H100 13.9; aiconfigurator's
  decode-sized GEMMs reach a median 0.80 of spec bandwidth on H100 and 0.72 on H200, and H20's decode steps run
  1.25x H100's on 1.2x its bandwidth. The features carry it already, as the ratio of ``sm_max_shared_cycle`` to
  ``sm_max_global_cycle`` (docs/ACCURACY_HISTORY.md, "End to end");
* ``ampere``, ``ada``, ``hopper``, ``blackwell``: 1 on a GPU of that architecture (``ampere+ada+hopper+blackwell``
  is the one-hot architecture): siblings share their generation's kernels and power behaviour (L40S, the only
  Ada GPU with GEMM data, runs large GEMMs at 0.63 of peak; its die-mate L40 has no data).

and one per-row input, a property of the measurement rather than of the GPU:

* ``vidur_harness``: 1 for a row timed by Vidur's profiler, 0 for the other harnesses (docs/DATA.md). On the GPUs
  both measured, Vidur's large GEMMs take 1.1-1.2x aiconfigurator's (docs/ACCURACY.md, "Where measurement sources
  disagree"); with the input the model can learn that offset from those GPUs instead of absorbing it into the
  GPU effects.
* ``l2_fit``: the kernel's unique DRAM bytes (A, B and C once) over the GPU's L2 size. A harness re-runs a
  kernel in a loop, so operands that fit stay in the L2 (L40S's 96 MiB holds weights that H100's 50 MiB does
  not): a memory-bound GEMM of a 117 MB operand runs at 0.69 of L40S's DRAM bandwidth, and the leave-one-GPU-out
  model predicted it 3.35x faster, at a speed only an L2 that held it would give. Unlike ``l2``, it is not a
  constant of the GPU: the same GPU's rows take values on both sides of 1.
* ``pipeweave_harness``: 1 for a row of the PipeWeave artifact's CSVs (its own FP8 GEMM harness). H800 and H100
  have identical model inputs, and on their 2,080 common FP8 shapes aiconfigurator's H100 durations are 1.14x
  H800's PipeWeave ones (median; interquartile range 0.89-1.39x), while PipeWeave's H100 and H800 agree within 2 %:
  without the input, a held-out H100 is predicted from its twin's harness.

The held-out GPU's rows are scored with their own harness; a prediction for a user takes 0 (aiconfigurator's).

Two ideas change the model's form rather than add an input: a *pipe idea* adds one more cycle column that takes
part in the pipe shares (``launch_pipe``: a fixed 2 µs at the SM clock), and a *target idea* takes a fixed time
out of every duration before the network sees it (``launch_offset``: 1 µs; t = t0 + C / (p f)). Both answer one
observation: held out, short GEMMs are predicted with a bias of the GPU (H100's 1.19x too slow), though H200's
measured times of the same shapes are 0.98x H100's on 1.47x the bandwidth.

A *drop idea* takes feature columns out of the network's inputs. ``no_l2_pipe`` drops the L2 cycles
(``local_cycle``, ``sm_max_local_cycle``): the L2 bandwidth is the one hardware field without a vendor figure
(an estimate on every GPU, its provenance says which: README, "Hardware audit"), its share beside
the DRAM share is the GPU constant memBandwidth / l2CacheBandwidth, and it is the one field the models read
backwards (a copy of a GPU with more L2 bandwidth predicted up to 1.5x slower: README, "Physical consistency").
No C_ideal sums an L2 column, so without the input a prediction does not depend on the L2 bandwidth at all.
"""
from __future__ import annotations

import time
from argparse import ArgumentTypeError
from dataclasses import replace

import numpy as np
import pandas as pd

from analytical_model.hardware import load_hardware
from analytical_model.pipes import ARCHITECTURES
from analytical_model.registry import harness_input_names, harness_marks, operator_keys, source_family
from pipeweave.bounds import EXACT_DRAM_DESCRIPTOR, frame_l2_cycles
from pipeweave.cli import ArgumentParser, positive_int, run_cli
from pipeweave.mlp import LOG1P, PIPE_SHARES, model_inputs, total_efficiency, work_efficiency
from pipeweave.modeling import (
    DATASET_DIR,
    cap_rows_per_gpu,
    dataset_paths,
    duration_errors,
    feature_matrix,
    fixed_time_us,
    frame_ideal_us,
    input_names,
    load_splits,
    read_dataset,
)
from pipeweave.splits import shape_keys
from pipeweave.torch_mlp import predict_efficiency
from pipeweave.training import TrainConfig, fit


def _spec_value(idea: str, spec) -> float:
    if idea == "power":
        return spec.tdp_w / (spec.num_sms * spec.sm_freq)
    if idea == "hbm":
        return float(spec.memory_type.startswith("HBM"))
    if idea == "l2":
        return spec.l2_cache_size / 1024
    if idea == "boost":
        if spec.boost_clock is None:  # optional field: GB200, B300 and GB300 have no vendor boost clock
            raise ValueError(f"idea 'boost' needs boostClock, which hardware/{spec.stem}.json does not give")
        return spec.boost_clock / spec.sm_freq
    if idea == "balance":
        return spec.mem_bandwidth * 1e9 / (spec.tc_bf16 * spec.num_sms * spec.sm_freq * 1e6)
    if idea == "sm_bandwidth":
        return spec.mem_bandwidth * 1e9 / (spec.num_sms * spec.sm_freq * 1e6)
    if idea in ARCHITECTURES:
        return float(spec.architecture == idea)
    if idea == "energy":
        return spec.tdp_w / (spec.tc_bf16 * spec.num_sms * spec.sm_freq * 1e-6)
    raise ValueError(f"unknown idea {idea!r}; known: {', '.join(IDEAS)}")


def working_set_over_l2(frame: pd.DataFrame) -> np.ndarray:
    """Per row: the problem's bytes over the GPU's L2 size, both as DRAM cycles at the spec bandwidth."""
    return frame[EXACT_DRAM_DESCRIPTOR].to_numpy(np.float64) / frame_l2_cycles(frame)


# per-row ideas: a property of each measurement, its harness, marked as the registry's harness inputs mark it; and
# whether the kernel's operands fit in the L2, which a benchmark loop that re-runs a kernel keeps warm
ROW_IDEAS = {name: (lambda frame, family=family: harness_marks(frame["source"], (family,))[:, 0])
             for family, name in zip(("vidur", "pipeweave"), harness_input_names(("vidur", "pipeweave")))}
ROW_IDEAS["l2_fit"] = working_set_over_l2
#: a kernel's fixed time, of the order of the smallest measured kernels (1.5-2.5 µs on every GPU with data)
LAUNCH_PIPE_US = 2.0
# pipe ideas: one more cycle column that takes part in the pipe shares (with --inputs pipe_shares the busiest pipe
# may be the new one, so it also changes the size input). ``launch_pipe``: the fixed time at the SM clock. A kernel
# far below it takes about that long whatever the GPU's bandwidth (H200's short GEMMs take 0.98x H100's on 1.47x
# the bandwidth), while the other pipes' cycles make a small kernel look bandwidth-bound
PIPE_IDEAS = {"launch_pipe": (lambda frame: LAUNCH_PIPE_US * frame["sm_freq"].to_numpy(np.float64))}
# target ideas: a fixed time in µs taken out of every duration before the model sees it, t = t0 + C / (p f), so
# the network learns the efficiency p of the rest and the held-out GPU gets the fixed part exactly; on top of the
# operator's own (the registry's ``fixed_time_us``: BF16 and FP8 GEMM ship with 1 µs, this idea's first test, and
# attention with 6 µs).
# ``launch_offset``: 1 µs, below every measured kernel (the smallest take 1.5 µs)
TARGET_IDEAS = {"launch_offset": 1.0}
# drop ideas: feature columns taken out of the network's inputs (module docstring)
DROP_IDEAS = {"no_l2_pipe": ("local_cycle", "sm_max_local_cycle")}
TRANSFORMS = {"log1p": LOG1P, "pipe_shares": PIPE_SHARES}  # --inputs
IDEAS = ("power", "hbm", "l2", "boost", "balance", "energy", "sm_bandwidth", *ARCHITECTURES, *ROW_IDEAS,
         *PIPE_IDEAS, *TARGET_IDEAS, *DROP_IDEAS)
#: ideas that add no input column of their own
FORM_IDEAS = (*PIPE_IDEAS, *TARGET_IDEAS, *DROP_IDEAS)


def extra_inputs(frame: pd.DataFrame, ideas: tuple[str, ...]) -> np.ndarray:
    specs = {name: load_hardware(name) for name in frame["hardware"].unique()}
    columns = [ROW_IDEAS[i](frame) if i in ROW_IDEAS else
               frame["hardware"].map({n: _spec_value(i, s) for n, s in specs.items()}).to_numpy(np.float64)
               for i in ideas if i not in FORM_IDEAS]
    return np.column_stack(columns) if columns else np.zeros((len(frame), 0))


def with_pipes(frame: pd.DataFrame, features: np.ndarray, names: tuple[str, ...],
               ideas: tuple[str, ...]) -> tuple[np.ndarray, tuple[str, ...]]:
    """``features`` (columns ``names``) with the cycle column of each pipe idea of ``ideas`` appended and the
    columns of its drop ideas taken out."""
    pipes = [i for i in ideas if i in PIPE_IDEAS]
    if pipes:
        features = np.column_stack([features, *(PIPE_IDEAS[i](frame) for i in pipes)])
        names = (*names, *(f"{i}_cycle" for i in pipes))
    return without_dropped(features, names, ideas)


def without_dropped(features: np.ndarray, names: tuple[str, ...],
                    ideas: tuple[str, ...]) -> tuple[np.ndarray, tuple[str, ...]]:
    """``features`` (columns ``names``) without the columns the drop ideas of ``ideas`` take out."""
    dropped = {name for i in ideas if i in DROP_IDEAS for name in DROP_IDEAS[i]}
    if not dropped:
        return features, names
    missing = sorted(dropped - set(names))
    if missing:
        raise ValueError(f"a drop idea names columns the model does not read: {', '.join(missing)}")
    kept = [j for j, name in enumerate(names) if name not in dropped]
    return features[:, kept], tuple(names[j] for j in kept)


def target_offset_us(op: str, ideas: tuple[str, ...], config: TrainConfig) -> float:
    """The fixed time taken out of every duration: the recipe's own (the registry's; docs/METHOD.md §4.3) and the
    target ideas' on top of it."""
    return fixed_time_us(op, config) + sum(TARGET_IDEAS[i] for i in ideas if i in TARGET_IDEAS)


def logo_error(op: str, gpu: str, ideas: tuple[str, ...], config: TrainConfig, clip: bool = False,
               transform: str = LOG1P, seeds: tuple[int, ...] | None = None) -> dict:
    """LOGO error of ``gpu`` with the ideas' inputs appended (log1p) to the network inputs of ``transform``, one
    member per seed of ``seeds`` (default: ``config.seed``), their median; with ``clip``, the held-out GPU's idea
    values are clipped to the training GPUs' range (an MLP extrapolates a per-GPU constant it has never seen
    arbitrarily)."""
    train_all, test = load_splits(op, DATASET_DIR, [gpu])
    model_names = input_names(op, config)
    test_features, names = with_pipes(test, feature_matrix(test, op, config), model_names, ideas)
    test_ideas = extra_inputs(test, ideas)
    offset_us = target_offset_us(op, ideas, config)
    test_ideal_us = frame_ideal_us(op, test)

    def inputs(features, extra):
        if transform == LOG1P:  # the ideas' original form: one log1p over features and extras alike
            return model_inputs(np.column_stack([features, extra]))
        return np.column_stack([model_inputs(features, names, transform), np.log1p(extra)]).astype(np.float32)

    predictions = []
    for seed in seeds or (config.seed,):
        member = replace(config, seed=seed)
        train = cap_rows_per_gpu(train_all, member.max_rows_per_gpu, member.seed)
        train_extra, test_extra = extra_inputs(train, ideas), test_ideas
        if clip and len(ideas):
            test_extra = np.clip(test_ideas, train_extra.min(axis=0), train_extra.max(axis=0))
        train_features = with_pipes(train, feature_matrix(train, op, member), model_names, ideas)[0]
        target = work_efficiency(train["overall_perf"].to_numpy(np.float64), frame_ideal_us(op, train), offset_us)
        model, _ = fit(inputs(train_features, train_extra), target, member, group_keys=shape_keys(train, op))
        predictions.append(total_efficiency(predict_efficiency(model, inputs(test_features, test_extra)),
                                            test_ideal_us, offset_us))
    predicted = np.median(np.array(predictions), axis=0)
    measured = test["overall_perf"].to_numpy(np.float64)
    err = duration_errors(measured, predicted) * 100
    signed = np.median(measured / predicted - 1)  # > 0: the model predicts the GPU too slow
    harness = test["source"].map(source_family).to_numpy()
    return {"mean": float(err.mean()), "median_signed": float(signed * 100),
            "by_harness": {name: float(err[harness == name].mean()) for name in sorted(set(harness))}}


def seed_list(text: str) -> tuple[int, ...]:
    """``--seeds``: a comma list of integers."""
    try:
        return tuple(int(seed) for seed in text.split(","))
    except ValueError:
        raise ArgumentTypeError(f"expected a comma list of integer seeds, got {text!r}") from None


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python3 -m pipeweave.transfer_ideas",
                            description="Leave-one-GPU-out test of extra model inputs (spec-sheet constants, the "
                                        "measurement harness).")
    parser.add_argument("--op", default="gemm", choices=operator_keys(trainable=True),
                        help="the operator whose model is tested (default: gemm)")
    parser.add_argument("--max_rows_per_gpu", type=positive_int, default=2000,
                        help="training rows per GPU, a reduced budget (default: 2000)")
    parser.add_argument("--epochs", type=positive_int, default=30, help="training epochs (default: 30)")
    parser.add_argument("--ideas", default="none," + ",".join(IDEAS),
                        help="comma list; 'none' is the baseline, 'a+b' combines ideas (default: none and every idea)")
    parser.add_argument("--seeds", type=seed_list, default=(42,),
                        help="comma list of training seeds, one member each, scored as their median (default: 42; "
                             "a second run with another seed measures the noise)")
    parser.add_argument("--inputs", choices=tuple(TRANSFORMS), default="log1p",
                        help="the network inputs the ideas are appended to (default: log1p)")
    parser.add_argument("--gpus", default=None, help="comma list of GPUs to hold out (default: every GPU)")
    parser.add_argument("--clip", action="store_true",
                        help="clip the held-out GPU's idea values to the training GPUs' range")
    args = parser.parse_args(argv)
    combinations = args.ideas.split(",")
    unknown = sorted({idea for combination in combinations if combination != "none"
                      for idea in combination.split("+") if idea not in IDEAS})
    if unknown:  # before any training: a typo would otherwise cost the whole baseline run
        parser.error(f"unknown idea(s) {', '.join(map(repr, unknown))}; known: none, {', '.join(IDEAS)}")
    train_path, test_path = dataset_paths(args.op, DATASET_DIR)
    gpus = args.gpus.split(",") if args.gpus else sorted(
        set(read_dataset(train_path)["hardware"]) | set(read_dataset(test_path)["hardware"]))
    config = TrainConfig(epochs=args.epochs, max_rows_per_gpu=args.max_rows_per_gpu, progress=False,
                         seed=args.seeds[0])
    rows = []
    for idea in combinations:
        ideas = () if idea == "none" else tuple(idea.split("+"))
        for gpu in gpus:
            started = time.perf_counter()
            result = logo_error(args.op, gpu, ideas, config, clip=args.clip, transform=TRANSFORMS[args.inputs],
                                seeds=args.seeds)
            rows.append({"idea": idea, "gpu": load_hardware(gpu).stem, "mean": result["mean"]})
            by_harness = ", ".join(f"{name} {error:.2f} %" for name, error in result["by_harness"].items())
            print(f"{idea:>14s} {load_hardware(gpu).stem:>15s} mean {result['mean']:6.2f} %  median signed "
                  f"{result['median_signed']:+6.1f} %  by harness: {by_harness}  "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    table = pd.DataFrame(rows).pivot(index="gpu", columns="idea", values="mean").round(1)
    table.loc["mean"] = table.mean().round(1)
    print(table.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
