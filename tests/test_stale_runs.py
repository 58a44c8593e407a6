"""A sweep point reuses or resumes its run folder only when the folder was trained with the point's
configuration: a changed default or definition keeps the point's id, so the folder is checked."""

from __future__ import annotations

import dataclasses

import pytest

from synthlab.cli.train import resolve_run_config
from synthlab.errors import SynthlabError
from synthlab.models import ModelConfig
from synthlab.sweeps.lab_runner import _train_or_resume


@pytest.fixture(scope="module")
def run(mano):
    return resolve_run_config(
        {},
        {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_seq_len": 32, "init": "torch", "init_std": 0.02},
        {"task": "mano", "data": str(mano), "steps": 3, "batch_size": 8, "warmup_steps": 1},
    )


def test_the_same_configuration_is_reused_and_a_changed_one_is_refused(run, tmp_path):
    folder = tmp_path / "model"
    assert _train_or_resume(folder, lambda: run) is False  # trained
    assert _train_or_resume(folder, lambda: run) is True  # reused
    quieter = dataclasses.replace(run, train=run.train.replaced(log_every=1, checkpoint_every=7))
    assert _train_or_resume(folder, lambda: quieter) is True  # logging and checkpointing change no number
    faster = dataclasses.replace(run, train=run.train.replaced(lr=run.train.optim.lr * 2))
    with pytest.raises(SynthlabError, match=r"trained with another configuration .*train\.optim\.lr"):
        _train_or_resume(folder, lambda: faster)
    wider = dataclasses.replace(run, model=dataclasses.replace(run.model, d_model=64, n_heads=2))
    with pytest.raises(SynthlabError, match=r"model\.d_model 32 -> 64"):
        _train_or_resume(folder, lambda: wider)


def test_a_started_run_is_checked_before_it_resumes(run, tmp_path):
    folder = tmp_path / "model"
    _train_or_resume(folder, lambda: run)
    (folder / "summary.json").unlink()  # as if stopped before the end: the next call resumes
    changed = dataclasses.replace(run, train=run.train.replaced(warmup_steps=2))
    with pytest.raises(SynthlabError, match=r"train\.schedule\.warmup_steps 1 -> 2"):
        _train_or_resume(folder, lambda: changed)


def test_init_std_compares_by_the_scales_the_model_uses():
    torch_init = ModelConfig(vocab_size=10, d_model=128, n_heads=4, init="torch", init_std=0.02)
    assert torch_init.as_built() == dataclasses.replace(torch_init, init_std=None).as_built()  # 0.02 either way
    gpt2 = dataclasses.replace(torch_init, init="gpt2")
    assert gpt2.as_built() != dataclasses.replace(gpt2, init_std=None).as_built()  # 0.02 vs 0.049 at d = 128
    assert dataclasses.replace(gpt2, init_std=None).as_built()["weight_std"] == pytest.approx(0.02 * (768 / 128) ** 0.5)
