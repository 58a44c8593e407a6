"""End to end with the real runner (generate -> train -> evaluate) on a tiny Mano grid."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synthlab.sweeps import driver, experiments, runner_protocol, schema
from synthlab.sweeps import lab_runner as point_runner
from synthlab.sweeps import plan as sweep_plan
from synthlab.sweeps.results_table import RESULTS, factor_column, read_rows, step_rows

FIXTURE = Path(__file__).parent / "fixtures" / "mano_tiny.toml"
# Columns that measure time, or say where things are, legitimately differ between two runs.
VOLATILE = {"wall_s", "train_s", "run_dir"}


def _table(results: Path) -> list[tuple]:
    return sorted(tuple(sorted((k, v) for k, v in r.items() if k not in VOLATILE)) for r in read_rows(results))


def _cli(out: Path, preset: str) -> list[str]:
    return [str(Path(sys.executable).parent / "synthlab"), "sweep", str(FIXTURE), "--preset", preset, "--out", str(out)]


def test_smoke_sweep_end_to_end(tmp_path):
    results = driver.run_sweep(experiments.load(FIXTURE), "smoke", tmp_path, runner=point_runner, progress=False)
    rows = {r["model"]: r for r in read_rows(results)}
    assert set(rows) == {"1x1", "1x2"}
    factors = {factor_column(axis) for point in experiments.load(FIXTURE).points("smoke") for axis in point.factors}
    for row in rows.values():
        assert 0.0 <= float(row["accuracy"]) <= 1.0 and int(row["train_steps"]) == 12
        assert float(row["acc_step_" + row["loops"]]) == float(row["accuracy"])
        assert Path(row["run_dir"], "model", "checkpoint.pt").is_file()
        # every column is a grid factor or named in the schema
        assert [c for c in row if schema.family(c) is None and c not in factors] == []
    # a looped block is counted once; its FLOPs per step (the `last` loss reads out the last step only)
    assert rows["1x1"]["params"] == rows["1x2"]["params"]
    assert 1.5 < float(rows["1x2"]["train_flops"]) / float(rows["1x1"]["train_flops"]) < 2
    assert rows["1x1"]["acc_step_2"] == ""  # a 1-step model has no step-2 column value
    # one dataset, generated once for both points
    assert len([p for p in (tmp_path / "datasets").iterdir() if not p.name.startswith(".")]) == 1
    before = _table(results)
    driver.run_sweep(experiments.load(FIXTURE), "smoke", tmp_path, runner=point_runner, progress=False)
    assert _table(results) == before
    # the step-wise export: one row per recurrent step, the last step's loss is the run's loss
    steps = step_rows(tmp_path)
    assert sorted((r["model"], r["step"]) for r in steps) == [("1x1", 1), ("1x2", 1), ("1x2", 2)]
    last = next(r for r in steps if r["model"] == "1x2" and r["step"] == 2)
    assert last["loss"] == pytest.approx(float(rows["1x2"]["loss"]))
    from typer.testing import CliRunner

    from synthlab.cli import app

    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(app, ["steps", str(tmp_path), "--out", str(blocker / "steps.csv")])
    assert result.exit_code == 2 and result.output.startswith("error: cannot write --out")
    assert CliRunner().invoke(app, ["steps", str(tmp_path)]).exit_code == 0 and (tmp_path / "steps.csv").is_file()


@pytest.mark.slow  # three sweeps in fresh interpreters (torch start-up each); the fast suite
# covers kill -9 with the cheap runner in test_sweep.py
def test_killed_real_sweep_resumes_from_checkpoints_to_the_same_table(tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cli(killed, "cpu"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list(killed.glob("runs/*/model/checkpoint.pt")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    checkpoints = list(killed.glob("runs/*/model/checkpoint.pt"))
    assert checkpoints and not list(killed.glob("runs/*/model/summary.json"))  # killed mid-training
    subprocess.run(_cli(killed, "cpu"), check=True, capture_output=True)
    subprocess.run(_cli(tmp_path / "clean", "cpu"), check=True, capture_output=True)
    table = _table(killed / RESULTS)
    assert len(table) == 2 and table == _table(tmp_path / "clean" / RESULTS)


@pytest.mark.parametrize("name", ["capacity", "mano", "multihop", "reach"])
def test_cost_estimate_shapes_match_the_generated_data(name, tmp_path):
    # the dry run computes vocabulary, row length and steps before any data exists; check them on real data
    from synthlab.data.datasets import load_dataset
    from synthlab.sweeps.cost import positions
    from synthlab.training.run_folders import RunConfig
    from synthlab.training.trainer import prepare_run

    point = point_runner.parse(experiments.load(name).points("smoke")[0].config)
    data_dir = point_runner.dataset(point, tmp_path)
    data = load_dataset(data_dir, point.task)
    derived, _ = prepare_run(RunConfig(point.model, point.train), data)
    assert point.model.vocab_size == len(data.tokenizer)
    steps, seq = positions(point)
    assert seq == derived["seq_len"]
    assert steps == pytest.approx(derived["total_steps"], rel=0 if point.train.schedule.steps else 0.1)


def test_eval_results_flatten_to_columns():
    from synthlab.sweeps.results_table import eval_metrics
    from synthlab.training.configs import EvalOptions

    result = {
        "accuracy": 0.5,
        "accuracy_at_trained_depth": 0.4,
        "answer_loss_per_step": [2.0, 1.0],
        "eval_steps": 2,
        "accuracy_per_step": [0.4, 0.5],
        "agreement": [[1.0, 0.7], [0.7, 1.0]],
        "exit_accuracy": 0.45,
        "mean_exit_step": 1.5,
    }
    plain = eval_metrics(result, EvalOptions())
    assert plain["acc_step_2"] == plain["accuracy"] == 0.5 and "agree_1_2" not in plain
    exits = eval_metrics(result, EvalOptions(exit="q:0.8", agreement=True))
    assert (exits["strategy"], exits["threshold"], exits["accuracy"]) == ("q", 0.8, 0.45)
    assert exits["agree_1_2"] == exits["agree_2_1"] == 0.7


def _validate(experiment, preset):
    return runner_protocol.parse_points(point_runner, experiment, preset, experiment.points(preset))


def test_definitions_are_checked_against_the_real_config_classes():
    import tomllib

    from synthlab.errors import SynthlabError

    raw = tomllib.loads(FIXTURE.read_text())
    raw["base"]["model"]["d_modle"] = 32
    with pytest.raises(SynthlabError, match="did you mean 'd_model'"):
        _validate(experiments.parse(raw), "smoke")
    raw = tomllib.loads(FIXTURE.read_text())
    raw["presets"]["smoke"]["grid"]["data.L"] = [0]
    with pytest.raises(SynthlabError, match="--L"):
        _validate(experiments.parse(raw), "smoke")


def test_dry_run_of_a_shipped_experiment_estimates_every_point(tmp_path):
    from typer.testing import CliRunner

    from synthlab.cli import app

    result = CliRunner().invoke(app, ["sweep", "capacity", "--preset", "gpu", "--dry-run", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    n = len(experiments.load("capacity").points("gpu"))
    assert f"{n} points, {n} to run" in result.output and "(estimated)" in result.output and "?" not in result.output
    assert "gpu cost on one H200" in result.output and "peak_gib" in result.output
    assert not (tmp_path / "results.csv").exists()


def _gate_experiment(raw: dict) -> dict:
    """The tiny Mano fixture as an exit experiment: stage I (`ouro`), then stage II (`gate`)."""
    raw["stages"] = ["train", "gate", "eval"]
    raw["base"]["model"].update(exit_gate=True, n_layers=1, loops=2)
    raw["base"]["train"]["loss"] = "ouro"
    raw["base"]["gate"] = {"steps": 4, "warmup_steps": 1}
    raw["presets"]["smoke"]["grid"] = {"eval.exit": ["q:0.5", "static:1"]}
    return raw


def test_gate_stage_trains_the_exit_gate_alone_and_evaluates_that_model(tmp_path):
    import tomllib
    import torch

    results = driver.run_sweep(
        experiments.parse(_gate_experiment(tomllib.loads(FIXTURE.read_text()))),
        "smoke",
        tmp_path,
        runner=point_runner,
        progress=False,
    )
    rows = read_rows(results)
    assert len(rows) == 2 and all(int(r["gate_steps"]) == 4 for r in rows)
    run_dirs = {Path(r["run_dir"]) for r in rows}
    assert len(run_dirs) == 1  # both exit rules evaluate one stage I model and one stage II gate
    (run_dir,) = run_dirs
    (gate_dir,) = run_dir.glob("gate-*")
    stage1 = torch.load(run_dir / "model" / "checkpoint.pt", weights_only=True)["model"]
    stage2 = torch.load(gate_dir / "checkpoint.pt", weights_only=True)["model"]
    changed = {k for k in stage1 if not torch.equal(stage1[k], stage2[k])}
    assert changed and all(k.startswith("exit_gate.") for k in changed)  # the LM is frozen


def test_gate_section_needs_the_gate_stage_and_a_stage_one_model():
    import tomllib

    from synthlab.errors import SynthlabError

    raw = _gate_experiment(tomllib.loads(FIXTURE.read_text()))
    raw["stages"] = ["train", "eval"]
    with pytest.raises(SynthlabError, match="needs the 'gate' stage"):
        experiments.parse(raw)
    raw = _gate_experiment(tomllib.loads(FIXTURE.read_text()))
    raw["base"]["train"]["loss"] = "last"
    with pytest.raises(SynthlabError, match="stage I model"):
        _validate(experiments.parse(raw), "smoke")
    # definitions without a gate section resolve without one: the ids of their points never moved
    plain = experiments.parse(tomllib.loads(FIXTURE.read_text()))
    assert all("gate" not in p.config for p in plain.points("smoke"))


def test_each_point_config_is_parsed_once_per_sweep(tmp_path, monkeypatch):
    calls = []
    original = point_runner.parse_point
    monkeypatch.setattr(point_runner, "parse_point", lambda config: calls.append(1) or original(config))
    experiment = experiments.load(FIXTURE)
    driver.run_sweep(experiment, "smoke", tmp_path, runner=point_runner, progress=False)
    assert len(calls) == len(experiment.points("smoke"))


def test_a_finished_point_whose_config_changed_is_flagged_and_its_row_kept(tmp_path, monkeypatch, capsys):
    import dataclasses

    exp = experiments.load(FIXTURE)
    results = driver.run_sweep(exp, "smoke", tmp_path, runner=point_runner, progress=False)
    before = _table(results)
    assert {r["status"] for r in sweep_plan.plan(exp, "smoke", tmp_path, runner=point_runner)} == {"done"}
    parse = point_runner.parse

    def parse_under_a_new_default(config):  # as if TrainConfig's default warmup had changed since
        point = parse(config)
        return dataclasses.replace(
            point, train=point.train.replaced(warmup_steps=point.train.schedule.warmup_steps + 1)
        )

    monkeypatch.setattr(point_runner, "parse", parse_under_a_new_default)
    assert {r["status"] for r in sweep_plan.plan(exp, "smoke", tmp_path, runner=point_runner)} == {
        "done, config changed"
    }
    capsys.readouterr()
    driver.run_sweep(exp, "smoke", tmp_path, runner=point_runner, progress=False)
    err = capsys.readouterr().err
    assert err.count("its row is kept, but") == 2 and "train.schedule.warmup_steps" in err
    assert _table(results) == before
