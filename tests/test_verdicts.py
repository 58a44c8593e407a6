"""Seeds as a grid axis, verdicts by stated rules over seeds, and the report's claims table."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomllib
from scipy import stats
from typer.testing import CliRunner

from synthlab.claims import rules, verdicts
from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.report.markdown import write_report
from synthlab.sweeps import experiments

FAKE = Path(__file__).parent / "fixtures" / "sweep_fake.toml"


def _raw(**preset) -> dict:
    raw = tomllib.loads(FAKE.read_text())
    raw["presets"]["smoke"].update(preset)
    return raw


# --- seeds ------------------------------------------------------------------------------------


def test_seeds_repeat_every_point_with_the_data_fixed_and_seed_zero_keeps_its_ids():
    plain = experiments.parse(_raw()).points("smoke")
    seeded = experiments.parse(_raw(seeds=3)).points("smoke")
    assert len(seeded) == 3 * len(plain)
    assert [p.factors["seed"] for p in seeded] == [s for s in (0, 1, 2) for _ in plain]  # the outermost axis
    for point in seeded:
        seed = point.factors["seed"]
        assert point.config["train"].get("seed", 0) == seed
        assert ("seed" in point.config["train"]) == (seed != 0)  # the preset's own seed sets nothing
        assert point.config["data"] == plain[0].config["data"] or "data." in str(plain[0].factors)
    # seed 0's points are the one-seed grid's points: finished runs are reused
    assert [p.point_id for p in seeded if p.factors["seed"] == 0] == [p.point_id for p in plain]
    assert experiments.parse(_raw(seeds=[0, 1, 2])).points("smoke") == seeded
    # data seeds are their own axis; the dataset changes, the training seed does not
    both = experiments.parse(_raw(seeds=2, data_seeds=[0, 7])).points("smoke")
    assert len(both) == 4 * len(plain)
    assert {(p.factors["seed"], p.factors["data_seed"], p.config["data"].get("seed", 0)) for p in both} == {
        (s, d, d) for s in (0, 1) for d in (0, 7)
    }


def test_a_preset_that_sets_the_train_seed_keeps_it_for_that_seed():
    raw = _raw(seeds=[3, 4])
    raw["presets"]["smoke"].setdefault("train", {})["seed"] = 4
    points = experiments.parse(raw).points("smoke")
    assert {p.factors["seed"]: p.config["train"]["seed"] for p in points} == {3: 3, 4: 4}


@pytest.mark.parametrize(
    "preset, message",
    [
        ({"seeds": 0}, "seeds must be in 1..100,000"),
        ({"seeds": [1, 1]}, "distinct integers"),
        ({"seeds": [-1]}, "distinct integers"),
        ({"data_seeds": "two"}, "data_seeds"),
        ({"seeds": 2, "grid": {"train.seed": [0, 1]}}, "sets train.seed"),
        ({"seeds": 2, "grid": {"s": [{"label": "x", "train.seed": 3}]}}, "sets train.seed"),
    ],
)
def test_bad_seed_keys_are_one_line_errors(preset, message):
    with pytest.raises(SynthlabError, match=message):
        experiments.parse(_raw(**preset))


def test_every_builtin_verdict_rule_is_well_formed_and_every_claim_has_one():
    claims = {r.claim for name in experiments.available() for r in experiments.load(name).verdicts}
    assert claims >= {f"C{i}" for i in range(1, 11)}


# --- deciding rules ----------------------------------------------------------------------------


def _paired(diffs: list[float], seeds_column: bool = True) -> pd.DataFrame:
    """Two models at two lengths per seed; b - a's mean difference at each seed is diffs[seed]."""
    rows = []
    for seed, d in enumerate(diffs):
        for L in (2, 3):
            base = 0.3 + 0.1 * L + 0.01 * seed
            rows += [
                {"seed": seed, "L": L, "model": "loop", "accuracy": base + d + (0.01 if L == 2 else -0.01)},
                {"seed": seed, "L": L, "model": "base", "accuracy": base},
            ]
    table = pd.DataFrame(rows)
    return table if seeds_column else table.drop(columns="seed")


def _rule(**kw) -> rules.Rule:
    fields = dict(
        claim="C0", says="loop beats base", metric="accuracy", column="model", a="loop", b="base", expect="above"
    )
    return rules.Rule(**{**fields, **kw})


@pytest.mark.parametrize(
    "diffs, rule, outcome",
    [
        ([0.10, 0.12, 0.09], {}, "reproduced"),
        ([-0.10, -0.12, -0.09], {}, "contradicted"),
        ([0.10, -0.12, 0.03], {}, "inconclusive"),
        ([-0.10, -0.12, -0.09], {"expect": "below"}, "reproduced"),
        ([0.10, 0.12, 0.09], {"expect": "below"}, "contradicted"),
        ([0.01, -0.01, 0.005], {"expect": "within", "margin": 0.05}, "reproduced"),
        ([0.30, 0.32, 0.29], {"expect": "within", "margin": 0.05}, "contradicted"),
        ([0.03, 0.06, 0.0], {"expect": "within", "margin": 0.05}, "inconclusive"),
        ([0.10, 0.12], {}, "too few seeds"),
        ([0.10, 0.12, 0.09], {"b": "absent"}, "no data"),
        ([0.10, 0.12, 0.09], {"metric": "nope"}, "no data"),
    ],
)
def test_every_outcome_is_reachable(diffs, rule, outcome):
    verdict = verdicts.decide_all([_rule(**rule)], _paired(diffs), ["seed", "L", "model"])[0]
    assert verdict.outcome == outcome, verdict
    if outcome == "no data":
        assert verdict.summary() in ("no data (no row or pair the rule can use)", "no data (results.csv has no nope)")
    else:
        assert verdict.estimate == pytest.approx(np.mean(diffs))  # paired on L: the per-L offsets cancel
        assert verdict.n == len(diffs)


def test_an_unbounded_statistic_has_one_sided_student_t_bounds_over_seeds():
    diffs = [0.10, 0.12, 0.09, 0.2]
    table = _paired(diffs).rename(columns={"accuracy": "score"})  # not a share: no range to respect
    v = verdicts.decide_all([_rule(level=0.9, metric="score")], table, ["seed", "L", "model"])[0]
    half = stats.t.ppf(0.9, 3) * np.std(diffs, ddof=1) / math.sqrt(4)
    assert (v.low, v.high) == pytest.approx((np.mean(diffs) - half, np.mean(diffs) + half))
    assert "n = 4" in v.summary() and "one-sided 90% lower bound above 0" in v.rule.condition()
    assert v.replicates == pytest.approx(diffs) and v.per_replicate() == "per replicate: +0.1, +0.12, +0.09, +0.2"
    assert v.per_replicate(most=3) == ""


def test_an_accuracy_interval_stays_in_range_and_counts_the_test_set():
    """Three seeds near a ceiling: the bounds stay inside [0, 1]; with the test prompts known
    (n_test) the interval widens by the test set's binomial noise."""
    rows = [{"seed": s, "model": "loop", "accuracy": a} for s, a in enumerate([0.99, 0.97, 0.98])]
    rule = _rule(b=None, threshold=0.9)
    bare = verdicts.decide_all([rule], pd.DataFrame(rows), ["seed", "model"])[0]
    counted = verdicts.decide_all([rule], pd.DataFrame(rows).assign(n_test=100), ["seed", "model"])[0]
    for v in (bare, counted):
        assert 0 < v.low < v.estimate < v.high < 1
    assert counted.low < bare.low and counted.high > bare.high


def test_one_seed_is_too_few_and_says_n():
    v = verdicts.decide_all([_rule()], _paired([0.5], seeds_column=False), ["L", "model"])[0]
    assert v.outcome == "too few seeds" and v.n == 1 and "n = 1 < 3" in v.summary()
    assert math.isnan(v.low) and v.estimate == pytest.approx(0.5)


def test_relative_level_where_and_row_differences():
    table = _paired([0.1, 0.1, 0.1])
    rel = verdicts.seed_statistics(_rule(relative=True, where={"L": 2}), table, ["seed", "L", "model"])
    assert rel == pytest.approx([(0.11) / (0.5 + 0.01 * s) for s in range(3)])
    level = verdicts.seed_statistics(_rule(b=None, where={"L": [3]}), table, ["seed", "L", "model"])
    assert level == pytest.approx([0.6 + 0.01 * s + 0.1 - 0.01 for s in range(3)])
    table = table.assign(other=table["accuracy"] - 0.25)
    assert verdicts.seed_statistics(
        rules.Rule(claim="C0", says="s", metric="accuracy - other", expect="above"), table, []
    ) == pytest.approx([0.25] * 3)


def test_a_curve_is_read_at_the_other_arms_x():
    rows = []
    for seed in range(3):
        rows += [{"seed": seed, "strategy": "static", "step": t, "accuracy": 0.1 * t} for t in (1, 2, 3, 4)]
        rows += [{"seed": seed, "strategy": "gate", "step": x, "accuracy": 0.1 * x + 0.05} for x in (1.5, 2.5, 9)]
    rule = _rule(column="strategy", a="gate", b="static", x="step")
    # x = 9 is outside the static curve and is left out; the others sit 0.05 above it
    assert verdicts.seed_statistics(rule, pd.DataFrame(rows), ["seed", "strategy"]) == pytest.approx([0.05] * 3)


def test_rows_without_a_seed_value_are_one_seed_of_their_own():
    """A one-seed sweep extended with `seeds = 3`: its first rows have no seed or data_seed value."""
    rows = []
    for seed in range(3):
        unit = {"seed": float("nan"), "data_seed": float("nan")} if seed == 0 else {"seed": seed, "data_seed": 0}
        rows += [{**unit, "strategy": "static", "step": t, "accuracy": 0.1 * t} for t in (1, 2, 3, 4)]
        rows += [{**unit, "strategy": "gate", "step": 2.5, "accuracy": 0.25 + 0.01 * seed}]
    rule = _rule(column="strategy", a="gate", b="static", x="step")
    assert sorted(verdicts.seed_statistics(rule, pd.DataFrame(rows), ["seed", "strategy"])) == pytest.approx(
        [0.0, 0.01, 0.02]
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"expect": "higher"}, "expect must be"),
        ({"column": None, "b": "base"}, "need `column`"),
        ({"x": "step", "b": None}, "set `b`"),
        ({"min_seeds": 1}, "min_seeds"),
    ],
)
def test_bad_rules_are_one_line_errors(fields, message):
    with pytest.raises(SynthlabError, match=message):
        _rule(**fields)
    raw = _raw()
    raw["verdicts"] = [{"claim": "C0", "says": "s", "metric": "m", "expect": "above", "colour": 1}]
    with pytest.raises(SynthlabError, match="unknown config key '.*verdict 1: colour' for Rule"):
        experiments.parse(raw)
    raw["verdicts"] = [{"claim": "C0", "says": "s", "metric": "m"}]
    with pytest.raises(SynthlabError, match=r"verdict 1: missing \['expect'\]"):
        experiments.parse(raw)


# --- the report -------------------------------------------------------------------------------


def test_report_prints_the_claims_table_and_means_over_seeds(tmp_path):
    definition = tmp_path / "paired.toml"
    text = FAKE.read_text().replace('name = "sweep_fake"', 'name = "paired"')
    definition.write_text(
        text + '\n[[verdicts]]\nclaim = "C2"\nsays = "loop beats base"\nmetric = "accuracy"\n'
        'column = "model"\na = "loop"\nb = "base"\nexpect = "above"\n'
    )
    sweep_dir = tmp_path / "runs"
    sweep_dir.mkdir()
    table = _paired([0.10, 0.12, 0.09]).assign(
        point_id=lambda t: [f"p{i}" for i in range(len(t))], run_dir="r", wall_s=1.0
    )
    table.to_csv(sweep_dir / "results.csv", index=False)
    (sweep_dir / "sweep.json").write_text(
        json.dumps(
            {
                "experiment": "paired",
                "preset": "smoke",
                "claim": "C2",
                "title": "t",
                "plot": "none",
                "definition": str(definition),
            }
        )
    )
    out = tmp_path / "README.md"
    result = CliRunner().invoke(app, ["report", str(sweep_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    claims = text[text.index("## Claims") : text.index("## paired")]
    condition = "accuracy[model=loop] - accuracy[model=base]: one-sided 95% lower bound above 0"
    assert f"| C2 | paired | loop beats base: {condition} | reproduced (exploratory) | +0.1033 |" in claims
    # outside git and without a recorded start: exploratory (`synthlab.claims.prereg`)
    assert "| 3 | exploratory: first run not recorded; rule not committed; preset not committed |" in claims
    assert "- C2, loop beats base: **reproduced: +0.1033" in text
    assert "preset not committed); per replicate: +0.1, +0.12, +0.09" in text  # in seed order
    # one row per (model, L) cell: the mean and standard error over the three seeds, and n
    cell = table[(table["model"] == "base") & (table["L"] == 2)]["accuracy"]
    assert f"| {cell.mean():.4g} ± {cell.std(ddof=1) / math.sqrt(3):.4g} |" in text


def test_the_report_finds_a_shipped_definition_from_any_directory(tmp_path, monkeypatch):
    exit_results = Path(__file__).resolve().parent.parent / "results" / "exit"  # three seeds, committed
    monkeypatch.chdir(tmp_path)  # no experiments/ here: the committed sweep.json names experiments/exit.toml
    write_report([exit_results], tmp_path / "report.md")
    text = (tmp_path / "report.md").read_text()
    assert "states no rule" not in text and "| C6 | exit |" in text


@pytest.mark.parametrize("name", experiments.available())
def test_every_rule_names_arms_its_presets_train(name):
    """A rule that applies to a claim-testing preset (cpu, gpu) compares values that preset's grid trains
    (else it could only say "no data"); columns made by evaluation (kv, strategy) are not checked."""
    from synthlab.sweeps.results_table import describe, factor_column
    from synthlab.training.configs import parse_point

    experiment = experiments.load(name)
    for preset in [p for p in experiment.presets if p in ("cpu", "gpu")]:
        values: dict[str, set[str]] = {}
        for point in experiment.points(preset):
            columns = {factor_column(axis): value for axis, value in point.factors.items()}
            parsed = parse_point(point.config)
            if parsed.model is not None:  # a model-training point (not the OUROBOROS system's)
                columns = {**describe(parsed), **columns}
            for column, value in columns.items():
                values.setdefault(column, set()).add(str(value))
        for rule in experiment.verdicts:
            if rule.column is None or not rule.applies_to(preset):
                continue
            for arm in (rule.a, rule.b):
                if arm is not None and rule.column in values:
                    assert str(arm) in values.get(rule.column, set()), (
                        f"{name} preset {preset}: rule '{rule.says}' compares {rule.column} = {arm!r}, "
                        f"which the grid does not train ({sorted(values.get(rule.column, set()))})"
                    )


def test_a_rule_scoped_to_other_presets_is_listed_untested_not_decided():
    from synthlab.report.markdown import _verdict_lines

    parsed = rules.parse_rules(
        [
            {
                "claim": "C0",
                "says": "loop beats base",
                "metric": "accuracy",
                "column": "model",
                "a": "loop",
                "b": "base",
                "expect": "above",
                "presets": ["cpu"],
            },
            {
                "claim": "C0",
                "says": "big loop beats big base",
                "metric": "accuracy",
                "column": "model",
                "a": "big",
                "b": "base",
                "expect": "above",
                "presets": ["gpu"],
            },
        ],
        "test",
    )
    assert parsed[0].presets == ("cpu",) and parsed[0].applies_to("cpu") and not parsed[1].applies_to("cpu")
    lines, found = _verdict_lines(
        parsed, (), _paired([0.10, 0.12, 0.09]), ["L", "model", "seed"], {"preset": "cpu"}, Path(".")
    )
    assert [v.rule.says for v in found] == ["loop beats base"] and found[0].outcome == "reproduced"
    assert any("big loop beats big base: not tested by preset `cpu` (the rule is for `gpu`)" in line for line in lines)


def test_requires_turns_a_verdict_into_not_tested_when_a_compared_model_did_not_learn():
    table = _paired([-0.10, -0.12, -0.09]).assign(train_acc=0.99)
    assert (
        verdicts.decide_all([_rule(requires=("train_acc >= 0.95",))], table, ["L", "model", "seed"])[0].outcome
        == "contradicted"
    )
    table.loc[(table.model == "base") & (table.seed == 1) & (table.L == 3), "train_acc"] = 0.4
    found = verdicts.decide_all([_rule(requires=("train_acc >= 0.95",))], table, ["L", "model", "seed"])[0]
    assert found.outcome == "not tested" and "1 of 12 compared rows fail, lowest 0.4" in found.why
    assert found.n == 3 and found.high < 0  # the estimate and interval are still there to read
    assert "not tested (requires train_acc >= 0.95" in found.summary()
    # rows outside the compared arms do not count
    other = pd.concat([table.assign(train_acc=0.99), table.assign(model="other", train_acc=0.0)])
    assert (
        verdicts.decide_all([_rule(requires=("train_acc >= 0.95",))], other, ["L", "model", "seed"])[0].outcome
        == "contradicted"
    )
    missing = verdicts.decide_all([_rule(requires=("nope > 0",))], table, ["L", "model", "seed"])[0]
    assert missing.outcome == "not tested" and "results.csv has no nope" in missing.why


def test_requires_must_read_column_op_number():
    with pytest.raises(SynthlabError, match="requires"):
        _rule(requires=("train_acc is high",))


def test_units_replicate_over_a_column_when_each_value_is_an_independent_run():
    rng = np.random.default_rng(0)
    rows = [
        {
            "d_model": d,
            "checkpoint": c,
            "loops": loops,
            "eval_loss": 3.0 - 0.1 * c - (0.2 if loops == 4 else 0.0) + 0.01 * rng.standard_normal(),
        }
        for d in (24, 32, 48, 128)
        for c in (1, 2)
        for loops in (1, 4)
    ]
    for row in rows:  # the size's own offset tells the replicates apart
        row["eval_loss"] -= 0.001 * row["d_model"] * (row["loops"] == 4)
    rule = rules.Rule(
        claim="C5",
        says="4 loops below 1",
        metric="eval_loss",
        column="loops",
        a=4,
        b=1,
        match=("checkpoint",),
        units=("d_model",),
        expect="below",
    )
    found = verdicts.decide_all([rule], pd.DataFrame(rows), ["d_model", "loops", "checkpoint"])[0]
    assert found.n == 4 and found.outcome == "reproduced" and found.estimate == pytest.approx(-0.258, abs=0.02)
    assert np.argsort(found.replicates).tolist() == [3, 2, 1, 0]  # d_model 24, 32, 48, 128 in numeric order
    assert "one replicate per seed x d_model" in rule.condition()
    without = dataclasses.replace(rule, units=(), match=("d_model", "checkpoint"))  # one seed: no interval
    assert (
        verdicts.decide_all([without], pd.DataFrame(rows), ["d_model", "loops", "checkpoint"])[0].outcome
        == "too few seeds"
    )


# --- per-cell rules, rule freezing -----------------------------------------------------------


def _cells_table(by_L: dict[int, list[float]]) -> pd.DataFrame:
    """Loop minus base differences per seed at each L (a loss-like score: no range, no test set)."""
    return pd.DataFrame(
        [
            {"seed": s, "L": L, "model": m, "score": 1.0 + (d if m == "loop" else 0.0)}
            for L, diffs in by_L.items()
            for s, d in enumerate(diffs)
            for m in ("loop", "base")
        ]
    )


def test_each_decides_per_cell_with_holm_and_names_the_deciding_cell():
    from synthlab.claims import intervals

    table = _cells_table({2: [0.16, 0.15, 0.17], 3: [0.1, -0.02, 0.06]})
    pooled, per_cell = verdicts.decide_all(
        [_rule(metric="score", match=("L",)), _rule(metric="score", each=("L",), says="loop beats base at each L")],
        table,
        ["seed", "L", "model"],
    )
    assert pooled.outcome == "reproduced" and pooled.estimate == pytest.approx(
        np.mean([0.16, 0.15, 0.17, 0.1, -0.02, 0.06])
    )
    assert per_cell.outcome == "inconclusive" and per_cell.decided_by == "L=3"
    assert per_cell.estimate == pytest.approx(0.14 / 3) and [c.outcome for c in per_cell.cells] == [
        "reproduced",
        "inconclusive",
    ]
    raw = [float(intervals.SeedEstimate.of(np.array(d)).p_above(0.0)) for d in ([0.16, 0.15, 0.17], [0.1, -0.02, 0.06])]
    assert [c.p for c in per_cell.cells] == pytest.approx(list(intervals.holm(np.array(raw))))
    assert per_cell.per_cell().startswith("L=2: reproduced +0.16") and per_cell.per_cell().endswith("decided by L=3")
    assert "in every L (Holm over the cells)" in per_cell.rule.condition()
    # contradicted if any cell is, whatever the others say
    worse = verdicts.decide_all(
        [_rule(metric="score", each=("L",))],
        _cells_table({2: [0.16, 0.15, 0.17], 3: [-0.2, -0.22, -0.21]}),
        ["seed", "L", "model"],
    )[0]
    assert worse.outcome == "contradicted" and worse.decided_by == "L=3"


def test_a_rule_that_says_each_must_name_its_cells():
    with pytest.raises(SynthlabError, match="say which with `each`"):
        _rule(says="loop beats base at each diameter")
    with pytest.raises(SynthlabError, match="`each` columns cannot"):
        _rule(each=("model",))


def test_the_fingerprint_ignores_the_wording_and_defaults_and_sees_every_test_field():
    base = rules.fingerprint(_rule())
    assert rules.fingerprint(_rule(says="other words")) == base
    assert (
        rules.fingerprint(_rule(threshold=0))
        == base
        == rules.table_fingerprint(
            rules.Rule,
            {
                "claim": "C0",
                "says": "x",
                "metric": "accuracy",
                "column": "model",
                "a": "loop",
                "b": "base",
                "expect": "above",
                "threshold": 0.0,
                "each": [],
            },
        )
    )
    assert (
        len(
            {
                base,
                rules.fingerprint(_rule(threshold=0.1)),
                rules.fingerprint(_rule(each=("L",))),
                rules.fingerprint(_rule(expect="below")),
            }
        )
        == 4
    )
