"""Drawing functions shared by the figures (`synthlab.plots`: built-in kinds, generic, curves):
matplotlib set up for files, figures saved reproducibly as PNG and SVG, sweeps over seeds drawn as
the mean over seeds with one standard error and every seed as a point, and the check that a table
has the columns a built-in figure needs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from synthlab.errors import SynthlabError
from synthlab.files import atomic_write


def pyplot():
    import matplotlib  # matplotlib and seaborn: only where a figure is drawn (the package docstring)

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    matplotlib.rcParams["svg.hashsalt"] = "synthlab"  # fixed element ids: an unchanged figure is byte-identical
    return plt, sns


def save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    fig.tight_layout()
    for path in paths:  # a report copying the figure never sees half of one
        # no creation date or software version in the file: regenerating leaves git clean
        metadata = {"Date": None} if path.suffix == ".svg" else {"Software": None}
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=150, metadata=metadata))
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


def short_count(value: float) -> str:
    """12,345 -> 12K, 3.4e6 -> 3.4M (two significant figures at most): sizes in tables and on axes."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{float(f'{value / scale:.2g}'):g}{suffix}"
    return f"{value:.0f}"


def seed_count(table: pd.DataFrame) -> int:
    """How many (training seed, data seed) pairs the table holds (1 without seed columns)."""
    seeds = [c for c in ("seed", "data_seed") if c in table]
    return len(table[seeds].drop_duplicates()) if seeds else 1


def layer_passes(table: pd.DataFrame) -> pd.DataFrame:
    """The table with `passes` (layer applications per token, distinct layers x loops: what a
    model's FLOPs grow with) and `kind` ("looped" for one layer looped, "plain" for k x 1 with
    k > 1), read from the k x m `model` label (a table without one: one layer, `loops`)."""
    layers = table["model"].str.extract(r"^(\d+)x")[0].astype(int) if "model" in table else table["loops"] * 0 + 1
    kind = (layers == 1).map({True: "looped", False: "plain"})
    return table.assign(passes=layers * table["loops"], kind=kind)


def mean_and_seeds(sns, ax, data: pd.DataFrame, x: str, y: str, legend: str | bool = "auto", **kw) -> None:
    """A line through the mean over seeds, a band of +-1 standard error, and every seed as a point
    (`legend` is the line's; the points add none)."""
    sns.lineplot(data=data, x=x, y=y, marker="o", errorbar=("se", 1), ax=ax, legend=legend, **kw)
    if seed_count(data) > 1:
        sns.scatterplot(data=data, x=x, y=y, ax=ax, legend=False, alpha=0.45, s=16, **kw)


def bars_and_seeds(sns, ax, data: pd.DataFrame, x: str, y: str, **kw) -> None:
    """Bars at the mean over seeds with +-1 standard error, and every seed as a point."""
    many = seed_count(data) > 1
    sns.barplot(data=data, x=x, y=y, errorbar=("se", 1) if many else None, color="lightsteelblue", ax=ax, **kw)
    if many:
        sns.stripplot(data=data, x=x, y=y, color="black", size=4, jitter=False, ax=ax, **kw)


def seeds_note(table: pd.DataFrame) -> str:
    """What a figure's title adds for a table over several seeds ("" for one)."""
    n = seed_count(table)
    return f" (mean of {n} seeds ± s.e.; points: seeds)" if n > 1 else ""


def need(table: pd.DataFrame, kind: str, *columns: str) -> None:
    """Raise naming the columns a built-in figure `kind` needs that the table lacks or holds
    empty in every row (an empty figure would look like a result)."""
    if missing := [c for c in columns if c not in table.columns]:
        raise SynthlabError(f"plot '{kind}' needs column(s) {missing} in results.csv")
    if empty := [c for c in columns if table[c].isna().all()]:
        raise SynthlabError(f"plot '{kind}' needs column(s) {empty}, empty in every row of results.csv")


def percent(table: pd.DataFrame, column: str = "accuracy") -> pd.Series:
    return 100.0 * table[column]
