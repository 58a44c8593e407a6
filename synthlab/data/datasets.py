"""Datasets on disk -> token sequences with loss masks -> deterministic training batches.

A dataset folder is what `synthlab gen` writes (CONTRACTS.md): `meta.json`, `vocab.json`,
`train.jsonl`, `test.jsonl` and per-task extras. This module reads it, checks it is the task the
user asked for, and turns records into token sequences with a loss mask:

- records with `text` (a bioS biography, a reach edge statement) are language modelled: every
  token after the first is a target;
- records with a prompt (`prompt` or `question`, ending in `<ans>`) and an `answer` are QA
  examples: only the answer tokens are targets.

`Batcher` cuts the examples into fixed-shape batches. With packing (the default for bioS) whole
examples are laid end to end in rows of `seq_len` positions with a document id per position, so
the model can mask attention across documents (one biography never attends to another); without
packing each row holds one example, padded. The order of every epoch is a permutation drawn from
`numpy.random.default_rng([seed, epoch])`, so the batcher's whole state is (epoch, cursor): a
checkpoint stores two integers and a resumed run sees exactly the same batches.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from synthlab.data.prefetch import EpochsAhead
from synthlab.data.token_cache import cached_arrays
from synthlab.data.tokenizer import WordTokenizer
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text, sha256_file
from synthlab_generators import TASKS


def read_jsonl(path: Path, check: Callable[[dict[str, Any], str], None] | None = None) -> list[dict[str, Any]]:
    """All records of a JSON Lines file; a malformed line (not JSON, not UTF-8 text, not an object,
    or refused by `check(record, "file:line")`) is a SynthlabError naming file and line."""
    records = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise SynthlabError(f"{path}:{number}: not UTF-8 text (byte {err.start + 1}; a binary file?)") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise SynthlabError(f"{path}:{number}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise SynthlabError(f"{path}:{number}: not a record (a JSON object), got {type(record).__name__}")
            if check is not None:
                check(record, f"{path}:{number}")
            records.append(record)
    return records


def check_record(record: dict[str, Any], where: str) -> None:
    """A train / test record the lab can encode: `text`, or a `prompt` (or `question`) with an
    `answer`; each of them a string. A SynthlabError naming `where` (file:line) otherwise."""
    for field in ("text", "prompt", "question", "answer"):
        if field in record and not isinstance(record[field], str):
            raise SynthlabError(f"{where}: '{field}' must be a string, got {type(record[field]).__name__}")
    if "text" not in record and ("answer" not in record or not {"prompt", "question"} & set(record)):
        raise SynthlabError(f"{where}: a record needs 'text', or a 'prompt' (or 'question') and an 'answer'")


def check_vocab(data: Dataset, vocab_size: int, recorded: dict[str, str] | None) -> None:
    """`data`'s vocabulary is the one a model was trained on: its size, and every word's id where
    the run recorded its training vocab.json's sha256 (`recorded`, a run's data_sha256)."""
    where = data.path / "vocab.json"
    if len(data.tokenizer) != vocab_size:
        raise SynthlabError(
            f"--data {data.path}: vocabulary of {len(data.tokenizer)} tokens, the model was trained on {vocab_size}"
        )
    if recorded and "vocab.json" in recorded and sha256_file(where) != recorded["vocab.json"]:
        raise SynthlabError(
            f"--data {data.path}: {where} is not the vocabulary the model was trained on (the same "
            f"{vocab_size} tokens in number, not the same ids): use a dataset with the run's vocab.json"
        )


VERIFIED = ".verified.json"  # {file: [size, mtime_ns, sha256]} of the files last found to match meta.json
_verify = contextvars.ContextVar("verify_data", default=True)


@contextlib.contextmanager
def unverified_data(skip: bool = True) -> Iterator[None]:
    """While the block runs (with `skip`), datasets are opened without hashing their files (`--no-verify`)."""
    token = _verify.set(not skip)
    try:
        yield
    finally:
        _verify.reset(token)


def verify_files(folder: Path, meta: dict[str, Any]) -> None:
    """Hash each file meta.json lists (streamed) and compare it with the sha256 recorded there; a
    mismatch is a SynthlabError. A file whose size and mtime are those of its last successful check
    (remembered in `folder/.verified.json` where the folder is writable) is not hashed again."""
    try:
        known = json.loads((folder / VERIFIED).read_text())
    except (OSError, ValueError):
        known = {}
    checked = {}
    for name, entry in sorted(meta.get("files", {}).items()):
        try:
            stat = (folder / name).stat()
        except OSError:
            raise SynthlabError(f"{folder} is incomplete: {name} (listed in meta.json) is missing") from None
        checked[name] = [stat.st_size, stat.st_mtime_ns, entry.get("sha256")]
        if known.get(name) != checked[name] and sha256_file(folder / name) != entry.get("sha256"):
            raise SynthlabError(
                f"{folder / name} does not match the sha256 in {folder / 'meta.json'} (edited or "
                f"damaged): regenerate it with `synthlab gen`, or pass --no-verify to use it as it is"
            )
    if checked != known:
        with contextlib.suppress(SynthlabError):  # a read-only dataset is hashed at every start
            atomic_write_text(folder / VERIFIED, json.dumps(checked) + "\n")


class Dataset:
    """One generated dataset folder, validated on construction (its files hashed against
    meta.json's sha256s, unless inside `unverified_data`); records are read lazily."""

    def __init__(self, path: str | Path, task: str | None = None):
        self.path = Path(path)
        if not self.path.is_dir():
            raise SynthlabError(f"data folder not found: {self.path}")
        for name in ("meta.json", "vocab.json"):
            if not (self.path / name).is_file():
                raise SynthlabError(f"{self.path} is not a synthlab dataset (no {name}); make one with `synthlab gen`")
        try:
            self.meta: dict[str, Any] = json.loads((self.path / "meta.json").read_text())
        except json.JSONDecodeError as err:
            raise SynthlabError(f"{self.path / 'meta.json'} is not valid JSON ({err.msg})") from None
        self.task: str = self.meta.get("task", "")
        if self.task not in TASKS:
            raise SynthlabError(
                f"{self.path / 'meta.json'}: unknown task {self.task!r} (expected one of {', '.join(TASKS)})"
            )
        if task is not None and task != self.task:
            raise SynthlabError(f"--task {task} does not match the data in {self.path}, which is a {self.task} dataset")
        files = self.meta.get("files", {})
        outside = [n for n in files if not isinstance(n, str) or Path(n).name != n or n in (".", "..")]
        if not isinstance(files, dict) or outside:
            raise SynthlabError(
                f"{self.path / 'meta.json'}: lists {outside[0] if outside else files!r}, not a file of the "
                f"dataset folder (edited?): regenerate it with `synthlab gen`"
            )
        for name in ("train.jsonl", "test.jsonl", *TASKS[self.task].extra_files):
            if not (self.path / name).is_file():
                raise SynthlabError(f"{self.path} is incomplete: {name} is missing")
        if _verify.get():
            verify_files(self.path, self.meta)
        self.tokenizer = WordTokenizer.from_file(self.path / "vocab.json")
        self.pad_id = self.tokenizer.id("<pad>")
        self.bos_id = self.tokenizer.id("<bos>")
        self.eos_id = self.tokenizer.id("<eos>")
        self._cache: dict[str, list[dict[str, Any]]] = {}

    def records(self, name: str) -> list[dict[str, Any]]:
        """Records of `train`, `test`, `people` or `facts` (cached)."""
        if name not in self._cache:
            check = check_record if name in ("train", "test") else None
            self._cache[name] = read_jsonl(self.path / f"{name}.jsonl", check)
        return self._cache[name]

    def encode(self, text: str) -> list[int]:
        """Ids of `text`'s tokens; an unknown token is a SynthlabError naming the file and line of
        the record it comes from."""
        try:
            return self.tokenizer.encode(text)
        except SynthlabError as err:
            raise SynthlabError(f"{self._where(text)}: {err}; the vocabulary is {self.path / 'vocab.json'}") from None

    def _where(self, text: str) -> str:
        """`file:line` of the first record read so far with `text` in a field (else the folder)."""
        for name, records in self._cache.items():
            for number, record in enumerate(records, 1):  # the writer writes no blank lines
                if any(text in str(value) for value in record.values()):
                    return f"{self.path / (name + '.jsonl')}:{number}"
        return str(self.path)

    def encode_text(self, text: str) -> list[int]:
        """A plain text as one document: `<bos>` first (added unless present), `<eos>` last."""
        ids = self.encode(text)
        if not ids or ids[0] != self.bos_id:
            ids = [self.bos_id, *ids]
        if ids[-1] != self.eos_id:
            ids.append(self.eos_id)
        return ids

    def encode_prompt(self, prompt: str) -> list[int]:
        """A QA prompt (ends with `<ans>`), `<bos>` first unless present."""
        ids = self.encode(prompt)
        return ids if ids and ids[0] == self.bos_id else [self.bos_id, *ids]


def load_dataset(path: str | Path, task: str | None = None) -> Dataset:
    """Open and validate a dataset folder; `task`, when given, must match meta.json."""
    return Dataset(path, task)


@dataclass(frozen=True)
class Examples:
    """Token sequences stored flat: example i is `tokens[offsets[i]:offsets[i+1]]`.

    `target[j]` is True where token j is a training target (predicted from the tokens before it);
    the first token of an example is never a target.
    """

    tokens: np.ndarray  # (total,) int64
    target: np.ndarray  # (total,) bool
    offsets: np.ndarray  # (n + 1,) int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def from_lists(cls, sequences: list[list[int]], n_prompt: list[int]) -> Examples:
        """Sequences whose tokens from index `n_prompt[i]` on are targets (1 = every token after the first)."""
        lengths = np.array([len(s) for s in sequences], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        tokens = np.fromiter((t for s in sequences for t in s), dtype=np.int64, count=int(offsets[-1]))
        position = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        target = position >= np.repeat(np.maximum(np.asarray(n_prompt, dtype=np.int64), 1), lengths)
        return cls(tokens, target, offsets)


def qa_sequence(ds: Dataset, record: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) of a QA record (`prompt` or `question`, plus `answer`)."""
    prompt = record.get("prompt", record.get("question"))
    return ds.encode_prompt(prompt), ds.encode(str(record["answer"]))


ENCODED = ".train_tokens.npz"  # the training split encoded (synthlab.data.token_cache)
ENCODING_VERSION = 1  # of the rules below (<bos>/<eos>, the loss mask): a change must bump it


def training_examples(ds: Dataset) -> Examples:
    """The training split as sequences with the task's loss mask (multihop's train split already
    holds the atomic facts as one-hop questions; reach's holds the edge statements as texts).
    Encoded once per dataset and kept in DIR/.train_tokens.npz, keyed by the sha256 of train.jsonl
    as it is now and the vocabulary (`cached_arrays`); a dataset whose folder is gone (loaded, then
    its temporary folder removed) is encoded from the records it holds."""
    if not (ds.path / "train.jsonl").is_file():
        return _encode_training(ds)
    key = {
        "train.jsonl": sha256_file(ds.path / "train.jsonl"),
        "vocab": hashlib.sha256(ds.tokenizer.to_json().encode()).hexdigest(),
        "version": ENCODING_VERSION,
    }
    arrays = cached_arrays(ds.path / ENCODED, key, lambda: asdict(_encode_training(ds)))
    return Examples(**arrays)


def _encode_training(ds: Dataset) -> Examples:
    sequences: list[list[int]] = []
    n_prompt: list[int] = []
    for record in ds.records("train"):
        if "text" in record:  # language-modelled document: every token is a target
            sequences.append(ds.encode_text(record["text"]))
            n_prompt.append(1)
        else:  # QA: only the answer tokens are targets
            prompt, answer = qa_sequence(ds, record)
            sequences.append(prompt + answer)
            n_prompt.append(len(prompt))
    if not sequences:
        raise SynthlabError(f"{ds.path / 'train.jsonl'} has no records")
    return Examples.from_lists(sequences, n_prompt)


@dataclass(frozen=True)
class Rows:
    """Model inputs for a set of rows: position i of a row predicts `targets[:, i]` from `inputs[:, :i+1]`."""

    inputs: np.ndarray  # (R, S) int64
    targets: np.ndarray  # (R, S) int64
    loss_mask: np.ndarray  # (R, S) bool: the positions whose target is trained on
    doc_ids: np.ndarray | None  # (R, S) int64 document index inside the row, None if one per row

    def __len__(self) -> int:
        return len(self.inputs)

    def take(self, index: np.ndarray) -> Rows:
        return Rows(
            self.inputs[index],
            self.targets[index],
            self.loss_mask[index],
            None if self.doc_ids is None else self.doc_ids[index],
        )


def _scatter(
    examples: Examples, order: np.ndarray, row: np.ndarray, start: np.ndarray, n_rows: int, seq_len: int, pad_id: int
) -> Rows:
    """Place example order[k] (its n - 1 input/target pairs) at row[k], positions start[k].. ."""
    lengths = examples.lengths[order] - 1  # input positions each example occupies
    total = int(lengths.sum())
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    source = np.repeat(examples.offsets[order], lengths) + within  # token index of each input
    flat = np.repeat(row, lengths) * seq_len + np.repeat(start, lengths) + within
    inputs = np.full(n_rows * seq_len, pad_id, dtype=np.int64)
    targets = np.full(n_rows * seq_len, pad_id, dtype=np.int64)
    loss_mask = np.zeros(n_rows * seq_len, dtype=bool)
    inputs[flat] = examples.tokens[source]
    targets[flat] = examples.tokens[source + 1]
    loss_mask[flat] = examples.target[source + 1]
    shape = (n_rows, seq_len)
    return Rows(inputs.reshape(shape), targets.reshape(shape), loss_mask.reshape(shape), None)


def pad_rows(examples: Examples, order: np.ndarray, seq_len: int, pad_id: int) -> Rows:
    """One example per row, left-aligned and padded on the right (no document ids needed)."""
    if (examples.lengths[order] - 1).max(initial=0) > seq_len:
        raise SynthlabError(f"an example needs {int(examples.lengths.max()) - 1} positions but seq_len is {seq_len}")
    n = len(order)
    return _scatter(examples, order, np.arange(n), np.zeros(n, dtype=np.int64), n, seq_len, pad_id)


def pack_rows(examples: Examples, order: np.ndarray, seq_len: int, pad_id: int) -> Rows:
    """Whole examples in `order` laid end to end, next-fit: an example that does not fit opens a new row.

    Document ids count examples inside a row (0, 1, ...); padding at the end of a row gets an id of
    its own, so no real token ever attends to padding or to another document.
    """
    occupied = examples.lengths[order] - 1
    if occupied.max(initial=0) > seq_len:
        raise SynthlabError(f"an example needs {int(occupied.max())} positions but seq_len is {seq_len}")
    row = np.empty(len(order), dtype=np.int64)
    start = np.empty(len(order), dtype=np.int64)
    doc = np.empty(len(order), dtype=np.int64)
    ends = np.concatenate([[0], np.cumsum(occupied)])  # ends[k]: positions taken by the examples before k
    first = r = 0
    while first < len(order):  # sequential by nature, one row at a time: a row takes what fits whole
        last = int(np.searchsorted(ends, ends[first] + seq_len, side="right")) - 1  # examples first..last-1
        row[first:last], doc[first:last] = r, np.arange(last - first)
        start[first:last] = ends[first:last] - ends[first]
        first, r = last, r + 1
    n_rows = max(r, 1)
    rows = _scatter(examples, order, row, start, n_rows, seq_len, pad_id)
    doc_ids = np.full(n_rows * seq_len, -1, dtype=np.int64)
    flat = (
        np.repeat(row, occupied) * seq_len
        + np.repeat(start, occupied)
        + (np.arange(int(occupied.sum())) - np.repeat(np.cumsum(occupied) - occupied, occupied))
    )
    doc_ids[flat] = np.repeat(doc, occupied)
    doc_ids = doc_ids.reshape(n_rows, seq_len)
    # padding: one id past the row's last document
    pad_doc = doc_ids.max(axis=1, keepdims=True) + 1
    doc_ids = np.where(doc_ids < 0, pad_doc, doc_ids)
    return Rows(rows.inputs, rows.targets, rows.loss_mask, doc_ids)


def row_layout(train, max_seq_len: int, examples: Examples, task: str) -> tuple[bool, int]:
    """(pack, row length) of a run's rows (`train`: its TrainConfig): packed rows of train.batch.seq_len
    (default max_seq_len) where the run packs (default: the task's choice), else the longest example."""
    pack = train.batch.pack if train.batch.pack is not None else TASKS[task].pack
    return pack, (train.batch.seq_len or max_seq_len) if pack else int(examples.lengths.max()) - 1


class Batcher:
    """Endless, deterministic batches of `batch_size` rows; state = (epoch, cursor) only."""

    def __init__(self, examples: Examples, *, batch_size: int, seq_len: int, pack: bool, pad_id: int, seed: int):
        self.examples, self.batch_size, self.seq_len = examples, batch_size, seq_len
        self.pack, self.pad_id, self.seed = pack, pad_id, seed
        self.epoch, self.cursor = 0, 0
        self._rows_epoch, self._rows = -1, None
        if not pack:  # one padded row per example, built once; epochs only permute them
            self._all = pad_rows(examples, np.arange(len(examples)), seq_len, pad_id)
        else:  # each epoch packed in its own order, the next one in the background (synthlab.data.prefetch)
            self._packed = EpochsAhead(lambda epoch: pack_rows(examples, self.order(epoch), seq_len, pad_id))

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))

    def rows(self, epoch: int) -> Rows:
        """All rows of an epoch, in training order (cached for the current epoch)."""
        if self._rows_epoch != epoch:
            self._rows = self._packed.get(epoch) if self.pack else self._all.take(self.order(epoch))
            self._rows_epoch = epoch
        return self._rows

    @cached_property
    def rows_per_epoch(self) -> int:
        """Rows in epoch 0 (packing varies a little with the order; one exposure is about this many)."""
        return len(self.rows(0))

    def next_batch(self) -> Rows:
        parts, need = [], self.batch_size
        while need:
            rows = self.rows(self.epoch)
            take = min(need, len(rows) - self.cursor)
            parts.append(rows.take(np.arange(self.cursor, self.cursor + take)))
            self.cursor += take
            need -= take
            if self.cursor == len(rows):
                self.epoch, self.cursor = self.epoch + 1, 0
        if len(parts) == 1:
            return parts[0]
        return Rows(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("inputs", "targets", "loss_mask")),
            None if parts[0].doc_ids is None else np.concatenate([p.doc_ids for p in parts]),
        )

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise SynthlabError(f"checkpoint was made with data seed {state['seed']}, config says {self.seed}")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
