"""ModelConfig: every option of the one looped decoder, as a typed dataclass.

One GPT-2-style decoder covers every model of the lab; the options below choose its recurrence.
The layer stack is split into three parts (all counts are distinct layers, i.e. unique weights):

    prelude (n_prelude layers, run once)
    core    (n_layers - n_prelude - n_coda layers, run `loops` times: the recurrent block)
    coda    (n_coda layers, run once per readout)

- topology "ouro": prelude = coda = 0, the whole stack is the core and runs `loops` times
  ("k x m" = n_layers k, loops m). The plain model is ouro with loops = 1.
- topology "sandwich" (Huginn / "Done Right"): prelude once, core `loops` times with input
  injection of the prelude output, coda once.

The config round-trips through JSON/TOML with `synthlab.config` (to_dict / from_dict / save / load);
validation lives in __post_init__ and raises SynthlabError naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synthlab.errors import SynthlabError

MLP_KINDS = ("gelu", "swiglu")
NORM_PLACEMENTS = ("pre", "sandwich")
NORM_TYPES = ("rmsnorm", "layernorm")
TOPOLOGIES = ("ouro", "sandwich")
INJECTIONS = ("none", "add", "concat", "diagonal")
STATE_INITS = ("zero", "input", "normal")
CONTROLLERS = ("none", "controller", "static_lora")
LORA_BASES = ("learned", "fixed")
ATTENTION_TARGETS = ("q", "k", "v", "o")
MLP_TARGETS = {"gelu": ("up", "down"), "swiglu": ("gate", "up", "down")}


@dataclass
class ModelConfig:
    vocab_size: int
    # --- the base decoder ---------------------------------------------------------------------
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2  # distinct layers (prelude + core + coda)
    max_seq_len: int = 256
    mlp: str = "gelu"  # gelu | swiglu
    d_ff: int | None = None  # None: 4 d (gelu) or 8/3 d rounded up to a multiple of 8 (swiglu)
    norm: str = "pre"  # pre | sandwich (RMSNorm before AND after attention / MLP, as in Ouro)
    norm_type: str = "rmsnorm"  # rmsnorm | layernorm
    bias: bool = False  # biases in linear layers and LayerNorm
    dropout: float = 0.0
    rope_base: float = 10000.0
    init_std: float = 0.02
    # --- recurrence -----------------------------------------------------------------------------
    topology: str = "ouro"  # ouro | sandwich
    loops: int = 1  # recurrent steps T: whole-stack passes (ouro) or core steps (sandwich)
    n_prelude: int = 0  # sandwich only
    n_coda: int = 0  # sandwich only
    injection: str = "none"  # none | add | concat | diagonal: how the prelude output e enters each step
    state_init: str = "input"  # zero | input (h0 = e) | normal (h0 ~ N(0, state_init_std^2))
    state_init_std: float = 0.02  # same scale as the embedding init
    # Huginn training-time depth sampling: T ~ Poisson(LogNormal(log(loops) - s^2/2, s)) + 1
    step_sampling: bool = False
    step_sigma: float = 0.5
    backprop_last_k: int | None = None  # gradients through the last k steps only (None: all)
    # --- Ouro exit gate -------------------------------------------------------------------------
    exit_gate: bool = False
    # --- OUROBOROS-style modulation of the core ---------------------------------------------------
    controller: str = "none"  # none | controller (input-conditioned) | static_lora (per step)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o", "up", "down")
    lora_bases: str = "learned"  # learned | fixed (random, frozen: the controller learns magnitudes only)
    controller_hidden: int = 64
    recurrence_gate: bool = False  # h <- g h_new + (1 - g) h_old, g = sigmoid(W[h_new; h_old] - 2)
    step_norm: bool = False  # a per-step RMSNorm (own scale gamma_t) on the core's input
    # Rows of the step-indexed tables (step embedding, static LoRA, per-step norms); None = loops.
    # A step beyond the table (depth extrapolation, a sampled depth) reuses the last row.
    max_steps: int | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, msg: str) -> None:
            if not ok:
                raise SynthlabError(f"ModelConfig.{field}: {msg}")

        def choice(field: str, options: tuple[str, ...]) -> None:
            need(getattr(self, field) in options, field, f"must be one of {', '.join(options)}")

        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_seq_len", "loops",
                     "lora_rank", "controller_hidden"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                 f"must be a positive integer, got {value!r}")
        for field, options in (("mlp", MLP_KINDS), ("norm", NORM_PLACEMENTS),
                               ("norm_type", NORM_TYPES), ("topology", TOPOLOGIES),
                               ("injection", INJECTIONS), ("state_init", STATE_INITS),
                               ("controller", CONTROLLERS), ("lora_bases", LORA_BASES)):
            choice(field, options)
        need(self.d_model % self.n_heads == 0, "n_heads", f"must divide d_model={self.d_model}")
        need((self.d_model // self.n_heads) % 2 == 0, "n_heads", "head size must be even (RoPE)")
        need(self.d_ff is None or self.d_ff >= 1, "d_ff", "must be positive")
        need(0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)")
        need(self.rope_base > 1.0, "rope_base", "must be > 1")
        need(self.init_std > 0 and self.state_init_std > 0, "init_std", "must be positive")
        need(self.n_prelude >= 0, "n_prelude", "must be >= 0")
        need(self.n_coda >= 0, "n_coda", "must be >= 0")
        if self.topology == "ouro":
            need(self.n_prelude == 0 and self.n_coda == 0, "topology",
                 "ouro loops the whole stack: n_prelude and n_coda must be 0 (use sandwich)")
        need(self.n_core >= 1, "n_layers",
             f"leaves no core layer after n_prelude={self.n_prelude} and n_coda={self.n_coda}")
        need(self.step_sigma > 0, "step_sigma", "must be positive")
        need(self.backprop_last_k is None or self.backprop_last_k >= 1, "backprop_last_k",
             "must be >= 1 or null")
        need(self.lora_alpha > 0, "lora_alpha", "must be positive")
        self.lora_targets = tuple(self.lora_targets)
        valid_targets = ATTENTION_TARGETS + MLP_TARGETS[self.mlp]
        bad = [t for t in self.lora_targets if t not in valid_targets]
        need(not bad and len(self.lora_targets) > 0 and len(set(self.lora_targets))
             == len(self.lora_targets), "lora_targets",
             f"{bad or list(self.lora_targets)}: choose distinct names from {', '.join(valid_targets)}"
             f" (for mlp={self.mlp})")
        need(self.max_steps is None or self.max_steps >= self.loops, "max_steps",
             f"must be >= loops={self.loops} or null")

    # --- derived sizes --------------------------------------------------------------------------
    @property
    def n_core(self) -> int:
        return self.n_layers - self.n_prelude - self.n_coda

    @property
    def step_table_size(self) -> int:
        return self.max_steps if self.max_steps is not None else self.loops

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if self.mlp == "gelu":
            return 4 * self.d_model
        # SwiGLU has three matrices instead of two: 2/3 of 4d keeps the parameter count of GELU's.
        return 8 * math.ceil(8 * self.d_model / 3 / 8)
