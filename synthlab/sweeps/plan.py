"""A sweep's dry run: its grid as rows, each point's status and its measured or estimated cost."""

from __future__ import annotations

import functools
import inspect
import math
from pathlib import Path
from typing import Any

from synthlab.sweeps.experiments import Experiment
from synthlab.sweeps.info import store
from synthlab.sweeps.results_table import RESULTS, cell_number, factor_column, sweep_rows
from synthlab.sweeps.runner_protocol import PointRunner, hook, parse_points


def plan(
    experiment: Experiment,
    preset: str,
    out: Path,
    *,
    runner: PointRunner,
    runs_dir: Path | None = None,
    gpu: bool = False,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """The grid as rows: factors, status (done / partial / todo), measured or estimated cost and the
    run directory in the trained-model store that the point's model is (or would be) trained into.

    A finished point's cost is its measured wall time; the rest come from the runner's
    `estimate_seconds(point, finished=rows)` (which may calibrate on the finished rows, each with
    its typed config as "point" where the grid still holds it; given `jobs=`, the points the sweep
    runs at a time, where it takes that keyword), or NaN if it has none. gpu: the runner's optional `gpu_cost(point) -> dict` adds its columns to each
    row, and its `gpu_h` (hours on one GPU, less `gpu_h_shared` where an earlier point trains the
    model) is the cost of a point still to run.
    """
    out = Path(out)
    runs_dir = store(out, "runs", runs_dir)
    done = {r["point_id"]: r for r in sweep_rows(out / RESULTS)}
    estimate = hook(runner, "estimate_seconds")
    if estimate is not None and "jobs" in inspect.signature(estimate).parameters:
        estimate = functools.partial(estimate, jobs=jobs)
    past_training = (
        functools.partial(estimate, trained=True)
        if estimate is not None and "trained" in inspect.signature(estimate).parameters
        else None
    )
    gpu_cost = hook(runner, "gpu_cost") if gpu else None
    points = experiment.points(preset)
    changed_since = hook(runner, "changed_since")
    typed_points = parse_points(runner, experiment, preset, points)
    by_id = {p.point_id: typed for p, typed in zip(points, typed_points)}
    finished = [{**row, "point": by_id.get(point_id)} for point_id, row in done.items()]
    rows, trained = [], set()
    for point, typed in zip(points, typed_points):
        run_dir = runs_dir / point.train_id
        row = {
            "point_id": point.point_id,
            **{factor_column(a): v for a, v in point.factors.items()},
            "run_dir": str(run_dir),
        }
        if gpu_cost is not None:
            row.update(gpu_cost(typed))
        shared = point.train_id in trained  # evaluates a model an earlier point trains
        trained.add(point.train_id)
        if point.point_id in done:
            changed = changed_since is not None and changed_since(typed, run_dir)
            row.update(
                status="done, config changed" if changed else "done",
                cost_s=cell_number(done[point.point_id], "wall_s", out / RESULTS),
                cost="measured",
            )
        elif shared:
            if gpu_cost is not None:
                own = (row["gpu_h"] - row["gpu_h_shared"]) * 3600
            else:
                own = past_training(typed, finished=finished) if past_training is not None else 0.0
            row.update(status="partial" if run_dir.is_dir() else "todo", cost_s=own, cost="shared model")
        else:
            row["status"] = "partial" if run_dir.is_dir() else "todo"
            seconds = (
                row["gpu_h"] * 3600
                if gpu_cost is not None
                else estimate(typed, finished=finished)
                if estimate
                else math.nan
            )
            row.update(cost_s=seconds, cost="estimated")
        rows.append(row)
    return rows
