"""Reach generator: answers and distances re-derived with networkx on graph.json + context
edges, diameter bound, balance, distance spread, both sources needed, splits, bad input."""

import json
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.tokenizer import WordTokenizer

runner = CliRunner()
D = 5
ARGS = ["--nodes", "30", "--max-diameter", str(D), "--n-train", "400", "--n-test", "100",
        "--edge-repeats", "3"]


def gen(out: Path, *args: str) -> None:
    result = runner.invoke(app, ["gen", "reach", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reach") / "d"
    gen(out, *ARGS)
    return out


def test_answers_and_distances_by_networkx(data):
    graph = json.loads((data / "graph.json").read_text())
    knowledge = nx.DiGraph(graph["edges"])
    knowledge.add_nodes_from(graph["nodes"])
    queries = [r for r in read(data / "train.jsonl") if r["kind"] == "query"]
    queries += read(data / "test.jsonl")
    for i, q in enumerate(queries):
        union = knowledge.copy()
        union.add_edges_from(q["context_edges"])
        s, t = q["source"], q["target"]
        reachable = nx.has_path(union, s, t)
        assert q["answer"] == ("yes" if reachable else "no")
        if reachable:
            assert q["distance"] == nx.shortest_path_length(union, s, t)
            if q["distance"] >= 2:  # needs the weights and the context together
                context = nx.DiGraph(q["context_edges"])
                context.add_nodes_from(graph["nodes"])
                assert not nx.has_path(knowledge, s, t) and not nx.has_path(context, s, t)
        else:
            assert q["distance"] is None
        if i < 20:  # the union's diameter is bounded by D
            lengths = dict(nx.all_pairs_shortest_path_length(union))
            assert max(d for row in lengths.values() for d in row.values()) <= D


def test_prompt_lists_the_context(data):
    tok = WordTokenizer.from_file(data / "vocab.json")
    for q in read(data / "test.jsonl"):
        words = q["prompt"].split()
        assert words[0] == "<bos>" and words[-6:] == ["can", f"n{q['source']}", "reach",
                                                      f"n{q['target']}", "?", "<ans>"]
        listed = " ".join(words[1:-7]).split(" , ")
        assert listed == [f"n{u} -> n{v}" for u, v in q["context_edges"]]
        assert words[-7] == "."
        tok.encode(q["prompt"] + " " + q["answer"])


def test_balance_and_distance_spread(data):
    for split in ("train", "test"):
        queries = [r for r in read(data / f"{split}.jsonl") if r["kind"] == "query"]
        answers = Counter(q["answer"] for q in queries)
        assert answers["yes"] == answers["no"] == len(queries) // 2
        assert {q["distance"] for q in queries if q["answer"] == "yes"} == set(range(1, D + 1))


def test_edge_statements_and_disjoint_splits(data):
    graph = json.loads((data / "graph.json").read_text())
    train = read(data / "train.jsonl")
    statements = Counter(tuple(r["edge"]) for r in train if r["kind"] == "edge")
    assert statements == {tuple(e): 3 for e in graph["edges"]}
    for r in train:
        if r["kind"] == "edge":
            assert r["text"] == f"n{r['edge'][0]} -> n{r['edge'][1]}"
    train_prompts = {r["prompt"] for r in train if r["kind"] == "query"}
    test_prompts = [r["prompt"] for r in read(data / "test.jsonl")]
    assert len(set(test_prompts)) == len(test_prompts) and not train_prompts & set(test_prompts)
    assert all("kind" in r and r["kind"] == "query" for r in read(data / "test.jsonl"))


def test_determinism(data, tmp_path):
    gen(tmp_path / "b", *ARGS)
    gen(tmp_path / "c", *ARGS, "--seed", "1")
    for name in ("meta.json", "vocab.json", "graph.json", "train.jsonl", "test.jsonl"):
        assert (data / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (data / "test.jsonl").read_bytes() != (tmp_path / "c/test.jsonl").read_bytes()


@pytest.mark.parametrize("args, flag", [
    (["--nodes", "10"], "--nodes"),
    (["--max-diameter", "0"], "--max-diameter"),
    (["--context-edges", "3"], "--context-edges"),
    (["--n-test", "0"], "--n-test"),
    (["--nodes", "8", "--max-diameter", "1", "--n-train", "2000"], "--n-train"),  # too few
])
def test_bad_input(tmp_path, args, flag):
    result = runner.invoke(app, ["gen", "reach", *args, "--out", str(tmp_path / "d")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0]
    assert list(tmp_path.iterdir()) == []
