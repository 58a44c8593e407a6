"""Uncertainty and goodness of fit for scaling laws: bootstrap intervals, derived quantities, hold-outs,
and the lack-of-fit test against seed noise.

Bootstrap over runs: a resample is a vector of row multiplicities (counts from drawing R rows
with replacement), so all resamples share one batched objective and are refitted together by
`minimize_batched`. Each resample is warm-started from the full-data optimum and the next best
distinct endpoints of the full-data grid (other basins), not from the whole grid: a resample
perturbs the data slightly, so its optimum sits beside the full-data one. Warm starts need the
tight stopping rules (FitOptions.tight_ftol/gtol): under scipy's absolute ftol a start that
begins near the optimum stops at once. A resample whose warm refit did not converge (no stopping
rule met: line-search failure or the iteration cap) is refitted cold from the full-data fit's
optimum by the trust-region polish (`optimize.refit_from`; a whole-grid `fit` per resample costs
about a minute for LoopLM on 2 cores); one that still does not converge is left out, and the
intervals come from the converged refits only; below `min_converged` (90%) of the resamples no interval is
given at all (`BootstrapResult.refused` says why; the cold refits stop once that is certain).
tests/test_scaling_eval.py and
benchmarks/bench_fit.py check that warm and cold refits agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from scipy import stats

from synthlab.errors import SynthlabError
from synthlab.files import warn
from synthlab.scaling.laws import Data, Law, get_law
from synthlab.scaling.optimize import (
    FitOptions,
    FitResult,
    fit,
    goodness,
    huber_objective,
    jacobian,
    minimize_batched,
    refit_from,
)
from synthlab.scaling.options import HOLDOUT_KINDS


def derived(params: Mapping[str, np.ndarray | float], compute: float | None = None) -> dict[str, np.ndarray | float]:
    """Compute-optimal quantities of a law with alpha and beta (works on arrays of samples too).

    a = beta / (alpha + beta) and b = alpha / (alpha + beta) are the exponents of N_opt and D_opt in
    C; for the offset-free form L = E + A/N^alpha + B/D^beta with C = 6ND:
    G = (alpha A / (beta B))^(1 / (alpha + beta)), N_opt = G (C/6)^a, D_opt = (C/6)^b / G.
    """
    if "alpha" not in params or "beta" not in params:
        return {}
    alpha, beta = np.asarray(params["alpha"]), np.asarray(params["beta"])
    out = {"a": beta / (alpha + beta), "b": alpha / (alpha + beta)}
    if "A" in params and "B" in params and "t1" not in params and "t2" not in params:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out["G"] = (alpha * np.asarray(params["A"]) / (beta * np.asarray(params["B"]))) ** (1.0 / (alpha + beta))
            if compute is not None:
                out["N_opt"] = out["G"] * (compute / 6.0) ** out["a"]
                out["D_opt"] = (compute / 6.0) ** out["b"] / out["G"]
    return {k: (float(v) if np.ndim(v) == 0 else v) for k, v in out.items()}


@dataclasses.dataclass(frozen=True)
class BootstrapResult:
    rows: np.ndarray  # (resamples, R) the row indices drawn for each resample
    samples: dict[str, np.ndarray]  # every reported parameter and derived quantity of the converged refits
    intervals: dict[str, tuple[float, float]]  # percentile intervals at `level` (empty when refused)
    level: float
    n_resamples: int
    n_converged: int  # resamples whose refit (warm, else cold) met a stopping rule: the samples
    n_cold: int = 0  # resamples refitted cold (from the full-data fit) after a warm refit that did not converge
    refused: str = ""  # why no interval is given ("" when they are)


def bootstrap(
    law: Law | str,
    data: Data,
    result: FitResult,
    rng: np.random.Generator,
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    compute: float | None = None,
    options: FitOptions = FitOptions(),
    warm_starts: int = 4,
    min_converged: float = 0.9,
) -> BootstrapResult:
    """Refit `law` on resamples of the runs; percentile intervals of the converged refits for
    parameters and derived quantities (none below `min_converged` of the resamples)."""
    law = get_law(law) if isinstance(law, str) else law
    if n_resamples < 2:
        raise SynthlabError(f"bootstrap needs at least 2 resamples, got {n_resamples}")
    if not 0 < level < 1:
        raise SynthlabError(f"level must be in (0, 1), got {level}")
    X, loss = data.matrix(law), np.asarray(data.loss, dtype=float)
    rows = rng.integers(0, len(loss), size=(n_resamples, len(loss)))
    weights = np.stack([np.bincount(r, minlength=len(loss)) for r in rows]).astype(float)  # multiplicities
    starts = result.basins[:warm_starts]
    K = len(starts)
    theta0 = np.tile(starts, (n_resamples, 1))  # (resamples * K, P), resample-major
    which = np.repeat(np.arange(n_resamples), K)
    objective = huber_objective(law, X, np.log(loss), weights, options)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        batch = minimize_batched(
            objective, theta0, which, ftol=options.tight_ftol, gtol=options.tight_gtol, max_iter=options.max_iter
        )
    f = np.where(np.isfinite(batch.f), batch.f, np.inf).reshape(n_resamples, K)
    best = np.arange(n_resamples) * K + f.argmin(axis=1)
    thetas = batch.theta[best]  # (resamples, P)
    converged = np.isin(batch.status[best], (1, 2))
    cold, allowed = [], int((1 - min_converged) * n_resamples)  # more failures than this: no interval anyway
    for i in np.flatnonzero(~converged):
        if len(cold) - int(converged[cold].sum()) > allowed:
            break
        cold.append(i)
        thetas[i], converged[i] = refit_from(law, data.subset(rows[i]), result.theta, options)
    reported = [law.report(t) for t in thetas[converged]]
    samples = {k: np.array([r[k] for r in reported]) for k in law.report(result.theta)}
    samples.update(derived(samples, compute))
    n_converged = int(converged.sum())
    refused = (
        ""
        if n_converged >= min_converged * n_resamples
        else (f"no interval: {n_converged} of {n_resamples} refits converged (< {100 * min_converged:.0f}%)")
    )
    tail = 100 * (1 - level) / 2
    with np.errstate(invalid="ignore"):  # a constant run off to inf: its upper bound is NaN, printed as such
        intervals = (
            {}
            if refused
            else {k: (float(np.percentile(v, tail)), float(np.percentile(v, 100 - tail))) for k, v in samples.items()}
        )
    return BootstrapResult(rows, samples, intervals, level, n_resamples, n_converged, len(cold), refused)


def cold_refits(
    law: Law | str, data: Data, rows: np.ndarray, options: FitOptions = FitOptions(), starts: np.ndarray | None = None
) -> list[FitResult]:
    """The reference for the warm-started bootstrap: a full `fit` (grid + polish) of each resample in rows (k, R)."""
    return [fit(law, data.subset(r), options, starts) for r in rows]


@dataclasses.dataclass(frozen=True)
class HoldoutRow:
    split: str
    train_rows: int
    test_rows: int
    r2_train: float
    r2_test: float
    rmse_log_test: float
    thin: str = ""  # the law's variables with fewer than 3 levels to fit on, e.g. "N: 2 levels"


def thin_levels(law: Law, data: Data, train: np.ndarray) -> str:
    """The variables of `law` that the rows in `train` cover with fewer than 3 distinct values: a
    coefficient, an exponent and an offset cannot be identified from two levels."""
    thin = [
        f"{v}: {n} level{'s' * (n != 1)}"
        for v in law.variables
        for n in [len(np.unique(np.asarray(data.variables[v])[train]))]
        if n < 3
    ]
    return ", ".join(thin)


DATA_CUT_TOLERANCE = 0.01  # D within 1% of a data hold-out's cut counts as at it (one checkpoint's D
# differs by a few tokens between runs: the cut must not split it)
MAX_DATA_LEVELS = 8  # D with at most this many levels (checkpoints read as D) is cut after whole
# levels; with more (each run its own D) at fractions of the largest D


def data_levels(d: np.ndarray) -> np.ndarray:
    """The levels of D, ascending, each as its largest value: a value within DATA_CUT_TOLERANCE of
    the one below it is the same level (a checkpoint's tokens differ by a few between runs)."""
    values = np.unique(d)
    return np.array([v for v, above in zip(values, values[1:]) if above > v * (1 + DATA_CUT_TOLERANCE)] + [values[-1]])


def holdout_splits(law: Law, data: Data, kind: str) -> list[tuple[str, np.ndarray]]:
    """(name, train mask) pairs as in the Ouro appendix; the test set is the complement.

    size: fit on the smallest 60% of model sizes (3 of 5), and on at least 3 where a larger one is
    left to test (3 of 4: two levels cannot identify A, alpha and t1); test on the larger ones
    (extrapolation).
    data: fit on the first part of training, test on the rest. Where D has few levels (at most
    MAX_DATA_LEVELS: checkpoints read as D), on the first k of m levels for each k >= 3 (three levels
    identify B, beta and t2; k = m - 1 where m <= 3); otherwise on D <= 25/50/75% of the largest D
    (D within 1% of the cut counts as at it).
    steps: leave each value of the recurrence variable (Tm, or T for the step-wise law) out in turn.
    """
    if kind == "size":
        n = np.asarray(data.variables.get("N", []))
        sizes = np.unique(n)
        if "N" not in law.variables or len(sizes) < 3:
            raise SynthlabError(
                f"--holdout size needs a law over N and at least 3 distinct sizes "
                f"(law '{law.name}', {len(sizes)} sizes)"
            )
        k = max(int(round(0.6 * len(sizes))), min(3, len(sizes) - 1))
        return [(f"smallest {k} of {len(sizes)} sizes", n <= sizes[k - 1])]
    if kind == "data":
        if "D" not in law.variables:
            raise SynthlabError(f"--holdout data needs a law over D (law '{law.name}' has {list(law.variables)})")
        d = np.asarray(data.variables["D"])
        levels = data_levels(d)
        if len(levels) < 2:
            raise SynthlabError("--holdout data needs at least 2 levels of D")
        if len(levels) <= MAX_DATA_LEVELS:
            return [
                (f"first {k} of {len(levels)} D levels", d <= levels[k - 1])
                for k in range(min(3, len(levels) - 1), len(levels))
            ]
        return [
            (f"first {int(100 * q)}% of data", d <= q * d.max() * (1 + DATA_CUT_TOLERANCE)) for q in (0.25, 0.5, 0.75)
        ]
    if kind == "steps":
        var = next((v for v in ("Tm", "T") if v in law.variables), None)
        if var is None:
            raise SynthlabError(
                f"--holdout steps needs a law over Tm or T (law '{law.name}' has {list(law.variables)})"
            )
        t = np.asarray(data.variables[var])
        values = np.unique(t)
        if len(values) < 2:
            raise SynthlabError(f"--holdout steps needs at least 2 distinct {var} values, got {len(values)}")
        return [(f"leave {var}={v:g} out", t != v) for v in values]
    raise SynthlabError(f"unknown hold-out '{kind}'; choose from {', '.join(HOLDOUT_KINDS)}")


def holdout(law: Law | str, data: Data, kind: str, options: FitOptions = FitOptions()) -> list[HoldoutRow]:
    """Fit on each split's training rows, report R^2 on train and test and the test RMSE (log)."""
    law = get_law(law) if isinstance(law, str) else law
    rows = []
    for name, train in holdout_splits(law, data, kind):
        if train.sum() <= len(law.params) or (~train).sum() == 0:
            raise SynthlabError(
                f"hold-out '{name}' leaves {int(train.sum())} training and {int((~train).sum())} test rows; too few"
            )
        train_data, test_data = data.subset(train), data.subset(~train)
        result = fit(law, train_data, options)
        r2_test, rmse_test = goodness(law, result.theta, test_data.matrix(law), np.asarray(test_data.loss, dtype=float))
        thin = thin_levels(law, data, train)
        if thin:
            warn(f"hold-out '{name}' leaves {thin} to fit {law.name} on: its constants are not identified")
        rows.append(HoldoutRow(name, int(train.sum()), int((~train).sum()), result.r2, r2_test, rmse_test, thin))
    return rows


@dataclasses.dataclass(frozen=True)
class LackOfFit:
    """Does the law's form leave more than seed noise? A lack-of-fit test on log loss.

    Rows at one design point (`design_cells`) are replicates, e.g. seeds; their scatter about the
    point's mean is pure error, which no law of these variables can explain. The residual sum of
    squares of the law's least-squares fit beyond it is the lack of fit. The classical test reads
    F = (ss_lack / (cells - params)) / (ss_pure / (rows - cells)) against the F distribution (`p`),
    which assumes independent rows of one variance. A sweep's rows are neither: one run's
    checkpoints and recurrent steps share its seed's luck, and some points' seeds disagree far more
    than others'. `p_runs` keeps both: a wild bootstrap that adds each run's own pure-error
    residuals, the sign flipped per run, to the fitted law, and refits it linearised at the optimum
    (the Jacobian's column space); p_runs is the share of resamples whose ss_lack / ss_pure reaches
    the data's. A small p says the law's form departs from the data by more than the replicates
    scatter, whatever its constants (a degenerate fit included: it is the family's best, at its
    boundary), provided the refit found the family's best fit (it starts at the multi-start optimum
    and the next best basins).
    """

    rows: int
    cells: int
    params: int
    runs: int  # independent units the bootstrap flips: training runs (each row its own without run ids)
    ss_pure: float
    ss_lack: float
    f: float
    p: float  # F distribution: independent rows of one variance
    p_runs: float  # wild bootstrap over runs (NaN without resamples)
    resamples: int  # wild-bootstrap draws behind p_runs (0: none; the F test's p decides)
    r2_ceiling: float  # R^2 (loss space) of the design points' mean losses: no law of these variables exceeds it


def design_levels(law: Law, data: Data) -> dict[str, np.ndarray]:
    """{variable of `law`: (rows,) index of each row's level}: values within DATA_CUT_TOLERANCE of
    each other are one level, as `data_levels` groups D (a checkpoint's tokens differ by a few
    between seeds)."""
    return {
        v: np.searchsorted(data_levels(values), values)
        for v in law.variables
        for values in [np.asarray(data.variables[v], dtype=float)]
    }


def design_cells(law: Law, data: Data) -> np.ndarray:
    """(rows,) index of each row's design point: the rows whose every variable of `law` is at the
    same level (`design_levels`)."""
    levels = design_levels(law, data)
    return np.unique(np.column_stack([levels[v] for v in law.variables]), axis=0, return_inverse=True)[1].ravel()


def lack_of_fit(
    law: Law | str,
    data: Data,
    theta: np.ndarray,
    rng: np.random.Generator | None = None,
    resamples: int = 1000,
    options: FitOptions = FitOptions(),
) -> LackOfFit | None:
    """The lack-of-fit test of `law` fitted by least squares from `theta`, (P,) or (k, P): the fit's
    optimum and its next best basins (`FitResult.basins`), the best refit kept; `resamples`
    wild-bootstrap draws from `rng` (none without rng). None where the data have no replicates or no
    more design points than the law has parameters."""
    law = get_law(law) if isinstance(law, str) else law
    cells = design_cells(law, data)
    n_cells = int(cells.max()) + 1
    if n_cells == len(cells) or n_cells <= len(law.params):
        return None  # before the refits; lack_of_fit_test says so too
    X, log_loss = data.matrix(law), np.log(np.asarray(data.loss, dtype=float))
    refits = [refit_from(law, data, start, options, max_nfev=5000, robust=False)[0] for start in np.atleast_2d(theta)]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        sse = [float(np.sum((np.log(law.predict(t, X)) - log_loss) ** 2)) for t in refits]
        optimum = refits[int(np.nanargmin(sse))]
        J = jacobian(law, X, optimum) if rng is not None and resamples > 0 else None
    return lack_of_fit_test(data, cells, float(np.nanmin(sse)), len(law.params), J, rng, resamples)


def lack_of_fit_test(
    data: Data,
    cells: np.ndarray,
    sse: float,
    params: int,
    J: np.ndarray | None,
    rng: np.random.Generator | None = None,
    resamples: int = 1000,
) -> LackOfFit | None:
    """The lack-of-fit test of any model of the design points fitted by least squares on log loss:
    `sse` its residual sum of squares, `params` its parameter count, `J` (rows, params) the
    Jacobian of its log prediction at the optimum (for the wild bootstrap over `data.runs`; None:
    the F test only). None where the data have no replicates or too few design points. The bootstrap
    assumes the model's parameters do not follow the runs: a free value per small group of runs
    (per (N, Tm) on a sweep's grid) absorbs part of their shared luck, and the bootstrap is then
    not calibrated for it (benchmarks/law_form_check.py leaves that model out)."""
    n_cells, rows = int(cells.max()) + 1, len(cells)
    if n_cells == rows or n_cells <= params:
        return None
    loss = np.asarray(data.loss, dtype=float)
    log_loss = np.log(loss)
    counts = np.bincount(cells)[cells]

    def pure_residuals(values: np.ndarray) -> np.ndarray:  # (..., rows): each row minus its design point's mean
        means = np.stack([np.bincount(cells, v) for v in np.atleast_2d(values)]) / np.bincount(cells)
        return values - means[:, cells].reshape(np.shape(values))

    ss_pure = float((pure_residuals(log_loss) ** 2).sum())
    ss_lack = max(sse - ss_pure, 0.0)
    df_lack, df_pure = n_cells - params, rows - n_cells
    f = (ss_lack / df_lack) / (ss_pure / df_pure) if ss_pure > 0 else np.inf
    runs = np.unique(data.runs if data.runs is not None else np.arange(rows), return_inverse=True)[1].ravel()
    p_runs, drawn_count = np.nan, 0
    if rng is not None and resamples > 0 and ss_pure > 0 and J is not None:
        drawn_count = resamples
        J = np.where(np.isfinite(J), J, 0.0)
        scale = np.abs(J).max(axis=0)
        J = J[:, scale > 0] / scale[scale > 0]  # the same column space, columns of one scale
        u, sv, _ = np.linalg.svd(J, full_matrices=False)
        basis = u[:, sv > sv[0] * 1e-10] if sv[0] > 0 else u[:, :0]
        noise = pure_residuals(log_loss) * np.sqrt(np.where(counts > 1, counts / np.maximum(counts - 1, 1), 0.0))
        drawn = rng.choice([-1.0, 1.0], size=(resamples, runs.max() + 1))[:, runs] * noise  # (resamples, rows)
        fitted_away = drawn - (drawn @ basis) @ basis.T  # the linearised least-squares refit's residuals
        pure = (pure_residuals(drawn) ** 2).sum(axis=1)
        lack = (fitted_away**2).sum(axis=1) - pure
        p_runs = float((1 + np.sum(lack / pure >= ss_lack / ss_pure)) / (resamples + 1))
    ceiling = 1 - (pure_residuals(loss) ** 2).sum() / ((loss - loss.mean()) ** 2).sum()
    return LackOfFit(
        rows,
        n_cells,
        params,
        int(runs.max()) + 1,
        ss_pure,
        ss_lack,
        float(f),
        float(stats.f.sf(f, df_lack, df_pure)),
        p_runs,
        drawn_count,
        float(ceiling),
    )
