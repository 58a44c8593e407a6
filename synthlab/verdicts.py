"""Verdicts by a stated rule: each claim of an experiment decided from its results table, over seeds.

An experiment definition states its rules as `[[verdicts]]` tables (fields: `Rule`), e.g.

    [[verdicts]]
    claim = "C2"
    says = "Loop 1x3 beats Base 1x1 at equal unique parameters"
    metric = "accuracy"                  # a column, or "col1 - col2" (a difference within a row)
    column = "model"                     # the compared column (a grid factor or a descriptor) ...
    a = "1x3"                            # ... the statistic is a - b
    b = "1x1"
    match = ["L"]                        # a and b rows are paired on these columns
    expect = "above"                     # above / below threshold, or within threshold +- margin
    presets = ["gpu"]                    # optional: only these presets' grids test it
    requires = ["train_acc_l1 >= 0.99"]  # optional: what every compared row must have learned
    units = ["d_model"]                  # optional: also replicate over these columns (below)

The statistic is computed once per seed (the unit of replication: the `seed` and `data_seed`
columns; a table without them is one seed; with `units`, once per seed and value of those columns
too, e.g. once per model size when a scaling grid has one seed per size): the mean over the matched cells of mean(a) - mean(b)
(divided by |mean(b)| with `relative`), or the mean of a's rows alone without `b`; with `x`, b's
rows are a curve along column x, read at each a row's x by linear interpolation (accuracy against
mean exit step). Over the n seeds: the mean and its Student-t interval at `level`. The outcome:
- "reproduced": the interval lies on the expected side of `threshold` (inside threshold +- margin
  for `within`);
- "contradicted": it lies wholly on the other side (wholly outside the band for `within`);
- "inconclusive": it straddles;
- "too few seeds": n < min_seeds (the estimate is shown, no interval is claimed);
- "no data": no row (or no pair) the rule can use;
- "not tested": a compared row fails a `requires` condition: the models did not learn what the
  claim builds on (e.g. the single operations, the attribute values), so neither "reproduced" nor
  "contradicted" would mean anything; the estimate and interval are still shown.

A claim that the loss follows a law is stated as a `[[laws]]` table (fields: `LawRule`) and decided
from the fit `synthlab fit ... --save` wrote beside the results table (`synthlab.law_verdicts`).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from typing import Any

from synthlab.errors import SynthlabError

EXPECT = ("above", "below", "within")
SEED_COLUMNS = ("seed", "data_seed")
OUTCOMES = ("reproduced", "contradicted", "inconclusive", "too few seeds", "no data", "not tested", "not identified")
COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
REQUIREMENT = re.compile(r"^\s*([\w.]+)\s*(>=|<=|>|<)\s*([-+]?[\d.]+(?:[eE][-+]?\d+)?)\s*$")


@dataclasses.dataclass(frozen=True)
class Rule:
    claim: str  # the claim id (docs/claims.md)
    says: str  # the claim as this rule tests it (one line)
    metric: str  # a results column, or "col1 - col2"
    expect: str  # above / below / within
    column: str | None = None  # the column that tells arm a from arm b (None: every row is arm a)
    a: Any = None
    b: Any = None  # None: the statistic is arm a's level
    match: tuple[str, ...] | None = None  # pair a and b rows on these (default: the other grid factors
    # whose values are the same set in both arms, e.g. L in mano, not the arch axis behind `model`)
    where: dict[str, Any] = dataclasses.field(default_factory=dict)  # keep rows whose column equals
    # the value (or is in the list)
    x: str | None = None  # read b as a curve along this column at a's values
    threshold: float = 0.0
    margin: float = 0.0
    relative: bool = False
    min_seeds: int = 3
    level: float = 0.95
    presets: tuple[str, ...] = ()  # the presets whose grid tests this rule (empty: every preset); the
    # report lists the rule as untested under any other preset instead of deciding it
    requires: tuple[str, ...] = ()  # "column >= number" (or <=, >, <) every compared row must meet,
    # e.g. "train_acc_l1 >= 0.99": what the models must have learned for the claim to be tested
    units: tuple[str, ...] = ()  # columns whose values are further independent replicates (the
    # statistic once per seed and value): independent training runs that are not seeds

    def applies_to(self, preset: str) -> bool:
        return not self.presets or preset in self.presets

    def __post_init__(self) -> None:
        if self.expect not in EXPECT:
            raise SynthlabError(f"verdict '{self.says}': expect must be one of {EXPECT}, got {self.expect!r}")
        if self.column is not None and self.a is None:
            raise SynthlabError(f"verdict '{self.says}': `column` needs the value `a` (and `b` to compare)")
        if (self.b is not None or self.x is not None) and self.column is None:
            raise SynthlabError(f"verdict '{self.says}': `b` and `x` need `column`")
        if self.x is not None and self.b is None:
            raise SynthlabError(f"verdict '{self.says}': `x` reads arm b as a curve; set `b`")
        bad = [r for r in self.requires if not REQUIREMENT.match(r)]
        if bad:
            raise SynthlabError(f"verdict '{self.says}': `requires` entries look like 'column >= 0.99', got {bad}")
        if self.min_seeds < 2 or not 0 < self.level < 1 or self.margin < 0:
            raise SynthlabError(f"verdict '{self.says}': need min_seeds >= 2, 0 < level < 1, margin >= 0")

    def condition(self) -> str:
        """The rule in words: "accuracy[model=1x3] - accuracy[model=1x1], 95% interval above 0"."""
        arm = lambda v: f"{self.metric}[{self.column}={v}]" if self.column else self.metric  # noqa: E731
        stat = arm(self.a) if self.b is None else f"{arm(self.a)} - {arm(self.b)}"
        if self.relative:
            stat = f"({stat}) / |{arm(self.b)}|"
        if self.x:
            stat += f" along {self.x}"
        if self.units:
            stat += f", one replicate per {' x '.join(('seed', *self.units))}"
        bound = f"inside {self.threshold:g} +- {self.margin:g}" if self.expect == "within" else \
            f"{self.expect} {self.threshold:g}"
        return f"{stat}, {round(100 * self.level)}% interval {bound}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    rule: Rule | LawRule
    outcome: str
    estimate: float  # the mean over seeds (NaN without data); for a law, its (lowest) in-sample R^2
    low: float  # the interval (NaN without one, and for a law)
    high: float
    n: int  # replicates: seeds (times the values of the rule's `units`); for a law, the rows fitted
    why: str = ""  # for "no data": what the table lacks; "not tested": the unmet requirement; a law:
    # what decided it
    replicates: tuple[float, ...] = ()  # the statistic per replicate, in seed (then `units`) order

    def per_replicate(self, most: int = 12) -> str:
        """"per replicate: -0.27, -0.19, -0.03" (empty for one replicate, a law, or more than `most`)."""
        if not 1 < len(self.replicates) <= most:
            return ""
        return "per replicate: " + ", ".join(f"{s:+.3g}" for s in self.replicates)

    def summary(self) -> str:
        """"reproduced: +0.12 [0.05, 0.19], n = 3", "too few seeds (n = 1 < 3): +0.12"."""
        if self.outcome == "no data":
            return f"no data ({self.why})" if self.why else "no data"
        if self.outcome == "not tested":
            shown = "" if math.isnan(self.estimate) else f"; estimate {self.estimate:+.4g}" + (
                "" if math.isnan(self.low) else f" [{self.low:.4g}, {self.high:.4g}]")
            return f"not tested ({self.why}){shown}, n = {self.n}"
        if isinstance(self.rule, LawRule):
            return f"{self.outcome} ({self.why}), n = {self.n} rows"
        if self.outcome == "too few seeds":
            return f"too few seeds (n = {self.n} < {self.rule.min_seeds}): estimate {self.estimate:+.4g}"
        return f"{self.outcome}: {self.estimate:+.4g} [{self.low:.4g}, {self.high:.4g}], n = {self.n}"


def parse_rules(raw: Any, where: str) -> tuple[Rule, ...]:
    """The `[[verdicts]]` tables of a definition, checked."""
    from synthlab.config import from_dict

    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise SynthlabError(f"{where}: `verdicts` must be an array of tables ([[verdicts]])")
    required = [f.name for f in dataclasses.fields(Rule) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    rules = []
    for i, table in enumerate(raw, 1):
        context = f"{where}: verdict {i}"
        missing = [k for k in required if k not in table]
        if missing:
            raise SynthlabError(f"{context}: missing {missing}")
        if not isinstance(table.get("where", {}), dict):
            raise SynthlabError(f"{context}: `where` must be a table column = value")
        rules.append(from_dict(Rule, table, where=f"{context}: "))
    return tuple(rules)


def _same(series, value):
    """Rows of `series` equal to `value` (numbers compared as numbers, anything else as text)."""
    import pandas as pd

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


def _metric(table, metric: str):
    left, sep, right = metric.partition(" - ")
    columns = [left, right] if sep else [left]
    missing = [c for c in columns if c not in table]
    if missing:
        return None
    values = table[left].astype(float)
    return values - table[right].astype(float) if sep else values


def _where(rule: Rule, table):
    """The rows the rule's `where` keeps (None when the table lacks one of its columns)."""
    for column, value in rule.where.items():
        if column not in table:
            return None
        table = table[_same(table[column], value)]
    return table


def seed_statistics(rule: Rule, table, factors: list[str]) -> list[float]:
    """The rule's statistic once per seed (seeds without a usable row or pair are left out)."""
    import numpy as np
    import pandas as pd

    table = _where(rule, table.copy())  # a copy: one block, a wide results table is fragmented
    if table is None:
        return []
    value = _metric(table, rule.metric)
    if value is None or (rule.column is not None and rule.column not in table):
        return []
    table = table.assign(_value=value).dropna(subset=["_value"])
    replicates = [c for c in (*SEED_COLUMNS, *rule.units) if c in table]
    if any(u not in table for u in rule.units):
        return []
    table = table.assign(_unit=table[replicates].map(str).agg("/".join, axis=1) if replicates else "all")
    a_rows = table[_same(table[rule.column], rule.a)] if rule.column else table
    b_rows = table[_same(table[rule.column], rule.b)] if rule.b is not None else a_rows
    match = list(rule.match) if rule.match is not None else [  # the factors both arms span alike
        f for f in factors if f in table and f not in (rule.column, rule.x, *SEED_COLUMNS, *rule.units)
        and set(a_rows[f].astype(str)) == set(b_rows[f].astype(str))]
    if any(m not in table for m in match) or (rule.x and rule.x not in table):
        return []
    a_rows, b_rows = (rows.assign(**{m: rows[m].map(str) for m in match}) for rows in (a_rows, b_rows))
    out = []
    for unit in (a_rows.sort_values(replicates)["_unit"].unique() if replicates else ["all"]):  # seed order, numeric
        a_unit = a_rows[a_rows["_unit"] == unit]
        if rule.b is None:
            out.append(float(a_unit["_value"].mean()))
            continue
        b_unit = b_rows[b_rows["_unit"] == unit]
        diffs = []
        cells = a_unit.groupby(match, dropna=False) if match else [((), a_unit)]
        for key, a_cell in cells:
            key = key if isinstance(key, tuple) else (key,)
            b_cell = b_unit
            for m, v in zip(match, key):
                b_cell = b_cell[b_cell[m] == v]
            if b_cell.empty:
                continue
            if rule.x:
                curve = b_cell.groupby(rule.x)["_value"].mean().sort_index()
                xs = pd.to_numeric(a_cell[rule.x]).to_numpy(float)
                inside = (xs >= curve.index.min()) & (xs <= curve.index.max())
                if not inside.any():
                    continue
                base = np.interp(xs[inside], curve.index.to_numpy(float), curve.to_numpy(float))
                a_vals = a_cell["_value"].to_numpy(float)[inside]
                diff = float(np.mean(a_vals - base))
                ref = float(np.mean(base))
            else:
                ref = float(b_cell["_value"].mean())
                diff = float(a_cell["_value"].mean()) - ref
            if rule.relative:
                if ref == 0:
                    continue
                diff /= abs(ref)
            diffs.append(diff)
        if diffs:
            out.append(float(np.mean(diffs)))
    return out


def decide(rule: Rule, statistics: list[float]) -> Verdict:
    """The outcome of `rule` from its per-seed statistics."""
    import numpy as np
    from scipy import stats

    n = len(statistics)
    if n == 0:
        return Verdict(rule, "no data", math.nan, math.nan, math.nan, 0)
    estimate, replicates = float(np.mean(statistics)), tuple(statistics)
    if n < rule.min_seeds:
        return Verdict(rule, "too few seeds", estimate, math.nan, math.nan, n, replicates=replicates)
    half = float(stats.t.ppf((1 + rule.level) / 2, n - 1) * np.std(statistics, ddof=1) / math.sqrt(n))
    low, high = estimate - half, estimate + half
    t, m = rule.threshold, rule.margin
    if rule.expect == "within":
        inside, outside = t - m <= low and high <= t + m, high < t - m or low > t + m
    else:
        inside, outside = (low > t, high < t) if rule.expect == "above" else (high < t, low > t)
    outcome = "reproduced" if inside else "contradicted" if outside else "inconclusive"
    return Verdict(rule, outcome, estimate, low, high, n, replicates=replicates)


def evaluate(rules: tuple[Rule, ...] | list[Rule], table, factors: list[str]) -> list[Verdict]:
    """Every rule's verdict on a results table (`factors`: its grid factor columns)."""
    out = []
    for rule in rules:
        verdict = decide(rule, seed_statistics(rule, table, factors))
        if verdict.outcome == "no data":
            needed = [*rule.metric.split(" - "), rule.column, rule.x, *(rule.match or ()), *rule.where]
            missing = [c for c in dict.fromkeys(needed) if c is not None and c not in table]
            why = f"results.csv has no {', '.join(missing)}" if missing else "no row or pair the rule can use"
            verdict = dataclasses.replace(verdict, why=why)
        unmet = unmet_requirements(rule, table)
        if unmet and verdict.outcome != "no data":
            verdict = dataclasses.replace(verdict, outcome="not tested", why=unmet)
        out.append(verdict)
    return out


def unmet_requirements(rule: Rule, table) -> str:
    """What the rule's compared rows fail of its `requires` ("" when every row meets every one)."""
    import pandas as pd

    table = _where(rule, table)
    if table is None:
        return ""
    if rule.column is not None and rule.column in table:
        arms = _same(table[rule.column], rule.a)
        if rule.b is not None:
            arms |= _same(table[rule.column], rule.b)
        table = table[arms]
    failed = []
    for requirement in rule.requires:
        column, op, number = REQUIREMENT.match(requirement).groups()
        if column not in table:
            failed.append(f"requires {requirement}: results.csv has no {column}")
            continue
        values = pd.to_numeric(table[column], errors="coerce")
        bad = ~values.map(lambda v: COMPARE[op](v, float(number)) if v == v else False)
        if bad.any():
            worst = values[bad].min() if op in (">=", ">") else values[bad].max()
            failed.append(f"requires {requirement}: {int(bad.sum())} of {len(values)} compared rows fail, "
                          f"{'lowest' if op in ('>=', '>') else 'highest'} {worst:.4g}")
    return "; ".join(failed)


def aggregate(table, factors: list[str], metrics: list[str]):
    """Mean, standard error and n over seeds per cell of the other grid factors (a DataFrame with
    the factor columns, `n`, each metric's mean under its name and its standard error as `<m>_se`)."""
    import pandas as pd

    keys = [f for f in factors if f in table and f not in SEED_COLUMNS]
    groups = table.groupby(keys, dropna=False, sort=False) if keys else [((), table)]
    rows = []
    for key, group in groups:
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row["n"] = len(group)
        for m in metrics:
            values = pd.to_numeric(group[m], errors="coerce").dropna()
            row[m] = float(values.mean()) if len(values) else math.nan
            row[f"{m}_se"] = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


@dataclasses.dataclass(frozen=True)
class LawRule:
    claim: str
    says: str
    fit: str  # the `synthlab fit --save` JSON, relative to the results directory
    table: str = "results.csv"  # the table that fit was fitted to (steps.csv for the step-wise law)
    min_r2: float = 0.9
    min_holdout_r2: float = 0.8
    holdout: str = "size"  # the hold-out kind the saved fit must carry; "" for none
    lack_of_fit_level: float = 0.05  # the lack-of-fit test rejects the law's form below this p; 0 = off
    presets: tuple[str, ...] = ()

    def applies_to(self, preset: str) -> bool:
        return not self.presets or preset in self.presets

    def __post_init__(self) -> None:
        if not 0 <= self.min_r2 <= 1 or not self.min_holdout_r2 <= 1 or not 0 <= self.lack_of_fit_level < 1:
            raise SynthlabError(f"law '{self.says}': need 0 <= min_r2 <= 1, min_holdout_r2 <= 1 and "
                                "0 <= lack_of_fit_level < 1")

    def condition(self) -> str:
        held = f", every {self.holdout} hold-out's test R^2 >= {self.min_holdout_r2:g}" if self.holdout else ""
        form = (f"no lack of fit beyond seed noise at p < {self.lack_of_fit_level:g}; "
                if self.lack_of_fit_level else "")
        return (f"{self.fit}: {form}converged, plausible constants, bootstrap intervals from >= 90% converged refits, "
                f"R^2 >= {self.min_r2:g}{held}")


def parse_law_rules(raw: Any, where: str) -> tuple[LawRule, ...]:
    """The `[[laws]]` tables of a definition, checked."""
    from synthlab.config import from_dict

    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise SynthlabError(f"{where}: `laws` must be an array of tables ([[laws]])")
    return tuple(from_dict(LawRule, table, where=f"{where}: law {i}: ") for i, table in enumerate(raw, 1))
