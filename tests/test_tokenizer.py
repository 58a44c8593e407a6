"""The word tokenizer's encode and its `tokenizers` backend (the exported tokenizer) give exactly
the ids of the lab's original dictionary lookup, on every task's generated data and whole
vocabulary: runs and results made with the old one stay valid, and an exported model reads the
ids it was trained on."""

from __future__ import annotations

import json

import pytest

from synthlab.data.datasets import Dataset
from synthlab.data.tokenizer import WordTokenizer
from synthlab.errors import SynthlabError


class ReferenceTokenizer:
    """The lab's tokenizer before it moved onto `tokenizers`, kept verbatim as the reference."""

    def __init__(self, vocab_path):
        data = json.loads(vocab_path.read_text(encoding="utf-8"))
        self.tokens = data["tokens"]
        self._ids = {tok: i for i, tok in enumerate(self.tokens)}

    def encode(self, text: str) -> list[int]:
        return [self._ids[tok] for tok in text.split()]

    def decode(self, ids) -> str:
        return " ".join(self.tokens[int(i)] for i in ids)


TEXT_FIELDS = ("text", "prompt", "question", "answer")


def _texts(folder):
    """Every token-text field (documents, prompts, questions, answers) of every .jsonl file."""
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            yield from (str(record[field]) for field in TEXT_FIELDS if field in record)


@pytest.mark.parametrize("task", ["bios", "mano", "multihop", "reach"])
def test_ids_equal_the_old_tokenizers_on_every_tasks_data(task, task_datasets):
    folder = task_datasets[task]
    new, old = WordTokenizer.from_file(folder), ReferenceTokenizer(folder / "vocab.json")
    assert new.tokens == old.tokens
    vocabulary = " ".join(old.tokens)
    assert new.encode(vocabulary) == old.encode(vocabulary) == list(range(len(old.tokens)))
    assert new.decode(range(len(old.tokens))) == vocabulary
    specials = "<pad> <bos> <eos> <ans>" + (" <len_2> <len_4>" if task == "mano" else "")
    assert new.encode(specials) == old.encode(specials)
    ds, checked = Dataset(folder), 0
    for text in _texts(folder):
        ids = new.encode(text)
        assert ids == old.encode(text) == new.backend.encode(text, add_special_tokens=False).ids, text
        assert new.decode(ids) == old.decode(ids) == " ".join(text.split())
        assert ds.encode_text(text) == [new.bos_id] * (ids[:1] != [new.bos_id]) + ids + [new.eos_id] * (
            ids[-1:] != [new.eos_id]
        )
        checked += 1
    assert checked > 50


def test_unknown_words_and_ids_fail_with_one_line():
    tok = WordTokenizer(["<pad>", "<bos>", "<eos>", "a", "b"], ["<pad>", "<bos>", "<eos>"])
    assert tok.encode(" a\tb  a\n") == [3, 4, 3]
    with pytest.raises(SynthlabError, match="unknown token 'c'"):
        tok.encode("a c b")
    with pytest.raises(Exception):  # the backend (the exported tokenizer) refuses it too
        tok.backend.encode("a c b")
    with pytest.raises(SynthlabError, match="token id 5 is outside"):
        tok.decode([1, 5])
    with pytest.raises(SynthlabError, match="one non-empty word"):
        WordTokenizer(["<pad>", "a b"], ["<pad>"])
    with pytest.raises(SynthlabError, match="<unk> is reserved"):
        WordTokenizer(["<pad>", "<unk>"], ["<pad>"])
