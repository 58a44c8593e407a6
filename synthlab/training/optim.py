"""Optimizer and learning-rate schedules, shared by `synthlab train` and the OUROBOROS trainer.

- `OptimConfig`, `ScheduleConfig`: the `[train.optim]` and `[train.schedule]` sections of a run
  (synthlab.training.configs.TrainConfig): AdamW's settings, and the run's length with the
  learning rate's course over it.

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
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from synthlab.conditions import parse as parse_conditions
from synthlab.errors import SynthlabError
from synthlab.serialize import check_finite, option

SCHEDULES = ("cosine", "constant", "wsd")
# torch AdamW's kernels: default leaves torch's choice (a per-tensor loop on the CPU); foreach
# batches the tensors; fused is one kernel per group (CPU and CUDA). All three apply the same
# update up to floating-point rounding.
OPTIMIZER_IMPLS = ("default", "foreach", "fused")


@dataclass
class OptimConfig:
    """`[train.optim]`: AdamW and its gradient clip."""

    lr: float = option(1e-3, "Peak learning rate.")
    weight_decay: float = option(0.1, "AdamW weight decay on 2-D weights (not norms, biases, gains).")
    beta1: float = option(0.9, "AdamW beta1.")
    beta2: float = option(0.98, "AdamW beta2.")
    eps: float = option(1e-8, "AdamW epsilon.")
    grad_clip: float = option(1.0, "Gradient norm clip (0: off).")
    optimizer_impl: str = option(
        "default",
        "torch AdamW's kernel: default (a loop per tensor on the CPU), foreach or fused (benchmarks/README.md "
        "has the measured factors; the same update up to rounding).",
    )

    def __post_init__(self) -> None:
        check_finite(
            "train.optim.",
            lr=self.lr,
            weight_decay=self.weight_decay,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            grad_clip=self.grad_clip,
        )
        if not self.lr > 0:
            raise SynthlabError(f"train.optim.lr must be > 0, got {self.lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0):
            raise SynthlabError("train.optim.beta1 and train.optim.beta2 must be in [0, 1), train.optim.eps > 0")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise SynthlabError("train.optim.weight_decay and train.optim.grad_clip must be >= 0")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise SynthlabError(
                f"train.optim.optimizer_impl must be one of {', '.join(OPTIMIZER_IMPLS)}, not {self.optimizer_impl!r}"
            )


# The columns the probe logs (synthlab.evaluation.groups.group_columns: held-out and training
# accuracy, answer loss and count per group); which groups a dataset has is checked when it is loaded.
_PROBE_COLUMN = re.compile(r"^(train_)?(acc|answer_loss|n)_\w+$")


@dataclass
class ScheduleConfig:
    """`[train.schedule]`: the run's length (`steps` or `exposures`, epochs over the data), the
    learning rate's course over it, and the rule that may end it early."""

    steps: int | None = option(None, "Optimizer steps (or use exposures).")
    exposures: float | None = option(None, "Passes over the training data (bioS: times each biography is seen).")
    kind: str = option(
        "cosine",
        "Learning-rate schedule after the linear warmup: cosine, constant or wsd (warmup-stable-decay).",
        flag="--schedule",
    )
    min_lr_ratio: float = option(0.1, "cosine (and wsd's cooldown) decay to lr times this.")
    decay_fraction: float = option(0.2, "wsd: share of the run spent in the final linear cooldown.")
    warmup_steps: int = option(50, "Linear warmup steps.")
    stop_when: str = option(
        "",
        "End the run, finished, at the first eval_every probe whose columns meet this condition, e.g. "
        "'train_acc_l1 >= 0.99 and train_acc_l2 >= 0.99' (a verdict's `requires` grammar; the names "
        "results.csv gives the probe's columns, or metrics.jsonl's eval/...); steps or exposures stays "
        "the upper bound and the learning-rate schedule stays laid out over it: the rule stops the run, "
        "it does not rescale the schedule (empty: train to the budget).",
    )

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.exposures is None):
            raise SynthlabError(
                "set exactly one of train.schedule.steps (--steps) and train.schedule.exposures (--exposures)"
            )
        check_finite(
            "train.schedule.",
            exposures=self.exposures,
            min_lr_ratio=self.min_lr_ratio,
            decay_fraction=self.decay_fraction,
        )
        if self.steps is not None and self.steps < 1:
            raise SynthlabError(f"train.schedule.steps must be >= 1, got {self.steps}")
        if self.exposures is not None and self.exposures <= 0:
            raise SynthlabError(f"train.schedule.exposures must be > 0, got {self.exposures}")
        if not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise SynthlabError("train.schedule.min_lr_ratio must be in [0, 1], train.schedule.warmup_steps >= 0")
        if self.kind not in SCHEDULES:
            raise SynthlabError(f"train.schedule.kind must be one of {', '.join(SCHEDULES)}, not {self.kind!r}")
        if not 0 < self.decay_fraction <= 1:
            raise SynthlabError(f"train.schedule.decay_fraction must be in (0, 1], got {self.decay_fraction}")
        conditions = (
            parse_conditions(self.stop_when, "train.schedule.stop_when", prefix="eval/") if self.stop_when else []
        )
        for column, _, _ in conditions:
            if not _PROBE_COLUMN.match(column):
                raise SynthlabError(
                    f"train.schedule.stop_when: {column} is no column of the probe (it logs acc_<group>, "
                    "train_acc_<group>, answer_loss_<group>, train_answer_loss_<group>, n_<group>, train_n_<group>)"
                )


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
