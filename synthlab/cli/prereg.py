"""`synthlab prereg check RESULTS_DIR`: per rule, the commit that fixed its text and its preset,
the first run's start as the sweep recorded it, and whether the verdict is confirmatory."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from synthlab.cli import flags
from synthlab.errors import SynthlabError

app = typer.Typer(help="Preregistration: was each rule committed before its data began?", no_args_is_help=True)


def _check(results: list[Path]) -> None:
    from synthlab.claims import prereg  # it reads experiment definitions (torch): only when the command runs

    for folder in results:
        if not (folder / "sweep.json").is_file():
            raise SynthlabError(f"{folder} is not a sweep directory (no sweep.json)")
        typer.echo(f"{folder}:")
        for line in prereg.lines(prereg.check(folder)):
            typer.echo(f"  {line}")


app.command("check")(
    flags.with_signature(
        _check,
        [flags.argument("results", List[Path], "Sweep or results folders (each with sweep.json).")],
        "check",
        """Print, per rule of each folder's definition: its status (confirmatory if the rule and the
    preset were committed before the first run started, else exploratory), the commits (git log)
    and the first run's start (the sweep's own record, or the latest it can have been).""",
    )
)
