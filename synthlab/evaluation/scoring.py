"""Scoring a model on token sequences, one forward pass per batch of similar length: each answer,
teacher-forced, at every recurrent step (`score_answers`: right when all its tokens are the argmax,
which equals greedy decoding), and every token of a sequence at the last step (`score_sequences`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from synthlab.progress import Progress
from synthlab.training.run_folders import autocast


def _padded(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, S) right-padded, lengths (B,))."""
    lengths = torch.tensor([len(s) for s in sequences])
    ids = torch.full((len(sequences), int(lengths.max())), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq)
    return ids, lengths


def _batches(n: int, lengths: list[int], batch_size: int):
    """Index batches of similar length (less padding), in a fixed order."""
    order = np.argsort(lengths, kind="stable")
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


@dataclass
class AnswerScores:
    """Per example and recurrent step: is the whole answer right, its summed loss, its prediction."""

    correct: np.ndarray  # (T, n) bool
    loss: np.ndarray  # (T, n) nats summed over the answer tokens
    agreement: np.ndarray  # (T, T) fraction of examples predicting the same answer at steps i and j
    answer_class: np.ndarray  # (T, n) the first step whose predicted answer equals step t's (0-based):
    # steps i and j agree on an example exactly when their classes are equal (per-prompt agreement)


@torch.no_grad()
def score_answers(
    model,
    prompts: list[list[int]],
    answers: list[list[int]],
    *,
    pad_id: int,
    device: torch.device,
    steps: int | None = None,
    batch_size: int = 256,
    progress: Progress | None = None,
) -> AnswerScores:
    """Teacher-forced exact match and loss of each answer at every recurrent step (`progress`
    advances by each batch's answers)."""
    n = len(prompts)
    correct, loss, same, classes = None, None, None, None
    for index, inputs, targets, answer_mask in answer_batches(prompts, answers, pad_id, device, batch_size):
        with autocast(device):
            step_logits = model(inputs, steps=steps).step_logits  # (T, B, S, V)
        logp = torch.log_softmax(step_logits.float(), dim=-1)
        n_steps = logp.shape[0]
        if correct is None:
            correct = np.zeros((n_steps, n), dtype=bool)
            loss = np.zeros((n_steps, n))
            same = np.zeros((n_steps, n_steps))
            classes = np.zeros((n_steps, n), dtype=np.int64)
        target_logp = logp.gather(-1, targets.expand(n_steps, -1, -1).unsqueeze(-1)).squeeze(-1)  # (T, B, S)
        loss[:, index] = -(target_logp * answer_mask).sum(-1).cpu().numpy()
        predicted = logp.argmax(-1)  # (T, B, S-1)
        hit = (predicted == targets) | ~answer_mask
        correct[:, index] = hit.all(-1).cpu().numpy()
        # two steps agree when their predictions match at every answer position
        pairwise = (predicted.unsqueeze(0) == predicted.unsqueeze(1)) | ~answer_mask  # (T, T, B, S-1)
        agree = pairwise.all(-1).cpu().numpy()  # (T, T, B)
        same += agree.sum(-1)
        classes[:, index] = agree.argmax(1)  # the first step agreeing with step t (t itself at the latest)
        if progress is not None:
            progress.update(len(index))
    return AnswerScores(correct, loss, same / max(n, 1), classes)


@torch.no_grad()
def score_sequences(
    model,
    sequences: list[list[int]],
    *,
    pad_id: int,
    device: torch.device,
    steps: int | None = None,
    batch_size: int = 64,
    progress: Progress | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Last-step (loss, argmax-correct) of every token given the ones before it, one pass per
    sequence: entry j - 1 of sequence i's arrays scores its token j."""
    losses: list[np.ndarray] = [np.empty(0)] * len(sequences)
    hits: list[np.ndarray] = [np.empty(0)] * len(sequences)
    for index in _batches(len(sequences), [len(s) for s in sequences], batch_size):
        ids, lengths = _padded([sequences[i] for i in index], pad_id)
        ids = ids.to(device)
        with autocast(device):
            logits = model(ids[:, :-1], steps=steps).logits.float()  # (B, S-1, V)
        targets = ids[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").cpu().numpy()
        hit = (logits.argmax(-1) == targets).cpu().numpy()
        for row, i in enumerate(index):
            losses[i], hits[i] = loss[row, : lengths[row] - 1], hit[row, : lengths[row] - 1]
        if progress is not None:
            progress.update(len(index))
    return losses, hits


def score_texts(model, data, records: list[dict], **options) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """`score_sequences` of each record's text as training read it (`<bos> text <eos>`): entry k of
    record i's arrays scores its text token k."""
    return score_sequences(model, [data.encode_text(r["text"]) for r in records], pad_id=data.pad_id, **options)


def answer_batches(prompts, answers, pad_id, device, batch_size):
    """Teacher-forcing batches: (index, inputs (B, S-1), targets (B, S-1), answer mask (B, S-1))."""
    for index in _batches(len(prompts), [len(p) + len(a) for p, a in zip(prompts, answers)], batch_size):
        ids, lengths = _padded([prompts[i] + answers[i] for i in index], pad_id)
        mask = torch.zeros(len(index), ids.shape[1] - 1, dtype=torch.bool)
        for row, i in enumerate(index):
            mask[row, len(prompts[i]) - 1 : lengths[row] - 1] = True
        ids = ids.to(device)
        yield index, ids[:, :-1], ids[:, 1:], mask.to(device)
