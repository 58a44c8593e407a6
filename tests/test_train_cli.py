"""`synthlab train / eval / capacity` through typer's CliRunner: the happy path and bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from synthlab.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_train_eval_from_a_config_file_with_flag_overrides(tmp_path, mano):
    config = tmp_path / "run.toml"
    config.write_text(
        "[model]\nd_model = 32\nn_heads = 2\nn_layers = 1\nmax_seq_len = 32\n"
        "[train]\nsteps = 3\nbatch_size = 8\nlog_every = 1\n"
    )
    result = invoke(
        "train",
        "--task",
        "mano",
        "--data",
        mano,
        "--out",
        tmp_path / "run",
        "--config",
        config,
        "--loops",
        2,
        "--steps",
        4,
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["loops"] == 2 and saved["model"]["d_model"] == 32  # flag and file
    assert saved["train"]["schedule"]["steps"] == 4  # the flag wins over the file
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 4

    result = invoke("eval", tmp_path / "run", "--steps", 3)
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "run" / "eval" / "steps3.json").read_text())
    assert len(written["accuracy_per_step"]) == 3 and written["n_examples"] == 20

    for option, value in (("--exit", "soon:1"), ("--kv", "middle")):
        result = invoke("eval", tmp_path / "run", option, value)
        assert result.exit_code == 2 and value in result.output

    result = invoke("capacity", tmp_path / "run")
    assert result.exit_code == 2 and "trained on mano" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "bios"], "does not match"),
        (["--task", "mano", "--d-model", "30"], "n_heads"),
        (["--task", "mano", "--loss", "best"], "train.loss"),
        (["--task", "mano", "--steps", "0"], "train.schedule.steps"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, mano, args, message):
    result = invoke("train", "--data", mano, "--out", tmp_path / "run", "--steps", 1, *args)
    assert result.exit_code == 2
    assert message in result.output and result.output.startswith("error:") and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_unknown_config_key_and_section_are_named(tmp_path, mano):
    config = tmp_path / "run.toml"
    config.write_text("[train]\nbatch_sise = 4\n")
    result = invoke("train", "--data", mano, "--out", tmp_path / "run", "--steps", 1, "--config", config)
    assert result.exit_code == 2 and "batch_sise" in result.output and "batch_size" in result.output
    config.write_text("[trian]\nsteps = 4\n")
    result = invoke("train", "--data", mano, "--out", tmp_path / "run", "--config", config)
    assert result.exit_code == 2 and "did you mean 'train'" in result.output


def test_resume_takes_no_run_options_and_needs_a_run(tmp_path, mano):
    result = invoke("train", "--resume", tmp_path, "--lr", 0.1)
    assert result.exit_code == 2 and "--lr" in result.output
    result = invoke("train", "--resume", tmp_path / "nothing")
    assert result.exit_code == 2 and "not a run directory" in result.output
    result = invoke("eval", tmp_path / "nothing")
    assert result.exit_code == 2 and "not a run directory" in result.output


@pytest.mark.slow
def test_ctrl_c_on_the_real_command_writes_a_checkpoint_and_exits_130(tmp_path, mano):
    exe = Path(sys.executable).parent / "synthlab"
    run_dir = tmp_path / "run"
    args = [
        exe,
        "train",
        "--task",
        "mano",
        "--data",
        mano,
        "--out",
        run_dir,
        "--steps",
        100000,
        "--d-model",
        32,
        "--n-heads",
        2,
        "--n-layers",
        1,
        "--max-seq-len",
        32,
        "--log-every",
        1,
        "--no-progress",
        "--threads",
        1,
    ]
    proc = subprocess.Popen([str(a) for a in args], stderr=subprocess.PIPE, text=True)
    while not (run_dir / "metrics.jsonl").is_file() or not (run_dir / "metrics.jsonl").read_text():
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "--resume" in err
    step = torch.load(run_dir / "checkpoint.pt", weights_only=True)["step"]
    assert 0 < step < 100000
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == step


def test_every_model_and_train_field_is_a_flag_with_help():
    from synthlab.cli.flags import flag_name, leaf_fields
    from synthlab.models import ModelConfig
    from synthlab.training.configs import TrainConfig

    result = runner.invoke(
        app, ["train", "--help"], env={"COLUMNS": "400"}
    )  # rich wraps at COLUMNS (80 off a terminal)
    for cls in (ModelConfig, TrainConfig):
        for f in leaf_fields(cls):  # TrainConfig's sections: each of their fields a flag
            if f.name != "vocab_size":
                assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
                assert flag_name(f).split("/")[0] in result.output, f.name


def test_new_model_and_schedule_flags_reach_the_run_config(tmp_path, mano):
    result = invoke(
        "train",
        "--data",
        mano,
        "--out",
        tmp_path / "run",
        "--d-model",
        32,
        "--n-heads",
        2,
        "--n-layers",
        1,
        "--max-seq-len",
        32,
        "--steps",
        3,
        "--batch-size",
        8,
        "--no-tie-head",
        "--positions",
        "learned",
        "--init",
        "torch",
        "--bias",
        "--norm-type",
        "layernorm",
        "--schedule",
        "wsd",
        "--controller",
        "static_lora",
        "--lora-targets",
        "q,v",
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["model"]["tie_head"], saved["model"]["positions"], saved["model"]["init"]) == (
        False,
        "learned",
        "torch",
    )
    assert saved["model"]["lora_targets"] == ["q", "v"] and saved["train"]["schedule"]["kind"] == "wsd"
    assert Path(saved["train"]["data"]).is_absolute()  # the run folder works from anywhere


def test_a_non_finite_setting_is_one_error_line(tmp_path, mano):
    result = invoke("train", "--data", mano, "--out", tmp_path / "run", "--steps", 3, "--lr", "inf")
    assert result.exit_code == 2 and result.output.startswith("error: train.optim.lr must be a finite number")
    assert not (tmp_path / "run").exists()


def test_resume_auto_starts_then_continues_the_same_run(tmp_path, mano):
    """One command line for torchrun --max-restarts and a Slurm requeue: the first call starts the
    run, a later one (here after an interruption: the last checkpoint and its metrics removed)
    continues it, and options that describe another run are refused."""
    run_dir = tmp_path / "run"
    args = [
        "train",
        "--resume",
        "auto",
        "--out",
        run_dir,
        "--task",
        "mano",
        "--data",
        mano,
        "--steps",
        8,
        "--d-model",
        32,
        "--n-heads",
        2,
        "--n-layers",
        1,
        "--max-seq-len",
        32,
        "--log-every",
        1,
        "--checkpoint-every",
        4,
        "--keep-checkpoints",
        3,
        "--no-progress",
    ]
    first = invoke(*args)
    assert first.exit_code == 0, first.output

    def curve():
        return [
            {k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]

    full = curve()
    for name in ("summary.json", "model.safetensors", "checkpoint-8.pt", "checkpoint-8.pt.sha256"):
        (run_dir / name).unlink()  # as if stopped between steps 4 and 8
    again = invoke(*args)
    assert again.exit_code == 0 and "done: 8 steps" in again.output, again.output
    assert curve() == full  # steps 5-8 again, the same numbers
    other = invoke(*[a if a != 8 else 9 for a in args])
    assert other.exit_code == 2 and "another configuration" in other.output
    assert invoke("train", "--resume", "auto").exit_code == 2
