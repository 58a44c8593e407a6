"""Activation checkpointing per recurrent step (`train.activation_checkpointing`): the same loss
and gradients as without, less saved activation memory, and the trainer runs with it."""

from __future__ import annotations

import pytest
import torch
from test_train import datasets, losses_of, run_config  # noqa: F401  (datasets is a fixture)

from synthlab.models import ModelConfig, build_model
from synthlab.training.run_folders import load_checkpoint
from synthlab.training.trainer import train

LOOPED = dict(
    vocab_size=17,
    d_model=32,
    n_heads=2,
    n_layers=3,
    topology="sandwich",
    n_prelude=1,
    n_coda=1,
    loops=4,
    injection="concat",
    state_init="normal",
    controller="controller",
    recurrence_gate=True,
    exit_gate=True,
    dropout=0.1,
    max_seq_len=16,
)


def _loss_and_grads(model, idx, doc_ids, checkpoint):
    torch.manual_seed(3)  # dropout's draws; checkpointing replays them in the recomputation
    out = model(idx, doc_ids=doc_ids, generator=torch.Generator().manual_seed(5), checkpoint=checkpoint)
    loss = (out.step_logits.float().logsumexp(-1) * out.exit_probs).mean()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"backprop_last_k": 2},
        {"topology": "ouro", "n_prelude": 0, "n_coda": 0, "injection": "none", "state_init": "input"},
    ],
)
def test_checkpointed_steps_give_the_same_loss_and_gradients(extra):
    model = build_model(ModelConfig(**{**LOOPED, **extra}), seed=1).train()
    idx = torch.randint(0, 17, (3, 12), generator=torch.Generator().manual_seed(0))
    doc_ids = torch.tensor([[0] * 5 + [1] * 7] * 3)
    loss, grads = _loss_and_grads(model, idx, doc_ids, checkpoint=False)
    loss_ckpt, grads_ckpt = _loss_and_grads(model, idx, doc_ids, checkpoint=True)
    assert torch.allclose(loss, loss_ckpt, rtol=0, atol=1e-6)
    assert grads.keys() == grads_ckpt.keys() and len(grads) > 10
    for name in grads:
        assert torch.allclose(grads[name], grads_ckpt[name], rtol=1e-5, atol=1e-7), name


def saved_bytes(model, idx, **forward) -> int:
    """Bytes of the tensors autograd saves for the backward pass of one forward (each storage once)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, **forward)
    return sum(storages.values())


def test_checkpointing_keeps_one_state_per_step_instead_of_the_steps_activations():
    config = dict(vocab_size=17, d_model=32, n_heads=2, n_layers=1, max_seq_len=64)
    idx = torch.randint(0, 17, (2, 64), generator=torch.Generator().manual_seed(0))
    per_step = {}
    for checkpoint in (False, True):
        b2, b6 = (
            saved_bytes(
                build_model(ModelConfig(**config, loops=T)).train(), idx, all_steps=False, checkpoint=checkpoint
            )
            for T in (2, 6)
        )
        per_step[checkpoint] = (b6 - b2) / 4  # what one more recurrent step adds
    state = 2 * 64 * 32 * 4  # the step's input h (B, S, D), float32
    assert per_step[True] == state
    assert per_step[False] > 8 * state  # a step's activations: many tensors of (B, S, D) or larger


def test_trainer_with_checkpointing_matches_the_plain_run(tmp_path, datasets):
    runs = {}
    for on in (False, True):
        runs[on] = tmp_path / f"ckpt{on}"
        train(
            runs[on],
            run_config(
                datasets("bios"), "bios", {"loops": 3}, steps=4, loss="mean", device="cpu", activation_checkpointing=on
            ),
            progress=False,
        )
    plain, ckpt = (load_checkpoint(runs[on])["model"] for on in (False, True))
    for name in plain:
        assert torch.allclose(plain[name], ckpt[name], rtol=0, atol=1e-6), name
    for a, b in zip(losses_of(runs[False]), losses_of(runs[True]), strict=True):
        assert a == pytest.approx(b, abs=1e-6)
