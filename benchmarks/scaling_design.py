"""Can a scaling grid identify the LoopLM law at the noise its runs have? A power check by simulation.

    .venv/bin/python benchmarks/scaling_design.py results/scaling/results.csv [--noise 0.003 0.01 0.03 0.1] [--trials 3]
    .venv/bin/python benchmarks/scaling_design.py results/scaling/results.csv --n 1.6e4 6e4 2.4e5 1e6 \
        --d 4.5e5 9e5 1.8e6 3.6e6 7.2e6 --tm 1 2 4 8 --replicates 3 --noise 0.09   # another grid

For each assumed law below and each noise level: draw `trials` tables whose loss is the law's
value at the table's own rows (N = params, D = eval_tokens, Tm = loops: the real grid, seeds and
checkpoints included) times exp(noise * z), z standard normal, and fit each as `synthlab fit looplm
--holdout size` does. Printed per level: the trials whose fit is identified (converged, no
implausible constant: the first two of the report's [[laws]] conditions; the bootstrap's is
stricter), the trials whose lack-of-fit test rejects the (true) law at p < 0.05 (the test's false
alarms: about 5% if it holds its level), by the F test that takes rows as independent and by the
wild bootstrap over runs the report decides by, the median R^2 and the median test R^2 of the size
hold-out, and the trials whose identified law the optimiser missed: a refit started at the true
constants ends at plausible constants and a lower objective than the fit from the grid of starts
(where none does, an unidentified fit is the data's, not the optimiser's). Beside it, the noise the table itself has: the standard deviation of log(eval_loss) over
seeds within each (d_model, loops, checkpoint) cell, its median over cells and its root mean square
(the scatter the R^2 sees; heavy-tailed cells make it larger). A grid identifies the law only if the
first column stays full up to that noise. With --shape observed each row's noise is its own cell's
sd, scaled so that its root mean square is the --noise level: the runs' uneven scatter (some cells'
seeds disagree far more than others), which the F test's one-variance assumption ignores. A run's
rows (its checkpoints) share the fraction --shared of their noise variance (default: the table's
own, the mean correlation of a run's deviations from its cells' means across its checkpoints), as
a seed that learns early stays ahead. With --steps TM the table is a steps.csv and the law the step-wise one (T for Tm), simulated on
the rows with loops = TM, each run's checkpoints and steps sharing its noise. With --n, --d and
--tm the design is instead their full grid, each point --replicates times (the
table then only gives the noise level to compare with).

The two assumed laws: `test` is tests/test_scaling_eval.py's CPU_TRUTH (a large N and D term, a
small depth term); `runs` is set by hand to the one-layer cpu runs' magnitudes (cell means of
results/scaling/one_layer: the loss falls by about 0.9 nats from the first to the last checkpoint, 0.33
from the smallest to the largest model at 4 loops and 0.2 from 1 to 4 loops; 0.30 nats at the
largest N, D and Tm), with exponents of 1 and small offsets.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads OpenBLAS
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from synthlab import scaling as sc  # noqa: E402
from synthlab.scaling.optimize import FitOptions, huber_objective, refit_from  # noqa: E402

LAWS = {
    "test": {
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
    },
    "runs": {
        "E": 0.08,
        "A": 5600.0,
        "alpha": 1.0,
        "t1": 1e3,
        "B": 4.6e5,
        "beta": 1.0,
        "t2": 1e4,
        "C": 0.27,
        "gamma": 1.0,
        "t3": 0.1,
    },
}


def cell_noise(table: pd.DataFrame, cell: list[str]) -> np.ndarray:
    """(rows,) the standard deviation of log loss over seeds in each row's cell (d_model, loops, checkpoint[, step])."""
    cells = table.assign(log_loss=np.log(table["eval_loss"])).groupby(cell)
    return cells["log_loss"].transform(lambda x: x.std(ddof=1)).to_numpy(float)


def shared_fraction(table: pd.DataFrame, cell: list[str]) -> float:
    """The mean correlation, over pairs of a run's rows (checkpoints[, steps]), of its deviations from its cells' mean
    log loss."""
    log_loss = np.log(table["eval_loss"])
    deviation = table.assign(dev=log_loss - log_loss.groupby([table[c] for c in cell]).transform("mean"))
    wide = deviation.pivot_table(index="run_dir", columns=cell[2:], values="dev")
    corr = wide.corr().to_numpy()
    return float(corr[~np.eye(len(corr), dtype=bool)].mean())


def from_truth(law: sc.Law, data: sc.Data, constants: dict[str, float]) -> tuple[float, dict[str, float]]:
    """(objective, constants) at the end of a refit started at the true constants (the fit's own polish)."""
    X = data.matrix(law)
    theta, _ = refit_from(law, data, law.theta(constants), max_nfev=5000)
    objective = huber_objective(law, X, np.log(data.loss), np.ones((1, len(X))), FitOptions())
    return float(objective(theta[None, :], np.zeros(1, dtype=int), False)[0][0]), law.report(theta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "table", type=Path, help="a scaling sweep's results.csv (params, eval_tokens, loops, eval_loss)"
    )
    parser.add_argument(
        "--noise", type=float, nargs="+", default=[0.003, 0.01, 0.03, 0.1], help="log-space noise levels to simulate"
    )
    parser.add_argument("--trials", type=int, default=3, help="noisy tables per law and level")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noise")
    parser.add_argument("--laws", nargs="+", choices=list(LAWS), default=list(LAWS), help="assumed laws to simulate")
    parser.add_argument("--n", type=float, nargs="+", help="model sizes of another design (with --d, --tm)")
    parser.add_argument("--d", type=float, nargs="+", help="tokens (checkpoints) of another design")
    parser.add_argument("--tm", type=float, nargs="+", help="loop counts of another design")
    parser.add_argument("--replicates", type=int, default=3, help="rows per point of another design (seeds)")
    parser.add_argument(
        "--shape",
        choices=["even", "observed"],
        default="even",
        help="noise with one sd everywhere, or each row's cell's sd in the table (its root mean square "
        "scaled to --noise)",
    )
    parser.add_argument(
        "--shared", type=float, help="fraction of the noise variance a run's rows share (default: the table's own)"
    )
    parser.add_argument(
        "--steps",
        type=float,
        metavar="TM",
        help="TABLE is a steps.csv (`synthlab steps`): "
        "simulate the step-wise law on its rows with loops = TM (the law's T: the step)",
    )
    args = parser.parse_args()
    table = pd.read_csv(args.table)
    law, depth, cell = sc.LOOPLM, "loops", ["d_model", "loops", "eval.checkpoint"]
    if args.steps is not None:
        if args.n or args.d or args.tm:
            parser.error("--steps simulates the table's own design (no --n, --d, --tm)")
        table = table[table["loops"] == args.steps].reset_index(drop=True)
        law, depth, cell = sc.STEPS, "step", [*cell, "step"]
        print(f"the step-wise law at loops = {args.steps:g}: {len(table)} rows")
    sd = cell_noise(table, cell)
    rms = float(np.sqrt(np.mean(sd**2)))
    table_shared = shared_fraction(table, cell)
    shared = table_shared if args.shared is None else args.shared
    print(
        f"{args.table}: {len(table)} rows; its seed-to-seed noise (sd of log loss in a cell): median "
        f"{np.median(sd):.3f}, root mean square {rms:.3f}; shared by a run's checkpoints: {table_shared:.2f}",
        flush=True,
    )
    if args.n or args.d or args.tm:
        if not (args.n and args.d and args.tm):
            parser.error("another design needs all of --n, --d and --tm")
        if args.shape == "observed":
            parser.error("--shape observed needs the table's own design (no --n, --d, --tm)")
        grid = np.stack([a.ravel() for a in np.meshgrid(args.n, args.d, args.tm, indexing="ij")], axis=1)
        X = np.repeat(grid, args.replicates, axis=0)
        i_n, _, i_tm, rep = np.unravel_index(
            np.arange(len(X)), (len(args.n), len(args.d), len(args.tm), args.replicates)
        )
        runs = (i_n * len(args.tm) + i_tm) * args.replicates + rep  # one run: a size, a loop count, a seed; all its D
        print(f"design: N {args.n} x D {args.d} x Tm {args.tm}, {args.replicates} rows each: {len(X)} rows")
    else:
        X = table[["params", "eval_tokens", depth]].to_numpy(float)
        runs = np.unique(table["run_dir"].astype(str), return_inverse=True)[1].ravel()
    print(f"noise shape: {args.shape}, shared by a run's rows: {shared:.2f}")
    print(
        f"{'law':<5} {'noise':>6} {'identified':>11} {'F rejects':>10} {'runs reject':>12} {'median R2':>10} "
        f"{'median hold-out R2':>19} {'missed':>9}"
    )
    rng = np.random.default_rng(args.seed)
    shape = sd / rms if args.shape == "observed" else np.ones(len(X))
    for name in args.laws:
        constants = LAWS[name]
        clean = law.predict(law.theta(constants), X)
        for noise in args.noise:
            identified, by_rows, by_runs, r2, r2_test, missed = 0, 0, 0, [], [], 0
            for _ in range(args.trials):
                z = np.sqrt(shared) * rng.standard_normal(runs.max() + 1)[runs] + np.sqrt(
                    1 - shared
                ) * rng.standard_normal(len(X))
                data = sc.Data(
                    {"N": X[:, 0], "D": X[:, 1], law.variables[2]: X[:, 2]},
                    clean * np.exp(noise * shape * z),
                    runs=runs,
                )
                result = sc.fit(law, data)
                identified += bool(result.converged and not sc.implausible(result.params))
                lack = sc.lack_of_fit(law, data, result.theta, rng)
                by_rows, by_runs = by_rows + (lack.p < 0.05), by_runs + (lack.p_runs < 0.05)
                r2.append(result.r2)
                r2_test.append(sc.holdout(law, data, "size")[0].r2_test)
                objective, params = from_truth(law, data, constants)
                missed += objective < result.objective * (1 - 1e-6) and not sc.implausible(params)
            print(
                f"{name:<5} {noise:>6.3f} {f'{identified} of {args.trials}':>11} {f'{by_rows} of {args.trials}':>10} "
                f"{f'{by_runs} of {args.trials}':>12} {np.median(r2):>10.4f} {np.median(r2_test):>19.4f} "
                f"{f'{missed} of {args.trials}':>9}",
                flush=True,
            )


if __name__ == "__main__":
    main()
