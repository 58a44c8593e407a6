"""What the lab's trainer computes on one batch: the batch on the device (`to_device`), the model's
forward as the trainer calls it (`model_forward`: compiled or not, activation checkpointing) and the
objective of `TrainConfig.loss` with the loss per recurrent step (`step_losses`)."""

from __future__ import annotations

import torch

from synthlab.data.datasets import Rows
from synthlab.models.layers import Block
from synthlab.models.losses import ouro_stage1_loss, ouro_stage2_loss, summed_loss, token_losses
from synthlab.training.configs import TrainConfig


def to_device(rows: Rows, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(inputs, targets, loss mask, doc ids or None) as tensors on `device`."""
    tensors = [torch.from_numpy(a).to(device, non_blocking=True) for a in (rows.inputs, rows.targets, rows.loss_mask)]
    doc_ids = None if rows.doc_ids is None else torch.from_numpy(rows.doc_ids).to(device, non_blocking=True)
    return (*tensors, doc_ids)


def model_forward(model: torch.nn.Module, compile: bool = False, checkpoint: bool = False):
    """A function (inputs, doc_ids, generator, all_steps) -> (step_logits, exit p(t), exit lambda_t);
    the last two are None without the exit gate. checkpoint: activation checkpointing per step.

    Returning only these keeps torch.compile away from the model output's `logits`, a view of
    `step_logits`: compiled graphs whose outputs alias each other fail at run time (torch 2.13).

    compile: the whole forward as one graph at a fixed depth. With step_sampling the depth is a
    host draw per step (from the CPU generator: no device sync), and a whole-forward graph would
    be traced again for every depth drawn (past torch's recompile limit it falls back to eager):
    then each decoder block is compiled on its own, once, and the loop over steps runs eagerly.
    """

    def forward(inputs, doc_ids, generator, all_steps):
        out = model(inputs, doc_ids=doc_ids, generator=generator, all_steps=all_steps, checkpoint=checkpoint)
        return out.step_logits, out.exit_probs, out.exit_lambdas

    if not compile:
        return forward
    if getattr(model, "module", model).config.step_sampling:  # model: the LoopedGPT or its DDP wrapper
        for block in model.modules():
            if isinstance(block, Block):
                block.compile()
        return forward
    return torch.compile(forward)


def step_losses(
    forward, inputs, targets, mask, doc_ids, cfg: TrainConfig, generator: torch.Generator, all_steps: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(objective to minimise, masked mean loss per recurrent step (T,)) for one batch.

    `forward` comes from `model_forward`. With the `last` objective the other steps' read-outs
    only serve the log, so they are computed on logging steps only (`all_steps`); off them per_step
    has one entry, the objective, computed without the per-position losses (`summed_loss`: the
    same gradients, the value within rounding of the logged form's).
    """
    all_steps = all_steps or cfg.loss != "last"
    step_logits, exit_probs, exit_lambdas = forward(inputs, doc_ids, generator, all_steps)
    # positions outside the mask (prompt tokens of Mano/QA, padding) get target -100: loss 0
    labels, count = targets.masked_fill(~mask, -100), mask.sum().clamp_min(1)
    if not all_steps:  # `last` off the logging steps: only the sum, the same gradient
        objective = summed_loss(step_logits[-1], labels) / count
        return objective, objective[None]
    losses = token_losses(step_logits, labels)  # (T, B, S) fp32
    per_step = losses.sum((1, 2)) / count  # (T,) masked means
    if cfg.loss == "last":
        return per_step[-1], per_step
    if cfg.loss == "mean":
        return per_step.mean(), per_step
    if cfg.loss == "ouro":
        return ouro_stage1_loss(losses, exit_probs.float(), mask, beta=cfg.entropy_beta), per_step
    return ouro_stage2_loss(losses, exit_lambdas.float(), mask), per_step
