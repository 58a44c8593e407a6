"""Can a scaling grid identify the LoopLM law at the noise its runs have? A power check by simulation.

    .venv/bin/python benchmarks/scaling_design.py results/scaling/results.csv [--noise 0.003 0.01 0.03 0.1] [--trials 3]
    .venv/bin/python benchmarks/scaling_design.py results/scaling/results.csv --n 1.6e4 6e4 2.4e5 1e6 \
        --d 4.5e5 9e5 1.8e6 3.6e6 7.2e6 --tm 1 2 4 8 --replicates 3 --noise 0.09   # another grid

For each assumed law below and each noise level: draw `trials` tables whose loss is the law's
value at the table's own rows (N = params, D = eval_tokens, Tm = loops: the real grid, seeds and
checkpoints included) times exp(noise * z), z standard normal, and fit each as `synthlab fit looplm
--holdout size` does. Printed per level: the trials whose fit is identified (converged, no
implausible constant: the first two of the report's [[laws]] conditions; the bootstrap's is
stricter), the median R^2 and the median test R^2 of the size hold-out. Beside it, the noise the
table itself has: the standard deviation of log(eval_loss) over seeds within each (d_model, loops,
checkpoint) cell. A grid identifies the law only if the first column stays full up to that noise.
With --n, --d and --tm the design is instead their full grid, each point --replicates times (the
table then only gives the noise level to compare with).

The two assumed laws: `test` is tests/test_scaling_eval.py's CPU_TRUTH (a large N and D term, a
small depth term); `runs` is set by hand to the cpu runs' magnitudes (cell means of
results/scaling: the loss falls by about 0.9 nats from the first to the last checkpoint, 0.33
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

LAWS = {
    "test": {"E": 1.0, "A": 400.0, "alpha": 0.45, "t1": 2e4, "B": 2000.0, "beta": 0.5, "t2": 1e5,
             "C": 0.5, "gamma": 1.0, "t3": 0.5},
    "runs": {"E": 0.08, "A": 5600.0, "alpha": 1.0, "t1": 1e3, "B": 4.6e5, "beta": 1.0, "t2": 1e4,
             "C": 0.27, "gamma": 1.0, "t3": 0.1},
}


def seed_noise(table: pd.DataFrame) -> float:
    """Median over cells of the standard deviation of log loss over seeds."""
    cells = table.assign(log_loss=np.log(table["eval_loss"])).groupby(["d_model", "loops", "eval.checkpoint"])
    return float(cells["log_loss"].std(ddof=1).median())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="a scaling sweep's results.csv (params, eval_tokens, loops, eval_loss)")
    parser.add_argument("--noise", type=float, nargs="+", default=[0.003, 0.01, 0.03, 0.1],
                        help="log-space noise levels to simulate")
    parser.add_argument("--trials", type=int, default=3, help="noisy tables per law and level")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noise")
    parser.add_argument("--laws", nargs="+", choices=list(LAWS), default=list(LAWS), help="assumed laws to simulate")
    parser.add_argument("--n", type=float, nargs="+", help="model sizes of another design (with --d, --tm)")
    parser.add_argument("--d", type=float, nargs="+", help="tokens (checkpoints) of another design")
    parser.add_argument("--tm", type=float, nargs="+", help="loop counts of another design")
    parser.add_argument("--replicates", type=int, default=3, help="rows per point of another design (seeds)")
    args = parser.parse_args()
    table = pd.read_csv(args.table)
    law = sc.LOOPLM
    print(f"{args.table}: {len(table)} rows; its seed-to-seed noise (median sd of log loss in a cell): "
          f"{seed_noise(table):.3f}", flush=True)
    if args.n or args.d or args.tm:
        if not (args.n and args.d and args.tm):
            parser.error("another design needs all of --n, --d and --tm")
        grid = np.stack([a.ravel() for a in np.meshgrid(args.n, args.d, args.tm, indexing="ij")], axis=1)
        X = np.repeat(grid, args.replicates, axis=0)
        print(f"design: N {args.n} x D {args.d} x Tm {args.tm}, {args.replicates} rows each: {len(X)} rows")
    else:
        X = table[["params", "eval_tokens", "loops"]].to_numpy(float)
    print(f"{'law':<5} {'noise':>6} {'identified':>11} {'median R2':>10} {'median hold-out R2':>19}")
    rng = np.random.default_rng(args.seed)
    for name in args.laws:
        constants = LAWS[name]
        clean = law.predict(law.theta(constants), X)
        for noise in args.noise:
            identified, r2, r2_test = 0, [], []
            for _ in range(args.trials):
                data = sc.Data({"N": X[:, 0], "D": X[:, 1], "Tm": X[:, 2]}, clean * np.exp(noise * rng.standard_normal(len(clean))))
                result = sc.fit(law, data)
                identified += bool(result.converged and not sc.implausible(result.params))
                r2.append(result.r2)
                r2_test.append(sc.holdout(law, data, "size")[0].r2_test)
            print(f"{name:<5} {noise:>6.3f} {f'{identified} of {args.trials}':>11} {np.median(r2):>10.4f} "
                  f"{np.median(r2_test):>19.4f}", flush=True)


if __name__ == "__main__":
    main()
