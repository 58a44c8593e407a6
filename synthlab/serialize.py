"""Typed dataclass configs to and from JSON and TOML: the one serialiser of every config.

Every config in synthlab (generator params, model, training, sweeps) is a dataclass. This module
turns them into plain dicts and back, strictly: an unknown key is an error that names the key and
suggests the closest valid one, and values are checked against the field types that matter
(nested dataclasses, tuples, literals are left to each config's own `__post_init__` validation).

Precedence, as everywhere in synthlab: CLI flags override a config file, which overrides defaults
(`merge` applies a dict of overrides onto a dataclass instance).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
import tomllib

from synthlab.errors import SynthlabError, from_tasks

T = TypeVar("T")


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass (nested ones included) as a dict of JSON-able values; tuples become lists."""
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"{type(config).__name__} is not a dataclass")
    return json.loads(json.dumps(dataclasses.asdict(config)))


def _check_keys(cls: type, data: dict[str, Any], where: str) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    hints = typing.get_type_hints(cls)
    inner = {  # a section's fields by name: the suggestion for a key given outside its section
        g.name: f"{f.name}.{g.name}"
        for f in dataclasses.fields(cls)
        if "section" in f.metadata
        for g in dataclasses.fields(hints[f.name])
    }
    for key in data:
        if key not in names:
            candidates = {name: name for name in names} | inner
            close = [candidates[c] for c in difflib.get_close_matches(key, list(candidates), n=1)]
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SynthlabError(f"unknown config key '{where}{key}' for {cls.__name__}{hint}")


def _convert(tp: Any, value: Any, where: str) -> Any:
    """Convert a JSON/TOML value to the annotated field type where the two differ."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return from_dict(tp, value, where=f"{where}.")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        if len(args) == 1:
            return _convert(args[0], value, where)
        return value
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        return tuple(_convert(inner, v, where) for v in value)
    if origin is list and isinstance(value, list):
        args = typing.get_args(tp)
        return [_convert(args[0], v, where) if args else v for v in value]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass `cls` from a dict; unknown keys raise SynthlabError with a suggestion."""
    if not isinstance(data, dict):
        raise SynthlabError(f"config section '{where or cls.__name__}' must be a table/object")
    _check_keys(cls, data, where)
    hints = typing.get_type_hints(cls)
    kwargs = {k: _convert(hints[k], v, f"{where}{k}") for k, v in data.items()}
    try:
        with from_tasks():  # a task's params check their values themselves
            return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise SynthlabError(f"invalid {cls.__name__}: {err}") from None


def merge(config: T, overrides: dict[str, Any]) -> T:
    """A copy of `config` with `overrides` applied (None values mean 'not given' and are skipped)."""
    data = to_dict(config)
    for key, value in overrides.items():
        if value is None:
            continue
        data[key] = value
    return from_dict(type(config), data)


def save(config: Any, path: str | Path) -> None:
    """Write a config as JSON or TOML, by the file's suffix."""
    path = Path(path)
    data = to_dict(config)
    if path.suffix == ".toml":
        path.write_text(tomli_w.dumps(_drop_none(data)))
    else:
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_dict(path: str | Path) -> dict[str, Any]:
    """Read a JSON or TOML file into a dict, with a readable error for a missing or bad file."""
    path = Path(path)
    if not path.is_file():
        raise SynthlabError(f"config file not found: {path}")
    try:
        if path.suffix == ".toml":
            return tomllib.loads(path.read_text())
        return json.loads(path.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise SynthlabError(f"cannot parse config {path}: {err}") from None


def load(cls: type[T], path: str | Path) -> T:
    """Read a dataclass config from JSON or TOML."""
    return from_dict(cls, load_dict(path))


def _drop_none(data: Any) -> Any:
    # TOML has no null: a None field is simply absent (and comes back as its default).
    if isinstance(data, dict):
        return {k: _drop_none(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [_drop_none(v) for v in data]
    return data


def content_hash(data: Any) -> str:
    """Stable 12-hex-digit digest of a JSON-able value (key order does not matter)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    short: str | None = None,
    min: int | None = None,
    metavar: str | None = None,
) -> Any:
    """A config field with its help text (shown by the CLI flags generated from the dataclass,
    `synthlab.cli.flags`); `default` dataclasses.MISSING: a field (and flag) without a default, one
    the user must give. `flag`: the flag when it is not --field-name (a boolean's as written: no
    --no- form, or both as 'on/off': '--copy/--no-copy'); `short`: a one-letter alias ('-p'); `min`:
    the least value the flag takes; `metavar`: the value's name in the help ('K')."""
    given = {"flag": flag, "short": short, "min": min, "metavar": metavar}
    return dataclasses.field(
        default=default, metadata={"help": help, **{k: v for k, v in given.items() if v is not None}}
    )


def section(cls: type, help: str) -> Any:
    """A config field that is a section, a dataclass of its own (`[train.optim]` in a run.toml);
    the generated CLI keeps each of its fields a flag of its own, grouped under `help` in --help."""
    return dataclasses.field(default_factory=cls, metadata={"help": help, "section": True})


def check_finite(where: str, **values: float | None) -> None:
    """Refuse a NaN or infinite setting, naming it as `where` + its name (None: not set)."""
    for name, value in values.items():
        if value is not None and not math.isfinite(value):
            raise SynthlabError(f"{where}{name} must be a finite number, got {value}")


def check_at_least(where: str, least: int, **values: int) -> None:
    """Refuse a count below `least`, naming it as `where` + its name."""
    for name, value in values.items():
        if value < least:
            raise SynthlabError(f"{where}{name} must be >= {least}, got {value}")
