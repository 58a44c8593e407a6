"""`synthlab curves RUN [RUN...]`: training curves (loss, loss per recurrent step, lr) of runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List

import typer

from synthlab.cli import flags
from synthlab.files import check_writable
from synthlab.serialize import option


@dataclasses.dataclass(frozen=True)
class CurvesOptions:
    """How `synthlab curves` colours its runs and where it draws them. Beside the command rather
    than in synthlab.plots, which imports pandas and matplotlib on import (the CLI starts without them)."""

    by: str | None = option(
        None,
        "A sweep's results.csv column to colour its runs by (e.g. loops): runs of one value share a colour "
        "(default: one per run).",
    )
    out: Path | None = option(None, "Figure directory (default: FIRST_RUN/figures).", short="-o")


def _curves(runs: list[Path], **kwargs) -> None:
    from synthlab.plots import curves as curveslib  # pandas, torch: only when the command runs

    (options,) = flags.parsed(kwargs, CurvesOptions)
    out = options.out or Path(runs[0]) / "figures"
    check_writable(out)
    for path in curveslib.plot_curves(curveslib.collect(runs, options.by), out):
        typer.echo(str(path))


curves = flags.with_signature(
    _curves,
    [
        flags.argument("runs", List[Path], "Run folders (metrics.jsonl) and/or sweep folders (results.csv)."),
        *flags.dataclass_options(CurvesOptions),
    ],
    "curves",
    "Draw training curves (PNG and SVG) of one or many runs, overlaid with a legend.",
)
