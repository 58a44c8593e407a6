"""The scaling experiment end to end on its smoke preset: one run per (N, T), held-out loss read at
kept checkpoints as the D axis, the step-wise table from the held-out per-step losses."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from synthlab import experiments, stages, sweep
from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.heldout import heldout_loss
from synthlab.results import step_rows


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    sweep.run_sweep(experiments.load("scaling"), "smoke", out, runner=stages, progress=False)
    return out, pd.read_csv(out / "results.csv")


def test_one_run_per_size_and_depth_read_at_each_checkpoint(smoke):
    out, table = smoke
    assert len(table) == 2 * 2 * 2 and table["run_dir"].nunique() == 4  # checkpoints share their run
    for _, run in table.groupby("run_dir"):
        run = run.sort_values("eval_checkpoint")
        assert list(run["eval_checkpoint"]) == [10, 20]
        # D grows with the checkpoint: tokens seen when it was written, the final one the run's total
        assert 0 < run["eval_tokens"].iloc[0] < run["eval_tokens"].iloc[1] == run["tokens"].iloc[1]
        assert run["eval_loss"].nunique() == 2  # two different models scored
    steps = [c for c in table if c.startswith("eval_loss_step_")]
    assert set(steps) == {"eval_loss_step_1", "eval_loss_step_2"}
    one_loop = table[table["loops"] == 1]
    assert one_loop["eval_loss_step_2"].isna().all() and (one_loop["eval_loss"] == one_loop["eval_loss_step_1"]).all()
    assert (table["eval_loss"] == table[steps].ffill(axis=1).iloc[:, -1]).all()  # the last step's loss


def test_the_heldout_loss_is_the_final_model_at_the_last_checkpoint_and_is_deterministic(smoke):
    out, table = smoke
    row = table[(table["loops"] == 2) & (table["eval_checkpoint"] == 20)].iloc[0]
    model_dir = out / "runs" / row["run_dir"].split("/")[-1] / "model"
    data_dir = next(p for p in (out / "datasets").iterdir() if p.is_dir())
    final = heldout_loss(model_dir, data_dir, rows=4)
    at_20 = heldout_loss(model_dir, data_dir, rows=4, checkpoint=20)
    assert final["loss_per_step"] == pytest.approx(at_20["loss_per_step"], rel=1e-5)
    assert heldout_loss(model_dir, data_dir, rows=4, checkpoint=10) == heldout_loss(model_dir, data_dir, rows=4,
                                                                                     checkpoint=10)
    with pytest.raises(SynthlabError, match="no checkpoint of step 15"):
        heldout_loss(model_dir, data_dir, rows=4, checkpoint=15)


def test_the_step_table_reads_the_heldout_losses(smoke):
    out, table = smoke
    rows = pd.DataFrame(step_rows(out))
    assert len(rows) == int(table["loops"].sum())
    two = rows[rows["loops"].astype(int) == 2]
    assert set(two["step"]) == {1, 2} and (two["tokens"].astype(int).isin(table["eval_tokens"])).all()
    result = CliRunner().invoke(app, ["steps", str(out), "--out", str(out / "steps.csv")])
    assert result.exit_code == 0, result.output
    # each step's held-out loss, in the column `synthlab fit` reads by default (not the last step's repeated)
    assert (rows["eval_loss"] == rows["loss"]).all()
    for _, row in table[table["loops"] == 2].iterrows():
        mine = two[two["point_id"] == row["point_id"]].sort_values("step")
        assert mine["eval_loss"].tolist() == pytest.approx([row["eval_loss_step_1"], row["eval_loss_step_2"]])
