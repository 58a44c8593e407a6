"""The sweep engine: run every point of an experiment's grid once, resumably, in parallel.

Layout of a sweep directory DIR:

    DIR/results.csv              one row per finished point (factors, metrics, run_dir)
    DIR/sweep.json               the experiment, preset, the stores outside DIR it uses (a rerun
                                 without --cache / --runs uses them), every command, rule fingerprints
    DIR/runs/<train_id>/         one trained model; points that differ only in evaluation share it
                                 (--runs DIR: a store shared by several sweeps)
        points/<point_id>.json   a finished point's metrics (written atomically, then the row)
    DIR/datasets/<task>-<hash>/  generated data, keyed by a content hash of generator params+seed
                                 (--cache DIR: shared by several sweeps)

Crash safety, kill -9 included: a point's metrics are written to a temporary file and renamed;
its `wall_s` counts every attempt (`points/<point_id>.elapsed` keeps the running total);
the row is added by rewriting results.csv to a temporary file and renaming it, under an exclusive
file lock, skipping point ids already present. So results.csv is always a whole, duplicate-free
table; a point killed before its metrics file exists reruns (its training resumes from the last
checkpoint in its run dir); a point killed after it gets its row on the next run without rerunning.

The engine does not know what a point does: a point runner (`PointRunner`, a module) does the
work; the lab's is `synthlab.stages` (generate, train, evaluate); tests pass a cheap one. Workers
(spawn processes, Ray tasks) import the runner module by name.
Executors: in process (`jobs=1`), a spawn process pool (`jobs>1`), a process per model on its
GPUs, or Ray tasks (`executor="ray"`): GPUs as `synthlab.devices` assigns them. The driver adds
the rows as each model's points finish. With `nproc_per_node` K a worker trains its point as a
torchrun job of K processes (the runner's `run_point(..., nproc=K)`)."""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from synthlab import devices
from synthlab.errors import SynthlabError
from synthlab.experiments import Experiment, Point
from synthlab.files import atomic_write_text, check_writable, die_with_parent, file_lock, warn
from synthlab.progress import Progress
from synthlab.results import RESULTS, append_rows, cell_number, factor_column, missing_columns, read_rows
from synthlab.rules import record_rules

# --- work units: one trained model and the points evaluated on it --------------------------


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

    demand = property(lambda self: devices.Demand(max(1, self.nproc), self.gib))


@runtime_checkable
class PointRunner(Protocol):
    """What a point runner module defines (its optional functions: `RunnerHooks`)."""

    def parse(self, config: dict[str, Any]) -> Any:
        """Check and type a point's resolved config; called once per point, in the driver, so a bad
        grid fails before anything runs (raises SynthlabError)."""

    def run_point(self, point: Any, run_dir: Path, *, cache_dir: Path, nproc: int = 0) -> dict[str, Any]:
        """Do the point's work in run_dir (data cached in cache_dir); return its row's metrics
        (float or str values). nproc >= 1: train as a torchrun job of that many processes."""


class RunnerHooks(Protocol):
    """What a point runner may define besides; the engine uses each where the runner has it (`hook`)."""

    def estimate_seconds(self, point: Any, *, finished: bool) -> float:
        """The point's cost in seconds, for --dry-run."""

    def gpu_cost(self, point: Any) -> dict[str, Any]:
        """Tokens, FLOPs, memory and hours on one GPU: the --dry-run columns of a gpu preset."""

    def columns(self, point: Any) -> list[str]:
        """The columns a finished row of the point fills (a row that misses one, or is not whole,
        counts as unfinished: the point runs again)."""

    def changed_since(self, point: Any, run_dir: Path) -> str:
        """Why the model in run_dir is not the one the point asks for now ("" when it is)."""

    def gpu_memory_gib(self, point: Any) -> float:
        """The point's estimated peak GPU memory: small points share a GPU by it (synthlab.devices)."""


def hook(runner: PointRunner, name: str) -> Callable | None:
    """The runner's optional function `name` (one of `RunnerHooks`), None when it has none."""
    if not callable(getattr(RunnerHooks, name, None)):
        raise AttributeError(f"{name} is not a point runner hook")
    return getattr(runner, name, None)


def load_runner(name: str) -> PointRunner:
    """The runner module `name`; it must define parse and run_point."""
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        raise SynthlabError(f"--runner '{name}' cannot be imported: {err}") from None
    missing = [f for f in ("parse", "run_point") if not callable(getattr(module, f, None))]
    if missing or not isinstance(module, PointRunner):
        raise SynthlabError(f"--runner '{name}' is not a point runner: it defines no {missing[0]}()")
    return module


def parse_points(runner: PointRunner, experiment: Experiment, preset: str, points: list[Point]) -> list[Any]:
    """Every point's config checked and typed by the runner, once; an error names the point."""
    parsed = []
    for point in points:
        try:
            parsed.append(runner.parse(point.config))
        except SynthlabError as err:
            raise SynthlabError(f"{experiment.name}.{preset} {point.factors}: {err}") from None
    return parsed


def finished_points(runner: PointRunner, experiment: Experiment, preset: str, points: list[Point],
                    path: Path) -> tuple[set[str], set[str]]:
    """(ids of the points with a whole row in the table, ids of those whose row misses a column the
    runner's optional `columns(point)` names: they run again, with a warning, and their new row
    replaces the old one)."""
    rows = {r["point_id"]: r for r in read_rows(path)}
    columns = hook(runner, "columns")
    listed = [p for p in points if p.point_id in rows]
    stale = set()
    for point, typed in zip(listed, parse_points(runner, experiment, preset, listed) if columns else []):
        missing = missing_columns(rows[point.point_id], columns(typed))
        if missing:
            warn(f"{path}: the row of point {point.point_id} has no {', '.join(missing)}; running the point again")
            stale.add(point.point_id)
    return set(rows) - stale, stale


def changed_points(runner: PointRunner, experiment: Experiment, preset: str, points: list[Point],
                   runs_dir: Path) -> dict[str, str]:
    """{point id: why} for the points whose trained model no longer matches what the point asks for
    (the runner's optional `changed_since(point, run_dir)`)."""
    changed_since = hook(runner, "changed_since")
    if changed_since is None:
        return {}
    typed = parse_points(runner, experiment, preset, points)
    found = {p.point_id: changed_since(t, runs_dir / p.train_id) for p, t in zip(points, typed)}
    return {point_id: why for point_id, why in found.items() if why}


def run_unit(unit: Unit) -> list[dict[str, Any]]:
    """Run (or recover) every point of a unit; returns their result rows. Used by every executor."""
    if unit.cuda_visible is not None:  # a fresh worker: CUDA starts after this, on these GPUs only
        os.environ["CUDA_VISIBLE_DEVICES"] = unit.cuda_visible
    if unit.threads:
        import torch

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
                metrics, wall_s = timed(elapsed, lambda: runner.run_point(p["point"], run_dir,
                                                                          cache_dir=Path(unit.cache_dir), **launch))
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


def make_units(experiment: Experiment, preset: str, points: list[Point], parsed: list[Any], runs_dir: Path,
               runner: PointRunner, cache_dir: Path, threads: int, nproc: int = 0,
               rerun: set[str] = frozenset(), gpus: bool = False) -> list[Unit]:
    """Group points by trained model, keeping grid order; the points in `rerun` run again even where
    their point record is whole. gpus: each unit's `gib` is the largest of its points' estimates
    (the runner's optional `gpu_memory_gib(point)`)."""
    units: dict[str, Unit] = {}
    estimate = hook(runner, "gpu_memory_gib") if gpus else None
    for point, typed in zip(points, parsed):
        unit = units.setdefault(
            point.train_id,
            Unit(runner=runner.__name__, run_dir=str(runs_dir / point.train_id), cache_dir=str(cache_dir),
                 points=[], threads=threads, nproc=nproc),
        )
        unit.points.append({"point_id": point.point_id, "factors": point.factors, "point": typed,
                            "experiment": experiment.name, "preset": preset,
                            "columns": list(hook(runner, "columns")(typed)) if hook(runner, "columns") else [],
                            "rerun": point.point_id in rerun})
        if estimate is not None:
            unit.gib = max(unit.gib or 0.0, float(estimate(typed)))
    return list(units.values())


# --- executors -------------------------------------------------------------------------------


def _execute_local(units: list[Unit], jobs: int, on_done, gpus: list[float] = ()) -> None:
    """In this process (jobs 1, no GPU), spawn processes, or on `gpus` (GiB each: devices.run_on_gpus)."""
    if gpus:
        devices.run_on_gpus(units, gpus, jobs, run_unit, on_done)
        return
    if jobs == 1:
        for unit in units:
            on_done(run_unit(unit))
        return
    import concurrent.futures
    import multiprocessing

    # spawn: a fresh interpreter per worker (fork would copy torch's thread pools and locks); each ends with the driver
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=die_with_parent) as pool:
        futures = [pool.submit(run_unit, unit) for unit in units]
        for future in concurrent.futures.as_completed(futures):
            on_done(future.result())


def run_sweep(experiment: Experiment, preset: str, out: Path, *, runner: PointRunner, jobs: int | None = None,
              executor: str = "local", ray_address: str | None = None, cache_dir: Path | None = None,
              runs_dir: Path | None = None, threads: int | None = None, nproc_per_node: int = 0,
              progress: bool = True, reevaluate: bool = False, gpus: list[float] | None = None) -> Path:
    """Run every unfinished point of `experiment`'s `preset` grid; returns the results.csv path.

    cache_dir: datasets (default OUT/datasets); runs_dir: trained models (default OUT/runs). Sweeps
    that share them generate each dataset and train each model once (a model is keyed by its
    config: e.g. depth's 1 x 4 model is faithfulness's).
    jobs: local workers at once; default one per GPU (synthlab.devices), else 1. `gpus`: each GPU's
    GiB (default: those this process sees); more jobs than GPUs share them where memory allows.
    threads: torch threads (and Ray CPUs) per run; default: cores / jobs locally, 1 on Ray.
    nproc_per_node: >= 1: each point's training runs as a torchrun job of that many processes
    (data-parallel; one GPU each on CUDA), started by the worker that runs the point (the runner's
    run_point gets nproc=K); 0: training runs in the worker.
    reevaluate: run the finished points again too (their models are reused, so after an evaluator
    change only the evaluation reruns); each new row replaces the old, its wall time added.
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
    points = experiment.points(preset)
    out = Path(out)
    cache_dir, runs_dir = store(out, "cache", cache_dir), store(out, "runs", runs_dir)
    finished, stale = finished_points(runner, experiment, preset, points, out / RESULTS)
    if reevaluate:
        finished, stale = set(), stale | finished
    for point_id, why in changed_points(runner, experiment, preset, [p for p in points if p.point_id in finished],
                                        runs_dir).items():
        warn(f"point {point_id}: its row is kept, but {why}")
    todo = [p for p in points if p.point_id not in finished]
    gpus = (devices.local_gpus() if gpus is None else list(gpus)) if todo else []
    jobs = jobs or devices.default_jobs(len(gpus))
    parsed = parse_points(runner, experiment, preset, todo)  # fail early, in the driver, on a bad grid
    out.mkdir(parents=True, exist_ok=True)
    _record_invocation(out, experiment, preset, cache_dir, runs_dir)
    results = out / RESULTS
    if threads is None:  # share this machine's cores among local workers; one core per Ray task
        threads = 1 if executor == "ray" else (max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else 0)
    units = make_units(experiment, preset, todo, parsed, runs_dir, runner, cache_dir, threads, nproc_per_node,
                       rerun=stale, gpus=bool(gpus) or executor == "ray")

    bar = Progress(len(points), initial=len(points) - len(todo), enabled=progress, desc=f"sweep {experiment.name}",
                   unit="point")

    def on_done(rows: list[dict[str, Any]]) -> None:
        append_rows(results, rows, replace=stale)
        bar.update(len(rows))

    try:
        if executor == "ray":
            devices.run_on_ray(units, ray_address, run_unit, on_done)
        else:
            _execute_local(units, jobs, on_done, gpus)
    finally:
        bar.close()
    return results


STORES = {"cache": ("--cache", "datasets"), "runs": ("--runs", "runs")}  # key: (option, default under OUT)


def read_info(out: Path) -> dict[str, Any]:
    """DIR/sweep.json as a dict ({} where there is none yet); a damaged one is one error line."""
    path = Path(out) / "sweep.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise SynthlabError(f"{path} is not valid JSON ({err}); repair or remove it") from None


def store(out: Path, key: str, given: Path | None) -> Path:
    """The sweep's dataset cache (key "cache") or trained-model store ("runs"): the one given, else
    the one a command in `out` was given before (sweep.json keeps it, so a rerun without --cache /
    --runs finds its models where they are instead of training them again), else OUT/datasets or
    OUT/runs."""
    option, default = STORES[key]
    if given is not None:
        return Path(given)
    recorded = read_info(out).get("stores", {}).get(key)
    if recorded:
        warn(f"{option} {recorded}: the store this sweep used before (sweep.json)")
        return Path(recorded)
    return Path(out) / default


def _command_line() -> str | None:
    """This process's command as a user would type it, when it is synthlab's command line (the
    entry point or `python -m synthlab`), else None (a library caller such as a test)."""
    prog = Path(sys.argv[0])
    if prog.name == "synthlab" or (prog.name == "__main__.py" and prog.parent.name == "synthlab"):
        return " ".join(["synthlab", *sys.argv[1:]])
    return None


def _record_invocation(out: Path, experiment: Experiment, preset: str, cache_dir: Path, runs_dir: Path) -> None:
    """DIR/sweep.json: what this directory holds, the stores it uses outside it, and every command
    that ran in it (for reports); its rules' fingerprints (`rules.record_rules`)."""
    path = out / "sweep.json"
    with file_lock(out / "sweep.json.lock"):  # two sweeps may share a directory
        info = read_info(out) or {"commands": []}
        if info.get("experiment", experiment.name) != experiment.name or info.get("preset", preset) != preset:
            raise SynthlabError(f"--out {out} holds sweep {info['experiment']}/{info['preset']}, not "
                                f"{experiment.name}/{preset}; choose another --out")
        command = _command_line()
        info.update(experiment=experiment.name, preset=preset, claim=experiment.claim, title=experiment.title,
                    plot=experiment.plot, definition=experiment.source, notes=experiment.notes.strip())
        outside = {key: str(folder.resolve()) for key, folder in (("cache", cache_dir), ("runs", runs_dir))
                   if folder.resolve() != (out / STORES[key][1]).resolve()}
        if outside or "stores" in info:
            info["stores"] = outside
        if command:
            info["commands"].append(command)
        record_rules(info, experiment, preset, starting=not (out / RESULTS).is_file())  # no results: all to run
        atomic_write_text(path, json.dumps(info, indent=1))


# --- dry run ---------------------------------------------------------------------------------


def plan(experiment: Experiment, preset: str, out: Path, *, runner: PointRunner,
         runs_dir: Path | None = None, gpu: bool = False) -> list[dict[str, Any]]:
    """The grid as rows: factors, status (done / partial / todo), measured or estimated cost and the
    run directory in the trained-model store that the point's model is (or would be) trained into.

    A finished point's cost is its measured wall time; the rest come from the runner's
    `estimate_seconds(point, finished=rows)` (which may calibrate on the finished rows), or NaN
    if it has none. gpu: the runner's optional `gpu_cost(point) -> dict` adds its columns to each
    row, and its `gpu_h` (hours on one GPU, less `gpu_h_shared` where an earlier point trains the
    model) is the cost of a point still to run.
    """
    out = Path(out)
    runs_dir = store(out, "runs", runs_dir)
    done = {r["point_id"]: r for r in read_rows(out / RESULTS)}
    estimate = hook(runner, "estimate_seconds")
    gpu_cost = hook(runner, "gpu_cost") if gpu else None
    points = experiment.points(preset)
    changed_since = hook(runner, "changed_since")
    rows, trained = [], set()
    for point, typed in zip(points, parse_points(runner, experiment, preset, points)):
        run_dir = runs_dir / point.train_id
        row = {"point_id": point.point_id, **{factor_column(a): v for a, v in point.factors.items()},
               "run_dir": str(run_dir)}
        if gpu_cost is not None:
            row.update(gpu_cost(typed))
        shared = point.train_id in trained  # evaluates a model an earlier point trains
        trained.add(point.train_id)
        if point.point_id in done:
            changed = changed_since is not None and changed_since(typed, run_dir)
            row.update(status="done, config changed" if changed else "done",
                       cost_s=cell_number(done[point.point_id], "wall_s", out / RESULTS), cost="measured")
        elif shared:
            own = row["gpu_h"] - row["gpu_h_shared"] if gpu_cost is not None else 0.0
            row.update(status="partial" if run_dir.is_dir() else "todo", cost_s=own * 3600, cost="shared model")
        else:
            row["status"] = "partial" if run_dir.is_dir() else "todo"
            seconds = (row["gpu_h"] * 3600 if gpu_cost is not None else
                       estimate(typed, finished=list(done.values())) if estimate else math.nan)
            row.update(cost_s=seconds, cost="estimated")
        rows.append(row)
    return rows
