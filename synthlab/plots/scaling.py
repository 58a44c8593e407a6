"""The figures of scaling laws: the built-in `scaling` figure of a sweep (loss vs N, D and T with the
fitted law) and the fit and residual plot of `synthlab fit --plot` (matplotlib imported where a
figure is drawn, as in the whole package; `synthlab.scaling` loads its fitting modules on first use:
other figures need no scipy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from synthlab import scaling
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write, warn
from synthlab.plots.style import need, pyplot, save

if TYPE_CHECKING:  # annotations only: importing synthlab.scaling loads scipy, which the other figures never need
    from synthlab.scaling.laws import Data, Law
    from synthlab.scaling.optimize import FitResult


def plot_fit(law: Law, parts: Sequence[tuple[str, Data, FitResult]], path: Path) -> None:
    """Two panels: observed vs fitted loss (with y = x), and log residual vs the first variable.

    `parts` are (label, data, fit) triples: one for most laws, one per Tm for the step-wise law.
    Written to a temporary sibling and renamed into place.
    """
    import matplotlib  # where a figure is drawn (the package docstring)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_fit, ax_res) = plt.subplots(1, 2, figsize=(10, 4.2))
    lo, hi = np.inf, 0.0
    for label, data, result in parts:
        X, loss = data.matrix(law), np.asarray(data.loss, dtype=float)
        pred = law.predict(result.theta, X)
        ax_fit.scatter(loss, pred, s=10, alpha=0.7, label=f"{label} (R^2 {result.r2:.3f})")
        ax_res.scatter(X[:, 0], np.log(pred) - np.log(loss), s=10, alpha=0.7, label=label)
        lo, hi = min(lo, loss.min(), pred.min()), max(hi, loss.max(), pred.max())
    ax_fit.plot([lo, hi], [lo, hi], color="black", lw=1, ls="--")
    ax_fit.set(xlabel="observed loss", ylabel="fitted loss")
    ax_fit.set_title(law.formula, fontsize=8)
    ax_res.axhline(0.0, color="black", lw=1, ls="--")
    ax_res.set(xscale="log", xlabel=law.variables[0], ylabel="log fitted - log observed", title="residuals")
    ax_fit.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120))
    plt.close(fig)


def fit_scaling(table: pd.DataFrame):
    """The LoopLM fit saved beside the table if it fitted these numbers (the report's verdict's), else
    a fit of the richest law the table supports: LoopLM if loops vary and rows allow, else Chinchilla."""
    try:
        if "sweep_dir" in table.attrs and (saved := scaling.saved_fit(table, Path(table.attrs["sweep_dir"]))):
            return saved
    except SynthlabError as err:
        warn(f"{err}; the figure draws a refit of its own")
    variables = {v: table[c].to_numpy(float) for v, c in (("N", "params"), ("D", "tokens"), ("Tm", "loops"))}
    data = scaling.Data(variables, table["loss"].to_numpy(float))
    if table["params"].nunique() < 3 or table["tokens"].nunique() < 3:
        return None  # two sizes cannot pin an exponent plus a constant: any fit would be degenerate
    laws = ("looplm", "chinchilla") if table["loops"].nunique() >= 2 else ("chinchilla",)
    return next((scaling.fit(law, data) for law in laws if len(table) > len(scaling.get_law(law).params)), None)


def plot_scaling(table: pd.DataFrame, out: Path) -> list[Path]:
    """Loss vs N, D and T (three panels); dashed: the fitted law's prediction at each run."""
    from matplotlib.ticker import NullFormatter

    d_col, loss_col = scaling.default_columns(table.columns)  # as `synthlab fit` reads the table
    if d_col != "tokens":  # the heldout stage: the held-out loss at each scored checkpoint
        table = table.assign(tokens=table[d_col], loss=table[loss_col])
    need(table, "scaling", "params", "tokens", "loops", "loss")
    plt, sns = pyplot()

    result = fit_scaling(table)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.8), sharey=True)
    if result is not None:
        law = scaling.get_law(result.law)
        X = table[[{"N": "params", "D": "tokens", "Tm": "loops"}[v] for v in law.variables]].to_numpy(float)
        table = table.assign(predicted=law.predict(result.theta, X))
    # one level per grid value (a run's D differs from its seed-mates' by a few tokens): ticks, legend, lines
    table = table.assign(**{c: table[c].map(lambda v: int(float(f"{v:.3g}"))) for c in ("params", "tokens")})
    panels = (
        ("params", "model size N (parameters)", "tokens"),
        ("tokens", "data D (training tokens)", "params"),
        ("loops", "recurrent depth T (loops)", "params"),
    )
    for ax, (x, label, hue) in zip(axes, panels):
        sns.scatterplot(
            data=table,
            x=x,
            y="loss",
            hue=hue,
            style="loops" if x != "loops" else None,
            palette="viridis",
            ax=ax,
            legend="full" if x != "tokens" else False,
        )
        if result is not None:
            for _, group in table.sort_values(x).groupby([c for c in ("params", "tokens", "loops") if c != x]):
                ax.plot(group[x], group["predicted"], "--", color="grey", lw=0.8)
        ax.set(xlabel=label, ylabel="loss (nats/token)", xscale="log" if x != "loops" else "linear")
        ax.xaxis.set_minor_formatter(NullFormatter())  # log-axis minor labels overlap
        values = sorted(table[x].unique())  # label the grid's own values (often within one decade)
        ax.set_xticks(values, [f"{v:.3g}" for v in values], rotation=30 if x != "loops" else 0)
    for ax, ncol in (
        (axes[0], 2),
        (axes[-1], 5),
    ):  # under their panels, off the points; the middle one's colours are the last's
        sns.move_legend(
            ax, "upper center", bbox_to_anchor=(0.5, -0.4), ncol=ncol, fontsize=7, title_fontsize=8, frameon=False
        )
    fig.suptitle(scaling_title(result), fontsize=8)
    return save(fig, out, "scaling")


def scaling_title(result) -> str:
    """The scaling figure's title: the fitted constants, or, for a degenerate fit (as `synthlab fit`
    warns), that its constants are not identified, naming those that ran off. The law's verdict
    (which also tests its form) is the report's."""
    if result is None:
        return "no law fitted (needs >= 3 model sizes, >= 3 data sizes and more runs than parameters)"
    if bad := scaling.implausible(result.params):
        return (
            f"{result.law}: degenerate fit (dashed, R² = {result.r2:.3f}; "
            + ", ".join(f"{k}={v:.3g}" for k, v in bad.items())
            + "): its constants are not identified; the verdict is the claims table's"
        )
    return f"fitted {result.law}: R² = {result.r2:.3f}, " + ", ".join(f"{k}={v:.3g}" for k, v in result.params.items())
