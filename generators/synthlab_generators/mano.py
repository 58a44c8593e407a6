"""Mano: modular arithmetic expression trees in prefix notation (knowledge manipulation).

A record is `{"prompt": "<bos> <len_l> EXPR <ans>", "answer": "v", "length": l}`: EXPR is a tree
with l operators written in prefix notation (operator, left subtree, right subtree), operands are
decimal tokens 0..mod-1, and v is its value mod `mod`. `/` (with --ops asmd) multiplies by the
modular inverse; a tree that divides by 0 anywhere is resampled whole.

Shape (as in Ouro's Mano task): for l operators pick an operator uniformly, split l - 1 = l1 + l2 with l1
uniform in 0..l-1, recurse on (l1, l2); l = 0 is a leaf. Train lengths are uniform on 1..L.

Test (test.jsonl): first `n_test` distinct prompts of length L, drawn before train; train records
whose prompt is one of them are resampled, so no test prompt appears in train. They alone make the
headline accuracy. Then, for every l = 1..L-1, up to `n_test_per_length` distinct prompts of
length l that are not in train (drawn after train, from the same tree distribution, so train is
the same with or without them), marked `"headline": false`: the per-length diagnostics. A short
length can have no such prompt at all (l = 1 has 3 mod^2 prompts, all in a large train split);
meta.json's `unseen_prompts_per_length` says how many exist and `test_per_length` how many were
written.

Speed: trees of one length are generated as a batch, column by column in prefix order, with an
explicit stack of pending subtree sizes per row; values come from a right-to-left scan with a
value stack per row. Both loops run over the 2l + 1 token positions, never over records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from synthlab_generators.common import SPECIAL_TOKENS, Dataset, TaskParams, TaskShape, TaskSpec, chunked, param

OPERATORS = {"asm": ("+", "-", "*"), "asmd": ("+", "-", "*", "/")}
ROUNDS, MAX_BATCH = 20, 1_000_000  # held-out draws of a shorter length: batches, trees per batch


@dataclass(frozen=True)
class ManoParams(TaskParams):
    """Parameters of `synthlab gen mano`."""

    L: int = param(
        24, "Test length: number of operators per test expression; training lengths are uniform on 1..L.", flag="--L"
    )
    n_train: int = param(100_000, "Number of training records.")
    n_test: int = param(3_000, "Number of headline test records (distinct prompts of length L).")
    n_test_per_length: int = param(
        200,
        "Held-out records of each shorter length l = 1..L-1 (distinct prompts not in train; fewer where fewer exist).",
    )
    ops: str = param("asm", "Operator set: 'asm' (+ - *) or 'asmd' (+ - * and / as the modular inverse).")
    mod: int = param(23, "Modulus, a prime; operands are 0..mod-1 and values are taken mod it.")

    def __post_init__(self) -> None:
        self.require_int("L", 1, 1000)
        self.require_int("n_train", 1)
        self.require_int("n_test", 1)
        self.require_int("n_test_per_length", 0)
        self.require_choice("ops", OPERATORS)
        self.require_int("mod", 2, 1000)
        self.require(
            all(self.mod % d for d in range(2, math.isqrt(self.mod) + 1)),
            "mod",
            "must be a prime (division and the operand range rely on it)",
        )
        distinct = distinct_prompts(self.L, len(OPERATORS[self.ops]), self.mod)
        self.require(
            2 * self.n_test <= distinct,
            "n_test",
            f"must be at most half of the {distinct} distinct prompts of length --L "
            f"{self.L}, so that training can still draw length-L prompts",
        )


def distinct_prompts(length: int, n_ops: int, mod: int) -> int:
    """Number of distinct expressions with `length` operators: Catalan * ops^l * mod^(l+1)."""
    catalan = math.comb(2 * length, length) // (length + 1)
    return catalan * n_ops**length * mod ** (length + 1)


def valid_prompts(max_length: int, n_ops: int, mod: int) -> list[int]:
    """Number of distinct expressions with l = 0..max_length operators that never divide by 0.

    Without division every expression is valid (`distinct_prompts`). With it, by dynamic
    programming over (l, value) in float64: exact below 2^53 (where a count can be compared with a
    training set's size), approximate above, the upper bound `distinct_prompts` past float range.
    """
    if n_ops < len(OPERATORS["asmd"]):
        return [distinct_prompts(length, n_ops, mod) for length in range(max_length + 1)]
    flat = _operator_table(mod).reshape(n_ops, -1)
    results = [table[table >= 0] for table in flat]  # value of each valid operand pair
    valid = [table >= 0 for table in flat]
    count = [np.ones(mod)]  # count[l][v]: expressions of l operators with value v
    with np.errstate(over="ignore", invalid="ignore"):
        for size in range(1, max_length + 1):
            total = np.zeros(mod)
            for left in range(size):
                pairs = np.multiply.outer(count[left], count[size - 1 - left]).ravel()
                for result, ok in zip(results, valid):
                    total += np.bincount(result, weights=pairs[ok], minlength=mod)
            count.append(total)
    return [
        int(c.sum()) if np.isfinite(c.sum()) else distinct_prompts(length, n_ops, mod) for length, c in enumerate(count)
    ]


def tokens(params: ManoParams) -> list[str]:
    """The vocabulary after the special tokens: <len_1>..<len_L>, operators, operands."""
    return (
        [f"<len_{i}>" for i in range(1, params.L + 1)]
        + list(OPERATORS[params.ops])
        + [str(v) for v in range(params.mod)]
    )


def sample_trees(length: int, count: int, n_ops: int, mod: int, rng: np.random.Generator) -> np.ndarray:
    """`count` random trees with `length` operators, as prefix codes (count, 2*length+1).

    Code c < mod is the operand c; code mod + k is operator k.
    """
    width, depth = 2 * length + 1, length + 2
    # Each row's stack of pending subtree sizes lives in a flat array at row * depth + height
    # (flat indices: 2-D fancy indexing is several times slower).
    pending = np.zeros(count * depth, dtype=np.int32)
    base = np.arange(count, dtype=np.int32) * depth
    pending[base] = length
    top = np.ones(count, dtype=np.int32)  # stack height per row
    sizes = np.empty((width, count), dtype=np.int32)  # column-major: one row per position
    split = rng.random((width, count))
    for col in range(width):
        top -= 1
        slot = base + top
        size = pending[slot]
        sizes[col] = size
        left = (split[col] * size).astype(np.int32)  # l1 uniform in 0..size-1
        # Push the right subtree, then the left one so that it is expanded first. A leaf
        # (size 0) writes into free slots above its stack and does not grow it.
        pending[slot] = size - 1 - left
        pending[slot + 1] = left
        top += 2 * (size > 0)
    is_op = sizes.T > 0
    return np.where(
        is_op,
        mod + rng.integers(0, n_ops, size=is_op.shape, dtype=np.int32),
        rng.integers(0, mod, size=is_op.shape, dtype=np.int32),
    )


def _operator_table(mod: int) -> np.ndarray:
    """(4, mod, mod) results of + - * / for every operand pair; -1 marks division by 0."""
    a, b = np.indices((mod, mod))
    inverse = np.array([pow(int(v), mod - 2, mod) if v else -1 for v in range(mod)])
    divide = np.where(b > 0, a * inverse[b] % mod, -1)
    return np.stack([(a + b) % mod, (a - b) % mod, a * b % mod, divide]).astype(np.int32)


def evaluate(codes: np.ndarray, mod: int) -> tuple[np.ndarray, np.ndarray]:
    """Values of prefix-coded trees (count, width) mod `mod`, and which rows divide by 0."""
    count, width = codes.shape
    table = _operator_table(mod).ravel()
    depth = width + 2
    stack = np.zeros(count * depth, dtype=np.int32)  # flat, as in sample_trees
    base = np.arange(count, dtype=np.int32) * depth
    top = np.full(count, 2, dtype=np.int32)  # two dummy slots: top - 2 >= 0 always
    div_by_zero = np.zeros(count, dtype=bool)
    columns = np.ascontiguousarray(codes.T)
    # Right to left: an operand is pushed; an operator pops its left operand (the most recent
    # push: its subtree stands right after the operator) then its right operand.
    for col in range(width - 1, -1, -1):
        code = columns[col]
        is_op = code >= mod
        left, right = stack[base + top - 1], stack[base + top - 2]
        op = np.maximum(code - mod, 0)
        value = np.where(is_op, table[(op * mod + left) * mod + right], code)
        div_by_zero |= value < 0
        np.maximum(value, 0, out=value)  # keep indices valid; the row is discarded anyway
        top -= 2 * is_op
        stack[base + top] = value
        top += 1
    return stack[base + 2], div_by_zero


def _prompt_bodies(codes: np.ndarray, names: np.ndarray) -> list[str]:
    return [" ".join(row) for row in names[codes].tolist()]


def _draw(
    length: int, count: int, params: ManoParams, names: np.ndarray, rng: np.random.Generator
) -> tuple[list[str], np.ndarray]:
    """Expression strings and answers of `count` valid trees (fewer if some divide by 0)."""
    codes = sample_trees(length, count, len(OPERATORS[params.ops]), params.mod, rng)
    values, bad = evaluate(codes, params.mod)
    keep = ~bad
    return _prompt_bodies(codes[keep], names), values[keep]


def _line(length: int, expr: str, value: int, headline: bool = True) -> str:
    # Same layout as json.dumps; tokens never contain quotes or backslashes.
    flag = "" if headline else ', "headline": false'
    return f'{{"prompt": "<bos> <len_{length}> {expr} <ans>", "answer": "{value}", "length": {length}{flag}}}\n'


def _unseen(
    length: int, want: int, seen: set[str], valid: int, params: ManoParams, names: np.ndarray, rng: np.random.Generator
) -> tuple[dict[str, int], int]:
    """(up to `want` distinct prompts of `length` not in `seen`, how many such prompts exist);
    `valid`: how many valid prompts of that length exist.

    Drawn from the tree distribution and rejected while in `seen`; when unseen prompts are rare,
    batches grow with the rarity, and after ROUNDS batches fewer than `want` may be returned.
    """
    unseen = valid - len(seen)
    want = min(want, unseen)
    found: dict[str, int] = {}
    for _ in range(ROUNDS if want else 0):
        batch = min(MAX_BATCH, 2 * (want - len(found)) * valid // unseen + 16)
        exprs, values = _draw(length, batch, params, names, rng)
        for expr, value in zip(exprs, values.tolist()):
            if expr not in seen and len(found) < want:
                found.setdefault(expr, value)
        if len(found) == want:
            break
    return found, unseen


def generate(params: ManoParams, rng: np.random.Generator) -> Dataset:
    # code -> token: operands 0..mod-1, then operators
    names = np.array([str(v) for v in range(params.mod)] + list(OPERATORS[params.ops]), dtype=object)
    # Test first: distinct prompts of length L.
    test: dict[str, int] = {}
    while len(test) < params.n_test:
        exprs, values = _draw(params.L, params.n_test - len(test), params, names, rng)
        for expr, value in zip(exprs, values.tolist()):
            test.setdefault(expr, value)
    test_lines = [_line(params.L, e, v) for e, v in test.items()]

    # Train: lengths uniform on 1..L, generated as one batch per length, kept in draw order.
    lengths = rng.integers(1, params.L + 1, size=params.n_train)
    by_length: dict[int, list[str]] = {}
    seen: dict[int, set[str]] = {}
    for length in tqdm(range(1, params.L + 1), desc="mano train", unit="length", disable=None):
        need = int(np.count_nonzero(lengths == length))
        lines: list[str] = []
        while len(lines) < need:
            exprs, values = _draw(length, need - len(lines), params, names, rng)
            kept = [(e, v) for e, v in zip(exprs, values.tolist()) if e not in test]
            lines += [_line(length, e, v) for e, v in kept]
            if length < params.L:  # the shorter lengths' held-out prompts must avoid these
                seen.setdefault(length, set()).update(e for e, _ in kept)
        by_length[length] = lines[::-1]  # popped from the end below, in draw order
    train_lines = [by_length[length].pop() for length in lengths.tolist()]

    # Held-out prompts of every shorter length, after train (which they leave unchanged).
    per_length, unseen = {params.L: len(test_lines)}, {}
    valid = valid_prompts(params.L - 1, len(OPERATORS[params.ops]), params.mod)
    for length in range(1, params.L):
        found, unseen[length] = _unseen(
            length, params.n_test_per_length, seen.get(length, set()), valid[length], params, names, rng
        )
        test_lines += [_line(length, e, v, headline=False) for e, v in found.items()]
        per_length[length] = len(found)

    return Dataset(
        tokens=tokens(params),
        files={"train.jsonl": chunked(train_lines), "test.jsonl": chunked(test_lines)},
        counts={"train": len(train_lines), "test": len(test_lines)},
        extra={
            "distinct_test_length_prompts": str(distinct_prompts(params.L, len(OPERATORS[params.ops]), params.mod)),
            "unseen_prompts_per_length": {str(k): str(v) for k, v in unseen.items()},
            "test_per_length": {str(k): per_length[k] for k in sorted(per_length)},
        },
    )


def shape(params: ManoParams) -> TaskShape:
    """A record of length l is <bos> <len_l> EXPR (2l + 1 tokens) <ans> answer: 2l + 5 tokens.
    The longest test records have l = L; train lengths are uniform on 1..L (mean L + 6)."""
    return TaskShape(
        vocab_size=len(SPECIAL_TOKENS) + len(tokens(params)),
        row_len=2 * params.L + 4,
        tokens_per_record=params.L + 6.0,
        train_records=params.n_train,
    )


SPEC = TaskSpec(
    name="mano",
    params_cls=ManoParams,
    generate=generate,
    help="Mano: modular arithmetic expression trees in prefix notation.",
    shape=shape,
    extra_files=(),
    group_key="length",
    headline="accuracy",
    pack=False,
    data_columns={"L": "L"},
)
