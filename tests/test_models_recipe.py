"""The training-recipe options of the looped decoder (positions, tie_head, init, bias, norm_type):
every value keeps the properties of test_models.py / test_models_inference.py on every topology
(ouro loop with the exit gate, sandwich with injection, controller LoRA on the linears)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from synthlab import SynthlabError
from synthlab.models import ModelConfig, build_model, count_params, flops_per_token

V, S = 50, 10
BASE = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=64)

# One entry per option value (test_models.py covers rope / tied / gpt2 / no bias / rmsnorm; the
# default head is untied), plus the 60-line reference GPT's recipe all at once.
OPTIONS = {
    "untied": dict(tie_head=False),
    "gpt2_std": dict(tie_head=True, init_std=0.02),  # GPT-2's head and init scale
    "learned_pos": dict(positions="learned"),
    "no_pos": dict(positions="none"),
    "init_torch": dict(init="torch"),
    "init_gpt2_depth": dict(init="gpt2_depth"),
    "bias_rmsnorm": dict(bias=True),
    "layernorm": dict(norm_type="layernorm"),
    "qkv_bias": dict(qkv_bias=True),
    "qwen2_block": dict(mlp="swiglu", qkv_bias=True, tie_head=False),  # what `synthlab export` needs
    "reference_gpt": dict(positions="learned", tie_head=False, init="torch", bias=True, norm_type="layernorm"),
}
TOPOLOGIES = {
    "ouro3_gate": dict(loops=3, exit_gate=True),
    "sandwich_concat": dict(
        topology="sandwich", n_layers=4, n_prelude=1, n_coda=1, loops=2, injection="concat", state_init="zero"
    ),
    "controller": dict(loops=2, controller="controller", recurrence_gate=True, step_norm=True),
}
GRID = [(o, t) for o in OPTIONS for t in TOPOLOGIES]


def make(seed: int = 0, **overrides) -> torch.nn.Module:
    return build_model(ModelConfig(**{**BASE, **overrides}), seed=seed).eval()


def make_grid(option: str, topology: str, seed: int = 0) -> torch.nn.Module:
    return make(seed, **OPTIONS[option], **TOPOLOGIES[topology])


def ids(seed: int, shape=(2, S)) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def spread_out(model):
    """Scale weights up so steps differ and greedy choices are clear (as test_models_inference),
    and give the zero-init controller heads weights so the modulation is exercised."""
    big_embedding = model.config.init != "torch"  # torch init: embeddings already N(0, 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(20 if name.startswith(("embed", "pos_embed")) and big_embedding else 5)
        if model.controller is not None:
            model.controller.heads.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
    return model


def reference_forward(model, idx):
    """The plain GPT written out: embed (+ learned positions), blocks, final norm, head."""
    rope = model.rotary.tables(0, idx.shape[1]) if model.rotary is not None else None
    x = model.embed(idx)
    if model.pos_embed is not None:
        x = x + model.pos_embed(torch.arange(idx.shape[1]))
    for block in [*model.prelude, *model.core, *model.coda]:
        x, _ = block(x, rope)
    head = model.embed.weight if model.lm_head is None else model.lm_head.weight
    return model.final_norm(x) @ head.T


# --- config ---------------------------------------------------------------------------------------
def test_defaults_are_the_benchmarked_recipe():
    c = ModelConfig(vocab_size=V)
    assert (c.positions, c.tie_head, c.init, c.bias, c.norm_type) == ("rope", False, "gpt2", False, "rmsnorm")
    model = make()
    assert model.lm_head is not None and model.pos_embed is None and model.rotary is not None


@pytest.mark.parametrize("d_model", [32, 128, 768])
def test_default_init_std_is_gpt2s_scaled_as_one_over_sqrt_width(d_model):
    model = make(d_model=d_model, n_heads=4)
    std = 0.02 * (768 / d_model) ** 0.5  # GPT-2's 0.02 at d = 768
    assert model.config.weight_std == pytest.approx(std)
    weights = torch.cat([model.embed.weight.flatten(), model.core[0].attn.qkv.weight.flatten()])
    assert weights.std().item() == pytest.approx(std, rel=0.05)
    assert make(d_model=d_model, n_heads=4, init_std=0.02).embed.weight.std().item() == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("positions", ["learned", "none"])
def test_odd_head_size_is_fine_without_rope_and_max_seq_len_still_holds(positions):
    model = make(d_model=12, n_heads=4, positions=positions)
    assert model(ids(0)).logits.shape == (2, S, V)
    with pytest.raises(SynthlabError, match="max_seq_len"):
        model(ids(0, (1, 65)))


# --- causality and equivalences -------------------------------------------------------------------
@pytest.mark.parametrize("option, topology", GRID)
def test_changing_token_j_changes_no_prediction_before_j(option, topology):
    model = spread_out(make_grid(option, topology))
    idx, j = ids(4), 6
    changed = idx.clone()
    changed[:, j] = (idx[:, j] + 1) % V
    a, b = model(idx), model(changed)
    assert torch.equal(a.step_logits[:, :, :j], b.step_logits[:, :, :j])
    assert not torch.allclose(a.step_logits[:, :, j:], b.step_logits[:, :, j:])
    if a.exit_probs is not None:
        assert torch.equal(a.exit_probs[:, :, :j], b.exit_probs[:, :, :j])


@pytest.mark.parametrize("option", list(OPTIONS))
def test_loops_1_equals_the_plain_model(option):
    plain, idx = make(**OPTIONS[option]), ids(0)
    out = plain(idx)
    assert torch.allclose(out.logits, reference_forward(plain, idx), atol=1e-6)
    looped = make(loops=4, **OPTIONS[option])
    looped.load_state_dict(plain.state_dict())  # gpt2_depth: a deeper loop inits differently
    assert torch.equal(looped(idx, steps=1).logits, out.logits)
    assert not torch.allclose(looped(idx).logits, out.logits)
    sandwich = make(topology="sandwich", n_layers=4, n_prelude=1, n_coda=1, **OPTIONS[option])
    assert torch.allclose(sandwich(idx).logits, reference_forward(sandwich, idx), atol=1e-5)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_static_exit_reads_that_steps_logits(option):
    model, idx = make(**OPTIONS[option], **TOPOLOGIES["ouro3_gate"]), ids(1)
    out = model.forward_exit(idx, "static:2")
    assert out.steps_computed == 2
    assert torch.allclose(out.logits, model(idx).step_logits[1], atol=1e-5)


@pytest.mark.parametrize("positions", ["rope", "learned", "none"])
def test_packed_documents_stay_isolated_and_relative_positions_read_as_alone(positions):
    model = spread_out(make(positions=positions, loops=2))
    first, second = ids(5, (1, 5)), ids(6, (1, 7))
    doc_ids = torch.tensor([[0] * 5 + [1] * 7])
    a = model(torch.cat([first, second], 1), doc_ids=doc_ids).step_logits
    b = model(torch.cat([(first + 3) % V, second], 1), doc_ids=doc_ids).step_logits
    assert torch.equal(a[:, :, 5:], b[:, :, 5:])
    # RoPE and no positions are blind to the offset; a learned table is absolute: it is not.
    alone = model(second).step_logits
    assert torch.allclose(a[:, :, 5:], alone, atol=1e-4) == (positions != "learned")


# --- generation ---------------------------------------------------------------------------------
def greedy_without_cache(model, idx, new_tokens):
    for _ in range(new_tokens):
        idx = torch.cat([idx, model(idx).logits[:, -1:].argmax(-1)], dim=1)
    return idx


@pytest.mark.parametrize("option, topology", GRID)
def test_full_kv_cache_decoding_equals_recomputation(option, topology):
    # Learned positions must index the table by absolute position while decoding too.
    model, idx = spread_out(make_grid(option, topology)), ids(6, (2, 6))
    out = model.generate(idx, 10, kv_strategy="full")
    assert torch.equal(out.tokens, greedy_without_cache(model, idx, 10))


# --- parameters, state, head, init ------------------------------------------------------------
@pytest.mark.parametrize("option, topology", GRID)
def test_count_params_is_the_sum_of_unique_parameter_numels(option, topology):
    model = make_grid(option, topology)
    unique = {p.data_ptr(): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}
    assert count_params(model) == sum(unique.values())
    tables = [model.embed.weight] + [m.weight for m in (model.lm_head, model.pos_embed) if m is not None]
    assert count_params(model, exclude_embedding=True) == sum(unique.values()) - sum(t.numel() for t in tables)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_parameter_count_is_re_derived(option):
    c = ModelConfig(**{**BASE, **OPTIONS[option]})
    d, L, P = 32, 2, 64
    f = 128 if c.mlp == "gelu" else 88  # 4 d; 8/3 d rounded up to a multiple of 8
    mlp_in = 2 * f if c.mlp == "swiglu" else f  # SwiGLU: gate and up
    ln_bias = c.norm_type == "layernorm" and c.bias
    per_layer = 4 * d * d + (mlp_in + f) * d + 2 * d  # qkv + o, MLP in + down, two norm gains
    per_layer += (3 * d + d + mlp_in + d if c.bias else 3 * d if c.qkv_bias else 0) + (2 * d if ln_bias else 0)
    vocab_tables = 1 if c.tie_head else 2
    embedding = vocab_tables * V * d + (P * d if c.positions == "learned" else 0)
    expected = embedding + L * per_layer + d + (d if ln_bias else 0)  # + final norm
    model = build_model(c)
    assert count_params(model) == expected
    assert count_params(model, exclude_embedding=True) == expected - embedding
    assert count_params(model, used_token_ids=range(10)) == expected - vocab_tables * (V - 10) * d


@pytest.mark.parametrize("option, topology", GRID)
def test_state_dict_round_trip(option, topology, tmp_path):
    model, idx = make_grid(option, topology), ids(7)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    other = make_grid(option, topology, seed=1)
    assert not torch.allclose(other(idx).step_logits, model(idx).step_logits)
    other.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    assert torch.equal(other(idx).step_logits, model(idx).step_logits)
    keys = set(model.state_dict())
    assert ("lm_head.weight" in keys) == (not model.config.tie_head)
    assert ("pos_embed.weight" in keys) == (model.config.positions == "learned")
    assert not any(k.startswith("rotary.") for k in keys)  # derived from the config


def test_untied_head_is_its_own_weight_and_both_tables_learn():
    model = make(tie_head=False).train()
    assert model.lm_head.weight is not model.embed.weight
    assert model.lm_head.weight.data_ptr() != model.embed.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.embed.weight)
    assert model.lm_head.bias is None
    idx = ids(8)
    model(idx).logits.logsumexp(-1).mean().backward()
    assert model.lm_head.weight.grad.abs().sum() > 0 and model.embed.weight.grad.abs().sum() > 0
    tied = make(tie_head=True)
    assert tied.lm_head is None and "embed.weight" in dict(tied.named_parameters())


def test_learned_position_table_is_trained_and_changes_the_output():
    # tied head: an untied head's draws would follow the table's, so the two models' heads differ
    model = make(positions="learned", tie_head=True).train()
    model(ids(9)).logits.logsumexp(-1).mean().backward()
    grad = model.pos_embed.weight.grad
    assert grad[:S].abs().sum(-1).gt(0).all() and grad[S:].abs().sum() == 0  # rows used only
    with torch.no_grad():
        before = model.eval()(ids(9)).logits
        model.pos_embed.weight.zero_()
        assert not torch.allclose(model(ids(9)).logits, before)
        assert torch.equal(model(ids(9)).logits, make(positions="none", tie_head=True).eval()(ids(9)).logits)


def test_torch_init_is_pytorchs_default_seeded_and_keeps_the_recurrence_inits():
    model = make(init="torch", bias=True, loops=2, controller="controller", recurrence_gate=True)
    state = torch.random.get_rng_state()
    model.init_weights(torch.Generator().manual_seed(0))  # re-draws the same weights ...
    assert torch.equal(torch.random.get_rng_state(), state)  # ... leaving the global RNG as it was
    again, other = (
        make(init="torch", bias=True, loops=2, controller="controller", recurrence_gate=True),
        make(1, init="torch", bias=True, loops=2, controller="controller", recurrence_gate=True),
    )
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert not torch.equal(model.core[0].attn.qkv.weight, other.core[0].attn.qkv.weight)
    qkv = model.core[0].attn.qkv
    bound = 32**-0.5  # nn.Linear default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias
    assert qkv.weight.abs().max() <= bound and qkv.weight.abs().max() > 0.9 * bound
    assert qkv.bias.abs().max() <= bound and qkv.bias.abs().max() > 0.5 * bound
    assert 0.9 < model.embed.weight.std().item() < 1.1  # nn.Embedding default: N(0, 1)
    assert model.controller.heads.weight.abs().sum() == 0  # zero heads: no modulation at init
    assert torch.all(model.recurrence_gate.proj.bias == -2.0)


# gpt2 keeps the previous code's scaling, 1/sqrt(2 n_layers) over the 4 distinct layers;
# gpt2_depth uses the depth run: prelude 1 + 4 loops x 2 core layers + coda 1 = 10.
@pytest.mark.parametrize("init, depth", [("gpt2", 4), ("gpt2_depth", 10)])
def test_gpt2_inits_scale_residual_projections_by_distinct_or_run_depth(init, depth):
    model = make(
        init=init,
        topology="sandwich",
        n_layers=4,
        n_prelude=1,
        n_coda=1,
        loops=4,
        injection="add",
        n_heads=2,
        d_model=64,
        init_std=0.02,
    )
    down = torch.cat([b.mlp.down.weight.flatten() for b in [*model.prelude, *model.core, *model.coda]])
    assert down.std().item() == pytest.approx(0.02 * (2 * depth) ** -0.5, rel=0.05)
    assert model.core[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_flops_per_token_match_torch_flop_counter(option):
    cfg = ModelConfig(**{**BASE, **OPTIONS[option], **TOPOLOGIES["sandwich_concat"]})
    model, idx = build_model(cfg).eval(), ids(9)
    with FlopCounterMode(display=False) as counter:
        model(idx)
    layer_runs = cfg.n_prelude + cfg.loops * (cfg.n_core + cfg.n_coda)
    attention = 4 * S * cfg.d_model * layer_runs  # CPU SDPA is not counted by the counter
    assert flops_per_token(cfg, S) == counter.get_total_flops() / idx.numel() + attention


@pytest.mark.parametrize("init", ["gpt2", "torch"])
def test_recurrence_modules_keep_0_02_unless_init_std_is_set(init):
    """The width-scaled default is for the main weights; the injection projection keeps 0.02."""
    sandwich = dict(
        d_model=128,
        n_heads=4,
        topology="sandwich",
        n_prelude=1,
        n_coda=1,
        n_layers=3,
        loops=2,
        injection="concat",
        init=init,
    )
    assert make(**sandwich).injection.proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert make(**sandwich, init_std=0.05).injection.proj.weight.std().item() == pytest.approx(0.05, rel=0.05)
