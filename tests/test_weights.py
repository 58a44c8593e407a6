"""Shareable weights and portable run folders: model.safetensors beside config.json, loaded with
one call (`synthlab.load_model`); a copied run folder evaluates from anywhere; a moved or
regenerated dataset is found (--data) or refused with one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import synthlab
from synthlab.cli.train import resolve_run_config
from synthlab.errors import SynthlabError
from synthlab.evaluation.evaluate import evaluate_run
from synthlab.training.run_folders import load_checkpoint
from synthlab.training.trainer import train
from synthlab_generators import TASKS, write_dataset

MANO = {"L": 2, "n_train": 200, "n_test": 20, "mod": 5}


def _data(path, seed=0):
    spec = TASKS["mano"]
    return write_dataset(spec, spec.params_cls(**MANO), seed, path)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(run folder, data folder) of a finished tiny mano run; tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("weights")
    data = _data(root / "data")
    run = resolve_run_config(
        {},
        {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_seq_len": 32, "loops": 2},
        {"task": "mano", "data": str(data), "steps": 6, "batch_size": 8, "log_every": 2},
    )
    train(root / "run", run, progress=False)
    return root / "run", data


def test_weights_are_the_checkpoints_and_load_in_one_call(finished, tmp_path):
    run_dir, _ = finished
    assert (run_dir / "model.safetensors").is_file() and (run_dir / "config.json").is_file()
    saved, ckpt = load_file(str(run_dir / "model.safetensors")), load_checkpoint(run_dir)["model"]
    assert saved and set(saved) <= set(ckpt)  # tied tensors are stored once
    for name, tensor in saved.items():
        assert torch.equal(tensor, ckpt[name]), name

    copy = tmp_path / "elsewhere" / "run"
    shutil.copytree(run_dir, copy)
    (copy / "checkpoint.pt").unlink()  # the weights alone are enough
    model = synthlab.load_model(copy)
    assert not model.training
    loaded = model.state_dict()
    assert set(loaded) == set(ckpt) and all(torch.equal(loaded[k], ckpt[k]) for k in ckpt)


def test_importing_synthlab_stays_free_of_torch():
    code = "import sys, synthlab; print('torch' in sys.modules, callable(synthlab.load_model), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "True"]


def test_a_copied_run_evaluates_from_anywhere(finished, tmp_path, monkeypatch):
    run_dir, data = finished
    config = json.loads((run_dir / "config.json").read_text())
    assert (
        config["derived"]["data_sha256"]["train.jsonl"]
        == json.loads((data / "meta.json").read_text())["files"]["train.jsonl"]["sha256"]
    )
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    monkeypatch.chdir(tmp_path)
    result = evaluate_run(copy)
    assert result["n_examples"] == MANO["n_test"]


def test_a_moved_or_regenerated_dataset_is_found_or_refused(finished, tmp_path):
    run_dir, data = finished
    moved_data = tmp_path / "moved"
    shutil.copytree(data, moved_data)
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    config = json.loads((run / "config.json").read_text())
    config["train"]["data"] = str(tmp_path / "gone")
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(SynthlabError, match="which is gone.*--data"):
        evaluate_run(run)
    assert evaluate_run(run, data_dir=moved_data)["n_examples"] == MANO["n_test"]

    config["train"]["data"] = str(_data(tmp_path / "other", seed=1))  # same params, another draw
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(SynthlabError, match="not the dataset run .* was trained on"):
        evaluate_run(run)
    with pytest.raises(SynthlabError, match="not the dataset"):
        train(run, data=tmp_path / "other")
    assert train(run, data=moved_data, progress=False).step == 6  # resumed a finished run from the moved dataset
