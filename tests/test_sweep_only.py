"""`synthlab sweep --only`: a subset of a grid's points now, the rest later into the same folder."""

from __future__ import annotations

import pytest
from test_sweep import FAKE, RUNNER, _table  # the sweep tests' fake grid and runner

from synthlab.errors import SynthlabError
from synthlab.sweeps import driver, experiments, results_table


def test_only_runs_the_points_it_selects_and_a_later_sweep_the_rest(tmp_path):
    exp = experiments.load(FAKE)
    both = tmp_path / "both"
    results = driver.run_sweep(exp, "smoke", both, runner=RUNNER, progress=False, only=["arch=b", "eval.probe=1"])
    rows = results_table.read_rows(results)
    assert len(rows) == 2 and {(r["arch"], r["eval.probe"]) for r in rows} == {("b", "1")}
    # the rest run into the same folder: the table equals one sweep's
    driver.run_sweep(exp, "smoke", both, runner=RUNNER, progress=False)
    whole = driver.run_sweep(exp, "smoke", tmp_path / "whole", runner=RUNNER, progress=False)
    assert _table(results) == _table(whole)


def test_only_takes_either_value_of_one_column_and_numbers_by_value():
    points = experiments.load(FAKE).points("smoke")
    assert len(driver.select_points(points, ["arch=a", "arch=b"])) == len(points)
    sizes = {p.factors["data.size"] for p in points}
    size = sorted(sizes)[0]
    chosen = driver.select_points(points, [f"data.size={float(size)!r}"])
    assert chosen and all(p.factors["data.size"] == size for p in chosen)


@pytest.mark.parametrize(
    ("only", "message"),
    [(["arch"], "COLUMN=VALUE"), (["colour=red"], "no factor 'colour'"), (["arch=z"], "no point of the grid")],
)
def test_only_refuses_what_selects_nothing(only, message):
    with pytest.raises(SynthlabError, match=message):
        driver.select_points(experiments.load(FAKE).points("smoke"), only)
