"""CLI options generated from config dataclasses, so every field is a flag with the field's help.

Fields carry their help text in `field(metadata={"help": ...})` (`synthlab.serialize.option`,
`synthlab_generators.common.param`). `dataclass_options(cls)` turns them into keyword parameters of
a typer command: `--field-name` (or the field's own "flag", with its "short" alias, "min" and
"metavar"), booleans as `--x/--no-x` (a boolean with its own flag: that flag as written), tuples as
comma-separated words, lists as a repeatable flag, a field without a default as a required flag; a
section (`synthlab.serialize.section`: `TrainConfig.optim`) gives its fields' flags, flat (`--lr`),
which --help lists under the section's heading (`PanelCommand`).
With `unset=True` every default is None, so the command can tell a flag the user gave from one they
did not (CLI flags > config file > defaults); the help still shows the field's default. Every
command builds its options here and nowhere else (`tests/test_cli_options.py` walks the whole app:
every option a field with its help, no typer.Option written by hand).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from typing import Any, List, Optional

import typer

from synthlab.errors import SynthlabError
from synthlab_generators.common import field_flag as flag_name


def _option(
    name: str,
    annotation: Any,
    default: Any,
    flag: str,
    help: str,
    shown: str | None = None,
    *,
    metavar: str | None = None,
    short: str | None = None,
    min: int | None = None,
    panel: str | None = None,
) -> inspect.Parameter:
    """One keyword parameter whose default is a typer Option; `shown`: the default its help shows
    when that is not `default` itself (the default of a field whose flag defaults to unset);
    `short`: a one-letter alias; `min`: the least value (click refuses less, the help shows it);
    `panel`: the heading --help lists it under (`PanelCommand`)."""
    if shown:
        help = f"{help}  [default: {shown}]"
    decls = (flag, short) if short else (flag,)
    option = typer.Option(
        default, *decls, help=help, show_default=shown is None, metavar=metavar, min=min, rich_help_panel=panel
    )
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=option)


def argument(name: str, annotation: Any, help: str) -> inspect.Parameter:
    """One required positional parameter (a typer Argument), for commands built by `with_signature`."""
    return inspect.Parameter(
        name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation, default=typer.Argument(..., help=help)
    )


def _plain(tp: Any) -> Any:
    """`int | None` -> int; other annotations unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _shown(value: Any) -> str | None:
    """A field's default as its help shows it; None for none to show (None or "": the help says
    what an unset field means)."""
    if value is None or value == "" or value is dataclasses.MISSING:
        return None
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def leaf_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of `cls` that are flags: its own, and those of its sections (`serialize.section`)
    in their place, so a nested config keeps one flat flag per setting."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        out += leaf_fields(hints[f.name]) if "section" in f.metadata else [f]
    return out


def dataclass_options(
    cls: type, *, unset: bool = False, exclude: tuple[str, ...] = (), panel: str | None = None
) -> list[inspect.Parameter]:
    """Typer parameters for the fields of `cls` (help from each field's metadata), under the --help
    heading `panel`; a section's fields under its own heading (the section field's help)."""
    hints = typing.get_type_hints(cls)
    params = []
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        if "section" in f.metadata:
            params += dataclass_options(hints[f.name], unset=unset, exclude=exclude, panel=f.metadata["help"])
            continue
        tp = _plain(hints[f.name])
        flag, help = flag_name(f), f.metadata.get("help", "")
        extra = {k: f.metadata.get(k) for k in ("short", "min", "metavar")} | {"panel": panel}
        if tp is bool and not f.metadata.get("flag"):
            flag = f"{flag}/--no-{flag[2:]}"
        if typing.get_origin(tp) is tuple:  # a list of words on the command line: comma-separated
            tp, help = str, f"{help} Comma-separated."
        elif typing.get_origin(tp) is list:  # a repeatable flag: typer's List of the element type
            tp = List[typing.get_args(tp)[0]]
        if unset:
            params.append(_option(f.name, Optional[tp], None, flag, help, _shown(f.default) or "", **extra))
        else:
            default = ",".join(str(v) for v in f.default) if isinstance(f.default, tuple) else f.default
            default = ... if default is dataclasses.MISSING else default  # no default: a required flag
            params.append(_option(f.name, Optional[tp] if default is None else tp, default, flag, help, **extra))
    return params


def given(values: dict[str, Any], cls: type) -> dict[str, Any]:
    """The fields of `cls` among `values` that the user set (not None), a section's as its own
    table; comma lists as tuples of the field's element type."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if "section" in f.metadata:  # a section's flags given: its table
            if inner := given(values, hints[f.name]):
                out[f.name] = inner
            continue
        value = values.get(f.name)
        if value is None:
            continue
        tp = _plain(hints[f.name])
        if typing.get_origin(tp) is tuple and isinstance(value, str):
            kind = typing.get_args(tp)[0]
            words = [v.strip() for v in value.split(",") if v.strip()]
            try:
                value = tuple(kind(w) for w in words)
            except ValueError:
                raise SynthlabError(
                    f"{flag_name(f)} takes comma-separated {kind.__name__} values, got '{value}'"
                ) from None
        out[f.name] = value
    return out


def parsed(values: dict[str, Any], *classes: type) -> tuple:
    """One instance of each options class from a command's keyword values (`given`: a flag left
    unset keeps the field's default)."""
    return tuple(cls(**given(values, cls)) for cls in classes)


def with_signature(func, params: list[inspect.Parameter], name: str, doc: str):
    """`func(**kwargs)` presented to typer with the parameters `params`."""
    func.__signature__ = inspect.Signature(params)
    func.__name__ = name
    func.__doc__ = doc
    return func


class PanelCommand(typer.core.TyperCommand):
    """A command whose --help lists its options under their panels' headings (a config's sections,
    `dataclass_options(panel=...)`), in order of first appearance: typer draws panels only in its
    rich help, which the app turns off (`rich_markup_mode=None`: help text as written)."""

    def format_options(self, ctx, formatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            heading = "Arguments" if param.param_type_name == "argument" else getattr(param, "rich_help_panel", None)
            groups.setdefault(heading or "Options", []).append(record)
        for heading, records in groups.items():
            with formatter.section(heading):
                formatter.write_dl(records)
