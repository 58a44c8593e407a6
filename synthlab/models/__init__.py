"""synthlab.models: the looped decoder family (torch only; knows nothing of data or training).

    from synthlab.models import ModelConfig, build_model
    model = build_model(ModelConfig(vocab_size=64, d_model=128, n_layers=2, loops=4), seed=0)
    out = model(idx, doc_ids=None, steps=None)     # out.logits (B,S,V), out.step_logits (T,B,S,V)
    # out.exit_probs / out.exit_lambdas (T,B,S) with exit_gate; forward(generator=...) for a
    # sampled depth or a normal initial state; forward(all_steps=False) reads out the last step only.
    ex = model.forward_exit(idx, "q:0.8", mask=None)  # ex.logits, ex.exit_step (B,S), ex.steps_computed
    gen = model.generate(idx, 8, kv_strategy="last")  # gen.tokens (B,S+8), gen.cache_bytes
    model.save_pretrained(folder); LoopedGPT.from_pretrained(folder)  # also a finished run's folder
    count_params(model, exclude_embedding=False, used_token_ids=None); flops_per_token(config, seq_len)

Where each mechanism of the papers (docs/claims.md) lives, reading top to bottom:

config.py      ModelConfig: every option below; JSON/TOML round trip via synthlab.serialize.
layers.py      the GPT-2-style base: RMSNorm / LayerNorm (`norm_type`), pre-norm or sandwich norm
               (`norm`), RoPE (`Rotary`, `positions = "rope"`), causal attention through
               scaled_dot_product_attention with document masking (`attention_mask`) and a KV
               cache, GELU / SwiGLU MLP (`mlp`), optional bias (`bias`, or q/k/v only:
               `qkv_bias`, as Qwen2).
model.py       LoopedGPT, `build_model`. Token embedding tied to the head (`LoopedGPT.head`) or a
               separate `lm_head` (`tie_head`); learned absolute positions (`pos_embed`,
               `positions = "learned"`) or none; init schemes gpt2 / gpt2_depth / torch (`init`).
               Ouro full-stack loop (`topology="ouro"`, `loops`): final norm + head after every
               pass -> `step_logits`. Sandwich / Huginn (`topology="sandwich"`, `n_prelude`,
               `n_coda`, `loops` core steps). Training-time depth sampling and truncated backprop
               (`step_sampling`, `backprop_last_k`, in `forward`).
pretrained.py  (mixed into LoopedGPT) `save_pretrained(folder)` / `LoopedGPT.from_pretrained(folder)`:
               config.json + model.safetensors, as the Hugging Face Hub lays a model out.
inference.py   (mixed into LoopedGPT) exit at inference (`forward_exit`). Greedy generation with
               one KV cache per (step, layer) and the decode strategies full / first / last / mean
               (`generate`, cache bytes reported).
recurrence.py  input injection none / add / concat / diagonal (`Injection`), state init zero /
               input / normal (`initial_state`), Poisson-lognormal depth draw (`sample_steps`).
exits.py       Ouro exit distribution p(t) (`exit_distribution`), exit rules static:N, q:Q
               (Q-exit), diff:EPS (hidden-state difference), kl:EPS (`parse_exit_rule`).
controller.py  OUROBOROS controller (`RecurrenceController`, causal running-mean pooling
               `causal_running_mean`, step embedding, zero-init heads), LoRA bases
               (`LoRABases`, dW = (alpha/r) B diag(delta) A in `LowRankModulation`), static
               per-step LoRA (`StaticStepLoRA`), gated recurrence with bias -2 (`RecurrenceGate`),
               per-step RMSNorm scales (`StepNorms`).
losses.py      per-step token losses, masked mean, last-step and mean-over-steps losses, Ouro
               stage I (entropy-regularised) and stage II (gate-only, k=50, tau=0.005) losses.
counting.py    unique / non-embedding / used-vocabulary parameter counts, FLOPs per token with loops,
               activation bytes per token for the backward pass (bf16 autocast, with or without
               activation checkpointing).
"""

import importlib

from synthlab.models.config import KV_STRATEGIES, ModelConfig

# Everything else is imported on first use (PEP 562), so that reading a ModelConfig (the CLI's
# flags, a sweep definition) does not pay for importing torch.
_LAZY = {
    "activation_bytes_per_token": "counting",
    "count_params": "counting",
    "flops_per_token": "counting",
    "flops_per_token_parts": "counting",
    "layer_activation_bytes": "counting",
    "ExitRule": "exits",
    "exit_distribution": "exits",
    "parse_exit_rule": "exits",
    "last_step_loss": "losses",
    "masked_mean": "losses",
    "mean_step_loss": "losses",
    "ouro_stage1_loss": "losses",
    "ouro_stage2_loss": "losses",
    "token_losses": "losses",
    "ExitOutput": "inference",
    "GenerationOutput": "inference",
    "LoopedGPT": "model",
    "ModelOutput": "model",
    "build_model": "model",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"synthlab.models.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'synthlab.models' has no attribute '{name}'")


__all__ = ["KV_STRATEGIES", "ModelConfig", *_LAZY]
