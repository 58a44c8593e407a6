"""Hostile and unlucky files: a crafted pickle in every load path runs nothing, an --out that holds
someone else's data is never replaced, an edited dataset is detected, a cut-off append does not
block a resume, damaged files fall back or end in one `error:` line. The same for OUROBOROS's
files in test_hostile_ouroboros.py and for sweeps in test_hostile_sweeps.py, which import
its shared functions."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.files import sha256_file
from synthlab.training.run_folders import checkpoint_files
from synthlab_generators import TASKS, write_dataset

runner = CliRunner()
EXPORTABLE = [
    "--d-model",
    32,
    "--n-heads",
    2,
    "--n-layers",
    1,
    "--max-seq-len",
    128,
    "--mlp",
    "swiglu",
    "--batch-size",
    4,
    "--device",
    "cpu",
    "--no-progress",
    "--threads",
    1,
]


def invoke(*args, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


def one_error_line(result, *needles) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    assert all(str(n) in lines[0] for n in needles), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def bios(tmp_path_factory):
    spec = TASKS["bios"]
    return write_dataset(spec, spec.params_cls(n_people=8), 0, tmp_path_factory.mktemp("d") / "bios")


@pytest.fixture(scope="module")
def trained(bios, tmp_path_factory):
    """A finished 2-step run (exportable: loops = 1, SwiGLU), checkpoints at steps 1 and 2."""
    run = tmp_path_factory.mktemp("r") / "run"
    result = invoke(
        "train", "--data", bios, "--out", run, "--steps", 2, "--checkpoint-every", 1, "--log-every", 1, *EXPORTABLE
    )
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture
def run_copy(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


class CraftedPickle:
    """An object whose unpickling would create `marker` (any code could run in its place)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant_crafted_checkpoints(run: Path, marker: Path) -> None:
    """Every checkpoint of `run` replaced by a crafted one with a matching sha256; no model.safetensors."""
    (run / "model.safetensors").unlink(missing_ok=True)
    real = torch.load(checkpoint_files(run)[0], weights_only=True)
    for path in [*checkpoint_files(run), run / "checkpoint.pt"]:
        path.unlink()
        torch.save({**real, "extra": CraftedPickle(marker)}, path)
        if path.name != "checkpoint.pt":
            path.with_name(path.name + ".sha256").write_text(sha256_file(path) + "\n")


# --- code from files ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["resume", "init-from", "eval", "capacity", "export"])
def test_a_crafted_checkpoint_is_refused_in_every_load_path(command, run_copy, bios, tmp_path):
    marker = tmp_path / "marker"
    plant_crafted_checkpoints(run_copy, marker)
    args = {
        "resume": ["train", "--resume", run_copy, "--no-progress"],
        "init-from": [
            "train",
            "--data",
            bios,
            "--out",
            tmp_path / "new",
            "--steps",
            1,
            "--init-from",
            run_copy,
            *EXPORTABLE,
        ],
        "eval": ["eval", run_copy, "--device", "cpu", "--threads", 1],
        "capacity": ["capacity", run_copy, "--device", "cpu"],
        "export": ["export", run_copy, "--out", tmp_path / "hf"],
    }[command]
    one_error_line(invoke(*args), "refused")
    assert not marker.exists()
    assert not (tmp_path / "new").exists() and not (tmp_path / "hf").exists()


def test_the_labs_own_checkpoints_load_with_weights_only(trained):
    ckpt = torch.load(trained / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 2 and {"model", "optimizer", "batcher", "torch_rng", "model_rng"} <= ckpt.keys()


def test_a_crafted_newest_checkpoint_falls_back_to_an_intact_older_one(run_copy, tmp_path):
    marker = tmp_path / "marker"
    (run_copy / "model.safetensors").unlink()
    newest = checkpoint_files(run_copy)[0]
    torch.save({**torch.load(newest, weights_only=True), "extra": CraftedPickle(marker)}, newest)
    newest.with_name(newest.name + ".sha256").unlink()
    result = invoke("eval", run_copy, "--device", "cpu", "--threads", 1)
    assert result.exit_code == 0 and "refused" in result.output and "checkpoint-1.pt" in result.output, result.output
    assert not marker.exists()


# --- folders replaced ---------------------------------------------------------------------------


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_never_replaces_the_run_the_working_directory_or_a_folder_holding_them(run_copy, tmp_path, monkeypatch):
    before = listing(tmp_path)
    for out in [run_copy, tmp_path]:  # the run, a folder holding it
        one_error_line(invoke("export", run_copy, "--out", out, "--overwrite"), "choose a new folder")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine\n")
    monkeypatch.chdir(work)
    for out in [".", "..", work]:
        one_error_line(invoke("export", run_copy, "--out", out, "--overwrite"), "working directory")
    (work / "notes.txt").unlink()
    work.rmdir()
    assert listing(tmp_path) == before


def test_export_replaces_its_own_output_and_anything_else_only_with_overwrite(run_copy, tmp_path):
    precious = tmp_path / "precious dir"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work\n")
    one_error_line(invoke("export", run_copy, "--out", precious), "not empty", "--overwrite")
    assert (precious / "thesis.tex").read_text() == "years of work\n"
    assert invoke("export", run_copy, "--out", precious, "--overwrite").exit_code == 0
    assert not (precious / "thesis.tex").exists() and (precious / "config.json").is_file()
    assert invoke("export", run_copy, "--out", precious).exit_code == 0  # its own earlier output
    (precious / "notes.md").write_text("added by hand\n")  # no longer only the export's files
    one_error_line(invoke("export", run_copy, "--out", precious), "not empty")
    assert (precious / "notes.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious dir", "run"]  # nothing aside left


def test_an_export_failing_midway_leaves_the_earlier_one_whole(run_copy, tmp_path, monkeypatch):
    from synthlab.ouroboros import export

    out = tmp_path / "hf"
    assert invoke("export", run_copy, "--out", out).exit_code == 0
    before = listing(out)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "hf_tokenizer", full_disk)
    one_error_line(invoke("export", run_copy, "--out", out), "No space left")
    assert listing(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]


def test_gen_never_replaces_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "keep.txt").write_text("mine\n")
    monkeypatch.chdir(tmp_path)
    for out in [".", ".."]:
        one_error_line(
            invoke("gen", "mano", "--L", 2, "--n-train", 10, "--n-test", 2, "--out", out, "--overwrite"),
            "working directory",
        )
    assert (tmp_path / "keep.txt").read_text() == "mine\n"


# --- edited datasets ----------------------------------------------------------------------------


def test_an_edited_dataset_is_refused_at_train_resume_eval_and_capacity_unless_no_verify(trained, bios, tmp_path):
    data = tmp_path / "bios"
    shutil.copytree(bios, data)
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    config = json.loads((run / "config.json").read_text())
    config["train"]["data"] = str(data)
    (run / "config.json").write_text(json.dumps(config))
    assert invoke("eval", run, "--device", "cpu", "--threads", 1).exit_code == 0
    train = data / "train.jsonl"
    train.write_text(train.read_text().replace(" She ", " He "))  # every record rewritten
    commands = {
        "train": ["train", "--data", data, "--out", tmp_path / "new", "--steps", 1, *EXPORTABLE],
        "resume": ["train", "--resume", run, "--no-progress"],
        "eval": ["eval", run, "--device", "cpu", "--threads", 1],
        "capacity": ["capacity", run, "--device", "cpu"],
    }
    for args in commands.values():
        one_error_line(invoke(*args), train, "sha256", "--no-verify")
    assert not (tmp_path / "new").exists()
    assert invoke(*commands["eval"], "--no-verify").exit_code == 0
    assert invoke(*commands["train"], "--no-verify").exit_code == 0


def test_a_dataset_is_hashed_once_per_size_and_mtime(bios, tmp_path, monkeypatch):
    from synthlab.data import datasets as datalib

    data = tmp_path / "bios"
    shutil.copytree(bios, data)
    (data / ".verified.json").unlink(missing_ok=True)
    hashed = []
    real = datalib.sha256_file
    monkeypatch.setattr(datalib, "sha256_file", lambda path: hashed.append(Path(path).name) or real(path))
    datalib.load_dataset(data)
    assert sorted(hashed) == sorted(json.loads((data / "meta.json").read_text())["files"])
    hashed.clear()
    datalib.load_dataset(data)
    assert hashed == []
    os.utime(data / "test.jsonl", ns=(0, 0))  # touched: hashed again (and still intact)
    datalib.load_dataset(data)
    assert hashed == ["test.jsonl"]


# --- appends cut off ----------------------------------------------------------------------------


def test_a_metrics_line_cut_by_a_full_disk_blocks_neither_resume_nor_curves(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    for name in ("model.safetensors", "summary.json", "checkpoint-2.pt", "checkpoint-2.pt.sha256"):
        (run / name).unlink()  # stopped after the step-1 checkpoint, while appending step 2's line
    shutil.copyfile(run / "checkpoint-1.pt", run / "checkpoint.pt")
    whole = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(whole[:-10])
    result = invoke("curves", run, "--out", tmp_path / "fig")
    assert result.exit_code == 0 and "warning: " in result.output and "cut off" in result.output, result.output
    result = invoke("train", "--resume", run, "--no-progress")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    before = [json.loads(line) for line in whole.splitlines()]
    assert [(r["step"], r["loss"]) for r in records] == [(r["step"], r["loss"]) for r in before]


def test_a_damaged_metrics_line_before_the_last_is_one_error_line(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(["{garbage", *lines]) + "\n")
    one_error_line(invoke("curves", run, "--out", tmp_path / "fig"), "metrics.jsonl:1")


# --- failures before the first step -------------------------------------------------------------


def test_out_of_memory_is_one_line_naming_the_size_and_blocks_no_rerun(bios, tmp_path):
    run = tmp_path / "run"
    args = ["train", "--data", bios, "--out", run, "--steps", 1, *EXPORTABLE]
    huge = [*args, "--d-ff", 10**11]  # its first matrix cannot be allocated (later flags win)
    one_error_line(invoke(*huge), "out of memory", "GiB")
    one_error_line(invoke("train", "--resume", run, "--no-progress"), "out of memory", "GiB")
    one_error_line(invoke(*huge), "out of memory", "GiB")  # the same command: the same line, no "not empty"
    result = invoke(*args)  # the corrected command replaces the folder, with a warning
    assert result.exit_code == 0 and "warning: replacing" in result.output, result.output


def test_a_folder_with_more_than_an_unstarted_run_is_not_replaced(trained, bios, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    (run / "metrics.jsonl").write_text("")  # even with no logged step: checkpoints are kept
    one_error_line(invoke("train", "--data", bios, "--out", run, "--steps", 1, *EXPORTABLE), "not empty")
    assert checkpoint_files(run)


@pytest.mark.parametrize(
    "args, needles",
    [
        (["eval", "RUN", "--batch-size", 0], ["--batch-size", ">= 1"]),
        (["capacity", "RUN", "--batch-size", 0], ["--batch-size", ">= 1"]),
        (["eval", "RUN", "--device", "tpu"], ["--device", "tpu"]),
        (["eval", "RUN", "--steps", 1_000_000], ["--steps", "1..16"]),
        (["capacity", "RUN", "--steps", 1_000_000], ["--steps", "1..16"]),
        (["eval", "RUN", "--exit", "diff:nan"], ["diff:nan", "finite"]),
        (["eval", "RUN", "--exit", "static:inf"], ["static:inf", "finite"]),
    ],
)
def test_bad_values_are_refused_naming_their_cause(args, needles, trained):
    one_error_line(invoke(*[trained if a == "RUN" else a for a in args]), *needles)


def test_nan_weights_are_an_error_not_an_accuracy(run_copy):
    from safetensors.torch import load_file, save_file

    weights = load_file(run_copy / "model.safetensors")
    name = sorted(weights)[0]
    weights[name][0] = float("nan")
    save_file(weights, run_copy / "model.safetensors")
    one_error_line(invoke("eval", run_copy, "--device", "cpu", "--threads", 1), "not finite", name)


def test_a_damaged_model_safetensors_falls_back_to_the_checkpoint(run_copy):
    (run_copy / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json")
    result = invoke("eval", run_copy, "--device", "cpu", "--threads", 1)
    assert result.exit_code == 0 and "warning: damaged" in result.output and "accuracy" in result.output, result.output


def test_a_damaged_checkpoint_without_its_sha256_falls_back(run_copy):
    newest = checkpoint_files(run_copy)[0]
    state = torch.load(newest, weights_only=True)
    state["torch_rng"] = torch.zeros(7, dtype=torch.uint8)  # bytes flipped inside a tensor: torch.load succeeds
    torch.save(state, newest)
    newest.with_name(newest.name + ".sha256").unlink()
    (run_copy / "summary.json").unlink()
    result = invoke("train", "--resume", run_copy, "--no-progress")
    assert result.exit_code == 0 and "invalid torch_rng" in result.output and "checkpoint-1.pt" in result.output, (
        result.output
    )


def test_a_full_disk_while_checkpointing_is_one_line_and_the_run_resumes(bios, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_save = torch.save

    def disk_full_at_step_2(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("step") == 2:
            Path(f).write_bytes(b"PK\x03\x04 half")
            raise RuntimeError(
                "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                "data/3: file write failed"
            )
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_step_2)
    args = ["train", "--data", bios, "--out", run, "--steps", 2, "--checkpoint-every", 1, *EXPORTABLE]
    one_error_line(invoke(*args), "checkpoint-2.pt", "disk full", "--resume")
    assert [p.name for p in checkpoint_files(run)] == ["checkpoint-1.pt"]
    assert not [p for p in run.iterdir() if ".tmp" in p.name]
    monkeypatch.setattr(torch, "save", real_save)  # space freed
    result = invoke("train", "--resume", run, "--no-progress")
    assert result.exit_code == 0 and (run / "model.safetensors").is_file(), result.output


# --- interruptions ------------------------------------------------------------------------------


def test_a_run_in_use_is_refused_naming_its_pid_and_a_killed_holder_frees_it(run_copy, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    (run_copy / "summary.json").unlink()  # resumable
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pathlib import Path\n"
            "from synthlab.files import folder_lock\n"
            "with folder_lock(Path(sys.argv[1]), 'test'):\n    print('held', flush=True)\n"
            "    time.sleep(60)\n",
            str(run_copy),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        one_error_line(invoke("train", "--resume", run_copy, "--no-progress"), f"in use by PID {holder.pid}")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    stale = run_copy / f".checkpoint-9.{holder.pid}.tmp.pt"  # a writer killed mid-write
    stale.write_bytes(b"\0" * 1024)
    time.sleep(0.01)
    result = invoke("train", "--resume", run_copy, "--no-progress")
    assert result.exit_code == 0, result.output
    assert not stale.exists() and not (run_copy / ".lock.pid").exists()
