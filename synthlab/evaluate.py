"""Evaluation of a trained run on its test split: `evaluate_run(run_dir, ...)` -> RUN_DIR/eval/*.json.

Every task's test records are (prompt, answer) pairs. The model reads prompt + answer once with
teacher forcing and, at every recurrent step t, we take the argmax at each answer position: the
answer is correct at step t when all its tokens are. This equals greedy decoding (if every greedy
token matches, each next token is predicted from the same correct prefix) at the cost of one
forward pass. Reported per step t = 1..T (and past the trained depth with `steps`):

- exact-match accuracy, and the summed cross-entropy of the answer tokens (nats);
- the step agreement matrix: the fraction of examples whose predicted answers at steps i and j
  are identical (docs/claims.md, C9);
- per group, at the trained depth (the model as trained, or the last evaluated step if `steps` is
  fewer: what a model has learned is not confounded with how it extrapolates past its depth, which
  `acc_step_<t>` reports) (the task SPEC's `group_key`: the bioS attribute, the Mano length, the multihop hop
  count with the one-hop atomic facts, reach's distance and class `d2_yes` / `d2_no` (a "no"
  at its decoy distance) with the training edge queries `edge_yes` / `edge_no`), accuracy and answer loss on every held-out test prompt AND on a sample of
  training prompts (memorised vs generalised; bioS trains on biographies, not questions: its
  training side is `biography_recall`): `groups`, flattened into results columns by
  `group_columns` (`acc_l2`, `train_acc_l1`, ...); `train_only_groups` names the groups with no
  held-out prompt (Mano's l = 1 when every one-operator prompt is in train, multihop's facts).
  Test records marked `"headline": false` (Mano's shorter lengths) count only here; every other
  number is over the headline test records;
- bioS also: recall of each attribute inside the training biographies (`biography_recall`), since
  a model trained on biographies alone has never seen a question.

Options that need the model's inference machinery:
- `exit_rule` (`static:T`, `q:0.8`, `diff:0.01`, `kl:0.001`): accuracy when each token exits at
  the step the rule picks, and the mean exit step (C6);
- `kv` (`full`, `first`, `last`, `mean`): accuracy of real greedy generation with that decode-time
  KV-cache strategy (C7), batched over prompts of equal length.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from synthlab.data import Dataset, load_dataset, qa_sequence
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text
from synthlab.models import KV_STRATEGIES, parse_exit_rule
from synthlab.runs import autocast, load_run, open_run, resolve_device, trained_data
from synthlab_generators import TASKS

EXTRAPOLATION = 16  # the most recurrent steps evaluated, as a multiple of the trained depth


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


@torch.no_grad()
def score_answers(model, prompts: list[list[int]], answers: list[list[int]], *, pad_id: int,
                  device: torch.device, steps: int | None = None, batch_size: int = 256) -> AnswerScores:
    """Teacher-forced exact match and loss of each answer at every recurrent step."""
    n = len(prompts)
    correct, loss, same = None, None, None
    for index, inputs, targets, answer_mask in _answer_batches(prompts, answers, pad_id, device, batch_size):
        with autocast(device):
            step_logits = model(inputs, steps=steps).step_logits  # (T, B, S, V)
        logp = torch.log_softmax(step_logits.float(), dim=-1)
        n_steps = logp.shape[0]
        if correct is None:
            correct = np.zeros((n_steps, n), dtype=bool)
            loss = np.zeros((n_steps, n))
            same = np.zeros((n_steps, n_steps))
        target_logp = logp.gather(-1, targets.expand(n_steps, -1, -1).unsqueeze(-1)).squeeze(-1)  # (T, B, S)
        loss[:, index] = -(target_logp * answer_mask).sum(-1).cpu().numpy()
        predicted = logp.argmax(-1)  # (T, B, S-1)
        hit = (predicted == targets) | ~answer_mask
        correct[:, index] = hit.all(-1).cpu().numpy()
        # two steps agree when their predictions match at every answer position
        pairwise = (predicted.unsqueeze(0) == predicted.unsqueeze(1)) | ~answer_mask  # (T, T, B, S-1)
        same += pairwise.all(-1).sum(-1).cpu().numpy()
    return AnswerScores(correct, loss, same / max(n, 1))


@torch.no_grad()
def score_sequences(model, sequences: list[list[int]], *, pad_id: int, device: torch.device,
                    steps: int | None = None, batch_size: int = 64) -> tuple[list[np.ndarray], list[np.ndarray]]:
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
    return losses, hits


def biography_recall(model, data: Dataset, *, device: torch.device, people: int = 500,
                     steps: int | None = None, batch_size: int = 64) -> dict[str, dict[str, float]]:
    """bioS: how well the training biographies themselves are recalled, per attribute: the fraction
    of values whose every token is the argmax given the biography before it, and the summed loss.
    (A model trained on biographies only has never seen a question; this is what it knows.)"""
    records = data.records("train")[:people]
    losses, hits = score_sequences(model, [data.encode_text(r["text"]) for r in records], pad_id=data.pad_id,
                                   device=device, steps=steps, batch_size=batch_size)
    exact: dict[str, list[bool]] = defaultdict(list)
    nats: dict[str, list[float]] = defaultdict(list)
    for record, loss, hit in zip(records, losses, hits):
        for name, (start, end) in record["spans"].items():  # text token k is scored at entry k
            exact[name].append(bool(hit[start:end].all()))
            nats[name].append(float(loss[start:end].sum()))
    return {name: {"accuracy": float(np.mean(exact[name])), "loss": float(np.mean(nats[name]))} for name in exact}


def split_items(data: Dataset, split: str = "test", headline_only: bool = False
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
    return {group_label(key, g): {"n": len(members[g]), "accuracy": float(correct[members[g]].mean()),
                                  "answer_loss": float(loss[members[g]].mean())} for g in order}


def group_columns(groups: dict[str, dict[str, dict]], prefix: str = "") -> dict[str, float]:
    """`groups` ({"heldout"|"train": {label: stats}}) as flat columns: acc_<label>,
    answer_loss_<label>, n_<label>, and the same with train_ for the training sample."""
    out = {}
    for split, stats in groups.items():
        head = prefix + ("train_" if split == "train" else "")
        for label, s in stats.items():
            out.update({f"{head}acc_{label}": s["accuracy"], f"{head}answer_loss_{label}": s["answer_loss"],
                        f"{head}n_{label}": s["n"]})
    return out


def _sample_by_group(records: list[dict], key: str, per_group: int, rng: np.random.Generator) -> list[dict]:
    """Up to `per_group` records of each group, drawn without replacement, in file order."""
    members: dict = defaultdict(list)
    for i, record in enumerate(records):
        members[record.get(key)].append(i)
    picked = [i for group in members.values()
              for i in (group if len(group) <= per_group else rng.choice(group, per_group, replace=False))]
    return [records[i] for i in sorted(picked)]


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
    each group, drawn once from `seed`): the learning curve `train.eval_every` logs."""

    def __init__(self, data: Dataset, *, per_group: int = 256, seed: int = 0, batch_size: int = 256):
        key = TASKS[data.task].group_key
        rng = np.random.default_rng(seed)
        self.key, self.pad_id, self.batch_size = key, data.pad_id, batch_size
        self.items = {split: _qa_items(data, _sample_by_group(records, key, per_group, rng))
                      for split, records in (("heldout", data.records("test")), ("train", _train_qa(data)))}

    def groups(self, model, device: torch.device, steps: int | None = None) -> dict[str, dict[str, dict]]:
        """{"heldout"|"train": {label: {"n", "accuracy", "answer_loss"}}} at the last step."""
        out = {}
        for split, (prompts, answers, groups) in self.items.items():
            if prompts:
                scores = score_answers(model, prompts, answers, pad_id=self.pad_id, device=device, steps=steps,
                                       batch_size=self.batch_size)
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


def check_eval_steps(steps: int | None, trained: int) -> None:
    """Recurrent steps to evaluate at: 1 up to EXTRAPOLATION times the trained depth (each step is
    a pass of the recurrent block over the whole test set)."""
    if steps is not None and not 1 <= steps <= EXTRAPOLATION * trained:
        raise SynthlabError(f"--steps must lie in 1..{EXTRAPOLATION * trained} ({EXTRAPOLATION} x the trained "
                            f"{trained} loops), got {steps}")


def evaluate_run(run_dir: str | Path, *, data_dir: str | Path | None = None, steps: int | None = None,
                 exit_rule: str | None = None, kv: str | None = None, batch_size: int = 256,
                 device: str = "auto", train_sample: int = 500, seed: int = 0) -> dict:
    """Score a run on a test split; writes RUN_DIR/eval/<name>.json and returns the same dict.

    train_sample: training prompts scored per group (drawn from `seed`)."""
    run_dir = Path(run_dir)
    if exit_rule is not None:
        parse_exit_rule(exit_rule)  # fail before any work on a malformed rule
    if kv is not None and kv not in KV_STRATEGIES:
        raise SynthlabError(f"--kv {kv}: choose one of {', '.join(KV_STRATEGIES)}")
    dev = resolve_device(device)
    check_eval_steps(steps, load_run(run_dir)[0].model.loops)
    model, run, derived = open_run(run_dir, dev)
    data = load_dataset(data_dir or trained_data(run_dir, run, derived), run.train.task)
    if len(data.tokenizer) != run.model.vocab_size:
        raise SynthlabError(f"--data {data.path}: vocabulary of {len(data.tokenizer)} tokens, the model was trained on {run.model.vocab_size}")
    prompts, answers, groups = split_items(data, headline_only=True)
    trained = run.model.loops
    scores = score_answers(model, prompts, answers, pad_id=data.pad_id, device=dev, steps=steps, batch_size=batch_size)
    n_steps = scores.correct.shape[0]
    depth = min(trained, n_steps)  # the model as trained (or the last step, evaluated to fewer)
    result = {
        "task": data.task,
        "data": str(data.path),
        "n_examples": len(prompts),
        "trained_steps": trained,
        "eval_steps": n_steps,
        "accuracy": float(scores.correct[-1].mean()),
        "accuracy_at_trained_depth": float(scores.correct[depth - 1].mean()),
        "accuracy_per_step": scores.correct.mean(1).tolist(),
        "answer_loss_per_step": scores.loss.mean(1).tolist(),
        "agreement": scores.agreement.tolist(),
        "group_key": TASKS[data.task].group_key,
        "groups_at_step": depth,
    }
    result.update(_diagnostics(model, data, scores, groups, dev, depth, batch_size, train_sample, seed))
    if "spans" in data.records("train")[0]:  # texts with marked values (bioS): recall inside them
        result["biography_recall"] = biography_recall(model, data, device=dev, steps=steps)
    name = f"steps{n_steps}" + (f"_data-{data.path.name}" if data_dir is not None else "")
    if exit_rule is not None:
        result.update(_exit_eval(model, prompts, answers, data.pad_id, dev, exit_rule, steps, batch_size))
        name += "_exit-" + exit_rule.replace(":", "")
    if kv is not None:
        result.update(_kv_eval(model, prompts, answers, dev, kv, steps, batch_size))
        name += "_kv-" + kv
    result["file"] = f"eval/{name}.json"
    (run_dir / "eval").mkdir(exist_ok=True)
    atomic_write_text(run_dir / result["file"], json.dumps(result, indent=2) + "\n")
    return result


def _diagnostics(model, data: Dataset, scores: AnswerScores, groups: list, device, depth: int, batch_size,
                 train_sample: int, seed: int) -> dict:
    """Per-group scores at recurrent step `depth` on every held-out prompt (the headline ones
    already scored) and on a sample of training prompts; groups present in training only are named."""
    key = TASKS[data.task].group_key
    extra = _qa_items(data, [r for r in data.records("test") if not r.get("headline", True)])
    correct, loss, all_groups = scores.correct[depth - 1], scores.loss[depth - 1], list(groups)
    if extra[0]:
        more = score_answers(model, extra[0], extra[1], pad_id=data.pad_id, device=device, steps=depth,
                             batch_size=batch_size)
        correct, loss = np.concatenate([correct, more.correct[-1]]), np.concatenate([loss, more.loss[-1]])
        all_groups += extra[2]
    out = {"heldout": _group_stats(correct, loss, all_groups, key)}
    train = _qa_items(data, _sample_by_group(_train_qa(data), key, train_sample, np.random.default_rng(seed)))
    if train[0]:
        ts = score_answers(model, train[0], train[1], pad_id=data.pad_id, device=device, steps=depth,
                           batch_size=batch_size)
        out["train"] = _group_stats(ts.correct[-1], ts.loss[-1], train[2], key)
    return {"accuracy_per_group": _per_group(correct, all_groups), "answer_loss_per_group": _per_group(loss, all_groups),
            "groups": out, "train_only_groups": [g for g in out.get("train", {}) if g not in out["heldout"]]}


def _answer_batches(prompts, answers, pad_id, device, batch_size):
    """Teacher-forcing batches: (index, inputs (B, S-1), targets (B, S-1), answer mask (B, S-1))."""
    for index in _batches(len(prompts), [len(p) + len(a) for p, a in zip(prompts, answers)], batch_size):
        ids, lengths = _padded([prompts[i] + answers[i] for i in index], pad_id)
        mask = torch.zeros(len(index), ids.shape[1] - 1, dtype=torch.bool)
        for row, i in enumerate(index):
            mask[row, len(prompts[i]) - 1 : lengths[row] - 1] = True
        ids = ids.to(device)
        yield index, ids[:, :-1], ids[:, 1:], mask.to(device)


@torch.no_grad()
def _exit_eval(model, prompts, answers, pad_id, device, exit_rule, steps, batch_size) -> dict:
    """Accuracy when every answer token is read at the step the exit rule picks for it (C6)."""
    correct = np.zeros(len(prompts), dtype=bool)
    exit_sum = exit_count = computed = 0
    for index, inputs, targets, mask in _answer_batches(prompts, answers, pad_id, device, batch_size):
        with autocast(device):
            out = model.forward_exit(inputs, exit_rule, mask=mask, steps=steps)
        hit = (out.logits.argmax(-1) == targets) | ~mask
        correct[index] = hit.all(-1).cpu().numpy()
        exit_sum += int(out.exit_step[mask].sum())
        exit_count += int(mask.sum())
        computed = max(computed, out.steps_computed)
    return {
        "exit_rule": exit_rule,
        "exit_accuracy": float(correct.mean()),
        "mean_exit_step": exit_sum / max(exit_count, 1),
        "max_steps_computed": computed,
    }


@torch.no_grad()
def _kv_eval(model, prompts, answers, device, kv, steps, batch_size) -> dict:
    """Accuracy of real greedy generation with a decode-time KV strategy (C7); prompts of one
    length and answers of one length form a batch, so no padding enters the caches."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        groups[(len(p), len(a))].append(i)
    correct = np.zeros(len(prompts), dtype=bool)
    cache_bytes_per_sequence = 0.0
    for (n_prompt, n_answer), members in sorted(groups.items()):
        for start in range(0, len(members), batch_size):
            index = members[start : start + batch_size]
            idx = torch.tensor([prompts[i] for i in index], device=device)
            with autocast(device):
                out = model.generate(idx, max_new_tokens=n_answer, kv_strategy=kv, steps=steps)
            generated = out.tokens[:, n_prompt:].cpu().numpy()
            correct[index] = (generated == np.array([answers[i] for i in index])).all(1)
            cache_bytes_per_sequence = max(cache_bytes_per_sequence, out.cache_bytes / len(index))
    return {"kv_strategy": kv, "kv_accuracy": float(correct.mean()), "kv_cache_bytes_per_sequence": cache_bytes_per_sequence}


def biography_generation(run_dir: str | Path, *, kv: str = "full", steps: int | None = None, people: int = 100,
                         batch_size: int = 256, device: str = "cpu") -> dict:
    """bioS recall by real greedy generation with a KV-cache strategy (C7).

    A trained bioS model has memorised biographies, not QA, so the generation test is the text it
    was trained on: the biography up to an attribute value is the prompt, the value's tokens
    (2-5 of them: "March 26 , 2094") the answer.
    """
    dev = resolve_device(device)
    model, run, derived = open_run(run_dir, dev)
    data = load_dataset(trained_data(run_dir, run, derived), "bios")
    prompts, answers = [], []
    for record in data.records("train")[:people]:
        ids = data.encode_text(record["text"])  # <bos> first: token j of the text is ids[j + 1]
        for attribute, (start, end) in record["spans"].items():
            if attribute != "name":
                prompts.append(ids[: start + 1])
                answers.append(ids[start + 1 : end + 1])
    result = _kv_eval(model, prompts, answers, dev, kv, steps, batch_size)
    return {"kv": kv, "accuracy": result["kv_accuracy"], "kv_bytes": result["kv_cache_bytes_per_sequence"],
            "n_answers": len(prompts)}
