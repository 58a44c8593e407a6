"""Verdicts by a stated rule: each claim of an experiment decided from its results table, over seeds.

An experiment definition states its rules as `[[verdicts]]` tables (fields: `Rule`), e.g.

    [[verdicts]]
    claim = "C2"
    says = "Loop 1x3 beats Base 1x1 at equal unique parameters"
    metric = "accuracy"                  # a column, or "col1 - col2" (a difference within a row)
    column = "model"                     # the compared column (a grid factor or a descriptor) ...
    a = "1x3"                            # ... the statistic is a - b
    b = "1x1"
    each = ["L"]                         # optional: the claim holds in every cell of these columns
    expect = "above"                     # above / below threshold, or within threshold +- margin
    presets = ["gpu"]                    # optional: only these presets' grids test it
    requires = ["train_acc_l1 >= 0.99"]  # optional: what every compared row must have learned
    units = ["d_model"]                  # optional: also replicate over these columns (below)

The statistic is computed once per seed (the unit of replication: the `seed` and `data_seed`
columns; a table without them is one seed; with `units`, once per seed and value of those columns
too, e.g. once per model size when a scaling grid has one seed per size) and per cell of `each`
(one cell without it): the mean over the matched rows (`match`, default the grid factors both arms
span alike) of mean(a) - mean(b) (divided by |mean(b)| with `relative`), or the mean of a's rows
alone without `b`; with `x`, b's rows are a curve along column x, read at each a row's x by linear
interpolation (accuracy against mean exit step). Over the n seeds of a cell: the mean and its
one-sided bounds at `level` (`synthlab.intervals`: on the logit scale of an accuracy's range, with
the test set's noise; Student-t otherwise). Per cell, with Holm's adjustment over the rule's cells
(the family whose error is controlled):
- "reproduced": the claim's one-sided test rejects its null (the bound lies on the expected side
  of `threshold`; for `within`, both bounds inside threshold +- margin: two one-sided tests);
- "contradicted": the opposite test rejects (the bound lies wholly on the other side; for
  `within`, wholly outside the band);
- "inconclusive": neither.
The rule is "reproduced" only if every cell is, "contradicted" if any cell is, else
"inconclusive"; the cell that decided it is named. Also:
- "too few seeds": a cell has n < min_seeds (the estimate is shown, no interval is claimed);
- "no data": no row (or no pair) the rule can use;
- "not tested": a compared row fails a `requires` condition: the models did not learn what the
  claim builds on (e.g. the single operations, the attribute values), so neither "reproduced" nor
  "contradicted" would mean anything; the estimate and interval are still shown.
The row's text is generated from these fields (`Rule.condition`) after its one-line `says`, and a
`says` that speaks of "each" cell without `each` is refused, so the words and the test agree.

A claim that the loss follows a law is stated as a `[[laws]]` table (fields: `LawRule`) and decided
from the fit `synthlab fit ... --save` wrote beside the results table (`synthlab.law_verdicts`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from typing import Any

from synthlab.errors import SynthlabError
from synthlab.rule_data import REQUIREMENT, SEED_COLUMNS, cells, seed_values, unmet_requirements

EXPECT = ("above", "below", "within")
OUTCOMES = ("reproduced", "contradicted", "inconclusive", "too few seeds", "no data", "not tested", "not identified")
EACH_WORDS = re.compile(r"\beach\b|\bat l = L\b")  # a `says` with these claims a result per cell


def fingerprint(rule) -> str:
    """A short hash of what decides a rule (`Rule` or `LawRule`): see `table_fingerprint`."""
    return table_fingerprint(type(rule), {f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)})


def table_fingerprint(kind: type, table: dict) -> str:
    """The hash of a rule's fields as written (a `[[verdicts]]` / `[[laws]]` table, parsed or not):
    every field but its wording `says`; fields at their default are left out, so that adding a
    field to the rule type changes no existing rule's hash; 1.0 and 1, a tuple and a list alike."""
    def canon(value):
        if isinstance(value, (list, tuple)):
            return [canon(v) for v in value]
        if isinstance(value, dict):
            return {k: canon(v) for k, v in value.items()}
        return int(value) if isinstance(value, float) and value.is_integer() else value

    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(kind)}
    kept = {k: canon(v) for k, v in table.items() if k in defaults and k != "says" and canon(v) != canon(defaults[k])}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


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
    each: tuple[str, ...] = ()  # the claim holds in every cell of these columns: decided per cell

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
        if EACH_WORDS.search(self.says) and not self.each:
            raise SynthlabError(f"verdict '{self.says}': it speaks of each cell; say which with `each`")
        if set(self.each) & {self.column, self.x, *(self.match or ()), *self.units}:
            raise SynthlabError(f"verdict '{self.says}': `each` columns cannot also be compared, matched or units")

    def condition(self) -> str:
        """The rule in words, from its fields: "accuracy[model=1x3] - accuracy[model=1x1], in every
        L (Holm over the cells), one-sided 95% bound above 0"."""
        arm = lambda v: f"{self.metric}[{self.column}={v}]" if self.column else self.metric  # noqa: E731
        stat = arm(self.a) if self.b is None else f"{arm(self.a)} - {arm(self.b)}"
        if self.relative:
            stat = f"({stat}) / |{arm(self.b)}|"
        if self.x:
            stat += f" along {self.x}"
        if self.where:
            stat += " where " + ", ".join(f"{k} = {v}" for k, v in self.where.items())
        if self.match:
            stat += f", paired on {', '.join(self.match)}"
        if self.units:
            stat += f", one replicate per {' x '.join(('seed', *self.units))}"
        if self.each:
            stat += f", in every {' x '.join(self.each)} (Holm over the cells)"
        level = f"{round(100 * self.level)}%"
        bound = (f"both one-sided {level} bounds inside {self.threshold:g} +- {self.margin:g}"
                 if self.expect == "within" else
                 f"one-sided {level} {'lower' if self.expect == 'above' else 'upper'} bound {self.expect} {self.threshold:g}")
        needs = f"; every compared row {' and '.join(self.requires)}" if self.requires else ""
        return f"{stat}: {bound}{needs}"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One cell of a rule's `each` (the whole table without it), decided with Holm's adjustment."""
    label: str  # "L=2" ("" without `each`)
    outcome: str
    estimate: float
    low: float  # the one-sided lower / upper bounds at the rule's level (NaN with too few seeds)
    high: float
    n: int
    p: float  # Holm-adjusted p of the test that decided it (the claim's, or its opposite's if contradicted)
    replicates: tuple[float, ...] = ()
    seeds_needed: int | None = 0  # for a decisive interval at the observed effect (None: no number)


@dataclasses.dataclass(frozen=True)
class Verdict:
    rule: Rule | LawRule
    outcome: str
    estimate: float  # the deciding cell's mean over seeds (NaN without data); for a law, its (lowest) in-sample R^2
    low: float  # the deciding cell's bounds (NaN without one, and for a law)
    high: float
    n: int  # replicates: seeds (times the values of the rule's `units`); for a law, the rows fitted
    why: str = ""  # for "no data": what the table lacks; "not tested": the unmet requirement; a law:
    # what decided it
    replicates: tuple[float, ...] = ()  # the deciding cell's statistic per replicate, in seed order
    cells: tuple[Cell, ...] = ()
    decided_by: str = ""  # the deciding cell's label ("" without `each`)
    fixed: str = ""  # when the rule was fixed (`frozen`)
    exploratory: bool = False  # the rule was not fixed before its data

    def per_replicate(self, most: int = 12) -> str:
        """"per replicate: -0.27, -0.19, -0.03" (empty for one replicate, a law, or more than `most`)."""
        if not 1 < len(self.replicates) <= most:
            return ""
        return "per replicate: " + ", ".join(f"{s:+.3g}" for s in self.replicates)

    def per_cell(self) -> str:
        """"L=2: reproduced +0.161 [0.14, 0.18] p 0.002; L=3: inconclusive ...; decided by L=3"
        (empty without `each`)."""
        if not self.decided_by:
            return ""
        parts = [f"{c.label}: {c.outcome} {c.estimate:+.3g}" + ("" if math.isnan(c.low) else
                 f" [{c.low:.3g}, {c.high:.3g}] Holm p {c.p:.2g}") for c in self.cells]
        return "; ".join(parts) + f"; decided by {self.decided_by}"

    def seeds_needed(self) -> str:
        """The seeds the observed spread says a decisive interval at the observed effect needs, per
        cell: "3", "L=2: 3; L=3: none on this test set" (its shared noise alone is as large as the
        effect), "no effect observed"; empty for a law or without an interval."""
        def words(n: int | None) -> str:
            return "none on this test set" if n is None else "no effect observed" if n == 0 else str(n)

        cells = [c for c in self.cells if c.n >= 2 and not math.isnan(c.low)]
        if not cells or not isinstance(self.rule, Rule):
            return ""
        if len(cells) == 1:
            return words(cells[0].seeds_needed)
        return "; ".join(f"{c.label}: {words(c.seeds_needed)}" for c in cells)

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


def record_rules(info: dict, experiment, preset: str, starting: bool) -> None:
    """Into a sweep.json dict: the seeds run (a preset's `seeds`, or `--seeds`), the time the first
    point starts (`data_began`, when `starting`: points to run and no results yet) and each rule's
    fingerprint with the time it was first seen (`rules`), so that a report can tell a rule fixed
    before the data from one changed after it."""
    import datetime

    if "seeds" in experiment.presets[preset] or "seeds" in info:
        info["seeds"] = experiment.presets[preset].get("seeds", 1)

    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
    if starting:
        info.setdefault("data_began", now)
    for rule in (*experiment.verdicts, *experiment.laws):
        info.setdefault("rules", {}).setdefault(fingerprint(rule), now)


def frozen(info: dict, rule) -> tuple[str, bool]:
    """(the date the rule was fixed, whether it changed after its data began) from a sweep.json:
    its `data_began` and the time each rule fingerprint was first seen (`rules`, recorded by the
    sweep, or dated from git with `rules_from`: there a rule first committed with the data counts
    as after it, since runs come before their commit)."""
    import datetime

    began, seen = info.get("data_began"), info.get("rules")
    if not began or seen is None:
        return "not recorded", False
    fixed = seen.get(fingerprint(rule))
    if fixed is None:
        return "after the data", True
    when = datetime.datetime.fromisoformat
    after = when(fixed) >= when(began) if info.get("rules_from") else when(fixed) > when(began)
    return fixed[:10], after


def parse_rules(raw: Any, where: str) -> tuple[Rule, ...]:
    """The `[[verdicts]]` tables of a definition, checked."""
    from synthlab.serialize import from_dict

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


def seed_statistics(rule: Rule, table, factors: list[str]) -> list[float]:
    """The rule's statistic once per seed, over the whole table (`each` aside)."""
    return [s.value for s in seed_values(rule, table, factors)]


def _cell(rule: Rule, label: str, values: list, family: int) -> tuple[Cell, Any]:
    """A cell before Holm: its Cell (outcome "", p the raw p's) and its SeedEstimate (None with too few)."""
    import numpy as np

    from synthlab import intervals
    from synthlab.rule_data import bounds

    stats = np.array([v.value for v in values])
    estimate, replicates = float(stats.mean()), tuple(float(s) for s in stats)
    if len(values) < rule.min_seeds:
        return Cell(label, "too few seeds", estimate, math.nan, math.nan, len(values), math.nan, replicates), None
    test_var = float(np.nanmean([v.test_var for v in values])) if any(v.test_var == v.test_var for v in values) else 0.0
    prompts = float(np.nanmin([v.prompts for v in values])) if any(v.prompts == v.prompts for v in values) else 1000.0
    est = intervals.SeedEstimate.of(stats, test_var, bounds(rule), prompts)
    low, high = float(est.bound(rule.level, "low")), float(est.bound(rule.level, "high"))
    needed = intervals.seeds_needed(stats, test_var, bounds(rule), rule.expect, rule.threshold, rule.margin,
                                    (1 - rule.level) / family, prompts=prompts)  # Bonferroni over the cells
    return Cell(label, "", estimate, low, high, len(values), math.nan, replicates, needed), est


def decide(rule: Rule, by_cell: dict[str, list]) -> Verdict:
    """The outcome of `rule` from its per-seed values (`rule_data.SeedValue`) in each cell."""
    import numpy as np

    from synthlab import intervals

    by_cell = {k: v for k, v in by_cell.items() if v}
    if not by_cell:
        return Verdict(rule, "no data", math.nan, math.nan, math.nan, 0)
    made = [_cell(rule, label, values, len(by_cell)) for label, values in by_cell.items()]
    tested = [(i, est) for i, (_, est) in enumerate(made) if est is not None]
    cells = [c for c, _ in made]
    if tested:
        alpha = 1 - rule.level
        p = np.array([intervals.p_values(est, rule.expect, rule.threshold, rule.margin) for _, est in tested], float)
        claim, against = intervals.holm(p[:, 0]), intervals.holm(p[:, 1])
        for (i, _), pc, pa in zip(tested, claim, against):
            outcome = "reproduced" if pc <= alpha else "contradicted" if pa <= alpha else "inconclusive"
            cells[i] = dataclasses.replace(cells[i], outcome=outcome, p=float(pa if outcome == "contradicted" else pc))
    outcomes = [c.outcome for c in cells]
    if "contradicted" in outcomes:
        decider = min((c for c in cells if c.outcome == "contradicted"), key=lambda c: c.p)
    elif "too few seeds" in outcomes:
        decider = next(c for c in cells if c.outcome == "too few seeds")
    else:
        decider = max((c for c in cells if c.outcome != "reproduced"), key=lambda c: c.p, default=None) or \
            max(cells, key=lambda c: c.p)
    return Verdict(rule, decider.outcome, decider.estimate, decider.low, decider.high, decider.n,
                   replicates=decider.replicates, cells=tuple(cells), decided_by=decider.label)


def evaluate(rules: tuple[Rule, ...] | list[Rule], table, factors: list[str]) -> list[Verdict]:
    """Every rule's verdict on a results table (`factors`: its grid factor columns)."""
    out = []
    for rule in rules:
        split = cells(rule, table)
        verdict = decide(rule, {} if split is None else {k: seed_values(rule, rows, factors) for k, rows in split.items()})
        if verdict.outcome == "no data":
            needed = [*rule.metric.split(" - "), rule.column, rule.x, *(rule.match or ()), *rule.where, *rule.each]
            missing = [c for c in dict.fromkeys(needed) if c is not None and c not in table]
            why = f"results.csv has no {', '.join(missing)}" if missing else "no row or pair the rule can use"
            verdict = dataclasses.replace(verdict, why=why)
        unmet = unmet_requirements(rule, table)
        if unmet and verdict.outcome != "no data":
            verdict = dataclasses.replace(verdict, outcome="not tested", why=unmet)
        out.append(verdict)
    return out


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
    from synthlab.serialize import from_dict

    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise SynthlabError(f"{where}: `laws` must be an array of tables ([[laws]])")
    return tuple(from_dict(LawRule, table, where=f"{where}: law {i}: ") for i, table in enumerate(raw, 1))
