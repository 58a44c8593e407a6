"""What a model has learned, end to end: per-group accuracy on held-out and training prompts in
`synthlab eval`, the learning curve of `--eval-every` in metrics.jsonl, the sweep's columns, the
per-length figure and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synthlab import plots
from synthlab.cli import app
from synthlab.report.markdown import write_report
from synthlab.sweeps import driver, experiments
from synthlab.sweeps import lab_runner as point_runner
from synthlab.sweeps.results_table import RESULTS, read_results, read_rows

FIXTURE = Path(__file__).parent / "fixtures" / "mano_tiny.toml"
runner = CliRunner()


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def mano_run(tmp_path_factory):
    """L = 2, mod 5: the 75 one-operator prompts are all in train (no held-out l = 1)."""
    root = tmp_path_factory.mktemp("diag")
    invoke("gen", "mano", "--L", "2", "--mod", "5", "--n-train", "2000", "--n-test", "40", "--out", str(root / "data"))
    invoke(
        "train",
        "--data",
        str(root / "data"),
        "--n-layers",
        "1",
        "--d-model",
        "32",
        "--n-heads",
        "2",
        "--max-seq-len",
        "16",
        "--steps",
        "36",
        "--batch-size",
        "16",
        "--warmup-steps",
        "2",
        "--lr",
        "3e-3",
        "--log-every",
        "5",
        "--eval-every",
        "12",
        "--device",
        "cpu",
        "--out",
        str(root / "run"),
    )
    return root


def test_eval_every_logs_per_group_accuracy_at_its_steps(mano_run):
    records = [json.loads(line) for line in (mano_run / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == sorted({*range(5, 36, 5), 12, 24, 36})
    evaluated = [r for r in records if any(k.startswith("eval/") for k in r)]
    assert [r["step"] for r in evaluated] == [12, 24, 36]
    for r in evaluated:
        keys = {k for k in r if k.startswith("eval/")}
        assert {
            "eval/acc_l2",
            "eval/train_acc_l1",
            "eval/train_acc_l2",
            "eval/answer_loss_l2",
            "eval/train_answer_loss_l1",
        } <= keys and "eval/acc_l1" not in keys  # l = 1: train only
        assert r["eval/n_l2"] == 40 and r["eval/train_n_l1"] == 75  # all there are (at most 256)
        assert all(0 <= r[k] <= 1 for k in keys if "/acc_" in k or "/train_acc_" in k)
    assert all("loss" in r and "tokens" in r for r in records)  # eval lines are whole log lines


def test_eval_json_has_held_out_and_training_accuracy_per_length(mano_run):
    output = invoke("eval", str(mano_run / "run"), "--device", "cpu")
    result = json.loads((mano_run / "run" / "eval" / "steps1.json").read_text())
    groups = result["groups"]
    assert list(groups["heldout"]) == ["l2"] and list(groups["train"]) == ["l1", "l2"]
    assert result["train_only_groups"] == ["l1"]
    assert groups["heldout"]["l2"]["n"] == result["n_examples"] == 40
    assert groups["heldout"]["l2"]["accuracy"] == result["accuracy"]  # the headline is l = L
    assert groups["train"]["l1"]["n"] == 75
    # the last learning-curve point scored the same final model on the same prompts
    last = json.loads((mano_run / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["eval/acc_l2"] == pytest.approx(groups["heldout"]["l2"]["accuracy"])
    assert last["eval/train_acc_l1"] == pytest.approx(groups["train"]["l1"]["accuracy"])
    assert last["eval/train_answer_loss_l1"] == pytest.approx(groups["train"]["l1"]["answer_loss"], rel=1e-5)
    shown = (
        f"per length at step 1, accuracy held-out/training prompts: l1 -/{groups['train']['l1']['accuracy']:.3f}, l2 "
    )
    assert shown in output


def test_evaluating_past_the_trained_depth_scores_the_groups_at_the_trained_depth(mano_run, tmp_path):
    """What a model has learned (the verdicts' preconditions read it) is the model as trained, not
    its extrapolation: a 1 x 2 model evaluated to T = 5 reports the same groups as at T = 2."""
    from synthlab.evaluation.evaluate import evaluate_run

    invoke(
        "train",
        "--data",
        str(mano_run / "data"),
        "--n-layers",
        "1",
        "--loops",
        "2",
        "--d-model",
        "32",
        "--n-heads",
        "2",
        "--max-seq-len",
        "16",
        "--steps",
        "30",
        "--batch-size",
        "16",
        "--warmup-steps",
        "2",
        "--lr",
        "3e-3",
        "--device",
        "cpu",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
    )
    at_depth = evaluate_run(tmp_path / "run", device="cpu")
    past = evaluate_run(tmp_path / "run", steps=5, device="cpu")
    assert past["eval_steps"] == 5 and past["groups_at_step"] == at_depth["groups_at_step"] == 2
    assert past["groups"] == at_depth["groups"]
    assert past["groups"]["heldout"]["l2"]["accuracy"] == past["accuracy_at_trained_depth"]


def test_eval_takes_threads_like_train(mano_run):
    assert "per length at step 1" in invoke("eval", str(mano_run / "run"), "--device", "cpu", "--threads", "1")
    result = runner.invoke(app, ["eval", str(mano_run / "run"), "--threads", "0"])
    assert result.exit_code == 2 and "--threads must be >= 1" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_bad_eval_every_is_one_error_line(tmp_path):
    result = runner.invoke(
        app, ["train", "--data", str(tmp_path), "--steps", "5", "--eval-every", "-1", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 2 and "train.logging.eval_every" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_sweep_results_figure_and_report_carry_the_per_length_columns(tmp_path):
    driver.run_sweep(experiments.load(FIXTURE), "smoke", tmp_path, runner=point_runner, progress=False)
    rows = read_rows(tmp_path / RESULTS)
    assert len(rows) == 2
    for row in rows:
        for column in (
            "acc_l2",
            "answer_loss_l2",
            "n_l2",
            "train_acc_l1",
            "train_acc_l2",
            "train_answer_loss_l1",
            "train_n_l1",
            "train_n_l2",
        ):
            assert row[column] != "", column
        assert float(row["acc_l2"]) == float(row["accuracy"]) and int(row["n_l2"]) == int(row["n_test"]) == 50
    paths = plots.plot("mano", read_results(tmp_path), tmp_path / "figures")
    assert {p.name for p in paths} == {"mano.png", "mano.svg", "mano_lengths.png", "mano_lengths.svg"}
    report = write_report([tmp_path], tmp_path / "report" / "README.md").read_text()
    assert "train_acc_l1" in report and "mano_lengths.png" in report


@pytest.mark.parametrize(
    "task, params, heldout, train",
    [
        (
            "reach",
            dict(nodes=24, max_diameter=3, n_train=200, n_test=40, edge_repeats=2, edge_queries=1),
            ["d1_no", "d1_yes", "d2_no", "d2_yes", "d3_no", "d3_yes"],
            ["d1_no", "d1_yes", "d2_no", "d2_yes", "d3_no", "d3_yes", "edge_no", "edge_yes"],
        ),
        # every atomic fact is a training question: one-hop is a training-only group
        (
            "multihop",
            dict(hops=2, layers=3, per_layer=5, relations=2, n_test=10, train_fraction=0.5),
            ["h2"],
            ["h1", "h2"],
        ),
    ],
)
def test_groups_of_the_other_tasks(tmp_path, task, params, heldout, train):
    import torch

    from synthlab.data.datasets import load_dataset
    from synthlab.evaluation.groups import GroupProbe, group_columns, group_label
    from synthlab.models import ModelConfig, build_model
    from synthlab_generators import TASKS, write_dataset

    spec = TASKS[task]
    data = load_dataset(write_dataset(spec, spec.params_cls(**params), 0, tmp_path / task))
    model = build_model(
        ModelConfig(vocab_size=len(data.tokenizer), d_model=16, n_heads=2, n_layers=1, max_seq_len=128, loops=1)
    )
    probe = GroupProbe(data, per_group=16)
    groups = probe.groups(model, torch.device("cpu"))
    # during training: the same numbers as columns, no random draw, the model left in training mode
    model.train()
    rng = torch.get_rng_state()
    columns = probe(model, torch.device("cpu"))
    assert model.training and torch.equal(torch.get_rng_state(), rng)
    assert columns == {f"eval/{k}": v for k, v in group_columns(groups).items()}
    assert sorted(probe.columns) == sorted(columns)  # named without scoring (train.stop_when is checked on them)
    assert list(groups["heldout"]) == heldout and list(groups["train"]) == train
    key = spec.group_key
    for split, records in (("heldout", data.records("test")), ("train", data.records("train"))):
        for label, stats in groups[split].items():
            members = {
                r.get("prompt", r.get("question"))
                for r in records
                if "answer" in r and group_label(key, r.get(key)) == label
            }
            assert stats["n"] == min(16, len(members))


def test_curves_draw_the_learning_curve_of_each_group(mano_run, tmp_path):
    from synthlab.plots import curves

    runs = curves.collect([mano_run / "run"])
    learning = curves._learning(runs)
    assert sorted(set(learning["step"])) == [12, 24, 36]
    assert set(zip(learning["group"], learning["prompts"])) == {
        ("l2", "held-out"),
        ("l1", "training"),
        ("l2", "training"),
    }
    names = {p.name for p in curves.plot_curves(runs, tmp_path)}
    assert {"curves.png", "curves_groups.png", "curves_groups.svg"} <= names
