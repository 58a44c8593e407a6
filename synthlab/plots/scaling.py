"""Fit and residual plots for scaling-law fits (matplotlib imported lazily: `synthlab fit` starts fast)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from synthlab.files import atomic_write
from synthlab.scaling.laws import Data, Law
from synthlab.scaling.optimize import FitResult


def plot_fit(law: Law, parts: Sequence[tuple[str, Data, FitResult]], path: Path) -> None:
    """Two panels: observed vs fitted loss (with y = x), and log residual vs the first variable.

    `parts` are (label, data, fit) triples: one for most laws, one per Tm for the step-wise law.
    Written to a temporary sibling and renamed into place.
    """
    import matplotlib

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
