"""LoopedGPT: the one decoder of the lab, with every recurrence as a config option.

Data flow of one forward pass (B batch, S positions, D d_model, V vocab, T steps):

    idx (B, S) -> embed (+ pos_embed) -> prelude (once) -> e (B, S, D)
    h_0 = state_init(e)                         zero | input (= e) | normal
    for t = 1..T:                               the recurrent core, shared weights
        x   = injection(h_{t-1}, e)             none | add | concat | diagonal
        x   = step_norm_t(x)                    optional per-step RMSNorm scales
        x   = core(x, modulation_t)             optional controller / static-LoRA deltas
        h_t = gate(x, h_{t-1})                  optional gated recurrence, else h_t = x
        r_t = final_norm(coda(h_t))             readout: the coda and final norm after EVERY step
        logits_t = r_t E^T                      head tied to the embedding E (or lm_head)
        lambda_t = sigmoid(exit_gate(r_t))      optional Ouro exit gate

Ouro (full-stack loop) is the case prelude = coda = 0, injection none, state_init input: the
whole stack runs T times, the final norm is applied and the head reads after each pass. The plain
model is loops = 1. The sandwich (Huginn) topology has a prelude and a coda.

Recipe options (config.py): `positions` rope (rotary in every attention layer) | learned (a
table `pos_embed` added to the token embedding once, at the input) | none; `tie_head` (false: a
separate `lm_head`); `init` gpt2 | gpt2_depth | torch (`init_weights`); `bias`, `norm_type`.
Modules that only some options create (pos_embed, lm_head) are registered last, so the default
model's weights and random draws are unchanged by their existence.

Beyond forward (inference.py, mixed in): `forward_exit` (per-token early exit at inference,
stopping the loop once every token has exited) and `generate` (greedy decoding with per-(step,
layer) KV caches and the decode-time strategies full / first / last / mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from synthlab.errors import SynthlabError
from synthlab.models.config import ModelConfig
from synthlab.models.controller import (
    LoRABases,
    LowRankModulation,
    RecurrenceController,
    RecurrenceGate,
    StaticStepLoRA,
    StepNorms,
    causal_running_mean,
)
from synthlab.models.exits import exit_distribution
from synthlab.models.inference import KV_STRATEGIES, ExitOutput, GenerationOutput, InferenceMixin
from synthlab.models.layers import Block, Rotary, make_norm, packed_mask
from synthlab.models.pretrained import PretrainedMixin
from synthlab.models.recurrence import Injection, initial_state, sample_steps

__all__ = ["KV_STRATEGIES", "ExitOutput", "GenerationOutput", "LoopedGPT", "ModelOutput", "build_model"]


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, S, V) the last step's
    step_logits: torch.Tensor  # (T, B, S, V) every step's (T = 1 with all_steps=False)
    exit_probs: torch.Tensor | None  # (T, B, S) p(t), when the exit gate is on
    exit_lambdas: torch.Tensor | None  # (T, B, S) lambda_t, the gate's exit probability
    steps: int  # T, the number of recurrent steps run


class LoopedGPT(InferenceMixin, PretrainedMixin, nn.Module):
    def __init__(self, config: ModelConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.prelude = nn.ModuleList(Block(c) for _ in range(c.n_prelude))
        self.core = nn.ModuleList(Block(c) for _ in range(c.n_core))
        self.coda = nn.ModuleList(Block(c) for _ in range(c.n_coda))
        self.injection = Injection(c)
        self.final_norm = make_norm(c)
        self.rotary = Rotary(c.head_dim, c.max_seq_len, c.rope_base) if c.positions == "rope" else None
        self.drop = nn.Dropout(c.dropout)
        self.exit_gate = nn.Linear(c.d_model, 1) if c.exit_gate else None
        modulated = c.controller != "none"
        self.lora_bases = nn.ModuleList(LoRABases(c) for _ in range(c.n_core)) if modulated else None
        self.controller = RecurrenceController(c) if c.controller == "controller" else None
        self.static_lora = StaticStepLoRA(c) if c.controller == "static_lora" else None
        self.recurrence_gate = RecurrenceGate(c) if c.recurrence_gate else None
        self.step_norms = StepNorms(c) if c.step_norm else None
        # Option-only modules last (see the module docstring).
        self.pos_embed = nn.Embedding(c.max_seq_len, c.d_model) if c.positions == "learned" else None
        self.lm_head = None if c.tie_head else nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.init_weights(generator if generator is not None else torch.Generator().manual_seed(0))

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """Initialise every weight from `generator` by config.init, then the recurrence modules'
        own inits (gates, zero heads...), under every scheme.

        gpt2 / gpt2_depth: N(0, weight_std) Linear and Embedding weights, zero biases, residual
        output projections (attn.o, mlp.down) scaled by 1/sqrt(2 L), L = n_layers (distinct
        layers) or the depth run, n_prelude + loops n_core + n_coda. torch: every module's own
        reset_parameters() (PyTorch's default init) under a CPU RNG seeded from `generator`, so
        the draw is reproducible and the global RNG is left as it was.
        """
        c, std = self.config, self.config.weight_std
        if c.init == "torch":
            seed = int(torch.randint(0, 2**62, (), generator=generator, device=generator.device))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                for module in self.modules():
                    if module is not self and hasattr(module, "reset_parameters"):
                        module.reset_parameters()
        else:
            depth = c.n_layers if c.init == "gpt2" else c.n_prelude + c.loops * c.n_core + c.n_coda
            for name, module in self.named_modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    residual_out = name.endswith(("attn.o", "mlp.down"))
                    scale = (2 * depth) ** -0.5 if residual_out else 1.0
                    nn.init.normal_(module.weight, 0.0, std * scale, generator=generator)
                    if getattr(module, "bias", None) is not None:
                        nn.init.zeros_(module.bias)
        for module in self.modules():
            if module is not self and hasattr(module, "init_weights"):
                module.init_weights(generator, c.recurrence_std)

    # --- the pieces of one pass --------------------------------------------------------------------
    def _rope(self, start: int, length: int):
        """RoPE (cos, sin) tables of positions [start, start + length), None without RoPE; a
        position past max_seq_len is an error under every `positions`."""
        if start + length > self.config.max_seq_len:
            raise SynthlabError(f"sequence of {start + length} positions exceeds max_seq_len={self.config.max_seq_len}")
        return self.rotary.tables(start, length) if self.rotary is not None else None

    def _embed_prelude(self, idx, rope, mask, pasts=None, start=0):
        """idx (B, S) at positions start.. -> e (B, S, D) and the prelude's (k, v) per layer."""
        x = self.embed(idx)
        if self.pos_embed is not None:  # learned absolute positions, added once at the input
            x = x + self.pos_embed.weight[start : start + idx.shape[1]]
        x, kvs = self.drop(x), []
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
        return [
            LowRankModulation(bases, deltas[i], c.lora_targets, c.lora_alpha / c.lora_rank)
            for i, bases in enumerate(self.lora_bases)
        ]

    def _readout(self, h, rope, mask=None, pasts=None):
        """h (B, S, D) -> r = final_norm(coda(h)) (B, S, D) and the coda's (k, v) per layer."""
        kvs = []
        for i, block in enumerate(self.coda):
            h, kv = block(h, rope, mask, None if pasts is None else pasts[i])
            kvs.append(kv)
        return self.final_norm(h), kvs

    def _query_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype attention's queries will have: autocast's where it is on, else the weights'."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.embed.weight.dtype

    def head(self, r: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V): the LM head, tied to the token embedding unless tie_head=false."""
        return F.linear(r, self.embed.weight if self.lm_head is None else self.lm_head.weight)

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
    def forward(
        self,
        idx: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        steps: int | None = None,
        generator: torch.Generator | None = None,
        all_steps: bool = True,
        checkpoint: bool = False,
    ) -> ModelOutput:
        """idx (B, S) token ids -> ModelOutput.

        doc_ids (B, S): packed documents; a token attends (and the controller pools) only over
            earlier-or-same positions of its own document.
        steps: the number of recurrent steps (default: loops; in training with step_sampling a
            draw from `generator`). With backprop_last_k = k in training, the first T - k steps
            run without gradients.
        generator: draws the sampled depth and a `normal` initial state (seed 0 when None).
        all_steps: read out (coda, norm, head, gate) after every step; False reads only the last
            step (faster when only the last step's loss is needed; step_logits is then (1, ...)).
        checkpoint: activation checkpointing per recurrent step (when gradients are on): each
            step (core and its readout) keeps only its input state and is recomputed in the
            backward pass (torch.utils.checkpoint, RNG state preserved: the same loss and
            gradients for about one more forward of compute).
        """
        B, S = idx.shape
        T = self._resolve_steps(steps, generator)
        rope, mask = self._rope(0, S), packed_mask(doc_ids, self.config.attention, self._query_dtype(idx.device))
        e, _ = self._embed_prelude(idx, rope, mask)
        h = initial_state(self.config.state_init, e, self.config.state_init_std, generator)
        k = self.config.backprop_last_k
        first_with_grad = T - k if (self.training and k is not None) else 0

        def step(h, t, readout):  # one recurrent step and, if asked, its readout r (B, S, D)
            h, _, _ = self._core_step(h, e, t, rope, mask, doc_ids)
            return h, self._readout(h, rope, mask)[0] if readout else None

        readouts = []
        for t in range(T):
            with torch.set_grad_enabled(torch.is_grad_enabled() and t >= first_with_grad):
                readout = all_steps or t == T - 1
                if checkpoint and torch.is_grad_enabled():
                    h, r = torch.utils.checkpoint.checkpoint(step, h, t, readout, use_reentrant=False)
                else:
                    h, r = step(h, t, readout)
                if r is not None:
                    readouts.append(r)
        r = readouts[0][None] if len(readouts) == 1 else torch.stack(readouts)  # (T, B, S, D)
        step_logits = self.head(r)  # one matmul for every step
        lambdas = probs = None
        if self.exit_gate is not None:
            lambdas = torch.sigmoid(self.exit_gate(r).squeeze(-1).float())  # (T, B, S); fp32: bf16 saturates to 0 / 1
            probs = exit_distribution(lambdas)
        return ModelOutput(step_logits[-1], step_logits, probs, lambdas, T)


def build_model(config: ModelConfig, seed: int = 0) -> LoopedGPT:
    """The model for `config`, initialised from a torch.Generator seeded with `seed` (CPU, fp32)."""
    return LoopedGPT(config, torch.Generator().manual_seed(seed))
