"""The fused attention path for packed rows (ModelConfig.attention = flex: flex_attention with a
document block mask) computes what today's dense masked attention computes, to float rounding:
the forward on the CPU (torch has no flex_attention backward there: CPU training keeps the dense
mask), forward and gradients on a GPU (`cuda` tests)."""

from __future__ import annotations

import pytest
import torch

from synthlab.errors import SynthlabError
from synthlab.models import ModelConfig, build_model


def _packed(B: int, S: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens in rows of documents of random lengths (the last one padding's own id)."""
    g = torch.Generator().manual_seed(seed)
    doc_ids = torch.zeros(B, S, dtype=torch.long)
    for b in range(B):
        cuts = torch.randint(1, S, (5,), generator=g).unique().tolist()
        for i, cut in enumerate(cuts):
            doc_ids[b, cut:] = i + 1
    return torch.randint(0, 50, (B, S), generator=g), doc_ids


EXTRAS = [
    {},
    {"loops": 3, "n_layers": 3, "topology": "sandwich", "n_prelude": 1, "n_coda": 1},
    {"positions": "learned"},
]


def _pair(device: str, extra: dict):
    config = {"vocab_size": 50, "d_model": 32, "n_heads": 4, "n_layers": 2, "max_seq_len": 160, **extra}
    dense, flex = (build_model(ModelConfig(**config, attention=kind), seed=0).to(device) for kind in ("sdpa", "flex"))
    assert all(torch.equal(a, b) for a, b in zip(dense.parameters(), flex.parameters()))
    idx, doc_ids = _packed(3, 150, seed=1)  # more than one 128-position block
    return dense, flex, idx.to(device), doc_ids.to(device)


@pytest.mark.parametrize("extra", EXTRAS)
def test_flex_attention_over_documents_equals_the_dense_masked_path(extra):
    dense, flex, idx, doc_ids = _pair("cpu", extra)
    with torch.no_grad():
        out_dense, out_flex = dense(idx, doc_ids=doc_ids), flex(idx, doc_ids=doc_ids)
    torch.testing.assert_close(out_flex.step_logits, out_dense.step_logits, rtol=1e-5, atol=1e-5)


def test_cpu_training_keeps_the_dense_mask():
    dense, flex, idx, doc_ids = _pair("cpu", {})
    assert torch.equal(flex(idx, doc_ids=doc_ids).logits, dense(idx, doc_ids=doc_ids).logits)  # bit for bit


@pytest.mark.cuda
@pytest.mark.parametrize("extra", EXTRAS)
def test_flex_attention_trains_like_the_dense_path_on_a_gpu(extra):
    dense, flex, idx, doc_ids = _pair("cuda", extra)
    out_dense, out_flex = dense(idx, doc_ids=doc_ids), flex(idx, doc_ids=doc_ids)
    torch.testing.assert_close(out_flex.step_logits, out_dense.step_logits, rtol=1e-4, atol=1e-4)
    out_dense.logits.square().mean().backward()
    out_flex.logits.square().mean().backward()
    for (name, a), b in zip(dense.named_parameters(), flex.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_token_sees_nothing_of_another_document():
    model = build_model(
        ModelConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=1, max_seq_len=64, attention="flex"), seed=0
    )
    idx, doc_ids = torch.randint(0, 50, (1, 40)), torch.tensor([[0] * 20 + [1] * 20])
    changed = idx.clone()
    changed[0, :20] = (changed[0, :20] + 1) % 50  # the first document changes
    with torch.no_grad():
        torch.testing.assert_close(
            model(idx, doc_ids=doc_ids).logits[0, 20:], model(changed, doc_ids=doc_ids).logits[0, 20:]
        )


def test_flex_needs_no_dropout():
    with pytest.raises(SynthlabError, match="dropout"):
        ModelConfig(vocab_size=50, attention="flex", dropout=0.1)
