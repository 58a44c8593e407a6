"""What a verdict rule reads from a results table: its statistic once per seed and cell, with the
test set's binomial variance of it, and the requirements its compared rows must meet.

The rule itself (`synthlab.claims.rules.Rule`) says which rows are compared and how; this module only
reads rows. A bounded statistic (accuracies, agreements: columns named `accuracy*`, `acc_*`,
`agree_*`, `train_acc_*`) carries, per seed, the test set's binomial variance p (1 - p) / N of
each compared column (N from the row's `n_test`, `n_answers` or, for `acc_X`, `n_X`), summed over
the statistic's columns and arms (`synthlab.claims.intervals` says why and how it is used); where the
rows name per-prompt outcomes (column `outcomes`), also the statistic per test prompt and each
arm's accuracy, for the paired interval and the learned / stuck count (`synthlab.claims.paired`).

pandas and `synthlab.claims.paired` (scipy) are imported inside the functions that read a table:
`synthlab.claims.rules` imports this module for the forms of a rule, and every experiment definition
is parsed through it, in a sweep's worker processes too, which read no table.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from typing import Any

import numpy as np

from synthlab.conditions import COMPARE, NUMBER, REQUIREMENT

Rule = Any  # a synthlab.claims.rules.Rule (which imports this module)

SEED_COLUMNS = ("seed", "data_seed")
BOUNDED = re.compile(r"^(accuracy\w*|acc_\w+|agree_\w+|train_acc_\w+)$")  # shares of answers, in [0, 1]
COUNTS = ("n_test", "n_answers")  # the test prompts behind a row's accuracies
DISTINCT = re.compile(rf"^\s*distinct\(\s*([\w.]+)\s*\)\s*(>=|<=|>|<)\s*{NUMBER}\s*$")
CONTAINS = re.compile(r"^\s*([-+\w.]+)\s+in\s+([\w.]+)\s*$")
REGIME = (REQUIREMENT, DISTINCT, CONTAINS)  # the forms of a rule's `regime` entries


@dataclasses.dataclass(frozen=True)
class SeedValue:
    value: float  # the statistic at this seed
    test_var: float  # the test set's binomial variance of it (NaN: not a share, or no count column)
    prompts: float  # the fewest test prompts behind it (NaN: unknown)
    per_prompt: Any = None  # the statistic per test prompt (None: no per-prompt outcomes; synthlab.claims.paired)
    arms: tuple[float, ...] = ()  # each arm's accuracy at this seed (a, then b): learned or stuck


def bounds(rule: Rule) -> tuple[float, float] | None:
    """The range of the rule's statistic: [0, 1] for one share, [-1, 1] for a difference of shares,
    None otherwise (a loss, bits, a relative difference)."""
    columns = rule.metric.split(" - ")
    if rule.relative or not all(BOUNDED.match(c) for c in columns):
        return None
    return (0.0, 1.0) if len(columns) == 1 and rule.b is None else (-1.0, 1.0)


def _count(column: str, table):
    own = f"n_{column[4:]}" if column.startswith("acc_") else None
    for name in (own, *COUNTS):
        if name and name in table:
            return table[name].astype(float)
    return None


def _same(series, value):
    """Rows of `series` equal to `value` (numbers compared as numbers, anything else as text)."""
    import pandas as pd  # pandas, scipy: where a table is read (module docstring)

    values = value if isinstance(value, list) else [value]
    numeric = pd.to_numeric(series, errors="coerce")
    mask = pd.Series(False, index=series.index)
    for v in values:
        try:
            mask |= numeric == float(v)
        except (TypeError, ValueError):
            pass
        mask |= series.astype(str) == str(v)
    return mask


def _metric(table, metric: str, bounded: bool):
    """(the metric per row, its binomial variance per row, the prompts behind it) or None."""
    columns = metric.split(" - ")
    if any(c not in table for c in columns):
        return None
    values = table[columns[0]].astype(float)
    if len(columns) == 2:
        values = values - table[columns[1]].astype(float)
    var, prompts = math.nan, math.nan
    counts = [_count(c, table) for c in columns]
    if bounded and all(n is not None for n in counts):
        var = sum(
            table[c].astype(float).clip(0, 1) * (1 - table[c].astype(float).clip(0, 1)) / n
            for c, n in zip(columns, counts)
        )
        prompts = counts[0] if len(counts) == 1 else counts[0].combine(counts[1], min)
    return values, var, prompts


def where(rule: Rule, table):
    """The rows the rule's `where` keeps (None when the table lacks one of its columns)."""
    for column, value in rule.where.items():
        if column not in table:
            return None
        table = table[_same(table[column], value)]
    return table


def cells(rule: Rule, table) -> dict[str, object] | None:
    """The rule's rows split by its `each` columns ({"": rows} without `each`), keyed "L=2, ...";
    None when the table lacks a column the split needs."""
    table = where(rule, table.copy())  # a copy: one block, a wide results table is fragmented
    if table is None or any(c not in table for c in rule.each):
        return None
    if not rule.each:
        return {"": table}
    out = {}
    for key, rows in table.groupby(list(rule.each), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        out[", ".join(f"{c}={v:g}" if isinstance(v, float) else f"{c}={v}" for c, v in zip(rule.each, key))] = rows
    return out


def seed_values(rule: Rule, table, factors: list[str]) -> list[SeedValue]:
    """The rule's statistic once per seed in `table`'s rows (seeds without a usable row or pair are
    left out): the mean over the matched cells of mean(a) - mean(b) (over |mean(b)| with
    `relative`), or the mean of a's rows alone without `b`; with `x`, b is read as a curve at the
    a rows strictly inside its range (rows at its ends are left out: there the arms coincide)."""
    import pandas as pd

    from synthlab.claims import paired

    table = where(rule, table)
    if table is None:
        return []
    metric = _metric(table, rule.metric, bounds(rule) is not None)
    if metric is None or (rule.column is not None and rule.column not in table):
        return []
    value, var, prompts = metric
    table = table.assign(_value=value, _var=var, _prompts=prompts).dropna(subset=["_value"])
    replicates = [c for c in (*SEED_COLUMNS, *rule.units) if c in table]
    if any(u not in table for u in rule.units):
        return []
    table = table.assign(_unit=table[replicates].map(str).agg("/".join, axis=1) if replicates else "all")
    a_rows = table[_same(table[rule.column], rule.a)] if rule.column else table
    b_rows = table[_same(table[rule.column], rule.b)] if rule.b is not None else a_rows
    match = (
        list(rule.match)
        if rule.match is not None
        else [  # the factors both arms span alike
            f
            for f in factors
            if f in table
            and f not in (rule.column, rule.x, *SEED_COLUMNS, *rule.units, *rule.each)
            and set(a_rows[f].astype(str)) == set(b_rows[f].astype(str))
        ]
    )
    if any(m not in table for m in match) or (rule.x and rule.x not in table):
        return []
    a_rows, b_rows = (rows.assign(**{m: rows[m].map(str) for m in match}) for rows in (a_rows, b_rows))
    out = []
    for unit in a_rows.sort_values(replicates)["_unit"].unique() if replicates else ["all"]:  # seed order, numeric
        a_unit = a_rows[a_rows["_unit"] == unit]
        if rule.b is None:
            out.append(
                SeedValue(
                    float(a_unit["_value"].mean()),
                    float(a_unit["_var"].mean()),
                    float(a_unit["_prompts"].min()),
                    paired.mean_vector(a_unit, rule.metric),
                    (_accuracy(a_unit, rule),),
                )
            )
            continue
        b_unit = b_rows[b_rows["_unit"] == unit]
        diffs, variances, fewest, vectors = [], [], [], []
        groups = a_unit.groupby(match, dropna=False) if match else [((), a_unit)]
        for key, a_cell in groups:
            key = key if isinstance(key, tuple) else (key,)
            b_cell = b_unit
            for m, v in zip(match, key):
                b_cell = b_cell[b_cell[m] == v]
            if b_cell.empty:
                continue
            if rule.x:
                curve = b_cell.groupby(rule.x)["_value"].mean().sort_index()
                xs = pd.to_numeric(a_cell[rule.x]).to_numpy(float)
                # strictly inside: at either end of b's curve (every prompt exits at the first or the
                # last step) both arms are the same model read the same way, equal by construction
                inside = (xs > curve.index.min()) & (xs < curve.index.max())
                if not inside.any():
                    continue
                base = np.interp(xs[inside], curve.index.to_numpy(float), curve.to_numpy(float))
                a_vals = a_cell["_value"].to_numpy(float)[inside]
                diff, ref = float(np.mean(a_vals - base)), float(np.mean(base))
                a_cell = a_cell[inside]
                vector = _per_prompt_curve(rule, a_cell, b_cell, xs[inside])
            else:
                ref = float(b_cell["_value"].mean())
                diff = float(a_cell["_value"].mean()) - ref
                a_vec, b_vec = paired.mean_vector(a_cell, rule.metric), paired.mean_vector(b_cell, rule.metric)
                vector = None if a_vec is None or b_vec is None or len(a_vec) != len(b_vec) else a_vec - b_vec
            if rule.relative:
                if ref == 0:
                    continue
                diff /= abs(ref)
            # rows of one arm share their prompts: the mean of their variances bounds their mean's
            diffs.append(diff)
            variances.append(float(a_cell["_var"].mean() + b_cell["_var"].mean()))
            fewest.append(min(a_cell["_prompts"].min(), b_cell["_prompts"].min()))
            vectors.append(None if rule.relative else vector)
        if diffs:
            out.append(
                SeedValue(
                    float(np.mean(diffs)),
                    float(np.mean(variances)),
                    float(np.min(fewest)),
                    paired.mean_of(vectors),
                    (_accuracy(a_unit, rule), _accuracy(b_unit, rule)),
                )
            )
    return out


def _per_prompt_curve(rule: Rule, a_cell, b_cell, xs):
    """Per prompt: each a row minus b's curve read at its x, averaged over the a rows (None
    without per-prompt outcomes)."""
    from synthlab.claims import paired

    a_vecs = [paired.prompt_vector(row, rule.metric) for _, row in a_cell.iterrows()]
    base = paired.curve_vectors(b_cell, rule.x, rule.metric, xs)
    if base is None or any(v is None or len(v) != base.shape[1] for v in a_vecs):
        return None
    return (np.stack(a_vecs) - base).mean(0)


def _accuracy(rows, rule: Rule) -> float:
    """An arm's accuracy at a seed, to tell learned seeds from stuck ones: the model's at its trained
    depth where the table has it, else the rule's (first) column if it is an accuracy (NaN otherwise)."""
    column = rule.metric.split(" - ")[0]
    column = "accuracy_at_trained_depth" if "accuracy_at_trained_depth" in rows else column
    share = BOUNDED.match(column) and not column.startswith("agree_")
    return float(rows[column].astype(float).mean()) if share and column in rows else math.nan


def _compared(rule: Rule, table):
    """The rows the rule compares: its `where`, then arms a and b (None when `where` cannot apply)."""
    table = where(rule, table)
    if table is None:
        return None
    if rule.column is not None and rule.column in table:
        arms = _same(table[rule.column], rule.a)
        if rule.b is not None:
            arms |= _same(table[rule.column], rule.b)
        table = table[arms]
    return table


def _every_row(condition: str, table) -> str:
    """'' when every row meets "column OP number", else what fails."""
    import pandas as pd

    column, op, number = REQUIREMENT.match(condition).groups()
    if column not in table:
        return f"{condition}: results.csv has no {column}"
    values = pd.to_numeric(table[column], errors="coerce")
    bad = ~values.map(lambda v: COMPARE[op](v, float(number)) if v == v else False)
    if not bad.any():
        return ""
    worst = values[bad].min() if op in (">=", ">") else values[bad].max()
    blank = int(values[bad].isna().sum())
    return f"{condition}: {int(bad.sum())} of {len(values)} compared rows fail, " + (
        f"{blank} of them blank" if worst != worst else f"{'lowest' if op in ('>=', '>') else 'highest'} {worst:.4g}"
    )


def _regime_condition(condition: str, table) -> str:
    """'' when the compared rows meet one `regime` entry (`REGIME`), else what fails."""
    if REQUIREMENT.match(condition):
        return _every_row(condition, table)
    if found := DISTINCT.match(condition):
        column, op, number = found.groups()
        if column not in table:
            return f"{condition}: results.csv has no {column}"
        count = table[column].astype(str).nunique()
        return "" if COMPARE[op](count, float(number)) else f"{condition}: {count} value(s) of {column}"
    value, column = CONTAINS.match(condition).groups()
    if column not in table:
        return f"{condition}: neither results.csv nor the preset has {column}"

    def holds(cell) -> bool:
        items = ast.literal_eval(cell) if isinstance(cell, str) else cell
        items = items if isinstance(items, (list, tuple)) else [items]
        return any(str(v) == value or (isinstance(v, (int, float)) and _number(value) == v) for v in items)

    bad = int((~table[column].map(holds)).sum())
    return f"{condition}: {bad} of {len(table)} compared rows fail" if bad else ""


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def out_of_regime(rule: Rule, table) -> str:
    """What the rule's compared rows fail of its `regime` ("" inside it, or with no rows to judge)."""
    table = _compared(rule, table)
    if table is None or table.empty:
        return ""
    failed = [f for f in (_regime_condition(c, table) for c in rule.regime) if f]
    if failed and rule.regime_preset:
        failed.append(f"preset `{rule.regime_preset}` reaches it")
    return "; ".join(failed)


def unmet_requirements(rule: Rule, table) -> str:
    """What the rule's compared rows fail of its `requires` ("" when every row meets every one)."""
    table = _compared(rule, table)
    if table is None:
        return ""
    return "; ".join(f"requires {f}" for f in (_every_row(r, table) for r in rule.requires) if f)
