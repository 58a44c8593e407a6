"""Ctrl-C on a sweep: one line saying how many points finished and the command that resumes it,
exit code 130; that command finishes the table."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.sweeps import driver as sweep
from synthlab.sweeps import results_table as results

TESTS = Path(__file__).parent
FAKE = TESTS / "fixtures" / "sweep_fake.toml"
sys.path.insert(0, str(TESTS))  # the cheap runner beside the tests

runner = CliRunner()


def test_an_interrupted_sweep_says_what_finished_and_how_to_resume(tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    real = sweep.execute

    def one_model_then_ctrl_c(units, on_done, **options):
        real(units[:1], on_done, **options)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "execute", one_model_then_ctrl_c)
    stopped = runner.invoke(app, ["sweep", str(FAKE), "--runner", "sweep_fake_runner", "--out", str(out)])
    assert stopped.exit_code == 130, stopped.output
    lines = [line for line in stopped.output.splitlines() if line.startswith("interrupted:")]
    assert len(lines) == 1 and "Traceback" not in stopped.output, stopped.output
    assert lines[0].startswith(f"interrupted: 2 of 8 points finished (their rows are in {out / 'results.csv'})")
    assert len(results.read_rows(out / "results.csv")) == 2

    monkeypatch.setattr(sweep, "execute", real)
    command = shlex.split(lines[0].split("resume with: ", 1)[1])
    assert command[:2] == ["synthlab", "sweep"]
    resumed = runner.invoke(app, command[1:])
    assert resumed.exit_code == 0, resumed.output
    assert len(results.read_rows(out / "results.csv")) == 8
