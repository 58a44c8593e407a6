"""Intervals and tests for a statistic measured once per training seed, on its own scale.

The unit of replication is the seed: a rule's statistic is computed once per seed (a mean
accuracy, a difference of two arms' accuracies, a loss difference) and these n values decide it.
Two things make a plain Student-t interval on them wrong for an accuracy:

- the range: at n = 3 (t = 2.92 one-sided, 4.30 two-sided) an interval of accuracies near a
  ceiling runs past 1, so a model that answers 98% on every seed reads "inconclusive" against 90%
  with no evidence against it;
- the test set: every seed is scored on the same test prompts (one data seed), so the test set's
  sampling noise is an offset shared by all seeds that their spread does not show.

What is used instead (`SeedEstimate`): a Student-t interval on the logit scale of the statistic's
range ([0, 1] for a level, [-1, 1] for a difference of two bounded arms, mapped to [0, 1] first),
back-transformed, so it never leaves the range; each seed's value is shrunk by half a prompt
towards the middle ((x N + 0.5) / (N + 1), N the test prompts) so that a seed at 100% has a finite
logit. Its variance is the seeds' spread over n plus the test set's binomial variance of the
statistic (p (1 - p) / N per arm and column, summed: an upper bound when the arms' answers on the
same prompt are positively correlated, as they are), carried to the logit scale by the delta
method. That binomial term bounds the part of the test set's noise the seeds share (the spread of
the prompts' own difficulty over N): it is reached only when every seed answers each prompt alike,
so the interval errs wide. With it, 1,000 simulated experiments (3 seeds, 500 shared prompts of
spread-out difficulty) cover the truth with each one-sided 95% bound 98-100% of the time and call
no effect "reproduced" in 1%; without it, 93-97% and 6%, above the 5% a rule at 95% promises. The bound is what is left when results.csv is all there is; where
the rows name per-prompt outcomes, `synthlab.claims.paired` measures the shared noise from them instead
(a seed x prompt bootstrap, which pairs two read-outs of one model prompt by prompt) and hands the
same estimate its variance. A bootstrap over seeds alone has ten distinct resamples at three
seeds and covers far below its level, so the seeds stay a Student-t. The degrees of freedom stay n - 1 (the added
variance is known, so this errs on the wide side). A statistic without a known range (a loss, a
relative difference) keeps the plain Student-t interval.

One-sided rules use one-sided bounds: "above 0 at 95%" means the 95% lower bound is above 0 (and
"contradicted" that the 95% upper bound is below it); the interval shown is the pair of one-sided
95% bounds, i.e. a 90% two-sided interval. A "within" rule is two one-sided tests at the same
level (TOST).

Multiplicity: the family is the cells of one rule (a rule with `each` tests one hypothesis per
cell): Holm's step-down adjustment of the cells' one-sided p-values keeps the chance of any false
per-cell statement at or below 1 - level, in each direction. Different rows of the claims table
are separate claims, each at its own level, not corrected against each other.

`tests/test_intervals.py` checks by simulation (1,000 experiments of 3 seeds on a shared test set,
a true effect, no effect and a ceiling near 1) that the bounds cover the truth at their level and
that no effect is called "reproduced" in more than 5% of experiments.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special, stats


def _to_unit(x, bounds):
    lo, hi = bounds
    return (np.asarray(x, float) - lo) / (hi - lo)


@dataclasses.dataclass(frozen=True)
class SeedEstimate:
    """The mean of per-seed values and its uncertainty on the working scale (logit of the range for
    a bounded statistic, the values themselves otherwise). Every array has the leading shape of
    the values without their last (seed) axis, so many simulated experiments go through at once."""

    estimate: np.ndarray  # the mean over seeds, on the statistic's own scale
    center: np.ndarray  # the mean on the working scale
    spread: np.ndarray  # the seeds' variance on the working scale
    shared: np.ndarray  # the shared test set's variance of the mean on the working scale
    df: int
    bounds: tuple[float, float] | None

    @classmethod
    def of(cls, values, test_var=0.0, bounds: tuple[float, float] | None = None, prompts: float = 1000.0):
        """values: (..., n seeds); test_var: the test set's sampling variance of the statistic shared
        by all seeds (0 when unknown or when each seed has its own test set); prompts: the test
        prompts behind each value (for the half-prompt shrinkage of a bounded statistic)."""
        values = np.asarray(values, float)
        n = values.shape[-1]
        estimate = values.mean(-1)
        test_var = np.broadcast_to(np.asarray(test_var, float), estimate.shape)
        if bounds is None:
            z, scale = values, np.ones_like(estimate)
        else:
            u = (_to_unit(values, bounds) * prompts + 0.5) / (prompts + 1)
            z = special.logit(u)
            mid = u.mean(-1)
            scale = 1.0 / (mid * (1 - mid) * (bounds[1] - bounds[0]))  # d logit(u) / d x at the mean
        spread = z.var(-1, ddof=1) if n > 1 else np.full(estimate.shape, np.nan)
        shared = test_var * scale**2
        return cls(estimate, z.mean(-1), spread, shared, n - 1, bounds)

    @property
    def se(self):
        """The standard error of the mean on the working scale."""
        return np.sqrt(self.spread / (self.df + 1) + self.shared)

    def _working(self, threshold: float) -> float:
        if self.bounds is None:
            return threshold
        return float(special.logit(np.clip(_to_unit(threshold, self.bounds), 1e-12, 1 - 1e-12)))

    def _back(self, z):
        if self.bounds is None:
            return z
        lo, hi = self.bounds
        return lo + (hi - lo) * special.expit(z)

    def bound(self, level: float, side: str):
        """The one-sided bound at `level`: side "low" (the statistic is above it at that confidence)
        or "high"."""
        t = stats.t.ppf(level, self.df)
        return self._back(self.center - t * self.se if side == "low" else self.center + t * self.se)

    def p_above(self, threshold: float):
        """One-sided p of "the mean is at most `threshold`" (small: evidence it is above)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.center - self._working(threshold)) / self.se
        return np.where(np.isnan(t), 0.5, stats.t.sf(t, self.df))

    def p_below(self, threshold: float):
        """One-sided p of "the mean is at least `threshold`"."""
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (self.center - self._working(threshold)) / self.se
        return np.where(np.isnan(t), 0.5, stats.t.cdf(t, self.df))


def p_values(est: SeedEstimate, expect: str, threshold: float, margin: float):
    """(p of the claim's null, p of its opposite's null): small first = evidence for the claim
    ("reproduced"), small second = evidence against it ("contradicted"). "within" is two one-sided
    tests (TOST): inside the band needs both, outside it either."""
    if expect == "above":
        return est.p_above(threshold), est.p_below(threshold)
    if expect == "below":
        return est.p_below(threshold), est.p_above(threshold)
    inside = np.maximum(est.p_above(threshold - margin), est.p_below(threshold + margin))
    outside = np.minimum(est.p_below(threshold - margin), est.p_above(threshold + margin))
    return inside, outside


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values over the last axis (the family)."""
    p = np.asarray(p, float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, -1) * (m - np.arange(m))
    adjusted = np.minimum(np.maximum.accumulate(ranked, axis=-1), 1.0)
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, -1)
    return out


def seeds_needed(
    values,
    test_var,
    bounds,
    expect: str,
    threshold: float,
    margin: float,
    alpha: float,
    power: float = 0.8,
    most: int = 1000,
    prompts: float = 1000.0,
) -> int | None:
    """The seeds at which the one-sided test at `alpha` decides the observed effect with probability
    `power`, if the per-seed spread and the effect are what was observed: the smallest n with
    (t_{1-alpha} + t_{power}) * se(n) below the estimate's distance from the threshold (the nearer
    edge of a "within" band), on the working scale. 0 when no effect was observed (the estimate on
    the threshold); None when no number of seeds is enough (the shared test set's noise alone is
    larger than the effect) or more than `most` would be."""
    est = SeedEstimate.of(values, test_var, bounds, prompts)
    edges = [threshold] if expect != "within" else [threshold - margin, threshold + margin]
    distance = min(abs(float(est.center) - est._working(e)) for e in edges)
    if distance == 0 or math.isnan(distance):
        return 0
    spread, shared = float(est.spread), float(est.shared)
    for n in range(2, most + 1):
        if (stats.t.ppf(1 - alpha, n - 1) + stats.t.ppf(power, n - 1)) * math.sqrt(spread / n + shared) < distance:
            return n
    return None
