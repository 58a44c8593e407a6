"""Optimizer and learning-rate schedules, shared by `synthlab train` and the OUROBOROS trainer.

- `adamw(params, decay, ...)`: AdamW with weight decay on the parameters `decay` names and none on
  the rest (nanoGPT's rule: matrices decay; biases, norm gains and small vectors do not), with
  torch's default, foreach or fused kernel (`OPTIMIZER_IMPLS`).
- `lr_factor(step, ...)`: the multiplier of the peak learning rate at an optimizer step, for the
  schedules `cosine` (linear warmup, cosine to `min_ratio`), `constant` (linear warmup, then flat)
  and `wsd` (warmup-stable-decay: linear warmup, flat, then a linear cooldown to `min_ratio` over
  the last `decay_fraction` of the run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

SCHEDULES = ("cosine", "constant", "wsd")
# torch AdamW's kernels: default leaves torch's choice (a per-tensor loop on the CPU); foreach
# batches the tensors; fused is one kernel per group (CPU and CUDA). All three apply the same
# update up to floating-point rounding.
OPTIMIZER_IMPLS = ("default", "foreach", "fused")


def adamw(
    params: Iterable[Any],
    decay: Callable[[Any], bool],
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float = 1e-8,
    impl: str = "default",
):
    """torch AdamW over the trainable `params`, weight decay only on those for which `decay(p)`
    holds, with the kernel `impl` (OPTIMIZER_IMPLS)."""
    import torch  # here, not at the top: the schedule names are read by torch-free config code

    params = [p for p in params if p.requires_grad]
    groups = [
        {"params": [p for p in params if decay(p)], "weight_decay": weight_decay},
        {"params": [p for p in params if not decay(p)], "weight_decay": 0.0},
    ]
    kernel = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=tuple(betas), eps=eps, **kernel)


def lr_factor(
    step: int, *, warmup: int, total: int, min_ratio: float, schedule: str = "cosine", decay_fraction: float = 0.2
) -> float:
    """Multiplier of the peak learning rate at `step` (0-based) of a `total`-step run."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":
        cooldown = max(1, round(decay_fraction * total))
        start = max(warmup, total - cooldown)
        if step < start:
            return 1.0
        progress = min(1.0, (step - start + 1) / max(1, total - start))
        return 1.0 - (1.0 - min_ratio) * progress
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
