"""The claims table recomputed independently of the verdict engine from committed results.csv files:
plain pandas per seed and cell, the interval written out from its definition (synthlab.claims.intervals'
docstring), compared with what `synthlab report` decides."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from synthlab.claims import paired, verdicts
from synthlab.sweeps import experiments

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _logit_bounds(values, test_var, lo, hi, prompts, level=0.95):
    """Mean of per-seed values; one-sided bounds on the logit scale of [lo, hi] with the shared
    test-set variance added (delta method at the mean), back-transformed."""
    u = ((np.asarray(values) - lo) / (hi - lo) * prompts + 0.5) / (prompts + 1)
    z = np.log(u / (1 - u))
    ubar = u.mean()
    se = math.sqrt(z.var(ddof=1) / len(z) + test_var / (ubar * (1 - ubar) * (hi - lo)) ** 2)
    t = stats.t.ppf(level, len(z) - 1)
    back = lambda x: lo + (hi - lo) / (1 + math.exp(-x))  # noqa: E731
    return float(np.mean(values)), back(z.mean() - t * se), back(z.mean() + t * se)


def _verdicts(name: str, says_start: str):
    exp = experiments.load(name)
    table = pd.read_csv(RESULTS / name / "results.csv")
    rules = [r for r in exp.verdicts if r.says.startswith(says_start)]
    return table, verdicts.decide_all(rules, table, ["seed", "L", "model"])


def test_c2_per_length_cells_match_a_recomputation():
    table, decided = _verdicts("mano", "Loop 1x3 beats Base 1x1")
    assert {c.label for v in decided for c in v.cells} == {"L=2", "L=3"}
    for verdict in decided:
        for cell in verdict.cells:
            L = int(cell.label.split("=")[1])
            rows = table[table["L"] == L].set_index(["seed", "model"])
            a, b = rows.xs("1x3", level="model"), rows.xs("1x1", level="model")
            diff = (a["accuracy"] - b["accuracy"]).sort_index()
            test_var = float(
                (
                    a["accuracy"] * (1 - a["accuracy"]) / a["n_test"]
                    + b["accuracy"] * (1 - b["accuracy"]) / b["n_test"]
                ).mean()
            )
            estimate, low, high = _logit_bounds(diff.to_numpy(), test_var, -1.0, 1.0, 500)
            assert (cell.estimate, cell.low, cell.high) == pytest.approx((estimate, low, high), rel=1e-9)
            if L == 3:  # no model has learned every length below 3 on its training prompts
                assert verdict.outcome in ("inconclusive", "not tested")


def test_c9_level_near_a_ceiling_matches_a_recomputation_and_stays_below_one():
    exp = experiments.load("faithfulness")
    rule = next(r for r in exp.verdicts if r.metric == "agree_7_8")
    table = pd.read_csv(RESULTS / "faithfulness" / "results.csv")
    verdict = verdicts.decide_all([rule], table, ["seed", "train.loss"])[0]
    rows = table[table["train.loss"] == "mean"].sort_values("seed")
    p = rows["agree_7_8"]
    estimate, low, high = _logit_bounds(
        p.to_numpy(), float((p * (1 - p) / rows["n_test"]).mean()), 0.0, 1.0, float(rows["n_test"].min())
    )
    assert (verdict.estimate, verdict.low, verdict.high) == pytest.approx((estimate, low, high), rel=1e-9)
    assert verdict.high < 1


def test_c11_loss_difference_keeps_the_plain_one_sided_student_t():
    exp = experiments.load("ouroboros")
    rule = next(r for r in exp.verdicts if r.metric == "loss_depth_8" and r.b == "static")
    table = pd.read_csv(RESULTS / "ouroboros" / "results.csv")
    verdict = verdicts.decide_all([rule], table, ["seed", "variant"])[0]
    rows = table.set_index(["seed", "variant"])["loss_depth_8"]
    diff = (rows.xs("controller", level="variant") - rows.xs("static", level="variant")).sort_index().to_numpy()
    half = stats.t.ppf(0.95, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff))
    assert (verdict.low, verdict.high) == pytest.approx((diff.mean() - half, diff.mean() + half), rel=1e-9)


def test_c7_paired_cache_row_matches_a_recomputation_from_the_outcomes():
    """The confirmatory C7 row (two caches of one model, paired prompt by prompt) from its committed
    per-prompt outcomes: the mean per-seed difference exactly; the bounds with the shared prompts'
    variance written in closed form (what the verdicts' seeded bootstrap estimates: the variance of
    a multinomial-weighted mean is the prompts' population variance over N), less the two-way
    seed x prompt residual, within the bootstrap's Monte Carlo error."""
    folder = RESULTS / "kvcache" / "confirm"
    exp = experiments.load("kvcache")
    rule = next(r for r in exp.verdicts if r.a == "first" and r.b == "full")
    table = pd.read_csv(folder / "results.csv")
    verdict = verdicts.decide_all([rule], paired.locate_runs(table, folder), ["seed", "kv"])[0]
    assert verdict.statistics.startswith("paired")

    def outcomes(row) -> np.ndarray:
        path = folder / "outcomes" / Path(row["run_dir"]).name / row["outcomes"]
        return pd.read_csv(path)["kv"].to_numpy(float)

    rows = table.set_index(["seed", "kv"])
    seeds = sorted(table["seed"].unique())
    diffs = np.stack([outcomes(rows.loc[(s, "first")]) - outcomes(rows.loc[(s, "full")]) for s in seeds])
    n, prompts = diffs.shape
    per_prompt = diffs.mean(0)
    resid = diffs - diffs.mean(1, keepdims=True) - per_prompt + diffs.mean()
    variance = max(
        per_prompt.var() / prompts - (resid**2).sum() / ((n - 1) * (prompts - 1)) / (n * prompts),
        (prompts - 1) / prompts**3,
    )
    estimate, low, high = _logit_bounds(diffs.mean(1), variance, -1.0, 1.0, prompts)
    assert verdict.estimate == pytest.approx(estimate, rel=1e-12)
    assert (verdict.low, verdict.high) == pytest.approx((low, high), abs=5e-4)
    # unpaired, the two binomials' variances would have been added: the paired bound is narrower
    assert variance < float(diffs.var(1).mean()) / prompts
