"""The sweep driver: grid expansion, the results table, the data cache, resume and kill -9 safety.

These tests drive the sweep driver with the cheap runner in tests/sweep_fake_runner.py, whose metrics
depend only on the config (and which checkpoints after every step), so an interrupted sweep
must end with exactly the table of an uninterrupted one.
"""

from __future__ import annotations

import copy
import dataclasses
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synthlab import files
from synthlab.claims import rules
from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.sweeps import driver, experiments, results_table, runner_protocol
from synthlab.sweeps import info as sweep_info
from synthlab.sweeps import lab_runner as point_runner
from synthlab.sweeps import plan as sweep_plan

TESTS = Path(__file__).parent
FAKE = TESTS / "fixtures" / "sweep_fake.toml"
sys.path.insert(0, str(TESTS))
import sweep_fake_runner  # noqa: E402  (a module beside the tests)

RUNNER = sweep_fake_runner


def _table(results: Path) -> list[tuple]:
    """The results as comparable tuples, without the columns that legitimately differ."""
    rows = results_table.read_rows(results)
    return sorted(tuple(sorted((k, v) for k, v in r.items() if k not in ("wall_s", "run_dir"))) for r in rows)


def test_grid_expands_to_the_cartesian_product_with_named_axes():
    exp = experiments.load(FAKE)
    points = exp.points("smoke")
    assert len(points) == 2 * 2 * 2
    widths = {(p.factors["arch"], p.config["model"]["width"]) for p in points}
    assert widths == {("a", 1), ("b", 2)}
    assert all(p.config["train"]["steps"] == 5 and p.config["task"] == "fake" for p in points)
    # points that differ only in eval options share a trained model; all point ids are distinct
    assert len({p.point_id for p in points}) == 8 and len({p.train_id for p in points}) == 4
    # the cpu preset overrides base sections
    assert all(p.config["train"]["sleep"] == 0.04 for p in exp.points("cpu"))


def test_point_ids_are_content_hashes():
    a = experiments.content_hash({"x": 1, "y": {"b": 2, "a": 1}})
    assert a == experiments.content_hash({"y": {"a": 1, "b": 2}, "x": 1})
    assert a != experiments.content_hash({"x": 2, "y": {"a": 1, "b": 2}})


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r.update(color="red"), "unknown key"),
        (lambda r: r.update(presets={}), "no preset"),
        (lambda r: r["presets"]["smoke"]["grid"].update({"optim.lr": [1]}), "section 'optim'"),
        (lambda r: r["presets"]["smoke"]["grid"].update({"data.size": []}), "non-empty list"),
        (lambda r: r["presets"]["smoke"]["grid"].update({"arch": [{"model.width": 1}]}), "label"),
        (lambda r: r.update(stages=["eval"]), "stages"),
    ],
)
def test_bad_definitions_are_rejected_with_one_line(edit, message):
    import tomllib

    raw = tomllib.loads(FAKE.read_text())
    edit(raw)
    with pytest.raises(SynthlabError, match=message):
        experiments.parse(raw)


def test_a_preset_written_with_like_resolves_to_the_same_points_as_written_in_full():
    import tomllib

    raw = tomllib.loads(FAKE.read_text())
    full = copy.deepcopy(raw["presets"]["smoke"])
    full["train"] = {**full.get("train", {}), "sleep": 0.5}
    raw["presets"]["full"] = full
    raw["presets"]["liked"] = {"like": "smoke", "train": {"sleep": 0.5}}  # sections merge field by field
    raw["presets"]["regrid"] = {"like": "liked", "seeds": 2, "grid": {"model.width": [3]}}  # grid replaced
    exp = experiments.parse(raw)
    assert [p.point_id for p in exp.points("liked")] == [p.point_id for p in exp.points("full")]
    assert [p.factors for p in exp.points("liked")] == [p.factors for p in exp.points("full")]
    regrid = exp.points("regrid")
    assert {(p.factors["seed"], p.config["model"]["width"], p.config["train"]["sleep"]) for p in regrid} == {
        (0, 3, 0.5),
        (1, 3, 0.5),
    }
    assert "like" not in exp.presets["liked"] and exp.presets["smoke"] == raw["presets"]["smoke"]


@pytest.mark.parametrize(
    "presets, message",
    [
        ({"a": {"like": "nowhere"}}, "like = 'nowhere' names no preset"),
        ({"a": {"like": "b"}, "b": {"like": "a"}}, "round in a circle"),
        ({"a": {"like": "a"}}, "round in a circle"),
        ({"a": {"like": "smoke", "optim": {}}}, "unknown section 'optim'"),
    ],
)
def test_a_bad_like_is_one_error_line(presets, message):
    import tomllib

    raw = tomllib.loads(FAKE.read_text())
    raw["presets"].update(presets)
    with pytest.raises(SynthlabError, match=message):
        experiments.parse(raw)


def test_every_builtin_experiment_and_preset_loads_and_validates():
    names = experiments.available()
    assert set(names) >= {
        "capacity",
        "mano",
        "multihop",
        "reach",
        "scaling",
        "exit",
        "kvcache",
        "topology",
        "depth",
        "faithfulness",
    }
    for name in names:
        exp = experiments.load(name)
        for preset in experiments.PRESETS:
            points = exp.points(preset)
            assert runner_protocol.parse_points(point_runner, exp, preset, points), (name, preset)


def _append_worker(path: str, start: int) -> None:
    for i in range(start, start + 10):
        results_table.append_rows(Path(path), [{"point_id": f"p{i % 25}", "value": i, f"extra{start}": 1.5}])


@pytest.mark.slow  # three spawned interpreters
def test_concurrent_appends_never_duplicate_or_corrupt(tmp_path):
    path = tmp_path / "results.csv"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_worker, args=(str(path), s)) for s in (0, 10, 20)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    rows = results_table.read_rows(path)
    ids = [r["point_id"] for r in rows]
    assert sorted(ids) == sorted({f"p{i % 25}" for i in range(30)})  # 25 ids, each once
    assert {"extra0", "extra10", "extra20"} <= set(rows[0])  # new metric columns were added
    assert not list(tmp_path.glob(".*.tmp"))


def test_cached_dir_builds_once(tmp_path):
    calls = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        tmp.mkdir()
        (tmp / "x").write_text("1")

    a = files.cached_dir(tmp_path, {"n": 1}, build, "t-")
    b = files.cached_dir(tmp_path, {"n": 1}, build, "t-")
    c = files.cached_dir(tmp_path, {"n": 2}, build, "t-")
    assert a == b != c and len(calls) == 2 and (a / "x").read_text() == "1"


def test_sweep_runs_every_point_once_and_rerun_skips(tmp_path):
    exp = experiments.load(FAKE)
    results = driver.run_sweep(exp, "smoke", tmp_path, runner=RUNNER, progress=False)
    rows = results_table.read_rows(results)
    assert len(rows) == 8
    assert {"data.size", "arch", "eval.probe", "accuracy", "steps", "run_dir", "point_id"} <= set(rows[0])
    # one dataset per data config, shared through the cache
    assert len({r["data_dir"] for r in rows}) == 2 and len(list((tmp_path / "datasets").iterdir())) >= 2
    # each model trained once although two eval points use it
    starts = [(Path(r["run_dir"]) / "starts.log").read_text().split() for r in rows]
    assert all(s == ["0", "5"] for s in starts)  # second point found training finished
    before = _table(results)
    driver.run_sweep(exp, "smoke", tmp_path, runner=RUNNER, progress=False)
    assert _table(results) == before
    assert all((Path(r["run_dir"]) / "starts.log").read_text().split() == ["0", "5"] for r in rows)


@pytest.mark.slow  # a spawn pool of two workers
def test_parallel_jobs_give_the_same_table(tmp_path):
    exp = experiments.load(FAKE)
    serial = driver.run_sweep(exp, "smoke", tmp_path / "serial", runner=RUNNER, progress=False)
    parallel = driver.run_sweep(exp, "smoke", tmp_path / "parallel", jobs=2, runner=RUNNER, progress=False)
    assert _table(serial) == _table(parallel)


def test_lost_row_is_recovered_without_rerunning(tmp_path):
    # kill -9 between a point's metrics file and its row: the rerun adds the row, trains nothing
    exp = experiments.load(FAKE)
    results = driver.run_sweep(exp, "smoke", tmp_path, runner=RUNNER, progress=False)
    full = _table(results)
    rows = results_table.read_rows(results)
    results.unlink()
    results_table.append_rows(results, rows[:3])
    driver.run_sweep(exp, "smoke", tmp_path, runner=RUNNER, progress=False)
    assert _table(results) == full
    assert all((Path(r["run_dir"]) / "starts.log").read_text().split() == ["0", "5"] for r in rows)


def test_a_published_table_copied_into_a_fresh_folder_runs_only_the_points_it_lacks(tmp_path):
    # a committed results.csv (no run folders, no sweep.json beside it) finishes from a fresh clone
    exp = experiments.load(FAKE)
    rows = results_table.read_rows(driver.run_sweep(exp, "smoke", tmp_path / "first", runner=RUNNER, progress=False))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    results_table.append_rows(fresh / results_table.RESULTS, rows[:5])
    results = driver.run_sweep(exp, "smoke", fresh, runner=RUNNER, progress=False)
    assert _table(results) == _table(tmp_path / "first" / results_table.RESULTS)
    # only the models of the points the table lacked were trained
    assert {p.name for p in (fresh / "runs").iterdir()} == {Path(r["run_dir"]).name for r in rows[5:]}


def _cli(out: Path) -> list[str]:
    return [
        str(Path(sys.executable).parent / "synthlab"),
        "sweep",
        str(FAKE),
        "--preset",
        "cpu",
        "--runner",
        RUNNER.__name__,
        "--out",
        str(out),
    ]


@pytest.mark.slow  # two sweeps as fresh CLI processes
def test_kill_9_mid_run_then_resume_gives_the_uninterrupted_table(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    proc = subprocess.Popen(_cli(tmp_path / "killed"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = tmp_path / "killed" / results_table.RESULTS
    deadline = time.time() + 60
    # wait until one point is finished and another is part-way through its training
    while time.time() < deadline:
        rows = results_table.read_rows(results)
        partial = [
            c
            for c in (tmp_path / "killed" / "runs").glob("*/ckpt.json")
            if c.parent.name not in {Path(r["run_dir"]).name for r in rows}
        ]
        if rows and partial:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 1 <= len(results_table.read_rows(results)) < 4
    subprocess.run(_cli(tmp_path / "killed"), env=env, check=True, capture_output=True)
    subprocess.run(_cli(tmp_path / "clean"), env=env, check=True, capture_output=True)
    assert _table(results) == _table(tmp_path / "clean" / results_table.RESULTS)
    starts = [(p / "starts.log").read_text().split() for p in (tmp_path / "killed" / "runs").iterdir()]
    assert any(s[0] == "0" and len(s) == 2 and 0 < int(s[1]) < 30 for s in starts)  # resumed mid-way


def test_dry_run_lists_status_and_cost(tmp_path):
    exp = experiments.load(FAKE)
    plan = sweep_plan.plan(exp, "cpu", tmp_path, runner=RUNNER)
    assert [r["status"] for r in plan] == ["todo"] * 4
    assert all(r["cost"] == "estimated" and r["cost_s"] == pytest.approx(30 * 0.04) for r in plan)
    # points that evaluate a model another point trains cost no training
    smoke = sweep_plan.plan(exp, "smoke", tmp_path, runner=RUNNER)
    assert sorted(r["cost"] for r in smoke) == ["estimated"] * 4 + ["shared model"] * 4
    driver.run_sweep(exp, "smoke", tmp_path / "done", runner=RUNNER, progress=False)
    assert {r["status"] for r in sweep_plan.plan(exp, "smoke", tmp_path / "done", runner=RUNNER)} == {"done"}
    result = CliRunner().invoke(
        app, ["sweep", str(FAKE), "--preset", "cpu", "--runner", RUNNER.__name__, "--out", str(tmp_path), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "4 points, 4 to run" in result.output and not (tmp_path / results_table.RESULTS).exists()
    assert f"trained models: in {tmp_path / 'runs'} (0 of 4 already there" in result.output
    # the store the models would be trained into, whatever --out says is done
    result = CliRunner().invoke(
        app,
        [
            "sweep",
            str(FAKE),
            "--preset",
            "smoke",
            "--runner",
            RUNNER.__name__,
            "--out",
            str(tmp_path / "other"),
            "--runs",
            str(tmp_path / "done" / "runs"),
            "--dry-run",
        ],
    )
    assert f"in {tmp_path / 'done' / 'runs'} (4 of 4 already there" in result.output, result.output


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["sweep", "no_such_experiment"], "unknown experiment"),
        (["sweep", str(FAKE), "--preset", "huge", "--runner", RUNNER.__name__], "unknown preset"),
        (["sweep", str(FAKE), "--jobs", "0", "--runner", RUNNER.__name__], "--jobs"),
        (["sweep", str(FAKE), "--runner", "nowhere"], "--runner"),
    ],
)
def test_bad_cli_input_is_one_line_exit_2(tmp_path, args, culprit):
    result = CliRunner().invoke(app, args + ["--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and culprit in result.output and "Traceback" not in result.output


def test_a_sweep_dir_holds_one_experiment_and_preset(tmp_path):
    exp = experiments.load(FAKE)
    driver.run_sweep(exp, "gpu", tmp_path, runner=RUNNER, progress=False)
    with pytest.raises(SynthlabError, match="holds sweep sweep_fake/gpu"):
        driver.run_sweep(exp, "smoke", tmp_path, runner=RUNNER, progress=False)


def test_sweeps_sharing_a_model_store_train_once(tmp_path):
    exp = experiments.load(FAKE)
    store, cache = tmp_path / "store", tmp_path / "cache"
    first = driver.run_sweep(
        exp, "smoke", tmp_path / "a", runner=RUNNER, runs_dir=store, cache_dir=cache, progress=False
    )
    second = driver.run_sweep(
        exp, "smoke", tmp_path / "b", runner=RUNNER, runs_dir=store, cache_dir=cache, progress=False
    )
    assert _table(first) == _table(second)
    logs = [(d / "starts.log").read_text().split() for d in store.iterdir()]
    assert len(logs) == 4 and all(log == ["0", "5"] for log in logs)  # each model trained once, in sweep a


def test_a_rerun_without_runs_and_cache_uses_the_stores_the_sweep_used_before(tmp_path, capsys):
    import csv
    import json

    exp = experiments.load(FAKE)
    store, cache, out = tmp_path / "store", tmp_path / "cache", tmp_path / "sweep"
    results = driver.run_sweep(exp, "smoke", out, runner=RUNNER, runs_dir=store, cache_dir=cache, progress=False)
    assert json.loads((out / "sweep.json").read_text())["stores"] == {
        "cache": str(cache.resolve()),
        "runs": str(store.resolve()),
    }
    rows = results_table.read_rows(results)
    with results.open("w", newline="") as fh:  # the first point's row lost: it runs again
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows[1:])
    capsys.readouterr()
    driver.run_sweep(exp, "smoke", out, runner=RUNNER, progress=False)  # the removed point runs again
    assert f"--runs {store.resolve()}" in capsys.readouterr().err
    assert not (out / "runs").exists() and not (out / "datasets").exists()  # nothing trained again in OUT
    logs = [(d / "starts.log").read_text().split() for d in store.iterdir()]
    assert len(logs) == 4 and all(log == ["0", "5"] for log in logs)
    assert all(r["status"] == "done" for r in sweep_plan.plan(exp, "smoke", out, runner=RUNNER))


@pytest.mark.parametrize(
    "argv0, recorded", [("/venv/bin/synthlab", True), ("/repo/synthlab/__main__.py", True), ("/venv/bin/pytest", False)]
)
def test_the_command_line_is_recorded_from_the_entry_point_and_python_m(monkeypatch, argv0, recorded):
    from synthlab.sweeps.info import _command_line

    monkeypatch.setattr(sys, "argv", [argv0, "sweep", "mano", "--preset", "smoke"])
    assert _command_line() == ("synthlab sweep mano --preset smoke" if recorded else None)
    monkeypatch.setattr(sys, "argv", [argv0, "sweep", "mano", "--only", "size=d64-L2 N23701"])
    assert _command_line() == ("synthlab sweep mano --only 'size=d64-L2 N23701'" if recorded else None)


def test_reevaluate_runs_every_finished_point_again_on_its_model(tmp_path, monkeypatch):
    exp = experiments.load(FAKE)
    out = tmp_path / "sweep"
    results = driver.run_sweep(exp, "smoke", out, runner=RUNNER, progress=False)
    before = {r["point_id"]: r for r in results_table.read_rows(results)}
    original = RUNNER.run_point
    monkeypatch.setattr(
        RUNNER,
        "run_point",
        lambda config, run_dir, *, cache_dir: {  # a changed evaluator
            **original(config, run_dir, cache_dir=cache_dir),
            "new_metric": 1.0,
        },
    )
    driver.run_sweep(exp, "smoke", out, runner=RUNNER, progress=False)  # nothing to do: every point finished
    assert all("new_metric" not in r for r in results_table.read_rows(results))
    driver.run_sweep(exp, "smoke", out, runner=RUNNER, progress=False, reevaluate=True)
    after = {r["point_id"]: r for r in results_table.read_rows(results)}
    assert after.keys() == before.keys() and all(r["new_metric"] == "1.0" for r in after.values())
    assert all(after[p]["accuracy"] == before[p]["accuracy"] for p in before)  # the same models
    logs = [(d / "starts.log").read_text().split() for d in (out / "runs").iterdir()]
    assert all(log[0] == "0" and set(log[1:]) == {"5"} for log in logs)  # trained once: every rerun found step 5


def test_the_first_start_records_when_the_data_began_and_every_rule_then(tmp_path):
    exp = dataclasses.replace(
        experiments.load(FAKE),
        verdicts=rules.parse_rules(
            [
                {
                    "claim": "C0",
                    "says": "b beats a",
                    "metric": "accuracy",
                    "column": "arch",
                    "a": "b",
                    "b": "a",
                    "expect": "above",
                }
            ],
            "test",
        ),
    )
    driver.run_sweep(exp, "gpu", tmp_path, runner=RUNNER, progress=False)
    info = sweep_info.read_info(tmp_path)
    fixed = rules.fingerprint(exp.verdicts[0])
    assert info["rules"] == {fixed: info["data_began"]}
    changed = dataclasses.replace(exp, verdicts=(dataclasses.replace(exp.verdicts[0], threshold=0.1),))
    driver.run_sweep(changed, "gpu", tmp_path, runner=RUNNER, progress=False)  # nothing left to run
    info = sweep_info.read_info(tmp_path)
    assert info["rules"][fixed] == info["data_began"] and len(info["rules"]) == 2  # the start kept


def test_seeds_overrides_the_presets_seeds_in_the_run_and_the_dry_run(tmp_path):
    exp = experiments.with_seeds(experiments.load(FAKE), "gpu", 3)
    assert [p.factors["seed"] for p in exp.points("gpu")] == [0, 1, 2]
    assert exp.points("gpu")[0].point_id == experiments.load(FAKE).points("gpu")[0].point_id  # seed 0 keeps its id
    result = CliRunner().invoke(
        app,
        [
            "sweep",
            str(FAKE),
            "--preset",
            "cpu",
            "--runner",
            RUNNER.__name__,
            "--out",
            str(tmp_path),
            "--dry-run",
            "--seeds",
            "2",
        ],
    )
    assert result.exit_code == 0 and "8 points, 8 to run" in result.output, result.output
    with pytest.raises(SynthlabError, match="unknown preset"):
        experiments.with_seeds(experiments.load(FAKE), "huge", 3)
    driver.run_sweep(exp, "gpu", tmp_path / "run", runner=RUNNER, progress=False)
    assert sweep_info.read_info(tmp_path / "run")["seeds"] == 3


def test_a_shipped_definition_is_recorded_by_name_so_a_copied_sweep_reads_the_reporting_checkouts(
    tmp_path, monkeypatch
):
    import json

    shipped = experiments.load("capacity")
    assert experiments.recorded_path(shipped.source) == "experiments/capacity.toml"
    monkeypatch.chdir(tmp_path)  # reported from elsewhere: the shipped file of the same name
    assert experiments.load_recorded("experiments/capacity.toml").source == shipped.source
    out = tmp_path / "sweep"
    driver.run_sweep(experiments.load(FAKE), "smoke", out, runner=RUNNER, progress=False)
    assert json.loads((out / "sweep.json").read_text())["definition"] == str(FAKE.resolve())  # not shipped: its path
