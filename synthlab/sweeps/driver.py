"""The sweep driver: run every point of an experiment's grid once, resumably, in parallel.

Layout of a sweep directory DIR:

    DIR/results.csv              one row per finished point (factors, metrics, run_dir)
    DIR/sweep.json               the experiment, preset, the stores outside DIR it uses (a rerun
                                 without --cache / --runs uses them), every command, rule fingerprints
    DIR/runs/<train_id>/         one trained model; points that differ only in evaluation share it
                                 (--runs DIR: a store shared by several sweeps)
        points/<point_id>.json   a finished point's metrics (written atomically, then the row)
    DIR/datasets/<task>-<hash>/  generated data, keyed by a content hash of generator params+seed
                                 (--cache DIR: shared by several sweeps)

Crash safety, kill -9 included: a point's metrics are written to a temporary file and renamed
(`synthlab.sweeps.executor`); the row is added by rewriting results.csv to a temporary file and renaming
it, under an exclusive file lock, skipping point ids already present. So results.csv is always a
whole, duplicate-free table; a point killed before its metrics file exists reruns (its training
resumes from the last checkpoint in its run dir); a point killed after it gets its row on the next
run without rerunning.

The driver does not know what a point does: a point runner (`synthlab.sweeps.runner_protocol`, a module)
does the work. Executors (`synthlab.sweeps.executor`): in process (`jobs=1`), a spawn process pool
(`jobs>1`), a process per model on its GPUs, or Ray tasks (`executor="ray"`): GPUs as
`synthlab.sweeps.gpu_scheduling` assigns them. The driver adds the rows as each model's points finish. With
`nproc_per_node` K a worker trains its point as a torchrun job of K processes (the runner's
`run_point(..., nproc=K)`). The dry run: `synthlab.sweeps.plan`; sweep.json: `synthlab.sweeps.info`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from synthlab.errors import SynthlabError
from synthlab.files import check_writable, warn
from synthlab.progress import Progress
from synthlab.sweeps import gpu_scheduling
from synthlab.sweeps.executor import execute, make_units
from synthlab.sweeps.experiments import Experiment, Point
from synthlab.sweeps.info import record_invocation, store
from synthlab.sweeps.results_table import (
    RESULTS,
    append_rows,
    factor_column,
    missing_columns,
    parse_only,
    selected,
    sweep_rows,
)
from synthlab.sweeps.runner_protocol import PointRunner, hook, parse_points


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by a signal (Ctrl-C, SIGTERM): `finished` of its `total` points have their
    rows in `results` (a rerun of the same command runs the rest, resuming a started training)."""

    def __init__(self, finished: int, total: int, results: Path):
        super().__init__(f"{finished} of {total} points finished")
        self.finished, self.total, self.results = finished, total, results


def finished_points(
    runner: PointRunner, experiment: Experiment, preset: str, points: list[Point], path: Path
) -> tuple[set[str], set[str]]:
    """(ids of the points with a whole row in the table, ids of those whose row misses a column the
    runner's optional `columns(point)` names: they run again, with a warning, and their new row
    replaces the old one)."""
    rows = {r["point_id"]: r for r in sweep_rows(path)}
    columns = hook(runner, "columns")
    listed = [p for p in points if p.point_id in rows]
    stale = set()
    for point, typed in zip(listed, parse_points(runner, experiment, preset, listed) if columns else []):
        missing = missing_columns(rows[point.point_id], columns(typed))
        if missing:
            warn(f"{path}: the row of point {point.point_id} has no {', '.join(missing)}; running the point again")
            stale.add(point.point_id)
    return set(rows) - stale, stale


def changed_points(
    runner: PointRunner, experiment: Experiment, preset: str, points: list[Point], runs_dir: Path
) -> dict[str, str]:
    """{point id: why} for the points whose trained model no longer matches what the point asks for
    (the runner's optional `changed_since(point, run_dir)`)."""
    changed_since = hook(runner, "changed_since")
    if changed_since is None:
        return {}
    typed = parse_points(runner, experiment, preset, points)
    found = {p.point_id: changed_since(t, runs_dir / p.train_id) for p, t in zip(points, typed)}
    return {point_id: why for point_id, why in found.items() if why}


def select_points(points: list[Point], only: Sequence[str]) -> list[Point]:
    """The grid points the `only` filters select (all of them without filters); none is an error."""
    if not only:
        return points
    columns = [{factor_column(axis): value for axis, value in p.factors.items()} for p in points]
    wanted = parse_only(only, {column for factors in columns for column in factors})
    chosen = [p for p, factors in zip(points, columns) if selected(factors, wanted)]
    if not chosen:
        raise SynthlabError(f"--only {' '.join(only)}: no point of the grid matches")
    return chosen


def run_sweep(
    experiment: Experiment,
    preset: str,
    out: Path,
    *,
    runner: PointRunner,
    jobs: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    cache_dir: Path | None = None,
    runs_dir: Path | None = None,
    threads: int | None = None,
    nproc_per_node: int = 0,
    progress: bool = True,
    reevaluate: bool = False,
    gpus: list[float] | None = None,
    only: Sequence[str] = (),
) -> Path:
    """Run every unfinished point of `experiment`'s `preset` grid; returns the results.csv path.

    cache_dir: datasets (default OUT/datasets); runs_dir: trained models (default OUT/runs). Sweeps
    that share them generate each dataset and train each model once (a model is keyed by its
    config: e.g. depth's 1 x 4 model is faithfulness's).
    jobs: local workers at once; default one per GPU (synthlab.sweeps.gpu_scheduling), else 1. `gpus`: each GPU's
    GiB (default: those this process sees); more jobs than GPUs share them where memory allows.
    threads: torch threads (and Ray CPUs) per run; default: the idle cores / jobs locally
    (`devices.default_threads`), 1 on Ray.
    nproc_per_node: >= 1: each point's training runs as a torchrun job of that many processes
    (data-parallel; one GPU each on CUDA), started by the worker that runs the point (the runner's
    run_point gets nproc=K); 0: training runs in the worker.
    reevaluate: run the finished points again too (their models are reused, so after an evaluator
    change only the evaluation reruns); each new row replaces the old, its wall time added.
    only: COLUMN=VALUE filters (`results_table.parse_only`): run just the points they select, in the
    grid's order; the others are left as they are for a later sweep into the same OUT.
    """
    if jobs is not None and jobs < 1:
        raise SynthlabError(f"--jobs must be >= 1, got {jobs}")
    if threads is not None and threads < 1:
        raise SynthlabError(f"--threads must be >= 1, got {threads}")
    if nproc_per_node < 0:
        raise SynthlabError(f"nproc_per_node must be >= 0 (0: train in the worker), got {nproc_per_node}")
    if executor not in ("local", "ray"):
        raise SynthlabError(f"--executor must be 'local' or 'ray', got '{executor}'")
    for path, option in ((out, "--out"), (cache_dir, "--cache"), (runs_dir, "--runs")):
        if path is not None:
            check_writable(path, option)
    points = select_points(experiment.points(preset), only)
    out = Path(out)
    cache_dir, runs_dir = store(out, "cache", cache_dir), store(out, "runs", runs_dir)
    finished, stale = finished_points(runner, experiment, preset, points, out / RESULTS)
    if reevaluate:
        finished, stale = set(), stale | finished
    for point_id, why in changed_points(
        runner, experiment, preset, [p for p in points if p.point_id in finished], runs_dir
    ).items():
        warn(f"point {point_id}: its row is kept, but {why}")
    todo = [p for p in points if p.point_id not in finished]
    gpus = (gpu_scheduling.local_gpus() if gpus is None else list(gpus)) if todo else []
    jobs = jobs or gpu_scheduling.default_jobs(len(gpus))
    parsed = parse_points(runner, experiment, preset, todo)  # fail early, in the driver, on a bad grid
    out.mkdir(parents=True, exist_ok=True)
    record_invocation(out, experiment, preset, cache_dir, runs_dir)
    results = out / RESULTS
    if threads is None:  # share this machine's idle cores among local workers; one core per Ray task
        threads, why = (1, "1 torch thread per Ray task") if executor == "ray" else gpu_scheduling.default_threads(jobs)
        print(why, file=sys.stderr, flush=True)
    units = make_units(
        experiment,
        preset,
        todo,
        parsed,
        runs_dir,
        runner,
        cache_dir,
        threads,
        nproc_per_node,
        rerun=stale,
        gpus=bool(gpus) or executor == "ray",
    )

    bar = Progress(
        len(points), initial=len(points) - len(todo), enabled=progress, desc=f"sweep {experiment.name}", unit="point"
    )

    def on_done(rows: list[dict[str, Any]]) -> None:
        append_rows(results, rows, replace=stale)
        bar.update(len(rows))

    try:
        execute(units, on_done, executor=executor, jobs=jobs, gpus=gpus, ray_address=ray_address)
    except KeyboardInterrupt:
        raise SweepInterrupted(bar.n, len(points), results) from None
    finally:
        bar.close()
    return results
