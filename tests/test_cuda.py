"""On a CUDA device only (`pytest -m cuda`; skipped elsewhere): the trainer's CUDA path (bf16
autocast, TF32, compile, checkpoint and resume), the OUROBOROS bases on the GPU, the random
initial state drawn on the device."""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch

from synthlab.cli.train import resolve_run_config
from synthlab.evaluation.evaluate import evaluate_run
from synthlab.models.recurrence import initial_state
from synthlab.training.run_folders import load_checkpoint
from synthlab.training.trainer import train
from synthlab_generators import TASKS, write_dataset

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def mano_data(tmp_path_factory):
    spec = TASKS["mano"]
    return write_dataset(
        spec, spec.params_cls(L=2, n_train=400, n_test=40, mod=5), 0, tmp_path_factory.mktemp("d") / "mano"
    )


def _run(data, **train):
    model = {
        "d_model": 64,
        "n_heads": 4,
        "max_seq_len": 32,
        "loops": 2,
        "exit_gate": True,
        "topology": "sandwich",
        "n_layers": 3,
        "n_prelude": 1,
        "n_coda": 1,
        "state_init": "normal",
        "injection": "concat",
    }
    train = {
        "steps": 12,
        "batch_size": 16,
        "lr": 3e-3,
        "warmup_steps": 2,
        "log_every": 1,
        "checkpoint_every": 5,
        "device": "auto",
        **train,
    }
    return resolve_run_config({}, model, {"task": "mano", "data": str(data), **train})


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_cuda_training_interrupts_resumes_and_evaluates(tmp_path, mano_data, monkeypatch):
    straight = train(tmp_path / "straight", _run(mano_data), progress=False)
    assert json.loads((tmp_path / "straight" / "config.json").read_text())["derived"]["device"] == "cuda"
    assert straight.step == 12 and math.isfinite(straight.final_loss)
    calls = {"n": 0}
    original = train.__globals__["Batcher"].next_batch

    def next_batch_then_signal(self):
        calls["n"] += 1
        if calls["n"] == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(train.__globals__["Batcher"], "next_batch", next_batch_then_signal)
    assert train(tmp_path / "resumed", _run(mano_data), progress=False).step == 7
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "resumed")["cuda_rng"] is not None
    assert train(tmp_path / "resumed", None, progress=False).step == 12
    # same data, draws and schedule; CUDA kernels are not bit-reproducible, so: close
    assert _losses(tmp_path / "resumed") == pytest.approx(_losses(tmp_path / "straight"), rel=0.05)
    stage2 = train(
        tmp_path / "stage2",
        _run(mano_data, loss="ouro_stage2", init_from=str(tmp_path / "straight"), steps=4),
        progress=False,
    )
    assert math.isfinite(stage2.final_loss)  # F.binary_cross_entropy would fail here under CUDA autocast
    result = evaluate_run(tmp_path / "stage2", exit_rule="q:0.8", kv="mean", device="cuda")
    assert 0 <= result["exit_accuracy"] <= 1 and 0 <= result["kv_accuracy"] <= 1


def test_cuda_compiled_training_step(tmp_path, mano_data):
    result = train(tmp_path / "compiled", _run(mano_data, steps=3, compile=True), progress=False)
    assert result.step == 3 and math.isfinite(result.final_loss)


def test_tf32_is_on_during_cuda_training_and_restored(tmp_path, mano_data, monkeypatch):
    seen = []
    original = train.__globals__["_loop"]

    def loop(*args, **kwargs):
        seen.append(torch.get_float32_matmul_precision())
        return original(*args, **kwargs)

    monkeypatch.setitem(train.__globals__, "_loop", loop)
    before = torch.get_float32_matmul_precision()
    train(tmp_path / "on", _run(mano_data, steps=1), progress=False)
    train(tmp_path / "off", _run(mano_data, steps=1, tf32=False), progress=False)
    assert seen == ["high", "highest"] and torch.get_float32_matmul_precision() == before


def test_normal_initial_state_is_drawn_on_the_gpu_reproducibly():
    e = torch.zeros(2, 3, 8, device="cuda", dtype=torch.bfloat16)
    a = initial_state("normal", e, 1.0, torch.Generator().manual_seed(5))
    b = initial_state("normal", e, 1.0, torch.Generator().manual_seed(5))
    assert a.device.type == "cuda" and torch.equal(a, b) and a.float().std() > 0.5


def test_ouroboros_bases_on_the_gpu():
    transformers = pytest.importorskip("transformers")
    from synthlab.ouroboros import OuroborosConfig, OuroborosLM, lm_loss

    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    base = transformers.Qwen2ForCausalLM(config).to("cuda", torch.bfloat16).eval().requires_grad_(False)
    model = OuroborosLM(base, OuroborosConfig(max_steps=4), torch.Generator().manual_seed(0))
    ids = torch.randint(0, 64, (2, 16), device="cuda")
    loss = lm_loss(model(ids, 3), ids)
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
