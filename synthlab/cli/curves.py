"""`synthlab curves RUN [RUN...]`: training curves (loss, loss per recurrent step, lr) of runs."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from synthlab.files import check_writable


def curves(
    runs: List[Path] = typer.Argument(..., help="Run folders (metrics.jsonl) and/or sweep folders (results.csv)."),
    by: Optional[str] = typer.Option(
        None,
        "--by",
        help="A sweep's results.csv column to colour its runs by "
        "(e.g. loops): runs of one value share a colour (default: one per run).",
    ),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Figure directory (default: FIRST_RUN/figures)."),
) -> None:
    """Draw training curves (PNG and SVG) of one or many runs, overlaid with a legend."""
    from synthlab.plots import curves as curveslib

    out = out or Path(runs[0]) / "figures"
    check_writable(out)
    for path in curveslib.plot_curves(curveslib.collect(runs, by), out):
        typer.echo(str(path))
