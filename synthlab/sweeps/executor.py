"""A sweep's work units and their execution: a `Unit` is one trained model and the points
evaluated on it; `run_unit` runs (or recovers) its points in a worker, `execute` runs the units in
this process, in spawn processes, on GPUs or as Ray tasks (`synthlab.sweeps.gpu_scheduling`).

A point's metrics are written to a temporary file and renamed (`points/<point_id>.json` in its
run dir); its `wall_s` counts every attempt (`points/<point_id>.elapsed` keeps the running total).
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text, die_with_parent, file_lock
from synthlab.sweeps import gpu_scheduling
from synthlab.sweeps.experiments import Experiment, Point
from synthlab.sweeps.results_table import factor_column, missing_columns
from synthlab.sweeps.runner_protocol import PointRunner, hook, load_runner


@dataclass
class Unit:
    """A job for one worker: train once in run_dir, then finish each point on that model."""

    runner: str  # the runner module's name (workers import it)
    run_dir: str
    cache_dir: str
    points: list[dict[str, Any]]  # each {"point_id", "factors", "point", "experiment", "preset"}
    threads: int = 0  # torch intra-op threads for this worker (0: leave as is)
    nproc: int = 0  # >= 1: the runner trains under torchrun with this many processes (0: in the worker)
    gib: float | None = None  # estimated peak GPU memory of its largest point (None: not estimated)
    cuda_visible: str | None = None  # CUDA_VISIBLE_DEVICES of the worker (None: inherited)

    demand = property(lambda self: gpu_scheduling.Demand(max(1, self.nproc), self.gib))


def run_unit(unit: Unit) -> list[dict[str, Any]]:
    """Run (or recover) every point of a unit; returns their result rows. Used by every executor."""
    if unit.cuda_visible is not None:  # a fresh worker: CUDA starts after this, on these GPUs only
        os.environ["CUDA_VISIBLE_DEVICES"] = unit.cuda_visible
    if unit.threads:
        torch.set_num_threads(unit.threads)
    runner = load_runner(unit.runner)
    run_dir = Path(unit.run_dir)
    (run_dir / "points").mkdir(parents=True, exist_ok=True)
    rows = []
    # The lock keeps two sweeps (or two workers) from training the same model at once.
    with file_lock(run_dir / ".lock"):
        for p in unit.points:
            done = run_dir / "points" / f"{p['point_id']}.json"
            try:
                record = json.loads(done.read_text()) if done.is_file() else None
            except ValueError:  # cut short: the point runs again
                record = None
            if record is None or p.get("rerun") or missing_columns(record["metrics"], p.get("columns", ())):
                elapsed = done.with_suffix(".elapsed")
                launch = {"nproc": unit.nproc} if unit.nproc else {}
                metrics, wall_s = timed(
                    elapsed, lambda: runner.run_point(p["point"], run_dir, cache_dir=Path(unit.cache_dir), **launch)
                )
                if record is not None and metrics.get("model_reused") == 1:
                    # a stale row run again on the model it trained: its compute is the first
                    # attempt's (training included, or not, as that record says) plus this one
                    metrics["model_reused"] = record["metrics"].get("model_reused", 1)
                    wall_s += float(record["wall_s"])
                record = {"metrics": metrics, "wall_s": wall_s}
                atomic_write_text(done, json.dumps(record, indent=1, sort_keys=True))
                elapsed.unlink(missing_ok=True)
            factors = {factor_column(axis): value for axis, value in p["factors"].items()}
            row = {"point_id": p["point_id"], "experiment": p["experiment"], "preset": p["preset"], **factors}
            row.update({k: v for k, v in record["metrics"].items() if k not in row})  # factors win a name clash
            rows.append({**row, "wall_s": record["wall_s"], "run_dir": str(run_dir)})
    return rows


ELAPSED_EVERY = 5.0  # seconds between saves of a running point's elapsed time


def timed(path: Path, work: Callable[[], Any]) -> tuple[Any, float]:
    """(work(), wall seconds over every attempt): earlier attempts' time (interrupted, or killed:
    then up to ELAPSED_EVERY s is lost) is read from `path`, which holds the running total, saved
    every ELAPSED_EVERY s and when the attempt ends, however it ends."""
    try:
        before = float(path.read_text()) if path.is_file() else 0.0
    except ValueError:
        before = 0.0
    start, stop = time.perf_counter(), threading.Event()

    def save() -> None:
        atomic_write_text(path, repr(before + time.perf_counter() - start))

    def beat() -> None:
        while not stop.wait(ELAPSED_EVERY):
            save()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        result = work()
    finally:
        stop.set()
        thread.join()
        save()
    return result, before + time.perf_counter() - start


def make_units(
    experiment: Experiment,
    preset: str,
    points: list[Point],
    parsed: list[Any],
    runs_dir: Path,
    runner: PointRunner,
    cache_dir: Path,
    threads: int,
    nproc: int = 0,
    rerun: set[str] = frozenset(),
    gpus: bool = False,
) -> list[Unit]:
    """Group points by trained model, keeping grid order; the points in `rerun` run again even where
    their point record is whole. gpus: each unit's `gib` is the largest of its points' estimates
    (the runner's optional `gpu_memory_gib(point)`)."""
    units: dict[str, Unit] = {}
    estimate = hook(runner, "gpu_memory_gib") if gpus else None
    for point, typed in zip(points, parsed):
        unit = units.setdefault(
            point.train_id,
            Unit(
                runner=runner.__name__,
                run_dir=str(runs_dir / point.train_id),
                cache_dir=str(cache_dir),
                points=[],
                threads=threads,
                nproc=nproc,
            ),
        )
        unit.points.append(
            {
                "point_id": point.point_id,
                "factors": point.factors,
                "point": typed,
                "experiment": experiment.name,
                "preset": preset,
                "columns": list(hook(runner, "columns")(typed)) if hook(runner, "columns") else [],
                "rerun": point.point_id in rerun,
            }
        )
        if estimate is not None:
            unit.gib = max(unit.gib or 0.0, float(estimate(typed)))
    return list(units.values())


def execute(
    units: list[Unit],
    on_done: Callable[[list[dict[str, Any]]], None],
    *,
    executor: str = "local",
    jobs: int = 1,
    gpus: list[float] = (),
    ray_address: str | None = None,
) -> None:
    """Run every unit, handing each unit's rows to `on_done` as it finishes: as Ray tasks
    (`executor="ray"`: devices.run_on_ray), on `gpus` (GiB each: devices.run_on_gpus), in this
    process (jobs 1, no GPU) or in `jobs` spawn processes."""
    if executor == "ray":
        gpu_scheduling.run_on_ray(units, ray_address, run_unit, on_done)
        return
    if gpus:
        gpu_scheduling.run_on_gpus(units, gpus, jobs, run_unit, on_done)
        return
    if jobs == 1:
        for unit in units:
            on_done(run_unit(unit))
        return
    # spawn: a fresh interpreter per worker (fork would copy torch's thread pools and locks); each ends with the driver
    ctx = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=die_with_parent
        ) as pool:
            futures = [pool.submit(run_unit, unit) for unit in units]
            for future in concurrent.futures.as_completed(futures):
                on_done(future.result())
    except BrokenProcessPool:  # a worker killed (kill -9, out of memory): the others cannot go on
        raise SynthlabError(
            "a sweep worker ended abruptly (killed, or out of memory?); the finished points are in "
            "results.csv: rerun the same command to resume the rest"
        ) from None
