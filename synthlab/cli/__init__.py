"""The `synthlab` command line: a thin typer layer over the library.

Each area registers its commands here from its own module in this package. Command modules import
heavy libraries (torch, transformers, ray) inside the command functions, so `synthlab gen` and
`synthlab fit` start fast. A SynthlabError anywhere becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import click
import typer
from typer.core import TyperGroup

from synthlab.errors import SynthlabError


class _ReadableErrors(TyperGroup):
    """Turns SynthlabError into a one-line message and exit code 2 (also under CliRunner)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SynthlabError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(code=2) from None


app = typer.Typer(
    cls=_ReadableErrors,
    help="synthlab: generate synthetic tasks, train looped and plain models, measure, fit laws.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.command()
def version() -> None:
    """Print the synthlab version."""
    from synthlab import __version__

    typer.echo(__version__)


# --- command registrations (one line per area; keep this list sorted by area) ---
from synthlab.cli import fit as _fit  # noqa: E402

app.command("fit")(_fit.fit)

from synthlab.cli import gen as _gen  # noqa: E402

app.add_typer(_gen.app, name="gen")

from synthlab.cli import ouroboros as _ouroboros  # noqa: E402

app.add_typer(_ouroboros.app, name="ouroboros")

from synthlab.cli import sweep as _sweep  # noqa: E402

app.command("sweep")(_sweep.sweep)
app.command("plot")(_sweep.plot)
app.command("steps")(_sweep.steps)
app.command("report")(_sweep.report)

from synthlab.cli import train as _train  # noqa: E402

app.command("train")(_train.train)
app.command("eval")(_train.evaluate)
app.command("capacity")(_train.capacity)


def main() -> None:
    """Console-script entry point."""
    app()
