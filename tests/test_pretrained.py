"""save_pretrained / from_pretrained: a folder with config.json + model.safetensors gives back the
same model (same logits); a finished run folder loads the same way as synthlab.load_model; files
are readable by others (0644 under umask 022), nothing the lab did not write is replaced."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

import synthlab
from synthlab.errors import SynthlabError
from synthlab.models import LoopedGPT, ModelConfig, build_model
from synthlab.training.configs import TrainConfig
from synthlab.training.run_folders import RunConfig

CONFIG = ModelConfig(
    vocab_size=40, d_model=32, n_heads=4, n_layers=2, loops=3, max_seq_len=32, tie_head=False, exit_gate=True
)


def _perturbed(config: ModelConfig):
    model = build_model(config, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_round_trip_gives_the_same_logits_and_readable_files(tmp_path):
    model = _perturbed(CONFIG)
    previous = os.umask(0o022)
    try:
        model.save_pretrained(tmp_path / "m")
    finally:
        os.umask(previous)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert {_mode(p) for p in (tmp_path / "m").iterdir()} == {0o644}
    loaded = LoopedGPT.from_pretrained(tmp_path / "m")
    assert loaded.config == CONFIG and not loaded.training
    ids = torch.randint(0, 40, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, theirs = model(ids), loaded(ids)
    assert torch.equal(ours.step_logits, theirs.step_logits) and torch.equal(ours.exit_probs, theirs.exit_probs)
    fresh = build_model(CONFIG, seed=0).eval()
    with torch.no_grad():
        assert not torch.equal(fresh(ids).logits, ours.logits)  # the weights, not the init, came back
    model.save_pretrained(tmp_path / "m")  # its own folder: replaced


def test_a_finished_run_loads_like_load_model(tmp_path, mano):
    from synthlab.training.trainer import train

    config = RunConfig(
        ModelConfig(vocab_size=14, d_model=16, n_heads=2, n_layers=1, loops=2, max_seq_len=64),
        TrainConfig.flat(task="mano", data=str(mano), steps=2, batch_size=4, seq_len=64, warmup_steps=1),
    )
    train(tmp_path / "run", config, progress=False)
    assert _mode(tmp_path / "run" / "model.safetensors") == _mode(tmp_path / "run" / "config.json")
    ids = torch.randint(0, 14, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(
            LoopedGPT.from_pretrained(tmp_path / "run")(ids).logits, synthlab.load_model(tmp_path / "run")(ids).logits
        )


def test_refusals_are_one_line(tmp_path):
    model = _perturbed(CONFIG)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {}, "train": {}}))
    with pytest.raises(SynthlabError, match="is a training run"):
        model.save_pretrained(run)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(SynthlabError, match="architectures"):
        model.save_pretrained(tmp_path / "other")
    assert json.loads((tmp_path / "other" / "config.json").read_text()) == {"architectures": ["BertModel"]}
    with pytest.raises(SynthlabError, match="has no config.json"):
        LoopedGPT.from_pretrained(tmp_path / "nothing")
    with pytest.raises(SynthlabError, match="unfinished run"):
        LoopedGPT.from_pretrained(run)
