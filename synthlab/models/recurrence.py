"""Huginn / "Towards Looped Models Done Right" recurrence pieces: input injection, state init and
training-time depth sampling.

In the sandwich topology the prelude output e (B, S, D) enters the recurrent core at every step:
    none      h                                   (Ouro: the stack just reads its own output)
    add       h + e
    concat    Linear(2D -> D)([h; e])
    diagonal  exp(-dt a) h + dt W e,  dt = softplus(dt_bias), a = exp(A_log)   (per channel)
              initialised so that exp(-dt a) = e^-1 (dt = a = 1) and W = identity: at init the
              state decays by 1/e per step and the input enters unchanged.
The recurrent state starts as h0 = 0 (zero), h0 = e (input) or h0 ~ N(0, std^2) (normal).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from synthlab.models.config import ModelConfig


class Injection(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.kind, d = config.injection, config.d_model
        if self.kind == "concat":
            self.proj = nn.Linear(2 * d, d, bias=config.bias)
        elif self.kind == "diagonal":
            self.dt_bias = nn.Parameter(torch.empty(d))
            self.A_log = nn.Parameter(torch.empty(d))
            self.W = nn.Linear(d, d, bias=False)

    def init_weights(self, generator: torch.Generator, std: float) -> None:
        if self.kind == "concat":
            nn.init.normal_(self.proj.weight, 0.0, std, generator=generator)
            if self.proj.bias is not None:
                nn.init.zeros_(self.proj.bias)
        elif self.kind == "diagonal":
            nn.init.constant_(self.dt_bias, math.log(math.e - 1.0))  # softplus(dt_bias) = 1
            nn.init.zeros_(self.A_log)  # a = 1, so exp(-dt a) = e^-1
            with torch.no_grad():
                self.W.weight.copy_(torch.eye(self.W.weight.shape[0]))

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """h state (B, S, D), e prelude output (B, S, D) -> the core's input (B, S, D)."""
        if self.kind == "none":
            return h
        if self.kind == "add":
            return h + e
        if self.kind == "concat":  # the residual stream stays in e's dtype (float32 under autocast, as elsewhere)
            return self.proj(torch.cat([h, e], dim=-1)).to(e.dtype)
        dt = F.softplus(self.dt_bias)
        return torch.exp(-dt * self.A_log.exp()) * h + dt * self.W(e)


def initial_state(kind: str, e: torch.Tensor, std: float, generator: torch.Generator | None) -> torch.Tensor:
    """h0 (B, S, D). `normal` draws from `generator` (a fixed seed-0 one when None: deterministic).

    The noise is drawn on e's device, never copied from the host: from `generator` itself when it
    lives there, else from a generator on e's device seeded by one draw from `generator` (a host
    draw, no device sync), so the run stays reproducible from `generator`'s state alone.
    """
    if kind == "zero":
        return torch.zeros_like(e)
    if kind == "input":
        return e
    return (_normal_noise(e.shape, e.device, generator) * std).to(e.dtype)


@torch.compiler.disable  # a draw from a generator (and maybe a host draw): eager, one clean graph break
def _normal_noise(shape: torch.Size, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """N(0, 1) float32 noise on `device`: from `generator` when it lives there, else from a new
    generator on `device` seeded by one draw from `generator` (seed 0 when None)."""
    if generator is None or not _same_device(generator.device, device):
        seed = (
            0 if generator is None else int(torch.randint(0, 2**62, (), generator=generator, device=generator.device))
        )
        generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """'cuda' and 'cuda:0' name one device when the current one is 0."""

    def index(d: torch.device) -> int:
        return d.index if d.index is not None else (torch.cuda.current_device() if d.type == "cuda" else 0)

    return a.type == b.type and index(a) == index(b)


@torch.compiler.disable  # a host draw that sets the loop's length: never traced
def sample_steps(mean: float, sigma: float, generator: torch.Generator) -> int:
    """Huginn's depth draw: Poisson(LogNormal(log(mean) - sigma^2/2, sigma)) + 1.

    The log-normal's mu is shifted by -sigma^2/2 so that its mean is exactly `mean`; the +1 keeps
    at least one step. E[T] = mean + 1.
    """
    z = torch.randn((), generator=generator, device=generator.device)
    rate = torch.exp(math.log(mean) - sigma**2 / 2 + sigma * z)
    return int(torch.poisson(rate.reshape(1), generator=generator).item()) + 1
