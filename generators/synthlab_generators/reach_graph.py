"""The reach task's graph machinery: the layered knowledge graph, uniform draws served in blocks,
the planted walks and the reachability check over knowledge and/or context edges (see reach.py
for the construction and why it controls the diameter)."""

from __future__ import annotations

import numpy as np


class Graph:
    """The layered knowledge graph: members[layer], layer[node], successor[node] (-1: none)."""

    def __init__(self, n_nodes: int, n_layers: int, rng: np.random.Generator) -> None:
        self.members = [a.tolist() for a in np.array_split(rng.permutation(n_nodes), n_layers)]
        self.layer = [0] * n_nodes
        for i, nodes in enumerate(self.members):
            for u in nodes:
                self.layer[u] = i
        self.successor = [-1] * n_nodes
        for i, nodes in enumerate(self.members[:-1]):
            for u, v in zip(nodes, rng.choice(self.members[i + 1], size=len(nodes)).tolist()):
                self.successor[u] = v
        # in layer order, then by position in the layer
        self.edges = [(u, self.successor[u]) for nodes in self.members[:-1] for u in nodes]


class Draws:
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


def _hop_kinds(d: int, draws: Draws) -> list[bool]:
    """True = context hop: one fair draw at d = 1, at least one hop of each kind at d >= 2."""
    while True:
        kinds = [draws.below(2) == 1 for _ in range(d)]
        if d == 1 or (any(kinds) and not all(kinds)):
            return kinds


def walk(graph: Graph, start: int, d: int, draws: Draws, context: set[tuple[int, int]]) -> tuple[int, str]:
    """(end, path kind) of a planted walk of d hops; its context hops are added to `context`."""
    node = start
    kinds = _hop_kinds(d, draws)
    for is_context in kinds:
        if is_context:  # any node of the next layer but the knowledge successor
            nxt = [v for v in graph.members[graph.layer[node] + 1] if v != graph.successor[node]]
            target = nxt[draws.below(len(nxt))]
            context.add((node, target))
            node = target
        else:
            node = graph.successor[node]
    kind = "mixed" if d >= 2 else ("context" if kinds[0] else "knowledge")
    return node, kind


def reaches(
    source: int, target: int, steps: int, successor: list[int] | None, context: dict[int, list[int]] | None
) -> bool:
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


def adjacency(edges) -> dict[int, list[int]]:
    """Source -> the targets of its edges, in edge order."""
    adj: dict[int, list[int]] = {}
    for u, v in edges:
        adj.setdefault(u, []).append(v)
    return adj
