"""The dry run's CPU estimates (synthlab.sweeps.step_rate) against the measured wall times of
finished sweeps: for each SWEEP_DIR, its experiment and preset (sweep.json) planned afresh, as if
nothing had run (each training shape timed here now), and per point that trained a model the
estimate over its measured wall_s, then the totals over every row (points on a model another point
trained cost their evaluation only: estimated 0, measured a few seconds). Reads SWEEP_DIR, writes
nothing there.

The measured times include whatever else ran beside each run, and the estimate the load while
it is made: one topology confirm shape trained at 77 ms a step and, an hour later, 189 ms.

Measured (load average 3.5-4 while estimating; estimate / measured wall time in total, per point):

    topology confirm (6 of 21 points, running)   0.69   1.10, 1.12, 0.83, 0.49, 0.46, 0.75
    depth confirm (2 of 8 points, running)        0.78   1.24, 0.67
    results/kvcache/confirm                       0.72   0.68, 0.72, 0.82 (the 9 others evaluate)
    results/exit/confirm                          0.65   0.74, 0.72, 0.63 (the 60 others evaluate)
    results/faithfulness/confirm                  0.81   0.90, 0.88, 0.77, 0.58, 0.77, 1.19
    results/capacity/calibration/calib64          0.85   0.36-1.40 (its d64-L1 N3447 run took 1,965 s
                                                         once and 498 s the other time)

With the sweep's own --jobs counted (`--jobs`): reach `fit` (9 points, run two at a time beside
intermittent benchmarks and tests, estimated afterwards at load average 2.0 with one other training
job running): 1.26 estimated for --jobs 2 (0.89-1.40 per point), 0.81 for --jobs 1: the measured
run lies between the two loads the estimate can assume, and within 20% of neither.

In the topology runs' logs their quiet windows ran at 76-91 ms a step, the estimates' 83-105 ms,
and the windows beside a burst of other work at 160-294 ms: the estimate is the step's time as
loaded when it is made; a run that meets more work takes longer.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/estimate_check.py SWEEP_DIR [SWEEP_DIR ...] [--jobs 2]
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


def median_step_s(sweep_dir: Path, row: dict[str, str]) -> float | None:
    """The run's median seconds per step over its logging windows (metrics.jsonl's tokens_per_s at
    the row's mean tokens per step): its typical speed, with the windows slowed by a burst of
    other work weighing no more than any other. None where the run folder is not there."""
    run = Path(row["run_dir"])
    for folder in (run, sweep_dir / "runs" / run.name):
        try:
            lines = (folder / "model" / "metrics.jsonl").read_text().splitlines()
        except OSError:
            continue
        rates = sorted(json.loads(line)["tokens_per_s"] for line in lines)
        return float(row["tokens"]) / float(row["train_steps"]) / rates[len(rates) // 2]
    return None


def check(sweep_dir: Path, jobs: int = 1) -> tuple[float, float]:
    """Print the sweep's points and return (estimated, measured) seconds over all its rows, the
    estimate made for `jobs` points at a time (as the sweep ran them)."""
    info = json.loads((sweep_dir / "sweep.json").read_text())
    exp = experiments.load(info["experiment"])  # the preset's own seeds (a sweep run with --seeds: left out)
    with tempfile.TemporaryDirectory() as fresh:
        estimated = {r["point_id"]: r for r in plan(exp, info["preset"], Path(fresh), runner=lab_runner, jobs=jobs)}
    total_estimated = total_measured = 0.0
    for row in sweep_rows(sweep_dir / RESULTS):
        planned, measured = estimated.get(row["point_id"]), float(row["wall_s"])
        if planned is None:
            print(f"  {row['point_id']}: not in the definition's grid now (left out)")
            continue
        seconds = planned["cost_s"] if planned["cost"] == "estimated" else 0.0
        total_estimated, total_measured = total_estimated + seconds, total_measured + measured
        if seconds:
            typical = median_step_s(sweep_dir, row)
            at_median = (
                "" if typical is None else f", at its median step {seconds / (typical * float(row['train_steps'])):.2f}"
            )
            print(
                f"  {row['point_id']}  estimated {seconds:7.0f} s  measured {measured:7.0f} s  {seconds / measured:5.2f}"
                + at_median
            )
    print(
        f"{sweep_dir}: estimated {total_estimated / 60:.1f} min, measured {total_measured / 60:.1f} min, "
        f"{total_estimated / total_measured:.2f} (load average now {os.getloadavg()[0]:.1f})"
    )
    return total_estimated, total_measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dirs", nargs="+", type=Path, help="finished (or partly finished) sweep folders")
    parser.add_argument("--jobs", type=int, default=1, help="points the sweeps ran at a time (default: 1)")
    args = parser.parse_args()
    for sweep_dir in args.sweep_dirs:
        check(sweep_dir, args.jobs)


if __name__ == "__main__":
    main()
