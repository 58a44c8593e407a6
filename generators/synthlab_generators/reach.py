"""Graph reachability over a graph split between the weights and the context (C4, Ouro Theorem 1).

The task (Ouro, docs/claims.md C4): a directed graph split in two, a fixed "knowledge" graph learned from
training data (in the weights) and per-example context edges in the prompt. A query (s, t) asks
whether t is reachable from s in the union; classes are balanced; the diameter D of the union
graph is controlled. Ouro's Theorem 1: one looped layer needs O(log D) loops (repeated squaring of
the adjacency matrix).

Construction (why the diameter is controlled): the `nodes` nodes are shuffled and cut into
D + 1 layers (D = --max-diameter), and every edge, in the knowledge graph and in the context,
goes from a layer to the next one. A path from layer i to layer j therefore has exactly j - i
edges, so every shortest path in the union graph is at most D long and a reachable target at
layer i + d is at distance exactly d.

- Knowledge graph (graph.json): every node outside the last layer has one out-edge to a random
  node of the next layer. It is taught in two forms: the statement "n3 -> n17" (language
  modelled, the form context edges are listed in; each edge --edge-repeats times) and, with
  --edge-queries R > 0, the question form queries use, with no context: "<bos> can n3 reach n17
  ? . <ans> yes" and "... can n3 reach n21 ? . <ans> no" for a non-successor n21 of the next
  layer (each R times; group `edge_yes` / `edge_no`, training only).
- Context lookups (--lookup-queries K, training only, group `lookup`): "<bos> can s reach what
  ? <context> . <ans>" answered by the node v of the one listed edge s -> v (s has no other listed
  out-edge), on the contexts of the first K training queries. The lookup a query needs at every
  context hop ("is s -> t listed?") is otherwise taught by one yes/no bit per query, and a
  looped layer on cpu did not learn it from that (results/reach/probe.md); a node answer
  trains the same attention (find the edge that starts at s) with a token target.
- The prompt states the query first, then the context: "<bos> can s reach t ? u -> v , ... .
  <ans>". With causal attention every context edge is then read with the query already known.
- A query (s, t) at distance d plants two walks of d hops, one from s and one from a decoy
  source s' in the same layer. "yes" asks for the end of the walk from s, "no" for the end of the
  decoy walk, so t always has a planted walk into it and both classes look alike locally. Random
  distractor edges between adjacent layers fill the context up to --context-edges. No context
  edge repeats a knowledge edge.
- Which edges a walk uses: at d = 1 the one hop is a knowledge edge or a context edge (a fair
  draw; `path` says which), so a d = 1 "yes" is answered by the weights alone or by the context
  alone. At d >= 2 every walk uses both kinds, and a "yes" is kept only if t is reachable
  neither by knowledge edges alone nor by context edges alone (`path` = "mixed"): answering
  needs the weights and the context together.
- `distance`: d for both classes. For "no" it is the decoy distance: t lies d layers after s, so
  ruling it out takes following every path from s for d hops, and the decoy source
  (`decoy_source`, same layer as s) reaches t at exactly distance d: the nearest miss is a walk
  of d hops that ends at t from the wrong source. `group` = "d<d>_yes" / "d<d>_no": evaluation
  reports accuracy per distance and per decoy distance.
- Distances: test queries are spread evenly over d = 1..D and classes (exact counts). Training
  queries follow the curriculum --distance-decay q: the count at distance d is proportional to
  q^(d - 1) (q = 1: uniform; q = 0.5 halves each step: a mixture weighted toward short
  distances), apportioned exactly (largest remainder), half "yes" and half "no" at each d.

What differs from Ouro and why: Ouro's statement is about the adjacency-squaring capacity of one
looped layer; the paper gives no data recipe. Here (1) the graph is layered so that D is exact
and a "no" has a well defined decoy distance; (2) knowledge out-degree is 1 (a lookup table the
weights can hold at cpu scale); (3) d = 1 cannot mix edge kinds, so its share of
weights-only and context-only answers is reported (`path`) instead; (4) knowledge edges are also
taught as queries, the form in which a query needs them (Physics of LMs 3.1: knowledge stored in
one form is not used in another unless trained so); (5) the short-distance curriculum gives
dense early supervision, since each query carries one bit; (6) the query comes before the
context (the theorem's layer reads both at once; a causal decoder only reads back); (7) the
context lookups are extra supervision for the in-prompt step the theorem takes as given (its
input is the context graph's adjacency matrix, not a list of edges to search). Ouro's
Theorem 1 (informal) states O(log^2 D) loops of one layer; its table of sequential steps lists O(log D).

Records: train has edge statements ({"kind": "edge", "edge": [u, v], "text": "n3 -> n17"}),
edge queries ({"kind": "edge_query", "prompt", "answer", "edge", "group"}), context lookups
({"kind": "lookup", "prompt", "answer": "n9", "source", "context_edges", "group": "lookup"}) and
queries; test has queries only, with prompts that never occur in train. A query: {"kind":
"query", "prompt": "<bos> can n3 reach n40 ? n3 -> n9 , ... . <ans>", "answer": "yes"|"no",
"source", "target", "decoy_source", "distance", "path" ("knowledge"|"context"|"mixed"), "group",
"context_edges": [[u, v], ...]}. Node ids are ints; node i's token is "n{i}".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from synthlab_generators.common import (
    SPECIAL_TOKENS,
    Dataset,
    TaskError,
    TaskParams,
    TaskShape,
    TaskSpec,
    chunked,
    json_line,
    param,
)
from synthlab_generators.reach_graph import Draws, Graph, adjacency, reaches, walk

MAX_TRIES = 1_000  # rejection-sampling tries per query before giving up
WORDS = ("->", ",", ".", "can", "reach", "what", "?", "yes", "no")  # besides the node tokens


@dataclass(frozen=True)
class ReachParams(TaskParams):
    """Parameters of `synthlab gen reach`."""

    nodes: int = param(64, "Number of graph nodes (at least 4 per layer: 4 x (max-diameter+1)).")
    max_diameter: int = param(8, "Largest shortest-path length D in the union graph; queries have distances 1..D.")
    n_train: int = param(20_000, "Number of training queries (plus the edge statements and edge queries).")
    n_test: int = param(2_000, "Number of test queries (spread evenly over distances, classes).")
    context_edges: int = param(
        0,
        "Edges given in each prompt (0: 2 x max-diameter); at least "
        "2 x max(1, max-diameter - 1), what two planted walks use.",
    )
    edge_repeats: int = param(20, "How many times each knowledge edge is stated as 'u -> v'.")
    edge_queries: int = param(
        0,
        "How many times each knowledge edge is also asked as a "
        "context-free query, with as many 'no' queries from its source.",
    )
    lookup_queries: int = param(
        0,
        "Context lookups in train (at most --n-train): '<bos> can "
        "s reach what ? <context> . <ans>' answered by the one node "
        "s leads to in the context.",
    )
    distance_decay: float = param(
        1.0, "Curriculum: training queries at distance d are in proportion to this ** (d - 1), in (0, 1] (1: uniform)."
    )

    def __post_init__(self) -> None:
        self.require_int("max_diameter", 1, 1000)
        self.require_int("nodes", 4 * (self.max_diameter + 1), 1_000_000)
        self.require_int("n_train", 2)
        self.require_int("n_test", 2)
        self.require_int("context_edges", 0)
        if self.context_edges:
            self.require_int("context_edges", 2 * max(1, self.max_diameter - 1), 100_000)
        self.require_int("edge_repeats", 1, 10_000)
        self.require_int("edge_queries", 0, 10_000)
        self.require_int("lookup_queries", 0, self.n_train)
        self.require(
            isinstance(self.distance_decay, (int, float)) and 0 < self.distance_decay <= 1,
            "distance_decay",
            "must be in (0, 1]",
        )
        sizes = [len(a) for a in np.array_split(np.arange(self.nodes), self.max_diameter + 1)]
        free = sum(a * b - a for a, b in zip(sizes, sizes[1:]))  # non-knowledge layer edges
        self.require(
            self.n_context <= free // 2, "context_edges", f"must be at most half of the {free} possible context edges"
        )

    @property
    def n_context(self) -> int:
        return self.context_edges or 2 * self.max_diameter


def distance_counts(total: int, weights: list[float]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainder; ties to the shorter d)."""
    shares = np.asarray(weights, dtype=float) / sum(weights) * total
    counts = np.floor(shares).astype(int)
    extra = np.argsort(-(shares - counts), kind="stable")[: total - counts.sum()]
    counts[extra] += 1
    return counts.tolist()


def planned_distances(params: ReachParams, split: str) -> list[tuple[bool, int]]:
    """(yes, d) of every query of a split, in generation order: half "yes" (the first of an odd
    count), each class spread over d = 1..D evenly (test) or by the curriculum (train)."""
    D = params.max_diameter
    count = params.n_test if split == "test" else params.n_train
    decay = 1.0 if split == "test" else params.distance_decay
    weights = [decay ** (d - 1) for d in range(1, D + 1)]
    plan = []
    for yes, n in ((True, (count + 1) // 2), (False, count // 2)):
        for d, k in enumerate(distance_counts(n, weights), 1):
            plan += [(yes, d)] * k
    return plan


def _listed(edges: list[list[int]]) -> str:
    return " , ".join(f"n{u} -> n{v}" for u, v in edges)


def _query(graph: Graph, params: ReachParams, yes: bool, d: int, draws: Draws) -> dict:
    D = params.max_diameter
    for _ in range(MAX_TRIES):
        first = graph.members[draws.below(D - d + 1)]
        i, j = draws.below(len(first)), draws.below(len(first) - 1)
        source, decoy = first[i], first[j + (j >= i)]
        context: set[tuple[int, int]] = set()
        end, kind = walk(graph, source, d, draws, context)
        decoy_end, decoy_kind = walk(graph, decoy, d, draws, context)
        target, path = (end, kind) if yes else (decoy_end, decoy_kind)
        while len(context) < params.n_context:  # distractors between adjacent layers
            u = draws.below(params.nodes)
            if graph.layer[u] < D:
                nxt = graph.members[graph.layer[u] + 1]
                v = nxt[draws.below(len(nxt))]
                if graph.successor[u] != v:
                    context.add((u, v))
        adj = adjacency(context)
        if reaches(source, target, d, graph.successor, adj) != yes:
            continue
        if (
            yes
            and d >= 2
            and (reaches(source, target, d, graph.successor, None) or reaches(source, target, d, None, adj))
        ):
            continue
        edges = sorted(context)
        edges = [list(edges[k]) for k in draws.rng.permutation(len(edges))]
        answer = "yes" if yes else "no"
        return {
            "kind": "query",
            "prompt": f"<bos> can n{source} reach n{target} ? {_listed(edges)} . <ans>",
            "answer": answer,
            "source": source,
            "target": target,
            "decoy_source": decoy,
            "distance": d,
            "path": path,
            "group": f"d{d}_{answer}",
            "context_edges": edges,
        }
    raise TaskError(
        f"--nodes {params.nodes}: could not build a query in {MAX_TRIES} tries; use more nodes or fewer --context-edges"
    )


def _queries(graph: Graph, params: ReachParams, split: str, avoid: set[str], rng: np.random.Generator) -> list[dict]:
    """The split's planned queries (`planned_distances`), prompts distinct and not in avoid."""
    plan = planned_distances(params, split)
    out: list[dict] = []
    seen = set(avoid)
    draws = Draws(rng)
    repeats = 0  # duplicates drawn in a row: a small graph has few distinct queries
    with tqdm(total=len(plan), desc=f"reach {split}", unit="query", disable=None, mininterval=1) as bar:
        while len(out) < len(plan):
            yes, d = plan[len(out)]
            query = _query(graph, params, yes, d, draws)
            if query["prompt"] in seen:
                repeats += 1
                if repeats == MAX_TRIES:
                    raise TaskError(
                        f"--n-train/--n-test: too few distinct {query['group']} queries exist "
                        f"with --nodes {params.nodes} and --max-diameter {params.max_diameter}"
                    )
                continue
            repeats = 0
            seen.add(query["prompt"])
            out.append(query)
            bar.update()
    return [out[i] for i in rng.permutation(len(out))]


def _edge_queries(graph: Graph, repeats: int, rng: np.random.Generator) -> list[dict]:
    """Each knowledge edge u -> v asked with no context, `repeats` times "yes" (can u reach v)
    and `repeats` times "no" (can u reach w, w a random other node of v's layer)."""
    out = []
    for u, v in graph.edges:
        others = [w for w in graph.members[graph.layer[v]] if w != v]
        for w in [v] * repeats + rng.choice(others, size=repeats).tolist():
            answer = "yes" if w == v else "no"
            out.append(
                {
                    "kind": "edge_query",
                    "prompt": f"<bos> can n{u} reach n{w} ? . <ans>",
                    "answer": answer,
                    "edge": [u, v],
                    "group": f"edge_{answer}",
                }
            )
    return out


def _lookups(train_queries: list[dict], count: int, rng: np.random.Generator) -> list[dict]:
    """`count` context lookups, on the contexts of the first training queries in turn (one whose
    every listed source has two out-edges is skipped): a source s with exactly one listed
    out-edge s -> v is asked "can s reach what ?", the answer is v."""
    out = []
    for query in train_queries:
        if len(out) == count:
            break
        edges = query["context_edges"]
        out_degree = Counter(u for u, _ in edges)
        single = [(u, v) for u, v in edges if out_degree[u] == 1]
        if single:
            u, v = single[int(rng.integers(len(single)))]
            prompt = f"<bos> can n{u} reach what ? {_listed(edges)} . <ans>"
            out.append(
                {
                    "kind": "lookup",
                    "prompt": prompt,
                    "answer": f"n{v}",
                    "source": u,
                    "context_edges": edges,
                    "group": "lookup",
                }
            )
    if len(out) < count:
        raise TaskError(
            f"--lookup-queries {count}: only {len(out)} training contexts list a source with one out-edge; use fewer"
        )
    return out


def generate(params: ReachParams, rng: np.random.Generator) -> Dataset:
    graph = Graph(params.nodes, params.max_diameter + 1, rng)
    edges = [list(edge) for edge in graph.edges]
    test = _queries(graph, params, "test", set(), rng)
    train_queries = _queries(graph, params, "train", {q["prompt"] for q in test}, rng)
    statements = [{"kind": "edge", "edge": [u, v], "text": f"n{u} -> n{v}"} for u, v in edges] * params.edge_repeats
    edge_queries = _edge_queries(graph, params.edge_queries, rng)
    lookups = _lookups(train_queries, params.lookup_queries, rng)
    train = statements + edge_queries + train_queries + lookups
    order = rng.permutation(len(train))
    graph_json = {
        "nodes": list(range(params.nodes)),
        "edges": edges,
        "layers": graph.members,
        "max_diameter": params.max_diameter,
    }
    paths = {
        kind: sum(q["path"] == kind for q in train_queries if q["answer"] == "yes")
        for kind in ("knowledge", "context", "mixed")
    }
    return Dataset(
        tokens=list(WORDS) + [f"n{i}" for i in range(params.nodes)],
        files={
            "graph.json": graph_json,
            "train.jsonl": chunked(json_line(train[i]) for i in order),
            "test.jsonl": chunked(json_line(q) for q in test),
        },
        counts={
            "train": len(train),
            "train_queries": len(train_queries),
            "train_edge_statements": len(statements),
            "train_edge_queries": len(edge_queries),
            "train_lookups": len(lookups),
            "test": len(test),
        },
        extra={"knowledge_edges": len(edges), "context_edges_per_query": params.n_context, "train_yes_paths": paths},
    )


def shape(params: ReachParams) -> TaskShape:
    """A query lists exactly n_context edges "u -> v" joined by "," (4C - 1 tokens); with
    <bos>, ". can s reach t ? <ans>" and the answer it is 4C + 8 tokens. An edge statement is
    "u -> v" plus <bos> and <eos>: 5 tokens; an edge query "<bos> . can u reach w ? <ans>" and
    its answer 9; a context lookup "<bos> can s reach what ? <context> . <ans>" (a
    query's layout, "what" in place of t) and its answer 4C + 8. Every node outside the last
    layer has one edge."""
    C = params.n_context
    last_layer = params.nodes // (params.max_diameter + 1)  # np.array_split: the last is smallest
    statements = (params.nodes - last_layer) * params.edge_repeats
    edge_queries = (params.nodes - last_layer) * params.edge_queries * 2
    records = statements + edge_queries + params.n_train + params.lookup_queries
    mean = (
        statements * 5 + edge_queries * 9 + params.n_train * (4 * C + 8) + params.lookup_queries * (4 * C + 8)
    ) / records
    return TaskShape(
        vocab_size=len(SPECIAL_TOKENS) + len(WORDS) + params.nodes,
        row_len=4 * C + 7,
        tokens_per_record=mean,
        train_records=records,
    )


SPEC = TaskSpec(
    name="reach",
    params_cls=ReachParams,
    generate=generate,
    help="Graph reachability over knowledge-graph edges (learned) plus context edges.",
    shape=shape,
    extra_files=("graph.json",),
    group_key="group",
    headline="accuracy",
    pack=False,
    data_columns={"max_diameter": "diameter"},
)
