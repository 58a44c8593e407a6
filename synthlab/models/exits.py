"""Ouro's exit distribution and the per-token exit rules used at inference.

Exit gate: lambda_t = sigmoid(Linear(r_t)) from step t's readout r_t. The probability of exiting
first at step t is p(t) = lambda_t prod_{j<t} (1 - lambda_j) for t < T, and the last step takes
the rest, p(T) = prod_{j<T} (1 - lambda_j), so p sums to 1 over the T steps.

Exit rules (strings, as on the command line), each applied per token:
    static:N   exit at step N (N may exceed the trained depth: depth extrapolation)
    q:Q        first step whose cumulative exit probability CDF(t) = 1 - prod_{j<=t}(1 - lambda_j)
               reaches Q (needs the exit gate)
    diff:EPS   first step t >= 2 whose recurrent state changed little:
               ||h_t - h_{t-1}|| / ||h_{t-1}|| < EPS (L2 over the hidden dimension)
    kl:EPS     first step t >= 2 with KL(softmax(z_{t-1}) || softmax(z_t)) < EPS between the
               predictions of successive steps
Every rule exits at the maximum step at the latest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from synthlab.errors import SynthlabError

EXIT_KINDS = ("static", "q", "diff", "kl")


def exit_distribution(lambdas: torch.Tensor) -> torch.Tensor:
    """lambdas (T, ...) instantaneous exit probabilities -> p (T, ...) summing to 1 over T."""
    survival = torch.cumprod(1.0 - lambdas, dim=0)  # S_t = prod_{j<=t} (1 - lambda_j)
    survival_before = torch.cat([torch.ones_like(lambdas[:1]), survival[:-1]], dim=0)  # S_{t-1}
    first_exit = lambdas[:-1] * survival_before[:-1]  # p(t) for t < T
    return torch.cat([first_exit, survival_before[-1:]], dim=0)


@dataclass(frozen=True)
class ExitRule:
    kind: str  # static | q | diff | kl
    value: float  # N for static, Q for q, EPS for diff and kl

    def __str__(self) -> str:
        return f"{self.kind}:{int(self.value) if self.kind == 'static' else self.value}"


def parse_exit_rule(text: str) -> ExitRule:
    """'static:4' | 'q:0.8' | 'diff:0.01' | 'kl:0.001' -> ExitRule; bad input -> SynthlabError."""
    kind, sep, raw = text.partition(":")
    if kind not in EXIT_KINDS or not sep:
        raise SynthlabError(f"exit rule '{text}': expected one of static:N, q:Q, diff:EPS, kl:EPS")
    try:
        value = float(raw)
    except ValueError:
        raise SynthlabError(f"exit rule '{text}': '{raw}' is not a number") from None
    if not math.isfinite(value):  # diff:nan would never (or always) exit, silently
        raise SynthlabError(f"exit rule '{text}': the value must be a finite number")
    if kind == "static" and (value < 1 or value != int(value)):
        raise SynthlabError(f"exit rule '{text}': the static step must be an integer >= 1")
    if kind == "q" and not 0.0 < value <= 1.0:
        raise SynthlabError(f"exit rule '{text}': q must be in (0, 1]")
    if kind in ("diff", "kl") and value < 0:
        raise SynthlabError(f"exit rule '{text}': the threshold must be >= 0")
    return ExitRule(kind, value)


def wants_exit(
    rule: ExitRule,
    step: int,
    *,
    survival: torch.Tensor | None,
    state: torch.Tensor,
    prev_state: torch.Tensor | None,
    logits: torch.Tensor,
    prev_logits: torch.Tensor | None,
) -> torch.Tensor:
    """Bool (B, S): tokens whose rule fires at `step` (1-based), given this step's quantities.

    survival (B, S) = prod_{j<=step} (1 - lambda_j); state (B, S, D) the recurrent state h_step;
    logits (B, S, V) this step's predictions; prev_* the previous step's (None at step 1).
    """
    shape = logits.shape[:2]
    if rule.kind == "static":
        return torch.full(shape, step >= rule.value, dtype=torch.bool, device=logits.device)
    if rule.kind == "q":
        return (1.0 - survival) >= rule.value
    if prev_state is None:  # diff and kl compare two steps: never at step 1
        return torch.zeros(shape, dtype=torch.bool, device=logits.device)
    if rule.kind == "diff":
        change = (state - prev_state).norm(dim=-1) / prev_state.norm(dim=-1).clamp_min(1e-12)
        return change < rule.value
    log_p, log_q = F.log_softmax(prev_logits.float(), -1), F.log_softmax(logits.float(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1) < rule.value
