"""Held-out language-model loss of a trained run, or of one of its kept checkpoints, at every
recurrent step: the loss the scaling laws are fitted to (`heldout` stage of a sweep point).

The held-out rows come from a fresh dataset of the same generator and parameters under another
seed (the point runner generates it), laid out as the run's training rows are (packed rows of the
run's length with document masking, or one padded row per example) in the dataset's own order,
so every checkpoint of every run of a sweep is scored on the same text; the loss is the mean over
their target tokens, in nats. A checkpoint's D is the tokens the run had trained on when it was
written (`tokens_seen`), so one long run gives a point of the D axis per kept checkpoint.

A fresh draw is not disjoint from the training split where the task's distribution is small (Mano
L = 2 mod 7 has about 6,300 distinct prompts, and 100,000 training draws hold nearly all of them):
the loss is then the distribution's loss, most of it on examples seen in training, not a test of
unseen ones. `seen` (given the training dataset) says which: the share of the scored examples that
occur verbatim among the training examples.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from synthlab.data.datasets import Examples, Rows, load_dataset, pack_rows, pad_rows, row_layout, training_examples
from synthlab.errors import SynthlabError
from synthlab.models.losses import token_losses
from synthlab.training.run_folders import autocast, open_checkpoint, open_run, read_metrics, resolve_device

HELDOUT_SEED_OFFSET = 1_000_003  # the held-out dataset's seed is the training data's seed plus this


@torch.no_grad()
def heldout_loss(
    run_dir: str | Path,
    data_dir: str | Path,
    *,
    rows: int,
    checkpoint: int | None = None,
    batch_size: int = 16,
    device: str = "cpu",
    train_dir: str | Path | None = None,
) -> dict[str, Any]:
    """{"loss_per_step": [mean loss after step t, t = 1..loops], "tokens": D, "step": optimizer step,
    "n_tokens": target tokens scored} of the run's final model or its checkpoint at `checkpoint`;
    with `train_dir` (the run's training dataset) also "seen": the share of the scored examples that
    occur verbatim in its training split."""
    dev = resolve_device(device)
    if checkpoint is None:
        model, run, _ = open_run(run_dir, dev)
        last = read_metrics(run_dir)[-1]
        step, tokens = int(last["step"]), int(last["tokens"])
    else:
        model, run, tokens = open_checkpoint(run_dir, checkpoint, dev)
        step = checkpoint
    data = load_dataset(data_dir)
    examples = training_examples(data)
    pack, seq_len = row_layout(run.train, run.model.max_seq_len, examples, data.task)
    enough = np.arange(min(len(examples), rows * seq_len))  # each example fills at least one position
    layout = (pack_rows if pack else pad_rows)(examples, enough, seq_len, data.pad_id)
    if len(layout) < rows:
        raise SynthlabError(
            f"the held-out dataset {data_dir} has {len(layout)} rows, fewer than eval.heldout_rows = {rows}"
        )
    totals, count = None, 0
    for start in range(0, rows, batch_size):
        part = layout.take(np.arange(start, min(rows, start + batch_size)))
        inputs, targets = torch.as_tensor(part.inputs, device=dev), torch.as_tensor(part.targets, device=dev)
        mask = torch.as_tensor(part.loss_mask, device=dev)
        doc_ids = None if part.doc_ids is None else torch.as_tensor(part.doc_ids, device=dev)
        with autocast(dev):
            step_logits = model(inputs, doc_ids=doc_ids).step_logits  # (T, B, S, V)
        losses = token_losses(step_logits, targets.masked_fill(~mask, -100))  # (T, B, S)
        summed = losses.sum((1, 2)).double().cpu().numpy()
        totals = summed if totals is None else totals + summed
        count += int(mask.sum())
    result = {"loss_per_step": (totals / max(count, 1)).tolist(), "tokens": tokens, "step": step, "n_tokens": count}
    if train_dir is not None:
        scored = examples_in_rows(layout, rows, data.pad_id) if pack else rows
        result["seen"] = seen_share(examples, scored, training_sequences(str(train_dir)))
    return result


def examples_in_rows(layout: Rows, rows: int, pad_id: int) -> int:
    """How many examples the first `rows` packed rows hold (whole examples laid in order, so they
    are the first ones): the distinct document ids of each row's non-padding tokens."""
    return sum(
        len(np.unique(ids[tokens != pad_id])) for ids, tokens in zip(layout.doc_ids[:rows], layout.inputs[:rows])
    )


def sequences(examples: Examples, count: int | None = None) -> list[bytes]:
    """The token sequence of each of the first `count` examples (default: all) as bytes (hashable)."""
    count = len(examples) if count is None else min(count, len(examples))
    return [examples.tokens[examples.offsets[i] : examples.offsets[i + 1]].tobytes() for i in range(count)]


@functools.lru_cache(maxsize=2)
def training_sequences(train_dir: str) -> frozenset[bytes]:
    """The token sequences of the training split in `train_dir`, read once per process: every
    checkpoint of every run of a sweep worker scores against the same (content-addressed) split."""
    return frozenset(sequences(training_examples(load_dataset(train_dir))))


def seen_share(examples: Examples, count: int, known: frozenset[bytes]) -> float:
    """The share of the first `count` of `examples` whose token sequence is among `known`."""
    return sum(sequence in known for sequence in sequences(examples, count)) / max(count, 1)
