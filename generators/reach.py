"""Graph reachability over a graph split between the weights and the context (Ouro Theorem 1).

Construction (why the diameter is controlled): the `nodes` nodes are shuffled and cut into
D + 1 layers (D = --max-diameter), and every edge, in the knowledge graph and in the context,
goes from a layer to the next one. A path from layer i to layer j therefore has exactly j - i
edges, so every shortest path in the union graph is at most D long and a reachable target at
layer i + d is at distance exactly d.

- Knowledge graph (graph.json, learned into the weights from edge-statement records): every
  node outside the last layer has one out-edge to a random node of the next layer.
- A query (s, t) picks d uniform in 1..D and a source layer, then plants two walks of d hops,
  one from s and one from a decoy source s' in the same layer. Each hop is either a knowledge
  edge or a fresh context edge; a walk has at least one context hop, and for d >= 2 at least one
  knowledge hop. "yes" queries ask for the end of the walk from s, "no" queries for the end of
  the decoy walk, so both classes look alike locally (t always has a planted walk into it).
  Random distractor edges between adjacent layers fill the context up to --context-edges.
  The query is kept only if its label is right in the union graph and, for "yes" with d >= 2,
  t is reachable neither by knowledge edges alone nor by context edges alone: answering needs
  both the weights and the context. Classes are exactly balanced; d is uniform for both.

Records: train has edge statements ({"kind": "edge", "edge": [u, v], "text": "n3 -> n17"},
each knowledge edge --edge-repeats times) and queries; test has queries only, with prompts that
never occur in train. A query: {"kind": "query", "prompt": "<bos> n3 -> n9 , ... . can n3
reach n40 ? <ans>", "answer": "yes"|"no", "source", "target", "distance" (d, or null for "no"),
"context_edges": [[u, v], ...]}. Node ids are ints; node i's token is "n{i}".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from synthlab_generators.common import (SPECIAL_TOKENS, Dataset, SynthlabError, TaskParams,
                                         TaskShape, TaskSpec, chunked, json_line, param)

MAX_TRIES = 1_000  # rejection-sampling tries per query before giving up
WORDS = ("->", ",", ".", "can", "reach", "?", "yes", "no")  # besides the node tokens


@dataclass(frozen=True)
class ReachParams(TaskParams):
    """Parameters of `synthlab gen reach`."""

    nodes: int = param(64, "Number of graph nodes (at least 4 per layer: 4 x (max-diameter+1)).")
    max_diameter: int = param(8, "Largest shortest-path length D in the union graph; query "
                                 "distances are uniform on 1..D.")
    n_train: int = param(20_000, "Number of training queries (plus the edge statements).")
    n_test: int = param(2_000, "Number of test queries.")
    context_edges: int = param(0, "Edges given in each prompt (0: 2 x max-diameter); at least "
                                  "2 x max(1, max-diameter - 1).")
    edge_repeats: int = param(20, "How many times each knowledge edge is stated in train.")

    def __post_init__(self) -> None:
        self.require_int("max_diameter", 1, 1000)
        self.require_int("nodes", 4 * (self.max_diameter + 1), 1_000_000)
        self.require_int("n_train", 2)
        self.require_int("n_test", 2)
        self.require_int("context_edges", 0)
        if self.context_edges:
            self.require_int("context_edges", 2 * max(1, self.max_diameter - 1), 100_000)
        self.require_int("edge_repeats", 1, 10_000)
        sizes = [len(a) for a in np.array_split(np.arange(self.nodes), self.max_diameter + 1)]
        free = sum(a * b - a for a, b in zip(sizes, sizes[1:]))  # non-knowledge layer edges
        self.require(self.n_context <= free // 2, "context_edges",
                     f"must be at most half of the {free} possible context edges")

    @property
    def n_context(self) -> int:
        return self.context_edges or 2 * self.max_diameter


class _Graph:
    """The layered knowledge graph: members[layer], layer[node], successor[node] (-1: none)."""

    def __init__(self, params: ReachParams, rng: np.random.Generator) -> None:
        self.members = [a.tolist() for a in
                        np.array_split(rng.permutation(params.nodes), params.max_diameter + 1)]
        self.layer = [0] * params.nodes
        for i, nodes in enumerate(self.members):
            for u in nodes:
                self.layer[u] = i
        self.successor = [-1] * params.nodes
        for i, nodes in enumerate(self.members[:-1]):
            for u, v in zip(nodes, rng.choice(self.members[i + 1], size=len(nodes)).tolist()):
                self.successor[u] = v
        # in layer order, then by position in the layer
        self.edges = [(u, self.successor[u]) for nodes in self.members[:-1] for u in nodes]
        self.knowledge_adjacency = _adjacency(self.edges)


class _Draws:
    """Uniform draws served from blocks of rng.random: a numpy call per scalar costs
    microseconds, and a query needs dozens of scalars."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 16) -> None:
        self.rng, self.block = rng, block
        self.buffer: list[float] = []

    def below(self, n: int) -> int:
        """A uniform integer in 0..n-1."""
        if not self.buffer:
            self.buffer = self.rng.random(self.block).tolist()[::-1]
        return int(self.buffer.pop() * n)


def _hop_kinds(d: int, draws: _Draws) -> list[bool]:
    """True = context hop; at least one context hop and, for d >= 2, one knowledge hop."""
    while True:
        kinds = [draws.below(2) == 1 for _ in range(d)]
        if any(kinds) and (d == 1 or not all(kinds)):
            return kinds


def _walk(graph: _Graph, start: int, d: int, draws: _Draws,
          context: set[tuple[int, int]]) -> int:
    node = start
    for is_context in _hop_kinds(d, draws):
        if is_context:
            nxt = graph.members[graph.layer[node] + 1]
            target = nxt[draws.below(len(nxt))]
            context.add((node, target))
            node = target
        else:
            node = graph.successor[node]
    return node


def _reaches(source: int, target: int, steps: int, successor: list[int] | None,
             context: dict[int, list[int]] | None) -> bool:
    """Whether `steps` edges lead from source to target (a layered graph: a path to the target's
    layer has exactly that many edges) over knowledge edges and/or context edges."""
    frontier = {source}
    for _ in range(steps):
        nxt = set()
        for u in frontier:
            if successor is not None and successor[u] >= 0:
                nxt.add(successor[u])
            if context is not None:
                nxt.update(context.get(u, ()))
        frontier = nxt
    return target in frontier


def _adjacency(edges) -> dict[int, list[int]]:
    adj: dict[int, list[int]] = {}
    for u, v in edges:
        adj.setdefault(u, []).append(v)
    return adj


def _query(graph: _Graph, params: ReachParams, yes: bool, draws: _Draws) -> dict:
    D = params.max_diameter
    for _ in range(MAX_TRIES):
        d = 1 + draws.below(D)
        first = graph.members[draws.below(D - d + 1)]
        i, j = draws.below(len(first)), draws.below(len(first) - 1)
        source, decoy = first[i], first[j + (j >= i)]
        context: set[tuple[int, int]] = set()
        end = _walk(graph, source, d, draws, context)
        decoy_end = _walk(graph, decoy, d, draws, context)
        target = end if yes else decoy_end
        while len(context) < params.n_context:  # distractors between adjacent layers
            u = draws.below(params.nodes)
            if graph.layer[u] < D:
                nxt = graph.members[graph.layer[u] + 1]
                v = nxt[draws.below(len(nxt))]
                if graph.successor[u] != v:
                    context.add((u, v))
        adjacency = _adjacency(context)
        if _reaches(source, target, d, graph.successor, adjacency) != yes:
            continue
        if yes and d >= 2 and (_reaches(source, target, d, graph.successor, None)
                               or _reaches(source, target, d, None, adjacency)):
            continue
        edges = sorted(context)
        edges = [list(edges[k]) for k in draws.rng.permutation(len(edges))]
        listed = " , ".join(f"n{u} -> n{v}" for u, v in edges)
        return {"kind": "query",
                "prompt": f"<bos> {listed} . can n{source} reach n{target} ? <ans>",
                "answer": "yes" if yes else "no", "source": source, "target": target,
                "distance": d if yes else None, "context_edges": edges}
    raise SynthlabError(f"--nodes {params.nodes}: could not build a query in {MAX_TRIES} tries; "
                        f"use more nodes or fewer --context-edges")


def _queries(graph: _Graph, params: ReachParams, count: int, avoid: set[str],
             rng: np.random.Generator, desc: str) -> list[dict]:
    """`count` queries, half yes and half no (alternating), prompts distinct and not in avoid."""
    out: list[dict] = []
    seen = set(avoid)
    draws = _Draws(rng)
    repeats = 0  # duplicates drawn in a row: a small graph has few distinct queries
    with tqdm(total=count, desc=desc, unit="query", disable=None, mininterval=1) as bar:
        while len(out) < count:
            query = _query(graph, params, yes=len(out) % 2 == 0, draws=draws)
            if query["prompt"] in seen:
                repeats += 1
                if repeats == MAX_TRIES:
                    raise SynthlabError(
                        f"--n-train/--n-test: only about {len(seen)} distinct queries exist "
                        f"with --nodes {params.nodes} and --max-diameter {params.max_diameter}")
                continue
            repeats = 0
            seen.add(query["prompt"])
            out.append(query)
            bar.update()
    return [out[i] for i in rng.permutation(count)]


def generate(params: ReachParams, rng: np.random.Generator) -> Dataset:
    graph = _Graph(params, rng)
    edges = [list(edge) for edge in graph.edges]
    test = _queries(graph, params, params.n_test, set(), rng, "reach test")
    train_queries = _queries(graph, params, params.n_train, {q["prompt"] for q in test}, rng,
                             "reach train")
    statements = [{"kind": "edge", "edge": [u, v], "text": f"n{u} -> n{v}"}
                  for u, v in edges] * params.edge_repeats
    train = statements + train_queries
    order = rng.permutation(len(train))
    graph_json = {"nodes": list(range(params.nodes)), "edges": edges,
                  "layers": graph.members, "max_diameter": params.max_diameter}
    return Dataset(
        tokens=list(WORDS) + [f"n{i}" for i in range(params.nodes)],
        files={"graph.json": graph_json,
               "train.jsonl": chunked(json_line(train[i]) for i in order),
               "test.jsonl": chunked(json_line(q) for q in test)},
        counts={"train": len(train), "train_queries": len(train_queries),
                "train_edge_statements": len(statements), "test": len(test)},
        extra={"knowledge_edges": len(edges), "context_edges_per_query": params.n_context},
    )


def shape(params: ReachParams) -> TaskShape:
    """A query lists exactly n_context edges "u -> v" joined by "," (4C - 1 tokens); with
    <bos>, ". can s reach t ? <ans>" and the answer it is 4C + 8 tokens. An edge statement is
    "u -> v" plus <bos> and <eos>: 5 tokens. Every node outside the last layer has one edge."""
    C = params.n_context
    last_layer = params.nodes // (params.max_diameter + 1)  # np.array_split: the last is smallest
    statements = (params.nodes - last_layer) * params.edge_repeats
    mean = (statements * 5 + params.n_train * (4 * C + 8)) / (statements + params.n_train)
    return TaskShape(vocab_size=len(SPECIAL_TOKENS) + len(WORDS) + params.nodes,
                     row_len=4 * C + 7, tokens_per_record=mean,
                     train_records=statements + params.n_train)


SPEC = TaskSpec(
    name="reach", params_cls=ReachParams, generate=generate,
    help="Graph reachability over knowledge-graph edges (learned) plus context edges.",
    shape=shape, extra_files=("graph.json",), group_key="distance", headline="accuracy",
    pack=False, data_columns={"max_diameter": "diameter"},
)
