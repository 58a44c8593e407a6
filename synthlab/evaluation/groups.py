"""Evaluation by group (the task SPEC's `group_key`: the bioS attribute, the Mano length, the
multihop hop count, reach's distance and class): the QA items of a split, each group's accuracy and
answer loss on held-out prompts and on a sample of training prompts (`group_scores`), their results
columns (`group_columns`), and the fixed-sample probe `train.logging.eval_every` logs (`GroupProbe`).
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import closing

import numpy as np
import torch

from synthlab.conditions import holds
from synthlab.conditions import parse as parse_conditions
from synthlab.data.datasets import Dataset, qa_sequence
from synthlab.errors import SynthlabError
from synthlab.evaluation.scoring import AnswerScores, score_answers
from synthlab.progress import Progress
from synthlab_generators import TASKS


def split_items(
    data: Dataset, split: str = "test", headline_only: bool = False
) -> tuple[list[list[int]], list[list[int]], list]:
    """(prompts, answers, group of each item) of a split's QA records (with `headline_only`, the
    test records that make the headline accuracy: all but those marked `"headline": false`)."""
    records = [r for r in data.records(split) if r.get("headline", True) or not headline_only]
    prompts, answers, groups = _qa_items(data, records)
    if not prompts:
        raise SynthlabError(f"{data.path / f'{split}.jsonl'} has no records")
    return prompts, answers, groups


def _qa_items(data: Dataset, records: list[dict]) -> tuple[list[list[int]], list[list[int]], list]:
    key = TASKS[data.task].group_key
    pairs = [qa_sequence(data, r) for r in records]
    return [p for p, _ in pairs], [a for _, a in pairs], [r.get(key) for r in records]


def group_label(key: str, value) -> str:
    """A group's name in results columns: an integer value g of key k is k[0] + g (length 2 -> `l2`,
    hops 1 -> `h1`), a missing value `no_<key>`, any other value itself (`birth_date`, `d3_no`)."""
    if value is None:
        return f"no_{key}"
    return f"{key[0]}{value}" if isinstance(value, int) else str(value)


def _group_stats(correct: np.ndarray, loss: np.ndarray, groups: list, key: str) -> dict[str, dict]:
    """label -> {"n", "accuracy", "answer_loss"} of one split's last-step scores, groups in order."""
    members: dict = defaultdict(list)
    for i, group in enumerate(groups):
        members[group].append(i)
    order = sorted(members, key=lambda g: (g is None, not isinstance(g, int), g if isinstance(g, int) else str(g)))
    return {
        group_label(key, g): {
            "n": len(members[g]),
            "accuracy": float(correct[members[g]].mean()),
            "answer_loss": float(loss[members[g]].mean()),
        }
        for g in order
    }


def group_columns(groups: dict[str, dict[str, dict]], prefix: str = "") -> dict[str, float]:
    """`groups` ({"heldout"|"train": {label: stats}}) as flat columns: acc_<label>,
    answer_loss_<label>, n_<label>, and the same with train_ for the training sample."""
    out = {}
    for split, stats in groups.items():
        head = prefix + ("train_" if split == "train" else "")
        for label, s in stats.items():
            out.update(
                {
                    f"{head}acc_{label}": s["accuracy"],
                    f"{head}answer_loss_{label}": s["answer_loss"],
                    f"{head}n_{label}": s["n"],
                }
            )
    return out


def _sample_by_group(records: list[dict], key: str, per_group: int, rng: np.random.Generator) -> list[dict]:
    """Up to `per_group` records of each group, drawn without replacement, in file order."""
    members: dict = defaultdict(list)
    for i, record in enumerate(records):
        members[record.get(key)].append(i)
    picked = [
        i
        for group in members.values()
        for i in (group if len(group) <= per_group else rng.choice(group, per_group, replace=False))
    ]
    return [records[i] for i in sorted(picked)]


def stratified(groups: list, limit: int | None, rng: np.random.Generator) -> list[int]:
    """Indices of at most `limit` items (all when None), in order: every group gets an even share
    of `limit` (a group with fewer items keeps them all and leaves the rest to the larger groups;
    the remainder goes one each to the largest), its items drawn from `rng` without replacement."""
    if limit is None or limit >= len(groups):
        return list(range(len(groups)))
    members: dict = defaultdict(list)
    for i, group in enumerate(groups):
        members[group].append(i)
    by_size = sorted(members, key=lambda g: (len(members[g]), str(g)))
    quota, left = {}, limit
    for j, group in enumerate(by_size):
        share, extra = divmod(left, len(by_size) - j)
        quota[group] = min(len(members[group]), share + (extra > 0 and len(by_size) - j - 1 < extra))
        left -= quota[group]
    return sorted(i for g, m in members.items() for i in rng.choice(m, quota[g], replace=False).tolist())


def _train_qa(data: Dataset) -> list[dict]:
    """The training split's QA records (not bioS biographies or reach edge statements), one per
    distinct prompt: how many of the prompts it was trained on a model gets right."""
    distinct = {}
    for r in data.records("train"):
        if "answer" in r and ("prompt" in r or "question" in r):
            distinct.setdefault(r.get("prompt", r.get("question")), r)
    return list(distinct.values())


class GroupProbe:
    """Per-group scores on fixed samples of held-out and training prompts (up to `per_group` of
    each group, drawn once from `seed`): the learning curve `train.logging.eval_every` logs, and what
    `train.schedule.stop_when` reads (`met`; its columns checked against the probe's here, before training)."""

    def __init__(
        self, data: Dataset, *, per_group: int = 256, seed: int = 0, batch_size: int = 256, stop_when: str = ""
    ):
        key = TASKS[data.task].group_key
        rng = np.random.default_rng(seed)
        self.key, self.pad_id, self.batch_size = key, data.pad_id, batch_size
        self.items = {
            split: _qa_items(data, _sample_by_group(records, key, per_group, rng))
            for split, records in (("heldout", data.records("test")), ("train", _train_qa(data)))
        }
        self.stop = parse_conditions(stop_when, "train.schedule.stop_when", prefix="eval/") if stop_when else []
        logged = self.columns
        for column, _, _ in self.stop:
            if f"eval/{column}" not in logged:
                accuracies = sorted(c.removeprefix("eval/") for c in logged if "acc_" in c)
                raise SynthlabError(
                    f"train.schedule.stop_when: the probe logs no {column} on {data.path} "
                    f"(it logs {', '.join(accuracies)}, and answer_loss_ and n_ of the same groups)"
                )

    @property
    def columns(self) -> list[str]:
        """The columns a call logs, named without scoring anything."""
        labels = {
            split: dict.fromkeys(group_label(self.key, g) for g in groups)
            for split, (prompts, _, groups) in self.items.items()
            if prompts
        }
        empty = {"accuracy": 0.0, "answer_loss": 0.0, "n": 0}
        return list(group_columns({s: dict.fromkeys(found, empty) for s, found in labels.items()}, prefix="eval/"))

    def met(self, record: dict[str, float]) -> bool:
        """Whether a metrics record this probe scored meets `train.schedule.stop_when` (never without one)."""
        return bool(self.stop) and holds(self.stop, record, prefix="eval/")

    def groups(self, model, device: torch.device, steps: int | None = None) -> dict[str, dict[str, dict]]:
        """{"heldout"|"train": {label: {"n", "accuracy", "answer_loss"}}} at the last step."""
        out = {}
        for split, (prompts, answers, groups) in self.items.items():
            if prompts:
                scores = score_answers(
                    model, prompts, answers, pad_id=self.pad_id, device=device, steps=steps, batch_size=self.batch_size
                )
                out[split] = _group_stats(scores.correct[-1], scores.loss[-1], groups, self.key)
        return out

    def __call__(self, model, device: torch.device) -> dict[str, float]:
        """Columns prefixed `eval/` (`eval/acc_l1`, `eval/train_acc_l1`, ...) for a metrics record;
        the model is scored in eval mode and put back in the mode it was in."""
        was_training = model.training
        model.eval()
        try:
            return group_columns(self.groups(model, device), prefix="eval/")
        finally:
            model.train(was_training)


def _per_group(values: np.ndarray, groups: list) -> dict[str, float]:
    by_group: dict[str, list[float]] = defaultdict(list)
    for value, group in zip(values.tolist(), groups):
        by_group[str(group)].append(value)
    return {g: float(np.mean(v)) for g, v in sorted(by_group.items())}


def group_scores(
    model,
    data: Dataset,
    scores: AnswerScores,
    groups: list,
    device,
    depth: int,
    batch_size,
    train_sample: int,
    seed: int,
    limit: int | None = None,
    progress: bool = False,
) -> dict:
    """Per-group scores at recurrent step `depth` on every held-out prompt (the headline ones
    already scored) and on a sample of training prompts; groups present in training only are named.
    `limit`: at most that many of the other held-out prompts and of the training sample (`stratified`)."""
    key = TASKS[data.task].group_key
    rng = np.random.default_rng(seed)
    extra = [r for r in data.records("test") if not r.get("headline", True)]
    extra = _qa_items(data, [extra[i] for i in stratified([r.get(key) for r in extra], limit, rng)])
    train = _sample_by_group(_train_qa(data), key, train_sample, rng)
    train = _qa_items(data, [train[i] for i in stratified([r.get(key) for r in train], limit, rng)])

    def scored(items, what: str) -> AnswerScores:
        with closing(Progress(len(items[0]), enabled=progress, desc=f"eval {what}", unit="prompt")) as bar:
            return score_answers(
                model,
                items[0],
                items[1],
                pad_id=data.pad_id,
                device=device,
                steps=depth,
                batch_size=batch_size,
                progress=bar,
            )

    correct, loss, all_groups = scores.correct[depth - 1], scores.loss[depth - 1], list(groups)
    if extra[0]:
        more = scored(extra, "other test prompts")
        correct, loss = np.concatenate([correct, more.correct[-1]]), np.concatenate([loss, more.loss[-1]])
        all_groups += extra[2]
    out = {"heldout": _group_stats(correct, loss, all_groups, key)}
    if train[0]:
        ts = scored(train, "training prompts")
        out["train"] = _group_stats(ts.correct[-1], ts.loss[-1], train[2], key)
    return {
        "accuracy_per_group": _per_group(correct, all_groups),
        "answer_loss_per_group": _per_group(loss, all_groups),
        "groups": out,
        "train_only_groups": [g for g in out.get("train", {}) if g not in out["heldout"]],
    }
