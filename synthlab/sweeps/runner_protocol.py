"""The point-runner contract: what a module must define to do a sweep point's work (`PointRunner`)
and may define besides (`RunnerHooks`), loading one by name, and typing a grid's points with it.

The sweep driver (`synthlab.sweeps.driver`) does not know what a point does; the lab's runner is
`synthlab.sweeps.lab_runner` (generate, train, evaluate); tests pass a cheap one. Workers (spawn processes,
Ray tasks) import the runner module by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from synthlab.errors import SynthlabError
from synthlab.sweeps.experiments import Experiment, Point


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
    """What a point runner may define besides; the driver uses each where the runner has it (`hook`)."""

    def estimate_seconds(
        self, point: Any, *, finished: list[dict[str, Any]], jobs: int = 1, trained: bool = False
    ) -> float:
        """The point's cost in seconds, for --dry-run; `finished`: the sweep's finished rows, each
        with its parsed point as "point" (None for a point the grid no longer holds); `jobs`: the
        points the sweep runs at a time; `trained`: an earlier point trains its model, so only the
        work past training counts (each passed only to a hook that takes the keyword)."""

    def gpu_cost(self, point: Any) -> dict[str, Any]:
        """Tokens, FLOPs, memory and hours on one GPU: the --dry-run columns of a gpu preset."""

    def columns(self, point: Any) -> list[str]:
        """The columns a finished row of the point fills (a row that misses one, or is not whole,
        counts as unfinished: the point runs again)."""

    def changed_since(self, point: Any, run_dir: Path) -> str:
        """Why the model in run_dir is not the one the point asks for now ("" when it is)."""

    def gpu_memory_gib(self, point: Any) -> float:
        """The point's estimated peak GPU memory: small points share a GPU by it (synthlab.sweeps.gpu_scheduling)."""


def hook(runner: PointRunner, name: str) -> Callable | None:
    """The runner's optional function `name` (one of `RunnerHooks`), None when it has none."""
    if not callable(getattr(RunnerHooks, name, None)):
        raise AttributeError(f"{name} is not a point runner hook")
    return getattr(runner, name, None)


# Runner modules under the names older commands and scripts used (`--runner <old name>`).
MOVED_RUNNERS = {"synthlab.point_runner": "synthlab.sweeps.lab_runner"}


def load_runner(name: str) -> PointRunner:
    """The runner module `name`; it must define parse and run_point."""
    try:
        module = importlib.import_module(MOVED_RUNNERS.get(name, name))
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
