"""Nothing lost, nothing cryptic: unwritable outputs, runs stopped before their first
checkpoint, divergence, damaged checkpoints and half-written results rows.

We run as root, for whom chmod does not stop a write: an unwritable place here is a path under a
regular file (`file/sub`), which fails for everyone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.sweeps import driver, experiments, results_table, runner_protocol
from synthlab.training.run_folders import checkpoint_files, load_checkpoint, read_metrics, save_checkpoint
from synthlab_generators import TASKS, write_dataset

TESTS = Path(__file__).parent
FAKE = TESTS / "fixtures" / "sweep_fake.toml"
TINY = [
    "--d-model",
    32,
    "--n-heads",
    2,
    "--n-layers",
    1,
    "--max-seq-len",
    32,
    "--batch-size",
    8,
    "--device",
    "cpu",
    "--no-progress",
]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(result, *needles) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    assert all(str(n) in errors[0] for n in needles), errors[0]


def losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(run_dir)]


# --- 1. unwritable outputs ---------------------------------------------------------------------


def test_every_writing_command_refuses_an_unwritable_place_in_one_line(tmp_path, mano, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a regular file\n")
    bad = blocker / "sub"
    sweep_dir = tmp_path / "sweep"
    monkeypatch.syspath_prepend(str(TESTS))
    result = invoke("sweep", FAKE, "--runner", "sweep_fake_runner", "--out", sweep_dir)
    assert result.exit_code == 0, result.output
    table = tmp_path / "table.csv"
    table.write_text("params,loss\n1e6,3.0\n2e6,2.8\n4e6,2.7\n8e6,2.65\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    commands = {
        "train": ["train", "--data", mano, "--out", bad, "--steps", 2, *TINY],
        "sweep": ["sweep", FAKE, "--runner", "sweep_fake_runner", "--out", bad],
        "gen": ["gen", "mano", "--L", 2, "--n-train", 10, "--n-test", 2, "--out", bad],
        "plot": ["plot", "capacity", sweep_dir, "--out", bad],
        "report": ["report", sweep_dir, "--out", bad / "report.md"],
        "fit": ["fit", "power", table, "--x-col", "params", "--bootstrap", 0, "--plot", bad / "fit.png"],
    }
    for name, args in commands.items():
        one_error_line(invoke(*args), bad, "not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing left behind


def test_an_os_error_while_writing_is_one_line_naming_the_file(tmp_path, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device", "somewhere/results.csv")

    monkeypatch.setattr(experiments, "load", no_space)
    one_error_line(invoke("sweep", "anything", "--out", tmp_path / "s"), "somewhere/results.csv", "No space")


def test_gen_into_an_existing_empty_folder_that_cannot_be_moved_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "data"
    out.mkdir()
    real_rename = os.rename

    def refuse_moving_out(src, dst):
        if Path(src) == out:
            raise PermissionError(13, "Permission denied", str(src))
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", refuse_moving_out)
    one_error_line(invoke("gen", "mano", "--L", 2, "--n-train", 10, "--n-test", 2, "--out", out), out)
    assert [p.name for p in tmp_path.iterdir()] == ["data"] and not any(out.iterdir())  # no .old-, no .tmp-


# --- 2. a run stopped before its first checkpoint; --init-from ----------------------------------


def test_a_run_with_a_config_and_no_checkpoint_resumes_from_step_0(tmp_path, mano):
    args = ["--data", mano, "--steps", 6, "--log-every", 1, "--checkpoint-every", 4, *TINY]
    assert invoke("train", "--out", tmp_path / "fresh", *args).exit_code == 0
    killed = tmp_path / "killed"  # what kill -9 before the first checkpoint leaves
    killed.mkdir()
    shutil.copy(tmp_path / "fresh" / "config.json", killed)
    (killed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in read_metrics(tmp_path / "fresh")[:3]))
    one_error_line(invoke("train", "--out", killed, *args), "not empty", "--resume")
    result = invoke("train", "--resume", killed, "--no-progress")
    assert result.exit_code == 0, result.output
    assert losses(killed) == losses(tmp_path / "fresh")  # same seed, same run, each step once


@pytest.mark.slow  # a training in a fresh CLI process
def test_kill_9_before_the_first_checkpoint_then_resume_gives_the_fresh_run(tmp_path, mano):
    args = ["--data", mano, "--steps", 300, "--log-every", 1, "--checkpoint-every", 300, "--threads", 1, *TINY]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "synthlab"), "train", "--out", str(killed), *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log, deadline = killed / "metrics.jsonl", time.time() + 120
    while not (log.is_file() and log.stat().st_size) and time.time() < deadline:  # a step logged
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not checkpoint_files(killed) and (killed / "config.json").is_file()
    assert invoke("train", "--resume", killed, "--no-progress").exit_code == 0
    assert invoke("train", "--out", tmp_path / "fresh", *args).exit_code == 0
    assert losses(killed) == losses(tmp_path / "fresh")


def test_a_bad_init_from_creates_no_run_folder(tmp_path, mano):
    out = tmp_path / "run"
    one_error_line(
        invoke("train", "--data", mano, "--out", out, "--steps", 2, "--init-from", tmp_path / "nothere", *TINY),
        "nothere",
    )
    assert not out.exists()


# --- 3. divergence ----------------------------------------------------------------------------


def test_a_diverging_run_stops_with_one_line_and_valid_metrics(tmp_path, mano):
    run_dir = tmp_path / "run"
    result = invoke(
        "train",
        "--data",
        mano,
        "--out",
        run_dir,
        "--steps",
        40,
        "--log-every",
        2,
        "--checkpoint-every",
        2,
        "--lr",
        "1e30",
        "--warmup-steps",
        0,
        *TINY,
    )
    one_error_line(result, "diverged", run_dir)
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():  # strict JSON: no NaN, no Infinity
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in metrics.jsonl"))
    if checkpoint_files(run_dir):  # whatever was kept is finite
        assert all(bool(t.isfinite().all()) for t in load_checkpoint(run_dir)["model"].values())


def test_a_run_diverging_before_its_first_checkpoint_says_none_is_kept(tmp_path, mano):
    run_dir = tmp_path / "run"
    result = invoke(
        "train",
        "--data",
        mano,
        "--out",
        run_dir,
        "--steps",
        40,
        "--log-every",
        2,
        "--checkpoint-every",
        1000,
        "--lr",
        "1e30",
        "--warmup-steps",
        0,
        *TINY,
    )
    one_error_line(result, "no checkpoint", run_dir)
    assert not checkpoint_files(run_dir)


@pytest.mark.parametrize(
    "flag, value", [("--lr", "inf"), ("--lr", "nan"), ("--weight-decay", "nan"), ("--eps", "inf"), ("--dropout", "nan")]
)
def test_non_finite_settings_are_refused_before_anything_is_written(tmp_path, mano, flag, value):
    out = tmp_path / "run"
    one_error_line(invoke("train", "--data", mano, "--out", out, "--steps", 2, flag, value, *TINY), "finite")
    assert not out.exists()


# --- 4. damaged checkpoints and results rows ----------------------------------------------------


def test_a_truncated_newest_checkpoint_falls_back_to_the_older_one(tmp_path, mano, capsys):
    args = ["--data", mano, "--steps", 9, "--log-every", 1, "--checkpoint-every", 3, *TINY]
    assert invoke("train", "--out", tmp_path / "straight", *args).exit_code == 0
    run_dir = tmp_path / "run"
    assert invoke("train", "--out", run_dir, "--keep-checkpoints", 2, *args).exit_code == 0
    assert [p.name for p in checkpoint_files(run_dir)] == ["checkpoint-9.pt", "checkpoint-6.pt"]  # the last 2
    newest = run_dir / "checkpoint-9.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    capsys.readouterr()
    assert load_checkpoint(run_dir)["step"] == 6
    assert "checkpoint-9.pt" in capsys.readouterr().err  # said so
    result = invoke("train", "--resume", run_dir, "--no-progress")
    assert result.exit_code == 0, result.output
    assert losses(run_dir) == losses(tmp_path / "straight")  # nothing lost but the steps since step 6
    assert load_checkpoint(run_dir)["step"] == 9


@pytest.mark.parametrize("every, kept", [(2, [8, 6, 4]), (0, [8, 6, 5])])
def test_a_stops_off_schedule_checkpoint_takes_no_kept_place_once_a_newer_one_exists(tmp_path, every, kept):
    # a run stopped at step 5 and resumed: with its schedule known, the scheduled checkpoint 4 that an
    # evaluation may read (scaling's eval.checkpoint) stays; 5 was only a resume point
    for step in (2, 4, 5, 6, 8):
        save_checkpoint(tmp_path, {"step": step}, keep=3, every=every)
    assert [int(p.stem.split("-")[1]) for p in checkpoint_files(tmp_path)] == kept
    assert sorted(p.name for p in tmp_path.glob("*.sha256")) == sorted(f"checkpoint-{k}.pt.sha256" for k in kept)


def test_no_intact_checkpoint_is_one_line_naming_each_file(tmp_path, mano):
    run_dir = tmp_path / "run"
    assert (
        invoke("train", "--out", run_dir, "--data", mano, "--steps", 4, "--checkpoint-every", 2, *TINY).exit_code == 0
    )
    for path in checkpoint_files(run_dir):
        path.write_bytes(b"garbage")
    with pytest.raises(SynthlabError, match="checkpoint-4.pt.*checkpoint-2.pt"):
        load_checkpoint(run_dir)


def test_a_damaged_sweep_json_is_one_error_line_for_a_sweep_and_its_dry_run(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    (tmp_path / "sweep.json").write_text("{not json")
    for extra in ([], ["--dry-run"]):
        one_error_line(
            invoke("sweep", FAKE, "--runner", "sweep_fake_runner", "--out", tmp_path, *extra),
            tmp_path / "sweep.json",
            "not valid JSON",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]  # nothing else written


def test_a_half_written_results_row_reruns_its_point_with_a_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(TESTS))
    fake = runner_protocol.load_runner("sweep_fake_runner")
    exp = experiments.load(FAKE)
    results = driver.run_sweep(exp, "smoke", tmp_path, runner=fake, progress=False)
    whole = results.read_text()
    results.write_text(whole[: len(whole) - 25])  # the last row cut mid-way, as a crash of a copy leaves it
    capsys.readouterr()
    rows = results_table.read_rows(results)
    assert len(rows) == 7 and "not a whole row" in capsys.readouterr().err
    assert len(results_table.read_results(tmp_path)) == 7  # plot and report show whole rows only, and say so
    assert "not a whole row" in capsys.readouterr().err
    driver.run_sweep(exp, "smoke", tmp_path, runner=fake, progress=False)
    assert results.read_text() == whole  # the point's row is back, whole, once


def test_a_row_missing_its_stage_columns_reruns_its_point(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(TESTS))
    fake = runner_protocol.load_runner("sweep_fake_runner")
    monkeypatch.setattr(fake, "columns", lambda point: ["accuracy"], raising=False)
    exp = experiments.load(FAKE)
    results = driver.run_sweep(exp, "smoke", tmp_path, runner=fake, progress=False)
    rows = results_table.read_rows(results)
    blanked = rows[2]["point_id"]
    results.unlink()
    results_table.append_rows(results, [{**r, "accuracy": ""} if r["point_id"] == blanked else r for r in rows])
    capsys.readouterr()
    driver.run_sweep(exp, "smoke", tmp_path, runner=fake, progress=False)
    assert blanked in capsys.readouterr().err
    again = {r["point_id"]: r for r in results_table.read_rows(results)}
    assert len(again) == len(rows) and all(again[r["point_id"]]["accuracy"] == r["accuracy"] for r in rows)


# --- 5. moved data, errors that name their file and line, big generations --------------------


def test_capacity_reads_a_moved_dataset_with_data(tmp_path):
    spec = TASKS["bios"]
    data = write_dataset(spec, spec.params_cls(n_people=8), 0, tmp_path / "bios")
    run_dir = tmp_path / "run"
    assert (
        invoke(
            "train",
            "--data",
            data,
            "--out",
            run_dir,
            "--steps",
            1,
            "--batch-size",
            4,
            "--d-model",
            32,
            "--n-heads",
            2,
            "--n-layers",
            1,
            "--max-seq-len",
            128,
            "--device",
            "cpu",
            "--no-progress",
        ).exit_code
        == 0
    )
    moved = data.rename(tmp_path / "moved")
    one_error_line(invoke("capacity", run_dir, "--device", "cpu"), "--data")
    result = invoke("capacity", run_dir, "--data", moved, "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads((run_dir / "capacity.json").read_text())["data"] == str(moved.resolve())


def test_a_token_outside_the_vocabulary_names_its_file_and_line(tmp_path, mano):
    data = Path(shutil.copytree(mano, tmp_path / "data"))
    lines = (data / "train.jsonl").read_text().splitlines()
    record = json.loads(lines[4])
    lines[4] = json.dumps({**record, "answer": "13"})  # mod 5: no token 13
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    one_error_line(
        invoke("train", "--data", data, "--out", tmp_path / "run", "--steps", 1, "--no-verify", *TINY),
        f"{data / 'train.jsonl'}:5",
        "'13'",
    )


def test_gen_states_a_big_size_and_refuses_one_the_disk_cannot_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, 10**8))
    result = invoke("gen", "bios", "--n-people", 10_000_000, "--out", tmp_path / "big")
    one_error_line(result, "GB", "free")
    assert "10,000,000 training records" in result.output and "GB on disk" in result.output
    assert not any(tmp_path.iterdir())
