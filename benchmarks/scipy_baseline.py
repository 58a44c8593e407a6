"""The straightforward per-start reference for `synthlab.scaling.fit`: scipy's L-BFGS-B from each start in turn.

Not part of the library: `benchmarks/bench_fit.py` and `tests/test_scaling.py` check the batched
fit against it (the fit must find this loop's best or better, far faster).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import optimize

from synthlab.scaling import Data, FitOptions, Law, get_law, huber_objective


def _scalar(objective: Callable) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    """The batched objective as scipy wants it: x (P,) -> (f, g (P,))."""
    which = np.zeros(1, dtype=int)

    def fun(x):
        with np.errstate(over="ignore", invalid="ignore"):
            f, g = objective(x[None, :], which, True)
        return (float(f[0]), g[0]) if np.isfinite(f[0]) else (np.inf, np.zeros_like(x))

    return fun


def scipy_loop(law: Law | str, data: Data, starts: np.ndarray, options: FitOptions = FitOptions()) -> np.ndarray:
    """scipy L-BFGS-B from each start in turn -> objectives (S,), thetas (S, P) as np.column_stack([f, theta])."""
    law = get_law(law) if isinstance(law, str) else law
    X, loss = data.matrix(law), np.asarray(data.loss, dtype=float)
    fun = _scalar(huber_objective(law, X, np.log(loss), np.ones((1, len(loss))), options))
    out = []
    for start in starts:
        res = optimize.minimize(
            fun, start, jac=True, method="L-BFGS-B", options={"ftol": options.ftol, "gtol": options.gtol}
        )
        out.append([res.fun if np.isfinite(res.fun) else np.inf, *res.x])
    return np.array(out)
