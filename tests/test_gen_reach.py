"""Reach generator: answers, distances and decoy distances re-derived with networkx on graph.json +
context edges, diameter bound, every d >= 2 "yes" needing both edge kinds, balance, the curriculum's
exact counts, the edge queries, the context lookups, splits, determinism, bad input."""

import json
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.data.tokenizer import WordTokenizer
from synthlab_generators.reach import ReachParams, distance_counts, planned_distances

runner = CliRunner()
D = 5
ARGS = [
    "--nodes",
    "30",
    "--max-diameter",
    str(D),
    "--n-train",
    "401",
    "--n-test",
    "100",
    "--edge-repeats",
    "3",
    "--edge-queries",
    "2",
    "--distance-decay",
    "0.5",
    "--lookup-queries",
    "150",
]


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


def queries(data: Path) -> list[dict]:
    return [r for r in read(data / "train.jsonl") if r["kind"] == "query"] + read(data / "test.jsonl")


def test_answers_distances_and_decoys_by_networkx(data):
    graph = json.loads((data / "graph.json").read_text())
    layer = {u: i for i, nodes in enumerate(graph["layers"]) for u in nodes}
    knowledge = nx.DiGraph(graph["edges"])
    knowledge.add_nodes_from(graph["nodes"])
    for i, q in enumerate(queries(data)):
        union = knowledge.copy()
        union.add_edges_from(q["context_edges"])
        s, t, d = q["source"], q["target"], q["distance"]
        assert q["answer"] == ("yes" if nx.has_path(union, s, t) else "no")
        assert q["group"] == f"d{d}_{q['answer']}" and layer[t] - layer[s] == d
        if q["answer"] == "yes":
            assert nx.shortest_path_length(union, s, t) == d
        else:  # the decoy: a source of s's layer from which t is exactly d hops away
            decoy = q["decoy_source"]
            assert decoy != s and layer[decoy] == layer[s]
            assert nx.shortest_path_length(union, decoy, t) == d
        if i < 20:  # the union's diameter is bounded by D
            lengths = dict(nx.all_pairs_shortest_path_length(union))
            assert max(d for row in lengths.values() for d in row.values()) <= D


def test_no_yes_beyond_one_hop_is_answerable_from_one_kind_of_edge(data):
    """At d >= 2 neither the context alone nor the knowledge graph alone connects s to t; at d = 1
    `path` says which one edge does."""
    graph = json.loads((data / "graph.json").read_text())
    knowledge = nx.DiGraph(graph["edges"])
    knowledge.add_nodes_from(graph["nodes"])
    kinds = Counter()
    for q in queries(data):
        if q["answer"] != "yes":
            continue
        s, t = q["source"], q["target"]
        context = nx.DiGraph(q["context_edges"])
        context.add_nodes_from(graph["nodes"])
        in_context, in_weights = nx.has_path(context, s, t), nx.has_path(knowledge, s, t)
        if q["distance"] >= 2:
            assert q["path"] == "mixed" and not in_context and not in_weights
        else:
            assert q["path"] == ("context" if in_context else "knowledge") and in_context != in_weights
            kinds[q["path"]] += 1
    assert kinds["context"] > 0 and kinds["knowledge"] > 0


def test_prompt_lists_the_context(data):
    tok = WordTokenizer.from_file(data / "vocab.json")
    for q in read(data / "test.jsonl"):
        words = q["prompt"].split()
        assert words[:6] == ["<bos>", "can", f"n{q['source']}", "reach", f"n{q['target']}", "?"]
        listed = " ".join(words[6:-2]).split(" , ")
        assert listed == [f"n{u} -> n{v}" for u, v in q["context_edges"]]
        assert words[-2:] == [".", "<ans>"]
        tok.encode(q["prompt"] + " " + q["answer"])


@pytest.mark.parametrize("split, count, decay", [("test", 100, 1.0), ("train", 401, 0.5)])
def test_the_curriculum_draws_what_it_says(data, split, count, decay):
    """Each class holds half the queries (the extra one is a "yes"), spread over d = 1..D in
    proportion to decay ** (d - 1), within one query of the exact share, summing exactly."""
    found = Counter((q["answer"], q["distance"]) for q in read(data / f"{split}.jsonl") if q["kind"] == "query")
    weights = [decay ** (d - 1) for d in range(1, D + 1)]
    for answer, n in (("yes", (count + 1) // 2), ("no", count // 2)):
        got = [found[(answer, d)] for d in range(1, D + 1)]
        assert sum(got) == n
        assert all(abs(g - n * w / sum(weights)) < 1 for g, w in zip(got, weights))
    params = ReachParams(nodes=30, max_diameter=D, n_train=401, n_test=100, distance_decay=decay)
    assert Counter({(a == "yes", d): n for (a, d), n in found.items()}) == Counter(planned_distances(params, split))


def test_distance_counts():
    assert distance_counts(10, [4, 2, 1]) == [6, 3, 1]
    assert distance_counts(7, [1, 1, 1]) == [3, 2, 2]  # ties go to the shorter distance
    assert distance_counts(0, [1, 2]) == [0, 0]


def test_edge_statements_edge_queries_and_disjoint_splits(data):
    graph = json.loads((data / "graph.json").read_text())
    layer = {u: i for i, nodes in enumerate(graph["layers"]) for u in nodes}
    successor = dict(map(tuple, graph["edges"]))
    train = read(data / "train.jsonl")
    statements = Counter(tuple(r["edge"]) for r in train if r["kind"] == "edge")
    assert statements == {tuple(e): 3 for e in graph["edges"]}
    for r in train:
        if r["kind"] == "edge":
            assert r["text"] == f"n{r['edge'][0]} -> n{r['edge'][1]}"
    asked = Counter()
    for r in (r for r in train if r["kind"] == "edge_query"):
        words = r["prompt"].split()
        assert words[:2] == ["<bos>", "can"] and words[3] == "reach" and words[5:] == ["?", ".", "<ans>"]
        u, w = int(words[2][1:]), int(words[4][1:])
        assert (successor[u] == w) == (r["answer"] == "yes") and layer[w] == layer[u] + 1
        assert r["group"] == f"edge_{r['answer']}" and r["edge"] == [u, successor[u]]
        asked[(u, r["answer"])] += 1
    assert asked == {(u, a): 2 for u in successor for a in ("yes", "no")}
    train_prompts = {r["prompt"] for r in train if r["kind"] == "query"}
    test_prompts = [r["prompt"] for r in read(data / "test.jsonl")]
    assert len(set(test_prompts)) == len(test_prompts) and not train_prompts & set(test_prompts)
    assert all(r["kind"] == "query" for r in read(data / "test.jsonl"))


def test_context_lookups_ask_a_source_with_one_listed_out_edge(data):
    train = read(data / "train.jsonl")
    contexts = [r["context_edges"] for r in train if r["kind"] == "query"]
    lookups = [r for r in train if r["kind"] == "lookup"]
    assert len(lookups) == 150 and all(r["group"] == "lookup" for r in lookups)
    assert json.loads((data / "meta.json").read_text())["counts"]["train_lookups"] == 150
    for r in lookups:
        edges, s = r["context_edges"], r["source"]
        assert edges in contexts  # the context of a training query
        listed = " , ".join(f"n{u} -> n{v}" for u, v in edges)
        assert r["prompt"] == f"<bos> can n{s} reach what ? {listed} . <ans>"
        assert [f"n{v}" for u, v in edges if u == s] == [r["answer"]]  # re-derived, unique


def test_determinism(data, tmp_path):
    gen(tmp_path / "b", *ARGS)
    gen(tmp_path / "c", *ARGS, "--seed", "1")
    for name in ("meta.json", "vocab.json", "graph.json", "train.jsonl", "test.jsonl"):
        assert (data / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (data / "test.jsonl").read_bytes() != (tmp_path / "c/test.jsonl").read_bytes()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--nodes", "10"], "--nodes"),
        (["--max-diameter", "0"], "--max-diameter"),
        (["--context-edges", "3"], "--context-edges"),
        (["--n-test", "0"], "--n-test"),
        (["--distance-decay", "0"], "--distance-decay"),
        (["--edge-queries", "-1"], "--edge-queries"),
        (["--n-train", "10", "--lookup-queries", "11"], "--lookup-queries"),
        (["--nodes", "8", "--max-diameter", "1", "--n-train", "2000"], "--n-train"),  # too few
    ],
)
def test_bad_input(tmp_path, args, flag):
    result = runner.invoke(app, ["gen", "reach", *args, "--out", str(tmp_path / "d")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0]
    assert list(tmp_path.iterdir()) == []
