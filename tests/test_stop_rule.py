"""`train.stop_when`: a run ends, finished, at the first probe that meets its condition (steps or
exposures the upper bound, the schedule the budget's), stays finished when resumed, and its sweep row
says where it stopped; a bad condition is one error line before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_run_extension import TINY, curve, invoke

from synthlab.conditions import holds, parse
from synthlab.errors import SynthlabError

BUDGET = ["--steps", 20, "--warmup-steps", 2, "--log-every", 1, "--eval-every", 4, "--checkpoint-every", 8]
EASY, NEVER = "eval/train_acc_l1 >= 0.0", "train_acc_l1 > 1"  # an accuracy is never above 1


def files(run_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def runs(mano, tmp_path_factory):
    """The same budget trained twice: a condition met at the first probe, and one never met."""
    root = tmp_path_factory.mktemp("stop")
    for name, condition in (("easy", EASY), ("never", NEVER)):
        result = invoke("train", "--data", mano, "--out", root / name, *BUDGET, *TINY, "--stop-when", condition)
        assert result.exit_code == 0, result.output
    return root


def test_a_met_condition_ends_the_run_finished_at_its_first_probe(runs):
    run_dir = runs / "easy"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 4 and summary["stopped_at_step"] == 4 and summary["stopped_by"] == EASY
    derived = json.loads((run_dir / "config.json").read_text())["derived"]
    assert derived["total_steps"] == 4 and derived["stop"] == {"by": EASY, "at_step": 4, "budget_steps": 20}
    assert (run_dir / "model.safetensors").is_file() and (run_dir / "checkpoint-4.pt").is_file()
    # the steps it trained are the budget run's: same losses, same learning rates (the schedule is
    # laid out over the 20-step budget, not rescaled to the 4 steps trained)
    assert curve(run_dir) == curve(runs / "never")[:4]
    assert [r["step"] for r in curve(run_dir)] == [1, 2, 3, 4]


def test_a_condition_never_met_runs_to_the_budget(runs):
    summary = json.loads((runs / "never" / "summary.json").read_text())
    assert summary["step"] == 20 and "stopped_by" not in summary and "stopped_at_step" not in summary
    derived = json.loads((runs / "never" / "config.json").read_text())["derived"]
    assert derived["total_steps"] == 20 and "stop" not in derived
    assert [r["step"] for r in curve(runs / "never") if "eval/train_acc_l1" in r] == [4, 8, 12, 16, 20]


def test_a_run_its_condition_ended_stays_finished(runs, mano, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs / "easy", run_dir)
    before = files(run_dir)
    result = invoke("train", "--resume", run_dir, "--no-progress")
    assert result.exit_code == 0 and f"done: 4 steps (train.schedule.stop_when met: {EASY})" in result.output, (
        result.output
    )
    again = invoke("train", "--resume", "auto", "--data", mano, "--out", run_dir, *BUDGET, *TINY, "--stop-when", EASY)
    assert again.exit_code == 0 and "done: 4 steps" in again.output, again.output
    longer = invoke("train", "--resume", run_dir, "--steps", 30, "--no-progress")
    assert longer.exit_code == 2 and longer.output.count("\n") == 1, longer.output
    assert longer.output.startswith("error:") and "its train.schedule.stop_when met: it is finished" in longer.output
    assert files(run_dir) == before  # nothing trained, nothing rewritten


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stop-when", NEVER], "set it (--eval-every K)"),  # nothing would check it
        (["--eval-every", 4, "--stop-when", "train_acc_l1 => 0.9"], "is not 'column >= number'"),
        (["--eval-every", 4, "--stop-when", "train_acc_l1 >= 0.9 or acc_l2 > 0"], "is not 'column >= number'"),
        (["--eval-every", 4, "--stop-when", "train_acc_l1 >= 1.2.3"], "is not 'column >= number'"),
        (["--eval-every", 4, "--stop-when", "accuracy >= 0.9"], "accuracy is no column of the probe"),
        (["--eval-every", 4, "--stop-when", "train_acc_l9 >= 0.9"], "the probe logs no train_acc_l9"),  # L = 2
    ],
)
def test_a_bad_condition_is_one_error_line_before_anything_is_written(mano, tmp_path, args, message):
    result = invoke("train", "--data", mano, "--out", tmp_path / "run", "--steps", 8, *TINY, *args)
    assert result.exit_code == 2 and result.output.startswith("error: train.schedule.stop_when"), result.output
    assert message in result.output and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "run").exists()


def test_one_grammar_with_the_verdicts_requires():
    assert parse("train_acc_l1 >= 0.99 and eval/acc_l2 < 5e-1", "w", prefix="eval/") == [
        ("train_acc_l1", ">=", 0.99),
        ("acc_l2", "<", 0.5),
    ]
    conditions = parse("a >= 0.5 and b < 1", "w")
    assert holds(conditions, {"a": 0.5, "b": 0.9}) and not holds(conditions, {"a": 0.5, "b": 1.0})
    assert not holds(conditions, {"a": 0.7}) and not holds(conditions, {"a": float("nan"), "b": 0})  # missing, NaN
    with pytest.raises(SynthlabError, match="^w: 'a = 1' is not"):
        parse("a = 1", "w")


def test_stage_two_trains_its_gate_without_the_stage_one_rule():
    """Stage I's rule holds of the frozen LM at once: stage II would stop at its first probe."""
    from synthlab.training.configs import parse_point

    model = {"d_model": 16, "n_heads": 2, "max_seq_len": 16, "exit_gate": True}
    train = {"steps": 8, "loss": "ouro", "eval_every": 4, "stop_when": "train_acc_l1 >= 0.5"}
    point = parse_point({"task": "mano", "data": {"L": 2}, "model": model, "train": train, "stages": ["gate"]})
    assert point.train.schedule.stop_when and point.stage2_train(point.train, "stage1").schedule.stop_when == ""


EXPERIMENT = """
name = "stop_tiny"
claim = "C2"
title = "Stop rule"
task = "mano"
plot = "mano"
stages = ["train"]

[base.data]
L = 2
mod = 5
n_train = 200
n_test = 20

[base.model]
d_model = 16
n_heads = 2
max_seq_len = 16

[base.train]
steps = 12
batch_size = 16
warmup_steps = 2
log_every = 4
eval_every = 4

[presets.smoke.grid]
rule = [
  { label = "none" },
  { label = "easy", "train.stop_when" = "train_acc_l1 >= 0" },
  { label = "never", "train.stop_when" = "train_acc_l1 > 1" },
]
"""


def test_the_sweep_row_says_where_its_run_stopped(tmp_path):
    from synthlab.claims.per_seed import unmet_requirements
    from synthlab.claims.rules import Rule
    from synthlab.sweeps import driver, experiments
    from synthlab.sweeps import lab_runner as point_runner
    from synthlab.sweeps.results_table import read_results, read_rows

    definition = tmp_path / "stop_tiny.toml"
    definition.write_text(EXPERIMENT)
    experiment = experiments.load(definition)
    assert "stop_when" not in experiment.points("smoke")[0].config["train"]  # a default is not in an id
    results = driver.run_sweep(experiment, "smoke", tmp_path / "sweep", runner=point_runner, progress=False)
    rows = {r["rule"]: r for r in read_rows(results)}
    assert {k: (rows[k]["train_steps"], rows[k]["stopped_at_step"]) for k in rows} == {
        "none": ("12", ""),
        "easy": ("4", "4"),
        "never": ("12", ""),
    }
    # the FLOPs count the steps trained: a third of the budget
    assert float(rows["easy"]["train_flops"]) == pytest.approx(float(rows["none"]["train_flops"]) / 3)
    # a verdict that compares arms only where both met their criterion says which did not
    rule = Rule(
        "C2", "easy vs never", "train_loss", "below", "rule", "easy", "never", requires=("stopped_at_step >= 1",)
    )
    assert unmet_requirements(rule, read_results(tmp_path / "sweep")) == (
        "requires stopped_at_step >= 1: 1 of 2 compared rows fail, 1 of them blank"
    )
    # the rows measured again reuse the finished models, the stopped one as it stopped
    results.unlink()
    for row in rows.values():
        shutil.rmtree(Path(row["run_dir"]) / "points")  # each point's stored row: measured again
    driver.run_sweep(experiments.load(definition), "smoke", tmp_path / "sweep", runner=point_runner, progress=False)
    again = {r["rule"]: r for r in read_rows(results)}
    assert {r["model_reused"] for r in again.values()} == {"1"}
    assert [(again[k]["train_steps"], again[k]["stopped_at_step"]) for k in rows] == [
        (rows[k]["train_steps"], rows[k]["stopped_at_step"]) for k in rows
    ]
