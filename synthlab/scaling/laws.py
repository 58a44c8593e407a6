"""Loss scaling laws as data: the law type, sums of power laws, the registry, the built-in laws,
the runs a law is fitted to, and what counts as an implausible fit.

A law predicts log L from a few variables (N parameters, D tokens, Tm maximum recurrent steps,
T the recurrent step, or a generic x). Fit-space parameters named `log_X` are reported as
X = exp(log_X) (E, A, B, C and the offsets t1..t3, which thereby stay positive); every other
parameter is reported as is.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from synthlab.errors import SynthlabError

# (starts, P), (rows, V), need_grad -> log L_hat (starts, rows) and, if need_grad, its vector-Jacobian
# product: a function from d objective / d log L_hat (starts, rows) to d objective / d theta (starts, P).
LogPredict = Callable[[np.ndarray, np.ndarray, bool], tuple[np.ndarray, Callable | None]]


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

    def theta(self, reported: Mapping[str, float]) -> np.ndarray:
        """Reported parameters -> fit-space vector (P,): the inverse of `report`."""
        return np.array([np.log(reported[p[4:]]) if p.startswith("log_") else reported[p] for p in self.params])

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


CHINCHILLA = register_law(
    power_sum_law(
        "chinchilla",
        [PowerTerm("N", "A", "alpha"), PowerTerm("D", "B", "beta")],
        lambda X: CHINCHILLA_GRID,
    )
)
LOOPLM = register_law(
    power_sum_law(
        "looplm",
        [PowerTerm("N", "A", "alpha", "t1"), PowerTerm("D", "B", "beta", "t2"), PowerTerm("Tm", "C", "gamma", "t3")],
        _looplm_grid,
    )
)
# The step-wise law for one Tm: the LoopLM form with T, the recurrent step (1..Tm), in place of Tm.
STEPS = register_law(
    power_sum_law(
        "steps",
        [PowerTerm("N", "A", "alpha", "t1"), PowerTerm("D", "B", "beta", "t2"), PowerTerm("T", "C", "gamma", "t3")],
        _looplm_grid,
    )
)
POWER = register_law(power_sum_law("power", [PowerTerm("x", "A", "alpha", "t")], _power_grid))


@dataclasses.dataclass(frozen=True)
class Data:
    """Runs to fit: variables[name] and loss, all (rows,), finite and positive.

    `labels` maps a variable name (and "loss") to what the user calls it (a CSV column), for
    error messages. `runs` (rows,), optional, says which rows come from one training run (its
    checkpoints, its recurrent steps): their noise is shared, which the lack-of-fit test keeps.
    """

    variables: Mapping[str, np.ndarray]
    loss: np.ndarray
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    runs: np.ndarray | None = None

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
        return Data(
            variables,
            np.asarray(self.loss)[rows],
            self.labels,
            None if self.runs is None else np.asarray(self.runs)[rows],
        )


# Values no loss law of this kind takes in practice: an exponent beyond +-5 or a coefficient above 1e30.
# A fit that lands there has traded one term off against another along a flat valley: the data do
# not identify the law (too few rows, or a regime the law does not describe).
EXPONENTS, COEFFICIENTS = ("alpha", "beta", "gamma"), ("A", "B", "C")


def implausible(params: Mapping[str, float]) -> dict[str, float]:
    """The reported parameters of a fit that are not finite or outside plausible ranges."""
    return {
        name: value
        for name, value in params.items()
        if not np.isfinite(value)
        or (name in EXPONENTS and abs(value) > 5)
        or (name in COEFFICIENTS and abs(value) > 1e30)
    }
