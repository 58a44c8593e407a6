"""A word-level tokenizer over a dataset's closed vocabulary (DIR/vocab.json), on `tokenizers`.

Text fields of every synthlab dataset are whitespace-separated tokens of that vocabulary, so the
tokenizer is a `tokenizers` WordLevel model over whitespace-split words: nothing is split further.
Ids follow the order of `tokens` in vocab.json: special tokens first, `<pad>` is id 0. The same
`tokenizers.Tokenizer` (`WordTokenizer.backend`) serves transformers (`transformers_tokenizer`) and
is what `synthlab export` renders for `AutoTokenizer` (synthlab.ouroboros.export.hf_tokenizer), so the lab
and an exported folder share one vocabulary. `encode`, which training runs over every document,
looks the words up in the same vocabulary's dict: the backend's ids, without its per-call cost.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from synthlab.errors import SynthlabError

# WordLevel needs an unknown-token name; it is never in a vocabulary, so an unknown word makes
# `tokenizers` raise instead of mapping it to an id.
_ABSENT_UNK = "<unk>"


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
        if _ABSENT_UNK in self._ids:
            raise SynthlabError(f"vocabulary: {_ABSENT_UNK} is reserved (an unknown word must fail, not map to it)")
        if any(not tok or len(tok.split()) != 1 or tok.split()[0] != tok for tok in self.tokens):
            raise SynthlabError("vocabulary: every token must be one non-empty word without whitespace")
        self.backend = Tokenizer(models.WordLevel(self._ids, unk_token=_ABSENT_UNK))
        self.backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()

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

    def to_json(self) -> str:
        """The vocabulary in vocab.json's format (`from_file` reads it back)."""
        return json.dumps({"special_tokens": self.special_tokens, "tokens": self.tokens}, indent=1) + "\n"

    def transformers_tokenizer(self):
        """This tokenizer as a transformers PreTrainedTokenizerFast (same backend, same ids; `<pad>`,
        `<bos>`, `<eos>` as its pad / bos / eos tokens)."""
        from transformers import PreTrainedTokenizerFast  # about 3 s to import; training never needs it

        named = {
            name: tok
            for name, tok in (("pad_token", "<pad>"), ("bos_token", "<bos>"), ("eos_token", "<eos>"))
            if tok in self._ids
        }
        extra = [t for t in self.special_tokens if t not in named.values()]
        return PreTrainedTokenizerFast(
            tokenizer_object=self.backend, clean_up_tokenization_spaces=False, extra_special_tokens=extra, **named
        )

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, token: str) -> int:
        """The id of one token; an unknown token raises SynthlabError naming it."""
        try:
            return self._ids[token]
        except KeyError:
            raise SynthlabError(f"unknown token {token!r} (not in the vocabulary)") from None

    def encode(self, text: str) -> list[int]:
        """Ids of the whitespace-separated tokens of `text`. A dict lookup per word: the ids of
        the `tokenizers` backend (tests/test_tokenizer.py checks both on every task's data), which
        costs 5-8x more through its Python binding (every task's training texts, one thread), and
        training encodes every document."""
        try:
            return [self._ids[tok] for tok in text.split()]
        except KeyError as err:
            raise SynthlabError(f"unknown token {err.args[0]!r} (not in the vocabulary)") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Tokens of `ids` joined by single spaces."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < len(self.tokens)), None)
        if bad is not None:
            raise SynthlabError(f"token id {bad} is outside the vocabulary (size {len(self.tokens)})")
        return self.backend.decode(ids, skip_special_tokens=False)

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
