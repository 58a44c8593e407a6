"""What a screen chooses: the setting each arm takes, by the rule its preset states.

A screen preset (`screen = true`) decides no claim; it chooses a setting (a learning rate, say)
that a later preset is set to before that one runs. Its rule sits beside it in the definition, so
the choice is applied by code and the same on every path (the CPU sweep's report, a GPU benchmark):

    [presets.screen1000-64.choose]
    setting = "train.lr"         # the factor column chosen
    metric = "bits_per_param"    # the read-out it is chosen by: the most (mean over seeds)
    per = ["loops"]              # one choice per value of these factor columns (the arms)
    tie = 0.01                   # settings within this of the best count as tied: the lowest is taken
    bracket = true               # a best at the grid's lowest or highest setting is not taken

An arm's choice stands only once every setting of it has a row; until then it reads as waiting.
With `bracket`, an arm whose best is the grid's lowest or highest setting reads "at the grid's
edge" instead: the best may lie beyond it, so the grid is to gain the next setting past that edge
(for every arm, so that the arms stay screened alike) before the arm takes one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from synthlab.errors import SynthlabError

if TYPE_CHECKING:  # pandas only where a table is read: definitions load without it (the CLI starts fast)
    import pandas as pd


@dataclasses.dataclass(frozen=True)
class Choice:
    setting: str
    metric: str
    per: tuple[str, ...] = ()
    tie: float = 0.0
    bracket: bool = False

    def describe(self) -> str:
        arms = f"each value of {', '.join(self.per)} takes" if self.per else "it takes"
        tied = f", the lowest within {self.tie:g} of the best" if self.tie else ""
        inside = ", once that lies inside the grid (not at its lowest or highest setting)" if self.bracket else ""
        return f"{arms} the {self.setting} with the most {self.metric}{tied}{inside}"


def parse_choice(table: Any, where: str) -> Choice:
    """A preset's `choose` table as a Choice, or one error naming what is wrong."""
    if not isinstance(table, dict):
        raise SynthlabError(f"{where}.choose must be a table (setting, metric, per, tie, bracket)")
    unknown = set(table) - {f.name for f in dataclasses.fields(Choice)}
    if unknown:
        raise SynthlabError(
            f"{where}.choose: unknown key(s) {sorted(unknown)} (allowed: setting, metric, per, tie, bracket)"
        )
    for key in ("setting", "metric"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise SynthlabError(f"{where}.choose.{key} must name a column, got {table.get(key)!r}")
    per = table.get("per", [])
    if not isinstance(per, list) or not all(isinstance(p, str) for p in per):
        raise SynthlabError(f"{where}.choose.per must be a list of factor columns, got {per!r}")
    tie = table.get("tie", 0.0)
    if isinstance(tie, bool) or not isinstance(tie, (int, float)) or not math.isfinite(tie) or tie < 0:
        raise SynthlabError(f"{where}.choose.tie must be a finite number >= 0, got {tie!r}")
    bracket = table.get("bracket", False)
    if not isinstance(bracket, bool):
        raise SynthlabError(f"{where}.choose.bracket must be true or false, got {bracket!r}")
    return Choice(setting=table["setting"], metric=table["metric"], per=tuple(per), tie=float(tie), bracket=bracket)


def choose(table: pd.DataFrame, choice: Choice, grid: pd.DataFrame) -> pd.DataFrame:
    """One row per arm (the `per` columns of `grid`, the screen's points' factors): the setting taken
    (`chosen`, NaN while any of the arm's settings has no row in `table`, or with `bracket` while
    the best is at the grid's edge: `edge`, that setting), the metric of each setting (mean over
    its seeds), and how many of the arm's settings have rows (`finished` of `settings`)."""
    import pandas as pd

    missing = [c for c in (*choice.per, choice.setting) if c not in grid] + [
        c for c in (*choice.per, choice.setting, choice.metric) if c not in table
    ]
    if missing:
        raise SynthlabError(f"the screen's choice names column(s) the table lacks: {sorted(set(missing))}")
    keys = list(choice.per)
    rows = []
    for arm, points in grid.groupby(keys, sort=True) if keys else [((), grid)]:
        arm = arm if isinstance(arm, tuple) else (arm,)
        mine = table
        for key, value in zip(keys, arm):
            mine = mine[mine[key] == value]
        means = mine.groupby(choice.setting)[choice.metric].mean().dropna()
        settings = sorted(points[choice.setting].unique())
        if choice.bracket and len(settings) < 3:
            raise SynthlabError(f"choose.bracket needs three settings or more per arm, {arm} has {len(settings)}")
        done = [s for s in settings if s in means.index]
        chosen = edge = math.nan
        if len(done) == len(settings):
            best = means.loc[done].max()
            chosen = min(s for s in done if means[s] >= best - choice.tie)
            if choice.bracket and chosen in (settings[0], settings[-1]):
                chosen, edge = math.nan, chosen
        rows.append(
            {
                **dict(zip(keys, arm)),
                "chosen": chosen,
                "edge": edge,
                "finished": len(done),
                "settings": len(settings),
                **{f"{choice.metric} at {_shown(s)}": means[s] for s in done},
            }
        )
    return pd.DataFrame(rows)


def choice_lines(chosen: pd.DataFrame, choice: Choice) -> list[str]:
    """The report's lines: the rule, then each arm's choice (or how many settings it still waits for)."""
    import pandas as pd

    lines = [f"Choice (the screen's stated rule: {choice.describe()}):", ""]
    for _, row in chosen.iterrows():
        arm = ", ".join(f"{k} {_shown(row[k])}" for k in choice.per) or "all"
        read = [f"{c.split(' at ')[1]}: {row[c]:.3f}" for c in chosen.columns if c.startswith(f"{choice.metric} at ")]
        read = [r for r in read if not r.endswith("nan")]
        if pd.notna(row["edge"]):
            lines.append(
                f"- {arm}: at the grid's edge ({choice.setting} {_shown(row['edge'])} is best: {', '.join(read)}):"
                f" the grid gains the next {choice.setting} beyond it before this arm takes one"
            )
        elif pd.isna(row["chosen"]):
            so_far = f": {', '.join(read)}" if read else ""
            lines.append(
                f"- {arm}: waiting ({int(row['finished'])} of {int(row['settings'])} settings finished{so_far})"
            )
        else:
            lines.append(
                f"- {arm}: **{choice.setting} {_shown(row['chosen'])}** ({choice.metric} by setting: {', '.join(read)})"
            )
    return lines


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
