"""A rule's direction and regime: one-sided rules with an equivalence reported beside them, and
`regime` conditions that turn a table outside the claim's regime into "not tested: out of regime"."""

from __future__ import annotations

import pandas as pd
import pytest
from test_verdicts import FAKE

from synthlab.claims import rules, verdicts
from synthlab.errors import SynthlabError
from synthlab.report.markdown import regime_columns
from synthlab.sweeps import experiments


def _capacity(ratio: float, exposures: int) -> pd.DataFrame:
    """Plain and looped bits/param over three seeds; looped = plain x ratio (seed noise 1%)."""
    rows = []
    for seed, noise in enumerate((1.0, 1.01, 0.99)):
        rows += [
            {"seed": seed, "loops": 1, "bits_per_param": 0.5 * noise, "exposures": exposures, "diameter": 3},
            {"seed": seed, "loops": 4, "bits_per_param": 0.5 * ratio / noise, "exposures": exposures, "diameter": 3},
        ]
    return pd.DataFrame(rows)


def _c1(**kw) -> rules.Rule:
    fields = dict(
        claim="C1",
        says="looping does not add capacity",
        metric="bits_per_param",
        column="loops",
        a=4,
        b=1,
        relative=True,
        expect="below",
        threshold=0.1,
        equivalence=0.1,
        regime=("exposures >= 1000",),
        regime_preset="calib1000-64",
    )
    return rules.Rule(**{**fields, **kw})


def test_the_one_sided_capacity_rule_reads_less_storage_as_reproduced_and_reports_the_equivalence():
    (less,) = verdicts.decide_all([_c1()], _capacity(0.75, 1000), ["seed", "loops"])
    assert less.outcome == "reproduced" and less.estimate == pytest.approx(-0.25, abs=0.01)
    assert less.equivalence() == "not equivalent within +-0.1"  # the old two-sided rule's "contradicted"
    (more,) = verdicts.decide_all([_c1()], _capacity(1.3, 1000), ["seed", "loops"])
    assert more.outcome == "contradicted" and more.low > 0.1
    (same,) = verdicts.decide_all([_c1()], _capacity(1.0, 1000), ["seed", "loops"])
    assert same.outcome == "reproduced" and same.equivalence() == "equivalent within +-0.1"
    text = _c1().condition()
    assert "one-sided 95% upper bound below 0.1" in text and "regime exposures >= 1000" in text
    assert "equivalence within 0 +- 0.1 reported beside" in text


def test_a_table_outside_the_regime_is_not_tested_and_names_the_condition_and_the_preset():
    (verdict,) = verdicts.decide_all([_c1()], _capacity(0.75, 100), ["seed", "loops"])
    assert verdict.outcome == "not tested" and verdict.estimate == pytest.approx(-0.25, abs=0.01)
    assert verdict.why == (
        "out of regime (exposures >= 1000: 6 of 6 compared rows fail, lowest 100; preset `calib1000-64` reaches it)"
    )
    grows = _c1(regime=("distinct(diameter) >= 2",), regime_preset="gpu")
    (one,) = verdicts.decide_all([grows], _capacity(0.75, 1000), ["seed", "loops"])
    assert one.outcome == "not tested" and "distinct(diameter) >= 2: 1 value(s) of diameter" in one.why
    two = pd.concat([_capacity(0.75, 1000), _capacity(0.75, 1000).assign(diameter=8)])
    (both,) = verdicts.decide_all([grows], two, ["seed", "loops", "diameter"])
    assert both.outcome == "reproduced"


def test_a_list_setting_holds_the_value_or_the_row_is_out_of_regime():
    table = _capacity(0.75, 1000).assign(**{"ouroboros.depths": "[2, 4, 8]"})
    rule = _c1(regime=("1 in ouroboros.depths",), regime_preset="")
    (out,) = verdicts.decide_all([rule], table, ["seed", "loops"])
    assert out.why == "out of regime (1 in ouroboros.depths: 6 of 6 compared rows fail)"
    (inside,) = verdicts.decide_all([rule], table.assign(**{"ouroboros.depths": "[1, 2]"}), ["seed", "loops"])
    assert inside.outcome == "reproduced"
    (missing,) = verdicts.decide_all([rule], _capacity(0.75, 1000), ["seed", "loops"])
    assert "neither results.csv nor the preset has ouroboros.depths" in missing.why


def test_the_report_reads_a_regime_setting_from_each_rows_grid_point():
    experiment = experiments.load(FAKE)
    points = experiment.points("smoke")
    table = pd.DataFrame({"point_id": [p.point_id for p in points]})
    rule = _c1(regime=("10 in data.size",))
    sizes = regime_columns(table, [rule], points)["data.size"].tolist()
    assert sizes == [p.config["data"]["size"] for p in points] and set(sizes) == {10, 20}
    assert "data.size" not in regime_columns(table, [_c1()], points)  # only what a regime names


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"regime": ("exposures at least 1000",)}, "`regime` entries look like"),
        ({"equivalence": 0.1, "expect": "within", "margin": 0.1}, "`equivalence` is a margin"),
        ({"equivalence": -0.1}, "`equivalence` is a margin"),
    ],
)
def test_bad_regimes_and_equivalences_are_one_line_errors(fields, message):
    with pytest.raises(SynthlabError, match=message):
        _c1(**fields)
