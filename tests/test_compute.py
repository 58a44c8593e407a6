"""Compute accounting: a point's wall time survives an interruption and resume, and a model reused
from another sweep counts its training in the Compute of the sweep that reuses it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from synthlab.report import markdown as report
from synthlab.sweeps import executor


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_wall_time_adds_up_over_an_interrupted_attempt_and_its_resume(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(executor.time, "perf_counter", clock)
    path = tmp_path / "p.elapsed"

    def interrupted():
        clock.now += 100.0
        raise KeyboardInterrupt("signal")

    with pytest.raises(KeyboardInterrupt):
        executor.timed(path, interrupted)
    assert float(path.read_text()) == 100.0  # saved however the attempt ended

    def finish():
        clock.now += 50.0
        return "metrics"

    assert executor.timed(path, finish) == ("metrics", 150.0)
    path.unlink()
    assert executor.timed(path, finish) == ("metrics", 50.0)  # a fresh point starts from zero


def test_the_driver_records_the_wall_time_of_every_attempt(tmp_path, monkeypatch):
    import sweep_fake_runner

    from synthlab.sweeps import experiments

    clock = _Clock()
    monkeypatch.setattr(executor.time, "perf_counter", clock)
    attempts = []

    def run_point(config, run_dir, *, cache_dir):
        clock.now += 10.0
        attempts.append(1)
        if len(attempts) == 1:
            raise KeyboardInterrupt("killed mid-training")
        return {"accuracy": 0.5}

    monkeypatch.setattr(sweep_fake_runner, "run_point", run_point)
    exp = experiments.load(Path(__file__).parent / "fixtures" / "sweep_fake.toml")
    point = exp.points("smoke")[0]
    unit = executor.Unit(
        runner="sweep_fake_runner",
        run_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "d"),
        points=[
            {
                "point_id": point.point_id,
                "factors": point.factors,
                "point": point.config,
                "experiment": exp.name,
                "preset": "smoke",
            }
        ],
    )
    with pytest.raises(KeyboardInterrupt):
        executor.run_unit(unit)
    (row,) = executor.run_unit(unit)
    assert row["wall_s"] == 20.0
    assert not list((tmp_path / "run" / "points").glob("*.elapsed"))


def test_compute_counts_the_training_of_models_reused_from_another_sweep():
    table = pd.DataFrame(
        {
            "run_dir": ["a", "a", "b", "b"],
            "model_reused": [0, 1, 1, 1],
            "train_s": [600.0, 600.0, 1200.0, 1200.0],
            "wall_s": [630.0, 30.0, 30.0, 30.0],
        }
    )
    # a was trained here (its first row's wall time holds the training); b was trained elsewhere
    assert report.compute_line(table) == (
        "Compute: 32.0 min in all (sum of run wall times, 20.0 min of it "
        "training 1 model(s) reused from another sweep)."
    )
    assert (
        report.compute_line(table.drop(columns="model_reused")) == "Compute: 12.0 min in all (sum of run wall times)."
    )


def test_a_stale_row_run_again_keeps_the_compute_of_its_first_attempt(tmp_path, monkeypatch):
    """A row missing a column runs again on the model it trained (model_reused 1 in the new run):
    its wall time adds to the first attempt's, and it still says its model was trained in it."""
    import json

    import sweep_fake_runner

    from synthlab.sweeps import experiments

    clock = _Clock()
    monkeypatch.setattr(executor.time, "perf_counter", clock)
    runs = iter(
        [(600.0, {"accuracy": 0.5, "model_reused": 0}), (30.0, {"accuracy": 0.5, "model_reused": 1, "new_column": 1.0})]
    )

    def run_point(config, run_dir, *, cache_dir):
        seconds, metrics = next(runs)
        clock.now += seconds
        return metrics

    monkeypatch.setattr(sweep_fake_runner, "run_point", run_point)
    exp = experiments.load(Path(__file__).parent / "fixtures" / "sweep_fake.toml")
    point = exp.points("smoke")[0]
    spec = {
        "point_id": point.point_id,
        "factors": point.factors,
        "point": point.config,
        "experiment": exp.name,
        "preset": "smoke",
    }
    unit = executor.Unit(
        runner="sweep_fake_runner", run_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "d"), points=[spec]
    )
    (first,) = executor.run_unit(unit)
    assert (first["wall_s"], first["model_reused"]) == (600.0, 0)
    unit.points[0] = {**spec, "columns": ["new_column"]}  # the runner now fills a column the record lacks
    (again,) = executor.run_unit(unit)
    assert (again["wall_s"], again["model_reused"], again["new_column"]) == (630.0, 0, 1.0)
    record = json.loads((tmp_path / "run" / "points" / f"{point.point_id}.json").read_text())
    assert record["wall_s"] == 630.0
