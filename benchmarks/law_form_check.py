"""Is a scaling law rejected for adding its terms, or for their power-law shapes? A check by free-level models.

    .venv/bin/python benchmarks/law_form_check.py results/scaling/results.csv [--min-checkpoint 500]

The LoopLM law L = E + A/(N+t1)^alpha + B/(D+t2)^beta + C/(Tm+t3)^gamma adds one term per
variable. The most flexible law of that additive form gives each level of N, D and Tm a free value:
L = E + f(N) + g(D) + h(Tm), 10 constants on a 4 x 4 x 4 grid, as many as the LoopLM law. Every
LoopLM fit is one of these models, so its least-squares residual (on log loss) can only be larger:
where the free additive model fails `synthlab fit`'s lack-of-fit test, every additive law of N, D
and Tm fails it, whatever its optimiser did; where it passes, a rejected LoopLM law fails by its
power-law shapes. The same test then runs with N and D, or D and Tm, free to interact (a free value
per combination of their levels, the third variable added): which interaction the data need. (Not
N x Tm: a free value per (N, Tm) is one per group of three runs, which absorbs part of their shared
luck, and the wild bootstrap over runs is not calibrated for a model that follows the runs so
closely.) Each model is
fitted by least squares on log loss from the linear fit in loss space; the test is
`scaling.lack_of_fit_test` (F test over rows, wild bootstrap over runs), as for the laws.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads OpenBLAS
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import optimize  # noqa: E402

from synthlab import scaling as sc  # noqa: E402
from synthlab.errors import SynthlabError  # noqa: E402

MODELS = {  # name: groups of variables, each group one free table over its levels' combinations
    "N + D + Tm": [["N"], ["D"], ["Tm"]],
    "N x D + Tm": [["N", "D"], ["Tm"]],
    "N + D x Tm": [["N"], ["D", "Tm"]],
}


def design_matrix(levels: dict[str, np.ndarray], groups: list[list[str]]) -> np.ndarray:
    """(rows, 1 + sum of (combinations - 1)) intercept and treatment-coded indicators: full rank for disjoint groups."""
    columns = [np.ones(len(next(iter(levels.values()))))]
    for group in groups:
        combination = np.unique(np.column_stack([levels[v] for v in group]), axis=0, return_inverse=True)[1].ravel()
        columns += [(combination == k).astype(float) for k in range(1, combination.max() + 1)]
    return np.column_stack(columns)


def fit_free(M: np.ndarray, loss: np.ndarray) -> tuple[float, np.ndarray, float]:
    """(sse on log loss, Jacobian of the log prediction at the optimum, R^2 in loss space)."""
    start = np.linalg.lstsq(M, loss, rcond=None)[0]

    def residuals(beta):
        return np.log(np.maximum(M @ beta, 1e-12)) - np.log(loss)

    def jac(beta):
        return M / np.maximum(M @ beta, 1e-12)[:, None]

    beta = optimize.least_squares(residuals, start, jac=jac, method="lm", xtol=1e-12, ftol=1e-12).x
    prediction = M @ beta
    r2 = 1 - np.sum((loss - prediction) ** 2) / np.sum((loss - loss.mean()) ** 2)
    return float(np.sum(residuals(beta) ** 2)), jac(beta), float(r2)


def form_tests(
    table: pd.DataFrame, rng: np.random.Generator, resamples: int = 1000, name: str = "table"
) -> tuple[pd.DataFrame, str]:
    """(one row per model of MODELS: its constants, R^2 and lack-of-fit test; a line describing the
    table), the table's N, D, Tm, loss and runs read as `synthlab fit looplm` reads them."""
    data, _, _ = sc.table_data(table, sc.LOOPLM, name=name)
    levels = sc.design_levels(sc.LOOPLM, data)
    cells = sc.design_cells(sc.LOOPLM, data)
    rows = []
    for model, groups in MODELS.items():
        M = design_matrix(levels, groups)
        sse, J, r2 = fit_free(M, data.loss)
        test = sc.lack_of_fit_test(data, cells, sse, M.shape[1], J, rng, resamples)
        if test is None:
            raise SynthlabError(f"{name}: no design point has replicates (seeds), or too few points for {model}")
        rows.append(
            {
                "model": model,
                "params": M.shape[1],
                "R2": r2,
                "F": test.f,
                "p (rows)": test.p,
                "p (runs)": test.p_runs,
                "R2 ceiling": test.r2_ceiling,
            }
        )
    described = (
        f"{len(table)} rows, {cells.max() + 1} design points, {len(np.unique(data.runs))} runs; levels: "
        + ", ".join(f"{v} {x.max() + 1}" for v, x in levels.items())
    )
    return pd.DataFrame(rows), described


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "table", type=Path, help="a scaling sweep's results.csv (params, eval_tokens, loops, eval_loss, run_dir)"
    )
    parser.add_argument("--min-checkpoint", type=int, default=0, help="keep the rows read at this step or later")
    parser.add_argument("--resamples", type=int, default=1000, help="wild-bootstrap draws of the test over runs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the wild bootstrap")
    args = parser.parse_args()
    try:
        table = pd.read_csv(args.table)
        if args.min_checkpoint:
            if "eval.checkpoint" not in table:
                raise SynthlabError(f"{args.table} has no eval.checkpoint column for --min-checkpoint")
            table = table[table["eval.checkpoint"] >= args.min_checkpoint].reset_index(drop=True)
        results, described = form_tests(table, np.random.default_rng(args.seed), args.resamples, args.table.name)
    except (OSError, ValueError, SynthlabError) as err:
        parser.exit(2, f"error: {err}\n")
    print(f"{args.table} (checkpoints >= {args.min_checkpoint}): {described}")
    print(results.to_string(index=False, float_format=lambda x: f"{x:.3g}"))


if __name__ == "__main__":
    main()
