"""Evaluation of a trained run on its test split: `evaluate_run(run_dir, ...)` -> RUN_DIR/eval/*.json.

Every task's test records are (prompt, answer) pairs. The model reads prompt + answer once with
teacher forcing and, at every recurrent step t, we take the argmax at each answer position: the
answer is correct at step t when all its tokens are. This equals greedy decoding (if every greedy
token matches, each next token is predicted from the same correct prefix) at the cost of one
forward pass (`synthlab.evaluation.scoring`). Reported per step t = 1..T (and past the trained depth with
`steps`):

- exact-match accuracy, and the summed cross-entropy of the answer tokens (nats);
- the step agreement matrix: the fraction of examples whose predicted answers at steps i and j
  are identical (docs/claims.md, C9);
- per group, at the trained depth (the model as trained, or the last evaluated step if `steps` is
  fewer: what a model has learned is not confounded with how it extrapolates past its depth, which
  `acc_step_<t>` reports) (the task SPEC's `group_key`: the bioS attribute, the Mano length, the multihop hop
  count with the one-hop atomic facts, reach's distance and class `d2_yes` / `d2_no` (a "no"
  at its decoy distance) with the training edge queries `edge_yes` / `edge_no`), accuracy and answer loss on every held-out test prompt AND on a sample of
  training prompts (memorised vs generalised; bioS trains on biographies, not questions: its
  training side is `biography_recall`): `groups` (`synthlab.evaluation.groups`), flattened into results
  columns by `group_columns` (`acc_l2`, `train_acc_l1`, ...); `train_only_groups` names the groups with no
  held-out prompt (Mano's l = 1 when every one-operator prompt is in train, multihop's facts).
  Test records marked `"headline": false` (Mano's shorter lengths) count only here; every other
  number is over the headline test records;
- bioS also: recall of each attribute inside the training biographies (`biography_recall`), since
  a model trained on biographies alone has never seen a question.

Beside the JSON, `eval/<name>.outcomes.csv` holds each headline prompt's outcome per read-out
(right or not at every step, which step's answer each step repeats, the exit rule's or KV
strategy's): comparisons of two read-outs of one model are then paired (`synthlab.claims.paired`).

Options that need the model's inference machinery:
- `exit_rule` (`static:T`, `q:0.8`, `diff:0.01`, `kl:0.001`): accuracy when each token exits at
  the step the rule picks, and the mean exit step (C6);
- `kv` (`full`, `first`, `last`, `mean`): accuracy of real greedy generation with that decode-time
  KV-cache strategy (C7), batched over prompts of equal length.
"""

from __future__ import annotations

import json
from collections import defaultdict
from contextlib import closing
from pathlib import Path

import numpy as np
import torch

from synthlab.data.datasets import Dataset, check_vocab, load_dataset
from synthlab.errors import SynthlabError
from synthlab.evaluation.groups import group_scores, split_items, stratified
from synthlab.evaluation.scoring import answer_batches, score_answers, score_texts
from synthlab.files import atomic_write_text
from synthlab.models import KV_STRATEGIES, parse_exit_rule
from synthlab.progress import Progress
from synthlab.training.run_folders import autocast, load_run, open_run, resolve_device, trained_data
from synthlab_generators import TASKS

EXTRAPOLATION = 16  # the most recurrent steps evaluated, as a multiple of the trained depth


def biography_recall(
    model,
    data: Dataset,
    *,
    device: torch.device,
    people: int = 500,
    steps: int | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """bioS: how well the training biographies themselves are recalled, per attribute: the fraction
    of values whose every token is the argmax given the biography before it, and the summed loss.
    (A model trained on biographies only has never seen a question; this is what it knows.)"""
    records = data.records("train")[:people]
    with closing(Progress(len(records), enabled=progress, desc="eval training biographies", unit="text")) as bar:
        losses, hits = score_texts(
            model, data, records, device=device, steps=steps, batch_size=batch_size, progress=bar
        )
    exact: dict[str, list[bool]] = defaultdict(list)
    nats: dict[str, list[float]] = defaultdict(list)
    for record, loss, hit in zip(records, losses, hits):
        for name, (start, end) in record["spans"].items():  # text token k is scored at entry k
            exact[name].append(bool(hit[start:end].all()))
            nats[name].append(float(loss[start:end].sum()))
    return {name: {"accuracy": float(np.mean(exact[name])), "loss": float(np.mean(nats[name]))} for name in exact}


def check_eval_steps(steps: int | None, trained: int) -> None:
    """Recurrent steps to evaluate at: 1 up to EXTRAPOLATION times the trained depth (each step is
    a pass of the recurrent block over the whole test set)."""
    if steps is not None and not 1 <= steps <= EXTRAPOLATION * trained:
        raise SynthlabError(
            f"--steps must lie in 1..{EXTRAPOLATION * trained} ({EXTRAPOLATION} x the trained "
            f"{trained} loops), got {steps}"
        )


def evaluate_run(
    run_dir: str | Path,
    *,
    data_dir: str | Path | None = None,
    steps: int | None = None,
    exit_rule: str | None = None,
    kv: str | None = None,
    batch_size: int = 256,
    device: str = "auto",
    train_sample: int = 500,
    seed: int = 0,
    max_prompts: int | None = None,
    progress: bool = False,
) -> dict:
    """Score a run on a test split; writes RUN_DIR/eval/<name>.json (and its per-prompt
    <name>.outcomes.csv, `write_outcomes`) and returns the same dict.

    train_sample: training prompts scored per group (drawn from `seed`). max_prompts: score at most
    that many test prompts, and as many of each other set (`eval_groups.stratified`: each group its
    even share, drawn from `seed`). progress: show each phase's progress (`synthlab.progress`)."""
    run_dir = Path(run_dir)
    if exit_rule is not None:
        parse_exit_rule(exit_rule)  # fail before any work on a malformed rule
    if kv is not None and kv not in KV_STRATEGIES:
        raise SynthlabError(f"--kv {kv}: choose one of {', '.join(KV_STRATEGIES)}")
    dev = resolve_device(device)
    check_eval_steps(steps, load_run(run_dir)[0].model.loops)
    model, run, derived = open_run(run_dir, dev)
    data = load_dataset(data_dir or trained_data(run_dir, run, derived), run.train.task)
    check_vocab(data, run.model.vocab_size, derived.get("data_sha256"))
    prompts, answers, groups = split_items(data, headline_only=True)
    if max_prompts is not None:
        kept = stratified(groups, max_prompts, np.random.default_rng(seed))
        prompts, answers, groups = ([items[i] for i in kept] for items in (prompts, answers, groups))
    trained = run.model.loops

    def bar(what: str) -> Progress:
        return Progress(len(prompts), enabled=progress, desc=f"eval {what}", unit="prompt")

    with closing(bar("test prompts")) as shown:
        scores = score_answers(
            model, prompts, answers, pad_id=data.pad_id, device=dev, steps=steps, batch_size=batch_size, progress=shown
        )
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
    if max_prompts is not None:
        result["max_prompts"] = max_prompts
    result.update(
        group_scores(model, data, scores, groups, dev, depth, batch_size, train_sample, seed, max_prompts, progress)
    )
    if "spans" in data.records("train")[0]:  # texts with marked values (bioS): recall inside them
        people = min(500, max_prompts or 500)
        result["biography_recall"] = biography_recall(
            model, data, device=dev, steps=steps, people=people, progress=progress
        )
    name = f"steps{n_steps}" + (f"_data-{data.path.name}" if data_dir is not None else "")
    outcomes = {"group": groups}
    outcomes.update({f"step_{t}": c for t, c in enumerate(scores.correct, 1)})
    outcomes.update({f"answer_{t}": c for t, c in enumerate(scores.answer_class, 1)})
    if exit_rule is not None:
        with closing(bar(f"exit {exit_rule}")) as shown:
            summary, outcomes["exit"] = _exit_eval(
                model, prompts, answers, data.pad_id, dev, exit_rule, steps, batch_size, shown
            )
        result.update(summary)
        name += "_exit-" + exit_rule.replace(":", "")
    if kv is not None:
        with closing(bar(f"generation, kv {kv}")) as shown:
            summary, outcomes["kv"] = _kv_eval(model, prompts, answers, dev, kv, steps, batch_size, shown)
        result.update(summary)
        name += "_kv-" + kv
    name += f"_max{max_prompts}" if max_prompts is not None else ""
    result["file"] = f"eval/{name}.json"
    (run_dir / "eval").mkdir(exist_ok=True)
    result["outcomes"] = write_outcomes(run_dir / "eval" / f"{name}.outcomes.csv", outcomes, run_dir)
    atomic_write_text(run_dir / result["file"], json.dumps(result, indent=2) + "\n")
    return result


def write_outcomes(path: Path, columns: dict, run_dir: Path) -> str:
    """Per-prompt outcomes beside an eval JSON, one CSV row per scored prompt (`prompt`: its place
    among the scored test records, in file order): `group`, and per read-out whether the answer was
    right (1/0) or, for `answer_<t>`, which step's answer step t repeats (the OUROBOROS stage: per
    held-out sequence, its loss at each depth). Two read-outs of one model are then compared prompt
    by prompt (`synthlab.claims.paired`). Returns the path relative to run_dir."""
    names = list(columns)
    rows = zip(*(columns[c] for c in names))
    cell = lambda v: str(int(v)) if isinstance(v, (bool, np.bool_, np.integer)) else "" if v is None else str(v)  # noqa: E731
    lines = [",".join(["prompt", *names])] + [",".join([str(i), *map(cell, row)]) for i, row in enumerate(rows)]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path.relative_to(run_dir).as_posix()


@torch.no_grad()
def _exit_eval(
    model, prompts, answers, pad_id, device, exit_rule, steps, batch_size, progress=None
) -> tuple[dict, np.ndarray]:
    """Accuracy when every answer token is read at the step the exit rule picks for it (C6), and
    whether each prompt was answered right."""
    correct = np.zeros(len(prompts), dtype=bool)
    exit_sum = exit_count = computed = 0
    for index, inputs, targets, mask in answer_batches(prompts, answers, pad_id, device, batch_size):
        with autocast(device):
            out = model.forward_exit(inputs, exit_rule, mask=mask, steps=steps)
        hit = (out.logits.argmax(-1) == targets) | ~mask
        correct[index] = hit.all(-1).cpu().numpy()
        exit_sum += int(out.exit_step[mask].sum())
        exit_count += int(mask.sum())
        computed = max(computed, out.steps_computed)
        if progress is not None:
            progress.update(len(index))
    summary = {
        "exit_rule": exit_rule,
        "exit_accuracy": float(correct.mean()),
        "mean_exit_step": exit_sum / max(exit_count, 1),
        "max_steps_computed": computed,
    }
    return summary, correct


@torch.no_grad()
def _kv_eval(model, prompts, answers, device, kv, steps, batch_size, progress=None) -> tuple[dict, np.ndarray]:
    """Accuracy of real greedy generation with a decode-time KV strategy (C7), and whether each
    prompt was answered right; prompts of one length and answers of one length form a batch, so no
    padding enters the caches."""
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
            if progress is not None:
                progress.update(len(index))
    summary = {
        "kv_strategy": kv,
        "kv_accuracy": float(correct.mean()),
        "kv_cache_bytes_per_sequence": cache_bytes_per_sequence,
    }
    return summary, correct


def biography_generation(
    run_dir: str | Path,
    *,
    kv: str = "full",
    steps: int | None = None,
    people: int = 100,
    batch_size: int = 256,
    device: str = "cpu",
) -> dict:
    """bioS recall by real greedy generation with a KV-cache strategy (C7).

    A trained bioS model has memorised biographies, not QA, so the generation test is the text it
    was trained on: the biography up to an attribute value is the prompt, the value's tokens
    (2-5 of them: "March 26 , 2094") the answer.
    """
    dev = resolve_device(device)
    model, run, derived = open_run(run_dir, dev)
    data = load_dataset(trained_data(run_dir, run, derived), "bios")
    prompts, answers, attributes = [], [], []
    for record in data.records("train")[:people]:
        ids = data.encode_text(record["text"])  # <bos> first: token j of the text is ids[j + 1]
        for attribute, (start, end) in record["spans"].items():
            if attribute != "name":
                prompts.append(ids[: start + 1])
                answers.append(ids[start + 1 : end + 1])
                attributes.append(attribute)
    result, correct = _kv_eval(model, prompts, answers, dev, kv, steps, batch_size)
    run_dir = Path(run_dir)
    (run_dir / "eval").mkdir(exist_ok=True)
    name = f"generate_people{people}" + (f"_steps{steps}" if steps is not None else "") + f"_kv-{kv}"
    return {
        "kv": kv,
        "accuracy": result["kv_accuracy"],
        "kv_bytes": result["kv_cache_bytes_per_sequence"],
        "n_answers": len(prompts),
        "outcomes": write_outcomes(
            run_dir / "eval" / f"{name}.outcomes.csv", {"group": attributes, "kv": correct}, run_dir
        ),
    }
