"""Verdicts by a stated rule: each claim of an experiment decided from its results table, over seeds.

The rules are an experiment definition's `[[verdicts]]` tables (`synthlab.claims.rules.Rule`). The
statistic is computed once per seed (the unit of replication: the `seed` and `data_seed`
columns; a table without them is one seed; with `units`, once per seed and value of those columns
too, e.g. once per model size when a scaling grid has one seed per size) and per cell of `each`
(one cell without it): the mean over the matched rows (`match`, default the grid factors both arms
span alike) of mean(a) - mean(b) (divided by |mean(b)| with `relative`), or the mean of a's rows
alone without `b`; with `x`, b's rows are a curve along column x, read at each a row's x by linear
interpolation (accuracy against mean exit step). Over the n seeds of a cell: the mean and its
one-sided bounds at `level` (`synthlab.claims.intervals`: on the logit scale of an accuracy's range, with
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
- "not tested: out of regime (...)": the compared rows lie outside the rule's `regime`, the
  conditions under which the claim applies (1000 exposures for a capacity, the paper's training
  fractions, two diameters for a growth with D, trained depths only); checked first;
- "not tested": a compared row fails a `requires` condition: the models did not learn what the
  claim builds on (e.g. the single operations, the attribute values), so neither "reproduced" nor
  "contradicted" would mean anything; the estimate and interval are still shown.
With `equivalence`, `Verdict.equivalence` says beside the outcome whether both bounds lie inside
0 +- that margin (an equivalence the claim does not make, reported, never deciding).

A `[[laws]]` claim (`synthlab.claims.rules.LawRule`) gets its `Verdict` from the saved fit
(`synthlab.claims.law_verdicts`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from synthlab.claims import intervals, paired
from synthlab.claims.per_seed import SEED_COLUMNS, bounds, cells, out_of_regime, seed_values, unmet_requirements
from synthlab.claims.rules import LawRule, Rule

OUTCOMES = ("reproduced", "contradicted", "inconclusive", "too few seeds", "no data", "not tested", "not identified")


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
    statistics: str = ""  # paired or not; learned / stuck seeds per arm (synthlab.claims.paired)


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
    statistics: str = ""  # the deciding cell's: paired or not, learned / stuck seeds per arm

    def per_replicate(self, most: int = 12) -> str:
        """ "per replicate: -0.27, -0.19, -0.03" (empty for one replicate, a law, or more than `most`)."""
        if not 1 < len(self.replicates) <= most:
            return ""
        return "per replicate: " + ", ".join(f"{s:+.3g}" for s in self.replicates)

    def per_cell(self) -> str:
        """ "L=2: reproduced +0.161 [0.14, 0.18] p 0.002; L=3: inconclusive ...; decided by L=3"
        (empty without `each`)."""
        if not self.decided_by:
            return ""
        parts = [
            f"{c.label}: {c.outcome} {c.estimate:+.3g}"
            + ("" if math.isnan(c.low) else f" [{c.low:.3g}, {c.high:.3g}] Holm p {c.p:.2g}")
            for c in self.cells
        ]
        return "; ".join(parts) + f"; decided by {self.decided_by}"

    def equivalence(self) -> str:
        """For a rule with `equivalence` m: "equivalent within +-0.1" (both bounds inside 0 +- m),
        "not equivalent within +-0.1" (a bound wholly outside), "equivalence within +-0.1 undecided";
        empty without the field or an interval."""
        margin = getattr(self.rule, "equivalence", 0.0)
        if not margin or math.isnan(self.low):
            return ""
        band = f"within +-{margin:g}"
        if -margin < self.low and self.high < margin:
            return f"equivalent {band}"
        if self.low >= margin or self.high <= -margin:
            return f"not equivalent {band}"
        return f"equivalence {band} undecided"

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
        """ "reproduced: +0.12 [0.05, 0.19], n = 3", "too few seeds (n = 1 < 3): +0.12"."""
        if self.outcome == "no data":
            return f"no data ({self.why})" if self.why else "no data"
        if self.outcome == "not tested":
            shown = (
                ""
                if math.isnan(self.estimate)
                else f"; estimate {self.estimate:+.4g}"
                + ("" if math.isnan(self.low) else f" [{self.low:.4g}, {self.high:.4g}]")
            )
            return f"not tested ({self.why}){shown}, n = {self.n}"
        if isinstance(self.rule, LawRule):
            return f"{self.outcome} ({self.why}), n = {self.n} rows"
        if self.outcome == "too few seeds":
            bimodal = self.statistics.split("; ")[0] if self.statistics.startswith("bimodal") else ""
            return (
                f"too few seeds ({bimodal or f'n = {self.n} < {self.rule.min_seeds}'}): estimate {self.estimate:+.4g}"
            )
        return f"{self.outcome}: {self.estimate:+.4g} [{self.low:.4g}, {self.high:.4g}], n = {self.n}"


def seed_statistics(rule: Rule, table, factors: list[str]) -> list[float]:
    """The rule's statistic once per seed, over the whole table (`each` aside)."""
    return [s.value for s in seed_values(rule, table, factors)]


def _cell(rule: Rule, label: str, values: list, family: int) -> tuple[Cell, Any]:
    """A cell before Holm: its Cell (outcome "", p the raw p's) and its SeedEstimate (None with too few)."""
    stats = np.array([v.value for v in values])
    estimate, replicates = float(stats.mean()), tuple(float(s) for s in stats)
    test_var = float(np.nanmean([v.test_var for v in values])) if any(v.test_var == v.test_var for v in values) else 0.0
    prompts = float(np.nanmin([v.prompts for v in values])) if any(v.prompts == v.prompts for v in values) else 1000.0
    test_var, prompts, statistics, asked = _paired(rule, values, test_var, prompts)
    if len(values) < rule.min_seeds:
        too_few = Cell(label, "too few seeds", estimate, math.nan, math.nan, len(values), math.nan, replicates)
        return dataclasses.replace(too_few, statistics=statistics), None
    est = intervals.SeedEstimate.of(stats, test_var, bounds(rule), prompts)
    low, high = float(est.bound(rule.level, "low")), float(est.bound(rule.level, "high"))
    needed = intervals.seeds_needed(
        stats,
        test_var,
        bounds(rule),
        rule.expect,
        rule.threshold,
        rule.margin,
        (1 - rule.level) / family,
        prompts=prompts,
    )  # Bonferroni over the cells
    if asked > len(values):
        note = f"{paired.too_few_note(len(values), asked, needed)}; {statistics}"
        return Cell(
            label, "too few seeds", estimate, math.nan, math.nan, len(values), math.nan, replicates, needed, note
        ), None
    return Cell(label, "", estimate, low, high, len(values), math.nan, replicates, needed, statistics), est


def _paired(rule: Rule, values: list, test_var: float, prompts: float) -> tuple[float, float, str, int]:
    """(the shared test set's variance, its prompts, how the interval was made, the seeds a bimodal
    arm asks for): the variance measured from per-prompt outcomes where every seed has them
    (`synthlab.claims.paired`), else the binomial bound as given; with each arm's learned / stuck seeds."""
    shared = paired.shared_variance(values)
    how = paired.SEEDS_ONLY if bounds(rule) is None else paired.UNPAIRED
    if shared is not None:
        test_var, prompts, how = shared
    labels = (str(rule.a), str(rule.b)) if rule.column else ("",)
    modes, asked = paired.modes_note([v.arms for v in values if v.arms], labels, rule.level, rule.learned_at)
    return test_var, prompts, "; ".join(p for p in (how, modes) if p), asked


def decide(rule: Rule, by_cell: dict[str, list]) -> Verdict:
    """The outcome of `rule` from its per-seed values (`rule_data.SeedValue`) in each cell."""
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
        decider = max((c for c in cells if c.outcome != "reproduced"), key=lambda c: c.p, default=None) or max(
            cells, key=lambda c: c.p
        )
    return Verdict(
        rule,
        decider.outcome,
        decider.estimate,
        decider.low,
        decider.high,
        decider.n,
        replicates=decider.replicates,
        cells=tuple(cells),
        decided_by=decider.label,
        statistics=decider.statistics,
    )


def decide_all(rules: tuple[Rule, ...] | list[Rule], table, factors: list[str]) -> list[Verdict]:
    """Every rule's verdict on a results table (`factors`: its grid factor columns)."""
    out = []
    for rule in rules:
        split = cells(rule, table)
        verdict = decide(
            rule, {} if split is None else {k: seed_values(rule, rows, factors) for k, rows in split.items()}
        )
        if verdict.outcome == "no data":
            needed = [*rule.metric.split(" - "), rule.column, rule.x, *(rule.match or ()), *rule.where, *rule.each]
            missing = [c for c in dict.fromkeys(needed) if c is not None and c not in table]
            why = f"results.csv has no {', '.join(missing)}" if missing else "no row or pair the rule can use"
            verdict = dataclasses.replace(verdict, why=why)
        unmet = out_of_regime(rule, table)
        unmet = f"out of regime ({unmet})" if unmet else unmet_requirements(rule, table)
        if unmet and verdict.outcome != "no data":
            verdict = dataclasses.replace(verdict, outcome="not tested", why=unmet)
        out.append(verdict)
    return out


def aggregate(table, factors: list[str], metrics: list[str]):
    """Mean, standard error and n over seeds per cell of the other grid factors (a DataFrame with
    the factor columns, `n`, each metric's mean under its name and its standard error as `<m>_se`)."""
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
