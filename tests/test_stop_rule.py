"""`train.stop_when`: a run ends, finished, at the first probe that meets its condition (steps or
exposures the upper bound, the schedule the budget's) and stays finished when resumed; a bad
condition is one error line before anything is written."""

from __future__ import annotations

import json
import shutil

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
    assert result.exit_code == 0 and f"done: 4 steps (train.stop_when met: {EASY})" in result.output, result.output
    again = invoke("train", "--resume", "auto", "--data", mano, "--out", run_dir, *BUDGET, *TINY, "--stop-when", EASY)
    assert again.exit_code == 0 and "done: 4 steps" in again.output, again.output
    longer = invoke("train", "--resume", run_dir, "--steps", 30, "--no-progress")
    assert longer.exit_code == 2 and longer.output.count("\n") == 1, longer.output
    assert longer.output.startswith("error:") and "its train.stop_when met: it is finished" in longer.output
    assert files(run_dir) == before  # nothing trained, nothing rewritten


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stop-when", NEVER], "set train.eval_every"),  # nothing would check it
        (["--eval-every", 4, "--stop-when", "train_acc_l1 => 0.9"], "is not 'column >= number'"),
        (["--eval-every", 4, "--stop-when", "train_acc_l1 >= 0.9 or acc_l2 > 0"], "is not 'column >= number'"),
        (["--eval-every", 4, "--stop-when", "train_acc_l1 >= 1.2.3"], "is not 'column >= number'"),
        (["--eval-every", 4, "--stop-when", "accuracy >= 0.9"], "accuracy is no column of the probe"),
        (["--eval-every", 4, "--stop-when", "train_acc_l9 >= 0.9"], "the probe logs no train_acc_l9"),  # L = 2
    ],
)
def test_a_bad_condition_is_one_error_line_before_anything_is_written(mano, tmp_path, args, message):
    result = invoke("train", "--data", mano, "--out", tmp_path / "run", "--steps", 8, *TINY, *args)
    assert result.exit_code == 2 and result.output.startswith("error: train.stop_when"), result.output
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
