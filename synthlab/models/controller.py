"""OUROBOROS-style modulation of the recurrent core, and its static per-step LoRA baseline.

Each core layer has LoRA bases per target projection (q, k, v, o and the MLP's gate / up / down):
A (r x in) and B (out x r). At step t a magnitude vector delta (r) per target changes the weight

    dW = (alpha / r) B diag(delta) A,   i.e.  y = W x + (alpha / r) B (delta * (A x))

computed without forming dW. Who writes delta:
- controller (`controller = "controller"`): a small MLP reads a CAUSAL running mean of the core's
  input over the prefix (positions <= i, and only the token's own document when doc_ids are
  given) plus a step embedding, so delta is per token: (B, S, r). The public OUROBOROS code
  mean-pools over the whole sequence, future included, which leaks the future; we do not.
- static LoRA (`controller = "static_lora"`): a learned delta per step, the same for every token.
Output heads start at zero, so dW = 0 at init and the core starts as the plain shared block.

Bases: OUROBOROS freezes bases taken from the SVD of the removed layers' weight differences. A
small model trained from scratch has no removed layers, so by default (`lora_bases = "learned"`)
the bases are random-init trainable parameters; `lora_bases = "fixed"` keeps them random and frozen
(buffers), the closest from-scratch analogue: the controller then learns magnitudes only.

Also here: the gated recurrence h <- g h_new + (1 - g) h_old with g = sigmoid(W [h_new; h_old] + b),
b initialised at -2 (about 88% of the old state kept), and the per-step RMSNorm scales gamma_t.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from synthlab.models.config import ModelConfig


def target_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA target projection of one core layer."""
    d, f = config.d_model, config.ff_dim
    shapes = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    return {t: shapes[t] for t in config.lora_targets}


class LoRABases(nn.Module):
    """A (r x in) and B (out x r) per target, for one core layer: trainable, or frozen buffers."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.shapes, r = target_shapes(config), config.lora_rank
        for target, (n_in, n_out) in self.shapes.items():
            for name, shape in ((f"A_{target}", (r, n_in)), (f"B_{target}", (n_out, r))):
                if config.lora_bases == "learned":
                    self.register_parameter(name, nn.Parameter(torch.empty(shape)))
                else:
                    self.register_buffer(name, torch.empty(shape))

    def init_weights(self, generator: torch.Generator, std: float) -> None:
        # Unit-variance directions: A x and B u keep the scale of x and u, so delta alone sets
        # the size of the update (it starts at 0).
        with torch.no_grad():
            for target, (n_in, _) in self.shapes.items():
                A, B = self.bases(target)
                A.normal_(0.0, n_in**-0.5, generator=generator)
                B.normal_(0.0, A.shape[0] ** -0.5, generator=generator)

    def bases(self, target: str) -> tuple[torch.Tensor, torch.Tensor]:
        return getattr(self, f"A_{target}"), getattr(self, f"B_{target}")


class LowRankModulation:
    """`mod(target, x, y)` for one core layer at one step: y + (alpha/r) ((x A^T) * delta) B^T.

    deltas (..., n_targets, r): (B, S, n_targets, r) from the controller (one per token) or
    (n_targets, r) from static LoRA; it broadcasts against x A^T of shape (B, S, r).
    """

    def __init__(self, bases: LoRABases, deltas: torch.Tensor, targets: tuple[str, ...], scale: float):
        self.bases, self.deltas, self.scale = bases, deltas, scale
        self.index = {t: i for i, t in enumerate(targets)}

    def __call__(self, target: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        i = self.index.get(target)
        if i is None:
            return y
        A, B = self.bases.bases(target)
        return y + self.scale * F.linear(F.linear(x, A) * self.deltas[..., i, :], B)


def causal_running_mean(
    x: torch.Tensor, doc_ids: torch.Tensor | None = None, prefix_sum: torch.Tensor | None = None, prefix_count: int = 0
) -> torch.Tensor:
    """x (B, S, D) -> (B, S, D): position i holds the mean of x over positions <= i.

    With doc_ids (B, S) only positions of the same document count (packed documents stay
    isolated). prefix_sum (B, D) and prefix_count continue a running mean over earlier positions
    (KV-cache decoding); not combined with doc_ids.
    """
    if doc_ids is not None:
        S = x.shape[1]
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        weights = (causal & (doc_ids[:, :, None] == doc_ids[:, None, :])).to(x.dtype)  # (B, S, S)
        return (weights @ x) / weights.sum(-1, keepdim=True)
    sums = x.cumsum(dim=1)
    if prefix_sum is not None:
        sums = sums + prefix_sum[:, None]
    counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype) + prefix_count
    return sums / counts[:, None]


class RecurrenceController(nn.Module):
    """pooled state (B, S, D) and step t -> delta (B, S, n_core, n_targets, r)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.out_shape = (config.n_core, len(config.lora_targets), config.lora_rank)
        hidden = config.controller_hidden
        self.in_norm = nn.RMSNorm(config.d_model, eps=1e-5)
        self.proj = nn.Linear(config.d_model, hidden)
        self.step_embedding = nn.Embedding(config.step_table_size, hidden)
        self.heads = nn.Linear(hidden, self.out_shape[0] * self.out_shape[1] * self.out_shape[2])

    def init_weights(self, generator: torch.Generator, std: float) -> None:
        nn.init.normal_(self.proj.weight, 0.0, std, generator=generator)
        nn.init.zeros_(self.proj.bias)
        nn.init.normal_(self.step_embedding.weight, 0.0, 1.0, generator=generator)
        nn.init.zeros_(self.heads.weight)  # output heads at zero: no modulation at init
        nn.init.zeros_(self.heads.bias)

    def forward(self, pooled: torch.Tensor, step: int) -> torch.Tensor:
        row = min(step, self.step_embedding.num_embeddings - 1)
        # Adding the step embedding to the first layer's pre-activation = a linear layer on
        # [pooled; step one-hot].
        z = F.gelu(self.proj(self.in_norm(pooled)) + self.step_embedding.weight[row])
        return self.heads(z).view(*pooled.shape[:-1], *self.out_shape)


class StaticStepLoRA(nn.Module):
    """A learned delta per step, shared by every token: (n_core, n_targets, r) at step t."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.deltas = nn.Parameter(
            torch.zeros(config.step_table_size, config.n_core, len(config.lora_targets), config.lora_rank)
        )

    def init_weights(self, generator: torch.Generator, std: float) -> None:
        nn.init.zeros_(self.deltas)

    def forward(self, step: int) -> torch.Tensor:
        return self.deltas[min(step, self.deltas.shape[0] - 1)]


class RecurrenceGate(nn.Module):
    """h <- g h_new + (1 - g) h_old, g = sigmoid(W [h_new; h_old] + b) per channel, b = -2 at init."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.proj = nn.Linear(2 * config.d_model, config.d_model)

    def init_weights(self, generator: torch.Generator, std: float) -> None:
        nn.init.normal_(self.proj.weight, 0.0, std, generator=generator)
        nn.init.constant_(self.proj.bias, -2.0)  # sigmoid(-2) = 0.12: keep 88% of the old state

    def forward(self, h_new: torch.Tensor, h_old: torch.Tensor) -> torch.Tensor:
        g = torch.sigmoid(self.proj(torch.cat([h_new, h_old], dim=-1)))
        return h_old + g * (h_new - h_old)


class StepNorms(nn.Module):
    """RMSNorm with its own scale gamma_t per step: the shared core sees which step it is in."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(config.step_table_size, config.d_model))

    def init_weights(self, generator: torch.Generator, std: float) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        gamma = self.weight[min(step, self.weight.shape[0] - 1)]
        return F.rms_norm(x, (x.shape[-1],), gamma, eps=1e-5)
