"""Multi-hop knowledge-graph QA: compose k atomic facts to answer one question.

Graph: `layers` layers of `per_layer` entities and `relations` relations; every entity outside
the last layer links through every relation to a uniformly random entity of the next layer.
Entity tokens `e0`..`e{n-1}` are numbered in a random order (the token does not reveal the
layer); relation tokens are `r0`..`r{R-1}`.

A k-hop question starts at a head from which k hops exist (layers 0..layers-1-k) and follows a
relation path r1, ..., rk; it reads from the outside in, like English:
    <bos> who is the r3 of the r2 of the r1 of e42 ? <ans>     answer: e17
There are (layers - k) * per_layer * R^k possible questions. Test holds `n_test` of them, train
`train_fraction` of the rest (disjoint by construction: one draw without replacement; fraction
1 = every question not in test). Train also holds every atomic fact as a 1-hop question
(`hops` = 1) so that the facts are learned.

Files: facts.jsonl (`head`, `relation`, `tail`, `text` = "the r3 of e42 is e17", the last token
the tail); train.jsonl / test.jsonl (`question`, `answer`, `head`, `relations` in path order
from the head, `hops`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synthlab_generators.common import (SPECIAL_TOKENS, Dataset, TaskParams, TaskShape,
                                         TaskSpec, chunked, param)

WORDS = ("who", "is", "the", "of", "?")  # the vocabulary besides relations and entities


@dataclass(frozen=True)
class MultihopParams(TaskParams):
    """Parameters of `synthlab gen multihop`."""

    hops: int = param(3, "Number of hops k of the train and test questions (2..layers-1).")
    layers: int = param(5, "Number of entity layers; relations link one layer to the next.")
    per_layer: int = param(100, "Entities per layer.")
    relations: int = param(20, "Number of relations; every entity has each one.")
    train_fraction: float = param(0.15, "Fraction of the possible k-hop questions (after "
                                        "the test ones are held out) put in train, in (0, 1].")
    n_test: int = param(3_000, "Number of held-out k-hop test questions.")

    def __post_init__(self) -> None:
        self.require_int("layers", 3, 100)
        self.require_int("hops", 2, self.layers - 1)
        self.require_int("per_layer", 1, 100_000)
        self.require_int("relations", 1, 10_000)
        self.require_int("n_test", 1)
        self.require(isinstance(self.train_fraction, (int, float))
                     and 0 < self.train_fraction <= 1, "train_fraction", "must be in (0, 1]")
        self.require(self.n_test < self.n_questions, "n_test",
                     f"must be below the {self.n_questions} possible {self.hops}-hop questions")
        self.require(self.n_train >= 1, "train_fraction",
                     f"leaves no training question out of {self.n_questions}")
        self.require(self.n_train + self.n_test <= 20_000_000, "train_fraction",
                     f"asks for {self.n_train} training questions; at most 20,000,000 in all")

    @property
    def n_questions(self) -> int:
        """All possible k-hop questions: heads with k hops ahead x relation paths."""
        return (self.layers - self.hops) * self.per_layer * self.relations**self.hops

    @property
    def n_train(self) -> int:
        """Training k-hop questions: the fraction of those not held out for test."""
        return round(self.train_fraction * (self.n_questions - self.n_test))


def _question_lines(heads: np.ndarray, paths: np.ndarray, answers: np.ndarray) -> list[str]:
    """JSON lines of questions; paths (n, k) relation ids in order from the head."""
    hops = paths.shape[1]
    lines = []
    for head, path, answer in zip(heads.tolist(), paths.tolist(), answers.tolist()):
        outside_in = " of the ".join(f"r{r}" for r in reversed(path))
        relations = ", ".join(f'"r{r}"' for r in path)
        lines.append(f'{{"question": "<bos> who is the {outside_in} of e{head} ? <ans>", '
                     f'"answer": "e{answer}", "head": "e{head}", "relations": [{relations}], '
                     f'"hops": {hops}}}\n')
    return lines


def generate(params: MultihopParams, rng: np.random.Generator) -> Dataset:
    K, n, R, k = params.layers, params.per_layer, params.relations, params.hops
    entity_id = rng.permutation(K * n).reshape(K, n)  # (layer, slot) -> entity token number
    # successor[layer, slot, relation] = slot in layer + 1
    successor = rng.integers(0, n, size=(K - 1, n, R))

    # Atomic facts, in (layer, slot, relation) order.
    layer, slot, rel = (a.ravel() for a in np.indices((K - 1, n, R)))
    heads, tails = entity_id[layer, slot], entity_id[layer + 1, successor[layer, slot, rel]]
    facts = [f'{{"head": "e{h}", "relation": "r{r}", "tail": "e{t}", '
             f'"text": "the r{r} of e{h} is e{t}"}}\n'
             for h, r, t in zip(heads.tolist(), rel.tolist(), tails.tolist())]
    atomic = _question_lines(heads, rel[:, None], tails)

    # k-hop questions: index q = (head_layer * n + head_slot) * R^k + path (base R digits).
    picked = rng.choice(params.n_questions, size=params.n_test + params.n_train, replace=False)
    head_index, path_index = np.divmod(picked, R**k)
    head_layer, head_slot = np.divmod(head_index, n)
    paths = np.stack([(path_index // R ** (k - 1 - i)) % R for i in range(k)], axis=1)
    cur_layer, cur_slot = head_layer.copy(), head_slot.copy()
    for i in range(k):
        cur_slot = successor[cur_layer, cur_slot, paths[:, i]]
        cur_layer += 1
    q_heads, q_answers = entity_id[head_layer, head_slot], entity_id[cur_layer, cur_slot]
    split = params.n_test  # the first n_test picks are the test questions
    test = _question_lines(q_heads[:split], paths[:split], q_answers[:split])
    train = atomic + _question_lines(q_heads[split:], paths[split:], q_answers[split:])
    order = rng.permutation(len(train))

    return Dataset(
        tokens=list(WORDS) + [f"r{r}" for r in range(R)]
        + [f"e{e}" for e in range(K * n)],
        files={"facts.jsonl": chunked(facts), "train.jsonl": chunked(train[i] for i in order),
               "test.jsonl": chunked(test)},
        counts={"facts": len(facts), "train": len(train), "train_khop": params.n_train,
                "test": len(test)},
        extra={"possible_questions": params.n_questions},
    )


def shape(params: MultihopParams) -> TaskShape:
    """A k-hop question "<bos> who is the r_k of the ... of the r_1 of e ? <ans>" and its answer
    are 3k + 7 tokens; train holds every atomic fact as a 1-hop question plus the k-hop ones."""
    K, n, R, k = params.layers, params.per_layer, params.relations, params.hops
    atomic = (K - 1) * n * R
    mean = (atomic * (3 + 7) + params.n_train * (3 * k + 7)) / (atomic + params.n_train)
    return TaskShape(vocab_size=len(SPECIAL_TOKENS) + len(WORDS) + R + K * n,
                     row_len=3 * k + 6, tokens_per_record=mean, train_records=atomic + params.n_train)


SPEC = TaskSpec(
    name="multihop", params_cls=MultihopParams, generate=generate,
    help="Multi-hop knowledge-graph QA: k-hop questions over a layered entity graph.",
    shape=shape, extra_files=("facts.jsonl",), group_key="hops", headline="accuracy",
    pack=False, data_columns={"train_fraction": "train_fraction"},
)
