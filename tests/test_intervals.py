"""synthlab.claims.intervals: coverage and error rates by simulation, range, Holm, the seeds a rule needs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from synthlab.claims.intervals import SeedEstimate, holm, p_values, seeds_needed

EXPERIMENTS, SEEDS, PROMPTS, LEVEL = 1000, 3, 500, 0.95
MC_ERROR = 3 * math.sqrt(LEVEL * (1 - LEVEL) / EXPERIMENTS)  # three Monte Carlo standard errors


def _truth(mu: float, tau: float, difficulty: float) -> float:
    """E over seeds and prompts of the accuracy expit(mu + seed + prompt)."""
    draws = np.random.default_rng(99).normal(size=(2, 400_000))
    return float(special.expit(mu + tau * draws[0] + difficulty * draws[1]).mean())


def _experiments(rng, mus, tau=0.3, difficulty=1.0):
    """Per arm: each experiment's per-seed accuracies on one shared test set of PROMPTS prompts
    (drawn afresh per experiment); each seed its own offset on the logit scale."""
    prompt = difficulty * rng.normal(size=(EXPERIMENTS, 1, PROMPTS))
    arms = []
    for mu in mus:
        seed = tau * rng.normal(size=(EXPERIMENTS, SEEDS, 1))
        arms.append((rng.random((EXPERIMENTS, SEEDS, PROMPTS)) < special.expit(mu + seed + prompt)).mean(-1))
    return arms


def _binomial(acc):
    return (acc * (1 - acc) / PROMPTS).mean(-1)


SHAPES = {  # name: (arm means on the logit scale, bounds); one arm: its level, two: a - b
    "true effect": ((0.8, 0.0), (-1.0, 1.0)),
    "no effect": ((0.5, 0.5), (-1.0, 1.0)),
    "ceiling near 1": ((4.5,), (0.0, 1.0)),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_one_sided_bounds_cover_the_truth_at_their_level_and_stay_in_range(shape):
    mus, bounds = SHAPES[shape]
    arms = _experiments(np.random.default_rng(len(shape)), mus)
    truth = _truth(mus[0], 0.3, 1.0) - (_truth(mus[1], 0.3, 1.0) if len(mus) > 1 else 0.0)
    values = arms[0] - arms[1] if len(arms) > 1 else arms[0]
    est = SeedEstimate.of(values, sum(_binomial(a) for a in arms), bounds, PROMPTS)
    low, high = est.bound(LEVEL, "low"), est.bound(LEVEL, "high")
    assert (low >= bounds[0]).all() and (high <= bounds[1]).all()
    for covered in (low <= truth, high >= truth):
        assert covered.mean() >= LEVEL - MC_ERROR, covered.mean()
    assert ((low <= truth) & (high >= truth)).mean() >= 2 * LEVEL - 1 - MC_ERROR


def test_no_effect_is_reproduced_in_at_most_five_percent_of_experiments_per_rule_and_per_cell():
    rng = np.random.default_rng(5)
    a, b = _experiments(rng, (0.5, 0.5))
    est = SeedEstimate.of(a - b, _binomial(a) + _binomial(b), (-1.0, 1.0), PROMPTS)
    p_claim, _ = p_values(est, "above", 0.0, 0.0)
    assert (p_claim <= 1 - LEVEL).mean() <= 0.05
    # three cells with no effect in any: "reproduced in every cell" after Holm, and "contradicted in any"
    cells = [_experiments(rng, (0.5, 0.5)) for _ in range(3)]
    ests = [SeedEstimate.of(x - y, _binomial(x) + _binomial(y), (-1.0, 1.0), PROMPTS) for x, y in cells]
    p = np.stack([p_values(e, "above", 0.0, 0.0) for e in ests], -1)  # (2, experiments, cells)
    assert (holm(p[0]) <= 1 - LEVEL).all(-1).mean() <= 0.05
    assert (holm(p[1]) <= 1 - LEVEL).any(-1).mean() <= 0.05 + MC_ERROR


def test_a_ceiling_is_not_inconclusive_for_want_of_range():
    """Three seeds at 97-99% on 500 prompts: above 90% at 95%, where Student-t on the raw values
    (upper bound past 1) is not decisive in the same way."""
    est = SeedEstimate.of(np.array([0.99, 0.974, 0.966]), 0.98 * 0.02 / 500, (0.0, 1.0), 500)
    assert est.bound(0.95, "low") > 0.9 and est.bound(0.95, "high") < 1.0
    assert p_values(est, "above", 0.9, 0.0)[0] < 0.05


def test_an_unbounded_statistic_keeps_the_student_t_interval():
    from scipy import stats

    values = np.array([0.3, 0.1, 0.5, 0.2])
    est = SeedEstimate.of(values)
    half = stats.t.ppf(0.95, 3) * values.std(ddof=1) / 2
    assert est.bound(0.95, "low") == pytest.approx(values.mean() - half)
    assert est.bound(0.95, "high") == pytest.approx(values.mean() + half)


def test_holm_matches_the_step_down_by_hand():
    p = np.array([0.01, 0.04, 0.03, 0.2])
    # sorted 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1 = 0.04, 0.09, 0.08, 0.2; running max 0.04, 0.09, 0.09, 0.2
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.2])


def test_seeds_needed_shrink_with_the_effect_and_stop_at_the_test_set_noise():
    values = np.array([0.1, 0.2, 0.15])
    wide = seeds_needed(values, 0.0, None, "above", 0.0, 0.0, 0.05)
    narrow = seeds_needed(values - 0.1, 0.0, None, "above", 0.0, 0.0, 0.05)
    assert 2 <= wide < narrow
    assert seeds_needed(values, 1.0, None, "above", 0.0, 0.0, 0.05) is None  # shared noise beats any n
    assert seeds_needed(np.zeros(3), 0.0, None, "above", 0.0, 0.0, 0.05) == 0
