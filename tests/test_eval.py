"""synthlab.evaluation.evaluate: accuracies against independently derived answers and equivalences."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from synthlab.claims import paired
from synthlab.cli.train import resolve_run_config
from synthlab.data.datasets import load_dataset
from synthlab.evaluation.evaluate import evaluate_run
from synthlab.evaluation.groups import GroupProbe, group_label, split_items
from synthlab.evaluation.scoring import score_answers
from synthlab.models import ModelConfig, build_model
from synthlab.training.trainer import train
from synthlab_generators import TASKS, write_dataset

MOD = 5


def prefix_value(tokens: list[str]) -> int:
    """Evaluate a prefix expression mod MOD, right to left with a stack (independent of the generator)."""
    stack = []
    for tok in reversed(tokens):
        if tok.isdigit():
            stack.append(int(tok))
        else:
            a, b = stack.pop(), stack.pop()
            stack.append({"+": a + b, "-": a - b, "*": a * b}[tok] % MOD)
    assert len(stack) == 1
    return stack[0]


class ManoOracle(torch.nn.Module):
    """Reads the prompt, computes its value v itself; at step 1 predicts v if v is even, else v + 1;
    at step 2 predicts v. Its logits at `<ans>` are one-hot on the prediction."""

    def __init__(self, tokenizer):
        super().__init__()
        self.tok = tokenizer
        self.loops = 2

    def forward(self, idx, steps=None, **_):
        T = steps or self.loops
        B, S = idx.shape
        logits = torch.zeros(T, B, S, len(self.tok))
        for b in range(B):
            words = self.tok.decode(idx[b].tolist()).split()
            end = words.index("<ans>")
            v = prefix_value(words[2:end])
            for t in range(T):
                guess = v if (t >= 1 or v % 2 == 0) else (v + 1) % MOD
                logits[t, b, end, self.tok.id(str(guess))] = 10.0
        return SimpleNamespace(step_logits=logits, logits=logits[-1])


@pytest.fixture(scope="module")
def mano_data(tmp_path_factory):
    spec = TASKS["mano"]
    return write_dataset(
        spec, spec.params_cls(L=3, n_train=300, n_test=60, mod=MOD), 0, tmp_path_factory.mktemp("d") / "mano"
    )


def test_accuracy_per_step_and_agreement_match_independent_answers(mano_data):
    data = load_dataset(mano_data)
    prompts, answers, _ = split_items(data)
    values = np.array([prefix_value(r["prompt"].split()[2:-1]) for r in data.records("test")])
    assert [str(v) for v in values] == [r["answer"] for r in data.records("test")]
    scores = score_answers(
        ManoOracle(data.tokenizer), prompts, answers, pad_id=data.pad_id, device=torch.device("cpu"), batch_size=7
    )
    even = float((values % 2 == 0).mean())
    assert scores.correct.mean(1).tolist() == pytest.approx([even, 1.0])
    assert np.allclose(scores.agreement, [[1.0, even], [even, 1.0]])
    # per prompt: step 2 repeats step 1's answer (class 0) exactly on the even values
    assert scores.answer_class.tolist() == [[0] * len(values), [0 if v % 2 == 0 else 1 for v in values]]
    # a right guess (logit 10, every other logit 0) costs log(e^10 + V - 1) - 10 nats
    V = len(data.tokenizer)
    assert scores.loss[1] == pytest.approx(np.full(len(values), np.log(np.exp(10) + V - 1) - 10), rel=1e-3)


def test_teacher_forced_exact_match_equals_greedy_generation():
    """Answers that are the model's own greedy continuations score correct, corrupted ones do not."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=30, d_model=32, n_heads=2, n_layers=1, max_seq_len=32, loops=2)).eval()
    prompts = [torch.randint(4, 30, (int(n),)).tolist() for n in torch.randint(3, 9, (12,))]
    answers = []
    for i, p in enumerate(prompts):
        greedy = model.generate(torch.tensor([p]), max_new_tokens=3).tokens[0, len(p) :].tolist()
        if i % 2:
            greedy[i % 3] = 4 + (greedy[i % 3] - 3) % 26  # a different token at one answer position
        answers.append(greedy)
    scores = score_answers(model, prompts, answers, pad_id=0, device=torch.device("cpu"), batch_size=5)
    assert scores.correct[-1].tolist() == [i % 2 == 0 for i in range(12)]


@pytest.fixture(scope="module")
def mano_run(mano_data, tmp_path_factory):
    run = resolve_run_config(
        {},
        {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_seq_len": 32, "loops": 2},
        {"data": str(mano_data), "steps": 8, "batch_size": 16, "lr": 3e-3, "warmup_steps": 2},
    )
    run_dir = tmp_path_factory.mktemp("r") / "run"
    train(run_dir, run, progress=False)
    return run_dir


def test_eval_options_agree_with_each_other(mano_run):
    deep = evaluate_run(mano_run, steps=4, kv="full", device="cpu")
    assert deep["eval_steps"] == 4 and len(deep["accuracy_per_step"]) == 4 and deep["trained_steps"] == 2
    assert deep["kv_accuracy"] == pytest.approx(deep["accuracy"])  # real decoding == teacher forcing
    static = evaluate_run(mano_run, exit_rule="static:2", device="cpu")
    assert static["mean_exit_step"] == 2
    assert static["exit_accuracy"] == pytest.approx(static["accuracy_per_step"][1])
    assert static["accuracy"] == pytest.approx(deep["accuracy_per_step"][1])
    written = json.loads((mano_run / static["file"]).read_text())
    # the headline numbers are over l = L alone; shorter held-out lengths only in the groups
    assert written["accuracy_per_group"]["3"] == static["accuracy"] and written["n_examples"] == 60
    assert written["groups"]["heldout"]["l3"]["n"] == 60
    assert written["groups"]["heldout"]["l3"]["accuracy"] == static["accuracy"]
    diag = np.diag(np.array(deep["agreement"]))
    assert (diag == 1).all()


def test_per_prompt_outcomes_beside_the_eval_json_give_back_its_numbers(mano_run):
    """eval/<name>.outcomes.csv: one row per headline prompt; its columns' means are the JSON's
    accuracies and agreements, and `synthlab.claims.paired` reads results columns from it."""
    deep = evaluate_run(mano_run, steps=4, kv="full", device="cpu")
    static = evaluate_run(mano_run, exit_rule="static:1", device="cpu")
    assert static["outcomes"] == "eval/steps2_exit-static1.outcomes.csv"
    table = pd.read_csv(mano_run / deep["outcomes"])
    assert table["prompt"].tolist() == list(range(60)) and set(table["group"]) == {3}
    assert [table[f"step_{t}"].mean() for t in range(1, 5)] == pytest.approx(deep["accuracy_per_step"])
    assert table["kv"].mean() == pytest.approx(deep["kv_accuracy"])
    agree = [[(table[f"answer_{i}"] == table[f"answer_{j}"]).mean() for j in range(1, 5)] for i in range(1, 5)]
    assert np.allclose(agree, deep["agreement"])
    row = {"run_dir": str(mano_run), "outcomes": static["outcomes"], "groups_at_step": 2}
    assert paired.prompt_vector(row, "accuracy").mean() == pytest.approx(static["exit_accuracy"])
    at_depth = paired.prompt_vector(row, "accuracy_all_steps - accuracy")
    assert at_depth.mean() == pytest.approx(static["accuracy"] - static["exit_accuracy"])
    assert paired.prompt_vector(row, "acc_l3") is None and paired.prompt_vector({"run_dir": "x"}, "accuracy") is None


def test_group_probe_matches_independent_answers(mano_data):
    """Per-group accuracy of the oracle (right at step 2, right on even values at step 1) is the
    share of even values among the sampled prompts, re-derived from the prompts themselves."""
    data = load_dataset(mano_data)
    probe = GroupProbe(data, per_group=25, seed=3)
    oracle, cpu = ManoOracle(data.tokenizer), torch.device("cpu")
    sources = {
        "heldout": {r["prompt"] for r in data.records("test")},
        "train": {r["prompt"] for r in data.records("train")},
    }
    first, last = probe.groups(oracle, cpu, steps=1), probe.groups(oracle, cpu)
    for split, (prompts, answers, groups) in probe.items.items():
        texts = [data.tokenizer.decode(p) for p in prompts]
        assert set(texts) <= sources[split] and len(set(texts)) == len(texts)
        for length in set(groups):
            mine = [t for t, g in zip(texts, groups) if g == length]
            values = [prefix_value(t.split()[2:-1]) for t in mine]
            available = {p for p in sources[split] if p.split()[1] == f"<len_{length}>"}
            assert len(mine) == min(25, len(available))
            label = group_label("length", length)
            assert first[split][label]["accuracy"] == pytest.approx(np.mean([v % 2 == 0 for v in values]))
            assert last[split][label]["accuracy"] == 1.0 and last[split][label]["n"] == len(mine)
    assert probe.items["heldout"][0] == GroupProbe(data, per_group=25, seed=3).items["heldout"][0]


def test_group_labels():
    assert [
        group_label("length", 2),
        group_label("hops", 1),
        group_label("distance", None),
        group_label("attribute", "birth_date"),
    ] == ["l2", "h1", "no_distance", "birth_date"]
