"""Every figure of the lab, drawn with seaborn from a sweep's results table (`synthlab plot`,
`synthlab report`), and the training curves of runs (`synthlab curves`).

Each built-in figure takes the table (a pandas DataFrame with the columns of `synthlab.sweeps.results_table`)
and an output folder, saves the figure as PNG and SVG, and returns the paths. Axes carry units:
"bits", "parameters (unique)", "accuracy (%)", "tokens", "recurrent steps", "bytes". A sweep over
seeds is drawn as the mean over seeds with a band (or bar) of one standard error, and every seed
as a point (`style`); a heatmap cell shows the mean, and under it every seed's value (Mano)
or the seeds' range (faithfulness).

- `style`: the shared drawing (matplotlib set up for files, reproducible saving, seeds over the mean).
- `tasks`, `mechanisms`, `scaling`: the built-in kinds, registered here (`PLOTTERS`, `plot`).
- `generic`: an experiment's figure: its built-in kind, or the generic figure of its grid.
- `curves`: training curves of runs, from their metrics.jsonl.

matplotlib and seaborn (seconds to import) are imported inside the functions that draw (`style.pyplot`,
the tick formatters), so the package loads without them: a sweep's closing summary
(`synthlab.report.markdown.summary_lines`) imports it and draws nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from synthlab.errors import SynthlabError
from synthlab.plots.mechanisms import (
    plot_depth,
    plot_exit,
    plot_faithfulness,
    plot_kvcache,
    plot_ouroboros,
    plot_recipe,
    plot_topology,
)
from synthlab.plots.scaling import plot_scaling
from synthlab.plots.tasks import plot_capacity, plot_mano, plot_multihop, plot_reach

PLOTTERS: dict[str, Callable[[pd.DataFrame, Path], list[Path]]] = {
    "capacity": plot_capacity,
    "mano": plot_mano,
    "multihop": plot_multihop,
    "reach": plot_reach,
    "scaling": plot_scaling,
    "exit": plot_exit,
    "kvcache": plot_kvcache,
    "topology": plot_topology,
    "recipe": plot_recipe,
    "depth": plot_depth,
    "faithfulness": plot_faithfulness,
    "ouroboros": plot_ouroboros,
}


def plot(kind: str, table: pd.DataFrame, out: str | Path) -> list[Path]:
    if kind not in PLOTTERS:
        raise SynthlabError(
            f"unknown plot kind '{kind}' (have {', '.join(PLOTTERS)}; a definition without `plot` gets the generic figure)"
        )
    if table.empty:
        raise SynthlabError("results.csv has no rows to plot")
    return PLOTTERS[kind](table, Path(out))
