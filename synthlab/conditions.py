"""Conditions over named numbers, one grammar for the whole lab: `column OP number` (OP one of
>=, <=, >, <).

A verdict's `requires` entries (synthlab.claims) state in it what every compared row of a results
table must have learned ("train_acc_l1 >= 0.99"); `train.schedule.stop_when` (synthlab.training.configs)
states when a training run has learned enough to stop, over the columns its probe logs, several
conditions joined by `and` ("train_acc_l1 >= 0.99 and train_acc_l2 >= 0.99").
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping
from typing import Any

from synthlab.errors import SynthlabError

COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
NUMBER = r"([-+]?[\d.]+(?:[eE][-+]?\d+)?)"
REQUIREMENT = re.compile(rf"^\s*([\w.]+)\s*(>=|<=|>|<)\s*{NUMBER}\s*$")
_AND = re.compile(r"\s+and\s+")

Condition = tuple[str, str, float]  # (column, operator, number)


def parse(text: str, where: str, prefix: str = "") -> list[Condition]:
    """The conditions of `text` ("a >= 1 and b < 0.5"); a column may carry `prefix` (dropped). A
    part that is not `column OP number` is a SynthlabError naming `where`."""
    out = []
    for part in _AND.split(text.strip()):
        found = REQUIREMENT.match(part.strip().removeprefix(prefix))
        try:
            out.append((found[1], found[2], float(found[3])))
        except (TypeError, ValueError):  # no match, or a number like 1.2.3
            raise SynthlabError(
                f"{where}: '{part}' is not 'column >= number' (or <=, >, <; several joined by 'and')"
            ) from None
    return out


def holds(conditions: list[Condition], values: Mapping[str, Any], prefix: str = "") -> bool:
    """Whether every condition holds of `values` (keyed `prefix` + column); a missing or NaN value
    fails every comparison."""
    return all(COMPARE[op](float(values.get(prefix + column, math.nan)), number) for column, op, number in conditions)
