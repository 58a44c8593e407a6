"""synthlab.models: the looped decoder family (torch only; knows nothing of data or training).

    from synthlab.models import ModelConfig, build_model
    model = build_model(ModelConfig(vocab_size=64, d_model=128, n_layers=2, loops=4), seed=0)
    out = model(idx, doc_ids=None, steps=None)     # out.logits (B,S,V), out.step_logits (T,B,S,V)
    # out.exit_probs / out.exit_lambdas (T,B,S) with exit_gate; forward(generator=...) for a
    # sampled depth or a normal initial state; forward(all_steps=False) reads out the last step only.
    ex = model.forward_exit(idx, "q:0.8", mask=None)  # ex.logits, ex.exit_step (B,S), ex.steps_computed
    gen = model.generate(idx, 8, kv_strategy="last")  # gen.tokens (B,S+8), gen.cache_bytes
    count_params(model, exclude_embedding=False, used_token_ids=None); flops_per_token(config, seq_len)

Where each mechanism of MISSION.md ("The models") lives, reading top to bottom:

config.py      ModelConfig: every option below; JSON/TOML round trip via synthlab.config.
layers.py      the GPT-2-style base: RMSNorm / LayerNorm (`norm_type`), pre-norm or sandwich norm
               (`norm`), RoPE (`Rotary`), causal attention through scaled_dot_product_attention
               with document masking (`attention_mask`) and a KV cache, GELU / SwiGLU MLP (`mlp`),
               optional bias.
model.py       LoopedGPT, `build_model`. Token embedding tied to the head (`LoopedGPT.head`).
               Ouro full-stack loop (`topology="ouro"`, `loops`): final norm + head after every
               pass -> `step_logits`. Sandwich / Huginn (`topology="sandwich"`, `n_prelude`,
               `n_coda`, `loops` core steps). Training-time depth sampling and truncated backprop
               (`step_sampling`, `backprop_last_k`, in `forward`). Exit at inference
               (`forward_exit`). Greedy generation with one KV cache per (step, layer) and the
               decode strategies full / first / last / mean (`generate`, cache bytes reported).
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
counting.py    unique / non-embedding / used-vocabulary parameter counts, FLOPs per token with loops.
"""

from synthlab.models.config import ModelConfig
from synthlab.models.counting import count_params, flops_per_token
from synthlab.models.exits import ExitRule, exit_distribution, parse_exit_rule
from synthlab.models.losses import (last_step_loss, masked_mean, mean_step_loss, ouro_stage1_loss,
                                    ouro_stage2_loss, token_losses)
from synthlab.models.model import (KV_STRATEGIES, ExitOutput, GenerationOutput, LoopedGPT,
                                   ModelOutput, build_model)

__all__ = [
    "KV_STRATEGIES", "ExitOutput", "ExitRule", "GenerationOutput", "LoopedGPT", "ModelConfig",
    "ModelOutput", "build_model", "count_params", "exit_distribution", "flops_per_token",
    "last_step_loss", "masked_mean", "mean_step_loss", "ouro_stage1_loss", "ouro_stage2_loss",
    "parse_exit_rule", "token_losses",
]
