"""Every option of every user-facing script has a help sentence, and states its default when it has one (issue 9).

Each script's ``main`` is run until it parses its flags; the parser is captured there, so the check covers the
real parsers (sub-commands included) without hard-coding any option list."""
from __future__ import annotations

import argparse

import pytest

import profile_operators
import train_collective_rf
import train_mlp
import train_mlp_quantile
import workload_generator
from analytical_model.__main__ import main as features_main
from dataset import build as dataset_build
from pipeweave import (accuracy, aggregate, bounds, calibration_e2e, calibration_eval, calibration_fit, compare,
                       design_eval, edges, ensemble, interval_eval, kernels, logo_cache, memory_model, peers,
                       quantize_model, torch_mlp, transfer_ideas)
from pipeweave.cli import ArgumentParser
from pipeweave.profiler import crosscheck, onboard
from pipeweave.serving import cli as serving_cli
from pipeweave.serving import report as serving_report
from pipeweave.serving import search

SCRIPTS = {
    "aggregator.py": aggregate.main, "predict_kernels.py": kernels.main, "analytical_model": features_main,
    "workload_generator.py": workload_generator.main, "train_mlp.py": train_mlp.main,
    "train_mlp_quantile.py": train_mlp_quantile.main, "train_collective_rf.py": train_collective_rf.main,
    "compare_pred_real.py": compare.main_pred_real, "compare_vllm_pred_real.py": compare.main_vllm,
    "compare_pred_real.py --summarize_real": compare.main_summarize, "profile_operators.py": profile_operators.main,
    "dataset.build": dataset_build.main, "pipeweave.accuracy": accuracy.main, "pipeweave.ensemble": ensemble.main,
    "pipeweave.edges": edges.main, "pipeweave.interval_eval": interval_eval.main, "serve_sim.py": serving_cli.main,
    "search_config.py": search.main, "calibrate.py": calibration_fit.main, "pipeweave.bounds": bounds.main,
    "pipeweave.calibration_e2e": calibration_e2e.main, "pipeweave.calibration_eval": calibration_eval.main,
    "pipeweave.logo_cache": logo_cache.main, "pipeweave.memory_model": memory_model.main, "pipeweave.peers": peers.main,
    "pipeweave.quantize_model": quantize_model.main, "pipeweave.torch_mlp": torch_mlp.main,
    "pipeweave.transfer_ideas": transfer_ideas.main, "pipeweave.profiler.onboard": onboard.main,
    "pipeweave.profiler.crosscheck": crosscheck.main, "pipeweave.serving.report": serving_report.main,
    "pipeweave.design_eval": design_eval.main,
}


class _Captured(Exception):
    pass


def captured_parsers(main, monkeypatch) -> list[argparse.ArgumentParser]:
    parsers = []

    def capture(self, args=None, namespace=None):
        parsers.append(self)
        raise _Captured
    monkeypatch.setattr(ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(_Captured):
        main([])
    out = []
    for parser in parsers:
        out.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.extend(action.choices.values())
    return out


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    problems = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or not action.option_strings:
            continue
        name = action.option_strings[-1]
        text = action.help or ""
        if len(text.split()) < 2:
            problems.append(f"{name}: no help sentence")
        elif action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in text.lower():
            problems.append(f"{name}: default {action.default!r} not stated")
    return problems


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_option_has_help_and_default(script, monkeypatch):
    parsers = captured_parsers(SCRIPTS[script], monkeypatch)
    problems = [f"{parser.prog} {p}" for parser in parsers for p in undocumented(parser)]
    assert not problems, "\n".join(problems)
    for parser in parsers:  # a bare % in a help text fails only when --help formats it
        assert parser.format_help()


def test_kernel_cli_help_lists_shape_columns_per_operator(monkeypatch):
    from analytical_model.registry import OPERATORS

    for main in (features_main, kernels.main):
        text = "\n".join(parser.format_help() for parser in captured_parsers(main, monkeypatch))
        flat = " ".join(text.split())
        for key, operator in OPERATORS.items():
            assert f"{key}: {','.join(operator.shape_columns)}" in flat.replace(", ", ","), (key, flat)
