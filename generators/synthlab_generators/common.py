"""The one interface every task generator implements, and the small functions they share.

Adding a task = one generator module + its SPEC (and a line in the registry `TASKS`). The module
must provide:

- a params dataclass (a subclass of `TaskParams`, frozen), validated in `__post_init__`, every
  field declared with `param(default, help, flag)` so that `synthlab gen TASK` gets a CLI flag
  and help text for it;
- `generate(params, rng) -> Dataset`, drawing every random number from the
  `numpy.random.Generator` it is given, so the same params and seed give byte-identical files.
  It returns the vocabulary and the files' contents as iterables of text chunks;
  `synthlab_generators.writer.write_dataset` puts them on disk;
- `shape(params) -> TaskShape`: vocabulary size, row length and tokens per training record,
  computed from the params alone (cost estimates before the data exists);
- `SPEC = TaskSpec(...)`: the task's name, the three above, and every other per-task fact the
  rest of the lab needs (extra files, how evaluation groups results, the plots' headline column,
  packing, which params describe a point in the results table). Nothing outside the generator
  module may hold a per-task fact.

This package is the bottom floor: it imports nothing from `synthlab` (the lab imports it). Its
errors are `TaskError`s (bad parameters, an --out that cannot be written); the lab's own error type
subclasses it, and the lab turns the TaskErrors it meets into its own where it calls in.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np


class TaskError(Exception):
    """A problem with a task's parameters or output folder that the user can fix; its message is
    one line that names the culprit."""


# Special tokens of every task, in id order (<pad> is id 0). Text fields never contain <pad>;
# prompts and questions start with <bos> and end with <ans>; plain texts (biographies, facts,
# edge statements) carry no special token: the data loader wraps them as it needs.
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<ans>")


def param(default: Any, help: str, flag: str | None = None) -> Any:
    """A params field with its CLI help text and flag (default flag: --field-name)."""
    return field(default=default, metadata={"help": help, "flag": flag})


def field_flag(f: dataclasses.Field) -> str:
    """The CLI flag of a dataclass field: its metadata's "flag", else --field-name (every command's
    generated options use this rule: synthlab.cli.flags)."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def flag_of(params_cls: type, name: str) -> str:
    """The CLI flag of a params field, e.g. 'n_train' -> '--n-train' (used in error messages)."""
    return field_flag({f.name: f for f in dataclasses.fields(params_cls)}[name])


class TaskParams:
    """Base of every task's params dataclass: validation methods that name the CLI flag."""

    def require(self, ok: bool, name: str, message: str) -> None:
        """Raise TaskError '--flag message (got value)' unless `ok`."""
        if not ok:
            value = getattr(self, name)
            raise TaskError(f"{flag_of(type(self), name)} {message} (got {value!r})")

    def require_int(self, name: str, low: int, high: int | None = None) -> None:
        """An integer field in [low, high] (high None: no upper bound)."""
        value = getattr(self, name)
        is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        bound = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
        self.require(is_int and value >= low and (high is None or value <= high), name, f"must be {bound}")

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
class TaskShape:
    """What a training run needs to know about a dataset before it exists (from the params).

    vocab_size:        exact length of vocab.json's token list, the special tokens included.
    row_len:           input positions of the longest unpacked training or test example (its
                       tokens, <bos> and the answer included, minus 1); None for a task that
                       packs several examples per row.
    tokens_per_record: mean tokens of one training record: a QA record's prompt and answer, a
                       text with the <bos> and <eos> the data loader adds (an expectation over
                       the generator's draws where the records vary).
    train_records:     records in train.jsonl.
    """

    vocab_size: int
    row_len: int | None
    tokens_per_record: float
    train_records: int


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """A registry entry: every fact about a task that the rest of the lab needs.

    name:         the task's name (`synthlab gen NAME`, meta.json "task").
    params_cls:   the params dataclass.
    generate:     generate(params, rng) -> Dataset.
    help:         one-line help of `synthlab gen NAME`.
    shape:        shape(params) -> TaskShape, without generating the data.
    extra_files:  files the dataset holds beside meta.json, vocab.json, train.jsonl, test.jsonl.
    group_key:    the field of a test (and training QA) record by which evaluation groups its
                  results. Test records marked `"headline": false` count in the per-group
                  diagnostics only, not in the headline accuracy (Mano's shorter lengths).
    headline:     the results column a plot of this task leads with.
    pack:         whether training packs several examples per row by default.
    data_columns: generator param field or property (multihop's n_train) -> the results-table
                  column that describes the point (a read-only mapping).
    version:      the generator's output version: raise it when the same params and seed would
                  write other bytes, so that cached datasets (and runs trained on them) are not
                  taken for the new ones (tests/test_gen_common.py fingerprints each task).
    """

    name: str
    params_cls: type
    generate: Callable[[Any, np.random.Generator], Dataset]
    help: str
    shape: Callable[[Any], TaskShape]
    extra_files: tuple[str, ...]
    group_key: str
    headline: str
    pack: bool
    data_columns: Mapping[str, str] = field(hash=False)
    version: int = 1

    def version_key(self) -> dict[str, int]:
        """What a dataset's cache key or folder name adds for the generator's version: nothing at
        version 1, so the keys of every dataset made before versions existed stay as they were."""
        return {"generator_version": self.version} if self.version != 1 else {}

    def __post_init__(self) -> None:  # a read-only copy, whatever mapping was passed
        object.__setattr__(self, "data_columns", MappingProxyType(dict(self.data_columns)))

    # A mappingproxy cannot be pickled: pickle (and copy) a plain dict and wrap it again.
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "data_columns": dict(self.data_columns)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, data_columns=MappingProxyType(state["data_columns"]))


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
