"""Mano generator: answers re-derived by an independent recursive evaluator, distributions,
determinism, train/test disjointness, vocabulary, bad input through the CLI."""

import json
from collections import Counter
from pathlib import Path

import pytest
from scipy.stats import chisquare
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.data.tokenizer import WordTokenizer

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
            assert tok.decode(tok.encode(rec["prompt"] + " " + rec["answer"])) == rec["prompt"] + " " + rec["answer"]
    if ops == "asmd":
        assert any("/" in r["prompt"] for r in read(out / "train.jsonl"))


def test_length_distribution_and_test_length(tmp_path):
    out = tmp_path / "d"
    gen(out, "--L", "8", "--n-train", "8000", "--n-test", "200")
    counts = Counter(r["length"] for r in read(out / "train.jsonl"))
    assert sorted(counts) == list(range(1, 9))
    assert chisquare([counts[length] for length in range(1, 9)]).pvalue > 1e-4
    test = read(out / "test.jsonl")
    assert {r["length"] for r in test if r.get("headline", True)} == {8}
    assert [r["length"] for r in test[:200]] == [8] * 200  # the headline records come first


def test_tree_shape_left_size_uniform(tmp_path):
    # Root split l1 uniform in 0..l-1: the left subtree of the root has l1 operators.
    out = tmp_path / "d"
    gen(out, "--L", "4", "--n-train", "200", "--n-test", "4000")
    left_sizes = Counter()
    for rec in read(out / "test.jsonl")[:4000]:  # the headline records, l = L = 4
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
    assert meta["params"] == {"L": 5, "n_train": 500, "n_test": 50, "n_test_per_length": 200, "ops": "asm", "mod": 23}
    assert meta["counts"] == {"train": 500, "test": 50 + 4 * 200} and meta["seed"] == 1
    assert meta["info"]["test_per_length"] == {"1": 200, "2": 200, "3": 200, "4": 200, "5": 50}
    vocab = json.loads((tmp_path / "a/vocab.json").read_text())
    assert vocab["tokens"][:4] == ["<pad>", "<bos>", "<eos>", "<ans>"]
    assert vocab["tokens"][4:] == [f"<len_{i}>" for i in range(1, 6)] + ["+", "-", "*"] + [str(v) for v in range(23)]


def test_overwrite(tmp_path):
    out = tmp_path / "d"
    gen(out, "--L", "3", "--n-train", "100", "--n-test", "10")
    result = runner.invoke(app, ["gen", "mano", "--L", "3", "--n-train", "100", "--n-test", "10", "--out", str(out)])
    assert result.exit_code != 0 and "--overwrite" in result.output
    gen(out, "--L", "4", "--n-train", "100", "--n-test", "10", "--overwrite")
    assert json.loads((out / "meta.json").read_text())["params"]["L"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--L", "0"], "--L"),
        (["--n-train", "0"], "--n-train"),
        (["--n-test", "-1"], "--n-test"),
        (["--n-test-per-length", "-1"], "--n-test-per-length"),
        (["--ops", "asx"], "--ops"),
        (["--mod", "21"], "--mod"),
        (["--L", "1", "--n-test", "1000"], "--n-test"),
        (["--seed", "-1"], "--seed"),
        (["--L", "abc"], "--L"),  # a wrongly typed option: typer's parse error, also on one line
        (["--nope", "1"], "--nope"),
    ],
)
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
    result = runner.invoke(app, ["gen", "mano", "--n-train", "10", "--n-test", "5", "--out", str(blocker / "sub")])
    assert result.exit_code == 2 and "--out" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def all_expressions(length: int, ops: str, mod: int) -> list[list[str]]:
    """Every prefix expression with `length` operators, by plain recursion (tiny cases only)."""
    if length == 0:
        return [[str(v)] for v in range(mod)]
    return [
        [op, *left, *right]
        for left_size in range(length)
        for left in all_expressions(left_size, ops, mod)
        for right in all_expressions(length - 1 - left_size, ops, mod)
        for op in ops
    ]


def divides_by_zero(tokens: list[str], mod: int) -> bool:
    try:
        prefix_value(tokens, mod)
    except AssertionError:
        return True
    return False


@pytest.mark.parametrize("ops, symbols", [("asm", "+-*"), ("asmd", "+-*/")])
def test_valid_prompt_counts_match_enumeration(ops, symbols):
    from synthlab_generators.mano import valid_prompts

    counts = [sum(not divides_by_zero(e, 5) for e in all_expressions(length, symbols, 5)) for length in range(4)]
    assert valid_prompts(3, len(symbols), 5) == counts


@pytest.mark.parametrize("ops, symbols", [("asm", "+-*"), ("asmd", "+-*/")])
def test_held_out_prompts_of_every_length(tmp_path, ops, symbols):
    """Shorter lengths: distinct prompts not in train, answers right, as many as exist (or asked),
    and the count of unseen prompts in meta.json matches an enumeration; l = L is unchanged."""
    out = tmp_path / "d"
    gen(
        out,
        "--L",
        "3",
        "--mod",
        "3",
        "--ops",
        ops,
        "--n-train",
        "300",
        "--n-test",
        "40",
        "--n-test-per-length",
        "60",
        "--seed",
        "4",
    )
    train, test = read(out / "train.jsonl"), read(out / "test.jsonl")
    headline = [r for r in test if r.get("headline", True)]
    assert len(headline) == 40 and {r["length"] for r in headline} == {3}
    meta = json.loads((out / "meta.json").read_text())
    train_prompts = {r["prompt"] for r in train}
    for length in (1, 2):
        held = [r for r in test if r["length"] == length]
        assert all(r["headline"] is False for r in held)
        prompts = [r["prompt"] for r in held]
        assert len(set(prompts)) == len(prompts) and not set(prompts) & train_prompts
        for rec in held:
            assert int(rec["answer"]) == prefix_value(rec["prompt"].split()[2:-1], 3)
        valid = {
            f"<bos> <len_{length}> {' '.join(e)} <ans>"
            for e in all_expressions(length, symbols, 3)
            if not divides_by_zero(e, 3)
        }
        unseen = valid - train_prompts
        assert int(meta["info"]["unseen_prompts_per_length"][str(length)]) == len(unseen)
        assert len(held) == min(60, len(unseen)) == meta["info"]["test_per_length"][str(length)]
    assert meta["counts"]["test"] == len(test)


def test_train_split_is_the_same_with_or_without_held_out_lengths(tmp_path):
    """Held-out prompts of shorter lengths are drawn after train, which they leave as it was."""
    base = ["--L", "3", "--mod", "5", "--n-train", "2000", "--n-test", "30", "--seed", "2"]
    gen(tmp_path / "a", *base, "--n-test-per-length", "0")
    gen(tmp_path / "b", *base, "--n-test-per-length", "25")
    assert (tmp_path / "a/train.jsonl").read_bytes() == (tmp_path / "b/train.jsonl").read_bytes()
    a, b = read(tmp_path / "a/test.jsonl"), read(tmp_path / "b/test.jsonl")
    assert b[: len(a)] == a and len(a) == 30 and {r["length"] for r in b[30:]} == {2}  # l = 1: all in train
    gen(tmp_path / "c", *base, "--n-test-per-length", "25")
    assert (tmp_path / "b/test.jsonl").read_bytes() == (tmp_path / "c/test.jsonl").read_bytes()


def test_a_length_wholly_in_train_has_no_held_out_records(tmp_path):
    # l = 1 with mod 3: 27 prompts, all drawn among ~1000 length-1 training records
    out = tmp_path / "d"
    gen(out, "--L", "2", "--mod", "3", "--n-train", "2000", "--n-test", "20")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["info"]["unseen_prompts_per_length"] == {"1": "0"}
    assert meta["info"]["test_per_length"] == {"1": 0, "2": 20}
    assert {r["length"] for r in read(out / "test.jsonl")} == {2}
