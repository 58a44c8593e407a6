"""The decoder's building blocks: norms, rotary positions, causal attention, MLP, one block.

Positions: with `positions = "rope"` every attention layer rotates q and k (RoPE); with "learned"
or "none" the blocks get rope = None and attend without any rotation (a learned table, if any,
was added to the token embedding by the model).

Shapes: B batch, S sequence (query) length, P cached (past) length, H heads, Dh head size,
D d_model, F the MLP's hidden size.

A block optionally takes `mod`, a low-rank modulation of its projections (the OUROBOROS
controller or static per-step LoRA, see controller.py): `mod(target, x, y)` returns y plus the
low-rank update of target ("q", "k", "v", "o", "gate", "up", "down") applied to the input x. The
plain model passes None and pays nothing for it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from synthlab.errors import SynthlabError
from synthlab.models.config import ModelConfig


def make_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    """RMSNorm or LayerNorm over the last dimension (LayerNorm has a bias only if config.bias;
    RMSNorm never has one)."""
    dim = dim or config.d_model
    if config.norm_type == "rmsnorm":
        return nn.RMSNorm(dim, eps=1e-5)
    return nn.LayerNorm(dim, eps=1e-5, bias=config.bias)


class Rotary(nn.Module):
    """Rotary position embedding (RoPE), rotate-half form, tables for every position up front.

    x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1) for the halves x1, x2 of a head, is
    computed as x cos + roll(x, Dh/2) sin_signed with sin_signed = (-sin, sin): the same products
    (x2 (-s) and (-x2) s are the same float), without the neg and the cat of two slices, whose
    backward fills zeros."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (S, Dh/2)
        # Not persistent: derived from the config, so checkpoints stay free of them.
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], dim=-1), persistent=False)  # (S, Dh)
        self.register_buffer("sin", torch.cat([-angles.sin(), angles.sin()], dim=-1), persistent=False)  # signed

    def tables(self, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin_signed for positions [start, start + length), each (length, Dh)."""
        if start + length > self.cos.shape[0]:
            raise SynthlabError(f"sequence of {start + length} positions exceeds max_seq_len={self.cos.shape[0]}")
        return self.cos[start : start + length], self.sin[start : start + length]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, S, ..., Dh) rotated by position: x cos + roll(x, Dh/2) sin_signed (`Rotary`'s tables,
    each (S, Dh), broadcast over the dimensions between S and Dh: heads, or q and k and heads)."""
    shape = (cos.shape[0],) + (1,) * (x.dim() - 3) + (cos.shape[1],)
    cos, sin = cos.view(shape).to(x.dtype), sin.view(shape).to(x.dtype)
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def attention_mask(doc_ids: torch.Tensor | None) -> torch.Tensor | None:
    """Boolean mask (B, 1, S, S), True = may attend: causal AND same document.

    None without doc_ids: attention then uses the fused causal path (is_causal=True).
    """
    if doc_ids is None:
        return None
    S = doc_ids.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=doc_ids.device).tril()
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, S, S)
    return (causal & same_doc)[:, None]


def document_block_mask(doc_ids: torch.Tensor) -> BlockMask:
    """The mask of `attention_mask` as flex_attention's block mask: a query attends to earlier or
    equal positions of its own document; (128 x 128) blocks that hold no such pair are skipped,
    which in packed rows of many short documents is most of them."""
    B, S = doc_ids.shape

    def same_document_causal(b, h, q, kv):
        return (q >= kv) & (doc_ids[b, q] == doc_ids[b, kv])

    return create_block_mask(same_document_causal, B, None, S, S, device=doc_ids.device)


def packed_mask(
    doc_ids: torch.Tensor | None, kind: str = "sdpa", dtype: torch.dtype = torch.float32
) -> torch.Tensor | BlockMask | None:
    """The mask of packed rows for ModelConfig.attention `kind`: None (one document per row),
    the `document_block_mask` (flex: on CUDA, and on the CPU without gradients; torch has no
    flex_attention backward on the CPU, where training keeps the dense mask), or for sdpa the
    `attention_mask` as the additive mask (0 where allowed, -inf elsewhere) in `dtype`, the dtype
    of the queries: what SDPA turns a boolean mask into in every call, built once for all layers
    (the same floats, so the same outputs)."""
    if kind == "flex" and doc_ids is not None and (doc_ids.is_cuda or not torch.is_grad_enabled()):
        return document_block_mask(doc_ids)
    allowed = attention_mask(doc_ids)
    if allowed is None:
        return None
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d = config.d_model
        self.n_heads, self.head_dim, self.dropout = config.n_heads, config.head_dim, config.dropout
        # fused: one matmul for q, k and v
        self.qkv = nn.Linear(d, 3 * d, bias=config.bias or config.qkv_bias)
        self.o = nn.Linear(d, d, bias=config.bias)

    def forward(self, x, rope, mask=None, past=None, mod=None):
        """x (B, S, D) -> (y (B, S, D), (k, v) of these S positions, each (B, H, S, Dh)).

        rope: (cos, sin) tables of these positions, or None without rotary positions.

        past: cached (k, v), each (B, H, P, Dh), of the positions before these; with a past,
        S must be 1 (one decoded token attends to every cached position and itself).
        """
        B, S, D = x.shape
        qkv = self.qkv(x)
        if mod is None:  # q and k rotated together, in one pass over both
            qkv = qkv.view(B, S, 3, self.n_heads, self.head_dim)
            qk = apply_rotary(qkv[:, :, :2], *rope) if rope is not None else qkv[:, :, :2]
            (q, k), v = qk.unbind(2), qkv[:, :, 2]
        else:
            q, k, v = qkv.split(D, dim=-1)
            q, k, v = (
                t.view(B, S, self.n_heads, self.head_dim) for t in (mod("q", x, q), mod("k", x, k), mod("v", x, v))
            )
            if rope is not None:  # None: positions learned (added at the input) or none
                q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, Dh)
        new_kv = (k, v)
        if past is not None:
            if S != 1:
                raise ValueError("decoding with a KV cache takes one token at a time")
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if isinstance(mask, BlockMask):
            y = flex_attention(q, k, v, block_mask=mask)
        else:
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                is_causal=mask is None and past is None,
                dropout_p=self.dropout if self.training else 0.0,
            )
        y = y.transpose(1, 2).reshape(B, S, D)
        out = self.o(y)
        return (mod("o", y, out) if mod is not None else out), new_kv


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, f = config.d_model, config.ff_dim
        self.swiglu = config.mlp == "swiglu"
        # SwiGLU: gate and up fused in one matmul, split after.
        self.up = nn.Linear(d, 2 * f if self.swiglu else f, bias=config.bias)
        self.down = nn.Linear(f, d, bias=config.bias)

    def forward(self, x, mod=None):
        """x (B, S, D) -> (B, S, D)."""
        if self.swiglu:
            gate, up = self.up(x).chunk(2, dim=-1)
            if mod is not None:
                gate, up = mod("gate", x, gate), mod("up", x, up)
            hidden = F.silu(gate) * up
        else:
            up = self.up(x)
            hidden = F.gelu(mod("up", x, up) if mod is not None else up)
        out = self.down(hidden)
        return mod("down", hidden, out) if mod is not None else out


class Block(nn.Module):
    """One decoder layer. Pre-norm: x + f(norm(x)). Sandwich norm: x + norm_post(f(norm(x)))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm, self.mlp_norm = make_norm(config), make_norm(config)
        self.attn, self.mlp = Attention(config), MLP(config)
        sandwich = config.norm == "sandwich"
        self.attn_post_norm = make_norm(config) if sandwich else nn.Identity()
        self.mlp_post_norm = make_norm(config) if sandwich else nn.Identity()
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, rope, mask=None, past=None, mod=None):
        """x (B, S, D) -> (x (B, S, D), (k, v) of this layer for these positions)."""
        a, kv = self.attn(self.attn_norm(x), rope, mask, past, mod)
        x = x + self.drop(self.attn_post_norm(a))
        x = x + self.drop(self.mlp_post_norm(self.mlp(self.mlp_norm(x), mod)))
        return x, kv
