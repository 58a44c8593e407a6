"""synthlab.data.datasets on hand-written dataset folders that follow CONTRACTS.md."""

from __future__ import annotations

import json

import numpy as np
import pytest

from synthlab.data.datasets import Batcher, Examples, load_dataset, pack_rows, pad_rows, training_examples
from synthlab.errors import SynthlabError

SPECIALS = ["<pad>", "<bos>", "<eos>", "<ans>"]


def write_dataset(path, task, train, test, tokens, extras=None):
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"task": task}))
    (path / "vocab.json").write_text(json.dumps({"special_tokens": SPECIALS, "tokens": SPECIALS + tokens}))
    for name, records in {"train": train, "test": test, **(extras or {})}.items():
        if name == "graph":
            (path / "graph.json").write_text(json.dumps(records))
            continue
        (path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def mano_folder(path, n=20, seed=0):
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        a, b = rng.integers(0, 5, size=2)
        records.append({"prompt": f"<bos> <len_1> + {a} {b} <ans>", "answer": str((a + b) % 5), "length": 1})
    return write_dataset(path, "mano", records, records[:5], ["<len_1>", "+"] + [str(v) for v in range(5)])


def test_qa_examples_train_only_on_the_answer(tmp_path):
    ds = load_dataset(mano_folder(tmp_path / "d"), "mano")
    ex = training_examples(ds)
    for i, record in enumerate(ds.records("train")):
        seq = ex.tokens[ex.offsets[i] : ex.offsets[i + 1]]
        target = ex.target[ex.offsets[i] : ex.offsets[i + 1]]
        assert ds.tokenizer.decode(seq.tolist()) == record["prompt"] + " " + record["answer"]
        assert target.tolist() == [False] * (len(seq) - 1) + [True]


def test_text_records_are_language_modelled(tmp_path):
    train = [
        {"kind": "edge", "text": "n1 -> n2"},
        {"kind": "query", "prompt": "<bos> can n1 reach n2 ? <ans>", "answer": "yes", "distance": 1},
    ]
    tokens = ["n1", "n2", "->", "can", "reach", "?", "yes", "no"]
    ds = load_dataset(write_dataset(tmp_path / "d", "reach", train, train[1:], tokens, {"graph": []}), "reach")
    ex = training_examples(ds)
    assert len(ex) == 2
    edge = ex.tokens[ex.offsets[0] : ex.offsets[1]].tolist()
    assert ds.tokenizer.decode(edge) == "<bos> n1 -> n2 <eos>"  # a document: wrapped, all targets
    assert ex.target[ex.offsets[0] : ex.offsets[1]].tolist() == [False, True, True, True, True]
    assert ex.target[ex.offsets[1] : ex.offsets[2]].sum() == 1  # the query: only its answer


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda p: (p / "vocab.json").unlink(), "no vocab.json"),
        (lambda p: (p / "test.jsonl").unlink(), "test.jsonl is missing"),
        (lambda p: (p / "meta.json").write_text("{not json"), "not valid JSON"),
        (lambda p: (p / "meta.json").write_text('{"task": "chess"}'), "unknown task"),
    ],
)
def test_bad_folders_are_named(tmp_path, breakage, message):
    path = mano_folder(tmp_path / "d")
    breakage(path)
    with pytest.raises(SynthlabError, match=message):
        load_dataset(path)


def test_task_mismatch_and_missing_folder(tmp_path):
    path = mano_folder(tmp_path / "d")
    with pytest.raises(SynthlabError, match="does not match"):
        load_dataset(path, "bios")
    with pytest.raises(SynthlabError, match="not found"):
        load_dataset(tmp_path / "nowhere")


def random_examples(rng, n, max_len=9):
    seqs = [rng.integers(4, 50, size=rng.integers(2, max_len + 1)).tolist() for _ in range(n)]
    return Examples.from_lists(seqs, [1] * n), seqs


def test_packing_keeps_every_example_whole_and_separate():
    rng = np.random.default_rng(1)
    ex, seqs = random_examples(rng, 50)
    order = rng.permutation(50)
    rows = pack_rows(ex, order, seq_len=16, pad_id=0)
    found = []
    for r in range(len(rows)):
        for d in np.unique(rows.doc_ids[r]):
            pos = np.flatnonzero(rows.doc_ids[r] == d)
            assert np.array_equal(pos, np.arange(pos[0], pos[-1] + 1))  # contiguous
            if not rows.loss_mask[r, pos].any():
                assert (rows.inputs[r, pos] == 0).all()  # padding only
                continue
            # inputs then the shifted targets rebuild the whole example
            found.append(rows.inputs[r, pos].tolist() + [int(rows.targets[r, pos[-1]])])
    assert found == [seqs[i] for i in order]
    assert rows.loss_mask.sum() == sum(len(s) - 1 for s in seqs)


def test_padding_one_example_per_row():
    rng = np.random.default_rng(2)
    ex, seqs = random_examples(rng, 10)
    rows = pad_rows(ex, np.arange(10), seq_len=8, pad_id=0)
    for r, seq in enumerate(seqs):
        n = len(seq) - 1
        assert rows.inputs[r, :n].tolist() == seq[:-1] and rows.targets[r, :n].tolist() == seq[1:]
        assert not rows.loss_mask[r, n:].any()
    with pytest.raises(SynthlabError, match="seq_len"):
        pad_rows(ex, np.arange(10), seq_len=3, pad_id=0)


@pytest.mark.parametrize("pack", [True, False])
def test_batcher_is_deterministic_and_resumable(pack):
    ex, _ = random_examples(np.random.default_rng(3), 37)
    make = lambda: Batcher(ex, batch_size=5, seq_len=16, pack=pack, pad_id=0, seed=7)  # noqa: E731
    straight = make()
    batches = [straight.next_batch() for _ in range(30)]  # several epochs
    again = make()
    for _ in range(12):
        again.next_batch()
    resumed = make()
    resumed.load_state_dict(again.state_dict())
    for expected in batches[12:]:
        got = resumed.next_batch()
        assert np.array_equal(got.inputs, expected.inputs) and np.array_equal(got.targets, expected.targets)
    # every epoch is a fresh permutation: each example is trained on once per epoch
    first_epoch = make().rows(0)
    assert first_epoch.loss_mask.sum() == (ex.lengths - 1).sum()
    assert not np.array_equal(make().order(0), make().order(1))
