"""Loss scaling laws as data, and a fast, exact fitter for them (numpy + scipy only, no torch).

A law predicts log L from a few variables (N parameters, D tokens, Tm maximum recurrent steps,
T the recurrent step, or a generic x). It is fitted as in Chinchilla approach 3 (Hoffmann et al.
2022; Besiroglu et al. 2024): minimise the SUM over runs of Huber_delta(log L_hat - log L),
delta = 1e-3, with L-BFGS and analytic gradients from every point of a grid of starts, and keep
the best. Averaging instead of summing shrinks the objective and its gradient by the number of
runs, so L-BFGS's absolute stopping rules (ftol, gtol) fire before it has moved: a known trap.

Speed: a per-start scipy loop spends nearly all its time in Python overhead (a 240-row objective
is microseconds of arithmetic). Here all starts run together: `minimize_batched` is L-BFGS whose
objective, gradient, two-loop recursion and backtracking line search act on a (starts, rows)
array at once, with the same stopping rules as scipy's L-BFGS-B. The best few distinct endpoints
are then polished at tight tolerance by scipy's trust-region least squares with the same Huber
loss, so the answer is at least as good as the straightforward per-start loop's best
(tests/test_scaling.py checks this on a subsample of starts; benchmarks/bench_fit.py on all).

Fit-space parameters named `log_X` are reported as X = exp(log_X) (E, A, B, C and the offsets
t1..t3, which thereby stay positive); every other parameter is reported as is.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np
from scipy import optimize

from synthlab.errors import SynthlabError

# (starts, P), (rows, V), need_grad -> log L_hat (starts, rows) and, if need_grad, its vector-Jacobian
# product: a function from d objective / d log L_hat (starts, rows) to d objective / d theta (starts, P).
LogPredict = Callable[[np.ndarray, np.ndarray, bool], tuple[np.ndarray, Callable | None]]

SCIPY_FTOL = 2.220446049250313e-09  # scipy L-BFGS-B defaults: the published procedure's stopping rules
SCIPY_GTOL = 1e-05


@dataclasses.dataclass(frozen=True)
class Law:
    """A loss law: what it reads, its fit-space parameters, its log prediction and start grid.

    `start_grid(X)` gives, for every fit-space parameter, the values whose Cartesian product is the
    default grid of starts; it sees the data X (rows, len(variables)) so offsets can be scaled to it.
    """

    name: str
    formula: str
    variables: tuple[str, ...]
    params: tuple[str, ...]
    log_predict: LogPredict
    start_grid: Callable[[np.ndarray], Mapping[str, Sequence[float]]]

    def report(self, theta: np.ndarray) -> dict[str, float]:
        """Fit-space vector (P,) -> reported parameters (log_X -> X = exp(log_X); inf if it overflows)."""
        with np.errstate(over="ignore"):
            return {
                p.removeprefix("log_"): float(np.exp(v) if p.startswith("log_") else v)
                for p, v in zip(self.params, theta)
            }

    def starts(self, X: np.ndarray) -> np.ndarray:
        """The default grid of starts, (starts, P), in the order of `params`."""
        grid = self.start_grid(X)
        return np.array(list(itertools.product(*(grid[p] for p in self.params))), dtype=float)

    def predict(self, theta: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Loss L_hat (rows,) for one fit-space vector theta (P,)."""
        return np.exp(self.log_predict(np.asarray(theta)[None, :], X, False)[0][0])


@dataclasses.dataclass(frozen=True)
class PowerTerm:
    """One term coef / (variable + offset)^exponent of a sum-of-power-laws law."""

    variable: str
    coef: str
    exponent: str
    offset: str | None = None


def power_sum_law(
    name: str,
    terms: Sequence[PowerTerm],
    start_grid: Callable[[np.ndarray], Mapping[str, Sequence[float]]],
) -> Law:
    """L = E + sum_k coef_k / (x_k + offset_k)^exponent_k, predicted as log L.

    Fit-space parameters: log_E, then per term log_<coef>, <exponent>, [log_<offset>].
    """
    variables = tuple(dict.fromkeys(t.variable for t in terms))
    params = ["log_E"]
    for t in terms:
        params += [f"log_{t.coef}", t.exponent] + ([f"log_{t.offset}"] if t.offset else [])
    index = {p: i for i, p in enumerate(params)}
    column = [variables.index(t.variable) for t in terms]

    def log_predict(theta, X, need_grad):
        # Arrays are (starts, rows) unless noted. The summands are exponentiated unshifted (no
        # log-sum-exp max): half the passes over memory, and a summand that over- or underflows
        # makes the objective non-finite, which the line search rejects like any bad step.
        log_x, offset_frac, summands = [], [], []
        for k, t in enumerate(terms):
            x = X[:, column[k]]
            if t.offset:
                offset = np.exp(theta[:, index[f"log_{t.offset}"], None])  # (starts, 1)
                log_x.append(np.log(x + offset))
                offset_frac.append(offset / (x + offset))  # d log(x + t) / d log t
            else:
                log_x.append(np.log(x)[None, :])  # (1, rows)
                offset_frac.append(None)
            log_coef, exponent = theta[:, index[f"log_{t.coef}"], None], theta[:, index[t.exponent], None]
            summands.append(np.exp(log_coef - exponent * log_x[k]))
        floor = np.exp(theta[:, index["log_E"]])  # (starts,)
        total = floor[:, None] + sum(summands[1:], summands[0])
        log_pred = np.log(total)
        if not need_grad:
            return log_pred, None

        def vjp(upstream):
            """upstream d objective / d log L_hat (starts, rows) -> d objective / d theta (starts, P)."""
            scaled = upstream / total
            grad = np.empty((theta.shape[0], len(params)))
            grad[:, index["log_E"]] = scaled.sum(axis=1) * floor
            for k, t in enumerate(terms):
                share = scaled * summands[k]  # upstream * d log L_hat / d log(summand k)
                grad[:, index[f"log_{t.coef}"]] = share.sum(axis=1)
                if t.offset:
                    grad[:, index[t.exponent]] = -np.einsum("sr,sr->s", share, log_x[k])
                    p = theta[:, index[t.exponent]]
                    grad[:, index[f"log_{t.offset}"]] = -p * np.einsum("sr,sr->s", share, offset_frac[k])
                else:
                    grad[:, index[t.exponent]] = -np.einsum("sr,r->s", share, log_x[k][0])
            return grad

        return log_pred, vjp

    formula = "L = E + " + " + ".join(
        f"{t.coef}/({t.variable} + {t.offset})^{t.exponent}" if t.offset else f"{t.coef}/{t.variable}^{t.exponent}"
        for t in terms
    )
    return Law(name, formula, variables, tuple(params), log_predict, start_grid)


LAWS: dict[str, Law] = {}


def register_law(law: Law) -> Law:
    """Add a law to the registry under its name (names are unique)."""
    if law.name in LAWS:
        raise ValueError(f"law '{law.name}' is already registered")
    LAWS[law.name] = law
    return law


def get_law(name: str) -> Law:
    if name not in LAWS:
        close = difflib.get_close_matches(name, list(LAWS), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise SynthlabError(f"unknown law '{name}'{hint}; known: {', '.join(sorted(LAWS))}")
    return LAWS[name]


def _half_steps(lo: float, hi: float) -> tuple[float, ...]:
    return tuple(np.arange(lo, hi + 0.25, 0.5))


# The published grid (Besiroglu et al. 2024): 5 x 5 x 5 x 6 x 6 = 4,500 starts.
CHINCHILLA_GRID = {
    "log_E": _half_steps(-1, 1),
    "log_A": tuple(range(0, 26, 5)),
    "log_B": tuple(range(0, 26, 5)),
    "alpha": _half_steps(0, 2),
    "beta": _half_steps(0, 2),
}


def _offset_start(X: np.ndarray, col: int) -> tuple[float]:
    """Offsets start at 1/20 of the smallest value of their variable: small, but on its scale."""
    return (float(np.log(X[:, col].min())) - 3.0,)


def _looplm_grid(X: np.ndarray) -> dict[str, tuple[float, ...]]:
    # 3 * 3 * 2 * 3 * 2 * 2 * 2 = 432 starts over the 10 parameters; offsets are scaled to the data
    # because one fixed grid cannot suit N ~ 1e5 and Tm ~ 4 alike.
    return {
        "log_E": (-1.0, 0.0, 1.0),
        "log_A": (0.0, 10.0, 20.0),
        "alpha": (0.25, 1.0),
        "log_t1": _offset_start(X, 0),
        "log_B": (0.0, 10.0, 20.0),
        "beta": (0.25, 1.0),
        "log_t2": _offset_start(X, 1),
        "log_C": (-2.0, 0.0),
        "gamma": (0.5, 1.5),
        "log_t3": _offset_start(X, 2),
    }


def _power_grid(X: np.ndarray) -> dict[str, tuple[float, ...]]:
    # Negative exponents are in the grid so growing curves (bits vs params) fit too.
    return {
        "log_E": (-3.0, -1.0, 0.0, 1.0),
        "log_A": (-5.0, 0.0, 5.0, 10.0, 15.0),
        "alpha": (-1.0, -0.5, 0.25, 0.5, 1.0, 2.0),
        "log_t": (*_offset_start(X, 0), float(np.log(X[:, 0].min()))),
    }


CHINCHILLA = register_law(power_sum_law(
    "chinchilla",
    [PowerTerm("N", "A", "alpha"), PowerTerm("D", "B", "beta")],
    lambda X: CHINCHILLA_GRID,
))
LOOPLM = register_law(power_sum_law(
    "looplm",
    [PowerTerm("N", "A", "alpha", "t1"), PowerTerm("D", "B", "beta", "t2"),
     PowerTerm("Tm", "C", "gamma", "t3")],
    _looplm_grid,
))
# The step-wise law for one Tm: the LoopLM form with T, the recurrent step (1..Tm), in place of Tm.
STEPS = register_law(power_sum_law(
    "steps",
    [PowerTerm("N", "A", "alpha", "t1"), PowerTerm("D", "B", "beta", "t2"),
     PowerTerm("T", "C", "gamma", "t3")],
    _looplm_grid,
))
POWER = register_law(power_sum_law("power", [PowerTerm("x", "A", "alpha", "t")], _power_grid))


@dataclasses.dataclass(frozen=True)
class Data:
    """Runs to fit: variables[name] and loss, all (rows,), finite and positive.

    `labels` maps a variable name (and "loss") to what the user calls it (a CSV column), for
    error messages.
    """

    variables: Mapping[str, np.ndarray]
    loss: np.ndarray
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        rows = len(self.loss)
        for name, values in [*self.variables.items(), ("loss", self.loss)]:
            label = self.labels.get(name, name)
            values = np.asarray(values, dtype=float)
            if values.shape != (rows,):
                raise SynthlabError(f"'{label}' has shape {values.shape}, expected ({rows},)")
            if not np.isfinite(values).all():
                raise SynthlabError(f"'{label}' has {int((~np.isfinite(values)).sum())} NaN or infinite values")
            if (values <= 0).any():
                raise SynthlabError(f"'{label}' has {int((values <= 0).sum())} non-positive values; all must be > 0")

    def matrix(self, law: Law) -> np.ndarray:
        """The law's variables as a (rows, V) float array."""
        missing = [v for v in law.variables if v not in self.variables]
        if missing:
            raise SynthlabError(f"law '{law.name}' needs variables {missing}, data has {sorted(self.variables)}")
        return np.column_stack([np.asarray(self.variables[v], dtype=float) for v in law.variables])

    def subset(self, rows: np.ndarray) -> Data:
        variables = {k: np.asarray(v)[rows] for k, v in self.variables.items()}
        return Data(variables, np.asarray(self.loss)[rows], self.labels)


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
        if self.delta <= 0:
            raise SynthlabError(f"delta must be > 0, got {self.delta}")
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
            parts = [objective(theta[i:i + chunk], which[i:i + chunk], need_grad) for i in range(0, len(theta), chunk)]
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
        gamma = np.where(has_pair, 1.0 / np.where(has_pair, ra[:, 0] * yy, 1.0),
                         1.0 / np.maximum(np.linalg.norm(ga, axis=1), 1e-300))
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
            with np.errstate(over="ignore", invalid="ignore"):
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
            f"law '{law.name}' has {len(law.params)} parameters but only {len(loss)} rows; need more rows")
    starts = law.starts(X) if starts is None else np.atleast_2d(np.asarray(starts, dtype=float))
    weights = np.ones((1, len(loss)))
    objective = huber_objective(law, X, np.log(loss), weights, options)
    which = np.zeros(len(starts), dtype=int)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        batch = minimize_batched(objective, starts, which, ftol=options.ftol, gtol=options.gtol,
                                 max_iter=options.max_iter, ftol_floor=options.ftol_floor)
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
        law=law.name, theta=best_theta, params=law.report(best_theta), objective=best_f,
        converged=converged, message=message, n_starts=len(starts), n_reached=n_reached,
        r2=r2, rmse_log=rmse, n_rows=len(loss), basins=np.vstack([best_theta, batch.theta[basins[1:]]]),
    )


# Values no loss law of this kind takes in practice: an exponent beyond +-5 or a coefficient above 1e30.
# A fit that lands there has traded one term off against another along a flat valley: the data do
# not identify the law (too few rows, or a regime the law does not describe).
EXPONENTS, COEFFICIENTS = ("alpha", "beta", "gamma"), ("A", "B", "C")


def implausible(params: Mapping[str, float]) -> dict[str, float]:
    """The reported parameters of a fit that are not finite or outside plausible ranges."""
    return {name: value for name, value in params.items()
            if not np.isfinite(value) or (name in EXPONENTS and abs(value) > 5)
            or (name in COEFFICIENTS and abs(value) > 1e30)}


def _scalar(objective: Callable) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    """The batched objective as scipy wants it: x (P,) -> (f, g (P,))."""
    which = np.zeros(1, dtype=int)

    def fun(x):
        with np.errstate(over="ignore", invalid="ignore"):
            f, g = objective(x[None, :], which, True)
        return (float(f[0]), g[0]) if np.isfinite(f[0]) else (np.inf, np.zeros_like(x))

    return fun


def _polish(law: Law, X: np.ndarray, log_loss: np.ndarray, theta: np.ndarray, options: FitOptions):
    """Refine one endpoint by scipy's trust-region least squares with the same Huber loss.

    least_squares(loss="huber", f_scale=delta) minimises sum 2 Huber_delta(r): twice our summed
    objective, so the same optimum. Its Gauss-Newton model copes with the long curved valleys of
    the offset laws, where L-BFGS crawls (LoopLM: 0.2 s here against minutes).
    """
    rows = len(log_loss)

    def residuals(x):
        return law.log_predict(x[None, :], X, False)[0][0] - log_loss

    def jacobian(x):  # (rows, P): row i is the vector-Jacobian product with the i-th unit vector
        _, vjp = law.log_predict(np.tile(x, (rows, 1)), X, True)
        return vjp(np.eye(rows))

    with np.errstate(over="ignore", invalid="ignore"):
        return optimize.least_squares(residuals, theta, jac=jacobian, loss="huber", f_scale=options.delta,
                                      method="trf", xtol=options.tight_ftol, ftol=options.tight_ftol,
                                      gtol=options.tight_gtol, max_nfev=5000)


def scipy_loop(law: Law | str, data: Data, starts: np.ndarray, options: FitOptions = FitOptions()) -> np.ndarray:
    """The straightforward reference: scipy L-BFGS-B from each start in turn -> objectives (S,), thetas (S, P).

    Used by tests and the benchmark to check `fit` against; returns np.column_stack([f, theta]).
    """
    law = get_law(law) if isinstance(law, str) else law
    X, loss = data.matrix(law), np.asarray(data.loss, dtype=float)
    fun = _scalar(huber_objective(law, X, np.log(loss), np.ones((1, len(loss))), options))
    out = []
    for start in starts:
        res = optimize.minimize(fun, start, jac=True, method="L-BFGS-B",
                                options={"ftol": options.ftol, "gtol": options.gtol})
        out.append([res.fun if np.isfinite(res.fun) else np.inf, *res.x])
    return np.array(out)
