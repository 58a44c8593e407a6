"""A word-level tokenizer over a dataset's closed vocabulary (DIR/vocab.json).

Text fields of every synthlab dataset are whitespace-separated tokens of that vocabulary, so
encoding is a dictionary lookup per word; nothing is split further. Ids follow the order of
`tokens` in vocab.json: special tokens first, `<pad>` is id 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from synthlab.errors import SynthlabError


class WordTokenizer:
    """Maps whitespace-separated tokens to ids and back."""

    def __init__(self, tokens: Sequence[str], special_tokens: Sequence[str]) -> None:
        self.tokens = list(tokens)
        self.special_tokens = list(special_tokens)
        self._ids = {tok: i for i, tok in enumerate(self.tokens)}
        if len(self._ids) != len(self.tokens):
            raise SynthlabError("vocabulary: duplicate tokens")
        if self.tokens[: len(self.special_tokens)] != self.special_tokens:
            raise SynthlabError("vocabulary: special tokens must come first, in order")
        if self.tokens[:1] != ["<pad>"]:
            raise SynthlabError("vocabulary: <pad> must be id 0")

    @classmethod
    def from_file(cls, path: str | Path) -> WordTokenizer:
        """Read DIR/vocab.json ({"special_tokens": [...], "tokens": [...]})."""
        path = Path(path)
        if path.is_dir():
            path = path / "vocab.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(data["tokens"], data["special_tokens"])
        except FileNotFoundError:
            raise SynthlabError(f"vocabulary file not found: {path}") from None
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise SynthlabError(f"vocabulary file {path} is malformed: {err}") from None

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, token: str) -> int:
        """The id of one token; an unknown token raises SynthlabError naming it."""
        try:
            return self._ids[token]
        except KeyError:
            raise SynthlabError(f"unknown token {token!r} (not in the vocabulary)") from None

    def encode(self, text: str) -> list[int]:
        """Ids of the whitespace-separated tokens of `text`."""
        ids = self._ids
        try:
            return [ids[tok] for tok in text.split()]
        except KeyError as err:
            raise SynthlabError(f"unknown token {err.args[0]!r} (not in the vocabulary)") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Tokens of `ids` joined by single spaces."""
        tokens = self.tokens
        out = []
        for i in ids:
            if not 0 <= i < len(tokens):
                raise SynthlabError(f"token id {i} is outside the vocabulary (size {len(tokens)})")
            out.append(tokens[int(i)])
        return " ".join(out)

    @property
    def pad_id(self) -> int:
        return self._ids["<pad>"]

    @property
    def bos_id(self) -> int:
        return self.id("<bos>")

    @property
    def eos_id(self) -> int:
        return self.id("<eos>")

    @property
    def ans_id(self) -> int:
        return self.id("<ans>")
