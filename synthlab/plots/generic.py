"""An experiment's figure: the built-in kind its definition names (`plot = "mano"`, synthlab.plots),
or, for a definition that names none, the generic figure of its grid.

The generic figure draws the task's headline metric (generators' `TaskSpec.headline`, or another
results column) against the grid's first axis, one line (a numeric axis) or bar (otherwise) per
combination of the other axes; seeds are drawn as the mean with one standard error and every seed
as a point (`synthlab.plots.style`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from synthlab import plots
from synthlab.claims.verdicts import SEED_COLUMNS
from synthlab.errors import SynthlabError
from synthlab.plots.style import bars_and_seeds, mean_and_seeds, pyplot, save, seeds_note
from synthlab.sweeps import experiments
from synthlab.sweeps.results_table import factor_column
from synthlab_generators import TASKS


def headline(task: str) -> str:
    """The results column a figure of this task leads with."""
    return TASKS[task].headline if task in TASKS else "accuracy"


def grid_factors(experiment: experiments.Experiment, preset: str | None) -> list[str]:
    """The results columns of the preset's grid axes in file order (every preset's, for a preset the
    definition does not have), seeds left out."""
    presets = [preset] if preset in experiment.presets else list(experiment.presets)
    axes = [factor_column(a) for p in presets for a in experiment.presets[p].get("grid", {})]
    return [a for a in dict.fromkeys(axes) if a not in SEED_COLUMNS]


def plot_grid(table: pd.DataFrame, out: Path, name: str, factors: list[str], metric: str) -> list[Path]:
    """The generic figure: `metric` against the first grid axis that varies, one line or bar per
    combination of the others."""
    if metric not in table:
        raise SynthlabError(
            f"the figure of {name} needs column '{metric}' in results.csv "
            f"(have {', '.join(c for c in table.columns if table[c].dtype.kind in 'if')})"
        )
    if table[metric].isna().all():
        raise SynthlabError(f"the figure of {name}: column '{metric}' of results.csv is empty in every row")
    varying = [f for f in factors if f in table and table[f].nunique(dropna=False) > 1]
    data = table.copy()
    x = varying[0] if varying else "runs"
    if not varying:
        data[x] = "all"
    hue = " / ".join(varying[1:]) or None
    if hue:
        data[hue] = data[varying[1:]].astype(str).agg(" / ".join, axis=1)
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    if pd.api.types.is_numeric_dtype(data[x]):
        mean_and_seeds(sns, ax, data, x, metric, hue=hue)
        values = data[x].dropna()
        if len(values) and values.min() > 0 and values.max() / values.min() >= 16:
            ax.set_xscale("log", base=2)
    else:
        if hue:  # one bar per cell of the grid
            label = f"{x} / {hue}"
            data[label] = data[x].astype(str) + " / " + data[hue]
            x = label
        bars_and_seeds(sns, ax, data, x, metric)
        ax.tick_params(axis="x", labelrotation=30)
    ax.set(xlabel=x, ylabel=metric, title=f"{name}: {metric}" + seeds_note(table))
    if hue and ax.get_legend() is not None:
        ax.legend(title=hue, fontsize=7, title_fontsize=7)
    return save(fig, Path(out), name)


def draw(
    experiment: experiments.Experiment, table: pd.DataFrame, out: str | Path, metric: str | None = None
) -> list[Path]:
    """The experiment's figures from its results table: its built-in kind, else the generic figure
    (of `metric`, default the task's headline)."""
    if table.empty:
        raise SynthlabError("results.csv has no rows to plot")
    if experiment.plot and metric is None:
        return plots.plot(experiment.plot, table, out)
    preset = str(table["preset"].iloc[0]) if "preset" in table else None
    return plot_grid(
        table, Path(out), experiment.name, grid_factors(experiment, preset), metric or headline(experiment.task)
    )


def figures_of(info: dict[str, Any], table: pd.DataFrame, out: Path, factors: list[str]) -> list[Path]:
    """A reported sweep's figures (its sweep.json `info`): the recorded kind, else the generic
    figure of the recorded definition."""
    if info.get("plot"):
        return plots.plot(info["plot"], table, out)
    experiment = experiments.load_recorded(info["definition"])
    return plot_grid(
        table, out, experiment.name, [f for f in factors if f not in SEED_COLUMNS], headline(experiment.task)
    )
