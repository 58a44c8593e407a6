"""Bootstrap intervals (warm starts agree with cold grid refits), derived quantities, hold-outs."""

from __future__ import annotations

import numpy as np
import pytest
from test_scaling import TRUTH, synthetic

from synthlab import SynthlabError
from synthlab import scaling as sc


@pytest.fixture(scope="module")
def noisy_chinchilla():
    data, _ = synthetic("chinchilla", 5e-3, np.random.default_rng(10))
    return data, sc.fit("chinchilla", data)


def test_warm_bootstrap_equals_cold_grid_refits(noisy_chinchilla):
    """Warm-started resamples land on the optimum a full cold grid fit of the same resample finds."""
    data, result = noisy_chinchilla
    boot = sc.bootstrap("chinchilla", data, result, np.random.default_rng(0), n_resamples=30)
    for i, cold in zip(range(2), sc.cold_refits("chinchilla", data, boot.rows[:2])):
        for name, value in cold.params.items():
            assert boot.samples[name][i] == pytest.approx(value, rel=1e-3), name


def test_bootstrap_is_seeded_and_intervals_behave(noisy_chinchilla):
    data, result = noisy_chinchilla
    one = sc.bootstrap("chinchilla", data, result, np.random.default_rng(7), n_resamples=40, compute=1e21)
    same = sc.bootstrap("chinchilla", data, result, np.random.default_rng(7), n_resamples=40, compute=1e21)
    other = sc.bootstrap("chinchilla", data, result, np.random.default_rng(8), n_resamples=40, compute=1e21)
    assert one.intervals == same.intervals and one.intervals != other.intervals
    assert set(one.intervals) == {"E", "A", "alpha", "B", "beta", "a", "b", "G", "N_opt", "D_opt"}
    point = {**result.params, **sc.derived(result.params, 1e21)}
    for name, (lo, hi) in one.intervals.items():
        assert lo <= point[name] <= hi, name
    # A narrower level gives a narrower interval; more noise gives wider ones.
    narrow = sc.bootstrap("chinchilla", data, result, np.random.default_rng(7), n_resamples=40, level=0.5)
    noisier, _ = synthetic("chinchilla", 2e-2, np.random.default_rng(10))
    wide = sc.bootstrap("chinchilla", noisier, sc.fit("chinchilla", noisier), np.random.default_rng(7), n_resamples=40)
    width = lambda b, k: b.intervals[k][1] - b.intervals[k][0]  # noqa: E731
    for name in ("alpha", "beta"):
        assert width(narrow, name) < width(one, name) < width(wide, name)


def test_compute_optimum_minimises_loss_at_fixed_compute():
    params = TRUTH["chinchilla"]
    compute = 1e22
    out = sc.derived(params, compute)
    assert out["a"] + out["b"] == pytest.approx(1.0)
    n = np.geomspace(1e8, 1e12, 200_001)
    theta = sc.CHINCHILLA.theta(params)
    loss = sc.CHINCHILLA.predict(theta, np.column_stack([n, compute / (6 * n)]))
    assert out["N_opt"] == pytest.approx(n[np.argmin(loss)], rel=1e-3)
    assert out["N_opt"] * out["D_opt"] * 6 == pytest.approx(compute)
    assert "G" not in sc.derived(TRUTH["looplm"])  # the closed form does not hold with offsets


def test_holdout_splits_and_scores():
    data, _ = synthetic("looplm", 1e-5, np.random.default_rng(11))
    law = sc.LOOPLM
    ((name, train),) = sc.holdout_splits(law, data, "size")
    assert name == "smallest 3 of 5 sizes" and data.variables["N"][train].max() < data.variables["N"][~train].min()
    fractions = sc.holdout_splits(law, data, "data")
    assert [int(t.sum()) for _, t in fractions] == sorted(int(t.sum()) for _, t in fractions)
    steps = sc.holdout_splits(law, data, "steps")
    assert len(steps) == 4 and all((~t).sum() == 25 for _, t in steps)
    rows = sc.holdout(law, data, "steps")
    # Noise-free-ish data from the law itself: every held-out Tm is predicted almost exactly.
    assert all(r.r2_train > 0.999 and r.rmse_log_test < 1e-2 for r in rows)
    with pytest.raises(SynthlabError, match="needs a law over Tm or T"):
        sc.holdout_splits(sc.CHINCHILLA, data, "steps")
    with pytest.raises(SynthlabError, match="unknown hold-out"):
        sc.holdout_splits(law, data, "tokens")


def test_data_holdout_keeps_a_checkpoint_whole_when_its_tokens_vary_between_runs():
    # checkpoints at 500 / 1000 / 2000 / 4000 steps, tokens seen varying by a few per run (as in
    # a Mano sweep, whose rows have different lengths): four levels, cut after whole ones
    rng = np.random.default_rng(0)
    levels = np.repeat([0.45e6, 0.9e6, 1.8e6, 3.6e6], 12)
    d = levels + rng.integers(-60, 60, levels.shape)
    d[-1] = 3.6e6  # the largest D, against which the cuts are taken
    data = sc.Data({"N": np.full(d.shape, 1e5), "D": d, "Tm": np.ones(d.shape)}, np.ones(d.shape))
    ((name, train),) = sc.holdout_splits(sc.LOOPLM, data, "data")
    assert name == "first 3 of 4 D levels" and int(train.sum()) == 36  # whole levels: 3 of the 4 checkpoints
    # each run its own D (Chinchilla's grid): cut at 25/50/75% of the largest D
    spread = sc.Data({"N": np.full(40, 1e5), "D": np.geomspace(1e6, 1e8, 40), "Tm": np.ones(40)}, np.ones(40))
    cuts = sc.holdout_splits(sc.LOOPLM, spread, "data")
    assert [n for n, _ in cuts] == ["first 25% of data", "first 50% of data", "first 75% of data"]
    assert [int(t.sum()) for _, t in cuts] == [
        int((spread.variables["D"] <= q * 1e8 * 1.01).sum()) for q in (0.25, 0.5, 0.75)
    ]


# The cpu scaling preset's design: 4 model sizes x 4 checkpoints (D) x 4 loop counts (experiments/scaling.toml).
CPU_TRUTH = {
    "E": 1.0,
    "A": 400.0,
    "alpha": 0.45,
    "t1": 2e4,
    "B": 2000.0,
    "beta": 0.5,
    "t2": 1e5,
    "C": 0.5,
    "gamma": 1.0,
    "t3": 0.5,
}


def test_the_cpu_preset_design_identifies_the_looplm_law():
    """Loss from a known LoopLM law (0.1% noise) on a grid shaped like the cpu preset: the fit
    converges, the bootstrap keeps only converged refits (at least 90% of them) and every
    constant's interval holds its true value."""
    n, d, t = (
        a.ravel()
        for a in np.meshgrid([8.0e4, 1.1e5, 1.9e5, 2.8e5], [2e5, 4e5, 8e5, 1.6e6], [1.0, 2.0, 3.0, 4.0], indexing="ij")
    )
    law = sc.LOOPLM
    clean = law.predict(law.theta(CPU_TRUTH), np.column_stack([n, d, t]))
    data = sc.Data({"N": n, "D": d, "Tm": t}, clean * np.exp(np.random.default_rng(0).normal(0, 1e-3, clean.shape)))
    result = sc.fit(law, data)
    assert result.converged and result.r2 > 0.9999
    boot = sc.bootstrap(law, data, result, np.random.default_rng(1), n_resamples=40)
    assert not boot.refused and boot.n_converged >= 0.9 * 40
    assert all(len(v) == boot.n_converged for v in boot.samples.values())  # converged refits only
    for name, value in CPU_TRUTH.items():
        lo, hi = boot.intervals[name]
        assert lo <= value <= hi, (name, lo, hi)
    # too few converged refits for the asked share: no interval at all, and it says why
    strict = sc.bootstrap(law, data, result, np.random.default_rng(1), n_resamples=40, min_converged=1.0)
    assert bool(strict.refused) == (strict.n_converged < 40) and (strict.intervals == {}) == bool(strict.refused)


def test_a_holdout_that_leaves_two_levels_says_so():
    from synthlab.scaling.uncertainty import thin_levels

    n, d = (a.ravel() for a in np.meshgrid([1e6, 1e7, 1e8], [1e8, 1e9, 1e10, 1e11], indexing="ij"))
    data = sc.Data({"N": n, "D": d}, 2.0 + 0 * n)
    ((name, train),) = sc.holdout_splits(sc.CHINCHILLA, data, "size")
    assert name == "smallest 2 of 3 sizes" and thin_levels(sc.CHINCHILLA, data, train) == "N: 2 levels"
    assert thin_levels(sc.CHINCHILLA, data, np.ones(len(n), bool)) == ""
    four = sc.Data({"N": np.repeat([1e6, 2e6, 4e6, 8e6], 4), "D": np.tile([1e8, 1e9, 1e10, 1e11], 4)}, np.full(16, 2.0))
    ((name, train),) = sc.holdout_splits(sc.CHINCHILLA, four, "size")  # the cpu scaling grid's 4 sizes: 3 fitted
    assert name == "smallest 3 of 4 sizes" and thin_levels(sc.CHINCHILLA, four, train) == ""
    assert thin_levels(sc.CHINCHILLA, data, d <= 1e9) == "D: 2 levels"


def replicated_chinchilla(rng: np.random.Generator, noise: float, bend: float = 0.0, shared: float = 0.0) -> sc.Data:
    """4 N sizes x 3 seeds = 12 runs, each read at 4 D levels (checkpoints) whose D differs by a few
    tokens between seeds; log-normal noise of sd `noise`, the fraction `shared` of its variance
    common to a run's checkpoints (a seed's luck persists). `bend` multiplies the loss by exp(+-bend),
    the sign alternating over D's levels: a zigzag in D that no power law in D follows."""
    n, seed, d = (
        a.ravel() for a in np.meshgrid([1e7, 3e7, 1e8, 3e8], [0, 1, 2], [1e9, 3e9, 1e10, 3e10], indexing="ij")
    )
    d = d + rng.integers(0, 50, 48)
    runs = np.repeat(np.arange(12), 4)
    z = np.sqrt(shared) * rng.standard_normal(12)[runs] + np.sqrt(1 - shared) * rng.standard_normal(48)
    clean = sc.CHINCHILLA.predict(sc.CHINCHILLA.theta(TRUTH["chinchilla"]), np.column_stack([n, d]))
    zigzag = bend * np.cos(np.pi * np.round(np.log(d / 1e9) / np.log(3)))
    return sc.Data({"N": n, "D": d}, clean * np.exp(zigzag + noise * z), runs=runs)


def test_lack_of_fit_holds_its_level_on_the_true_law_and_rejects_a_bent_one():
    """When the law holds, the test over runs rejects few of 20 tables at 5%, a run's checkpoints
    sharing most of their noise; it rejects a law whose form the data leave by more than their replicates' scatter.
    The R^2 ceiling (the design points' mean losses) bounds every fit's R^2; no replicates, no test."""
    rng = np.random.default_rng(5)
    truth = sc.CHINCHILLA.theta(TRUTH["chinchilla"])
    p_runs = []
    for i in range(20):
        data = replicated_chinchilla(rng, 0.02, shared=0.8)
        # fitted from the true constants, which lands on the grid fit's optimum (checked on the first
        # table) at a hundredth of its cost
        result = sc.fit(sc.CHINCHILLA, data, starts=truth[None])
        if i == 0:
            assert result.objective == pytest.approx(sc.fit(sc.CHINCHILLA, data).objective, rel=1e-9)
        lof = sc.lack_of_fit(sc.CHINCHILLA, data, result.theta, rng, resamples=400)
        assert (lof.rows, lof.cells, lof.params, lof.runs) == (48, 16, 5, 12)  # jittered D: still 16 points
        assert result.r2 <= lof.r2_ceiling
        p_runs.append(lof.p_runs)
    assert sum(p < 0.05 for p in p_runs) <= 3 and np.median(p_runs) > 0.2, p_runs
    bent = replicated_chinchilla(rng, 0.02, bend=0.05, shared=0.8)
    lof = sc.lack_of_fit(sc.CHINCHILLA, bent, sc.fit(sc.CHINCHILLA, bent).theta, rng, resamples=400)
    assert lof.p_runs < 0.01 and lof.f > 10
    single = bent.subset(np.flatnonzero(np.arange(48) // 4 % 3 == 0))  # seed 0's runs: one row per design point
    assert sc.lack_of_fit(sc.CHINCHILLA, single, sc.fit(sc.CHINCHILLA, single, starts=truth[None]).theta) is None


def _law_form_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "law_form_check.py"
    spec = importlib.util.spec_from_file_location("law_form_check", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_free_level_models_find_the_interaction_the_loss_has():
    """benchmarks/law_form_check.py on a cpu-shaped grid (4 N x 4 D x 4 Tm, 3 seeds, a run's 4
    checkpoints sharing half its noise): an additive loss passes every model's lack-of-fit test; a
    loss whose size gain grows with D fails the additive model and passes the one with N x D free."""
    import pandas as pd

    script = _law_form_check()
    rng = np.random.default_rng(3)
    n, tm, seed, d = (
        a.ravel()
        for a in np.meshgrid([3e4, 1e5, 2.3e5, 4e5], [1, 2, 3, 4], [0, 1, 2], [2e5, 4e5, 9e5, 1.8e6], indexing="ij")
    )
    run = np.repeat(np.arange(48), 4)
    noise = 0.03 * (np.sqrt(0.5) * rng.standard_normal(48)[run] + np.sqrt(0.5) * rng.standard_normal(192))
    additive = 0.3 + 30 / n**0.5 + 300 / d**0.5 + 0.2 / tm
    interacting = additive + 0.4 * np.log(n / 3e4) * np.log(d / 2e5) / 10  # the size gap widens with D
    for loss, rejected in ((additive, set()), (interacting, {"N + D + Tm", "N + D x Tm"})):
        table = pd.DataFrame(
            {
                "params": n,
                "eval_tokens": d + rng.integers(0, 50, 192),
                "loops": tm,
                "eval_loss": loss * np.exp(noise),
                "run_dir": run.astype(str),
                "eval.checkpoint": 0,
            }
        )
        results, described = script.form_tests(table, np.random.default_rng(0), resamples=300)
        assert described.startswith("192 rows, 64 design points, 48 runs; levels: N 4, D 4, Tm 4"), described
        assert set(results.loc[results["p (runs)"] < 0.05, "model"]) == rejected, results
        assert (results["R2"] <= results["R2 ceiling"] + 1e-9).all()
    with pytest.raises(SynthlabError, match="no design point has replicates"):  # one seed: nothing to test against
        script.form_tests(table[seed == 0], np.random.default_rng(0), resamples=10)
