"""Parameter and FLOP counting.

Parameters are UNIQUE: a core run T times counts once, and the head tied to the embedding counts
once (`model.parameters()` already deduplicates shared tensors). Frozen random LoRA bases
(lora_bases = "fixed") are buffers, not parameters: they store nothing learned.

Embedding tables: the token embedding, an untied head (`tie_head = false`: its vocab x d matrix
is the unembedding, counted as an embedding table so that tied and untied models of one shape
have the same non-embedding count) and a learned position table (`positions = "learned"`).
For the capacity estimate (bits per parameter) the rows of tokens that never occur in the data
are not parameters of the learned knowledge: `used_token_ids` drops them from the token
embedding and from an untied head (the position table stays whole).

FLOPs per token are forward matmul FLOPs (2 per multiply-add), counting the loops: the prelude
once, the core T times, the readout (coda, final norm, head, exit gate) after every step when
all_steps (as in training with per-step losses) or once otherwise. Attention's QK^T and AV are
counted over the full context (not halved for causality), as in the PaLM / Chinchilla
conventions; element-wise work (norms, softmax, cumsum, biases, adding learned positions) is not
counted, so `bias`, `positions` and `tie_head` leave the count unchanged. A training step costs
about 3x the forward (backward = 2x forward).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.nn as nn

from synthlab.models.config import ModelConfig
from synthlab.models.controller import target_shapes


def count_params(
    model: nn.Module, *, exclude_embedding: bool = False, used_token_ids: Iterable[int] | None = None
) -> int:
    """Unique parameters of `model`.

    exclude_embedding: drop every embedding table entirely (the "non-embedding" count): the token
        embedding (tied or not), an untied head `lm_head` and a learned position table
        `pos_embed`.
    used_token_ids: keep only the rows of these token ids in the token embedding and in an untied
        head (ids outside the vocabulary are an error); ignored when exclude_embedding.
    """
    total = sum(p.numel() for p in model.parameters())
    vocab, dim = model.embed.weight.shape
    head = getattr(model, "lm_head", None)
    vocab_tables = 1 if head is None else 2  # token embedding, untied head
    if exclude_embedding:
        positions = getattr(model, "pos_embed", None)
        return total - vocab_tables * vocab * dim - (0 if positions is None else positions.weight.numel())
    if used_token_ids is not None:
        used = set(int(i) for i in used_token_ids)
        bad = [i for i in used if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"used_token_ids outside the vocabulary of {vocab}: {sorted(bad)[:5]}")
        return total - vocab_tables * (vocab - len(used)) * dim
    return total


def _block_flops(c: ModelConfig, seq_len: int) -> int:
    d, f = c.d_model, c.ff_dim
    mlp = (3 if c.mlp == "swiglu" else 2) * d * f
    projections = 3 * d * d + d * d + mlp
    attention = 2 * seq_len * d  # QK^T and AV, each seq_len x d multiply-adds per token
    return 2 * (projections + attention)


def _step_extra_flops(c: ModelConfig) -> int:
    """Per recurrent step, outside the core blocks: injection, gate, LoRA, controller."""
    d, r, macs = c.d_model, c.lora_rank, 0
    if c.injection == "concat":
        macs += 2 * d * d
    elif c.injection == "diagonal":
        macs += d * d
    if c.recurrence_gate:
        macs += 2 * d * d
    if c.controller != "none":
        macs += c.n_core * sum(r * (n_in + n_out) for n_in, n_out in target_shapes(c).values())
    if c.controller == "controller":
        hidden = c.controller_hidden
        macs += d * hidden + hidden * c.n_core * len(c.lora_targets) * r
    return 2 * macs


def flops_per_token(
    config: ModelConfig, seq_len: int | None = None, steps: int | None = None, all_steps: bool = True
) -> int:
    """Forward FLOPs per token at context seq_len (default max_seq_len) and `steps` (default loops)."""
    return sum(flops_per_token_parts(config, seq_len, steps, all_steps).values())


def flops_per_token_parts(
    config: ModelConfig, seq_len: int | None = None, steps: int | None = None, all_steps: bool = True
) -> dict[str, int]:
    """`flops_per_token` in the two parts that run at different speeds: "layers" (every application
    of a decoder layer, with each step's injection, gate and LoRA work) and "head" (the unembedding
    of each readout, with its exit gate: a vocabulary-wide matmul whose softmax and loss are
    memory-bound at small d). The GPU cost model times each at its own measured utilisation."""
    c = config
    S = seq_len if seq_len is not None else c.max_seq_len
    T = steps if steps is not None else c.loops
    readouts = T if all_steps else 1
    block = _block_flops(c, S)
    layers = (c.n_prelude + T * c.n_core + readouts * c.n_coda) * block + T * _step_extra_flops(c)
    head = readouts * (2 * c.d_model * c.vocab_size + (2 * c.d_model if c.exit_gate else 0))
    return {"layers": layers, "head": head}


# --- activation memory ------------------------------------------------------------------------
# Bytes per token that autograd keeps for the backward pass in bf16 autocast (float32 weights and
# residual stream, matmuls in bf16), measured on the CPU under CUDA autocast's op policy with
# saved-tensor hooks (tests/test_cost.py re-measures every term): per norm, 8 d for RMSNorm
# (float32 input and normalised input: CUDA autocast feeds it the float32 residual) or 4 d for
# LayerNorm (the fused kernel's input); the linears' bf16 inputs with q, k, v and the output kept
# by a fused attention kernel, 12 d, +4 d with RoPE (the rotated q and k); the MLP hidden, 4 f
# (GELU: its input and the down projection's) or 8 f (SwiGLU); 4 bytes per head (the softmax
# log-sum-exp) and 8 per layer (norm statistics). Packed rows (document masks) add the mask as a
# bf16 bias row, 2 S; a dense (math) attention keeps the H x S probabilities too, 4 H S. Not
# counted: the bf16 copies of the weights (2 bytes per parameter, once per forward).


def layer_activation_bytes(c: ModelConfig, seq_len: int, *, masked: bool = False, dense: bool = False) -> int:
    """Bytes per token one application of one decoder layer keeps for the backward pass."""
    d = c.d_model
    norms = (4 if c.norm == "sandwich" else 2) * (8 * d if c.norm_type == "rmsnorm" else 4 * d)
    linears = 12 * d + (4 * d if c.positions == "rope" else 0)
    mlp = (8 if c.mlp == "swiglu" else 4) * c.ff_dim
    attention = 4 * c.n_heads + (2 * seq_len if masked else 0) + (4 * c.n_heads * seq_len if dense else 0)
    return norms + linears + mlp + attention + 8


def _step_extra_bytes(c: ModelConfig) -> int:
    """Per recurrent step outside the core layers: injection, gated recurrence, step norm."""
    d = c.d_model
    injection = {"concat": 4 * d, "diagonal": 8 * d + 8}.get(c.injection, 0)
    return injection + (10 * d if c.recurrence_gate else 0) + (8 * d if c.step_norm else 0)


def activation_bytes_per_token(
    config: ModelConfig,
    seq_len: int,
    *,
    all_steps: bool = True,
    masked: bool = False,
    dense: bool = False,
    checkpoint: bool = False,
) -> tuple[int, int]:
    """(bytes per token the forward keeps for the backward pass, bytes per token recomputed and
    live during the backward on top of them), at `loops` steps; the loss's are not counted.

    Kept: 4 d at the input, the prelude's layers, per step the core's layers and the step's
    extras, per readout (every step when all_steps, else the last) the coda's layers and 6 d
    (final norm, head input). With checkpoint (activation checkpointing per step) a step keeps
    only its input state (4 d) and its readout's output (2 d); in the backward one step (core,
    extras, readout) is recomputed at a time: the second number.
    """
    c, d = config, config.d_model
    layer = layer_activation_bytes(c, seq_len, masked=masked, dense=dense)
    step = c.n_core * layer + _step_extra_bytes(c)
    readout = c.n_coda * layer + 6 * d
    readouts = c.loops if all_steps else 1
    if checkpoint:
        return c.n_prelude * layer + c.loops * 4 * d + readouts * 2 * d, step + readout
    return 4 * d + c.n_prelude * layer + c.loops * step + readouts * readout, 0
