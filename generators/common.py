"""The one interface every task generator implements, and small helpers they share.

A task is a `TaskSpec`: a typed params dataclass (validated in `__post_init__`, every field with
a help text and a CLI flag in its metadata) and a function `generate(params, rng) -> Dataset`.
`generate` draws every random number from the `numpy.random.Generator` it is given, so the same
params and seed give byte-identical files. It returns the vocabulary and the files' contents as
iterables of text chunks; `synthlab_generators.writer.write_dataset` puts them on disk.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from synthlab.errors import SynthlabError

# Special tokens of every task, in id order (<pad> is id 0). Text fields never contain <pad>;
# prompts and questions start with <bos> and end with <ans>; plain texts (biographies, facts,
# edge statements) carry no special token: the data loader wraps them as it needs.
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<ans>")


def param(default: Any, help: str, flag: str | None = None) -> Any:
    """A params field with its CLI help text and flag (default flag: --field-name)."""
    return field(default=default, metadata={"help": help, "flag": flag})


def flag_of(params_cls: type, name: str) -> str:
    """The CLI flag of a params field, e.g. 'n_train' -> '--n-train' (used in error messages)."""
    meta = {f.name: f.metadata for f in dataclasses.fields(params_cls)}[name]
    return meta.get("flag") or "--" + name.replace("_", "-")


class TaskParams:
    """Base of every task's params dataclass: validation helpers that name the CLI flag."""

    def require(self, ok: bool, name: str, message: str) -> None:
        """Raise SynthlabError '--flag message (got value)' unless `ok`."""
        if not ok:
            value = getattr(self, name)
            raise SynthlabError(f"{flag_of(type(self), name)} {message} (got {value!r})")

    def require_int(self, name: str, low: int, high: int | None = None) -> None:
        """An integer field in [low, high] (high None: no upper bound)."""
        value = getattr(self, name)
        is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        bound = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
        self.require(is_int and value >= low and (high is None or value <= high), name,
                     f"must be {bound}")

    def require_choice(self, name: str, choices: Iterable[str]) -> None:
        choices = tuple(choices)
        self.require(getattr(self, name) in choices, name, f"must be one of {', '.join(choices)}")


@dataclass
class Dataset:
    """What a generator returns; the writer turns it into DIR/*.

    tokens:  the task's vocabulary without the special tokens, in id order.
    files:   file name -> iterable of text chunks (JSON Lines: each chunk is whole lines, each
             line ending in a newline) or, for a .json file, a JSON-able object.
    counts:  records per file (meta.json), e.g. {"train": 1000, "test": 100}.
    extra:   task facts for meta.json (e.g. how many k-hop questions exist).
    """

    tokens: list[str]
    files: dict[str, Iterable[str] | dict]
    counts: dict[str, int]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    """A registry entry: the task's name, params class, generate function and one-line help."""

    name: str
    params_cls: type
    generate: Callable[[Any, np.random.Generator], Dataset]
    help: str


def json_line(record: dict) -> str:
    """One JSON Lines line; the fast paths in the generators format lines to this same layout."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def chunked(lines: Iterable[str], size: int = 10_000) -> Iterable[str]:
    """Join lines into chunks of `size` lines (fewer, larger writes)."""
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == size:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)
