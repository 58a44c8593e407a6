"""A claim's stated rule: the `[[verdicts]]` tables of an experiment definition (fields: `Rule`) and
its `[[laws]]` tables (fields: `LawRule`), parsed and checked; each rule's fingerprint (what
`synthlab.claims.prereg` dates from git to tell a rule committed before its data from one written after). How a rule is decided: `synthlab.claims.verdicts` (and `synthlab.claims.law_verdicts` for laws).

A `[[verdicts]]` table, e.g.

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
    regime = ["L >= 2"]                  # optional: where the claim applies (below)
    regime_preset = "gpu"                # optional: the preset whose grid reaches that regime
    units = ["d_model"]                  # optional: also replicate over these columns

`expect` follows the claim's direction: "beats" is `above` (a lower bound), "does not add" is
`below` (an upper bound), and `within` (an equivalence band, two one-sided tests) only where the
claim says "the same"; `equivalence = m` reports beside a one-sided rule whether its two bounds lie
inside 0 +- m, without deciding it. `regime` states where the claim applies, checked before
anything is decided (`rule_data.REGIME`): "exposures >= 1000" (every compared row),
"distinct(diameter) >= 2" (the compared rows span that many values), "1 in ouroboros.depths"
(every compared row's list holds the value; a preset setting the report reads from the grid); a
table outside it reads "not tested: out of regime (...)", naming `regime_preset` where one is given.

The row's text is generated from these fields (`Rule.condition`) after its one-line `says`, and a
`says` that speaks of "each" cell without `each` is refused, so the words and the test agree.

A claim that the loss follows a law is stated as a `[[laws]]` table (fields: `LawRule`) and decided
from the fit `synthlab fit ... --save` wrote beside the results table.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
from typing import Any

from synthlab.claims.per_seed import REGIME, REQUIREMENT
from synthlab.errors import SynthlabError
from synthlab.serialize import from_dict

EXPECT = ("above", "below", "within")
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

    defaults = {
        f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        for f in dataclasses.fields(kind)
    }
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
    regime: tuple[str, ...] = ()  # where the claim applies (`rule_data.REGIME`): outside it the row reads
    # "not tested: out of regime", never reproduced or contradicted
    regime_preset: str = ""  # the preset whose grid reaches the regime, where this one does not
    equivalence: float = 0.0  # > 0: also report whether both bounds lie inside 0 +- this (deciding nothing)
    units: tuple[str, ...] = ()  # columns whose values are further independent replicates (the
    # statistic once per seed and value): independent training runs that are not seeds
    each: tuple[str, ...] = ()  # the claim holds in every cell of these columns: decided per cell
    learned_at: float = 0.5  # a seed whose arm answers at least this share learned, below it stayed
    # stuck (`synthlab.claims.paired.modes`): halfway from chance to 1, so 0.75 on a yes/no task

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
        bad = [r for r in self.regime if not any(form.match(r) for form in REGIME)]
        if bad:
            raise SynthlabError(
                f"verdict '{self.says}': `regime` entries look like 'exposures >= 1000', "
                f"'distinct(diameter) >= 2' or '1 in ouroboros.depths', got {bad}"
            )
        if self.equivalence < 0 or (self.equivalence and self.expect == "within"):
            raise SynthlabError(f"verdict '{self.says}': `equivalence` is a margin > 0 beside a one-sided rule")
        if self.min_seeds < 2 or not 0 < self.level < 1 or self.margin < 0 or not 0 < self.learned_at < 1:
            raise SynthlabError(
                f"verdict '{self.says}': need min_seeds >= 2, 0 < level < 1, margin >= 0, 0 < learned_at < 1"
            )
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
        bound = (
            f"both one-sided {level} bounds inside {self.threshold:g} +- {self.margin:g}"
            if self.expect == "within"
            else f"one-sided {level} {'lower' if self.expect == 'above' else 'upper'} bound {self.expect} {self.threshold:g}"
        )
        needs = f"; every compared row {' and '.join(self.requires)}" if self.requires else ""
        regime = f"; regime {' and '.join(self.regime)}" if self.regime else ""
        beside = f"; equivalence within 0 +- {self.equivalence:g} reported beside" if self.equivalence else ""
        return f"{stat}: {bound}{needs}{regime}{beside}"


def record_rules(info: dict, experiment, preset: str, starting: bool) -> None:
    """Into a sweep.json dict: the seeds run (a preset's `seeds`, or `--seeds`), the time the first
    point starts (`data_began`, when `starting`: points to run and no results yet: the first run's
    start that `synthlab.claims.prereg` compares with the commits of the rules and the preset) and each
    rule's fingerprint with the time it was first seen (`rules`)."""
    if "seeds" in experiment.presets[preset] or "seeds" in info:
        info["seeds"] = experiment.presets[preset].get("seeds", 1)

    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
    if starting:
        info.setdefault("data_began", now)
    for rule in (*experiment.verdicts, *experiment.laws):
        info.setdefault("rules", {}).setdefault(fingerprint(rule), now)


def parse_rules(raw: Any, where: str) -> tuple[Rule, ...]:
    """The `[[verdicts]]` tables of a definition, checked."""
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise SynthlabError(f"{where}: `verdicts` must be an array of tables ([[verdicts]])")
    required = [
        f.name
        for f in dataclasses.fields(Rule)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
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
            raise SynthlabError(
                f"law '{self.says}': need 0 <= min_r2 <= 1, min_holdout_r2 <= 1 and 0 <= lack_of_fit_level < 1"
            )

    def condition(self) -> str:
        held = f", every {self.holdout} hold-out's test R^2 >= {self.min_holdout_r2:g}" if self.holdout else ""
        form = f"no lack of fit beyond seed noise at p < {self.lack_of_fit_level:g}; " if self.lack_of_fit_level else ""
        return (
            f"{self.fit}: {form}converged, plausible constants, bootstrap intervals from >= 90% converged refits, "
            f"R^2 >= {self.min_r2:g}{held}"
        )


def parse_law_rules(raw: Any, where: str) -> tuple[LawRule, ...]:
    """The `[[laws]]` tables of a definition, checked."""
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise SynthlabError(f"{where}: `laws` must be an array of tables ([[laws]])")
    return tuple(from_dict(LawRule, table, where=f"{where}: law {i}: ") for i, table in enumerate(raw, 1))
