"""Weights & Biases logging (`train.wandb`), run in wandb's offline mode (no network): the W&B run
gets the run's config and every metrics.jsonl record at its step; without the package it is one error line and nothing is written."""

from __future__ import annotations

import json
import sys

import pytest

from synthlab.errors import SynthlabError
from synthlab.training.trainer import train
from tests.test_curves import _tiny  # one tiny mano run config, as the TensorBoard tests use


def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


def test_offline_run_gets_every_record(mano, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    _offline(monkeypatch, tmp_path)
    logged = []
    real_log = wandb.Run.log
    monkeypatch.setattr(
        wandb.Run,
        "log",
        lambda self, data, step=None, **kw: (logged.append((step, data)), real_log(self, data, step=step, **kw)),
    )
    run = tmp_path / "run"
    train(run, _tiny(mano, wandb="synthlab-test"), progress=False)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [step for step, _ in logged] == [r["step"] for r in records] == [2, 4]
    for (_, data), record in zip(logged, records):
        assert data["loss"] == record["loss"] and data["loss_per_step/2"] == record["loss_per_step"][1]
        assert set(data) == {k for k in record if k != "step" and not isinstance(record[k], list)} | {
            f"loss_per_step/{t}" for t in (1, 2)
        }
    run_id = (run / "wandb_id").read_text().strip()
    (folder,) = (run / "wandb").glob(f"offline-run-*-{run_id}")
    written = (folder / f"run-{run_id}.wandb").read_bytes()  # wandb's record log, values as JSON text
    for record in records:
        assert json.dumps(record["loss"]).encode() in written and b"loss_per_step/2" in written
    assert b"synthlab-test" in written and b"d_model" in written  # the project, the run's config


def test_without_the_package_is_one_line_and_writes_nothing(mano, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    with pytest.raises(
        SynthlabError, match=r"^train.logging.wandb needs the wandb package: pip install 'synthlab\[wandb\]'$"
    ):
        train(tmp_path / "run", _tiny(mano, wandb="p"), progress=False)
    assert not (tmp_path / "run").exists()
