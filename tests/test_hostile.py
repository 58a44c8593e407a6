"""Hostile and unlucky files: a crafted pickle in every load path runs nothing, an --out that holds
someone else's data is never replaced, an edited dataset is detected, a cut-off append does not
block a resume, damaged files fall back or end in one `error:` line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.runs import checkpoint_files
from synthlab.files import sha256_file
from synthlab_generators import TASKS, write_dataset

runner = CliRunner()
EXPORTABLE = ["--d-model", 32, "--n-heads", 2, "--n-layers", 1, "--max-seq-len", 128, "--mlp", "swiglu",
              "--batch-size", 4, "--device", "cpu", "--no-progress", "--threads", 1]


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
    result = invoke("train", "--data", bios, "--out", run, "--steps", 2, "--checkpoint-every", 1, "--log-every", 1,
                    *EXPORTABLE)
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture
def run_copy(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


class _Payload:
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
        torch.save({**real, "extra": _Payload(marker)}, path)
        if path.name != "checkpoint.pt":
            path.with_name(path.name + ".sha256").write_text(sha256_file(path) + "\n")


# --- code from files ----------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["resume", "init-from", "eval", "capacity", "export"])
def test_a_crafted_checkpoint_is_refused_in_every_load_path(command, run_copy, bios, tmp_path):
    marker = tmp_path / "marker"
    plant_crafted_checkpoints(run_copy, marker)
    args = {
        "resume": ["train", "--resume", run_copy, "--no-progress"],
        "init-from": ["train", "--data", bios, "--out", tmp_path / "new", "--steps", 1, "--init-from", run_copy,
                      *EXPORTABLE],
        "eval": ["eval", run_copy, "--device", "cpu", "--threads", 1],
        "capacity": ["capacity", run_copy, "--device", "cpu"],
        "export": ["export", run_copy, "--out", tmp_path / "hf"],
    }[command]
    one_error_line(invoke(*args), "refused")
    assert not marker.exists()
    assert not (tmp_path / "new").exists() and not (tmp_path / "hf").exists()


def test_the_labs_own_checkpoints_load_with_weights_only(trained):
    ckpt = torch.load(trained / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 2 and {"model", "optimizer", "scheduler", "batcher", "torch_rng"} <= ckpt.keys()


def test_a_crafted_newest_checkpoint_falls_back_to_an_intact_older_one(run_copy, tmp_path):
    marker = tmp_path / "marker"
    (run_copy / "model.safetensors").unlink()
    newest = checkpoint_files(run_copy)[0]
    torch.save({**torch.load(newest, weights_only=True), "extra": _Payload(marker)}, newest)
    newest.with_name(newest.name + ".sha256").unlink()
    result = invoke("eval", run_copy, "--device", "cpu", "--threads", 1)
    assert result.exit_code == 0 and "refused" in result.output and "checkpoint-1.pt" in result.output, result.output
    assert not marker.exists()


@pytest.fixture(scope="module")
def qwen2_base(tmp_path_factory):
    """A 4-layer random Qwen2 with a WordLevel tokenizer and a small corpus beside it."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("qwen2")
    words = "the a cat dog sat ran on under mat log .".split()
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(folder)
    config = transformers.Qwen2Config(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                                      tie_word_embeddings=True)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    docs = [" ".join(words[(i + j) % len(words)] for j in range(30)) for i in range(40)]
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return folder


def ouroboros_train(base: Path, out: Path, *extra):
    return invoke("ouroboros", "train", "--base", base, "--corpus", base / "train.jsonl", "--out", out,
                  "--variants", "static", "--steps", 2, "--seq-len", 8, "--batch-size", 4, "--grad-accum", 1,
                  "--depths", "1,2", "--max-steps", 2, *extra)


def test_a_crafted_or_cut_ouroboros_state_is_one_error_line(qwen2_base, tmp_path):
    run = tmp_path / "run"
    assert ouroboros_train(qwen2_base, run).exit_code == 0
    (run / "static" / "train_log.csv").unlink()  # as if stopped after a checkpoint
    marker, state = tmp_path / "marker", run / "static" / "state.pt"
    torch.save({"step": 1, "extra": _Payload(marker)}, state)
    one_error_line(ouroboros_train(qwen2_base, run), state, "refused")
    assert not marker.exists()
    state.write_bytes(b"PK\x03\x04 cut")
    one_error_line(ouroboros_train(qwen2_base, run), state, "damaged")


# --- folders replaced ---------------------------------------------------------------------------

def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_never_replaces_the_run_the_working_directory_or_a_folder_holding_them(run_copy, tmp_path,
                                                                                          monkeypatch):
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
    from synthlab.hf import export

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
        one_error_line(invoke("gen", "mano", "--L", 2, "--n-train", 10, "--n-test", 2, "--out", out, "--overwrite"),
                       "working directory")
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
    from synthlab import data as datalib

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
    assert [(r["step"], r["loss"]) for r in records] == [(r["step"], r["loss"]) for r in map(json.loads, whole.splitlines())]


def test_a_damaged_metrics_line_before_the_last_is_one_error_line(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(["{garbage", *lines]) + "\n")
    one_error_line(invoke("curves", run, "--out", tmp_path / "fig"), "metrics.jsonl:1")
