"""The PNG figures of docs/PAPER.md, drawn from the results dict alone (so ``--from_results`` redraws them)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeweave.cli import save_png
from pipeweave.paper import published
from pipeweave.paper.experiments import VARIANTS

SHORT = {"pipeweave": "pipes +\ndescriptors", "paper_full": "pipes only\n(paper full)", "no_math": "w/o math\n(memory)",
         "no_mio": "w/o MIO\n(tensor)", "descriptors_only": "descriptors\nonly"}
METHODS = ("roofline", "ridge", "hgb", "mlp")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


def _grouped_bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    """One bar per (group, series), series side by side within a group."""
    x = np.arange(len(groups))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
    ax.set_xticks(x, groups, fontsize=8, rotation=20 if len(groups) > 6 else 0)


def ablation_figure(results: dict, path: Path) -> Path:
    plt = _pyplot()
    ops = list(results["ablation"])
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4), squeeze=False)
    x = np.arange(len(VARIANTS))
    for ax, op in zip(axes[0], ops):
        variants = results["ablation"][op]
        values = [np.array([m["overall"]["mean_relative_error"] for m in variants[v]["mlp"].values()]) * 100
                  for v in VARIANTS]
        means = np.array([v.mean() for v in values])
        spread = np.array([[m - v.min() for m, v in zip(means, values)], [v.max() - m for m, v in zip(means, values)]])
        ax.bar(x - 0.2, means, 0.4, yerr=spread, capsize=3, label="ours (mean, seed range)", color="tab:blue")
        paper = published.ABLATION.get(op, {})
        paper_values = [paper[v]["mean_relative_error"] * 100 if v in paper else np.nan for v in VARIANTS]
        ax.bar(x + 0.2, paper_values, 0.4, label="paper (published, its data)", color="white", edgecolor="tab:red",
               hatch="//")
        ax.set_xticks(x, [SHORT[v] for v in VARIANTS], fontsize=8)
        ax.set_ylabel("mean relative efficiency error (%)")
        ax.set_title(op)
        ax.legend(fontsize=8)
    return _finish(plt, fig, path)


def logo_figure(results: dict, path: Path) -> Path:
    plt = _pyplot()
    ops = list(results["logo"])
    fig, axes = plt.subplots(len(ops), 1, figsize=(10, 4 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        cells = results["logo"][op]
        _grouped_bars(ax, [g.replace("NVIDIA ", "").replace(" Blackwell Server Edition", "") for g in cells],
                      {SHORT[v].replace("\n", " "): [c[v]["duration_mean_abs_pct_error"] for c in cells.values()]
                       for v in VARIANTS})
        ax.set_ylabel("mean duration error (%)")
        ax.set_title(f"{op}: GPU left out of training")
        ax.legend(fontsize=8, ncol=3)
    return _finish(plt, fig, path)


def baselines_figure(results: dict, path: Path) -> Path:
    plt = _pyplot()
    ops = list(results["baselines"])
    fig, ax = plt.subplots(figsize=(9, 4))
    _grouped_bars(ax, ops, {m: [results["baselines"][op]["methods"][m]["overall"]["duration_mean_abs_pct_error"]
                                for op in ops] for m in METHODS})
    ax.set_yscale("log")
    ax.set_ylabel("mean duration error (%), test split")
    ax.legend(fontsize=8)
    return _finish(plt, fig, path)


def write_figures(results: dict, directory: Path) -> dict[str, Path]:
    """{name: path} of the figures the results support."""
    directory = Path(directory)
    out = {}
    if results["ablation"]:
        out["ablation"] = ablation_figure(results, directory / "paper_ablation.png")
    if results["logo"]:
        out["logo"] = logo_figure(results, directory / "paper_logo.png")
    if results["baselines"]:
        out["baselines"] = baselines_figure(results, directory / "paper_baselines.png")
    return out
