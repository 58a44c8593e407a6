"""`synthlab eval --max-prompts K`: at most K prompts of each set, every group its even share, the
same K every time; each phase (KV-cache generation included) shows its progress."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.evaluation.groups import stratified

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("limit", [1, 5, 9, 12, 30, 100])
def test_stratified_gives_every_group_its_even_share(limit):
    groups = [1] * 2 + [2] * 10 + [3] * 10 + [None] * 3  # 25 items, one group of two
    kept = stratified(groups, limit, np.random.default_rng(0))
    assert kept == sorted(set(kept)) and len(kept) == min(limit, len(groups))
    counts = Counter(groups[i] for i in kept)
    sizes = Counter(groups)
    full = [g for g in sizes if counts[g] < sizes[g]]  # groups that could have had more
    assert all(counts[g] >= max(counts.values()) - 1 for g in full)  # even shares, remainder one each
    assert all(counts[g] == sizes[g] for g in sizes if g not in full)
    assert kept == stratified(groups, limit, np.random.default_rng(0))  # the same K every time


def test_no_limit_keeps_everything():
    assert stratified(["a", "b", "a"], None, np.random.default_rng(0)) == [0, 1, 2]


@pytest.fixture(scope="module")
def looped_run(mano, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ev") / "run"
    tiny = ["--d-model", 32, "--n-heads", 2, "--n-layers", 1, "--loops", 2, "--max-seq-len", 32, "--batch-size", 8]
    result = invoke("train", "--data", mano, "--out", run_dir, "--steps", 3, *tiny, "--threads", 1, "--no-progress")
    assert result.exit_code == 0, result.output
    return run_dir


def test_a_bounded_eval_scores_k_prompts_and_shows_every_phase(looped_run):
    result = invoke("eval", looped_run, "--max-prompts", 7, "--exit", "static:1", "--kv", "full", "--threads", 1)
    assert result.exit_code == 0, result.output
    for phase in ("test prompts", "training prompts", "exit static:1", "generation, kv full"):
        assert f"eval {phase}: prompt 7/7 (100%)" in result.output, result.output
    written = json.loads((looped_run / "eval" / "steps2_exit-static1_kv-full_max7.json").read_text())
    assert written["n_examples"] == 7 and written["max_prompts"] == 7
    assert sum(s["n"] for s in written["groups"]["train"].values()) == 7
    assert written["kv_accuracy"] == written["accuracy"]  # the full cache decodes as teacher forcing scores

    whole = invoke("eval", looped_run, "--no-progress", "--threads", 1)
    bounded = invoke("eval", looped_run, "--max-prompts", 10_000, "--no-progress", "--threads", 1)
    assert whole.exit_code == 0 and bounded.exit_code == 0 and "eval test prompts" not in whole.output
    full = json.loads((looped_run / "eval" / "steps2.json").read_text())
    roomy = json.loads((looped_run / "eval" / "steps2_max10000.json").read_text())
    assert {k: v for k, v in roomy.items() if k not in ("file", "max_prompts", "outcomes")} == {
        k: v for k, v in full.items() if k not in ("file", "outcomes")
    }  # a bound above every set changes nothing


def test_a_bound_below_one_is_one_error_line(looped_run):
    result = invoke("eval", looped_run, "--max-prompts", 0)
    assert result.exit_code == 2 and result.output.startswith("error: --max-prompts must be >= 1"), result.output


def test_an_experiments_eval_section_bounds_the_prompts_as_the_flag_does(looped_run):
    from synthlab.errors import SynthlabError
    from synthlab.sweeps import lab_runner
    from synthlab.training.configs import EvalOptions

    class Point:  # the two fields the eval stage reads
        eval = EvalOptions(max_prompts=7)

    work = lab_runner.Work(Point(), looped_run.parent, looped_run.parent, 0, looped_run.parent, looped_run)
    row = lab_runner.STAGES["eval"].run(work)
    written = json.loads((looped_run / "eval" / "steps2_max7.json").read_text())
    assert written["n_examples"] == 7 and row["accuracy"] == written["accuracy"]
    with pytest.raises(SynthlabError, match="eval.max_prompts must be >= 1"):
        EvalOptions(max_prompts=0)
