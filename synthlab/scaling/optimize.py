"""Fitting a loss law: the Huber objective, a batched L-BFGS over a grid of starts, and the fit driver.

A law is fitted as in Chinchilla approach 3 (Hoffmann et al. 2022; Besiroglu et al. 2024):
minimise the SUM over runs of Huber_delta(log L_hat - log L), delta = 1e-3, with L-BFGS and
analytic gradients from every point of a grid of starts, and keep the best. Averaging instead of
summing shrinks the objective and its gradient by the number of runs, so L-BFGS's absolute
stopping rules (ftol, gtol) fire before it has moved: a known trap.

Speed: a per-start scipy loop spends nearly all its time in Python overhead (a 240-row objective
is microseconds of arithmetic). Here all starts run together: `minimize_batched` is L-BFGS whose
objective, gradient, two-loop recursion and backtracking line search act on a (starts, rows)
array at once, with the same stopping rules as scipy's L-BFGS-B. The best few distinct endpoints
are then polished at tight tolerance by scipy's trust-region least squares with the same Huber
loss, so the answer is at least as good as the straightforward per-start loop's best
(benchmarks/scipy_baseline.py; tests/test_scaling.py checks this on a subsample of starts,
benchmarks/bench_fit.py on all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

import numpy as np
from scipy import optimize

from synthlab.errors import SynthlabError
from synthlab.scaling.laws import Data, Law, get_law

SCIPY_FTOL = 2.220446049250313e-09  # scipy L-BFGS-B defaults: the published procedure's stopping rules
SCIPY_GTOL = 1e-05


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """How to fit. The defaults are the published procedure plus a tight polish of the best starts."""

    delta: float = 1e-3
    reduction: Literal["sum", "mean"] = "sum"
    ftol: float = SCIPY_FTOL
    gtol: float = SCIPY_GTOL
    max_iter: int = 1000
    ftol_floor: float = 1.0  # scipy's rule divides the decrease by max(|f|, ftol_floor); 0 makes it scale-free
    polish: int = 5  # best distinct endpoints refined by scipy least squares at tight tolerance; 0 = none
    # The polish and the bootstrap's warm-started refits stop at these: the absolute ftol rule above
    # is loose for objectives ~1e-3 and would stop a start that begins near the optimum at once.
    tight_ftol: float = 1e-15
    tight_gtol: float = 1e-12
    reach_rtol: float = 1e-4  # a start "reached" the optimum if its objective is this close

    def __post_init__(self) -> None:
        if not self.delta > 0 or not np.isfinite(self.delta):  # NaN compares false both ways
            raise SynthlabError(f"delta (--delta, the Huber delta) must be a finite number > 0, got {self.delta}")
        if self.reduction not in ("sum", "mean"):
            raise SynthlabError(f"reduction must be 'sum' or 'mean', got '{self.reduction}'")
        tolerances = (self.ftol, self.gtol, self.tight_ftol, self.tight_gtol, self.reach_rtol)
        if min(tolerances) <= 0 or self.ftol_floor < 0 or self.max_iter < 1 or self.polish < 0:
            raise SynthlabError("ftol, gtol, reach_rtol must be > 0, ftol_floor >= 0, max_iter >= 1 and polish >= 0")


def huber_objective(
    law: Law,
    X: np.ndarray,
    log_loss: np.ndarray,
    weights: np.ndarray,
    options: FitOptions,
) -> Callable[[np.ndarray, np.ndarray, bool], tuple[np.ndarray, np.ndarray | None]]:
    """objective(theta (s, P), rows_of (s,) indices into `weights` (B, R), need_grad) -> f (s,), g (s, P).

    Bootstrap resamples are row weights (multiplicities), so one objective serves every resample.
    """
    scale = 1.0 / weights.sum(axis=1) if options.reduction == "mean" else np.ones(len(weights))

    uniform = bool((weights == weights[0, 0]).all())
    chunk = max(1, 2**14 // X.shape[0])

    def objective(theta, which, need_grad):
        # Chunks of starts keep the (chunk, R) temporaries in cache: several times faster than one pass.
        if len(theta) > chunk:
            parts = [
                objective(theta[i : i + chunk], which[i : i + chunk], need_grad) for i in range(0, len(theta), chunk)
            ]
            return np.concatenate([f for f, _ in parts]), (np.concatenate([g for _, g in parts]) if need_grad else None)
        log_pred, vjp = law.log_predict(theta, X, need_grad)
        r = log_pred - log_loss  # (s, R)
        clipped = np.clip(r, -options.delta, options.delta)  # Huber'(r)
        # Huber(r) = 0.5 r^2 if |r| <= delta else delta (|r| - delta / 2), i.e. clipped * (r - clipped / 2).
        if uniform:  # the plain fit: skip the (s, R) weight multiply
            w = weights[0, 0] * scale[which]
            f = w * np.einsum("sr,sr->s", clipped, r - 0.5 * clipped)
            return f, (vjp(clipped) * w[:, None] if need_grad else None)
        w = weights[which] * scale[which, None]
        f = np.einsum("sr,sr->s", w * clipped, r - 0.5 * clipped)
        return f, (vjp(w * clipped) if need_grad else None)

    return objective


@dataclasses.dataclass(frozen=True)
class BatchResult:
    theta: np.ndarray  # (S, P) endpoints
    f: np.ndarray  # (S,)
    status: np.ndarray  # (S,) one of STATUS
    iterations: np.ndarray  # (S,)


STATUS = ("running", "gtol", "ftol", "line search failed", "max_iter")


def minimize_batched(
    objective: Callable,
    theta0: np.ndarray,
    which: np.ndarray,
    *,
    ftol: float = SCIPY_FTOL,
    gtol: float = SCIPY_GTOL,
    max_iter: int = 1000,
    ftol_floor: float = 1.0,
    memory: int = 10,
    max_backtracks: int = 30,
) -> BatchResult:
    """L-BFGS on many independent problems at once: theta0 (S, P), `which` (S,) passed to objective.

    Stopping rules as scipy's L-BFGS-B: max |g| <= gtol, or (f_k - f_k+1) / max(|f_k|, |f_k+1|, 1)
    <= ftol (ftol_floor replaces that 1; 0 makes the rule scale-free, so the objective's scale,
    e.g. sum vs mean, stops mattering). The line search backtracks from step 1 (Armijo, quadratic
    interpolation); on failure
    the memory is dropped and steepest descent is tried before the start is given up.
    """
    S, P = theta0.shape
    theta = theta0.astype(float).copy()
    f, g = objective(theta, which, True)
    s_hist = np.zeros((S, memory, P))  # newest pair first
    y_hist = np.zeros((S, memory, P))
    rho = np.zeros((S, memory))  # 0 marks an empty slot, which the two-loop recursion then skips
    status = np.where(np.abs(g).max(axis=1) <= gtol, 1, 0)
    status[~np.isfinite(f)] = 3
    iterations = np.zeros(S, dtype=int)
    for _ in range(max_iter):
        act = np.flatnonzero(status == 0)
        if act.size == 0:
            break
        iterations[act] += 1
        ga, sa, ya, ra = g[act], s_hist[act], y_hist[act], rho[act]
        # Two-loop recursion, vectorised over the active starts: d = -H g.
        q = ga.copy()
        alpha = np.zeros((act.size, memory))
        for i in range(memory):
            alpha[:, i] = ra[:, i] * np.einsum("sp,sp->s", sa[:, i], q)
            q -= alpha[:, i, None] * ya[:, i]
        yy = np.einsum("sp,sp->s", ya[:, 0], ya[:, 0])
        has_pair = ra[:, 0] > 0
        gamma = np.where(
            has_pair, 1.0 / np.where(has_pair, ra[:, 0] * yy, 1.0), 1.0 / np.maximum(np.linalg.norm(ga, axis=1), 1e-300)
        )
        q *= gamma[:, None]
        for i in reversed(range(memory)):
            beta = ra[:, i] * np.einsum("sp,sp->s", ya[:, i], q)
            q += (alpha[:, i] - beta)[:, None] * sa[:, i]
        d = -q
        slope = np.einsum("sp,sp->s", ga, d)
        uphill = ~(slope < 0)
        d[uphill] = -ga[uphill] * gamma[uphill, None]
        slope[uphill] = np.einsum("sp,sp->s", ga[uphill], d[uphill])
        # Backtracking line search on the still-unsatisfied subset.
        step = np.ones(act.size)
        f_new = np.full(act.size, np.inf)
        g_new = np.zeros((act.size, P))
        pending = np.arange(act.size)
        for _ in range(max_backtracks):
            idx = act[pending]
            trial = theta[idx] + step[pending, None] * d[pending]
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                ft, gt = objective(trial, which[idx], True)
            ok = np.isfinite(ft) & np.isfinite(gt).all(axis=1) & (ft <= f[idx] + 1e-4 * step[pending] * slope[pending])
            f_new[pending[ok]], g_new[pending[ok]] = ft[ok], gt[ok]
            bad = pending[~ok]
            fb = np.where(np.isfinite(ft[~ok]), ft[~ok], np.inf)
            sb = step[bad]
            # Minimiser of the quadratic through f(0), f'(0), f(step), kept within [0.1, 0.5] * step.
            curv = fb - f[act[bad]] - slope[bad] * sb
            interp = np.where(curv > 0, -slope[bad] * sb * sb / (2 * np.where(curv > 0, curv, 1.0)), 0.5 * sb)
            step[bad] = np.clip(interp, 0.1 * sb, 0.5 * sb)
            pending = bad
            if pending.size == 0:
                break
        failed = np.zeros(act.size, dtype=bool)
        failed[pending] = True
        # A failed search with memory retries as steepest descent next iteration; without, gives up.
        had_memory = failed & has_pair & ~uphill
        rho[act[had_memory]] = 0.0
        status[act[failed & ~had_memory]] = 3
        done = ~failed
        idx = act[done]
        s_new = step[done, None] * d[done]
        y_new = g_new[done] - g[idx]
        sy = np.einsum("sp,sp->s", s_new, y_new)
        keep = sy > np.finfo(float).eps * np.einsum("sp,sp->s", y_new, y_new)
        kept = idx[keep]
        s_hist[kept] = np.concatenate([s_new[keep, None], s_hist[kept, :-1]], axis=1)
        y_hist[kept] = np.concatenate([y_new[keep, None], y_hist[kept, :-1]], axis=1)
        rho[kept] = np.concatenate([1.0 / sy[keep, None], rho[kept, :-1]], axis=1)
        decrease = (f[idx] - f_new[done]) / np.maximum(np.maximum(np.abs(f[idx]), np.abs(f_new[done])), ftol_floor)
        theta[idx] += s_new
        f[idx], g[idx] = f_new[done], g_new[done]
        status[idx[decrease <= ftol]] = 2
        status[idx[np.abs(g_new[done]).max(axis=1) <= gtol]] = 1
    status[status == 0] = 4
    return BatchResult(theta, f, status, iterations)


@dataclasses.dataclass(frozen=True)
class FitResult:
    """The best fit of `law` to data, with how it was reached and how well it fits."""

    law: str
    theta: np.ndarray  # fit-space optimum (P,)
    params: dict[str, float]  # reported parameters (E, A, alpha, ...)
    objective: float  # Huber objective at the optimum (summed unless options.reduction == "mean")
    converged: bool  # the run that produced the optimum met a stopping rule (not a line-search failure)
    message: str
    n_starts: int
    n_reached: int  # starts whose grid-stage endpoint (scipy's default tolerances) is within reach_rtol of the optimum
    r2: float  # in loss space
    rmse_log: float
    n_rows: int
    basins: np.ndarray  # (k, P) best distinct endpoints, optimum first: warm starts for the bootstrap


def goodness(law: Law, theta: np.ndarray, X: np.ndarray, loss: np.ndarray) -> tuple[float, float]:
    """(R^2 in loss space, RMSE in log space) of fit-space theta on rows X, loss."""
    pred = law.predict(theta, X)
    spread = float(((loss - loss.mean()) ** 2).sum())
    r2 = 1.0 - float(((loss - pred) ** 2).sum()) / spread if spread > 0 else float("nan")
    return r2, float(np.sqrt(np.mean((np.log(pred) - np.log(loss)) ** 2)))


def distinct(theta: np.ndarray, order: np.ndarray, k: int, tol: float = 1e-2) -> np.ndarray:
    """Indices of up to k rows of theta, in `order`, that differ from every earlier pick by > tol."""
    picks: list[int] = []
    for i in order:
        if all(np.abs(theta[i] - theta[j]).max() > tol for j in picks):
            picks.append(int(i))
            if len(picks) == k:
                break
    return np.array(picks, dtype=int)


def fit(law: Law | str, data: Data, options: FitOptions = FitOptions(), starts: np.ndarray | None = None) -> FitResult:
    """Fit `law` to `data` from every start (default: the law's grid) and keep the best."""
    law = get_law(law) if isinstance(law, str) else law
    X = data.matrix(law)
    loss = np.asarray(data.loss, dtype=float)
    if len(loss) <= len(law.params):
        raise SynthlabError(
            f"law '{law.name}' has {len(law.params)} parameters but only {len(loss)} rows; need more rows"
        )
    starts = law.starts(X) if starts is None else np.atleast_2d(np.asarray(starts, dtype=float))
    weights = np.ones((1, len(loss)))
    objective = huber_objective(law, X, np.log(loss), weights, options)
    which = np.zeros(len(starts), dtype=int)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        batch = minimize_batched(
            objective,
            starts,
            which,
            ftol=options.ftol,
            gtol=options.gtol,
            max_iter=options.max_iter,
            ftol_floor=options.ftol_floor,
        )
    f = np.where(np.isfinite(batch.f), batch.f, np.inf)
    order = np.argsort(f, kind="stable")
    basins = distinct(batch.theta, order[np.isfinite(f[order])], max(options.polish, 5))
    if basins.size == 0:
        raise SynthlabError(f"law '{law.name}': no start reached a finite objective; check the data")
    best_theta, best_f = batch.theta[basins[0]], float(f[basins[0]])
    converged, message = bool(batch.status[basins[0]] in (1, 2)), STATUS[batch.status[basins[0]]]
    for i in basins[: options.polish]:
        polished = _polish(law, X, np.log(loss), batch.theta[i], options)
        f_polished = float(objective(polished.x[None, :], which[:1], False)[0][0])
        if f_polished < best_f:
            best_theta, best_f = polished.x, f_polished
            converged, message = bool(polished.success), f"polished: {polished.message}"
    n_reached = int((f <= best_f + options.reach_rtol * abs(best_f)).sum())
    r2, rmse = goodness(law, best_theta, X, loss)
    return FitResult(
        law=law.name,
        theta=best_theta,
        params=law.report(best_theta),
        objective=best_f,
        converged=converged,
        message=message,
        n_starts=len(starts),
        n_reached=n_reached,
        r2=r2,
        rmse_log=rmse,
        n_rows=len(loss),
        basins=np.vstack([best_theta, batch.theta[basins[1:]]]),
    )


def refit_from(
    law: Law,
    data: Data,
    theta: np.ndarray,
    options: FitOptions = FitOptions(),
    max_nfev: int = 500,
    robust: bool = True,
) -> tuple[np.ndarray, bool]:
    """(optimum, converged) of `law` on `data` by the polish (trust-region least squares) started
    at fit-space `theta`, within max_nfev evaluations: the bootstrap's cold start from the full-data fit.
    robust=False minimises plain squared log residuals instead of the Huber loss (the lack-of-fit test)."""
    X = data.matrix(law)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        polished = _polish(
            law,
            X,
            np.log(np.asarray(data.loss, dtype=float)),
            np.asarray(theta, dtype=float),
            options,
            max_nfev,
            robust,
        )
    return polished.x, bool(polished.success)


def jacobian(law: Law, X: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """d log L_hat / d theta at fit-space `theta` (P,): (rows, P), row i the vector-Jacobian product
    with the i-th unit vector."""
    rows = len(X)
    _, vjp = law.log_predict(np.tile(theta, (rows, 1)), X, True)
    return vjp(np.eye(rows))


def _polish(
    law: Law,
    X: np.ndarray,
    log_loss: np.ndarray,
    theta: np.ndarray,
    options: FitOptions,
    max_nfev: int = 5000,
    robust: bool = True,
):
    """Refine one endpoint by scipy's trust-region least squares with the same Huber loss
    (robust=False: with squared residuals).

    least_squares(loss="huber", f_scale=delta) minimises sum 2 Huber_delta(r): twice our summed
    objective, so the same optimum. Its Gauss-Newton model copes with the long curved valleys of
    the offset laws, where L-BFGS crawls (LoopLM: 0.2 s here against minutes).
    """

    def residuals(x):
        return law.log_predict(x[None, :], X, False)[0][0] - log_loss

    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return optimize.least_squares(
            residuals,
            theta,
            jac=lambda x: jacobian(law, X, x),
            loss="huber" if robust else "linear",
            f_scale=options.delta,
            method="trf",
            xtol=options.tight_ftol,
            ftol=options.tight_ftol,
            gtol=options.tight_gtol,
            max_nfev=max_nfev,
        )
