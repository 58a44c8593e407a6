"""Losses over a position mask (all positions, or only answer tokens for Mano / QA).

Conventions: step_logits (T, B, S, V); targets (B, S) aligned with positions, targets[:, i] is
the token after position i (shifted once, by the caller), positions with target `ignore_index`
get loss 0; mask (B, S) bool or 0/1 selects the positions that count (None: all).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_losses(step_logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """(T, B, S, V), (B, S) -> (T, B, S) next-token cross-entropy in nats per step and position."""
    T, B, S, V = step_logits.shape
    losses = F.cross_entropy(
        step_logits.reshape(T * B * S, V).float(),
        targets.expand(T, B, S).reshape(-1),
        ignore_index=ignore_index,
        reduction="none",
    )
    return losses.view(T, B, S)


def summed_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """(B, S, V), (B, S) -> the sum of `token_losses` over the positions, without materialising
    them: the same gradient as token_losses(...).sum() (the same grad_output reaches every counted
    position), the value equal up to the rounding of the sum's order."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=ignore_index, reduction="sum"
    )


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of values (..., B, S) over the masked positions (and over any leading dims)."""
    if mask is None:
        return values.mean()
    weights = mask.to(values.dtype).expand_as(values)
    return (values * weights).sum() / weights.sum().clamp_min(1.0)


def last_step_loss(step_logits, targets, mask=None) -> torch.Tensor:
    """The last step's masked mean next-token loss (the usual LM loss for loops = 1)."""
    return masked_mean(token_losses(step_logits[-1:], targets)[0], mask)


def mean_step_loss(step_logits, targets, mask=None) -> torch.Tensor:
    """The mean over steps of the per-step masked mean losses."""
    return masked_mean(token_losses(step_logits, targets), mask)


def ouro_stage1_loss(
    step_losses: torch.Tensor, exit_probs: torch.Tensor, mask: torch.Tensor | None = None, beta: float = 0.1
) -> torch.Tensor:
    """Ouro stage I: per token sum_t p(t) L(t) - beta H(p), then the masked mean.

    step_losses (T, B, S) = token_losses(...); exit_probs (T, B, S) = p(t) from the model.
    H(p) = -sum_t p(t) log p(t), the entropy term (a KL to the uniform prior, up to a constant).
    """
    expected = (exit_probs * step_losses).sum(0)
    entropy = -(exit_probs * exit_probs.clamp_min(1e-12).log()).sum(0)
    return masked_mean(expected - beta * entropy, mask)


def ouro_stage2_loss(
    step_losses: torch.Tensor,
    exit_lambdas: torch.Tensor,
    mask: torch.Tensor | None = None,
    k: float = 50.0,
    tau: float = 0.005,
) -> torch.Tensor:
    """Ouro stage II (gate only, LM frozen): BCE of the continue probability 1 - lambda_t against
    w_t = sigmoid(k (max(0, L(t-1) - L(t)) - tau)), for t = 2..T, averaged over those T - 1 steps
    and the masked positions. The per-token losses are detached: they only make labels.
    (The Ouro paper writes the step average as 1/T_max; synthlab averages over the T - 1 steps t = 2..T it sums.)
    """
    if step_losses.shape[0] < 2:
        raise ValueError("stage II needs at least 2 steps")
    losses = step_losses.detach()
    improvement = (losses[:-1] - losses[1:]).clamp_min(0.0)  # (T-1, B, S): step t vs t-1
    w = torch.sigmoid(k * (improvement - tau))
    bce = F.binary_cross_entropy_with_logits(continue_logit(exit_lambdas[1:]), w.float(), reduction="none")
    return masked_mean(bce, mask)


def continue_logit(exit_lambdas: torch.Tensor) -> torch.Tensor:
    """The logit of the continue probability 1 - lambda, in float32: log(1 - lambda) - log(lambda).

    BCE-with-logits on it equals F.binary_cross_entropy(1 - lambda, w) in float32 (CUDA autocast
    rejects the latter; the logits form is allowed), and is more exact near lambda = 0, where
    1 - lambda rounds. Lambda is first clamped to [smallest normal float32, largest float32 below
    1]: a saturated gate (sigmoid's output is exactly 0 or 1, common in bf16) then gives a finite
    loss and a zero gradient instead of log(0)'s infinities (F.binary_cross_entropy clamps its logs
    at -100 instead; both pass zero gradient back through the saturated sigmoid).
    """
    lambdas = exit_lambdas.float().clamp(torch.finfo(torch.float32).tiny, 1.0 - 2.0**-24)
    return torch.log1p(-lambdas) - torch.log(lambdas)
