"""The fixed LoRA bases of the recurrent layer and the modulated projections that apply them.

Each of the recurrent layer's seven projections (TARGETS) is wrapped in place by a
`ModulatedLinear` that adds `(alpha / r) B diag(delta) A x`; A (r x in) and B (out x r) come from
the SVD of the mean weight difference between the removed layers and the recurrent one
(`mean_residual`, `lora_bases`), and only the magnitudes `delta` are learned (by the owner).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# target name -> (sub-module of the decoder layer, attribute of its nn.Linear)
TARGETS: dict[str, tuple[str, str]] = {
    "q": ("self_attn", "q_proj"),
    "k": ("self_attn", "k_proj"),
    "v": ("self_attn", "v_proj"),
    "o": ("self_attn", "o_proj"),
    "gate": ("mlp", "gate_proj"),
    "up": ("mlp", "up_proj"),
    "down": ("mlp", "down_proj"),
}


@dataclass(frozen=True)
class Split:
    """Layer indices of each part; `removed` are the layers the recurrent one stands in for."""

    prelude: tuple[int, ...]
    recurrent: int
    coda: tuple[int, ...]
    removed: tuple[int, ...]


def target_linear(layer: nn.Module, target: str) -> nn.Module:
    parent, attr = TARGETS[target]
    return getattr(getattr(layer, parent), attr)


def lora_bases(residual: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed bases (A: rank x in, B: out x rank) of a mean residual M (out x in).

    With M = U S V^T: B = U_r S_r^(1/2), A = S_r^(1/2) V_r^T, so B A is the best rank-r
    approximation of M and delta = 1 reproduces it (the split of S keeps A and B at one scale).
    A matrix of rank below r gets zero-padded bases (those directions stay dead). Computed and
    returned on the residual's device (a CUDA SVD stays on the GPU; nothing mixes devices).
    """
    out_features, in_features = residual.shape
    if residual.is_meta:  # shapes only: counting a config-built model
        return (torch.empty(rank, in_features, device="meta"), torch.empty(out_features, rank, device="meta"))
    u, s, vh = torch.linalg.svd(residual.float(), full_matrices=False)
    kept = min(rank, s.numel())
    root = s[:kept].sqrt()
    a = torch.zeros(rank, in_features, device=residual.device)  # on the weights' device, float32
    b = torch.zeros(out_features, rank, device=residual.device)
    a[:kept] = root[:, None] * vh[:kept]
    b[:, :kept] = u[:, :kept] * root
    return a, b


def mean_residual(layers: nn.ModuleList, split: Split, target: str) -> torch.Tensor:
    """mean over removed layers l of (W_l - W_recurrent), float32, (out x in)."""
    recurrent = target_linear(layers[split.recurrent], target).weight
    if recurrent.is_meta:
        return torch.empty(recurrent.shape, device="meta")
    total = torch.zeros(recurrent.shape, dtype=torch.float32, device=recurrent.device)
    for index in split.removed:  # running sum: 19 stacked 11008 x 2048 copies would be 1.7 GB
        total += target_linear(layers[index], target).weight.float() - recurrent.float()
    return total / len(split.removed)


class ModulatedLinear(nn.Module):
    """A frozen nn.Linear plus `(alpha / r) B diag(delta) A x`; delta is set per step by the owner.

    delta has shape (batch, T, r) (per token, controller) or (r,) (static); None means no update.
    Computed as B (delta * (A x)) so the full dW is never formed (the same update as
    `synthlab.models.controller.LowRankModulation`, which the from-scratch layers call as a hook;
    the HF decoder layer calls its projections directly, so here the projection itself is wrapped).
    """

    def __init__(self, base: nn.Linear, a: torch.Tensor, b: torch.Tensor, scale: float, origin: tuple) -> None:
        super().__init__()
        self.base = base
        self.register_buffer("lora_a", a, persistent=False)  # (r, in)
        self.register_buffer("lora_b", b, persistent=False)  # (out, r)
        self.scale = scale
        self.origin = origin  # (split, rank, scale) the bases were computed for
        self.delta: torch.Tensor | None = None

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.delta is None:
            return y
        coeff = F.linear(x, self.lora_a) * self.delta.to(x.dtype)  # (batch, T, r)
        return y + self.scale * F.linear(coeff, self.lora_b)
