"""synthlab.sweeps.step_rate: the dry run's CPU estimate from per-shape step times (timed here, or
the sweep's finished runs of the shape), and the points train.compile would repay."""

from __future__ import annotations

import csv
import dataclasses
import types
from pathlib import Path

import pytest

from synthlab.sweeps import driver, experiments, lab_runner, step_rate
from synthlab.sweeps import plan as sweep_plan
from synthlab.sweeps.cost import positions

TESTS = Path(__file__).parent
FAKE = TESTS / "fixtures" / "sweep_fake.toml"


def capacity_points():
    """The capacity smoke preset's two points (loops 1 and 4), typed."""
    return [lab_runner.parse(p.config) for p in experiments.load("capacity").points("smoke")]


def with_train(point, **changes):
    return dataclasses.replace(point, train=point.train.replaced(**changes))


def test_the_shape_is_what_sets_a_steps_time():
    one, four = capacity_points()
    shape = step_rate.training_shape(one)
    assert step_rate.training_shape(with_train(one, seed=7, lr=1.0, exposures=99.0, warmup_steps=1)) == shape
    assert step_rate.training_shape(four) != shape  # another model
    for changes in ({"batch_size": 16}, {"loss": "mean"}, {"grad_accum": 2}, {"optimizer_impl": "fused"}):
        assert step_rate.training_shape(with_train(one, **changes)) != shape, changes


def test_synthetic_rows_have_the_points_shape():
    one, _ = capacity_points()
    _, seq = positions(one)
    rows = step_rate.synthetic_batcher(one, seq, 4 * one.train.batch.batch_size).next_batch()
    assert rows.inputs.shape == (one.train.batch.batch_size, seq) and rows.doc_ids is not None  # bioS rows are packed
    assert rows.inputs.max() < one.model.vocab_size and rows.doc_ids.max() > 1  # several documents a row


def test_each_shape_is_timed_once(monkeypatch):
    one, four = capacity_points()
    monkeypatch.setattr(step_rate, "_TIMED", {})
    assert 0 < step_rate.seconds_per_step(one) < 5  # timed for real: a tiny model's step
    timed = []
    monkeypatch.setattr(step_rate, "_time_steps", lambda point: timed.append(point) or (0.5, 1.0))
    monkeypatch.setattr(step_rate.os, "sched_getaffinity", lambda pid: {0, 1})
    step_rate.seconds_per_step(with_train(one, seed=3))  # the same shape: not timed again
    assert step_rate.seconds_per_step(four) == 0.5 and timed == [four]  # a core left for one job
    assert step_rate.seconds_per_step(four, jobs=3) == pytest.approx(0.5 * 4 / 2) and timed == [four]  # 2 of 4
    assert step_rate.timed_shapes() == 2


def fixed_rates(monkeypatch, rates: dict):
    """seconds_per_step gives `rates[loops]` (no timing)."""
    monkeypatch.setattr(step_rate, "seconds_per_step", lambda point, jobs=1: rates[point.model.loops])


def row(point, train_s, steps, reused=0):
    return {"point": point, "train_s": str(train_s), "train_steps": str(steps), "model_reused": str(reused)}


def test_the_estimate_uses_finished_runs_of_the_same_shape_else_the_timing(monkeypatch):
    one, four = capacity_points()
    fixed_rates(monkeypatch, {1: 0.01, 4: 0.04})
    steps = positions(one)[0]
    assert step_rate.estimate_seconds(one, finished=[]) == pytest.approx(steps * 0.01)
    # a finished run of the same shape (another seed): its seconds per step; a reused model counts once
    finished = [row(with_train(one, seed=5), 30.0, 1000), row(with_train(one, seed=5), 30.0, 1000, reused=1)]
    assert step_rate.estimate_seconds(one, finished=finished) == pytest.approx(steps * 0.03)
    # only other shapes finished: the timing, times how much slower they ran than their own timing
    slower = [row(four, 2 * 0.04 * 500, 500)]
    assert step_rate.estimate_seconds(one, finished=slower) == pytest.approx(steps * 0.01 * 2)
    assert step_rate.estimate_seconds(one, finished=[{"point": None, "train_s": "1", "train_steps": "1"}]) == (
        pytest.approx(steps * 0.01)  # a row of a point no longer in the grid says nothing of its shape
    )


def test_the_estimate_adds_the_time_finished_runs_of_its_stages_and_model_spent_past_training(monkeypatch):
    one, four = capacity_points()
    fixed_rates(monkeypatch, {1: 0.01, 4: 0.04})
    steps = positions(one)[0]
    finished = [
        {**row(with_train(one, seed=5), 30.0, 1000), "wall_s": "42"},  # 12 s of evaluation
        {**row(with_train(one, seed=6), 30.0, 1000), "wall_s": "38"},  # 8 s
        {**row(four, 40.0, 1000), "wall_s": "140"},  # another model: says nothing of this one's
        {**row(with_train(one, seed=5), 30.0, 1000, reused=1), "wall_s": "7"},  # evaluated a model trained before
    ]
    assert step_rate.estimate_seconds(one, finished=finished) == pytest.approx(steps * 0.03 + 9.0)
    assert step_rate.estimate_seconds(one, finished=finished, trained=True) == pytest.approx(9.0)  # a shared model
    other_stages = dataclasses.replace(one, stages=(*one.stages, "extra"))
    assert step_rate.after_training_seconds(other_stages, finished) == 0.0


def test_plan_passes_each_finished_row_with_its_point(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    import sweep_fake_runner

    exp = experiments.load(FAKE)
    driver.run_sweep(exp, "smoke", tmp_path, runner=sweep_fake_runner, progress=False)
    results = tmp_path / "results.csv"
    with open(results, newline="") as f:
        table = list(csv.DictReader(f))
    kept = table[: len(table) // 2]
    with open(results, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(kept)
    seen = []

    def estimate(point, *, finished):
        seen.append(finished)
        return 1.0

    runner = types.SimpleNamespace(parse=sweep_fake_runner.parse, estimate_seconds=estimate)
    sweep_plan.plan(exp, "smoke", tmp_path, runner=runner, jobs=2)  # a hook without `jobs` is called without it
    configs = {p.point_id: p.config for p in exp.points("smoke")}
    assert seen and all(len(f) == len(kept) for f in seen)
    assert all(r["point"] == configs[r["point_id"]] for r in seen[0])

    asked = []
    runner.estimate_seconds = lambda point, *, finished, jobs=1: asked.append(jobs) or 1.0
    sweep_plan.plan(exp, "smoke", tmp_path, runner=runner, jobs=2)
    assert asked and set(asked) == {2}  # the sweep's jobs, to a hook that takes them


def test_compile_is_named_where_the_time_saved_exceeds_its_compile(monkeypatch):
    one, four = capacity_points()
    monkeypatch.setattr(step_rate, "COMPILE_SPEEDUP", 1.25)  # saves a fifth of the time
    monkeypatch.setattr(step_rate, "COMPILE_COLD_S", 100.0)
    monkeypatch.setattr(step_rate, "COMPILE_WARM_S", 10.0)
    points = {"a": one, "b": with_train(one, seed=1), "c": four, "d": with_train(four, compile=True), "e": four}
    rows = [
        {"point_id": "a", "cost_s": 400.0, "cost": "estimated"},  # saves 80 s < 100 s cold
        {"point_id": "b", "cost_s": 400.0, "cost": "estimated"},  # the same shape again: 80 s > 10 s warm
        {"point_id": "c", "cost_s": 600.0, "cost": "estimated"},  # 120 s > 100 s cold
        {"point_id": "d", "cost_s": 9000.0, "cost": "estimated"},  # compiles already
        {"point_id": "e", "cost_s": 9000.0, "cost": "measured"},  # done
    ]
    assert step_rate.compile_repays(rows, points) == ["b", "c"]


def test_a_job_gets_a_core_where_one_is_left_else_an_equal_share(monkeypatch):
    monkeypatch.setattr(step_rate.os, "sched_getaffinity", lambda pid: {0, 1})
    # (seconds the cores were busy, this process's CPU seconds) before and after 10 s
    assert step_rate.busy_elsewhere((0.0, 0.0), (18.0, 10.0), 10.0) == pytest.approx(0.8)
    assert step_rate.busy_elsewhere((0.0, 0.0), (10.0, 10.0), 10.0) == 0.0  # only this process ran
    assert step_rate.busy_elsewhere(None, (1.0, 1.0), 10.0) == 0.0  # no /proc/stat: nothing else assumed
    assert step_rate.core_share(0.8) == 1.0  # a core left over
    assert step_rate.core_share(2.0) == pytest.approx(2 / 3)  # two busy cores
    assert step_rate.core_share(0.8, jobs=2) == pytest.approx(2 / 2.8)  # the sweep's own two jobs share too
    assert step_rate.core_share(0.0, jobs=2) == 1.0
    before = step_rate._busy()
    assert before is not None and before[0] >= before[1] >= 0  # this process's time is in the cores' total
