"""A finished run trained on: `synthlab train --resume RUN --steps N` keeps its trained steps and
their rates, runs the steps past its schedule at the rate of its last step, and says so in config.json."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from synthlab.cli import app

runner = CliRunner()
TINY = ["--d-model", 32, "--n-heads", 2, "--n-layers", 1, "--max-seq-len", 32, "--batch-size", 8, "--threads", 1]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def curve(run_dir) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def finished(mano, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ext") / "run"
    args = ["--data", mano, "--out", run_dir, "--steps", 6, "--warmup-steps", 2, "--log-every", 1, *TINY]
    result = invoke("train", *args, "--checkpoint-every", 3, "--no-progress")
    assert result.exit_code == 0, result.output
    return run_dir


def test_a_finished_run_extends_at_its_last_rate(finished, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = curve(run_dir)
    result = invoke("train", "--resume", run_dir, "--steps", 10, "--no-progress")
    assert result.exit_code == 0 and "done: 10 steps" in result.output, result.output
    after = curve(run_dir)
    assert after[:6] == before and [r["step"] for r in after] == list(range(1, 11))
    assert {r["lr"] for r in after[6:]} == {before[-1]["lr"]} and before[-1]["lr"] < before[2]["lr"]
    derived = json.loads((run_dir / "config.json").read_text())["derived"]
    assert derived["total_steps"] == 10
    assert derived["extension"] == {"schedule_steps": 6, "after": "constant", "lr": before[-1]["lr"]}
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 10

    again = invoke("train", "--resume", run_dir, "--no-progress")  # finished at its new length: nothing to do
    assert again.exit_code == 0 and "done: 10 steps" in again.output, again.output
    assert curve(run_dir) == after


def test_an_interrupted_extension_resumes_to_the_same_numbers(finished, tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    shutil.copytree(finished, whole)
    shutil.copytree(finished, cut)
    assert invoke("train", "--resume", whole, "--steps", 9, "--checkpoint-every", 3).exit_code == 2  # one option
    assert invoke("train", "--resume", whole, "--steps", 9, "--no-progress").exit_code == 0
    assert invoke("train", "--resume", cut, "--steps", 9, "--no-progress").exit_code == 0
    for name in ("summary.json", "model.safetensors", "checkpoint-9.pt", "checkpoint-9.pt.sha256"):
        (cut / name).unlink()  # as if stopped between steps 6 and 9 of the extension
    result = invoke("train", "--resume", cut, "--no-progress")  # its recorded length: 9
    assert result.exit_code == 0 and "done: 9 steps" in result.output, result.output
    assert curve(cut) == curve(whole)


@pytest.mark.parametrize(
    "make, args, message",
    [
        (None, ["--steps", 4], "already 6 steps long"),
        (None, ["--lr", "1e-3"], "--steps N extends it"),
        ("points", ["--steps", 8], "holds a sweep's points"),
    ],
)
def test_extensions_that_would_mislead_are_one_error_line(finished, tmp_path, make, args, message):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    if make:
        (run_dir / make).mkdir()
    result = invoke("train", "--resume", run_dir, *args, "--no-progress")
    assert result.exit_code == 2 and result.output.startswith("error:") and message in result.output, result.output
    assert (run_dir / "summary.json").is_file()  # the run is left as it was


def test_resume_auto_speaks_of_the_run_not_a_sweep(finished, tmp_path, mano):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    args = ["--data", mano, "--out", run_dir, "--steps", 7, "--warmup-steps", 2, "--log-every", 1, *TINY]
    result = invoke("train", "--resume", "auto", *args, "--checkpoint-every", 3, "--no-progress")
    assert result.exit_code == 2 and "train.schedule.steps 6 -> 7" in result.output, result.output
    assert "sweep" not in result.output and "point" not in result.output and "--resume RUN_DIR alone" in result.output
