"""The training engine both trainers share: the state of a run (`TrainState`) and one optimizer
step (`step`).

`synthlab.training.trainer` (the lab's looped models) and `synthlab.ouroboros.train` (OUROBOROS on a frozen base)
differ in their data and their losses; everything else of a step is this module's:

    lr = state.lr(state.step)                       the schedule, set on every parameter group
    for each micro-batch i: loss_i.backward()       the caller's forward and losses (`micro`)
    gradients averaged over the processes           by DDP in the last backward, or one all-reduce
    logged values summed over the processes         on `check` steps (a non-finite loss stops the run)
    clip, optimizer step, gradients freed, step += 1

A `TrainState` saves and restores as one dict (`state_dict` / `load_state_dict`): the weights, the
optimizer, the step, the tokens seen, each data position under its name, each seeded generator's
state under its name and, when the run draws from it (dropout), torch's global RNG. Resuming from
it continues a run bit for bit on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from synthlab.errors import SynthlabError
from synthlab.training import distributed


class Stateful(Protocol):
    """Something whose state a checkpoint keeps (a data position)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainState:
    """Everything a resumed run needs.

    model: the unwrapped module that trains; with `trainable_only` only its parameters that train
    are saved (a few on a large frozen model) and loading leaves the others as they are.
    lr: the learning rate of a (0-based) step. data: the data positions by name. generators: the
    seeded generators the run draws from (model draws, data order, depths) by name. global_rng:
    torch's global RNG (and on CUDA the devices') belongs to the state.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    lr: Callable[[int], float]
    data: dict[str, Stateful] = field(default_factory=dict)
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    step: int = 0
    tokens_seen: int = 0
    trainable_only: bool = False
    global_rng: bool = False
    _trainables: list[nn.Parameter] | None = field(default=None, init=False, repr=False)

    def trainables(self) -> list[nn.Parameter]:
        """The parameters that train, in the model's order (the order clipping sums their norms
        in); listed once, at the first step, since walking the model every step costs time at
        small shapes. Which parameters train is set before training starts."""
        if self._trainables is None:
            self._trainables = [p for p in self.model.parameters() if p.requires_grad]
        return self._trainables

    def weights_finite(self) -> bool:
        return bool(torch.stack([p.isfinite().all() for p in self.model.parameters()]).all())

    def state_dict(self) -> dict[str, Any]:
        if self.trainable_only:
            weights = {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}
        else:
            weights = self.model.state_dict()
        state = {
            "model": weights,
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
        }
        state |= {name: part.state_dict() for name, part in self.data.items()}
        state |= {name: g.get_state() for name, g in self.generators.items()}
        if self.global_rng:
            device = next(self.model.parameters()).device  # its own GPU: a run resumes on any number
            state |= {"torch_rng": torch.get_rng_state(), "cuda_rng": distributed.device_rng_state(device)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"], strict=not self.trainable_only)
        self.optimizer.load_state_dict(state["optimizer"])
        for name, part in self.data.items():
            part.load_state_dict(state[name])
        for name, g in self.generators.items():
            g.set_state(state[name])
        if self.global_rng:
            torch.set_rng_state(state["torch_rng"])
            distributed.set_device_rng_state(state.get("cuda_rng"), next(self.model.parameters()).device)
        self.step, self.tokens_seen = state["step"], state.get("tokens_seen", 0)


@dataclass
class Step:
    """What one optimizer step reports: the learning rate it used, the micro-batches' logged values
    summed (over the processes too on `check` steps), the gradient norm before clipping (None
    without clipping)."""

    lr: float
    logged: tuple[torch.Tensor, ...]
    grad_norm: torch.Tensor | None


def step(
    state: TrainState,
    micro_batches: int,
    micro: Callable[[int], tuple[torch.Tensor, tuple[torch.Tensor, ...]]],
    *,
    world: distributed.World,
    grad_clip: float,
    check: bool,
    parallel: nn.Module | None = None,
    where: Callable[[], str] = lambda: "",
) -> Step:
    """One optimizer step of `state` over `micro_batches` micro-batches.

    micro(i) runs the forward of micro-batch i and returns (the loss to differentiate, the values
    to log), both already weighted by the micro-batch's share of the step (their sums are the
    whole step's). Across processes the gradients become their mean: in backward by `parallel`
    (a DDP wrapper: its all-reduce skipped on all but the last micro-batch), else by one
    all-reduce after the last. On `check` steps the logged values are summed over the processes
    and a non-finite first value (the loss) stops the run before the update: one error line
    ending in where() (the learning rate, what is kept, how to continue).
    """
    lr = state.lr(state.step)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    logged: tuple[torch.Tensor, ...] = ()
    for i in range(micro_batches):
        with distributed.no_sync(parallel, sync=i == micro_batches - 1):
            loss, values = micro(i)
            loss.backward()
        logged = values if not logged else tuple(a + b for a, b in zip(logged, values))
    trainables = state.trainables()
    if not isinstance(parallel, nn.parallel.DistributedDataParallel):
        distributed.average_gradients(world, trainables)
    if check:
        logged = tuple(distributed.sum_over(world, *logged))
        if not torch.isfinite(logged[0]):
            raise SynthlabError(f"training diverged at step {state.step + 1}: the loss is {float(logged[0])}{where()}")
    norm = torch.nn.utils.clip_grad_norm_(trainables, grad_clip) if grad_clip > 0 else None
    state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.step += 1
    return Step(lr, logged, norm)
