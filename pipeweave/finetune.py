"""Fine-tuning a kernel model on one GPU's measured kernels: where the shipped model extrapolates there, and where
many kernels show that it helps.

Why. The calibration's corrections (:mod:`pipeweave.calibration`) are a low-dimensional function of the
shape: they fix a GPU's efficiency bias where the model's shape structure is right. Where the GPU's kernels lie
outside what the model was trained on (extrapolation flags, docs/METHOD.md §4.3: an unseen architecture,
inputs outside the training range, ensemble members that disagree), the structure itself is guesswork: under
leave-one-GPU-out, H20's BF16 and FP8 GEMMs are more compute-bound than any other GPU's and 86 % of them are
flagged. There the measured kernels teach the MLP more than a correction of its output can.

How. Each ensemble member is trained further, ``EPOCHS`` passes at ``LEARNING_RATE`` (the training recipe's
optimiser, loss and gradient clipping), on the measured kernels of the GPU (log efficiency) together with a
*replay set* that anchors the rest of the model: the operator's full shape grid (the profiler's; for MoE the layers
of the MoE model configs: :func:`pipeweave.profiler.grids.replay_rows`) on every GPU the model was trained on,
labelled with that member's own output. No training data is needed, so a user without the measurement sources can
fine-tune. The measured kernels are repeated to weigh as much as one
training GPU's replay rows. The result is a model for that GPU only, stored in the calibration file; other
GPUs' predictions never use it.

With many kernels. A few kernels only correct the model: :data:`STANDARD` (``EPOCHS`` passes, the measured kernels
weighing as one training GPU's replay rows). Thousands of kernels (the profiler's full grid) say more than that
recipe lets them: leave-one-GPU-out, L40S's GEMMs went 11.0 % (512 kernels) -> 11.9 % (2,048) with it (one draw
each). :data:`THOROUGH` trains ``THOROUGH_EPOCHS`` passes with the measured kernels weighing as much as the whole
replay set (first at a constant rate: 2,048 kernels of L40S 8.9 %, 512 11.1 %, no better than the standard recipe),
its learning rate annealed to near 0 along a half cosine: at a constant rate the last pass leaves each member
wherever its last batches put it (FP8 GEMMs of H20, 1,024 kernels, leave-one-GPU-out: members 1.7-6.5 % on the
GPU's other kernels, and refitting on all kernels after the held-out fifth had chosen gave 3.4 % against the 1.7 %
of the fit it chose); annealed, the same members give 1.5-2.0 %. The
standard recipe's five passes stay at a constant rate: annealed they learn less (FP8 GEMMs of H20, 128 kernels:
3.7 -> 4.7 %). Nor is the extrapolation flag the whole story with
that many kernels: on 1,024 kernels the thorough recipe also beat the corrections alone on H100's GEMMs (7.7 -> 6.4
%), where the model does not extrapolate, and the corrections alone stay best on B200's (the held-out fifth keeps
them). Which one suits a GPU's kernels is not known in advance, so from :data:`MIN_SELECTION_KERNELS` kernels on
the kernels decide (:func:`fine_tune_selected`): each recipe is fine-tuned on all but a seeded fifth of them
(:data:`VALIDATION_SHARE`), and of the corrections alone (:data:`CORRECTIONS_ONLY`) and the two recipes the one
with the smallest mean |log error| on that fifth is kept (a recipe then fine-tuned on all of them). Below that a
fifth is too few kernels to choose on; where the flag calls for fine-tuning (:func:`considers_fine_tuning`), the
standard recipe is kept only if it predicts the kernels better than the corrections alone under
:data:`VALIDATION_FOLDS`-fold cross-validation, each fold scored against the corrections refitted without it
(since 2026-12-06: on the flag alone, leave-one-GPU-out with 32 kernels, the fine-tuning made H20's, L40S's and RTX
PRO 6000's GEMMs worse than the corrections alone).

Where. A fine-tuned model changes the shipped model's efficiency on every kernel, but the measured kernels show
only the changes it makes on them. A fine-tuned model's log efficiency change from the shipped model's is therefore
kept within the range of the changes it made on the measured kernels (:func:`trusted_efficiency`; the range is
stored with the model, :func:`log_change_range`), and the choice below scores the fine-tuning so kept. Without it
(leave-one-GPU-out, five draws of 32 kernels each of A100, A40, L40S and RTX PRO 6000, the corrections and the
interpolation applied to both), BF16 GEMM's fine-tuning changed 0.04-3.6 % of the kernels it did not see by more
than any measured one, some by up to 2.2 in log (9x), and RTX PRO 6000's error rose 9.5 -> 15.5 % and 10.1 -> 16.7
% in two draws (kept in range: 10.9 and 11.9 %), L40S's 13.3 -> 15.6 % in one (13.3 %). Where the fine-tuning
helped, the range kept the gain: A40's GEMMs by 0.1-0.6 points in every draw, the same kept; RTX PRO 6000's FP8
GEMMs 13.3-15.3 -> 10.4-13.3 %, kept within 0.3 points of it.

When. ``calibrate.py --kernels`` considers fine-tuning an operator class in :data:`FINE_TUNABLE` with the
standard recipe when at least :data:`MIN_EXTRAPOLATED_SHARE` of its measured kernels carry one of the extrapolation
flags of :data:`TRIGGER_BITS` and there are at least :data:`MIN_KERNELS` of them, and keeps it as the
cross-validation chooses; from :data:`MIN_SELECTION_KERNELS` on, as the held-out fifth chooses (scored, as the
many-kernel sections of docs/ACCURACY.md measured it, against the corrections fitted on all the kernels). With fewer
kernels where the model does not extrapolate, the corrections alone are the better calibration (docs/ACCURACY.md,
"Few-shot calibration"). Attention and MoE (:data:`SELECTION_ONLY`) are fine-tuned only from
:data:`MIN_SELECTION_KERNELS` kernels on: a few kernels cannot hold the attention model in place against a replay
grid that does not cover them (every GPU got worse on 32), while on the profiler's full attention grid the kernels
themselves do, and the thorough recipe won on every held-out GPU. MoE, whose replay grid (the MoE layers of the MoE
model configs, :func:`pipeweave.profiler.grids.moe_grid`) was never tried on a few kernels, takes the same rule.
Needs torch (``pip install '.[train]'``).
"""
from __future__ import annotations

import base64
import io
import math
from concurrent.futures import FIRST_EXCEPTION, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from analytical_model.registry import get_operator
from pipeweave.cli import UserError, process_pool, usable_cores
from pipeweave.mlp import ensemble_arrays, read_metadata
from pipeweave.predictor import MEMBERS_DISAGREE, OUTSIDE_RANGE, UNSEEN_ARCHITECTURE, training_gpus

#: operator classes a calibration may fine-tune
FINE_TUNABLE = ("gemm", "gemm_fp8", "attn", "moe")
#: classes fine-tuned only where many kernels choose it (:data:`MIN_SELECTION_KERNELS`), never on the flag alone:
#: on 32 kernels the standard recipe made attention worse on every GPU (the replay set does not hold its kernels in
#: place; README, "Calibrating for your GPU"), on 1,024 the thorough recipe won on all five (docs/ACCURACY.md); MoE
#: was only evaluated with many kernels
SELECTION_ONLY = ("attn", "moe")
#: share of a class's measured kernels that must be flagged as extrapolated for it to be fine-tuned
MIN_EXTRAPOLATED_SHARE = 0.5
#: the flags the rule was set and measured on. The ``shares`` bit came later and is not one of them: with it, 96.8 %
#: of B300's GEMMs held out would trigger fine-tuning, which raised their k = 32 error 6.0 → 8.5 % when tried
TRIGGER_BITS = UNSEEN_ARCHITECTURE | OUTSIDE_RANGE | MEMBERS_DISAGREE
#: fewest flagged kernels of a class that fine-tune it: the number the rule was set and measured on (k = 32). At
#: k = 8, where it had never been measured, it made 5 of the 8 leave-one-GPU-out cells it touched worse than the
#: corrections alone, RTX PRO 6000's GEMMs 11.4 → 16.8 % and L40S's 14.4 → 17.5 %, both above their zero-shot error
#: (docs/ACCURACY.md, "Few-shot calibration")
MIN_KERNELS = 32
EPOCHS = 5
LEARNING_RATE = 3e-4  # 0.3 x the training recipe's: a correction of a trained model, not a new one
THOROUGH_EPOCHS = 20


@dataclass(frozen=True)
class Recipe:
    """How long a fine-tuning trains and how much the measured kernels weigh against the replay set."""

    name: str
    epochs: int
    #: the measured kernels (repeated) weigh as much as one training GPU's replay rows (``"one_gpu"``) or as
    #: all of them (``"replay"``)
    measured_weight: str
    #: the learning rate falls from LEARNING_RATE to near 0 along a half cosine over the epochs
    anneal: bool = False

    def measured_rows(self, replay_rows: int, replay_rows_per_gpu: int) -> int:
        return replay_rows if self.measured_weight == "replay" else replay_rows_per_gpu

    def as_dict(self) -> dict:
        return {"recipe": self.name, "epochs": self.epochs, "learning_rate": LEARNING_RATE,
                "learning_rate_schedule": "cosine" if self.anneal else "constant",
                "measured_weight": self.measured_weight}


def considers_fine_tuning(op: str, kernels: int, extrapolated_share: float) -> bool:
    """Whether a calibration on ``kernels`` measured kernels of ``op`` (a class of :data:`FINE_TUNABLE`), of which
    the model extrapolates on ``extrapolated_share``, may fine-tune (:func:`fine_tune_selected` then chooses whether
    it does): from :data:`MIN_SELECTION_KERNELS` kernels on always, below that where the model extrapolates on most
    of at least :data:`MIN_KERNELS`, except for a class of :data:`SELECTION_ONLY`."""
    if kernels >= MIN_SELECTION_KERNELS:
        return True
    return op not in SELECTION_ONLY and kernels >= MIN_KERNELS and extrapolated_share >= MIN_EXTRAPOLATED_SHARE


CORRECTIONS_ONLY = Recipe("corrections_only", 0, "none")  # no fine-tuning: the calibration's corrections alone
STANDARD = Recipe("standard", EPOCHS, "one_gpu")
THOROUGH = Recipe("thorough", THOROUGH_EPOCHS, "replay", anneal=True)
RECIPES = (STANDARD, THOROUGH)
#: from this many kernels on, a held-out fifth of them chooses: at least 40 kernels to compare on
MIN_SELECTION_KERNELS = 200
VALIDATION_SHARE = 0.2
VALIDATION_SEED = 0
#: below MIN_SELECTION_KERNELS a fifth is too few to choose on (6 kernels of 32), so each kernel is predicted once, by
#: the standard recipe fine-tuned without its quarter of them
VALIDATION_FOLDS = 4


def replay_shapes(op: str, config_dir: str | Path | None = None) -> dict[str, list]:
    """The shape columns of the full shape grid for ``op`` (:func:`pipeweave.profiler.grids.replay_rows`: LLM shapes
    of the default model configs and, for the profiled operators, a log-spaced sweep)."""
    from pipeweave.paths import DEFAULT_CONFIG_DIR
    from pipeweave.profiler.grids import replay_rows

    rows = replay_rows(op, config_dir or DEFAULT_CONFIG_DIR)
    return {column: [row[column] for row in rows] for column in get_operator(op).shape_columns}


def model_input_rows(op: str, columns: dict[str, Sequence], hardware: Sequence) -> np.ndarray:
    """Raw model inputs (features, then shape descriptors) of the shapes ``columns`` on each GPU of ``hardware``."""
    operator = get_operator(op)
    return np.concatenate([np.column_stack([operator.features(columns, hw), operator.descriptors(columns, hw)])
                           for hw in hardware])


def above_fixed_time(op: str, inputs: np.ndarray, efficiency: np.ndarray, sm_freq: float,
                     fixed_time_us: float) -> np.ndarray:
    """Which kernels of raw model inputs ``inputs`` and target ``efficiency`` take longer than a model's fixed time:
    the others have no work above it to teach, and :func:`fine_tune` leaves them out."""
    return get_operator(op).ideal_us(inputs, sm_freq) / np.asarray(efficiency, dtype=np.float64) > fixed_time_us


#: most processes a calibration fine-tunes in by default: one fine-tuning choice trains at most 20 members at once
#: (4 folds x 5), and each process holds torch and the replay set (a few hundred MB)
MAX_DEFAULT_WORKERS = 8


def default_workers() -> int:
    """The cores this process may use, at most :data:`MAX_DEFAULT_WORKERS`."""
    return max(1, min(usable_cores(), MAX_DEFAULT_WORKERS))


def fine_tuning_pool(workers: int):
    """A context giving the processes that fine-tune ensemble members at once (:func:`fine_tune`'s ``pool``), or
    None to fine-tune them one after the other here (``workers`` < 2; :func:`pipeweave.cli.process_pool`). Each
    member trains single-threaded with its own seed, so a pool gives the same weights, bit for bit; processes start
    at the first member."""
    return process_pool(workers, "fine-tune")


def fine_tune_member(op: str, directory: str | Path, x_replay: np.ndarray, x_measured: np.ndarray,
                     y_measured: np.ndarray, recipe: Recipe) -> dict[str, np.ndarray]:
    """The weight-file arrays of one ensemble member (torch checkpoint in ``directory``) fine-tuned with ``recipe``
    on the measured rows (network inputs, repeated; log work efficiency) and the replay rows ``x_replay`` labelled
    by the member itself: :func:`fine_tune`'s unit of work."""
    import torch

    from pipeweave.mlp import metadata_transform
    from pipeweave.torch_mlp import exported_arrays, fixed_time_of, load_model_dir
    from pipeweave.training import TrainConfig, loss_function, train_epoch

    config = TrainConfig(progress=False)
    torch.set_num_threads(config.threads)
    model, metadata = load_model_dir(directory, op)
    seed = int(metadata["training"]["seed"])
    x_replay, x_measured = torch.as_tensor(x_replay), torch.as_tensor(x_measured)
    with torch.no_grad():
        y_replay = model(x_replay)
    x, y = torch.cat([x_replay, x_measured]), torch.cat([y_replay, torch.as_tensor(y_measured)])
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=config.weight_decay)
    for epoch in range(recipe.epochs):
        if recipe.anneal:
            optimizer.param_groups[0]["lr"] = LEARNING_RATE * (1 + math.cos(math.pi * epoch / recipe.epochs)) / 2
        train_epoch(model, optimizer, loss_function(config), x, y, torch.randperm(len(x), generator=generator),
                    config.batch_size)
    model.eval()
    return exported_arrays(model, list(metadata["model_info"]["features"]), metadata_transform(metadata),
                           *fixed_time_of(metadata, op))


def member_trainings(op: str, member_dirs: Sequence[str | Path], inputs: np.ndarray, efficiency: np.ndarray,
                     replay: np.ndarray, replay_rows_per_gpu: int, sm_freq: float, recipe: Recipe) -> list[tuple]:
    """The :func:`fine_tune_member` arguments of each member of :func:`fine_tune`."""
    from pipeweave.mlp import metadata_transform, model_inputs, read_metadata, work_efficiency
    from pipeweave.torch_mlp import fixed_time_of

    if len(inputs) == 0:
        raise ValueError(f"{op}: no measured kernels to fine-tune on")
    measured = np.asarray(inputs, dtype=np.float64)
    info = read_metadata(member_dirs[0])  # the members share features and transform (pipeweave.mlp.ensemble_arrays)
    names, transform = list(info["model_info"]["features"]), metadata_transform(info)
    fixed = fixed_time_of(info, op)
    above = above_fixed_time(op, measured, efficiency, sm_freq, fixed[0])
    if not above.any():
        raise ValueError(f"{op}: no measured kernel takes longer than the model's fixed {fixed[0]} us")
    measured, efficiency = measured[above], np.asarray(efficiency, dtype=np.float64)[above]
    # what the members predict: the efficiency of the time above the fixed one (pipeweave.mlp)
    target = np.log(work_efficiency(efficiency, get_operator(op).ideal_us(measured, sm_freq), fixed[0]))
    repeats = max(1, recipe.measured_rows(len(replay), replay_rows_per_gpu) // len(measured))
    rows = (model_inputs(replay, names, transform),
            np.repeat(model_inputs(measured, names, transform), repeats, axis=0),
            np.repeat(target, repeats).astype(np.float32))
    return [(op, str(directory), *rows, recipe) for directory in member_dirs]


def trained_ensembles(fine_tunings: list[list[tuple]], pool=None) -> list[dict[str, np.ndarray]]:
    """The weight-file arrays of each fine-tuning (its :func:`member_trainings`); with a ``pool``
    (:func:`fine_tuning_pool`) the members of all of them train at once, and the first that fails stops those not
    started."""
    if pool is None:
        tuned = [[fine_tune_member(*member) for member in members] for members in fine_tunings]
    else:
        futures = [[pool.submit(fine_tune_member, *member) for member in members] for members in fine_tunings]
        every = [future for started in futures for future in started]
        try:
            wait(every, return_when=FIRST_EXCEPTION)
        finally:  # a member failed (or the wait was interrupted): the members not started never will be
            for future in every:
                future.cancel()
        failed = [future.exception() for future in every if future.done() and not future.cancelled()
                  and future.exception() is not None]
        if failed and isinstance(failed[0], BrokenProcessPool):
            raise UserError("a process fine-tuning ensemble members ended abruptly (killed for memory?): each of "
                            "the --workers processes holds torch and the replay set; pass fewer --workers, or "
                            "--workers 1 to fine-tune in this process") from failed[0]
        if failed:
            raise failed[0]
        tuned = [[future.result() for future in started] for started in futures]
    return [ensemble_arrays(members) if len(members) > 1 else members[0] for members in tuned]


def fine_tune(op: str, member_dirs: Sequence[str | Path], inputs: np.ndarray, efficiency: np.ndarray,
              replay: np.ndarray, replay_rows_per_gpu: int, sm_freq: float, recipe: Recipe = STANDARD,
              pool=None) -> dict[str, np.ndarray]:
    """The weight-file arrays (:mod:`pipeweave.mlp`) of the ensemble of ``member_dirs`` (torch checkpoints)
    fine-tuned with ``recipe`` on measured kernels (raw model inputs and measured ``overall_perf`` on a GPU of
    SM clock ``sm_freq``, MHz; those not above the model's fixed time left out, :func:`above_fixed_time`), with
    the replay inputs ``replay`` labelled by each member itself; the members trained at once in ``pool``
    (:func:`fine_tuning_pool`) where one is given."""
    return trained_ensembles([member_trainings(op, member_dirs, inputs, efficiency, replay, replay_rows_per_gpu,
                                               sm_freq, recipe)], pool)[0]


def fine_tunes_for_gpu(op: str, member_dirs: Sequence[str | Path], registry,
                       fine_tunings: list[tuple[np.ndarray, np.ndarray, Recipe]], sm_freq: float,
                       config_dir: str | Path | None = None, pool=None) -> list[dict[str, np.ndarray]]:
    """:func:`fine_tune` on each (inputs, efficiency, recipe) of ``fine_tunings``, with the replay set of the
    members' training GPUs; with a ``pool``, all at once."""
    shapes = replay_shapes(op, config_dir)
    trained = read_metadata(member_dirs[0]).get("data_info", {}).get("train_hardware_distribution", {})
    replay = model_input_rows(op, shapes, training_gpus(trained, registry))
    per_gpu = len(next(iter(shapes.values())))
    return trained_ensembles([member_trainings(op, member_dirs, inputs, efficiency, replay, per_gpu, sm_freq, recipe)
                              for inputs, efficiency, recipe in fine_tunings], pool)


def fine_tune_for_gpu(op: str, member_dirs: Sequence[str | Path], registry, inputs: np.ndarray,
                      efficiency: np.ndarray, sm_freq: float, config_dir: str | Path | None = None,
                      recipe: Recipe = STANDARD, pool=None) -> dict[str, np.ndarray]:
    """:func:`fine_tune` with the replay set of the members' training GPUs."""
    return fine_tunes_for_gpu(op, member_dirs, registry, [(inputs, efficiency, recipe)], sm_freq, config_dir,
                              pool)[0]


def validation_rows(n: int) -> np.ndarray:
    """The seeded fifth of ``n`` measured kernels that chooses the recipe (:func:`fine_tune_selected`)."""
    return np.sort(np.random.default_rng(VALIDATION_SEED).choice(n, size=round(n * VALIDATION_SHARE), replace=False))


def validation_folds(n: int) -> list[np.ndarray]:
    """The :data:`VALIDATION_FOLDS` seeded folds of ``n`` measured kernels (fewer than
    :data:`MIN_SELECTION_KERNELS`) that choose between the corrections alone and the standard recipe, each kernel in
    one (:func:`fine_tune_selected`)."""
    order = np.random.default_rng(VALIDATION_SEED).permutation(n)
    return [np.sort(fold) for fold in np.array_split(order, VALIDATION_FOLDS)]


def selection_method(kernels: int) -> str:
    """How :func:`fine_tune_selected` chooses on ``kernels`` measured kernels, for messages."""
    if kernels < MIN_SELECTION_KERNELS:
        return f"by {VALIDATION_FOLDS}-fold cross-validation on them"
    return "on a held-out fifth of them"


def compared_fine_tunings(kernels: int) -> int:
    """How many fine-tunings :func:`fine_tune_selected` trains to choose on ``kernels`` measured kernels."""
    return VALIDATION_FOLDS if kernels < MIN_SELECTION_KERNELS else len(RECIPES)


def log_change_range(base: np.ndarray, tuned: np.ndarray) -> tuple[float, float]:
    """(least, greatest) log(``tuned`` / ``base``) over kernels: the change of efficiency from the shipped model's
    (``base``) that a fine-tuned model (``tuned``) makes on the kernels it was fine-tuned on."""
    change = np.log(np.asarray(tuned, dtype=np.float64) / np.asarray(base, dtype=np.float64))
    return float(change.min()), float(change.max())


def trusted_efficiency(base: np.ndarray, tuned: np.ndarray, log_change: tuple[float, float] | None) -> np.ndarray:
    """A fine-tuned model's efficiency ``tuned`` with its log change from the shipped model's ``base`` kept within
    ``log_change`` (:func:`log_change_range` on its measured kernels; None: as it is): only the measured kernels
    tell a fine-tuned model's change from what it makes up (module docstring, "Where")."""
    tuned = np.asarray(tuned, dtype=np.float64)
    if log_change is None:
        return tuned
    base = np.asarray(base, dtype=np.float64)
    return base * np.exp(np.clip(np.log(tuned / base), *log_change))


def fine_tune_selected(op: str, member_dirs: Sequence[str | Path], registry, inputs: np.ndarray,
                       efficiency: np.ndarray, sm_freq: float, base_efficiency: np.ndarray,
                       efficiency_without: Callable[[np.ndarray], np.ndarray], config_dir: str | Path | None = None,
                       pool=None) -> tuple[dict[str, np.ndarray] | None, tuple[float, float] | None, Recipe,
                                           dict[str, float]]:
    """(weight-file arrays, or None for the corrections alone; their :func:`log_change_range` on the measured
    kernels (None with no arrays); the recipe; mean |log error| of each choice on the kernels its fine-tuning did not
    see) for measured kernels (raw model inputs, the ``efficiency`` the model must give
    them under the fitted corrections, the ``base_efficiency`` the model gives them): from
    :data:`MIN_SELECTION_KERNELS` kernels on, of :data:`CORRECTIONS_ONLY` and :data:`RECIPES` the one that predicts a
    held-out fifth best after fine-tuning on the other kernels, every choice scored against ``efficiency``, that is
    under the corrections fitted on all kernels, the fifth's too: the choice is of a fine-tuning on top of the
    corrections the calibration keeps (refitted without the fifth, which scores the corrections alone out of sample,
    they chose worse: GEMM, 239 kernels, leave-one-GPU-out, mean 6.2 -> 6.4 %, four of eleven GPUs worse, none
    better; docs/CALIBRATION.md); below it, of the corrections alone and :data:`STANDARD` the one
    that predicts the kernels best when each is predicted without its fold (:func:`validation_folds`): by the
    corrections and the fine-tuning fitted on the other folds, ``efficiency_without(fold)`` giving the efficiency each
    kernel must get under the corrections fitted without the kernels ``fold`` (fitted on all of them, the corrections
    would score the fold in-sample and the fine-tuning out of it). A fine-tuning is scored as it is applied, its
    change kept within the range it made on the kernels it was fine-tuned on (:func:`trusted_efficiency`). A recipe
    chosen is then fine-tuned on all of them. With a ``pool`` (:func:`fine_tuning_pool`) the members of the
    fine-tunings a choice compares train at once."""
    from pipeweave.mlp import NumpyMLP

    inputs, efficiency = np.asarray(inputs, dtype=np.float64), np.asarray(efficiency, dtype=np.float64)
    base_efficiency = np.asarray(base_efficiency, dtype=np.float64)

    def error(predicted: np.ndarray, rows: np.ndarray) -> float:
        return float(np.mean(np.abs(np.log(np.asarray(predicted, dtype=np.float64) / efficiency[rows]))))

    def fits(fine_tunings: list[tuple[np.ndarray, np.ndarray, Recipe]]) -> list[dict[str, np.ndarray]]:
        return fine_tunes_for_gpu(op, member_dirs, registry, fine_tunings, sm_freq, config_dir, pool)

    def kept(arrays: dict[str, np.ndarray], trained: np.ndarray, scored: np.ndarray) -> np.ndarray:
        """The efficiency of the kernels ``scored`` by the fine-tuning ``arrays`` of the kernels ``trained``."""
        model = NumpyMLP(arrays)
        trust = log_change_range(base_efficiency[trained], model.efficiency(inputs[trained], sm_freq))
        return trusted_efficiency(base_efficiency[scored], model.efficiency(inputs[scored], sm_freq), trust)

    if len(inputs) < MIN_SELECTION_KERNELS:
        recipes, log_errors = (STANDARD,), np.empty((2, len(inputs)))
        folds = validation_folds(len(inputs))
        targets = [np.asarray(efficiency_without(fold), dtype=np.float64) for fold in folds]
        rests = [np.setdiff1d(np.arange(len(inputs)), fold) for fold in folds]
        tuned = fits([(inputs[rest], target[rest], STANDARD) for rest, target in zip(rests, targets)])
        for fold, rest, target, arrays in zip(folds, rests, targets, tuned):
            log_errors[:, fold] = np.log([base_efficiency[fold] / target[fold],
                                          kept(arrays, rest, fold) / target[fold]])
        errors = dict(zip((CORRECTIONS_ONLY.name, STANDARD.name), np.mean(np.abs(log_errors), axis=1).tolist()))
    else:
        recipes, held = RECIPES, validation_rows(len(inputs))
        rest = np.setdiff1d(np.arange(len(inputs)), held)
        errors = {CORRECTIONS_ONLY.name: error(base_efficiency[held], held)}
        tuned = fits([(inputs[rest], efficiency[rest], recipe) for recipe in recipes])
        for recipe, arrays in zip(recipes, tuned):
            errors[recipe.name] = error(kept(arrays, rest, held), held)
    chosen = min((CORRECTIONS_ONLY,) + recipes, key=lambda recipe: errors[recipe.name])
    if chosen is CORRECTIONS_ONLY:
        return None, None, chosen, errors
    arrays = fits([(inputs, efficiency, chosen)])[0]
    trust = log_change_range(base_efficiency, NumpyMLP(arrays).efficiency(inputs, sm_freq))
    return arrays, trust, chosen, errors


def encode_arrays(arrays: dict[str, np.ndarray]) -> str:
    """A weight file's arrays as base64 text (compressed npz), for a JSON calibration file."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_arrays(text: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(base64.b64decode(text.encode("ascii"))), allow_pickle=False) as data:
        return {key: data[key] for key in data.files}
