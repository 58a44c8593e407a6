"""The encoded training split kept beside the data (DIR/.train_tokens.npz): a hit gives the fresh
encoding's arrays byte for byte; another train.jsonl, another vocabulary or a damaged file is
encoded again; a dataset folder that cannot be written still trains."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from test_train import TINY_DATA, losses_of, run_config
from test_train_data import mano_folder

from synthlab.data.datasets import ENCODED, _encode_training, load_dataset, training_examples
from synthlab.errors import SynthlabError
from synthlab.training.trainer import train
from synthlab_generators import TASKS, write_dataset


def same(a, b) -> bool:
    """Equal arrays of equal dtype, field by field (byte-identical)."""
    return all(
        getattr(a, f.name).dtype == getattr(b, f.name).dtype
        and getattr(a, f.name).tobytes() == getattr(b, f.name).tobytes()
        for f in fields(a)
    )


def never_read(ds):
    def refuse(name):
        raise AssertionError(f"{name}.jsonl was read: the cache missed")

    ds.records = refuse
    return ds


@pytest.mark.parametrize("task", ["bios", "mano", "multihop", "reach"])
def test_a_hit_is_byte_identical_to_a_fresh_encode(tmp_path, task):
    folder = write_dataset(TASKS[task], TASKS[task].params_cls(**TINY_DATA[task]), 0, tmp_path / task)
    first = training_examples(load_dataset(folder))
    assert (folder / ENCODED).is_file()
    hit = training_examples(never_read(load_dataset(folder)))
    fresh = _encode_training(load_dataset(folder))
    assert same(hit, fresh) and same(first, fresh)
    with np.load(folder / ENCODED, allow_pickle=False) as stored:  # no pickled objects in it
        assert {"tokens", "target", "offsets"} <= set(stored.files)


def test_another_train_file_is_encoded_again(tmp_path):
    folder = mano_folder(tmp_path / "d", n=20, seed=0)
    before = training_examples(load_dataset(folder))
    other = mano_folder(tmp_path / "other", n=20, seed=1)
    (folder / "train.jsonl").write_bytes((other / "train.jsonl").read_bytes())  # same size, new content
    after = training_examples(load_dataset(folder))
    assert not same(before, after)
    assert same(after, _encode_training(load_dataset(folder)))
    assert same(training_examples(never_read(load_dataset(folder))), after)  # and kept for the next start


def test_another_vocabulary_is_encoded_again(tmp_path):
    folder = mano_folder(tmp_path / "d")
    before = training_examples(load_dataset(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    specials = len(vocab["special_tokens"])
    vocab["tokens"] = vocab["tokens"][:specials] + vocab["tokens"][specials:][::-1]  # same words, other ids
    (folder / "vocab.json").write_text(json.dumps(vocab))
    after = training_examples(load_dataset(folder))
    assert not np.array_equal(before.tokens, after.tokens)
    assert same(after, _encode_training(load_dataset(folder)))


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 not a zip", b"\x93NUMPY"])
def test_a_damaged_cache_is_encoded_again_and_replaced(tmp_path, damage):
    folder = mano_folder(tmp_path / "d")
    fresh = training_examples(load_dataset(folder))
    (folder / ENCODED).write_bytes(damage)
    assert same(training_examples(load_dataset(folder)), fresh)
    assert same(training_examples(never_read(load_dataset(folder))), fresh)


def read_only(monkeypatch, folder: Path) -> None:
    """Files opened for writing in `folder` fail as on a read-only file system (chmod does not stop root)."""
    real_open = io.open

    def refuse(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).parent == folder and set(mode) & set("wax+"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", refuse)
    monkeypatch.setattr(builtins, "open", refuse)


def test_a_read_only_dataset_trains_without_the_cache(tmp_path, monkeypatch):
    spec = TASKS["mano"]
    folder = write_dataset(spec, spec.params_cls(**TINY_DATA["mano"]), 0, tmp_path / "mano")
    load_dataset(folder)  # its hashes checked (and remembered) before the folder turns read-only
    with monkeypatch.context() as patch:
        read_only(patch, folder)
        with pytest.raises(OSError):  # the patch holds for the writes the lab makes
            (folder / "probe").write_text("x")
        examples = training_examples(load_dataset(folder))
        assert not (folder / ENCODED).exists()
        train(tmp_path / "ro", run_config(folder, "mano"), progress=False)
    listed = json.loads((folder / "meta.json").read_text())["files"]
    assert {p.name for p in folder.iterdir()} == {"meta.json", ".verified.json", *listed}  # nothing written
    assert same(examples, _encode_training(load_dataset(folder)))
    train(tmp_path / "rw", run_config(folder, "mano"), progress=False)  # writes the cache, then reads it
    assert (folder / ENCODED).is_file()
    train(tmp_path / "hit", run_config(folder, "mano"), progress=False)
    assert losses_of(tmp_path / "ro") == losses_of(tmp_path / "rw") == losses_of(tmp_path / "hit")


def test_an_unknown_word_still_names_its_line(tmp_path):
    folder = mano_folder(tmp_path / "d")
    lines = (folder / "train.jsonl").read_text().splitlines()
    lines[3] = json.dumps({"prompt": "<bos> <len_1> + 9 1 <ans>", "answer": "0", "length": 1})
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(SynthlabError, match=r"train\.jsonl:4: unknown token '9'"):
        training_examples(load_dataset(folder))
    assert not (folder / ENCODED).exists()


def test_a_dataset_whose_folder_is_gone_encodes_what_it_holds(tmp_path):
    """A benchmark loads a dataset from a temporary folder and removes it: the records it holds
    still train, encoded afresh, and nothing is written."""
    folder = mano_folder(tmp_path / "d", n=20, seed=0)
    ds = load_dataset(folder)
    ds.records("train")  # read while the folder is there
    expected = _encode_training(ds)
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    assert same(training_examples(ds), expected) and not folder.exists()
