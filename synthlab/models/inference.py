"""Inference-time mechanisms of LoopedGPT (a mixin): per-token early exit (`forward_exit`) and
generation (greedy, or sampled at a temperature) with per-(step, layer) KV caches (`generate`).

Both run the same pieces as `forward` (model.py: `_embed_prelude`, `_core_step`, `_readout`,
`head`); positions are absolute in decoding: the token at position `pos` gets RoPE tables
`pos` or row `pos` of a learned position table, exactly as in a full recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from synthlab.errors import SynthlabError
from synthlab.models.config import KV_STRATEGIES
from synthlab.models.exits import ExitRule, parse_exit_rule, wants_exit
from synthlab.models.layers import attention_mask
from synthlab.models.recurrence import initial_state


@dataclass
class ExitOutput:
    logits: torch.Tensor  # (B, S, V) each token's predictions at its exit step
    exit_step: torch.Tensor  # (B, S) long, 1-based step at which each token exited
    steps_computed: int  # recurrent steps actually run (< max when every token exited early)
    mean_exit_step: float  # over the positions of `mask` (all positions without one)


@dataclass
class GenerationOutput:
    tokens: torch.Tensor  # (B, S0 + max_new_tokens) prompt followed by the continuation
    cache_bytes: int  # bytes of every K and V tensor held in the caches at the end


class InferenceMixin:
    """forward_exit and generate, mixed into LoopedGPT."""

    # --- early exit at inference ------------------------------------------------------------------
    @torch.no_grad()
    def forward_exit(
        self,
        idx: torch.Tensor,
        exit_rule: str | ExitRule,
        doc_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        steps: int | None = None,
    ) -> ExitOutput:
        """Per-token early exit. Runs steps 1..max (max = steps, default loops; N for static:N)
        and stops as soon as every token in `mask` (B, S) bool (default: all) has exited, so the
        saving is real: `steps_computed` counts the steps run."""
        rule = parse_exit_rule(exit_rule) if isinstance(exit_rule, str) else exit_rule
        if rule.kind == "q" and self.exit_gate is None:
            raise SynthlabError(f"exit rule {rule} needs a model with exit_gate = true")
        max_steps = int(rule.value) if rule.kind == "static" else self._eval_steps(steps)
        B, S = idx.shape
        rope, attn_mask = self._rope(0, S), attention_mask(doc_ids)
        e, _ = self._embed_prelude(idx, rope, attn_mask)
        h = initial_state(self.config.state_init, e, self.config.state_init_std, None)
        counted = mask.bool() if mask is not None else torch.ones(B, S, dtype=torch.bool, device=idx.device)
        exit_step = torch.zeros(B, S, dtype=torch.long, device=idx.device)  # 0 = not yet
        out_logits = survival = prev_h = prev_logits = None
        for t in range(1, max_steps + 1):
            h_new, _, _ = self._core_step(h, e, t - 1, rope, attn_mask, doc_ids)
            r, _ = self._readout(h_new, rope, attn_mask)
            logits = self.head(r)  # (B, S, V)
            if self.exit_gate is not None:
                lam = torch.sigmoid(self.exit_gate(r).squeeze(-1).float())
                survival = (1 - lam) if survival is None else survival * (1 - lam)
            fires = wants_exit(
                rule, t, survival=survival, state=h_new, prev_state=prev_h, logits=logits, prev_logits=prev_logits
            )
            if t == max_steps:
                fires = torch.ones_like(fires)
            newly = fires & (exit_step == 0)
            exit_step[newly] = t
            out_logits = logits.clone() if out_logits is None else torch.where(newly[..., None], logits, out_logits)
            h = prev_h = h_new
            prev_logits = logits
            if bool((exit_step[counted] > 0).all()):
                break
        unexited = exit_step == 0  # only tokens outside the mask: they end at the last step run
        out_logits = torch.where(unexited[..., None], logits, out_logits)
        exit_step[unexited] = t
        mean_exit = exit_step[counted].float().mean().item() if counted.any() else float("nan")
        return ExitOutput(out_logits, exit_step, t, mean_exit)

    # --- greedy generation with KV caches ---------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        kv_strategy: str = "full",
        steps: int | None = None,
        generator: torch.Generator | None = None,
        temperature: float = 0.0,
    ) -> GenerationOutput:
        """Decoding of `max_new_tokens` after the prompt idx (B, S0) (no padding): greedy at
        temperature 0, else each token drawn from softmax(logits / temperature) by `generator`.

        Prefill runs the prompt through every step and keeps one KV cache per (step, core layer)
        (prelude and coda layers run once per token and have one cache each). Decoding one new
        token runs all T steps; at step t, core layer l, the token attends to its own step-t key
        and value plus a cache of the earlier positions chosen by kv_strategy:
          full   the step-t cache (T caches per layer): identical to recomputing from scratch
          first  one cache per layer: the prefill's step-1 KV; each new token appends its step-1 KV
          last   one cache per layer: the prefill's step-T KV; new tokens append their step-T KV
          mean   one cache per layer: the mean over steps of the prefill KV; new tokens append the
                 mean over steps of their KV
        first / last / mean hold 1/T of full's core cache. A `normal` initial state is drawn per
        call from `generator`, so it matches a full forward only for zero / input states.
        """
        if kv_strategy not in KV_STRATEGIES:
            raise SynthlabError(f"kv_strategy '{kv_strategy}': choose {', '.join(KV_STRATEGIES)}")
        if max_new_tokens < 1:
            raise SynthlabError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not temperature >= 0 or temperature == float("inf"):
            raise SynthlabError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
        B, S0 = idx.shape
        if S0 + max_new_tokens > self.config.max_seq_len:
            raise SynthlabError(
                f"prompt {S0} + max_new_tokens {max_new_tokens} exceeds max_seq_len={self.config.max_seq_len}"
            )
        T = self._eval_steps(steps)
        cfg = self.config

        def state0(e):
            return initial_state(cfg.state_init, e, cfg.state_init_std, generator)

        # Prefill: every step keeps its own cache.
        rope = self._rope(0, S0)
        e, prelude_kv = self._embed_prelude(idx, rope, None)
        h, core_kv, prefix_sums = state0(e), [], []
        for t in range(T):
            h, kvs, x_in = self._core_step(h, e, t, rope)
            core_kv.append(kvs)  # [t][layer] = (k, v), each (B, H, S0, Dh)
            prefix_sums.append(x_in.sum(dim=1))
        r, coda_kv = self._readout(h, rope)
        if kv_strategy != "full":  # collapse to one cache per core layer
            core_kv = [_combine([core_kv[t][i] for t in range(T)], kv_strategy) for i in range(len(self.core))]
        tokens = [idx, _pick(self.head(r[:, -1:]), temperature, generator)]

        for pos in range(S0, S0 + max_new_tokens - 1):
            rope = self._rope(pos, 1)
            e, kvs = self._embed_prelude(tokens[-1], rope, None, prelude_kv, start=pos)
            prelude_kv = _append(prelude_kv, kvs)
            h, per_step = state0(e), []
            for t in range(T):
                pasts = core_kv[t] if kv_strategy == "full" else core_kv
                h, kvs, x_in = self._core_step(h, e, t, rope, pasts=pasts, prefix=(prefix_sums[t], pos))
                prefix_sums[t] = prefix_sums[t] + x_in[:, 0]
                if kv_strategy == "full":
                    core_kv[t] = _append(core_kv[t], kvs)
                else:
                    per_step.append(kvs)
            if kv_strategy != "full":
                new = [_combine([per_step[t][i] for t in range(T)], kv_strategy) for i in range(len(self.core))]
                core_kv = _append(core_kv, new)
            r, kvs = self._readout(h, rope, pasts=coda_kv)
            coda_kv = _append(coda_kv, kvs)
            tokens.append(_pick(self.head(r), temperature, generator))

        held = [prelude_kv, coda_kv] + (core_kv if kv_strategy == "full" else [core_kv])
        cache_bytes = sum(t.numel() * t.element_size() for layer in held for kv in layer for t in kv)
        return GenerationOutput(torch.cat(tokens, dim=1), cache_bytes)


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """(B, 1, V) logits -> (B, 1) next tokens: the argmax at temperature 0, else a draw."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits[:, -1].float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


def _append(caches, new):
    """Per layer: cached (k, v) (B, H, P, Dh) + new (k, v) (B, H, 1, Dh) -> (B, H, P + 1, Dh)."""
    return [(torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(caches, new)]


def _combine(per_step, strategy):
    """One layer's (k, v) of every step -> the single (k, v) kept by strategy first/last/mean."""
    if strategy == "first":
        return per_step[0]
    if strategy == "last":
        return per_step[-1]
    return (torch.stack([k for k, _ in per_step]).mean(0), torch.stack([v for _, v in per_step]).mean(0))
