"""Multi-hop generator: answers by path following over facts.jsonl, question text, counts (the
question count for each head-layer choice, by enumeration), per-hop probes, disjoint splits,
atomic facts in train, determinism, bad input."""

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.data.tokenizer import WordTokenizer

runner = CliRunner()
ARGS = [
    "--layers",
    "4",
    "--per-layer",
    "6",
    "--relations",
    "3",
    "--hops",
    "2",
    "--train-fraction",
    "0.5",
    "--n-test",
    "20",
]


def gen(out: Path, *args: str) -> None:
    result = runner.invoke(app, ["gen", "multihop", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("hops", [2, 3])
def test_answers_by_path_following(tmp_path, hops):
    out = tmp_path / "d"
    gen(out, *ARGS, "--hops", str(hops))
    facts = read(out / "facts.jsonl")
    tail = {(f["head"], f["relation"]): f["tail"] for f in facts}
    assert len(tail) == len(facts) == 3 * 6 * 3  # every non-last-layer entity x relation
    for f in facts:
        assert f["text"].split() == ["the", f["relation"], "of", f["head"], "is", f["tail"]]
    train, test = read(out / "train.jsonl"), read(out / "test.jsonl")
    tok = WordTokenizer.from_file(out / "vocab.json")
    for rec in train + test:
        node = rec["head"]
        for relation in rec["relations"]:
            node = tail[(node, relation)]
        assert rec["answer"] == node
        assert len(rec["relations"]) == rec["hops"]
        words = rec["question"].split()
        # "<bos> who is the rK of the ... of the r1 of HEAD ? <ans>"
        assert words[:3] == ["<bos>", "who", "is"] and words[-2:] == ["?", "<ans>"]
        assert words[-3] == rec["head"]
        assert words[3:-3] == [w for r in reversed(rec["relations"]) for w in ("the", r, "of")]
        tok.encode(rec["question"] + " " + rec["answer"])
    assert {r["hops"] for r in test if r.get("headline", True)} == {hops}


def test_counts_disjoint_and_atomic_facts_in_train(tmp_path):
    out = tmp_path / "d"
    gen(out, *ARGS)
    facts, train, test = (read(out / f"{s}.jsonl") for s in ("facts", "train", "test"))
    possible = (4 - 2) * 6 * 3**2
    khop = [r for r in train if r["hops"] == 2]
    assert len(khop) == round(0.5 * possible) and len(test) == 20
    assert not {r["question"] for r in khop} & {r["question"] for r in test}
    assert len({r["question"] for r in khop}) == len(khop)
    atomic = {(r["head"], r["relations"][0], r["answer"]) for r in train if r["hops"] == 1}
    assert atomic == {(f["head"], f["relation"], f["tail"]) for f in facts}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["info"]["possible_questions"] == possible
    assert meta["info"]["train_questions"] == len(khop)
    # heads are spread over the layers that have k hops ahead (here 2 layers of 6)
    assert len(Counter(r["head"] for r in khop)) == 12


@pytest.mark.parametrize("heads, expected", [("all", [0, 1, 2]), ("first", [0]), ("0,2", [0, 2]), ("1", [1])])
def test_question_count_for_each_head_layer_choice(tmp_path, heads, expected):
    """n_questions = |head layers| x per_layer x R^k, counted by enumerating every path from the
    heads in facts.jsonl; train holds round(fraction x n_questions) of them; heads lie in the
    chosen layers only."""
    from synthlab_generators.multihop import MultihopParams

    args = [
        "--layers",
        "5",
        "--per-layer",
        "4",
        "--relations",
        "2",
        "--hops",
        "2",
        "--n-test",
        "5",
        "--train-fraction",
        "0.4",
        "--head-layers",
        heads,
    ]
    out = tmp_path / "d"
    gen(out, *args)
    facts = read(out / "facts.jsonl")
    tail = {f["head"]: f["tail"] for f in facts}  # one tail per head suffices to walk to the end

    def ahead(e: str) -> int:  # hops from e to the last layer
        return 0 if e not in tail else 1 + ahead(tail[e])

    layer = {e: 4 - ahead(e) for f in facts for e in (f["head"], f["tail"])}
    enumerated = sum(1 for f in facts if layer[f["head"]] in expected for g in facts if g["head"] == f["tail"])
    params = MultihopParams(layers=5, per_layer=4, relations=2, hops=2, n_test=5, train_fraction=0.4, head_layers=heads)
    assert params.heads == tuple(expected)
    assert params.n_questions == enumerated == len(expected) * 4 * 2**2
    khop = [r for r in read(out / "train.jsonl") if r["hops"] == 2]
    assert len(khop) == params.n_train == round(0.4 * enumerated)
    assert {layer[r["head"]] for r in khop + read(out / "test.jsonl")} <= set(expected)


def test_probe_questions_of_every_hop_count(tmp_path):
    """3-hop data: held-out 2-hop probes (not in the headline) beside the 3-hop test questions."""
    out = tmp_path / "d"
    gen(out, *ARGS[:-6], "--hops", "3", "--train-fraction", "0.2", "--n-test", "20")
    test = read(out / "test.jsonl")
    assert Counter((r["hops"], r.get("headline", True)) for r in test) == {(3, True): 20, (2, False): 20}
    train = {r["question"] for r in read(out / "train.jsonl")}
    assert not train & {r["question"] for r in test}


def test_largest_fraction_takes_every_non_test_question(tmp_path):
    out = tmp_path / "d"
    gen(out, *ARGS[:-4], "--train-fraction", str(1 - 5 / 108), "--n-test", "5")
    khop = [r for r in read(out / "train.jsonl") if r["hops"] == 2]
    assert len(khop) == 2 * 6 * 9 - 5


def test_determinism(tmp_path):
    gen(tmp_path / "a", *ARGS, "--seed", "1")
    gen(tmp_path / "b", *ARGS, "--seed", "1")
    gen(tmp_path / "c", *ARGS, "--seed", "2")
    for name in ("meta.json", "vocab.json", "facts.jsonl", "train.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a/facts.jsonl").read_bytes() != (tmp_path / "c/facts.jsonl").read_bytes()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--train-fraction", "0"], "--train-fraction"),
        (["--train-fraction", "1.5"], "--train-fraction"),
        (["--train-fraction", "0.999"], "--train-fraction"),  # 0.999 x 1,600,000 + 3,000 do not fit
        (["--head-layers", "2"], "--head-layers"),  # 3 hops over 5 layers: heads in 0..1
        (["--head-layers", "0,0"], "--head-layers"),
        (["--head-layers", "last"], "--head-layers"),
        (["--hops", "1"], "--hops"),
        (["--hops", "5", "--layers", "5"], "--hops"),
        (["--per-layer", "0"], "--per-layer"),
        (["--n-test", "1000000000"], "--n-test"),
    ],
)
def test_bad_input(tmp_path, args, flag):
    result = runner.invoke(app, ["gen", "multihop", *args, "--out", str(tmp_path / "d")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0]
    assert list(tmp_path.iterdir()) == []
