"""Core properties of the looped decoder: config, equivalences, causality, losses, counting."""

from __future__ import annotations

import math

import pytest
import torch
from test_models_recipe import OPTIONS as RECIPE_OPTIONS  # the recipe options: tie_head, positions, init, bias, ...
from torch.utils.flop_counter import FlopCounterMode

from synthlab import SynthlabError
from synthlab.models import (
    ModelConfig,
    build_model,
    count_params,
    flops_per_token,
    flops_per_token_parts,
    last_step_loss,
    masked_mean,
    mean_step_loss,
    ouro_stage1_loss,
    ouro_stage2_loss,
    token_losses,
)
from synthlab.serialize import from_dict, load, save, to_dict

V, S = 50, 12
# GPT-2's head (tied to the embedding, as the reference computations below write it out) and init
# scale (the float tolerances below are set for it); the defaults are test_models_recipe.py's.
BASE = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=64, tie_head=True, init_std=0.02)

# Every topology, injection, state init and modulation, each in a tiny config.
VARIANTS = {
    "plain": dict(),
    "ouro3_gate": dict(loops=3, exit_gate=True),
    "ouro_swiglu_sandwichnorm": dict(loops=2, mlp="swiglu", norm="sandwich", norm_type="layernorm", bias=True),
    "sandwich_add_zero": dict(
        topology="sandwich", n_layers=3, n_prelude=1, n_coda=1, loops=3, injection="add", state_init="zero"
    ),
    "sandwich_concat_normal": dict(
        topology="sandwich", n_layers=3, n_prelude=1, n_coda=1, loops=2, injection="concat", state_init="normal"
    ),
    "sandwich_diagonal_input": dict(
        topology="sandwich", n_layers=4, n_prelude=1, n_coda=1, loops=2, injection="diagonal", state_init="input"
    ),
    "controller": dict(loops=3, controller="controller", recurrence_gate=True, step_norm=True),
    "static_lora_fixed": dict(
        loops=2, controller="static_lora", lora_bases="fixed", mlp="swiglu", lora_targets=("q", "v", "gate", "down")
    ),
}


def make(seed: int = 0, **overrides) -> torch.nn.Module:
    return build_model(ModelConfig(**{**BASE, **overrides}), seed=seed).eval()


def ids(seed: int, shape=(2, S)) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def perturb_controller(model: torch.nn.Module) -> None:
    """Zero-init heads make dW = 0; give them weights so the modulation is really exercised."""
    with torch.no_grad():
        for module in (model.controller, model.static_lora):
            if module is not None:
                for p in module.parameters():
                    p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))


# --- config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [*VARIANTS.values(), *RECIPE_OPTIONS.values()], ids=[*VARIANTS, *RECIPE_OPTIONS])
def test_config_round_trips_through_json_and_toml(options, tmp_path):
    cfg = ModelConfig(**{**BASE, **options})
    assert from_dict(ModelConfig, to_dict(cfg)) == cfg
    for suffix in (".json", ".toml"):
        save(cfg, tmp_path / f"model{suffix}")
        assert load(ModelConfig, tmp_path / f"model{suffix}") == cfg


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(n_heads=5), "n_heads"),
        (dict(mlp="relu"), "mlp"),
        (dict(injection="mul"), "injection"),
        (dict(topology="ouro", n_prelude=1), "topology"),
        (dict(topology="sandwich", n_layers=2, n_prelude=1, n_coda=1), "n_layers"),
        (dict(lora_targets=("gate",)), "lora_targets"),
        (dict(loops=0), "loops"),
        (dict(positions="alibi"), "positions"),
        (dict(init="xavier"), "init"),
        (dict(tie_head="no"), "tie_head"),
        (dict(bias=1), "bias"),
        (dict(norm_type="batch"), "norm_type"),
        (dict(qkv_bias="yes"), "qkv_bias"),
        (dict(d_model=12, n_heads=4), "n_heads"),  # head size 3: odd, RoPE needs it even
    ],
)
def test_config_rejects_bad_values_naming_the_field(bad, field):
    with pytest.raises(SynthlabError, match=f"ModelConfig.{field}"):
        ModelConfig(**{**BASE, **bad})


def test_unknown_config_key_is_an_error_with_a_suggestion():
    with pytest.raises(SynthlabError, match="did you mean 'loops'"):
        from_dict(ModelConfig, {**BASE, "loop": 2})


# --- equivalences ---------------------------------------------------------------------------------
def reference_forward(model, idx):
    """The plain GPT computation written out: embed, blocks in order, final norm, tied head."""
    rope = model.rotary.tables(0, idx.shape[1])
    x = model.embed(idx)
    for block in [*model.prelude, *model.core, *model.coda]:
        x, _ = block(x, rope)
    return model.final_norm(x) @ model.embed.weight.T


def test_loops_1_equals_the_plain_model_exactly():
    plain, idx = make(), ids(0)
    out = plain(idx)
    assert out.step_logits.shape == (1, 2, S, V)
    assert torch.equal(out.logits, reference_forward(plain, idx))
    # A 4-loop model has the same parameters (same seed -> same weights); at steps=1 it IS plain.
    looped = make(loops=4)
    assert torch.equal(looped(idx, steps=1).logits, out.logits)
    assert not torch.allclose(looped(idx).logits, out.logits)


def test_sandwich_without_injection_and_one_step_is_the_plain_stack():
    sandwich = make(topology="sandwich", n_layers=4, n_prelude=1, n_coda=1, loops=1)
    idx = ids(1)
    assert torch.allclose(sandwich(idx).logits, reference_forward(sandwich, idx), atol=1e-6)


def test_ouro_step_t_logits_equal_t_separate_passes():
    looped, idx = make(loops=3), ids(2)
    out = looped(idx)
    for t in range(1, 4):
        assert torch.allclose(out.step_logits[t - 1], looped(idx, steps=t).logits, atol=1e-6)


def test_zero_init_controller_heads_leave_the_shared_block_unchanged():
    idx = ids(3)
    plain = make(loops=3)
    for controller in ("controller", "static_lora"):
        modulated = make(loops=3, controller=controller)
        modulated.load_state_dict(plain.state_dict(), strict=False)
        assert torch.allclose(modulated(idx).step_logits, plain(idx).step_logits, atol=1e-6)


def test_diagonal_injection_starts_at_decay_one_over_e_and_identity_input():
    model = make(topology="sandwich", n_layers=3, n_prelude=1, n_coda=1, injection="diagonal")
    h, e = torch.randn(2, S, 32), torch.randn(2, S, 32)
    assert torch.allclose(model.injection(h, e), h / math.e + e, atol=1e-6)


# --- causality and document masking -------------------------------------------------------------
@pytest.mark.parametrize("name", list(VARIANTS))
def test_changing_token_j_changes_no_prediction_before_j(name):
    model = make(**VARIANTS[name])
    perturb_controller(model)
    idx, j = ids(4), 7
    changed = idx.clone()
    changed[:, j] = (idx[:, j] + 1) % V
    a, b = model(idx), model(changed)
    assert torch.equal(a.step_logits[:, :, :j], b.step_logits[:, :, :j])
    assert not torch.allclose(a.step_logits[:, :, j:], b.step_logits[:, :, j:])
    if a.exit_probs is not None:
        assert torch.equal(a.exit_probs[:, :, :j], b.exit_probs[:, :, :j])


@pytest.mark.parametrize("name", [n for n in VARIANTS if VARIANTS[n].get("state_init") != "normal"])
def test_document_mask_isolates_packed_documents(name):
    model = make(**VARIANTS[name])
    perturb_controller(model)
    first, second = ids(5, (1, 5)), ids(6, (1, 7))
    packed = torch.cat([first, second], dim=1)
    doc_ids = torch.tensor([[0] * 5 + [1] * 7])
    other_first = (first + 3) % V
    a = model(packed, doc_ids=doc_ids).step_logits
    b = model(torch.cat([other_first, second], dim=1), doc_ids=doc_ids).step_logits
    assert torch.equal(a[:, :, 5:], b[:, :, 5:])  # doc 2 does not see doc 1's content
    # ... and, RoPE being relative, it reads as if it were alone at position 0.
    alone = model(second).step_logits
    assert torch.allclose(a[:, :, 5:], alone, atol=1e-5)


# --- losses ---------------------------------------------------------------------------------------
def test_token_losses_and_masked_mean_match_hand_computation():
    logits = torch.randn(2, 1, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[4, 0, 2]])
    losses = token_losses(logits, targets)
    for t in range(2):
        for i in range(3):
            expected = -torch.log_softmax(logits[t, 0, i], -1)[targets[0, i]]
            assert losses[t, 0, i].item() == pytest.approx(expected.item(), rel=1e-6)
    mask = torch.tensor([[True, False, True]])
    assert masked_mean(losses, mask).item() == pytest.approx(
        (losses[:, 0, 0].sum() + losses[:, 0, 2].sum()).item() / 4, rel=1e-6
    )
    assert last_step_loss(logits, targets, mask).item() == pytest.approx(
        (losses[1, 0, 0] + losses[1, 0, 2]).item() / 2, rel=1e-6
    )
    assert mean_step_loss(logits, targets, mask).item() == pytest.approx(masked_mean(losses, mask).item(), rel=1e-6)
    ignored = token_losses(logits, torch.tensor([[4, -100, 2]]))
    assert ignored[:, 0, 1].abs().max().item() == 0.0


def test_ouro_stage1_loss_matches_hand_computation():
    # One token, T = 3: lambdas 0.2, 0.5, (unused) -> p = 0.2, 0.8*0.5, 0.8*0.5.
    lambdas = torch.tensor([0.2, 0.5, 0.9]).view(3, 1, 1)
    from synthlab.models import exit_distribution

    p = exit_distribution(lambdas)
    assert p.flatten().tolist() == pytest.approx([0.2, 0.4, 0.4])
    losses = torch.tensor([3.0, 2.0, 1.5]).view(3, 1, 1)
    beta = 0.1
    entropy = -(0.2 * math.log(0.2) + 2 * 0.4 * math.log(0.4))
    expected = 0.2 * 3.0 + 0.4 * 2.0 + 0.4 * 1.5 - beta * entropy
    assert ouro_stage1_loss(losses, p, beta=beta).item() == pytest.approx(expected, rel=1e-6)
    # Masked mean over two tokens, the second masked out.
    two = ouro_stage1_loss(
        torch.cat([losses, 9 * losses], 2), torch.cat([p, p], 2), torch.tensor([[True, False]]), beta=beta
    )
    assert two.item() == pytest.approx(expected, rel=1e-6)


def test_ouro_stage2_loss_matches_hand_computation():
    losses = torch.tensor([3.0, 2.0, 1.999]).view(3, 1, 1)  # big gain, then a tiny one
    lambdas = torch.tensor([0.3, 0.4, 0.7]).view(3, 1, 1)

    def bce(prob, label):
        return -(label * math.log(prob) + (1 - label) * math.log(1 - prob))

    w2 = 1 / (1 + math.exp(-50 * (1.0 - 0.005)))
    w3 = 1 / (1 + math.exp(-50 * (0.001 - 0.005)))
    expected = (bce(0.6, w2) + bce(0.3, w3)) / 2  # continue probability = 1 - lambda
    assert ouro_stage2_loss(losses, lambdas).item() == pytest.approx(expected, rel=1e-5)


def test_gradients_reach_the_exit_gate_and_the_controller():
    model = make(loops=3, exit_gate=True, controller="controller", recurrence_gate=True, step_norm=True).train()
    idx, targets = ids(7), ids(8)
    out = model(idx)
    losses = token_losses(out.step_logits, targets)
    (ouro_stage1_loss(losses, out.exit_probs) + ouro_stage2_loss(losses, out.exit_lambdas)).backward()
    for module in (model.exit_gate, model.controller.heads, model.recurrence_gate, model.step_norms):
        grads = [p.grad for p in module.parameters()]
        assert all(g is not None and g.abs().sum() > 0 for g in grads), module
    static = make(loops=2, controller="static_lora").train()
    mean_step_loss(static(idx).step_logits, targets).backward()
    assert static.static_lora.deltas.grad.abs().sum() > 0


# --- counting -------------------------------------------------------------------------------------
def test_parameter_count_is_unique_and_re_derived():
    d, f, L = 32, 128, 2
    per_layer = 4 * d * d + 2 * d * f + 2 * d  # qkv + o, MLP up + down, two RMSNorm scales
    expected = V * d + L * per_layer + d  # tied embedding once, final norm
    assert count_params(make()) == expected
    assert count_params(make(loops=4)) == count_params(make(loops=1))
    assert count_params(make(), exclude_embedding=True) == expected - V * d
    assert count_params(make(), used_token_ids=range(10)) == expected - (V - 10) * d


@pytest.mark.parametrize("name", list(VARIANTS))
def test_flops_per_token_match_torch_flop_counter(name):
    # FlopCounterMode counts every matmul but not CPU SDPA; add attention's 4 S D per layer run.
    cfg = ModelConfig(**{**BASE, **VARIANTS[name]})
    model, idx = build_model(cfg).eval(), ids(9)
    with FlopCounterMode(display=False) as counter:
        model(idx)
    layer_runs = cfg.n_prelude + cfg.loops * (cfg.n_core + cfg.n_coda)
    attention = 4 * S * cfg.d_model * layer_runs
    assert flops_per_token(cfg, S) == counter.get_total_flops() / idx.numel() + attention
    assert flops_per_token(cfg, S, steps=2 * cfg.loops) > flops_per_token(cfg, S)


@pytest.mark.parametrize("name", ["plain", "looped", "sandwich_all_steps"])
def test_flops_per_token_parts_split_the_count_into_layers_and_head(name):
    cfg = {
        "plain": ModelConfig(vocab_size=50, d_model=32, n_heads=2, n_layers=3),
        "looped": ModelConfig(vocab_size=50, d_model=32, n_heads=2, n_layers=2, loops=4),
        "sandwich_all_steps": ModelConfig(
            vocab_size=50, d_model=32, n_heads=2, n_layers=4, loops=3, topology="sandwich", n_prelude=1, n_coda=1
        ),
    }[name]
    parts = flops_per_token_parts(cfg, 16)
    assert sum(parts.values()) == flops_per_token(cfg, 16)
    assert parts["head"] == cfg.loops * 2 * cfg.d_model * cfg.vocab_size  # a readout after every step
    assert flops_per_token_parts(cfg, 16, all_steps=False)["head"] == 2 * cfg.d_model * cfg.vocab_size
