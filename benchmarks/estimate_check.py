"""The dry run's CPU estimates (synthlab.sweeps.step_rate) against the measured wall times of
finished sweeps: for each SWEEP_DIR, its experiment and preset (sweep.json) planned afresh, as if
nothing had run (each training shape timed here now), and per point that trained a model the
estimate over its measured wall_s, then the totals over every row (points on a model another point
trained cost their evaluation only: estimated 0, measured a few seconds). Reads SWEEP_DIR, writes
nothing there.

The measured times include whatever else ran beside each run, and the estimate the load while
it is made: one topology confirm shape trained at 77 ms a step and, an hour later, 189 ms.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/estimate_check.py SWEEP_DIR [SWEEP_DIR ...]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from synthlab.sweeps import experiments, lab_runner
from synthlab.sweeps.plan import plan
from synthlab.sweeps.results_table import RESULTS, sweep_rows


def check(sweep_dir: Path) -> tuple[float, float]:
    """Print the sweep's points and return (estimated, measured) seconds over all its rows."""
    info = json.loads((sweep_dir / "sweep.json").read_text())
    exp = experiments.load(info["experiment"])  # the preset's own seeds (a sweep run with --seeds: left out)
    with tempfile.TemporaryDirectory() as fresh:
        estimated = {r["point_id"]: r for r in plan(exp, info["preset"], Path(fresh), runner=lab_runner)}
    total_estimated = total_measured = 0.0
    for row in sweep_rows(sweep_dir / RESULTS):
        planned, measured = estimated.get(row["point_id"]), float(row["wall_s"])
        if planned is None:
            print(f"  {row['point_id']}: not in the definition's grid now (left out)")
            continue
        seconds = planned["cost_s"] if planned["cost"] == "estimated" else 0.0
        total_estimated, total_measured = total_estimated + seconds, total_measured + measured
        if seconds:
            print(
                f"  {row['point_id']}  estimated {seconds:7.0f} s  measured {measured:7.0f} s  {seconds / measured:5.2f}"
            )
    print(
        f"{sweep_dir}: estimated {total_estimated / 60:.1f} min, measured {total_measured / 60:.1f} min, "
        f"{total_estimated / total_measured:.2f} (load average now {os.getloadavg()[0]:.1f})"
    )
    return total_estimated, total_measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dirs", nargs="+", type=Path, help="finished (or partly finished) sweep folders")
    args = parser.parse_args()
    for sweep_dir in args.sweep_dirs:
        check(sweep_dir)


if __name__ == "__main__":
    main()
