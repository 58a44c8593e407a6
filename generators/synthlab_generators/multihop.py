"""Multi-hop knowledge-graph QA: compose k atomic facts to answer one question (C3).

The task (Ouro's multi-hop QA, docs/claims.md C3): entities in K layers of `per_layer`, R relations; every entity links
through every relation to a random entity of the next layer. A k-hop question asks for the
entity reached from a head by a path of k relations; training uses a fraction of all possible
k-hop questions plus every atomic fact; the metric is exact match of the answer entity on
held-out questions. Ouro: more loops learn 3-hop QA from fewer unique training questions.

Graph: entity tokens `e0`..`e{n-1}` are numbered in a random order (the token does not reveal the
layer); relation tokens are `r0`..`r{R-1}`. A question reads from the outside in, like English:
    <bos> who is the r3 of the r2 of the r1 of e42 ? <ans>     answer: e17

Head layers (--head-layers): `all` (default) lets a k-hop question start in every layer with k
layers after it, (K - k) x per_layer x R^k questions; `first` only in layer 0, per_layer x R^k;
or a comma list of layers ("0,1"). Why `all` is the default: counting Ouro's 3-hop
questions as (5 - 3) x 100 x 20^3, and with heads in layer 0 only a 3-hop question never reaches the
5th layer of Ouro's 5-layer graph, whose facts would then serve no question; the paper says only
that training uses 2.5% to 25% of all possible QA pairs, so `first` is kept as an option.

Splits: `n_test` k-hop questions are held out and the training set holds --train-fraction of
ALL possible k-hop questions, n_train = round(fraction x n_questions) unique ones (the axis a
reader sees is what it says; n_train + n_test must fit in n_questions). Disjoint by construction:
one draw without replacement. Train also holds every atomic fact as a 1-hop question (`hops` =
1) so that the facts are learned. For k >= 3, test also holds up to n_test held-out j-hop
questions for each j = 2..k-1 (`"headline": false`: reported per hop count, not in the headline
accuracy), so accuracy is reported per hop: the atomic facts (training), the intermediate hops,
and k.

Files: facts.jsonl (`head`, `relation`, `tail`, `text` = "the r3 of e42 is e17", the last token
the tail); train.jsonl / test.jsonl (`question`, `answer`, `head`, `relations` in path order
from the head, `hops`).

What differs from Ouro and why: a cpu-sized graph (fewer layers, entities and relations, 2 or 3
hops); the question template is fixed (Ouro's natural-language relation names add nothing to
the composition being measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synthlab_generators.common import SPECIAL_TOKENS, Dataset, TaskParams, TaskShape, TaskSpec, chunked, param

WORDS = ("who", "is", "the", "of", "?")  # the vocabulary besides relations and entities


@dataclass(frozen=True)
class MultihopParams(TaskParams):
    """Parameters of `synthlab gen multihop`."""

    hops: int = param(3, "Number of hops k of the train and test questions (2..layers-1).")
    layers: int = param(5, "Number of entity layers; relations link one layer to the next.")
    per_layer: int = param(100, "Entities per layer.")
    relations: int = param(20, "Number of relations; every entity has each one.")
    head_layers: str = param(
        "all",
        "Layers k-hop questions start from: all (every layer with k "
        "layers after it), first (layer 0), or a list like 0,1.",
    )
    train_fraction: float = param(
        0.15, "Fraction of ALL possible k-hop questions put in train, in (0, 1); the held-out ones must still fit."
    )
    n_test: int = param(3_000, "Number of held-out k-hop test questions.")

    def __post_init__(self) -> None:
        self.require_int("layers", 3, 100)
        self.require_int("hops", 2, self.layers - 1)
        self.require_int("per_layer", 1, 100_000)
        self.require_int("relations", 1, 10_000)
        self.require_int("n_test", 1)
        self.require(
            isinstance(self.train_fraction, (int, float)) and 0 < self.train_fraction < 1,
            "train_fraction",
            "must be in (0, 1)",
        )
        self.require(
            self.n_test < self.n_questions,
            "n_test",
            f"must be below the {self.n_questions} possible {self.hops}-hop questions",
        )
        self.require(self.n_train >= 1, "train_fraction", f"leaves no training question out of {self.n_questions}")
        self.require(
            self.n_train + self.n_test <= self.n_questions,
            "train_fraction",
            f"asks for {self.n_train} training questions; with --n-test {self.n_test} at "
            f"most {self.n_questions - self.n_test} of the {self.n_questions} fit",
        )
        self.require(
            self.n_train + self.n_test <= 20_000_000,
            "train_fraction",
            f"asks for {self.n_train} training questions; at most 20,000,000 in all",
        )

    @property
    def heads(self) -> tuple[int, ...]:
        """The layers k-hop questions start from (--head-layers parsed and checked)."""
        last = self.layers - 1 - self.hops  # the last layer with k layers after it
        if self.head_layers == "all":
            return tuple(range(last + 1))
        if self.head_layers == "first":
            return (0,)
        parts = [p.strip() for p in str(self.head_layers).split(",")]
        ok = all(p.isdigit() and int(p) <= last for p in parts)
        self.require(
            ok and len({int(p) for p in parts}) == len(parts),
            "head_layers",
            f"must be all, first or distinct layers in 0..{last} separated by commas",
        )
        return tuple(sorted(int(p) for p in parts))

    @property
    def n_questions(self) -> int:
        """All possible k-hop questions: heads with k hops ahead x relation paths."""
        return len(self.heads) * self.per_layer * self.relations**self.hops

    @property
    def n_train(self) -> int:
        """Unique training k-hop questions: the fraction of all possible ones."""
        return round(self.train_fraction * self.n_questions)

    def n_probe(self, hops: int) -> int:
        """Held-out probe questions of `hops` < k hops in test (all of them if fewer than n_test)."""
        return min(self.n_test, len(self.heads) * self.per_layer * self.relations**hops)


def _question_lines(heads: np.ndarray, paths: np.ndarray, answers: np.ndarray) -> list[str]:
    """JSON lines of questions; paths (n, k) relation ids in order from the head."""
    hops = paths.shape[1]
    lines = []
    for head, path, answer in zip(heads.tolist(), paths.tolist(), answers.tolist()):
        outside_in = " of the ".join(f"r{r}" for r in reversed(path))
        relations = ", ".join(f'"r{r}"' for r in path)
        lines.append(
            f'{{"question": "<bos> who is the {outside_in} of e{head} ? <ans>", '
            f'"answer": "e{answer}", "head": "e{head}", "relations": [{relations}], '
            f'"hops": {hops}}}\n'
        )
    return lines


def generate(params: MultihopParams, rng: np.random.Generator) -> Dataset:
    K, n, R, k = params.layers, params.per_layer, params.relations, params.hops
    entity_id = rng.permutation(K * n).reshape(K, n)  # (layer, slot) -> entity token number
    # successor[layer, slot, relation] = slot in layer + 1
    successor = rng.integers(0, n, size=(K - 1, n, R))

    # Atomic facts, in (layer, slot, relation) order.
    layer, slot, rel = (a.ravel() for a in np.indices((K - 1, n, R)))
    heads, tails = entity_id[layer, slot], entity_id[layer + 1, successor[layer, slot, rel]]
    facts = [
        f'{{"head": "e{h}", "relation": "r{r}", "tail": "e{t}", "text": "the r{r} of e{h} is e{t}"}}\n'
        for h, r, t in zip(heads.tolist(), rel.tolist(), tails.tolist())
    ]
    atomic = _question_lines(heads, rel[:, None], tails)

    layers_of = np.asarray(params.heads)

    def questions(count: int, hops: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(heads, paths, answers) of `count` distinct `hops`-hop questions: index q = (head
        layer position * n + head slot) * R^hops + path (base R digits)."""
        picked = rng.choice(len(layers_of) * n * R**hops, size=count, replace=False)
        head_index, path_index = np.divmod(picked, R**hops)
        head_pos, head_slot = np.divmod(head_index, n)
        head_layer = layers_of[head_pos]
        paths = np.stack([(path_index // R ** (hops - 1 - i)) % R for i in range(hops)], axis=1)
        cur_layer, cur_slot = head_layer.copy(), head_slot.copy()
        for i in range(hops):
            cur_slot = successor[cur_layer, cur_slot, paths[:, i]]
            cur_layer += 1
        return entity_id[head_layer, head_slot], paths, entity_id[cur_layer, cur_slot]

    q_heads, paths, q_answers = questions(params.n_test + params.n_train, k)
    split = params.n_test  # the first n_test picks are the test questions
    test = _question_lines(q_heads[:split], paths[:split], q_answers[:split])
    for j in range(2, k):  # per-hop probes, not in the headline accuracy
        lines = _question_lines(*questions(params.n_probe(j), j))
        test += [line[:-2] + ', "headline": false}\n' for line in lines]
    train = atomic + _question_lines(q_heads[split:], paths[split:], q_answers[split:])
    order = rng.permutation(len(train))

    return Dataset(
        tokens=list(WORDS) + [f"r{r}" for r in range(R)] + [f"e{e}" for e in range(K * n)],
        files={
            "facts.jsonl": chunked(facts),
            "train.jsonl": chunked(train[i] for i in order),
            "test.jsonl": chunked(test),
        },
        counts={"facts": len(facts), "train": len(train), "train_khop": params.n_train, "test": len(test)},
        extra={
            "possible_questions": params.n_questions,
            "head_layers": list(params.heads),
            "train_questions": params.n_train,
        },
    )


def shape(params: MultihopParams) -> TaskShape:
    """A k-hop question "<bos> who is the r_k of the ... of the r_1 of e ? <ans>" and its answer
    are 3k + 7 tokens; train holds every atomic fact as a 1-hop question plus the k-hop ones."""
    K, n, R, k = params.layers, params.per_layer, params.relations, params.hops
    atomic = (K - 1) * n * R
    mean = (atomic * (3 + 7) + params.n_train * (3 * k + 7)) / (atomic + params.n_train)
    return TaskShape(
        vocab_size=len(SPECIAL_TOKENS) + len(WORDS) + R + K * n,
        row_len=3 * k + 6,
        tokens_per_record=mean,
        train_records=atomic + params.n_train,
    )


SPEC = TaskSpec(
    name="multihop",
    params_cls=MultihopParams,
    generate=generate,
    help="Multi-hop knowledge-graph QA: k-hop questions over a layered entity graph.",
    shape=shape,
    extra_files=("facts.jsonl",),
    group_key="hops",
    headline="accuracy",
    pack=False,
    data_columns={"train_fraction": "train_fraction", "n_train": "train_questions", "head_layers": "head_layers"},
)
