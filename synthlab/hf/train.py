"""Training the looped variants and measuring loss against depth (claim C11).

Optimiser as in MISSION.md ("OUROBOROS training"): AdamW lr 3e-4, weight decay 0.01 on matrices
only (embeddings, norms and biases are not decayed, as in nanoGPT), betas (0.9, 0.95), linear
warmup, cosine to 1e-6, gradient clip 1.0; the depth of each optimiser step drawn from a set.
The optimiser and schedule are the shared ones of `synthlab.optim`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from synthlab import distributed
from synthlab.errors import SynthlabError
from synthlab.hf.data import PAD
from synthlab.hf.system import OuroborosLM, lm_loss
from synthlab.optim import adamw, lr_factor
from synthlab.progress import Progress
from synthlab.runs import float32_matmul


@dataclass
class OuroborosTrainConfig:
    """One training run of one looped variant (reference values in the comments)."""

    steps: int = 1000
    seq_len: int = 2048
    batch_size: int = 4
    grad_accum: int = 8  # effective batch 32 sequences, as the reference
    lr: float = 3e-4
    min_lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int | None = None  # None: min(2000, steps // 10); the reference uses 2000
    grad_clip: float = 1.0
    depths: tuple[int, ...] = (4, 8, 16)  # depth per step drawn uniformly; one value = fixed
    heldout_fraction: float = 0.05
    checkpoint_every: int = 0  # 0: only at the end
    seed: int = 0
    per_document: bool = False  # one document per sequence (padded, BOS first), as synthlab bases train; else packed
    tf32: bool = True  # on CUDA, TF32 tensor cores for the float32 gate / controller matmuls

    def __post_init__(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise SynthlabError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise SynthlabError(f"seq_len must be >= 2, got {self.seq_len}")
        if not self.depths or min(self.depths) < 1:
            raise SynthlabError(f"depths must be positive integers, got {self.depths}")
        if not 0 < self.heldout_fraction < 1:
            raise SynthlabError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.lr <= 0:
            raise SynthlabError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise SynthlabError(f"min_lr must be in [0, lr], got {self.min_lr}")

    @property
    def warmup(self) -> int:
        return min(2000, self.steps // 10) if self.warmup_steps is None else self.warmup_steps


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
    return adamw(model.parameters(), lambda p: id(p) in decay, lr=config.lr, weight_decay=config.weight_decay,
                 betas=config.betas)


def train(model: OuroborosLM, sequences: torch.Tensor, config: OuroborosTrainConfig, *,
          on_checkpoint=None, resume: dict | None = None, progress: bool = True,
          world: distributed.World = distributed.World()) -> list[dict]:
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
    if config.batch_size % world.size:
        raise SynthlabError(f"batch_size {config.batch_size} does not split into {world.size} processes")
    device = next(p for p in model.parameters() if p.requires_grad).device
    with float32_matmul(device, config.tf32):
        return _train(model, sequences, config, device, on_checkpoint, resume, progress and world.main, world)


def _train(model, sequences, config, device, on_checkpoint, resume, progress, world) -> list[dict]:
    data_gen = torch.Generator().manual_seed(config.seed)
    depth_gen = torch.Generator().manual_seed(config.seed + 1)
    optimizer = make_optimizer(model, config)
    order, cursor, log, start = torch.randperm(len(sequences), generator=data_gen), 0, [], 0
    if resume is not None:
        model.load_state_dict(resume["model"], strict=False)
        optimizer.load_state_dict(resume["optimizer"])
        data_gen.set_state(resume["data_gen"])
        depth_gen.set_state(resume["depth_gen"])
        order, cursor, log, start = resume["order"], resume["cursor"], list(resume["log"]), resume["step"]
    model.train()
    bar = Progress(config.steps, initial=start, enabled=progress, desc=f"train {model.config.variant}", unit="step")
    for step in range(start, config.steps):
        depth = config.depths[int(torch.randint(len(config.depths), (1,), generator=depth_gen))]
        lr = learning_rate(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=device)  # summed on the device: no host sync per micro-batch
        for _ in range(config.grad_accum):
            if cursor + config.batch_size > len(order):  # new epoch, new order
                order, cursor = torch.randperm(len(sequences), generator=data_gen), 0
            share = config.batch_size // world.size  # this process's rows of the micro-batch
            rows = order[cursor + world.rank * share: cursor + (world.rank + 1) * share]
            # this process's part of the micro-batch's mean: its targets over all of the micro-batch's
            # (counted on the host, known to every process; 1 / K of them in packed rows)
            whole = int((sequences[order[cursor: cursor + config.batch_size], 1:] != PAD).sum())
            part = world.size * int((sequences[rows, 1:] != PAD).sum()) / whole  # K x: the gradients are averaged
            batch = sequences[rows].to(device)
            cursor += config.batch_size
            loss = lm_loss(model(batch, depth), batch) * part / config.grad_accum
            loss.backward()
            total += loss.detach()
        trainables = [p for p in model.parameters() if p.requires_grad]
        distributed.average_gradients(world, trainables)
        norm = torch.nn.utils.clip_grad_norm_(trainables, config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total = float(distributed.sum_over(world, total)[0]) / world.size  # one sync per step, for the log
        log.append({"step": step, "depth": depth, "loss": total, "lr": lr, "grad_norm": float(norm)})
        bar.set_postfix(loss=f"{total:.3f}", depth=str(depth))
        bar.update()
        last = step + 1 == config.steps
        if on_checkpoint is not None and world.main and (last or (config.checkpoint_every and (step + 1) % config.checkpoint_every == 0)):
            on_checkpoint({"step": step + 1, "model": model.trainable_state(), "optimizer": optimizer.state_dict(),
                           "data_gen": data_gen.get_state(), "depth_gen": depth_gen.get_state(),
                           "order": order, "cursor": cursor, "log": log})
    bar.close()
    model.eval()
    return log


@torch.no_grad()
def evaluate(model: OuroborosLM, sequences: torch.Tensor, depth: int, batch_size: int, tf32: bool = True,
             world: distributed.World = distributed.World()) -> float:
    """Mean next-token loss over every predicted token of `sequences` at `depth` (the sum over all
    targets over their count, so a short last batch or a padded row counts for what it holds).

    Across processes (`world`) each evaluates its contiguous share of the rows and the sums are
    added up, so every process returns the one-process number (to float rounding). The shares are
    equal, the last ones filled up with rows of PAD (no targets): every process runs the same
    forwards, as a model sharded by FSDP needs."""
    model.eval()
    device = next(model.parameters()).device
    n = -(-len(sequences) // world.size)  # rows per process
    filled = torch.full((n * world.size, sequences.shape[1]), PAD, dtype=sequences.dtype)
    filled[: len(sequences)] = sequences
    mine = filled[world.rank * n: (world.rank + 1) * n]
    total = torch.zeros((), dtype=torch.float64, device=device)
    with float32_matmul(device, tf32):
        for start in range(0, n, batch_size):
            batch = mine[start: start + batch_size].to(device)
            total += lm_loss(model(batch, depth), batch, reduction="sum").double()
    count = torch.tensor(int((mine[:, 1:] != PAD).sum()), dtype=torch.float64, device=device)
    total, count = distributed.sum_over(world, total, count)
    return float(total / count)


def plot_loss_vs_depth(table, path: str | Path) -> None:
    """The C11 figure: loss against depth, a line per variant, a panel per corpus."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    grid = sns.relplot(data=table, x="depth", y="loss", hue="variant", style="variant", col="corpus",
                       kind="line", markers=True, dashes=False, facet_kws={"sharey": False}, height=3.5)
    depths = sorted(int(d) for d in table["depth"].unique())
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(depths, [str(d) for d in depths])
    grid.figure.suptitle("OUROBOROS (C11): loss vs recurrent depth", y=1.02)
    grid.savefig(path, format="png", bbox_inches="tight", dpi=120)
