"""The `synthlab` command line: a thin typer layer over the library.

Each area registers its commands here from its own module in this package. Command modules import
heavy libraries (torch, transformers, ray) inside the command functions, so `synthlab gen` and
`synthlab fit` start fast. A SynthlabError (or an OSError, or running out of memory) anywhere
becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import re

import click
import typer
from typer.core import TyperGroup

from synthlab import __version__
from synthlab.errors import TaskError
from synthlab.sweeps.schema import table

# Parse errors: click's own, or those of the click copy that typer >= 0.2x vendors.
_CLICK_ERRORS = (click.ClickException, getattr(typer, "TyperException", click.ClickException))


def _out_of_memory(err: BaseException) -> str | None:
    """', tried to allocate <size>' of an out-of-memory error ('' if it names none), None for any other error."""
    message = str(err)
    if (found := re.search(r"tried to allocate (\d+) bytes", message)) is not None:  # the CPU allocator
        return f", tried to allocate {int(found.group(1)) / 2**30:,.1f} GiB at once"
    if (found := re.search(r"out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)", message)) is not None:  # CUDA
        return f" on the GPU, tried to allocate {found.group(1)} at once"
    oom = isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError" or "out of memory" in message
    return "" if oom else None


class _ReadableErrors(TyperGroup):
    """Turns SynthlabError (or a generator's TaskError), an OSError (naming its file), and a
    subcommand's bad option (`--L abc`), into one line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TaskError as err:  # a SynthlabError, or a task generator's own error
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(code=2) from None
        except (MemoryError, RuntimeError) as err:  # out of memory (torch's OutOfMemoryError is a RuntimeError)
            if (size := _out_of_memory(err)) is None:
                raise
            typer.echo(f"error: out of memory{size}: use a smaller model, batch or sequence length", err=True)
            raise typer.Exit(code=2) from None
        except OSError as err:  # a file that could not be read or written: name it, no traceback
            where = f"{err.filename}: " if err.filename else ""
            typer.echo(f"error: {where}{err.strerror or err}", err=True)
            raise typer.Exit(code=2) from None
        except _CLICK_ERRORS as err:  # a bad option or argument: one line instead of typer's box
            if type(err).__name__ == "NoArgsIsHelpError":  # `synthlab gen` alone prints its help
                raise
            context = getattr(err, "ctx", None)
            where = f" (see `{context.command_path} --help`)" if context is not None else ""
            typer.echo(f"error: {err.format_message()}{where}", err=True)
            raise typer.Exit(code=2) from None


app = typer.Typer(
    cls=_ReadableErrors,
    help="synthlab: generate synthetic tasks, train looped and plain models, measure, fit laws.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    rich_markup_mode=None,  # help text as written: no [markup] (it ate '[default: ...]', 'W[h; h]')
)


def _print_version(given: bool) -> None:
    if given:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the synthlab version and exit."
    ),
) -> None:
    """synthlab: generate synthetic tasks, train looped and plain models, measure, fit laws."""


@app.command()
def version() -> None:
    """Print the synthlab version."""
    _print_version(True)


@app.command()
def columns() -> None:
    """Print the columns of a sweep's results.csv: each family, its type, the stage that writes it
    and what it means."""
    typer.echo(table())


# --- command registrations (one line per area; keep this list sorted by area) ---
from synthlab.cli import curves as _curves  # noqa: E402

app.command("curves")(_curves.curves)

from synthlab.cli import export as _export  # noqa: E402

app.command("export")(_export.export)

from synthlab.cli import fit as _fit  # noqa: E402

app.command("fit")(_fit.fit)

from synthlab.cli import gen as _gen  # noqa: E402

app.add_typer(_gen.app, name="gen")

from synthlab.cli import ouroboros as _ouroboros  # noqa: E402

app.add_typer(_ouroboros.app, name="ouroboros")

from synthlab.cli import sample as _sample  # noqa: E402

app.command("sample")(_sample.sample)

from synthlab.cli import prereg as _prereg  # noqa: E402

app.add_typer(_prereg.app, name="prereg")

from synthlab.cli import sweep as _sweep  # noqa: E402

app.command("sweep")(_sweep.sweep)
app.command("plot")(_sweep.plot)
app.command("steps")(_sweep.steps)
app.command("report")(_sweep.report)
app.command("publish")(_sweep.publish)

from synthlab.cli import flags as _flags  # noqa: E402
from synthlab.cli import train as _train  # noqa: E402

app.command("train", cls=_flags.PanelCommand)(_train.train)  # --help in the run.toml's sections
app.command("eval")(_train.evaluate)
app.command("capacity")(_train.capacity)


def main() -> None:
    """Console-script entry point."""
    app()
