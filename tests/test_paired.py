"""synthlab.claims.paired: coverage and power by simulation under four truths, and the per-prompt read-outs.

Each simulated experiment trains `n` seeds and scores two read-outs a and b on one shared test set
of PROMPTS prompts drawn afresh (difficulty q_j); a seed adds its offset on the logit scale. The
truths:
- unimodal: a and b answer independently (two models on the same prompts);
- interaction: a's gain varies by prompt (sd 1 on the logit scale), so the test set's draw of
  prompts moves the difference in every seed alike;
- paired: a and b are two read-outs of one model (one uniform per prompt and seed decides both:
  they disagree only where their probabilities straddle it);
- bimodal: each seed escapes the plateau with chance 1/2; a stuck seed answers near 7% in both
  read-outs (no difference), a learned one near 70% with a's gain.
The truth is the difference of expected accuracies over seeds and prompts. The interval is the one
the verdicts use (`paired.estimate`: seeds' t on the logit scale plus the prompt bootstrap), and
with the bimodal gate (`paired.modes`, `paired.seeds_for_modes`) a bimodal experiment with fewer
seeds than asked makes no statement. Coverage: the share of experiments whose statement does not
exclude the truth, per one-sided 95% bound, at or above 95% less three Monte Carlo standard errors.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import special

from synthlab.claims import paired, per_seed, rules, verdicts
from synthlab.claims.intervals import SeedEstimate, p_values
from synthlab.errors import SynthlabError
from synthlab.report.markdown import write_report

EXPERIMENTS, PROMPTS, LEVEL = 1000, 500, 0.95
MC_ERROR = 3 * math.sqrt(LEVEL * (1 - LEVEL) / EXPERIMENTS)
BOUNDS = (-1.0, 1.0)
TRUTHS = ("unimodal", "interaction", "paired", "bimodal")


def _logits(rng, truth: str, gain: float, shape: tuple[int, ...]):
    """(logit of a, logit of b) per experiment, seed and prompt."""
    experiments, seeds, prompts = shape
    q = rng.normal(size=(experiments, 1, prompts))
    s = 0.3 * rng.normal(size=(experiments, seeds, 1))
    base = 0.5 + s + q
    if truth == "interaction":
        return base + gain + 1.5 * rng.normal(size=(experiments, 1, prompts)), base
    if truth == "bimodal":
        learned = rng.random((experiments, seeds, 1)) < 0.5
        return np.where(learned, base + 0.6 + gain, base - 3.0), np.where(learned, base + 0.6, base - 3.0)
    return base + gain, base


def _truth(truth: str, gain: float) -> float:
    la, lb = _logits(np.random.default_rng(123), truth, gain, (1, 20_000, 100))
    return float((special.expit(la) - special.expit(lb)).mean())


def _experiments(truth: str, gain: float, seeds: int, seed: int):
    """(per-prompt differences (E, n, N), a's and b's per-seed accuracies (E, n))."""
    rng = np.random.default_rng(seed)
    la, lb = _logits(rng, truth, gain, (EXPERIMENTS, seeds, PROMPTS))
    u = rng.random(la.shape)
    a = u < special.expit(la)
    b = (rng.random(la.shape) if truth == "unimodal" else u) < special.expit(lb)
    return a.astype(float) - b, a.mean(-1), b.mean(-1)


def _decided(acc_a, acc_b):
    """Per experiment: whether the bimodal gate lets it make a statement."""
    n = acc_a.shape[-1]
    asked = np.zeros(acc_a.shape[0], int)
    for acc in (acc_a, acc_b):
        learned, _, bimodal = paired.modes(acc)
        need = np.array([paired.seeds_for_modes(k, n, LEVEL) for k in range(n + 1)])[learned]
        asked = np.maximum(asked, np.where(bimodal, need, 0))
    return asked <= n


def _run(truth: str, gain: float, seeds: int, seed: int = 0):
    """(coverage of the low bound, of the high bound, power: share calling a > b, share decided)."""
    diff, acc_a, acc_b = _experiments(truth, gain, seeds, seed)
    est = paired.estimate(diff, BOUNDS, np.random.default_rng(seed))
    decided = _decided(acc_a, acc_b)
    low, high = est.bound(LEVEL, "low"), est.bound(LEVEL, "high")
    true = _truth(truth, gain)
    wrong_low, wrong_high = decided & (low > true), decided & (high < true)
    above = decided & (p_values(est, "above", 0.0, 0.0)[0] <= 1 - LEVEL)
    return 1 - wrong_low.mean(), 1 - wrong_high.mean(), above.mean(), decided.mean(), diff, true


CASES = [(t, g, 3) for t in TRUTHS[:3] for g in (0.0, 0.3)] + [("bimodal", g, 8) for g in (0.0, 0.3)]


@pytest.mark.parametrize(("truth", "gain", "seeds"), CASES)
def test_one_sided_bounds_cover_the_truth_at_their_level(truth, gain, seeds):
    low, high, power, decided, _, true = _run(truth, gain, seeds)
    print(f"{truth}, {seeds} seeds, truth {true:+.3f}: cover {low:.3f} / {high:.3f}, a > b in {power:.3f}")
    assert low >= LEVEL - MC_ERROR and high >= LEVEL - MC_ERROR
    if gain == 0:  # no effect: "a beats b" at most as often as the level allows
        assert power <= 1 - LEVEL + MC_ERROR
    if truth != "bimodal":
        assert decided == 1.0  # one mode: every experiment makes its statement


def test_paired_read_outs_have_power_where_independent_binomials_have_none():
    """Two read-outs of one model, a +2.6-point true gain, 3 seeds: the paired interval calls it in
    most experiments; the binomial bound of two independent arms in almost none."""
    _, _, power, _, diff, true = _run("paired", 0.15, 3, seed=7)
    rng = np.random.default_rng(7)
    la, lb = _logits(rng, "paired", 0.15, (EXPERIMENTS, 3, PROMPTS))
    u = rng.random(la.shape)
    a, b = (u < special.expit(la)).mean(-1), (u < special.expit(lb)).mean(-1)
    binomial = ((a * (1 - a) + b * (1 - b)) / PROMPTS).mean(-1)
    unpaired = SeedEstimate.of(a - b, binomial, BOUNDS, PROMPTS)
    power_unpaired = (p_values(unpaired, "above", 0.0, 0.0)[0] <= 1 - LEVEL).mean()
    print(f"truth {true:+.3f}: paired power {power:.3f}, unpaired {power_unpaired:.3f}")
    assert 0.015 < true < 0.04 and power >= 0.5 and power_unpaired <= 0.1


def test_without_the_shared_prompts_the_interaction_truth_is_not_covered():
    """The check can fail: the seeds' spread alone (no prompt term) misses an arm-by-prompt
    interaction's shared offset far more often than 5%."""
    diff, _, _ = _experiments("interaction", 0.3, 3, 0)
    est = SeedEstimate.of(diff.mean(-1), 0.0, BOUNDS, PROMPTS)
    true = _truth("interaction", 0.3)
    assert min((est.bound(LEVEL, "low") <= true).mean(), (est.bound(LEVEL, "high") >= true).mean()) < 0.9


def test_bimodal_with_three_seeds_says_too_few_when_it_sees_both_modes():
    """At 3 seeds both modes show in 3/4 of experiments: those make no statement; the rest (every
    seed in one mode) cannot show the other mode, which is why 8 seeds are asked for."""
    _, _, _, decided, _, _ = _run("bimodal", 0.3, 3)
    assert decided == pytest.approx(0.25, abs=0.05)
    assert paired.seeds_for_modes(1, 3, LEVEL) == paired.seeds_for_modes(2, 3, LEVEL) == 8


def test_modes_count_learned_and_stuck_seeds_and_need_a_gap():
    learned, stuck, bimodal = paired.modes(np.array([[0.05, 0.9, 0.85], [0.45, 0.55, 0.6], [0.9, 0.95, np.nan]]))
    assert learned.tolist() == [2, 2, 2] and stuck.tolist() == [1, 1, 0] and bimodal.tolist() == [True, False, False]
    text, asked = paired.modes_note([(0.05, 0.9), (0.9, 0.92), (0.88, 0.93)], ("q", "static"), LEVEL)
    assert text == "learned (accuracy >= 0.5) / stuck seeds: q 2/1 (bimodal), static 3/0" and asked == 8


def test_a_yes_no_task_counts_seeds_near_chance_as_stuck():
    # on a yes/no task 0.5 is chance: a rule's learned_at = 0.75 calls seeds near it stuck
    seeds = [(0.52, 0.95), (0.95, 0.97), (0.93, 0.96)]
    assert paired.modes_note(seeds, ("4x1", "1x4"), LEVEL)[0].endswith("4x1 3/0, 1x4 3/0")
    text, asked = paired.modes_note(seeds, ("4x1", "1x4"), LEVEL, learned_at=0.75)
    assert text == "learned (accuracy >= 0.75) / stuck seeds: 4x1 2/1 (bimodal), 1x4 3/0" and asked == 8
    with pytest.raises(SynthlabError, match="learned_at"):
        rules.Rule(claim="C4", says="s", metric="accuracy", expect="above", learned_at=1.0)
    # the field leaves every rule written without it as it was preregistered (the same fingerprint)
    table = {"claim": "C4", "says": "s", "metric": "accuracy", "expect": "above"}
    plain = rules.Rule(**table)
    assert rules.fingerprint(plain) == rules.table_fingerprint(rules.Rule, table)
    assert rules.fingerprint(dataclasses.replace(plain, learned_at=0.75)) != rules.fingerprint(plain)


# --- verdicts read per-prompt outcomes ---------------------------------------------------------


def _outcomes(folder, name: str, columns: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"prompt": range(len(next(iter(columns.values())))), **columns}).to_csv(folder / name, index=False)
    return name


def _kv_table(tmp_path, stuck_seed: bool = False):
    """Three seeds, two read-outs (kv full / last) of one model on 400 shared prompts; last loses
    the answer on 8 of the prompts full gets right (a -2-point difference)."""
    rng, rows = np.random.default_rng(1), []
    for seed in range(3):
        full = rng.random(400) < (0.1 if stuck_seed and seed == 0 else 0.8)
        last = full.copy()
        last[np.flatnonzero(full)[:8]] = False
        run = tmp_path / f"run{seed}"
        for kv, hits in (("full", full), ("last", last)):
            where = _outcomes(run, f"{kv}.csv", {"group": ["x"] * 400, "kv": hits.astype(int)})
            rows.append({"seed": seed, "kv": kv, "accuracy": hits.mean(), "n_answers": 400, "run_dir": str(run)})
            rows[-1]["outcomes"] = where
    return pd.DataFrame(rows)


def _kv_rule(**fields):
    return rules.Rule(claim="C7", says="last keeps full", metric="accuracy", column="kv", a="last", b="full", **fields)


def test_two_read_outs_with_outcomes_are_decided_paired_and_without_say_unpaired(tmp_path):
    table = _kv_table(tmp_path)
    rule = _kv_rule(expect="below")
    (with_outcomes,) = verdicts.decide_all([rule], table, ["seed", "kv"])
    (without,) = verdicts.decide_all([rule], table.drop(columns="outcomes"), ["seed", "kv"])
    assert with_outcomes.estimate == pytest.approx(without.estimate) == pytest.approx(-0.02)
    assert with_outcomes.statistics.startswith("paired: seed x prompt bootstrap over 400 shared prompts")
    assert without.statistics.startswith("unpaired (no per-prompt outcomes)")
    assert with_outcomes.statistics.endswith("learned (accuracy >= 0.5) / stuck seeds: last 3/0, full 3/0")
    # the same 8 prompts lost on every seed: the paired bound is far tighter and decides it
    assert with_outcomes.outcome == "reproduced" and without.outcome == "inconclusive"
    assert with_outcomes.high - with_outcomes.low < (without.high - without.low) / 3


def test_a_bimodal_arm_with_three_seeds_reads_too_few(tmp_path):
    (verdict,) = verdicts.decide_all([_kv_rule(expect="below")], _kv_table(tmp_path, stuck_seed=True), ["seed", "kv"])
    assert verdict.outcome == "too few seeds" and math.isnan(verdict.low)
    assert verdict.summary().startswith("too few seeds (bimodal: 3 seeds too few (8 asked))")
    assert "last 2/1 (bimodal)" in verdict.statistics


def test_an_exit_curve_is_read_prompt_by_prompt(tmp_path):
    """With `x`, b's curve is interpolated per prompt: the per-prompt vector's mean is the value."""
    rng, rows = np.random.default_rng(2), []
    for seed in range(3):
        run = tmp_path / f"run{seed}"
        for strategy, x in (("static", 1.0), ("static", 2.0), ("static", 3.0), ("q", 1.4), ("q", 2.5)):
            hits = (rng.random(200) < 0.3 * x).astype(int)
            where = _outcomes(run, f"{strategy}{x}.csv", {"group": [2] * 200, "exit": hits, "step_1": hits})
            rows.append(
                {"seed": seed, "strategy": strategy, "mean_exit_step": x, "accuracy": hits.mean(), "n_test": 200}
                | {"run_dir": str(run), "outcomes": where}
            )
    rule = rules.Rule(claim="C6", says="q", metric="accuracy", column="strategy", a="q", b="static", expect="above")
    rule = dataclasses.replace(rule, x="mean_exit_step")
    values = per_seed.seed_values(rule, pd.DataFrame(rows), ["seed", "strategy"])
    assert len(values) == 3 and all(v.per_prompt is not None for v in values)
    assert [v.per_prompt.mean() for v in values] == pytest.approx([v.value for v in values])


def test_read_outs_that_agree_on_every_prompt_seen_keep_a_floor():
    """No discordant prompt among 10 is no evidence of agreement within 2 points; among 400, it is."""
    for prompts, decided in ((10, False), (400, True)):
        est = paired.estimate(np.zeros((3, prompts)), BOUNDS)
        inside, _ = p_values(est, "within", 0.0, 0.02)
        assert (inside <= 1 - LEVEL) == decided


def test_a_report_copies_the_outcomes_so_its_folder_decides_paired_as_the_sweep_did(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    _kv_table(tmp_path / "runs").assign(point_id=[f"p{i}" for i in range(6)]).to_csv(sweep / "results.csv", index=False)
    definition = str(Path(__file__).resolve().parents[1] / "experiments" / "kvcache.toml")
    info = {"experiment": "kvcache", "preset": "cpu", "claim": "C7", "title": "t", "definition": definition}
    (sweep / "sweep.json").write_text(json.dumps(info))
    write_report([sweep], tmp_path / "pages" / "README.md", copy_results=True)
    write_report([tmp_path / "pages" / "kvcache"], tmp_path / "again" / "README.md")
    lines = [
        [line for line in (folder / "README.md").read_text().splitlines() if line.startswith("- C7")]
        for folder in (tmp_path / "pages", tmp_path / "again")
    ]
    assert len(lines[0]) == 2 and lines[0] == lines[1] and "; paired: seed x prompt bootstrap" in lines[0][0]
    assert len(list((tmp_path / "pages" / "kvcache" / "outcomes").rglob("*.csv"))) == 6


def test_a_loss_read_per_held_out_sequence_counts_the_sequences_noise(tmp_path):
    """C11: two variants on one base per seed, scored on the same 60 held-out sequences. Each
    sequence's loss difference is drawn once and shared by every seed (the test set's own noise),
    so the seeds agree exactly: without the per-sequence outcomes the interval sees no noise at
    all; with them it counts the sequences' and cannot call a -0.05 mean with a 0.5 spread."""
    rng, rows = np.random.default_rng(3), []
    shared = -0.05 + 0.5 * rng.standard_normal(60)
    shared -= shared.mean() + 0.05  # the sample's mean difference is exactly -0.05
    for seed in range(3):
        static = 2.0 + rng.random(60)
        run = tmp_path / f"base{seed}"
        for variant, losses in (("static", static), ("controller", static + shared)):
            where = _outcomes(run, f"{variant}.csv", {"loss_depth_4": losses})
            rows.append({"seed": seed, "variant": variant, "loss_depth_4": losses.mean(), "run_dir": str(run)})
            rows[-1]["outcomes"] = where
    table = pd.DataFrame(rows)
    rule = rules.Rule(
        claim="C11", says="controller below static", metric="loss_depth_4", column="variant", a="controller",
        b="static", expect="below",
    )  # fmt: skip
    (paired_rule,) = verdicts.decide_all([rule], table, ["seed", "variant"])
    (seeds_only,) = verdicts.decide_all([rule], table.drop(columns="outcomes"), ["seed", "variant"])
    assert paired_rule.estimate == pytest.approx(seeds_only.estimate) == pytest.approx(-0.05)
    assert paired_rule.statistics.startswith("paired: seed x prompt bootstrap over 60 shared prompts")
    assert seeds_only.statistics.startswith("seeds only (no per-prompt outcomes") and seeds_only.outcome == "reproduced"
    assert paired_rule.outcome == "inconclusive" and paired_rule.high > 0
