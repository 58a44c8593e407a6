"""Inference-time mechanisms: early exit rules, KV-cache generation, depth sampling, truncated
backprop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from synthlab import SynthlabError
from synthlab.models import KV_STRATEGIES, ModelConfig, build_model, parse_exit_rule

V, S = 50, 10
BASE = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=64)


def make(seed: int = 0, **overrides):
    return build_model(ModelConfig(**{**BASE, **overrides}), seed=seed).eval()


def ids(seed: int, shape=(2, S)) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def spread_out(model):
    """Random init gives near-uniform predictions that barely change between steps; scale the
    embedding and every linear layer up so steps differ and greedy choices are clear."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(20 if name.startswith("embed") else 5)
        if model.controller is not None:  # zero-init heads: give the modulation something to do
            model.controller.heads.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
    return model


# --- exit rules -----------------------------------------------------------------------------------
def test_exit_rules_parse_and_reject_bad_input():
    assert str(parse_exit_rule("static:3")) == "static:3"
    assert parse_exit_rule("q:0.8").value == 0.8
    for bad in ("fast:1", "q:1.5", "q:x", "static:0", "diff", "kl:-1"):
        with pytest.raises(SynthlabError, match="exit rule"):
            parse_exit_rule(bad)


def test_static_exit_returns_that_step_and_computes_no_more():
    model, idx = make(loops=4), ids(0)
    full = model(idx)
    out = model.forward_exit(idx, "static:2")
    assert out.steps_computed == 2 and out.mean_exit_step == 2.0
    assert torch.allclose(out.logits, full.step_logits[1], atol=1e-6)
    deeper = model.forward_exit(idx, "static:6")  # depth extrapolation past the trained loops
    assert torch.allclose(deeper.logits, model(idx, steps=6).logits, atol=1e-6)


@pytest.mark.parametrize("q", [0.3, 0.6, 0.95])
def test_q_exit_is_the_first_step_whose_exit_cdf_reaches_q(q):
    model, idx = make(loops=4, exit_gate=True), ids(1)
    with torch.no_grad():
        model.exit_gate.weight.normal_(0, 2.0, generator=torch.Generator().manual_seed(3))
    full = model(idx)
    cdf = full.exit_probs.cumsum(0)  # (T, B, S)
    cdf[-1] = 1.0
    expected = (cdf >= q - 1e-6).float().argmax(0) + 1  # first step reaching q, 1-based
    out = model.forward_exit(idx, f"q:{q}")
    assert torch.equal(out.exit_step, expected)
    picked = full.step_logits.gather(0, (expected - 1)[None, ..., None].expand(1, 2, S, V))[0]
    assert torch.allclose(out.logits, picked, atol=1e-5)
    assert out.steps_computed == int(expected.max())


def test_q_exit_needs_the_gate_and_a_tiny_q_saves_every_later_step():
    with pytest.raises(SynthlabError, match="exit_gate"):
        make(loops=3).forward_exit(ids(2), "q:0.5")
    out = make(loops=5, exit_gate=True).forward_exit(ids(2), "q:0.000001")
    assert out.steps_computed == 1 and out.exit_step.eq(1).all()


def test_kl_and_diff_exits_match_a_recomputation_from_every_step():
    model, idx = spread_out(make(loops=5)), ids(4)
    logits = model(idx).step_logits  # (T, B, S, V)
    log_p = F.log_softmax(logits, -1)
    kl = (log_p[:-1].exp() * (log_p[:-1] - log_p[1:])).sum(-1)  # KL(step t-1 || step t), t >= 2
    eps = kl.median().item()
    fires = torch.cat([torch.zeros_like(kl[:1], dtype=torch.bool), kl < eps])  # (T, B, S)
    fires[-1] = True  # the last step always exits
    expected = fires.float().argmax(0) + 1
    out = model.forward_exit(idx, f"kl:{eps}")
    assert torch.equal(out.exit_step, expected)
    assert out.mean_exit_step == pytest.approx(expected.float().mean().item())
    # diff: an infinite threshold fires at the first comparison (step 2), zero never fires.
    diff = model.forward_exit(idx, "diff:1e9")  # every token exits at step 2, the first comparison
    assert diff.exit_step.eq(2).all() and diff.steps_computed == 2
    never = model.forward_exit(idx, "diff:0")
    assert never.exit_step.eq(5).all() and never.steps_computed == 5


def test_exit_stops_when_every_masked_token_has_exited():
    model, idx = make(loops=4), ids(5)
    mask = torch.zeros(2, S, dtype=torch.bool)
    mask[:, -1] = True
    out = model.forward_exit(idx, "diff:1e9", mask=mask)
    assert out.steps_computed == 2 and out.mean_exit_step == 2.0


# --- generation -----------------------------------------------------------------------------------
GEN_VARIANTS = {
    "ouro3": dict(loops=3),
    "sandwich_concat": dict(
        topology="sandwich", n_layers=4, n_prelude=1, n_coda=1, loops=3, injection="concat", state_init="zero"
    ),
    "controller": dict(loops=3, controller="controller", recurrence_gate=True, step_norm=True),
}


def greedy_without_cache(model, idx, new_tokens):
    for _ in range(new_tokens):
        idx = torch.cat([idx, model(idx).logits[:, -1:].argmax(-1)], dim=1)
    return idx


@pytest.mark.parametrize("name", list(GEN_VARIANTS))
def test_full_kv_cache_decoding_equals_recomputation_token_for_token(name):
    model, idx = spread_out(make(**GEN_VARIANTS[name])), ids(6, (2, 6))
    out = model.generate(idx, 12, kv_strategy="full")
    assert torch.equal(out.tokens, greedy_without_cache(model, idx, 12))


def test_cache_strategies_hold_the_expected_bytes_and_agree_at_one_step():
    cfg = dict(topology="sandwich", n_layers=4, n_prelude=1, n_coda=1, loops=3, injection="add")
    model, idx = spread_out(make(**cfg)), ids(7, (2, 5))
    new = 6
    kv_bytes = 2 * 2 * (5 + new - 1) * 32 * 4  # k and v, batch 2, positions, d_model, fp32
    outputs = {s: model.generate(idx, new, kv_strategy=s) for s in KV_STRATEGIES}
    assert outputs["full"].cache_bytes == kv_bytes * (1 + 3 * 2 + 1)  # prelude, 3 steps x 2, coda
    for s in ("first", "last", "mean"):
        assert outputs[s].cache_bytes == kv_bytes * (1 + 2 + 1)
        assert outputs[s].tokens.shape == (2, 5 + new)
        assert torch.equal(outputs[s].tokens[:, :6], outputs["full"].tokens[:, :6])  # prefill token
    # With one step every strategy is the same cache: identical decoding.
    one = {s: model.generate(idx, new, kv_strategy=s, steps=1).tokens for s in KV_STRATEGIES}
    assert all(torch.equal(one[s], one["full"]) for s in KV_STRATEGIES)


def test_first_last_mean_strategies_read_different_caches():
    # The strategies are real alternatives: on a model whose steps differ (a large init makes
    # every pass change the state), reusing another step's cache changes the decoded tokens.
    model, idx = spread_out(make(loops=3)), ids(8, (4, 8))
    decoded = {s: model.generate(idx, 8, kv_strategy=s).tokens for s in KV_STRATEGIES}
    assert not all(torch.equal(decoded["full"], decoded[s]) for s in ("first", "last", "mean"))


def test_generation_rejects_bad_arguments():
    model = make()
    with pytest.raises(SynthlabError, match="kv_strategy"):
        model.generate(ids(9), 2, kv_strategy="middle")
    with pytest.raises(SynthlabError, match="max_seq_len"):
        model.generate(ids(9), 60)


# --- depth sampling and truncated backprop -----------------------------------------------------------
def test_step_sampling_is_seeded_and_has_the_poisson_lognormal_mean():
    model = make(loops=8, step_sampling=True, max_steps=8)
    draws = [model.sample_steps(torch.Generator().manual_seed(s)) for s in range(4000)]
    again = [model.sample_steps(torch.Generator().manual_seed(s)) for s in range(20)]
    assert draws[:20] == again and min(draws) >= 1
    mean = sum(draws) / len(draws)
    assert abs(mean - 9.0) < 0.25  # E[Poisson(LogNormal with mean 8)] + 1
    model.train()
    with pytest.raises(SynthlabError, match="generator"):
        model(ids(10))
    out = model(ids(10), generator=torch.Generator().manual_seed(5))
    assert out.steps == model.sample_steps(torch.Generator().manual_seed(5))


def test_backprop_through_the_last_k_steps_only():
    model = make(loops=4, backprop_last_k=2).train()

    def core_grad(step):  # gradient of step `step`'s loss on the core's weights (1-based)
        model.zero_grad()
        model(ids(11)).step_logits[step - 1].logsumexp(-1).mean().backward()
        return sum(p.grad.abs().sum() for p in model.core.parameters() if p.grad is not None)

    assert core_grad(1) == 0 and core_grad(2) == 0  # steps 1..T-k ran without gradients
    assert core_grad(3) > 0 and core_grad(4) > 0
    with torch.no_grad():
        assert torch.allclose(model(ids(11)).step_logits, model.eval()(ids(11)).step_logits)


def test_normal_state_init_draws_from_the_generator_passed_in():
    model, idx = (
        make(
            topology="sandwich",
            n_layers=3,
            n_prelude=1,
            n_coda=1,
            loops=2,
            injection="add",
            state_init="normal",
            state_init_std=1.0,
        ),
        ids(12),
    )

    def run(seed):
        return model(idx, generator=torch.Generator().manual_seed(seed)).logits

    assert torch.equal(run(1), run(1))
    assert not torch.allclose(run(1), run(2))
    assert torch.equal(model(idx).logits, run(0))  # no generator: a fixed seed-0 draw


def test_fixed_lora_bases_are_saved_but_not_trained_or_counted():
    from synthlab.models import count_params

    learned = make(loops=2, controller="controller")
    fixed = make(loops=2, controller="controller", lora_bases="fixed")
    r, d, f = 8, 32, 128
    targets = {"q": (d, d), "k": (d, d), "v": (d, d), "o": (d, d), "up": (d, f), "down": (f, d)}
    bases = 2 * sum(r * (n_in + n_out) for n_in, n_out in targets.values())  # 2 core layers
    assert count_params(learned) - count_params(fixed) == bases
    assert any(k.startswith("lora_bases.") for k in fixed.state_dict())
    assert not any(n.startswith("lora_bases.") for n, _ in fixed.named_parameters())
