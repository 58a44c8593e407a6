"""OUROBOROS on a Qwen2-family checkpoint: prelude, one recurrent layer rewritten per step, coda.

The frozen base is cut into three parts (OUROBOROS, docs/claims.md C11):

    embed -> prelude layers -> recurrent layer x depth -> coda layers -> final norm -> lm_head

At every step the recurrent layer's seven projections (q, k, v, o, gate, up, down) are modulated
by a low-rank update `dW = (alpha / r) B diag(delta) A`. A (r x in) and B (out x r) are FIXED
buffers from the SVD of the mean weight difference between the removed layers and the recurrent
one; only the magnitudes `delta` change. Variants (one code path, chosen by `variant`):

- controller: delta is written per token by a small MLP that reads the CAUSAL running mean of the
  state entering the recurrent layer (prefix mean, never future tokens) plus a step embedding.
- static:     delta is a learned vector per (step, target), the same for every input.
- nogate:     the controller, but the new state simply replaces the old one (no gated recurrence).
- truncated:  prelude, the recurrent layer once, coda; nothing trainable.
- base:       the full, unmodified checkpoint.

Trainable parameters of the looped variants (base frozen, bases fixed), with d the hidden size,
S = max_steps, H = controller_hidden, K = 7 targets:
    gate       W (d x 2d) + b (d)               per-channel gate, b = -2 so g = 0.12 at init
    step_norm  S x d                            per-step RMSNorm scales
    controller S x d (step embedding) + (d+1) H + (H+1) K r   [controller, nogate]
    static     S x K x r                                       [static]
For the Qwen2.5-3B shape (d 2048, S 16, r 32) the gate is 8.39M and the controller with H = 320
brings the total to 9.18M. The reference states only the total (9.2M); with the gate and norm
forms above fixed by the paper, H is the one free size and 320 (a multiple of 64) is the width
that total implies: (9.2M - 8.456M) / (d + 1 + K r) = 327 -> 320. See `trainable_breakdown`.

One recurrent step t, with h the state entering it (batch, T, d):
    delta_t = controller(causal_running_mean(h), t)         (batch, T, K, r), zero at init
    c = layer_{W + dW(delta_t)}(h)                          the HF decoder layer, modulated
    c = rmsnorm(c) * gamma_t * rms(h)                       per-step RMSNorm, keeping h's scale
    g = sigmoid(W_g [rmsnorm(c); rmsnorm(h)] + b_g)         per-channel gate (absent in nogate)
    h = g c + (1 - g) h
Choices the reference leaves open, made here: the per-step norm hands the candidate back at the
incoming state's RMS (the frozen coda expects Qwen's residual magnitudes, which a plain RMSNorm
would shrink to 1), and the gate and controller read normalised states (Qwen's residual stream has
a few channels in the thousands that would saturate a linear gate).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from synthlab.errors import SynthlabError
from synthlab.models.controller import causal_running_mean
from synthlab.ouroboros.data import PAD
from synthlab.ouroboros.lora import TARGETS, ModulatedLinear, Split, lora_bases, mean_residual, target_linear
from synthlab.training.configs import LOOPED_VARIANTS, VARIANTS, OuroborosConfig  # noqa: F401 (re-exported)

# What each row of `ouroboros eval` is (printed under its table).
VARIANT_ROWS = {
    "controller": "trained: the recurrent layer run `depth` times, rewritten per token by the controller, gated",
    "static": "trained: the recurrent layer run `depth` times with learned per-step magnitudes, the same for "
    "every input",
    "nogate": "trained: the controller without the gate (each step's output replaces the state)",
    "truncated": "baseline, nothing trained: prelude, the recurrent layer once, coda (the removed layers cut "
    "out): what the looped variants start from; one loss, listed at every depth",
    "base": "baseline, nothing trained: the full checkpoint, every layer once; one loss, listed at every depth",
}

# Reference split of the 36-layer Qwen2.5-3B: prelude 0-7, recurrent 18, coda 28-35.
_REFERENCE_LAYERS, _REFERENCE_PRELUDE, _REFERENCE_CODA = 36, 8, 8


def resolve_split(num_layers: int, config: OuroborosConfig) -> Split:
    """The split for a `num_layers`-deep base: prelude, recurrent layer, coda, and the removed layers
    in between (at least one: the LoRA bases are built from them), so a base needs 2 layers or more.

    Default rule, proportional to the reference 8 / 1 / 8 of 36: prelude and coda each
    round(8 L / 36) layers (at least 1), recurrent layer L // 2. L = 36 gives 0-7 | 18 | 28-35,
    L = 28 gives 0-5 | 14 | 22-27, L = 24 gives 0-4 | 12 | 19-23, L = 4 gives 0 | 2 | 3. Where that
    leaves no room (L < 4, or with a given prelude / coda), the defaulted sizes shrink, the larger
    first, until the recurrent layer and one removed layer fit (L = 3: none | 1 | 2, L = 2:
    none | 1 | none), and a defaulted recurrent layer moves to the middle of what lies between.
    Given values are never changed: a split they make impossible is one error naming them.
    """
    if num_layers < 2:
        raise SynthlabError(
            f"OUROBOROS needs a base of at least 2 layers (a recurrent layer and one removed "
            f"layer for the LoRA bases); this base has {num_layers}"
        )
    given = {
        name: getattr(config, name)
        for name in ("prelude_layers", "coda_layers", "recurrent_layer")
        if getattr(config, name) is not None
    }
    for name, value in given.items():
        if value < 0:
            raise SynthlabError(f"{name} must be >= 0, got {value}")
    share = max(1, round(num_layers * _REFERENCE_PRELUDE / _REFERENCE_LAYERS))
    sizes = {name: given.get(name, share) for name in ("prelude_layers", "coda_layers")}
    defaulted = [name for name in sizes if name not in given]
    room = num_layers - 2  # besides the recurrent layer and one removed layer
    while sizes["prelude_layers"] + sizes["coda_layers"] > room and any(sizes[n] > 0 for n in defaulted):
        shrink = max((n for n in defaulted if sizes[n] > 0), key=lambda n: sizes[n])
        sizes[shrink] -= 1
    n_prelude, n_coda = sizes["prelude_layers"], sizes["coda_layers"]
    coda_start = num_layers - n_coda

    def culprits() -> str:
        named = [f"{n} {v}" for n, v in given.items()]
        return f" (given: {', '.join(named)})" if named else ""

    if n_prelude + n_coda > room:
        raise SynthlabError(
            f"prelude_layers {n_prelude} + coda_layers {n_coda} leave no room in a {num_layers}-layer base for the "
            f"recurrent layer and a removed layer{culprits()}: pass --prelude-layers / --coda-layers summing to at "
            f"most {room}"
        )
    recurrent = config.recurrent_layer
    if recurrent is None:
        recurrent = num_layers // 2
        if not n_prelude <= recurrent < coda_start:
            recurrent = (n_prelude + coda_start) // 2
    prelude_text = f"0-{n_prelude - 1}" if n_prelude else "none"
    coda_text = f"{coda_start}-{num_layers - 1}" if n_coda else "none"
    if not n_prelude <= recurrent < coda_start:
        raise SynthlabError(
            f"recurrent_layer {recurrent} must lie between the prelude ({prelude_text}) and the coda ({coda_text}) "
            f"of a {num_layers}-layer base{culprits()}: pass --recurrent-layer from {n_prelude} to {coda_start - 1}"
        )
    removed = tuple(i for i in range(n_prelude, coda_start) if i != recurrent)
    return Split(tuple(range(n_prelude)), recurrent, tuple(range(coda_start, num_layers)), removed)


def describe_split(split: Split) -> str:
    """`prelude 0-7, recurrent 18, coda 28-35` (an empty part: `none`)."""

    def span(layers: tuple[int, ...]) -> str:
        return f"{layers[0]}-{layers[-1]}" if layers else "none"

    return f"prelude {span(split.prelude)}, recurrent {split.recurrent}, coda {span(split.coda)}"


def causal_mask(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive (1, 1, T, T) mask: 0 on and below the diagonal, the dtype's minimum above.

    Passed explicitly to every layer so eager and SDPA attention are causal for the same reason
    (HF's SDPA path drops `is_causal` whenever a mask is given).
    """
    blocked = torch.ones(length, length, dtype=torch.bool, device=device).triu(1)
    mask = torch.zeros(length, length, dtype=dtype, device=device)
    return mask.masked_fill(blocked, torch.finfo(dtype).min)[None, None]


class Controller(nn.Module):
    """Causal pooled state + step embedding -> MLP -> one delta (r) per target, per token.

    Not models' RecurrenceController (step in the hidden layer, GELU, learned norm, n_core layers): the
    reference adds an S x d step table (counted in its 9.2M) to the input and uses SiLU.
    """

    def __init__(
        self, hidden_size: int, width: int, n_targets: int, rank: int, max_steps: int, generator: torch.Generator
    ) -> None:
        super().__init__()
        self.n_targets, self.rank = n_targets, rank
        self.step_embedding = nn.Parameter(torch.randn(max_steps, hidden_size, generator=generator))
        self.inp = nn.Linear(hidden_size, width)
        self.heads = nn.Linear(width, n_targets * rank)  # the 7 output heads, stacked
        with torch.no_grad():
            self.inp.weight.normal_(0.0, 1.0 / math.sqrt(hidden_size), generator=generator)
            self.inp.bias.zero_()
            self.heads.weight.zero_()  # zero heads: delta = 0 at init, the system starts unmodulated
            self.heads.bias.zero_()

    def forward(self, h: torch.Tensor, step: int) -> torch.Tensor:
        # Pooled state normalised (Qwen's residual stream has channels in the thousands), then the
        # step identity at the same scale (embedding ~ N(0, 1)). Pooled in float32 whatever the base
        # dtype. (batch, T, d) -> (batch, T, K, r)
        pooled = F.rms_norm(causal_running_mean(h.float()), (h.shape[-1],))
        x = pooled + self.step_embedding[step]
        out = self.heads(F.silu(self.inp(x)))
        return out.view(*h.shape[:2], self.n_targets, self.rank)


class OuroborosLM(nn.Module):
    """The looped system (or a baseline) around a frozen HF Qwen2ForCausalLM."""

    def __init__(self, base: nn.Module, config: OuroborosConfig, generator: torch.Generator) -> None:
        super().__init__()
        if getattr(base.config, "model_type", None) != "qwen2":
            raise SynthlabError(f"base must be a Qwen2-family checkpoint, got model_type '{base.config.model_type}'")
        if any(kind != "full_attention" for kind in base.config.layer_types):
            raise SynthlabError("base uses sliding-window layers, which OUROBOROS does not support")
        self.base = base.requires_grad_(False)
        self.config = config
        layers = base.model.layers
        self.split = resolve_split(len(layers), config)
        self.targets = tuple(TARGETS)
        d = base.config.hidden_size
        device = layers[0].self_attn.q_proj.weight.device
        if device.type == "meta":  # a base FSDP fills after sharding: the trainables wait on the CPU
            device = torch.device("cpu")
        if config.variant in LOOPED_VARIANTS:
            self._attach_bases(layers)
            # Trainable parts in float32 whatever the base dtype; modules built on CPU (seeded
            # init), then moved; plain parameters are created on the device.
            self.step_norm = nn.Parameter(torch.ones(config.max_steps, d, device=device))
            if config.variant != "nogate":
                self.gate = nn.Linear(2 * d, d)
                with torch.no_grad():  # W = 0, b = -2: g = sigmoid(-2) = 0.12 everywhere at init
                    self.gate.weight.zero_()
                    self.gate.bias.fill_(config.gate_bias)
                self.gate.to(device)
            if config.variant == "static":
                shape = (config.max_steps, len(self.targets), config.rank)
                self.static_delta = nn.Parameter(torch.zeros(shape, device=device))
            else:
                self.controller = Controller(
                    d, config.controller_hidden, len(self.targets), config.rank, config.max_steps, generator
                ).to(device)

    def train(self, mode: bool = True) -> OuroborosLM:
        """Train mode for the trainable parts only; the frozen base always runs in eval mode."""
        super().train(mode)
        self.base.eval()
        return self

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.named_parameters() if p.requires_grad}

    def _attach_bases(self, layers: nn.ModuleList) -> None:
        layer = layers[self.split.recurrent]
        scale = self.config.alpha / self.config.rank
        origin = (self.split, self.config.rank, scale)
        for target in self.targets:
            linear = target_linear(layer, target)
            if isinstance(linear, ModulatedLinear):  # several variants sharing one loaded base
                if linear.origin != origin:
                    raise SynthlabError("this base carries OUROBOROS bases of another split or rank; load it afresh")
                continue
            a, b = lora_bases(mean_residual(layers, self.split, target), self.config.rank)
            wrapped = ModulatedLinear(linear, a.to(linear.weight), b.to(linear.weight), scale, origin)
            parent, attr = TARGETS[target]
            setattr(getattr(layer, parent), attr, wrapped)

    @contextlib.contextmanager
    def _modulation(self, deltas: torch.Tensor):
        """Set each target's delta for one step; deltas (..., K, r), the K axis in TARGETS order."""
        layer = self.base.model.layers[self.split.recurrent]
        wrapped = [target_linear(layer, t) for t in self.targets]
        try:
            for k, module in enumerate(wrapped):
                module.delta = deltas[..., k, :]
            yield
        finally:
            for module in wrapped:
                module.delta = None

    def step_deltas(self, h: torch.Tensor, step: int) -> torch.Tensor:
        """(batch, T, K, r) for the controller variants, (K, r) for static."""
        if self.config.variant == "static":
            return self.static_delta[step]
        return self.controller(h, step)

    def _run(self, h, indices, mask, position_embeddings):
        for index in indices:
            h = self._layer(self.base.model.layers[index], h, mask, position_embeddings)
        return h

    @staticmethod
    def _layer(layer, h, mask, position_embeddings):
        out = layer(h, attention_mask=mask, position_embeddings=position_embeddings)
        return out[0] if isinstance(out, tuple) else out  # transformers 4.x layers return a tuple

    def _recur(self, h, depth, mask, position_embeddings):
        layer = self.base.model.layers[self.split.recurrent]
        for step in range(depth):
            with self._modulation(self.step_deltas(h, step)):
                new = self._layer(layer, h, mask, position_embeddings)
            # Per-step RMSNorm that keeps the incoming scale: the coda expects Qwen's residual
            # magnitudes, so the candidate gets the old state's RMS and a per-step channel scale.
            old_rms = h.float().pow(2).mean(-1, keepdim=True).sqrt()
            new = F.rms_norm(new.float(), (new.shape[-1],)) * self.step_norm[step] * old_rms
            if self.config.variant == "nogate":
                h = new.to(h.dtype)
                continue
            d = h.shape[-1]
            # The gate reads both states normalised, so massive channels do not saturate it.
            g = torch.sigmoid(self.gate(torch.cat([F.rms_norm(new, (d,)), F.rms_norm(h.float(), (d,))], -1)))
            h = (g * new + (1 - g) * h.float()).to(h.dtype)
        return h

    def hidden(self, input_ids: torch.Tensor, depth: int = 1) -> torch.Tensor:
        """Final normed hidden state (batch, T, d) of this variant at `depth` recurrent steps."""
        variant = self.config.variant
        if variant in LOOPED_VARIANTS and not 1 <= depth <= self.config.max_steps:
            raise SynthlabError(f"depth must be in 1..{self.config.max_steps} (max_steps), got {depth}")
        inner = self.base.model
        h = inner.embed_tokens(input_ids.clamp(min=0))  # PAD (-1) of per-document rows read as token 0
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        position_embeddings = inner.rotary_emb(h, positions)
        mask = causal_mask(input_ids.shape[1], h.dtype, h.device)
        if variant == "base":
            h = self._run(h, range(len(inner.layers)), mask, position_embeddings)
        else:
            h = self._run(h, self.split.prelude, mask, position_embeddings)
            if variant == "truncated":
                h = self._run(h, [self.split.recurrent], mask, position_embeddings)
            else:
                h = self._recur(h, depth, mask, position_embeddings)
            h = self._run(h, self.split.coda, mask, position_embeddings)
        return inner.norm(h)

    def forward(self, input_ids: torch.Tensor, depth: int = 1) -> torch.Tensor:
        """Logits (batch, T, vocab)."""
        return self.base.lm_head(self.hidden(input_ids, depth))


def lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy with ONE shift: position t predicts token t + 1 (PAD is no target);
    the mean over the targets, or (reduction "sum") their sum."""
    return F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten(), ignore_index=PAD, reduction=reduction
    )


def trainable_breakdown(model: OuroborosLM) -> dict[str, int]:
    """Trainable parameter count per part (and 'total')."""
    counts = {}
    for name in ("step_norm", "gate", "static_delta", "controller"):
        part = getattr(model, name, None)
        if part is None:
            continue
        tensors = [part] if isinstance(part, nn.Parameter) else list(part.parameters())
        counts[name] = sum(t.numel() for t in tensors if t.requires_grad)
    counts["total"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return counts


def summary(model: OuroborosLM) -> dict:
    """What `synthlab ouroboros build` writes to summary.json."""
    cfg = model.base.config
    return {
        "variant": model.config.variant,
        "trainable_params": trainable_breakdown(model)["total"],
        "trainable_breakdown": trainable_breakdown(model),
        "base_params": sum(p.numel() for p in model.base.parameters()),
        "split": dataclasses.asdict(model.split),
        "rank": model.config.rank,
        "alpha": model.config.alpha,
        "targets": list(model.targets),
        "config": dataclasses.asdict(model.config),
        "base_shape": {
            k: getattr(cfg, k)
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "vocab_size",
            )
        },
    }
