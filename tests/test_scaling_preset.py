"""The scaling experiment end to end on its smoke preset: one run per (N, T), held-out loss read at
kept checkpoints as the D axis, the step-wise table from the held-out per-step losses."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.data.datasets import Examples, pack_rows
from synthlab.errors import SynthlabError
from synthlab.evaluation.heldout import examples_in_rows, heldout_loss, seen_share, sequences
from synthlab.sweeps import driver, experiments
from synthlab.sweeps import lab_runner as point_runner
from synthlab.sweeps.results_table import step_rows


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    driver.run_sweep(experiments.load("scaling"), "smoke", out, runner=point_runner, progress=False)
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
    assert heldout_loss(model_dir, data_dir, rows=4, checkpoint=10) == heldout_loss(
        model_dir, data_dir, rows=4, checkpoint=10
    )
    assert heldout_loss(model_dir, data_dir, rows=4, train_dir=data_dir)["seen"] == 1.0  # its own training rows
    assert table["eval_seen"].between(0, 1).all()
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


def test_the_seen_share_counts_the_scored_examples_found_verbatim_in_training():
    training = frozenset(sequences(Examples.from_lists([[1, 2, 3], [4, 5]], [1, 1])))
    fresh = Examples.from_lists([[1, 2, 3], [4, 5, 6], [4, 5], [1, 2]], [1, 1, 1, 1])
    assert seen_share(fresh, 1, training) == 1.0
    assert seen_share(fresh, 2, training) == 0.5  # [4, 5, 6] is not [4, 5]
    assert seen_share(fresh, 4, training) == 0.5  # nor a prefix [1, 2] the sequence [1, 2, 3]


@pytest.mark.parametrize("seq_len", [3, 4, 6])
def test_packed_rows_hold_a_prefix_of_the_examples_counted_by_their_document_ids(seq_len):
    sequences = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [1, 4], [2, 5, 7]]
    examples = Examples.from_lists(sequences, [1] * len(sequences))
    layout = pack_rows(examples, np.arange(len(sequences)), seq_len, pad_id=0)
    row_of, row, used = [], 0, 0  # next-fit by hand: an example that does not fit opens a new row
    for s in sequences:
        if used + len(s) - 1 > seq_len:
            row, used = row + 1, 0
        row_of.append(row)
        used += len(s) - 1
    assert len(layout) == row + 1
    for rows in range(1, len(layout) + 1):
        assert examples_in_rows(layout, rows, pad_id=0) == sum(r < rows for r in row_of)
    assert examples_in_rows(layout, len(layout), pad_id=0) == len(sequences)
