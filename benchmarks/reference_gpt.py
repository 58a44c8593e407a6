"""The reference for benchmarks/bench_learning.py: a minimal nanoGPT-style decoder (token + learned
absolute position embedding, pre-LayerNorm blocks with biases, causal SDPA attention with
synthlab's document mask on packed rows, GELU MLP, final LayerNorm, untied head, PyTorch default
init), its plain training step, and the adapter the lab's scorers call it through."""

from __future__ import annotations

import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from synthlab.models.layers import attention_mask


class RefAttention(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x, mask=None):
        B, S, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, S, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.proj(y.transpose(1, 2).reshape(B, S, D))


class RefBlock(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), RefAttention(d, n_heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class RefGPT(nn.Module):
    def __init__(self, vocab: int, d: int, n_layers: int, n_heads: int, block_size: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(RefBlock(d, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, doc_ids=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        mask = attention_mask(doc_ids)  # packed rows: causal and same document, as synthlab's
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def ref_step(model, optimizer, inputs, targets, mask, doc_ids) -> float:
    logits = model(inputs, doc_ids)
    loss = F.cross_entropy(logits[mask], targets[mask])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


class RefScored:
    """The reference as the lab's scorers call a model: f(ids, steps=None) -> .logits, .step_logits."""

    def __init__(self, model: RefGPT):
        self.model = model

    def __call__(self, ids, steps=None):
        logits = self.model(ids)
        return types.SimpleNamespace(logits=logits, step_logits=logits[None])
