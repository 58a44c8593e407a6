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

The config round-trips through JSON/TOML with `synthlab.serialize` (to_dict / from_dict / save / load);
validation lives in __post_init__ and raises SynthlabError naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synthlab.errors import SynthlabError
from synthlab.serialize import option, to_dict

MLP_KINDS = ("gelu", "swiglu")
# Explicit maxima, far above any run here, that stop an absurd config before memory does.
MAX_DEPTH = 1024  # layers, loops, step-table rows
MAX_PARAMS = 10**12
# Decode-time KV-cache strategies of `generate` (one cache per (step, layer) at prefill).
KV_STRATEGIES = ("full", "first", "last", "mean")
NORM_PLACEMENTS = ("pre", "sandwich")
NORM_TYPES = ("rmsnorm", "layernorm")
POSITIONS = ("rope", "learned", "none")
INITS = ("gpt2", "gpt2_depth", "torch")
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
    d_model: int = option(128, "Hidden size d.")
    n_heads: int = option(4, "Attention heads.")
    n_layers: int = option(2, "Distinct layers (prelude + core + coda).")
    max_seq_len: int = option(256, "Longest sequence the model accepts.")
    mlp: str = option("gelu", "MLP kind: gelu or swiglu.")
    d_ff: int | None = option(
        None, "MLP hidden size (default: 4 d for gelu, 8/3 d rounded up to a multiple of 8 for swiglu)."
    )
    norm: str = option("pre", "Norm placement: pre, or sandwich (norm before AND after attention / MLP, as in Ouro).")
    norm_type: str = option("rmsnorm", "Every norm (blocks, sandwich, final): rmsnorm or layernorm.")
    bias: bool = option(
        False,
        "Biases in the attention (qkv, o), MLP and concat-injection linears and in LayerNorm "
        "(RMSNorm has none either way; the head never has one).",
    )
    qkv_bias: bool = option(
        False, "Biases on the q, k and v projections only (Qwen2's attention); `bias` also sets them."
    )
    positions: str = option(
        "rope",
        "Position signal: rope (rotary, relative, in every attention layer), learned "
        "(absolute table added to the token embedding at the input) or none (causal mask only).",
    )
    rope_base: float = option(10000.0, "RoPE base (positions = rope only).")
    tie_head: bool = option(
        False,
        "Output head tied to the token embedding (GPT-2's choice); false: a separate "
        "Linear(d, vocab) without bias (the default: results/recipe/bench).",
    )
    dropout: float = option(0.0, "Dropout probability.")
    attention: str = option(
        "sdpa",
        "Attention over packed rows: sdpa (scaled_dot_product_attention with a dense "
        "causal-and-same-document mask) or flex (flex_attention with a document block "
        "mask: blocks across documents are skipped, and the kernel is fused under "
        "train.system.compile; the same numbers to float rounding; CPU training, which torch's "
        "flex_attention cannot differentiate, keeps the dense mask). Rows of one "
        "document always use the fused causal kernel.",
    )
    init: str = option(
        "gpt2",
        "Weight init: gpt2 (N(0, init_std), residual projections scaled by 1/sqrt(2 n_layers) "
        "over DISTINCT layers), gpt2_depth (scaled by the depth actually run) or torch "
        "(PyTorch's default module init). Recurrence modules keep their own inits.",
    )
    init_std: float | None = option(
        None,
        "Standard deviation of the gpt2 inits (default: GPT-2's 0.02 at its "
        "width 768 carried to d_model as 1/sqrt(d): 0.02 sqrt(768 / d_model), "
        "0.049 at d = 128; 0.02: GPT-2's) and of the recurrence modules' "
        "projections under every init (default 0.02: not part of the recipe search).",
    )
    # --- recurrence -----------------------------------------------------------------------------
    topology: str = option("ouro", "ouro (loop the whole stack) or sandwich (prelude / core / coda).")
    loops: int = option(1, "Recurrent steps T: whole-stack passes (ouro) or core steps (sandwich).")
    n_prelude: int = option(0, "Sandwich: prelude layers run once.")
    n_coda: int = option(0, "Sandwich: coda layers run once.")
    injection: str = option(
        "none", "Sandwich input injection of the prelude output e at each step: none, add, concat or diagonal."
    )
    state_init: str = option(
        "input", "Sandwich state init: zero, input (h0 = e) or normal (h0 ~ N(0, state_init_std^2))."
    )
    state_init_std: float = option(0.02, "Standard deviation of the normal state init.")
    step_sampling: bool = option(
        False, "Huginn training-time depth sampling: T ~ Poisson(LogNormal(log(loops) - s^2/2, s)) + 1."
    )
    step_sigma: float = option(0.5, "s of the depth sampling.")
    backprop_last_k: int | None = option(None, "Gradients through the last k recurrent steps only (default: all).")
    # --- Ouro exit gate -------------------------------------------------------------------------
    exit_gate: bool = option(False, "Ouro exit gate (needed by the ouro losses and q: exits).")
    # --- OUROBOROS-style modulation of the core ---------------------------------------------------
    controller: str = option(
        "none", "Core modulation: none, controller (input-conditioned LoRA magnitudes) or static_lora (per step)."
    )
    lora_rank: int = option(8, "LoRA rank of the core modulation.")
    lora_alpha: float = option(16.0, "LoRA alpha (scale alpha / rank).")
    lora_targets: tuple[str, ...] = option(("q", "k", "v", "o", "up", "down"), "Projections the LoRA modulates.")
    lora_bases: str = option(
        "learned", "LoRA bases: learned, or fixed (random, frozen: the controller learns magnitudes only)."
    )
    controller_hidden: int = option(64, "Hidden size of the controller MLP.")
    recurrence_gate: bool = option(
        False, "Gated recurrence h <- g h_new + (1 - g) h_old, g = sigmoid(W[h_new; h_old] - 2)."
    )
    step_norm: bool = option(False, "A per-step RMSNorm (own scale per step) on the core's input.")
    max_steps: int | None = option(
        None,
        "Rows of the step-indexed tables (step embedding, static LoRA, per-step norms; "
        "default: loops); a step beyond the table reuses the last row.",
    )

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, msg: str) -> None:
            if not ok:
                raise SynthlabError(f"ModelConfig.{field}: {msg}")

        def choice(field: str, options: tuple[str, ...]) -> None:
            need(getattr(self, field) in options, field, f"must be one of {', '.join(options)}")

        for name in (
            "vocab_size",
            "d_model",
            "n_heads",
            "n_layers",
            "max_seq_len",
            "loops",
            "lora_rank",
            "controller_hidden",
        ):
            value = getattr(self, name)
            need(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                name,
                f"must be a positive integer, got {value!r}",
            )
        for name in ("n_layers", "loops", "max_steps"):  # before any table or layer is built
            value = getattr(self, name)
            need(value is None or value <= MAX_DEPTH, name, f"must be <= {MAX_DEPTH:,}, got {value}")
        weights = 12 * self.d_model**2 * self.n_layers + 2 * self.vocab_size * self.d_model  # about, in parameters
        need(
            weights <= MAX_PARAMS, "d_model", f"and n_layers give about {weights:.2g} parameters, over {MAX_PARAMS:.0e}"
        )
        for field, options in (
            ("mlp", MLP_KINDS),
            ("norm", NORM_PLACEMENTS),
            ("norm_type", NORM_TYPES),
            ("topology", TOPOLOGIES),
            ("injection", INJECTIONS),
            ("state_init", STATE_INITS),
            ("controller", CONTROLLERS),
            ("lora_bases", LORA_BASES),
            ("positions", POSITIONS),
            ("init", INITS),
        ):
            choice(field, options)
        for name in ("bias", "qkv_bias", "tie_head"):
            need(isinstance(getattr(self, name), bool), name, f"must be true or false, got {getattr(self, name)!r}")
        need(self.d_model % self.n_heads == 0, "n_heads", f"must divide d_model={self.d_model}")
        need(
            self.positions != "rope" or (self.d_model // self.n_heads) % 2 == 0,
            "n_heads",
            "head size must be even (RoPE)",
        )
        need(self.d_ff is None or self.d_ff >= 1, "d_ff", "must be positive")
        for name in ("rope_base", "dropout", "init_std", "state_init_std", "step_sigma", "lora_alpha"):
            need(
                getattr(self, name) is None or math.isfinite(getattr(self, name)),
                name,
                f"must be a finite number, got {getattr(self, name)}",
            )
        need(0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)")
        need(self.attention in ("sdpa", "flex"), "attention", f"must be sdpa or flex, not {self.attention!r}")
        need(self.attention == "sdpa" or self.dropout == 0, "attention", "flex has no attention dropout: set dropout 0")
        need(self.rope_base > 1.0, "rope_base", "must be > 1")
        need(self.init_std is None or self.init_std > 0, "init_std", "must be positive or null")
        need(self.state_init_std > 0, "state_init_std", "must be positive")
        need(self.n_prelude >= 0, "n_prelude", "must be >= 0")
        need(self.n_coda >= 0, "n_coda", "must be >= 0")
        if self.topology == "ouro":
            need(
                self.n_prelude == 0 and self.n_coda == 0,
                "topology",
                "ouro loops the whole stack: n_prelude and n_coda must be 0 (use sandwich)",
            )
        need(
            self.n_core >= 1,
            "n_layers",
            f"leaves no core layer after n_prelude={self.n_prelude} and n_coda={self.n_coda}",
        )
        need(self.step_sigma > 0, "step_sigma", "must be positive")
        need(self.backprop_last_k is None or self.backprop_last_k >= 1, "backprop_last_k", "must be >= 1 or null")
        need(self.lora_alpha > 0, "lora_alpha", "must be positive")
        self.lora_targets = tuple(self.lora_targets)
        valid_targets = ATTENTION_TARGETS + MLP_TARGETS[self.mlp]
        bad = [t for t in self.lora_targets if t not in valid_targets]
        need(
            not bad and len(self.lora_targets) > 0 and len(set(self.lora_targets)) == len(self.lora_targets),
            "lora_targets",
            f"{bad or list(self.lora_targets)}: choose distinct names from {', '.join(valid_targets)}"
            f" (for mlp={self.mlp})",
        )
        need(
            self.max_steps is None or self.max_steps >= self.loops,
            "max_steps",
            f"must be >= loops={self.loops} or null",
        )

    # --- derived sizes --------------------------------------------------------------------------
    @property
    def n_core(self) -> int:
        return self.n_layers - self.n_prelude - self.n_coda

    @property
    def step_table_size(self) -> int:
        return self.max_steps if self.max_steps is not None else self.loops

    @property
    def weight_std(self) -> float:
        """init_std, or by default GPT-2's 0.02 at d = 768 scaled as 1/sqrt(d_model) (0.049 at d = 128)."""
        return self.init_std if self.init_std is not None else 0.02 * math.sqrt(768 / self.d_model)

    @property
    def recurrence_std(self) -> float:
        """init_std, or 0.02: the recurrence modules' projections (injection, gate, controller) kept
        the scale they had before the width-scaled default, which results/recipe/bench measured
        for the main weights only."""
        return self.init_std if self.init_std is not None else 0.02

    def as_built(self) -> dict:
        """The fields as the model reads them: `init_std` replaced by the scales it sets (the main
        weights' only where the init scheme uses it), so two configs that build the same model from
        the same seed compare equal (e.g. init_std 0.02 and unset under init = torch)."""
        fields = {k: v for k, v in to_dict(self).items() if k != "init_std"}
        if self.init != "torch":
            fields["weight_std"] = self.weight_std
        return {**fields, "recurrence_std": self.recurrence_std}

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
