"""synthlab.sweeps.schema: every column a stage writes belongs to one family; names and matches round-trip."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.sweeps import schema
from synthlab.sweeps.results_table import capacity_metrics, heldout_columns


def test_names_and_matches_round_trip():
    assert schema.ACC_STEP.name(3) == "acc_step_3" and schema.ACC_STEP.match("acc_step_3") == ("3",)
    assert schema.AGREE.match(schema.AGREE.name(1, 2)) == ("1", "2")
    assert schema.ACC_STEP.match("acc_step_x") is None and schema.ACC_STEP.match("train_acc_step_1") is None
    with pytest.raises(ValueError):
        schema.AGREE.name(1)


@pytest.mark.parametrize(
    "column,pattern",
    [
        ("n_test", "n_test"),
        ("n_l2", "n_<g>"),
        ("acc_step_2", "acc_step_<t>"),
        ("acc_d3_yes", "acc_<g>"),
        ("train_acc_l2", "train_acc_<g>"),
        ("bits_name", "bits_name"),
        ("bits_gender", "bits_<attribute>"),
        ("eval_loss_step_4", "eval_loss_step_<t>"),
        ("loss_depth_8", "loss_depth_<k>"),
        ("L", "L"),
    ],
)
def test_a_single_column_wins_over_a_pattern(column, pattern):
    assert schema.family(column).pattern == pattern


def test_the_stages_columns_are_all_known():
    # the columns each stage promises (synthlab.sweeps.lab_runner.STAGES) and those the builders write
    from synthlab.sweeps.lab_runner import STAGES

    promised = [c for stage in STAGES.values() for c in stage.columns]
    written = [
        *heldout_columns({"loss_per_step": [1.0, 0.5], "tokens": 10, "step": 2, "n_tokens": 5, "seen": 0.1}),
        *capacity_metrics({"p1": 0.1, "p2": 0.2, "bits": 3.0, "params": 9, "per_attribute": {"gender": {"bits": 1.0}}}),
    ]
    assert [c for c in promised + written if schema.family(c) is None] == []
    assert schema.family("train.lr") is None  # a grid axis is its own column


def test_each_pattern_is_named_once_and_the_cli_prints_them():
    patterns = [f.pattern for f in schema.SCHEMA]
    assert len(patterns) == len(set(patterns))
    result = CliRunner().invoke(app, ["columns"])
    assert result.exit_code == 0 and all(p in result.output for p in patterns)
