"""Speed of `synthlab fit` on Epoch's 240 Chinchilla runs, against the straightforward per-start scipy loop.

    .venv/bin/python benchmarks/bench_fit.py [--loop-starts 4500] [--resamples 1000] [--cold 10]

Targets: the 4,500-start grid fit in <= 10 s on 2 cores; 1,000 bootstrap refits in <= 60 s.
Measured in one run, interleaved (batched, loop, batched; the faster batched time is kept), so the
ratio survives a noisy shared machine. Checks printed alongside:
- the batched fit's optimum equals the loop's best (objective and parameters);
- warm-started bootstrap refits equal cold full-grid refits (`scaling.cold_refits`) of the
  same resamples, per resample and as percentile intervals over that subsample.
BLAS is pinned to one thread on both sides: on a loaded 2-core machine OpenBLAS's threads make
scipy's L-BFGS-B about 25x slower, which would flatter the ratio.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads OpenBLAS
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy_baseline import scipy_loop  # noqa: E402 (benchmarks/, on sys.path when this script runs)

from synthlab import scaling as sc  # noqa: E402

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "results" / "reference" / "chinchilla_svg_extracted.csv"


def load(path: Path) -> sc.Data:
    table = pd.read_csv(path)
    table = table[table["loss"] < sorted(table["loss"])[-5]]
    n = table["Model Size"].to_numpy(float)
    return sc.Data({"N": n, "D": table["Training FLOP"].to_numpy(float) / (6 * n)}, table["loss"].to_numpy(float))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument(
        "--loop-starts", type=int, default=4500, help="starts the scipy loop runs (time scaled to 4,500)"
    )
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--cold", type=int, default=10, help="resamples refitted cold from the full grid")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = load(args.csv)
    starts = sc.CHINCHILLA.starts(None)

    first, t_first = timed(lambda: sc.fit("chinchilla", data))
    pick = np.random.default_rng(args.seed).choice(len(starts), min(args.loop_starts, len(starts)), replace=False)
    loop, t_loop = timed(lambda: scipy_loop("chinchilla", data, starts[np.sort(pick)]))
    result, t_second = timed(lambda: sc.fit("chinchilla", data))
    t_fit = min(t_first, t_second)
    t_loop_full = t_loop * len(starts) / len(pick)
    best = loop[np.argmin(loop[:, 0])]
    print(
        f"grid fit, {len(starts)} starts x {result.n_rows} rows: batched {t_fit:.2f} s (target <= 10 s); "
        f"per-start scipy loop {t_loop:.1f} s for {len(pick)} starts"
        + ("" if len(pick) == len(starts) else f" (x {len(starts) / len(pick):.1f} = {t_loop_full:.1f} s)")
        + f"; ratio {t_loop_full / t_fit:.1f}x"
    )
    print(
        f"  batched optimum: objective {result.objective:.10g}, "
        + ", ".join(f"{k} {v:.5g}" for k, v in result.params.items())
        + f"; converged {result.converged}, {result.n_reached} starts reached it"
    )
    print(
        f"  loop best:       objective {best[0]:.10g}, "
        + ", ".join(f"{k} {v:.5g}" for k, v in sc.CHINCHILLA.report(best[1:]).items())
    )
    print(
        f"  max |theta batched - theta loop| = {np.abs(result.theta - best[1:]).max():.2e} (log A, log B, log E, alpha, beta)"
    )

    boot, t_boot = timed(
        lambda: sc.bootstrap(
            "chinchilla", data, result, np.random.default_rng(args.seed), n_resamples=args.resamples, compute=5.76e23
        )
    )
    print(
        f"bootstrap: {args.resamples} warm-started refits in {t_boot:.2f} s (target <= 60 s), "
        f"{boot.n_converged} converged; 95% intervals:"
    )
    for name, (lo, hi) in boot.intervals.items():
        print(f"  {name:>6} [{lo:.5g}, {hi:.5g}]")
    cold, t_cold = timed(lambda: sc.cold_refits("chinchilla", data, boot.rows[: args.cold]))
    params = list(result.params)
    cold_theta = np.array([[c.params[p] for p in params] for c in cold])
    warm_theta = np.array([[boot.samples[p][i] for p in params] for i in range(args.cold)])
    rel = np.abs(warm_theta / cold_theta - 1).max()
    print(
        f"cold check: {args.cold} resamples refitted from the full grid in {t_cold:.1f} s "
        f"({t_cold / args.cold * args.resamples:.0f} s per {args.resamples}); max relative parameter "
        f"difference warm vs cold {rel:.2e}"
    )
    for j, name in enumerate(params):
        w, c = np.percentile(warm_theta[:, j], [2.5, 97.5]), np.percentile(cold_theta[:, j], [2.5, 97.5])
        print(f"  {name:>6} over those {args.cold}: warm [{w[0]:.5g}, {w[1]:.5g}]  cold [{c[0]:.5g}, {c[1]:.5g}]")


if __name__ == "__main__":
    main()
