"""Gradient accumulation (`train.batch.grad_accum`): micro-batches add up to exactly one big batch."""

from __future__ import annotations

import pytest
import torch
from test_train import datasets, losses_of, run_config  # noqa: F401  (datasets is a fixture)

from synthlab.errors import SynthlabError
from synthlab.training.configs import TrainConfig
from synthlab.training.run_folders import load_checkpoint
from synthlab.training.trainer import train


@pytest.mark.parametrize(
    "task,model,loss",
    [
        ("mano", {}, "last"),
        ("bios", {"loops": 2}, "mean"),  # packed rows: micro-batches hold different numbers of targets
        ("mano", {"loops": 2, "exit_gate": True}, "ouro"),
    ],
)
def test_accumulated_micro_batches_equal_one_batch(tmp_path, datasets, task, model, loss):
    runs = {}
    for accum in (1, 4):
        runs[accum] = tmp_path / f"accum{accum}"
        train(
            runs[accum],
            run_config(datasets(task), task, model, steps=5, loss=loss, grad_accum=accum, device="cpu"),
            progress=False,
        )
    one, four = (load_checkpoint(runs[a])["model"] for a in (1, 4))
    assert one.keys() == four.keys()
    for name in one:  # fp32 summation order differs; Adam scales it up on rows with tiny gradients
        # (bioS with the subject-first templates: 1.4e-6 after 5 steps, a 5e-4 share of one lr 3e-3 step)
        assert torch.allclose(one[name], four[name], rtol=0, atol=1e-5), name
    for a, b in zip(losses_of(runs[1]), losses_of(runs[4]), strict=True):
        assert a == pytest.approx(b, abs=1e-6)


def test_accumulation_must_divide_the_batch():
    with pytest.raises(SynthlabError, match="grad_accum 3 must divide train.batch.batch_size 8"):
        TrainConfig.flat(batch_size=8, grad_accum=3, steps=1)
    with pytest.raises(SynthlabError, match="grad_accum must be >= 1"):
        TrainConfig.flat(grad_accum=0, steps=1)
