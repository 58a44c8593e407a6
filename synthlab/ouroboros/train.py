"""Training the looped variants and measuring loss against depth (claim C11).

Optimiser as in the OUROBOROS reference training (docs/claims.md, C11): AdamW lr 3e-4, weight decay 0.01 on matrices
only (embeddings, norms and biases are not decayed, as in nanoGPT), betas (0.9, 0.95), linear
warmup, cosine to 1e-6, gradient clip 1.0; the depth of each optimiser step drawn from a set.
The optimiser and schedule are the shared ones of `synthlab.training.optim`; each optimiser step is
`synthlab.training.engine.step` and the state a checkpoint keeps is its `TrainState` (with the log so far),
as for the lab's own trainer.
"""

from __future__ import annotations

from pathlib import Path

import torch

from synthlab.errors import SynthlabError
from synthlab.ouroboros.data import PAD
from synthlab.ouroboros.system import OuroborosLM, lm_loss
from synthlab.progress import Progress
from synthlab.training import distributed, engine
from synthlab.training.configs import OuroborosTrainConfig
from synthlab.training.engine import TrainState
from synthlab.training.optim import adamw, lr_factor
from synthlab.training.run_folders import float32_matmul


def learning_rate(step: int, config: OuroborosTrainConfig) -> float:
    """Linear warmup to lr, then cosine from lr down to min_lr at the last step."""
    return config.lr * lr_factor(step, warmup=config.warmup, total=config.steps, min_ratio=config.min_lr / config.lr)


def make_optimizer(model: OuroborosLM, config: OuroborosTrainConfig) -> torch.optim.AdamW:
    if not any(p.requires_grad for p in model.parameters()):
        raise SynthlabError(f"variant '{model.config.variant}' has nothing to train")
    # Only the weight matrices of trainable Linear layers (gate, controller) decay; biases, norm
    # scales, step embeddings and static deltas do not (nanoGPT's rule, decaying them toward 0
    # would pull the gate bias and norm scales off their identity-preserving init).
    decay = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return adamw(
        model.parameters(), lambda p: id(p) in decay, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas
    )


def train(
    model: OuroborosLM,
    sequences: torch.Tensor,
    config: OuroborosTrainConfig,
    *,
    on_checkpoint=None,
    resume: dict | None = None,
    progress: bool = True,
    world: distributed.World = distributed.World(),
) -> list[dict]:
    """Train `model`'s trainable parameters on packed (N, seq_len) `sequences`; a log row per step.

    Batches and depths come from two generators seeded with config.seed (data order) and
    config.seed + 1 (depths), so a run is reproducible. Every `checkpoint_every` steps and at the
    end, `on_checkpoint(state)` gets the whole training state (step, trainable parameters,
    optimiser, both generators, data order and position, log so far); `resume=state` continues
    from such a state, bit-identically to a run that was never stopped (on the CPU).

    Data-parallel (`world`, under torchrun): every process draws the same micro-batches and depths
    and runs its contiguous share of each micro-batch's rows; the gradients are averaged over the
    processes before each optimiser step, so the step is the one-process step of the whole batch
    (each process's mean weighted by its share of the micro-batch's targets, which differs between
    processes in padded per-document rows). Only the main process calls `on_checkpoint`.
    """
    if max(config.depths) > model.config.max_steps:
        raise SynthlabError(f"depths {config.depths} exceed the model's max_steps {model.config.max_steps}")
    if config.micro_batch_size % world.size:
        raise SynthlabError(f"micro_batch_size {config.micro_batch_size} does not split into {world.size} processes")
    device = next(p for p in model.parameters() if p.requires_grad).device
    with float32_matmul(device, config.tf32):
        return _train(model, sequences, config, device, on_checkpoint, resume, progress and world.main, world)


class Order:
    """The data position: a permutation of the `n` sequences and a cursor in it, a new permutation
    (drawn from `generator`) each epoch."""

    def __init__(self, n: int, generator: torch.Generator):
        self.n, self.generator = n, generator
        self.order, self.cursor = torch.randperm(n, generator=generator), 0

    def next(self, batch_size: int) -> torch.Tensor:
        """The indices of the next micro-batch."""
        if self.cursor + batch_size > len(self.order):  # new epoch, new order
            self.order, self.cursor = torch.randperm(self.n, generator=self.generator), 0
        self.cursor += batch_size
        return self.order[self.cursor - batch_size : self.cursor]

    def state_dict(self) -> dict:
        return {"order": self.order, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.order, self.cursor = state["order"], state["cursor"]


def _train(model, sequences, config, device, on_checkpoint, resume, progress, world) -> list[dict]:
    data_gen = torch.Generator().manual_seed(config.seed)
    order = Order(len(sequences), data_gen)
    state = TrainState(
        model,
        make_optimizer(model, config),
        lambda step: learning_rate(step, config),
        data={"data": order},
        generators={"data_gen": data_gen, "depth_gen": torch.Generator().manual_seed(config.seed + 1)},
        trainable_only=True,
    )
    log = []
    if resume is not None:
        state.load_state_dict(resume)
        log = list(resume["log"])
    model.train()
    bar = Progress(
        config.steps, initial=state.step, enabled=progress, desc=f"train {model.config.variant}", unit="step"
    )
    share = config.micro_batch_size // world.size  # this process's rows of each micro-batch
    while state.step < config.steps:
        depth = config.depths[int(torch.randint(len(config.depths), (1,), generator=state.generators["depth_gen"]))]

        def micro(i: int):
            batch = order.next(config.micro_batch_size)
            rows = batch[world.rank * share : (world.rank + 1) * share]
            # this process's part of the micro-batch's mean: its targets over all of the micro-batch's
            # (counted on the host, known to every process; 1 / K of them in packed rows)
            whole = int((sequences[batch, 1:] != PAD).sum())
            part = world.size * int((sequences[rows, 1:] != PAD).sum()) / whole  # K x: the gradients are averaged
            inputs = sequences[rows].to(device)
            loss = lm_loss(model(inputs, depth), inputs) * part / config.grad_accum
            return loss, (loss.detach(),)

        done = engine.step(
            state,
            config.grad_accum,
            micro,
            world=world,
            grad_clip=config.grad_clip,
            check=True,
            where=lambda: f" (lr {config.lr})",
        )
        loss = float(done.logged[0]) / world.size  # one sync per step, for the log
        norm = None if done.grad_norm is None else float(done.grad_norm)
        log.append({"step": state.step - 1, "depth": depth, "loss": loss, "lr": done.lr, "grad_norm": norm})
        bar.set_postfix(loss=f"{loss:.3f}", depth=str(depth))
        bar.update()
        last = state.step == config.steps
        if (
            on_checkpoint is not None
            and world.main
            and (last or (config.checkpoint_every and state.step % config.checkpoint_every == 0))
        ):
            on_checkpoint(state.state_dict() | {"log": log})
    bar.close()
    model.eval()
    return log


def mean_loss(
    model: OuroborosLM,
    sequences: torch.Tensor,
    depth: int,
    batch_size: int,
    tf32: bool = True,
    world: distributed.World = distributed.World(),
) -> float:
    """Mean next-token loss over every predicted token of `sequences` at `depth` (the sum over all
    targets over their count, so a short last batch or a padded row counts for what it holds)."""
    sums, counts = sequence_losses(model, sequences, depth, batch_size, tf32, world)
    return float(sums.sum() / counts.sum())


@torch.no_grad()
def sequence_losses(
    model: OuroborosLM,
    sequences: torch.Tensor,
    depth: int,
    batch_size: int,
    tf32: bool = True,
    world: distributed.World = distributed.World(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `sequences` at `depth`: the summed next-token loss and the number of targets
    (float64), the per-sequence outcomes two variants on the same held-out text are paired by.

    Across processes (`world`) each evaluates its contiguous share of the rows and the shares are
    added up into the whole vectors, so every process returns the one-process numbers (to float
    rounding). The shares are equal, the last ones filled up with rows of PAD (no targets): every
    process runs the same forwards, as a model sharded by FSDP needs."""
    model.eval()
    device = next(model.parameters()).device
    n = -(-len(sequences) // world.size)  # rows per process
    filled = torch.full((n * world.size, sequences.shape[1]), PAD, dtype=sequences.dtype)
    filled[: len(sequences)] = sequences
    sums = torch.zeros(n * world.size, dtype=torch.float64, device=device)
    counts = (filled[:, 1:] != PAD).sum(-1).to(device=device, dtype=torch.float64)
    counts[: world.rank * n] = 0
    counts[(world.rank + 1) * n :] = 0
    with float32_matmul(device, tf32):
        for start in range(world.rank * n, (world.rank + 1) * n, batch_size):
            batch = filled[start : min(start + batch_size, (world.rank + 1) * n)].to(device)
            losses = lm_loss(model(batch, depth), batch, reduction="none").view(len(batch), -1)
            sums[start : start + len(batch)] = losses.sum(-1).double()
    sums, counts = distributed.sum_over(world, sums, counts)
    return sums[: len(sequences)].cpu(), counts[: len(sequences)].cpu()


def plot_loss_vs_depth(table, path: str | Path) -> None:
    """The C11 figure: loss against depth, a line per variant, a panel per corpus."""
    import matplotlib  # matplotlib and seaborn (seconds to import): only for the figure

    matplotlib.use("Agg")
    import seaborn as sns

    grid = sns.relplot(
        data=table,
        x="depth",
        y="loss",
        hue="variant",
        style="variant",
        col="corpus",
        kind="line",
        markers=True,
        dashes=False,
        facet_kws={"sharey": False},
        height=3.5,
    )
    depths = sorted(int(d) for d in table["depth"].unique())
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(depths, [str(d) for d in depths])
    grid.figure.suptitle("OUROBOROS (C11): loss vs recurrent depth", y=1.02)
    grid.savefig(path, format="png", bbox_inches="tight", dpi=120)
