"""Mano generator: answers re-derived by an independent recursive evaluator, distributions,
determinism, train/test disjointness, vocabulary, bad input through the CLI."""

import json
from collections import Counter
from pathlib import Path

import pytest
from scipy.stats import chisquare
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.tokenizer import WordTokenizer

runner = CliRunner()


def gen(out: Path, *args: str) -> list:
    result = runner.invoke(app, ["gen", "mano", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def prefix_value(tokens: list[str], mod: int) -> int:
    """Recursive prefix evaluation, written independently of the vectorised generator."""

    def parse(i: int) -> tuple[int, int]:
        tok = tokens[i]
        if tok not in "+-*/":
            return int(tok), i + 1
        left, i = parse(i + 1)
        right, i = parse(i)
        if tok == "+":
            return (left + right) % mod, i
        if tok == "-":
            return (left - right) % mod, i
        if tok == "*":
            return (left * right) % mod, i
        assert right != 0, "division by zero must have been resampled"
        return left * pow(right, -1, mod) % mod, i

    value, end = parse(0)
    assert end == len(tokens)
    return value


@pytest.mark.parametrize("ops", ["asm", "asmd"])
def test_answers_and_lengths_rederived(tmp_path, ops):
    out = tmp_path / "d"
    gen(out, "--L", "6", "--n-train", "3000", "--n-test", "300", "--ops", ops, "--seed", "3")
    tok = WordTokenizer.from_file(out / "vocab.json")
    for split in ("train", "test"):
        for rec in read(out / f"{split}.jsonl"):
            words = rec["prompt"].split()
            assert words[0] == "<bos>" and words[-1] == "<ans>"
            assert words[1] == f"<len_{rec['length']}>"
            expr = words[2:-1]
            assert sum(w in "+-*/" for w in expr) == rec["length"]
            assert len(expr) == 2 * rec["length"] + 1
            assert int(rec["answer"]) == prefix_value(expr, 23)
            assert tok.decode(tok.encode(rec["prompt"] + " " + rec["answer"])) == \
                rec["prompt"] + " " + rec["answer"]
    if ops == "asmd":
        assert any("/" in r["prompt"] for r in read(out / "train.jsonl"))


def test_length_distribution_and_test_length(tmp_path):
    out = tmp_path / "d"
    gen(out, "--L", "8", "--n-train", "8000", "--n-test", "200")
    counts = Counter(r["length"] for r in read(out / "train.jsonl"))
    assert sorted(counts) == list(range(1, 9))
    assert chisquare([counts[l] for l in range(1, 9)]).pvalue > 1e-4
    assert {r["length"] for r in read(out / "test.jsonl")} == {8}


def test_tree_shape_left_size_uniform(tmp_path):
    # Root split l1 uniform in 0..l-1: the left subtree of the root has l1 operators.
    out = tmp_path / "d"
    gen(out, "--L", "4", "--n-train", "200", "--n-test", "4000")
    left_sizes = Counter()
    for rec in read(out / "test.jsonl"):
        expr = rec["prompt"].split()[2:-1]
        need, i, ops = 1, 1, 0  # walk the left subtree of the root
        while need:
            need += 1 if expr[i] in "+-*/" else -1
            ops += expr[i] in "+-*/"
            i += 1
        left_sizes[ops] += 1
    assert chisquare([left_sizes[k] for k in range(4)]).pvalue > 1e-4


def test_test_prompts_distinct_and_absent_from_train(tmp_path):
    # L = 1 has only 1587 distinct prompts: collisions would be common without the rule.
    out = tmp_path / "d"
    gen(out, "--L", "1", "--n-train", "5000", "--n-test", "700")
    test = [r["prompt"] for r in read(out / "test.jsonl")]
    train = {r["prompt"] for r in read(out / "train.jsonl")}
    assert len(set(test)) == len(test) == 700
    assert not train & set(test)


def test_determinism_and_meta(tmp_path):
    args = ["--L", "5", "--n-train", "500", "--n-test", "50"]
    gen(tmp_path / "a", *args, "--seed", "1")
    gen(tmp_path / "b", *args, "--seed", "1")
    gen(tmp_path / "c", *args, "--seed", "2")
    for name in ("meta.json", "vocab.json", "train.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a/train.jsonl").read_bytes() != (tmp_path / "c/train.jsonl").read_bytes()
    meta = json.loads((tmp_path / "a/meta.json").read_text())
    assert meta["params"] == {"L": 5, "n_train": 500, "n_test": 50, "ops": "asm", "mod": 23}
    assert meta["counts"] == {"train": 500, "test": 50} and meta["seed"] == 1
    vocab = json.loads((tmp_path / "a/vocab.json").read_text())
    assert vocab["tokens"][:4] == ["<pad>", "<bos>", "<eos>", "<ans>"]
    assert vocab["tokens"][4:] == [f"<len_{i}>" for i in range(1, 6)] + ["+", "-", "*"] + \
        [str(v) for v in range(23)]


def test_overwrite(tmp_path):
    out = tmp_path / "d"
    gen(out, "--L", "3", "--n-train", "100", "--n-test", "10")
    result = runner.invoke(app, ["gen", "mano", "--L", "3", "--n-train", "100", "--n-test",
                                 "10", "--out", str(out)])
    assert result.exit_code != 0 and "--overwrite" in result.output
    gen(out, "--L", "4", "--n-train", "100", "--n-test", "10", "--overwrite")
    assert json.loads((out / "meta.json").read_text())["params"]["L"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


@pytest.mark.parametrize("args, flag", [
    (["--L", "0"], "--L"),
    (["--n-train", "0"], "--n-train"),
    (["--n-test", "-1"], "--n-test"),
    (["--ops", "asx"], "--ops"),
    (["--mod", "21"], "--mod"),
    (["--L", "1", "--n-test", "1000"], "--n-test"),
    (["--seed", "-1"], "--seed"),
    (["--L", "abc"], "--L"),  # a wrongly typed option: typer's parse error, also on one line
    (["--nope", "1"], "--nope"),
])
def test_bad_input(tmp_path, args, flag):
    out = tmp_path / "d"
    # the last occurrence of an option wins: args override the small --n-train
    result = runner.invoke(app, ["gen", "mano", "--n-train", "10", *args, "--out", str(out)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_unknown_task_and_unwritable_out(tmp_path):
    result = runner.invoke(app, ["gen", "mnao"])
    assert result.exit_code == 2 and "unknown task 'mnao'" in result.output
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = runner.invoke(app, ["gen", "mano", "--n-train", "10", "--n-test", "5",
                                 "--out", str(blocker / "sub")])
    assert result.exit_code == 2 and "--out" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
