"""No file the lab did not write is replaced or deleted: OUROBOROS `build` / `train` into a user's
folder, the working directory or another command's run; temporary-file cleanup on resume; a
sweep's --out holding a table it did not write. Each case is a hostile folder in tmp_path."""

from __future__ import annotations

import json

import pytest
from test_ouroboros import checkpoint  # noqa: F401  (the tiny Qwen2 fixture)
from test_reliability import FAKE, TINY, invoke, one_error_line

from synthlab.files import folder_lock

SMALL_RUN = [
    "--steps",
    1,
    "--seq-len",
    16,
    "--micro-batch-size",
    4,
    "--grad-accum",
    1,
    "--depths",
    "1,2",
    "--max-steps",
    4,
]


def ouroboros_train(checkpoint, out, *extra):
    corpus = checkpoint / "train.jsonl"
    return invoke(
        "ouroboros", "train", "--base", checkpoint, "--corpus", corpus, "--out", out, "--variants", "static",
        *SMALL_RUN, *extra,
    )  # fmt: skip


def test_ouroboros_train_never_replaces_a_users_run_json(checkpoint, tmp_path):  # noqa: F811
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "run.json").write_text('{"my": "own notes"}\n')
    one_error_line(ouroboros_train(checkpoint, folder), str(folder), "--overwrite")
    assert (folder / "run.json").read_text() == '{"my": "own notes"}\n'
    assert sorted(p.name for p in folder.iterdir()) == ["run.json"]


def test_ouroboros_train_refuses_the_working_directory(checkpoint, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.json").write_text("{}\n")
    for out in (".", tmp_path):
        one_error_line(ouroboros_train(checkpoint, out, "--overwrite"), "working directory")
    assert (tmp_path / "run.json").read_text() == "{}\n"


def test_ouroboros_train_resumes_its_own_run_and_overwrite_writes_into_a_users_folder(checkpoint, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    assert ouroboros_train(checkpoint, run).exit_code == 0
    (run / "notes.txt").write_text("mine\n")  # a file of the user's beside the run: the rerun resumes
    result = ouroboros_train(checkpoint, run)
    assert result.exit_code == 0, result.output
    assert (run / "notes.txt").read_text() == "mine\n"
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "draft.txt").write_text("x\n")
    result = ouroboros_train(checkpoint, folder, "--overwrite")
    assert result.exit_code == 0, result.output
    assert (folder / "draft.txt").read_text() == "x\n" and (folder / "static" / "train_log.csv").is_file()


def _training_run(folder):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": {}, "train": {}, "derived": {}}) + "\n")
    (folder / "summary.json").write_text('{"final_loss": 1.5}\n')


def test_gen_overwrite_replaces_a_dataset_never_another_commands_output(tmp_path):
    run = tmp_path / "trained"
    _training_run(run)
    for extra in ([], ["--overwrite"]):
        one_error_line(
            invoke("gen", "mano", "--L", 2, "--out", run, *extra), "training run", "not this command's output"
        )
    assert (run / "summary.json").read_text() == '{"final_loss": 1.5}\n'
    data = tmp_path / "data"
    for extra in ([], ["--overwrite"]):  # its own earlier output, with --overwrite
        result = invoke("gen", "mano", "--L", 2, "--n-train", 50, "--n-test", 10, "--out", data, *extra)
        assert result.exit_code == 0, result.output
    one_error_line(invoke("gen", "mano", "--L", 2, "--out", data), "--overwrite")


def test_ouroboros_build_never_writes_into_another_commands_run(checkpoint, tmp_path):  # noqa: F811
    run = tmp_path / "trained"
    _training_run(run)
    base_config = ["--base-config", checkpoint / "config.json"]
    for extra in ([], ["--overwrite"]):
        one_error_line(invoke("ouroboros", "build", *base_config, "--out", run, *extra), "training run")
    assert (run / "summary.json").read_text() == '{"final_loss": 1.5}\n'
    user = tmp_path / "user"
    user.mkdir()
    (user / "summary.json").write_text("my summary\n")
    one_error_line(invoke("ouroboros", "build", *base_config, "--out", user), "--overwrite")
    assert (user / "summary.json").read_text() == "my summary\n"
    built = tmp_path / "built"
    for _ in range(2):  # its own earlier output is replaced
        result = invoke("ouroboros", "build", *base_config, "--out", built)
        assert result.exit_code == 0, result.output
    one_error_line(ouroboros_train(checkpoint, built, "--overwrite"), "OUROBOROS build")


def test_resume_cleanup_removes_only_the_labs_own_stale_temporaries(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    users = [".notes.tmp.txt", ".tmp", ".a.tmp", ".draft.12.tmpl", ".x.notanumber.tmp.pt"]
    for name in users:
        (folder / name).write_text("mine\n")
    stale = folder / ".checkpoint-3.999999999.tmp.pt"  # a writer killed mid-write: no such process
    stale.write_text("half\n")
    with folder_lock(folder, "training"):
        pass
    assert not stale.exists()
    assert all((folder / name).read_text() == "mine\n" for name in users)


def test_train_resume_keeps_a_users_file_named_like_a_temporary(tmp_path, mano):
    run = tmp_path / "run"
    assert invoke("train", "--data", mano, "--out", run, "--steps", 2, *TINY).exit_code == 0
    (run / ".notes.tmp.txt").write_text("mine\n")
    result = invoke("train", "--resume", run, "--no-progress")
    assert result.exit_code == 0, result.output
    assert (run / ".notes.tmp.txt").read_text() == "mine\n"


def test_a_sweep_refuses_an_out_holding_a_table_it_did_not_write(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE.parent.parent))
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "results.csv").write_text("name,score\nalice,3\n")
    for args in ([], ["--dry-run"]):
        result = invoke("sweep", FAKE, "--runner", "sweep_fake_runner", "--out", out, *args)
        one_error_line(result, "results.csv", "point_id")
    assert sorted(p.name for p in out.iterdir()) == ["results.csv"]
    assert (out / "results.csv").read_text() == "name,score\nalice,3\n"


@pytest.mark.parametrize("seeds", [10**9, 200_000])
def test_huge_seed_counts_are_refused_before_any_point_is_built(tmp_path, monkeypatch, seeds):
    monkeypatch.syspath_prepend(str(FAKE.parent.parent))
    result = invoke(
        "sweep", FAKE, "--runner", "sweep_fake_runner", "--out", tmp_path / "s", "--seeds", seeds, "--dry-run"
    )
    one_error_line(result, "--seeds")
    assert not (tmp_path / "s").exists()


def test_a_huge_grid_or_seed_count_in_a_definition_is_refused_in_seconds(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE.parent.parent))
    text = FAKE.read_text().replace('name = "sweep_fake"', 'name = "huge"')
    axis = "[" + ", ".join(str(i) for i in range(1000)) + "]"
    grids = {
        "grid": text + f'\n[presets.huge.grid]\n"data.size" = {axis}\n"model.width" = {axis}\n"eval.probe" = {axis}\n',
        "seeds": text + "\n[presets.huge]\nseeds = 1000000000\n",
    }
    for name, definition in grids.items():
        path = tmp_path / name / "huge.toml"
        path.parent.mkdir()
        path.write_text(definition)
        result = invoke(
            "sweep", path, "--preset", "huge", "--runner", "sweep_fake_runner", "--out", tmp_path / "s", "--dry-run"
        )
        one_error_line(result, "presets.huge", "100,000")
