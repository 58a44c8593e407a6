"""TrainConfig's sections (`[train.optim]`, ...) and the flat `[train]` table written before them:
one conversion both ways, old run folders resuming, presets written either way keeping their point
ids, and the OUROBOROS micro-batch's old key."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from typer.testing import CliRunner

from synthlab import serialize
from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.ouroboros.runs import _read_run
from synthlab.ouroboros.stage import parse_section
from synthlab.sweeps import experiments
from synthlab.sweeps.lab_runner import check_same_run
from synthlab.training.configs import (
    OuroborosTrainConfig,
    TrainConfig,
    flat_train,
    flat_types,
    nested_train,
    ouroboros_train_keys,
)
from synthlab.training.run_folders import load_run

runner = CliRunner()

# every flat key set away from its default (and valid together)
FLAT = {
    "task": "mano",
    "data": "/d",
    "seed": 3,
    "loss": "mean",
    "entropy_beta": 0.5,
    "batch_size": 12,
    "grad_accum": 3,
    "seq_len": 40,
    "pack": True,
    "lr": 3e-4,
    "weight_decay": 0.2,
    "beta1": 0.8,
    "beta2": 0.9,
    "eps": 1e-6,
    "grad_clip": 0.5,
    "optimizer_impl": "foreach",
    "steps": 7,
    "exposures": None,
    "schedule": "wsd",
    "min_lr_ratio": 0.2,
    "decay_fraction": 0.3,
    "warmup_steps": 4,
    "stop_when": "train_acc_l1 >= 0.9",
    "checkpoint_every": 5,
    "checkpoints": 2,
    "keep_checkpoints": 3,
    "init_from": "/r",
    "log_every": 2,
    "eval_every": 4,
    "tensorboard": True,
    "wandb": "p",
    "device": "cpu",
    "compile": True,
    "activation_checkpointing": True,
    "tf32": False,
    "cpu_bf16": True,
}


def test_flat_to_sections_and_back_is_the_identity_on_every_field():
    assert set(FLAT) == set(flat_types())  # every field of TrainConfig and of its sections
    config = TrainConfig.flat(**FLAT)
    nested = serialize.to_dict(config)
    assert nested_train(FLAT) == nested and flat_train(nested) == FLAT
    assert nested_train(flat_train(nested)) == nested
    assert nested["optim"]["lr"] == 3e-4 and nested["schedule"]["kind"] == "wsd" and nested["batch"]["batch_size"] == 12
    for key, value in FLAT.items():  # each flat key alone lands on its one field
        assert flat_train(nested_train({key: value})) == {key: value}
    # dotted keys and a mix of the forms: the nested form
    mixed = {"lr": 1e-3, "optim.beta1": 0.7, "schedule": {"steps": 2}, "batch_size": 4}
    assert nested_train(mixed) == {
        "optim": {"lr": 1e-3, "beta1": 0.7},
        "schedule": {"steps": 2},
        "batch": {"batch_size": 4},
    }


def test_each_section_checks_its_fields_and_the_config_checks_across_them():
    for bad, said in [
        ({"lr": 0.0}, "train.optim.lr must be > 0"),
        ({"batch_size": 8, "grad_accum": 3}, "train.batch.grad_accum 3 must divide train.batch.batch_size 8"),
        ({"schedule": "linear"}, "train.schedule.kind must be one of"),
        ({"keep_checkpoints": 0}, "train.checkpoint.keep_checkpoints must be >= 1"),
        ({"stop_when": "train_acc_l1 >= 1"}, "reads the probe of train.logging.eval_every"),
        ({"lrr": 1.0}, "did you mean 'optim.lr'"),
    ]:
        with pytest.raises(SynthlabError, match=said):
            TrainConfig.flat(steps=1, **bad)
    assert TrainConfig.flat(steps=2).replaced(lr=0.5, steps=None, exposures=1.0).schedule == dataclasses.replace(
        TrainConfig.flat(steps=2).schedule, steps=None, exposures=1.0
    )


def test_a_run_folder_written_flat_loads_and_resumes_as_the_same_run(mano, tmp_path):
    tiny = ["--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--max-seq-len", "32", "--threads", "1"]
    config = tmp_path / "run.toml"
    config.write_text("[train]\nbatch_size = 8\n[train.optim]\nlr = 0.003\n[train.schedule]\nsteps = 4\n")
    new = tmp_path / "new"
    args = ["--data", str(mano), "--config", str(config), "--log-every", "1", "--checkpoint-every", "2"]
    result = runner.invoke(app, ["train", *args, *tiny, "--out", str(new), "--no-progress"])
    assert result.exit_code == 0, result.output
    stored = json.loads((new / "config.json").read_text())
    assert stored["train"]["optim"]["lr"] == 0.003 and stored["train"]["batch"]["batch_size"] == 8
    old = tmp_path / "old"  # the same run as a run of before the sections wrote it
    shutil.copytree(new, old)
    (old / "config.json").write_text(json.dumps({**stored, "train": flat_train(stored["train"])}, indent=2))
    assert load_run(old) == load_run(new)
    check_same_run(old, load_run(new)[0])  # a sweep or --resume auto takes it for the same run
    for run_dir in (new, old):
        result = runner.invoke(app, ["train", "--resume", str(run_dir), "--steps", "6", "--no-progress"])
        assert result.exit_code == 0 and "done: 6 steps" in result.output, result.output
    assert (new / "metrics.jsonl").read_text().count("\n") == 6
    assert [json.loads(line)["loss"] for line in (old / "metrics.jsonl").read_text().splitlines()] == [
        json.loads(line)["loss"] for line in (new / "metrics.jsonl").read_text().splitlines()
    ]


DEFINITION = """
name = "nested"
claim = "C0"
title = "sections"
task = "mano"
stages = ["train"]
[base.data]
L = 2
[base.train]
{train}
[presets.cpu]
seeds = 2
[presets.cpu.grid]
{axis} = [1e-3, 3e-3]
"""


def test_a_preset_written_in_sections_keeps_the_point_ids_of_its_flat_form():
    flat = DEFINITION.format(train="steps = 5\nbatch_size = 16\nschedule = 'wsd'", axis='"train.lr"')
    nested = DEFINITION.format(
        train="[base.train.schedule]\nsteps = 5\nkind = 'wsd'\n[base.train.batch]\nbatch_size = 16",
        axis='"train.optim.lr"',
    )
    import tomllib

    flat_points, nested_points = (experiments.parse(tomllib.loads(text)).points("cpu") for text in (flat, nested))
    assert [p.point_id for p in nested_points] == [p.point_id for p in flat_points]
    assert [p.train_id for p in nested_points] == [p.train_id for p in flat_points]
    assert nested_points[0].config["train"] == {"steps": 5, "batch_size": 16, "schedule": "wsd", "lr": 1e-3}


def test_the_ouroboros_micro_batch_reads_its_old_key_and_hashes_it(tmp_path):
    assert ouroboros_train_keys({"batch_size": 4, "lr": 1.0}) == {"micro_batch_size": 4, "lr": 1.0}
    assert ouroboros_train_keys({"micro_batch_size": 4}, old=True) == {"batch_size": 4}
    assert parse_section({"batch_size": 2, "grad_accum": 3}).train.micro_batch_size == 2
    assert "batch_size" not in {f.name for f in dataclasses.fields(OuroborosTrainConfig)}
    old = {"ouroboros": {}, "train": serialize.to_dict(OuroborosTrainConfig()), "variants": []}
    old["train"] = ouroboros_train_keys(old["train"], old=True)  # a run.json of before the renaming
    (tmp_path / "run.json").write_text(json.dumps(old))
    assert _read_run(tmp_path)["train"] == serialize.to_dict(OuroborosTrainConfig())  # so it resumes
    # a point's id hashes the old key, whichever a preset writes
    assert experiments.hashed_form({"ouroboros": {"micro_batch_size": 4}}) == {"ouroboros": {"batch_size": 4}}
