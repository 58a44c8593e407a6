"""One preregistration policy (`synthlab.claims.prereg`, `synthlab prereg check`): a verdict is
confirmatory only if its rule and preset were committed before the first run started, as the
sweep recorded it; checked on a throwaway git repository with a fake results folder."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
from test_verdicts import FAKE
from typer.testing import CliRunner

from synthlab.claims import prereg, rules
from synthlab.cli import app

RULE = '\n[[verdicts]]\nclaim = "C0"\nsays = "b beats a"\nmetric = "accuracy"\ncolumn = "arch"\na = "b"\nb = "a"\nexpect = "above"\n'


def _commit(repo: Path, date: str, message: str) -> str:
    env = {**os.environ, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date}
    git = ["git", "-C", str(repo), "-c", "user.name=lab", "-c", "user.email=lab@example.org"]
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, "commit", "-qm", message], check=True, env=env)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, env=env, capture_output=True, text=True).stdout


def _repo(tmp_path: Path, data_began: str | None) -> tuple[Path, Path]:
    """A repository whose definition (the fake experiment with one rule) was committed on
    2026-01-01 and a results folder of its smoke preset whose sweep began at `data_began`."""
    repo = tmp_path / "repo"
    (repo / "experiments").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    definition = repo / "experiments" / "fake.toml"
    definition.write_text(FAKE.read_text().replace('name = "sweep_fake"', 'name = "fake"') + RULE)
    _commit(repo, "2026-01-01T10:00:00+00:00", "definition and rule")
    results = repo / "results" / "fake"
    results.mkdir(parents=True)
    info = {"experiment": "fake", "preset": "smoke", "definition": str(definition)}
    (results / "sweep.json").write_text(json.dumps({**info, **({"data_began": data_began} if data_began else {})}))
    pd.DataFrame({"point_id": ["p0"], "accuracy": [0.5], "wall_s": [3600.0]}).to_csv(results / "results.csv")
    return repo, results


def test_a_rule_committed_before_the_recorded_start_is_confirmatory_and_one_after_it_exploratory(tmp_path):
    repo, results = _repo(tmp_path, "2026-01-02T10:00:00+00:00")
    _commit(repo, "2026-01-03T10:00:00+00:00", "results")
    (status,) = prereg.check(results)
    assert status.confirmatory and status.start_recorded and status.why == ""
    assert status.rule_commit.date.startswith("2026-01-01") and status.preset_commit.date.startswith("2026-01-01")
    assert status.summary().startswith("confirmatory: first run 2026-01-02 10:00; rule ")
    # the rule rewritten after the data (a threshold): its new text was first committed after the start
    definition = repo / "experiments" / "fake.toml"
    definition.write_text(definition.read_text().replace('expect = "above"', 'expect = "above"\nthreshold = 0.1'))
    _commit(repo, "2026-01-04T10:00:00+00:00", "threshold")
    (status,) = prereg.check(results)
    assert not status.confirmatory and status.rule_commit.date.startswith("2026-01-04")
    assert "rule committed" in status.why and "after the first run started" in status.why
    assert "-04 10:00, later; preset " in status.summary()
    # a preset changed after the start makes it exploratory too, the rule's own commit aside
    definition.write_text(definition.read_text().replace('"data.size" = [10, 20]', '"data.size" = [10, 30]', 1))
    _commit(repo, "2026-01-05T10:00:00+00:00", "preset")
    assert "preset committed" in prereg.check(results)[0].why
    info = json.loads((results / "sweep.json").read_text())
    (results / "sweep.json").write_text(json.dumps({**info, "seeds": 5}))  # `synthlab sweep --seeds 5`
    assert (
        prereg.check(results)[0]
        .summary()
        .endswith("; seeds 5 given by `synthlab sweep --seeds`, not in the committed preset")
    )
    uncommitted = definition.read_text().replace("threshold = 0.1", "threshold = 0.2")
    definition.write_text(uncommitted)
    assert "rule not committed" in prereg.check(results)[0].why


def test_an_unrecorded_start_is_a_bound_from_git_and_never_confirmatory(tmp_path):
    repo, results = _repo(tmp_path, None)
    _commit(repo, "2026-01-03T10:00:00+00:00", "results")  # its one run took an hour
    (status,) = prereg.check(results)
    assert not status.start_recorded and status.start.startswith("2026-01-03T09:00")
    assert not status.confirmatory and status.why == "the first run's start was not recorded"
    # an earlier committed sweep.json that the sweep wrote itself keeps the start it recorded
    info = json.loads((results / "sweep.json").read_text())
    (results / "sweep.json").write_text(json.dumps({**info, "data_began": "2026-01-02T08:00:00+00:00"}))
    _commit(repo, "2026-01-06T10:00:00+00:00", "recorded")
    (results / "sweep.json").write_text(
        json.dumps({**info, "data_began": "2026-01-03T10:00:00+00:00", "rules_from": "git history"})
    )
    _commit(repo, "2026-01-07T10:00:00+00:00", "dated from git")
    (status,) = prereg.check(results)
    assert status.start_recorded and status.start == "2026-01-02T08:00:00+00:00" and status.confirmatory


def test_the_command_prints_each_rule_and_refuses_a_folder_without_sweep_json(tmp_path):
    repo, results = _repo(tmp_path, "2026-01-02T10:00:00+00:00")
    out = CliRunner().invoke(app, ["prereg", "check", str(results)])
    assert out.exit_code == 0, out.output
    fingerprint = rules.fingerprint(prereg.check(results)[0].rule)
    assert f"C0 {fingerprint} confirmatory: first run 2026-01-02 10:00; rule " in out.output
    assert "first run: recorded by the sweep when its first point started" in out.output
    bad = CliRunner().invoke(app, ["prereg", "check", str(tmp_path)])
    assert bad.exit_code == 2 and "error: " in bad.output and "no sweep.json" in bad.output
