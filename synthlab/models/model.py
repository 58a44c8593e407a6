"""LoopedGPT: the one decoder of the lab, with every recurrence as a config option.

Data flow of one forward pass (B batch, S positions, D d_model, V vocab, T steps):

    idx (B, S) -> embed -> prelude (once) -> e (B, S, D)
    h_0 = state_init(e)                         zero | input (= e) | normal
    for t = 1..T:                               the recurrent core, shared weights
        x   = injection(h_{t-1}, e)             none | add | concat | diagonal
        x   = step_norm_t(x)                    optional per-step RMSNorm scales
        x   = core(x, modulation_t)             optional controller / static-LoRA deltas
        h_t = gate(x, h_{t-1})                  optional gated recurrence, else h_t = x
        r_t = final_norm(coda(h_t))             readout: the coda and final norm after EVERY step
        logits_t = r_t E^T                      head tied to the embedding E
        lambda_t = sigmoid(exit_gate(r_t))      optional Ouro exit gate

Ouro (full-stack loop) is the case prelude = coda = 0, injection none, state_init input: the
whole stack runs T times, the final norm is applied and the head reads after each pass. The plain
model is loops = 1. The sandwich (Huginn) topology has a prelude and a coda.

Beyond forward: `forward_exit` (per-token early exit at inference, stopping the loop once every
token has exited) and `generate` (greedy decoding with per-(step, layer) KV caches and the
decode-time strategies full / first / last / mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from synthlab.errors import SynthlabError
from synthlab.models.config import ModelConfig
from synthlab.models.controller import (LoRABases, LowRankModulation, RecurrenceController,
                                        RecurrenceGate, StaticStepLoRA, StepNorms,
                                        causal_running_mean)
from synthlab.models.exits import ExitRule, exit_distribution, parse_exit_rule, wants_exit
from synthlab.models.layers import Block, Rotary, attention_mask, make_norm
from synthlab.models.recurrence import Injection, initial_state, sample_steps

KV_STRATEGIES = ("full", "first", "last", "mean")


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, S, V) the last step's
    step_logits: torch.Tensor  # (T, B, S, V) every step's (T = 1 with all_steps=False)
    exit_probs: torch.Tensor | None  # (T, B, S) p(t), when the exit gate is on
    exit_lambdas: torch.Tensor | None  # (T, B, S) lambda_t, the gate's exit probability
    steps: int  # T, the number of recurrent steps run


@dataclass
class ExitOutput:
    logits: torch.Tensor  # (B, S, V) each token's predictions at its exit step
    exit_step: torch.Tensor  # (B, S) long, 1-based step at which each token exited
    steps_computed: int  # recurrent steps actually run (< max when every token exited early)
    mean_exit_step: float  # over the positions of `mask` (all positions without one)


@dataclass
class GenerationOutput:
    tokens: torch.Tensor  # (B, S0 + max_new_tokens) prompt followed by the greedy continuation
    cache_bytes: int  # bytes of every K and V tensor held in the caches at the end


class LoopedGPT(nn.Module):
    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.prelude = nn.ModuleList(Block(c) for _ in range(c.n_prelude))
        self.core = nn.ModuleList(Block(c) for _ in range(c.n_core))
        self.coda = nn.ModuleList(Block(c) for _ in range(c.n_coda))
        self.injection = Injection(c)
        self.final_norm = make_norm(c)
        self.rotary = Rotary(c.head_dim, c.max_seq_len, c.rope_base)
        self.drop = nn.Dropout(c.dropout)
        self.exit_gate = nn.Linear(c.d_model, 1) if c.exit_gate else None
        modulated = c.controller != "none"
        self.lora_bases = nn.ModuleList(LoRABases(c) for _ in range(c.n_core)) if modulated else None
        self.controller = RecurrenceController(c) if c.controller == "controller" else None
        self.static_lora = StaticStepLoRA(c) if c.controller == "static_lora" else None
        self.recurrence_gate = RecurrenceGate(c) if c.recurrence_gate else None
        self.step_norms = StepNorms(c) if c.step_norm else None
        self.init_weights(generator if generator is not None else torch.Generator().manual_seed(0))

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """GPT-2 init from `generator`: N(0, std) weights, zero biases, residual output projections
        scaled by 1/sqrt(2 n_layers); then the recurrence modules' own inits (gates, zero heads...)."""
        std = self.config.init_std
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                residual_out = name.endswith(("attn.o", "mlp.down"))
                scale = (2 * self.config.n_layers) ** -0.5 if residual_out else 1.0
                nn.init.normal_(module.weight, 0.0, std * scale, generator=generator)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():
            if module is not self and hasattr(module, "init_weights"):
                module.init_weights(generator, std)

    # --- the pieces of one pass --------------------------------------------------------------------
    def _embed_prelude(self, idx, rope, mask, pasts=None):
        """idx (B, S) -> e (B, S, D) and the prelude's (k, v) per layer."""
        x, kvs = self.drop(self.embed(idx)), []
        for i, block in enumerate(self.prelude):
            x, kv = block(x, rope, mask, None if pasts is None else pasts[i])
            kvs.append(kv)
        return x, kvs

    def _core_step(self, h, e, step, rope, mask=None, doc_ids=None, pasts=None, prefix=None):
        """One recurrent step (0-based `step`): h (B, S, D) -> (h_next, core (k, v) per layer,
        x_in the core's input, whose running mean the controller reads).

        prefix = (sum (B, D), count) of earlier positions' x_in at this step (decoding only)."""
        x = self.injection(h, e)
        if self.step_norms is not None:
            x = self.step_norms(x, step)
        mods = self._modulations(x, step, doc_ids, prefix)
        x_in, kvs = x, []
        for i, block in enumerate(self.core):
            x, kv = block(x, rope, mask, None if pasts is None else pasts[i], mods[i])
            kvs.append(kv)
        if self.recurrence_gate is not None:
            x = self.recurrence_gate(x, h)
        return x, kvs, x_in

    def _modulations(self, x, step, doc_ids, prefix):
        """The per-core-layer `mod` callables of this step (None without a controller)."""
        if self.lora_bases is None:
            return [None] * len(self.core)
        if self.controller is not None:
            prefix_sum, count = prefix if prefix is not None else (None, 0)
            pooled = causal_running_mean(x, doc_ids, prefix_sum, count)  # (B, S, D)
            deltas = self.controller(pooled, step)  # (B, S, n_core, n_targets, r)
            deltas = deltas.movedim(-3, 0)  # (n_core, B, S, n_targets, r)
        else:
            deltas = self.static_lora(step)  # (n_core, n_targets, r)
        c = self.config
        return [LowRankModulation(bases, deltas[i], c.lora_targets, c.lora_alpha / c.lora_rank)
                for i, bases in enumerate(self.lora_bases)]

    def _readout(self, h, rope, mask=None, pasts=None):
        """h (B, S, D) -> r = final_norm(coda(h)) (B, S, D) and the coda's (k, v) per layer."""
        kvs = []
        for i, block in enumerate(self.coda):
            h, kv = block(h, rope, mask, None if pasts is None else pasts[i])
            kvs.append(kv)
        return self.final_norm(h), kvs

    def head(self, r: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V): the LM head, tied to the token embedding."""
        return F.linear(r, self.embed.weight)

    def sample_steps(self, generator: torch.Generator) -> int:
        """A training-time depth draw: Poisson(LogNormal(log(loops) - s^2/2, s)) + 1."""
        return sample_steps(self.config.loops, self.config.step_sigma, generator)

    def _resolve_steps(self, steps, generator) -> int:
        """Forward's depth: `steps`; else a draw in training with step_sampling; else loops."""
        if steps is not None or not (self.training and self.config.step_sampling):
            return self._eval_steps(steps)
        if generator is None:
            raise SynthlabError("step_sampling draws the depth: pass forward(generator=...)")
        return self.sample_steps(generator)

    def _eval_steps(self, steps) -> int:
        """Inference depth: `steps`, else loops (never a training-time draw)."""
        if steps is not None and steps < 1:
            raise SynthlabError(f"steps must be >= 1, got {steps}")
        return int(steps) if steps is not None else self.config.loops

    # --- training / evaluation forward ----------------------------------------------------------
    def forward(self, idx: torch.Tensor, doc_ids: torch.Tensor | None = None,
                steps: int | None = None, generator: torch.Generator | None = None,
                all_steps: bool = True) -> ModelOutput:
        """idx (B, S) token ids -> ModelOutput.

        doc_ids (B, S): packed documents; a token attends (and the controller pools) only over
            earlier-or-same positions of its own document.
        steps: the number of recurrent steps (default: loops; in training with step_sampling a
            draw from `generator`). With backprop_last_k = k in training, the first T - k steps
            run without gradients.
        generator: draws the sampled depth and a `normal` initial state (seed 0 when None).
        all_steps: read out (coda, norm, head, gate) after every step; False reads only the last
            step (faster when only the last step's loss is needed; step_logits is then (1, ...)).
        """
        B, S = idx.shape
        T = self._resolve_steps(steps, generator)
        rope, mask = self.rotary.tables(0, S), attention_mask(doc_ids)
        e, _ = self._embed_prelude(idx, rope, mask)
        h = initial_state(self.config.state_init, e, self.config.state_init_std, generator)
        k = self.config.backprop_last_k
        first_with_grad = T - k if (self.training and k is not None) else 0
        readouts = []
        for t in range(T):
            with torch.set_grad_enabled(torch.is_grad_enabled() and t >= first_with_grad):
                h, _, _ = self._core_step(h, e, t, rope, mask, doc_ids)
                if all_steps or t == T - 1:
                    readouts.append(self._readout(h, rope, mask)[0])
        r = readouts[0][None] if len(readouts) == 1 else torch.stack(readouts)  # (T, B, S, D)
        step_logits = self.head(r)  # one matmul for every step
        lambdas = probs = None
        if self.exit_gate is not None:
            lambdas = torch.sigmoid(self.exit_gate(r).squeeze(-1))  # (T, B, S)
            probs = exit_distribution(lambdas)
        return ModelOutput(step_logits[-1], step_logits, probs, lambdas, T)

    # --- early exit at inference ------------------------------------------------------------------
    @torch.no_grad()
    def forward_exit(self, idx: torch.Tensor, exit_rule: str | ExitRule,
                     doc_ids: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                     steps: int | None = None) -> ExitOutput:
        """Per-token early exit. Runs steps 1..max (max = steps, default loops; N for static:N)
        and stops as soon as every token in `mask` (B, S) bool (default: all) has exited, so the
        saving is real: `steps_computed` counts the steps run."""
        rule = parse_exit_rule(exit_rule) if isinstance(exit_rule, str) else exit_rule
        if rule.kind == "q" and self.exit_gate is None:
            raise SynthlabError(f"exit rule {rule} needs a model with exit_gate = true")
        max_steps = int(rule.value) if rule.kind == "static" else self._eval_steps(steps)
        B, S = idx.shape
        rope, attn_mask = self.rotary.tables(0, S), attention_mask(doc_ids)
        e, _ = self._embed_prelude(idx, rope, attn_mask)
        h = initial_state(self.config.state_init, e, self.config.state_init_std, None)
        counted = mask.bool() if mask is not None else torch.ones(B, S, dtype=torch.bool,
                                                                 device=idx.device)
        exit_step = torch.zeros(B, S, dtype=torch.long, device=idx.device)  # 0 = not yet
        out_logits = survival = prev_h = prev_logits = None
        for t in range(1, max_steps + 1):
            h_new, _, _ = self._core_step(h, e, t - 1, rope, attn_mask, doc_ids)
            r, _ = self._readout(h_new, rope, attn_mask)
            logits = self.head(r)  # (B, S, V)
            if self.exit_gate is not None:
                lam = torch.sigmoid(self.exit_gate(r).squeeze(-1))
                survival = (1 - lam) if survival is None else survival * (1 - lam)
            fires = wants_exit(rule, t, survival=survival, state=h_new, prev_state=prev_h,
                               logits=logits, prev_logits=prev_logits)
            if t == max_steps:
                fires = torch.ones_like(fires)
            newly = fires & (exit_step == 0)
            exit_step[newly] = t
            out_logits = logits.clone() if out_logits is None else torch.where(
                newly[..., None], logits, out_logits)
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
    def generate(self, idx: torch.Tensor, max_new_tokens: int, kv_strategy: str = "full",
                 steps: int | None = None,
                 generator: torch.Generator | None = None) -> GenerationOutput:
        """Greedy decoding of `max_new_tokens` after the prompt idx (B, S0) (no padding).

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
        B, S0 = idx.shape
        if S0 + max_new_tokens > self.config.max_seq_len:
            raise SynthlabError(f"prompt {S0} + max_new_tokens {max_new_tokens} exceeds "
                                f"max_seq_len={self.config.max_seq_len}")
        T = self._eval_steps(steps)
        cfg = self.config

        def state0(e):
            return initial_state(cfg.state_init, e, cfg.state_init_std, generator)

        # Prefill: every step keeps its own cache.
        rope = self.rotary.tables(0, S0)
        e, prelude_kv = self._embed_prelude(idx, rope, None)
        h, core_kv, prefix_sums = state0(e), [], []
        for t in range(T):
            h, kvs, x_in = self._core_step(h, e, t, rope)
            core_kv.append(kvs)  # [t][layer] = (k, v), each (B, H, S0, Dh)
            prefix_sums.append(x_in.sum(dim=1))
        r, coda_kv = self._readout(h, rope)
        if kv_strategy != "full":  # collapse to one cache per core layer
            core_kv = [_combine([core_kv[t][i] for t in range(T)], kv_strategy)
                       for i in range(len(self.core))]
        tokens = [idx, self.head(r[:, -1:]).argmax(-1)]

        for pos in range(S0, S0 + max_new_tokens - 1):
            rope = self.rotary.tables(pos, 1)
            e, kvs = self._embed_prelude(tokens[-1], rope, None, prelude_kv)
            prelude_kv = _append(prelude_kv, kvs)
            h, per_step = state0(e), []
            for t in range(T):
                pasts = core_kv[t] if kv_strategy == "full" else core_kv
                h, kvs, x_in = self._core_step(h, e, t, rope, pasts=pasts,
                                               prefix=(prefix_sums[t], pos))
                prefix_sums[t] = prefix_sums[t] + x_in[:, 0]
                if kv_strategy == "full":
                    core_kv[t] = _append(core_kv[t], kvs)
                else:
                    per_step.append(kvs)
            if kv_strategy != "full":
                new = [_combine([per_step[t][i] for t in range(T)], kv_strategy)
                       for i in range(len(self.core))]
                core_kv = _append(core_kv, new)
            r, kvs = self._readout(h, rope, pasts=coda_kv)
            coda_kv = _append(coda_kv, kvs)
            tokens.append(self.head(r).argmax(-1))

        held = [prelude_kv, coda_kv] + (core_kv if kv_strategy == "full" else [core_kv])
        cache_bytes = sum(t.numel() * t.element_size() for layer in held for kv in layer for t in kv)
        return GenerationOutput(torch.cat(tokens, dim=1), cache_bytes)


def _append(caches, new):
    """Per layer: cached (k, v) (B, H, P, Dh) + new (k, v) (B, H, 1, Dh) -> (B, H, P + 1, Dh)."""
    return [(torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2))
            for (k, v), (nk, nv) in zip(caches, new)]


def _combine(per_step, strategy):
    """One layer's (k, v) of every step -> the single (k, v) kept by strategy first/last/mean."""
    if strategy == "first":
        return per_step[0]
    if strategy == "last":
        return per_step[-1]
    return (torch.stack([k for k, _ in per_step]).mean(0),
            torch.stack([v for _, v in per_step]).mean(0))


def build_model(config: ModelConfig, seed: int = 0) -> LoopedGPT:
    """The model for `config`, initialised from a torch.Generator seeded with `seed` (CPU, fp32)."""
    return LoopedGPT(config, torch.Generator().manual_seed(seed))
