"""Hostile and unlucky OUROBOROS files and failures: a crafted or cut training state is one
`error:` line and runs nothing, a failed run does not block the corrected command, bad values and
a base that is not Qwen2 are refused before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_hostile import CraftedPickle, invoke, one_error_line
from tests.tiny_qwen2 import save_checkpoint


@pytest.fixture(scope="module")
def qwen2_base(tmp_path_factory):
    """A 4-layer random Qwen2 with a WordLevel tokenizer and a small corpus beside it."""
    pytest.importorskip("transformers")
    words = "the a cat dog sat ran on under mat log .".split()
    docs = [" ".join(words[(i + j) % len(words)] for j in range(30)) for i in range(40)]
    shape = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 4, "num_attention_heads": 2}
    return save_checkpoint(
        tmp_path_factory.mktemp("qwen2"),
        words,
        docs,
        vocab_size=16,
        num_key_value_heads=2,
        max_position_embeddings=32,
        initializer_range=0.02,
        **shape,
    )


def ouroboros_train(base: Path, out: Path, *extra):
    return invoke(
        "ouroboros",
        "train",
        "--base",
        base,
        "--corpus",
        base / "train.jsonl",
        "--out",
        out,
        "--variants",
        "static",
        "--steps",
        2,
        "--seq-len",
        8,
        "--micro-batch-size",
        4,
        "--grad-accum",
        1,
        "--depths",
        "1,2",
        "--max-steps",
        2,
        *extra,
    )


def test_a_crafted_or_cut_ouroboros_state_is_one_error_line(qwen2_base, tmp_path):
    run = tmp_path / "run"
    assert ouroboros_train(qwen2_base, run).exit_code == 0
    (run / "static" / "train_log.csv").unlink()  # as if stopped after a checkpoint
    marker, state = tmp_path / "marker", run / "static" / "state.pt"
    torch.save({"step": 1, "extra": CraftedPickle(marker)}, state)
    one_error_line(ouroboros_train(qwen2_base, run), state, "refused")
    assert not marker.exists()
    state.write_bytes(b"PK\x03\x04 cut")
    one_error_line(ouroboros_train(qwen2_base, run), state, "damaged")


def test_a_failed_ouroboros_train_does_not_block_the_corrected_command(qwen2_base, tmp_path, monkeypatch):
    from synthlab.ouroboros import runs

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(runs, "train", out_of_memory)
        one_error_line(ouroboros_train(qwen2_base, run, "--lr", 1), "out of memory")
    assert (run / "run.json").is_file()
    result = ouroboros_train(qwen2_base, run)  # another lr: another run.json
    assert result.exit_code == 0, result.output
    assert (run / "static" / "train_log.csv").is_file()


def test_ouroboros_refuses_nan_lr_naming_lr(qwen2_base, tmp_path):
    one_error_line(ouroboros_train(qwen2_base, tmp_path / "run", "--lr", "nan"), "lr must be a finite number")
    assert not (tmp_path / "run").exists()


def test_ouroboros_build_on_a_non_qwen2_config_is_one_error_line(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(
        num_hidden_layers=4, hidden_size=32, num_attention_heads=2, intermediate_size=64
    ).to_json_file(tmp_path / "llama.json")
    one_error_line(
        invoke("ouroboros", "build", "--base-config", tmp_path / "llama.json", "--out", tmp_path / "b"), "llama"
    )
    assert not (tmp_path / "b").exists()
