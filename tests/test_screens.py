"""synthlab.claims.screens: a screen's stated choice applied to its table (the setting each arm
takes), re-derived here by hand; its refusals; and capacity's screen1000-64 stating its rule."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pandas as pd
import pytest

from synthlab.claims.screens import Choice, choice_lines, choose, parse_choice
from synthlab.errors import SynthlabError
from synthlab.sweeps import experiments

RULE = Choice(setting="train.lr", metric="bits_per_param", per=("loops",), tie=0.01)
GRID = pd.DataFrame(
    [{"loops": t, "train.lr": lr, "seed": 100} for t, lr in itertools.product((1, 4), (1.5e-3, 3e-3, 6e-3))]
)


def table(bits: dict[tuple[int, float], list[float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"loops": t, "train.lr": lr, "seed": s, "bits_per_param": b}
            for (t, lr), bs in bits.items()
            for s, b in enumerate(bs)
        ]
    )


def test_each_arm_takes_the_best_setting_and_the_lowest_within_the_tie():
    bits = {(1, 1.5e-3): [0.80], (1, 3e-3): [0.905], (1, 6e-3): [0.91], (4, 1.5e-3): [0.7], (4, 3e-3): [0.6]}
    bits[(4, 6e-3)] = [0.2, 0.4]  # two seeds: their mean, 0.3
    out = choose(table(bits), RULE, GRID).set_index("loops")
    assert out.loc[1, "chosen"] == 3e-3  # 0.905 is within 0.01 of 0.91: the lower rate
    assert out.loc[4, "chosen"] == 1.5e-3 and out.loc[4, "bits_per_param at 0.006"] == pytest.approx(0.3)
    assert choose(table(bits), Choice("train.lr", "bits_per_param", ("loops",)), GRID).set_index("loops").loc[
        1, "chosen"
    ] == pytest.approx(6e-3)  # no tie: the best


def test_the_choice_matches_a_direct_argmax_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(50):
        values = rng.uniform(0, 1, size=6).round(2)
        bits = {(t, lr): [v] for (t, lr), v in zip(itertools.product((1, 4), (1.5e-3, 3e-3, 6e-3)), values)}
        out = choose(table(bits), RULE, GRID).set_index("loops")
        for t in (1, 4):
            arm = {lr: b[0] for (tt, lr), b in bits.items() if tt == t}
            best = max(arm.values())
            assert out.loc[t, "chosen"] == min(lr for lr, b in arm.items() if b >= best - 0.01)


def test_an_arm_waits_until_every_setting_has_a_row():
    bits = {(1, 1.5e-3): [0.8], (1, 3e-3): [0.9], (4, 1.5e-3): [0.7], (4, 3e-3): [0.6], (4, 6e-3): [0.5]}
    out = choose(table(bits), RULE, GRID)
    assert math.isnan(out.set_index("loops").loc[1, "chosen"]) and out.set_index("loops").loc[4, "chosen"] == 1.5e-3
    lines = choice_lines(out, RULE)
    assert lines[0] == (
        "Choice (the screen's stated rule: each value of loops takes the train.lr with the most bits_per_param, "
        "the lowest within 0.01 of the best):"
    )
    assert "- loops 1: waiting (2 of 3 settings finished: 0.0015: 0.800, 0.003: 0.900)" in lines
    assert (
        "- loops 4: **train.lr 0.0015** (bits_per_param by setting: 0.0015: 0.700, 0.003: 0.600, 0.006: 0.500)" in lines
    )
    empty = table({(4, 1.5e-3): [0.7]})
    assert "- loops 1: waiting (0 of 3 settings finished)" in choice_lines(choose(empty, RULE, GRID), RULE)


@pytest.mark.parametrize(
    "raw, needle",
    [
        ([1], "must be a table"),
        ({"setting": "train.lr"}, "choose.metric must name a column"),
        ({"setting": "train.lr", "metric": "bits", "per": "loops"}, "per must be a list"),
        ({"setting": "train.lr", "metric": "bits", "tie": -1}, "tie must be a finite number >= 0"),
        ({"setting": "train.lr", "metric": "bits", "tie": float("nan")}, "tie must be a finite number >= 0"),
        ({"setting": "train.lr", "metric": "bits", "ties": 0.1}, "unknown key(s) ['ties']"),
        ({"setting": "train.lr", "metric": "bits", "bracket": 1}, "bracket must be true or false"),
    ],
)
def test_a_malformed_choice_is_one_error_naming_it(raw, needle):
    with pytest.raises(SynthlabError, match=None) as err:
        parse_choice(raw, "presets.s")
    assert needle in str(err.value)


def test_bracket_takes_only_a_best_inside_the_grid():
    bracketed = dataclasses.replace(RULE, bracket=True)
    bits = {(1, 1.5e-3): [0.80], (1, 3e-3): [0.91], (1, 6e-3): [0.70], (4, 1.5e-3): [0.9], (4, 3e-3): [0.6]}
    bits[(4, 6e-3)] = [0.895]  # within the tie of the lowest rate's 0.9: the lowest is taken, an edge
    out = choose(table(bits), bracketed, GRID).set_index("loops")
    assert out.loc[1, "chosen"] == 3e-3 and math.isnan(out.loc[1, "edge"])
    assert math.isnan(out.loc[4, "chosen"]) and out.loc[4, "edge"] == 1.5e-3
    assert choose(table(bits), RULE, GRID).set_index("loops").loc[4, "chosen"] == 1.5e-3  # without it: taken
    lines = choice_lines(choose(table(bits), bracketed, GRID), bracketed)
    assert lines[0].endswith("once that lies inside the grid (not at its lowest or highest setting)):")
    assert (
        "- loops 4: at the grid's edge (train.lr 0.0015 is best: 0.0015: 0.900, 0.003: 0.600, 0.006: 0.895):"
        " the grid gains the next train.lr beyond it before this arm takes one"
    ) in lines
    # the grid extended past the edge: the arm waits for the new rate, then takes its best inside
    wider = pd.concat([GRID, pd.DataFrame([{"loops": t, "train.lr": 7.5e-4, "seed": 100} for t in (1, 4)])])
    assert math.isnan(choose(table(bits), bracketed, wider).set_index("loops").loc[4, "chosen"])
    bits |= {(1, 7.5e-4): [0.5], (4, 7.5e-4): [0.85]}
    out = choose(table(bits), bracketed, wider).set_index("loops")
    assert out.loc[1, "chosen"] == 3e-3 and out.loc[4, "chosen"] == 1.5e-3
    with pytest.raises(SynthlabError, match="three settings or more per arm"):
        choose(table(bits), bracketed, GRID[GRID["train.lr"] < 5e-3])


def test_a_choice_naming_a_column_the_table_lacks_is_refused():
    with pytest.raises(SynthlabError, match="lacks"):
        choose(table({(1, 3e-3): [0.9]}), Choice("train.wd", "bits_per_param", ("loops",)), GRID)


def test_choose_belongs_to_screens_and_capacitys_screen_states_its_rule(tmp_path):
    assert experiments.load("capacity").screen_choice("screen1000-64") == dataclasses.replace(RULE, bracket=True)
    assert experiments.load("capacity").screen_choice("calib1000-64") is None  # not a screen
    raw = experiments.load("capacity").source
    definition = tmp_path / "capacity.toml"
    definition.write_text(
        open(raw).read().replace("[presets.calib64]\n", '[presets.calib64]\nchoose = {setting = "x", metric = "y"}\n')
    )
    with pytest.raises(SynthlabError, match="presets.calib64: `choose` states a screen's rule; add screen = true"):
        experiments.load(definition)
