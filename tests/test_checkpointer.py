"""Checkpoints off the training thread (synthlab.training.checkpointer): the snapshot is the state of its
step whatever the loop does next, errors reach the training thread, and the cadence per run."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from synthlab.cli.train import resolve_run_config
from synthlab.training import checkpointer
from synthlab.training.run_folders import checkpoint_files, load_checkpoint
from synthlab.training.trainer import train

TINY_MODEL = {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_seq_len": 128}


def test_the_snapshot_is_not_changed_by_the_next_steps():
    weights = torch.zeros(4)
    written = []

    def slow_write(state):
        time.sleep(0.2)  # the training thread goes on meanwhile
        written.append(state)

    writer = checkpointer.Writer(slow_write)
    writer.submit({"model": {"w": weights}, "step": 1, "rng": [torch.ones(2)]})
    weights.add_(5)  # the next optimizer step, in place
    writer.close()
    assert torch.equal(written[0]["model"]["w"], torch.zeros(4)) and written[0]["step"] == 1
    assert torch.equal(written[0]["rng"][0], torch.ones(2))


def test_a_failed_write_is_raised_on_the_training_thread():
    def broken(state):
        raise OSError("disk full")

    writer = checkpointer.Writer(broken)
    writer.submit({"step": 1})
    with pytest.raises(OSError, match="disk full"):
        writer.wait()
    writer.wait()  # reported once


def test_one_write_in_flight_at_a_time():
    running, most = [], []

    def write(state):
        running.append(1)
        most.append(len(running))
        time.sleep(0.05)
        running.pop()

    writer = checkpointer.Writer(write)
    for step in range(4):
        writer.submit({"step": step})
    writer.close()
    assert most == [1, 1, 1, 1]


def test_checkpoints_per_run_do_not_grow_with_its_length():
    assert checkpointer.every(200_000, 200, checkpoints=20) == 10_000
    assert checkpointer.every(12, 1000, checkpoints=3) == 4
    assert checkpointer.every(12, 5) == 5


def test_a_run_writes_its_checkpoints_off_the_training_thread(tmp_path, mano, monkeypatch):
    import synthlab.training.run_folders

    threads = []
    original = synthlab.training.run_folders.save_checkpoint

    def recording(*args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return original(*args, **kwargs)

    monkeypatch.setattr("synthlab.training.trainer.save_checkpoint", recording)
    run = resolve_run_config(
        {},
        TINY_MODEL,
        {
            "task": "mano",
            "data": str(mano),
            "steps": 12,
            "batch_size": 8,
            "checkpoints": 3,
            "keep_checkpoints": 5,
            "log_every": 4,
        },
    )
    train(tmp_path / "run", run, progress=False)
    assert threads == [False, False, False]
    assert [p.name for p in checkpoint_files(tmp_path / "run")] == [
        "checkpoint-12.pt",
        "checkpoint-8.pt",
        "checkpoint-4.pt",
    ]
    assert load_checkpoint(tmp_path / "run")["step"] == 12
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["checkpoint"]["checkpoints"] == 3


def test_epochs_packed_ahead_are_the_epochs_packed_on_demand(mano):
    """The batcher packs the next epoch in the background; its batches are exactly those of
    packing each epoch when it is needed (the order is a function of seed and epoch)."""
    import numpy as np

    from synthlab.data.datasets import Batcher, load_dataset, pack_rows, training_examples

    examples = training_examples(load_dataset(mano, "mano"))
    batcher = Batcher(examples, batch_size=64, seq_len=48, pack=True, pad_id=0, seed=3)
    seen = [batcher.next_batch() for _ in range(3 * batcher.rows_per_epoch // 64 + 2)]
    expected = np.concatenate([pack_rows(examples, batcher.order(e), 48, 0).inputs for e in range(batcher.epoch + 1)])
    got = np.concatenate([rows.inputs for rows in seen])
    assert batcher.epoch >= 3 and np.array_equal(got, expected[: len(got)])
    resumed = Batcher(examples, batch_size=64, seq_len=48, pack=True, pad_id=0, seed=3)
    resumed.load_state_dict(batcher.state_dict())  # a jump to a later epoch packs it on demand
    assert np.array_equal(resumed.next_batch().inputs, batcher.next_batch().inputs)


def test_a_packing_error_reaches_the_caller():
    from synthlab.data.prefetch import EpochsAhead

    def make(epoch):
        if epoch == 1:
            raise ValueError("bad example")
        return epoch

    ahead = EpochsAhead(make)
    assert ahead.get(0) == 0
    with pytest.raises(ValueError, match="bad example"):
        ahead.get(1)


def test_packing_a_row_at_a_time_is_next_fit():
    """pack_rows fills a row at a time (a search over cumulative lengths, not a loop over examples):
    the rows of next-fit example by example, the reference written out here."""
    import numpy as np

    from synthlab.data.datasets import Examples, pack_rows

    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 30, size=500)
    examples = Examples.from_lists([list(rng.integers(3, 50, size=n)) for n in lengths], [1] * len(lengths))
    order = rng.permutation(len(lengths))
    seq_len = 40
    rows, used, placed = [[]], 0, []
    for k in order:  # next-fit: an example that does not fit opens a new row
        n = lengths[k] - 1
        if used + n > seq_len:
            rows.append([])
            used = 0
        placed.append((len(rows) - 1, used, len(rows[-1])))
        rows[-1].append(k)
        used += n
    packed = pack_rows(examples, order, seq_len, 0)
    assert len(packed) == len(rows)
    for (r, start, doc), k in zip(placed, order):
        n = lengths[k] - 1
        assert list(packed.inputs[r, start : start + n]) == list(examples.tokens[examples.offsets[k] :][:n])
        assert set(packed.doc_ids[r, start : start + n]) == {doc}
