"""The training step's speed work keeps its numerics: attention with RoPE and the document mask
built once equals the old per-layer formulas bit for bit, the summed `last` loss gives the same
gradients as the per-position losses, the trainable list is walked once, and the optimizer kernels
(train.optim.optimizer_impl) apply the same update within rounding. benchmarks/bench_shapes.py runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from synthlab.errors import SynthlabError
from synthlab.models import ModelConfig, build_model
from synthlab.models.layers import Attention, Rotary, attention_mask, packed_mask
from synthlab.training import engine
from synthlab.training.configs import TrainConfig
from synthlab.training.objectives import model_forward, step_losses
from synthlab.training.optim import adamw

ROOT = Path(__file__).resolve().parents[1]
CFG = ModelConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=2, max_seq_len=24)


def old_rotary(x, cos, sin):
    """The previous RoPE: x (B, H, S, Dh) cos + cat(-x2, x1) sin with the unsigned sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def old_attention(attn: Attention, x, cos, sin, mask):
    """The previous Attention.forward: split, per-head views, rotate q and k apart, the boolean mask."""
    B, S, D = x.shape
    q, k, v = attn.qkv(x).split(D, dim=-1)
    q, k, v = (t.view(B, S, attn.n_heads, attn.head_dim).transpose(1, 2) for t in (q, k, v))
    q, k = old_rotary(q, cos, sin), old_rotary(k, cos, sin)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    return attn.o(y.transpose(1, 2).reshape(B, S, D))


def doc_ids(B=3, S=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (B, S), generator=g).sort(dim=1).values


@pytest.mark.parametrize("packed", [False, True])
def test_attention_equals_the_old_formulas_bit_for_bit(packed):
    attn, rotary = Attention(CFG), Rotary(CFG.head_dim, CFG.max_seq_len, CFG.rope_base)
    torch.nn.init.normal_(attn.qkv.weight, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, 24, 32, generator=torch.Generator().manual_seed(2), requires_grad=True)
    ids = doc_ids() if packed else None
    angles = torch.outer(torch.arange(24.0), CFG.rope_base ** (-torch.arange(0, 8, 2.0) / 8))
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    new, _ = attn(x, rotary.tables(0, 24), packed_mask(ids))
    grads_new = torch.autograd.grad(new.square().sum(), [x, *attn.parameters()])
    old = old_attention(attn, x, cos, sin, attention_mask(ids))
    grads_old = torch.autograd.grad(old.square().sum(), [x, *attn.parameters()])
    assert torch.equal(rotary.cos, cos)
    assert torch.equal(new, old)
    assert all(torch.equal(a, b) for a, b in zip(grads_new, grads_old))


def test_the_additive_mask_is_the_boolean_one_in_the_queries_dtype():
    ids = doc_ids()
    allowed = attention_mask(ids)
    additive = packed_mask(ids, dtype=torch.bfloat16)
    assert additive.dtype == torch.bfloat16 and packed_mask(None) is None
    assert torch.equal(additive == 0, allowed) and torch.isneginf(additive[~allowed]).all()


def test_the_summed_last_loss_gives_the_logged_forms_gradients():
    model = build_model(CFG)
    g = torch.Generator().manual_seed(3)
    inputs, targets = torch.randint(0, 40, (3, 24), generator=g), torch.randint(0, 40, (3, 24), generator=g)
    mask = torch.rand(3, 24, generator=g) > 0.3
    cfg, forward = TrainConfig.flat(steps=1), model_forward(model)
    results = []
    for logging in (False, True):  # off a logging step: the summed loss; on one: per-position losses
        model.zero_grad()
        objective, per_step = step_losses(forward, inputs, targets, mask, doc_ids(), cfg, g, logging)
        objective.backward()
        results.append((objective.detach(), per_step, [p.grad.clone() for p in model.parameters()]))
    (fast, fast_steps, fast_grads), (logged, logged_steps, logged_grads) = results
    assert all(torch.equal(a, b) for a, b in zip(fast_grads, logged_grads))
    torch.testing.assert_close(fast, logged, rtol=1e-6, atol=0)
    assert fast_steps.shape == logged_steps.shape == (1,)


def test_trainables_are_listed_once_in_the_models_order():
    model = build_model(CFG)
    model.embed.requires_grad_(False)
    state = engine.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), lambda s: 0.1)
    first = state.trainables()
    assert [id(p) for p in first] == [id(p) for p in model.parameters() if p.requires_grad]
    assert id(model.embed.weight) not in map(id, first)
    assert state.trainables() is first


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_kernels_apply_the_default_update_within_rounding(impl):
    finals = {}
    for kernel in ("default", impl):
        model = build_model(CFG)
        opt = adamw(
            model.parameters(), lambda p: p.dim() >= 2, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.98), impl=kernel
        )
        for step in range(3):
            idx = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(step))
            model(idx).logits.square().mean().backward()
            opt.step()
            opt.zero_grad()
        finals[kernel] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.equal(finals["default"], torch.cat([p.flatten() for p in build_model(CFG).parameters()]))
    torch.testing.assert_close(finals[impl], finals["default"], rtol=1e-5, atol=1e-6)


def test_an_unknown_optimizer_impl_is_an_error():
    assert TrainConfig.flat(steps=1).optim.optimizer_impl == "default"
    with pytest.raises(SynthlabError, match="optimizer_impl must be one of default, foreach, fused"):
        TrainConfig.flat(steps=1, optimizer_impl="apex")


@pytest.mark.slow
def test_bench_shapes_dry_run_compares_the_lab_with_the_reference(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_shapes

    results = bench_shapes.main(["--dry-run", "--shapes", "multihop-1x2", "--impl", "fused", "--cache", str(tmp_path)])
    out = capsys.readouterr().out
    assert "multihop-1x2: d 128 x 1 layers x 2 loops" in out
    assert (
        set(results["multihop-1x2"]) == {"reference", "lab", "lab fused"} and results["multihop-1x2"]["reference"] == 1
    )


@pytest.mark.parametrize(
    "load,processes,threads",
    [(0.0, 1, 4), (0.0, 2, 2), (1.0, 2, 1), (1.4, 1, 2), (2.4, 1, 1), (3.6, 1, 1), (50.0, 1, 1)],
)
def test_default_threads_follow_the_idle_cores(monkeypatch, capsys, load, processes, threads):
    import os

    from synthlab.cli.train import _set_threads
    from synthlab.sweeps.gpu_scheduling import default_threads

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    assert default_threads(processes)[0] == threads
    if processes == 1:
        line = f"torch thread{'s' * (threads > 1)} per process: load average {load:.1f} on 4 cores"
        before = torch.get_num_threads()
        try:
            _set_threads(None)  # off a terminal (pytest's capture): the choice is not printed
            assert torch.get_num_threads() == threads
            assert capsys.readouterr().err == ""
            monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
            _set_threads(None)
            assert torch.get_num_threads() == threads
        finally:
            torch.set_num_threads(before)
        err = capsys.readouterr().err
        assert err.count(line) == 1
        assert "warning" not in err


def test_cpu_bf16_autocast_is_opt_in():
    from synthlab.training.run_folders import autocast

    cpu = torch.device("cpu")
    assert not TrainConfig.flat(steps=1).system.cpu_bf16
    with autocast(cpu):
        assert not torch.is_autocast_enabled("cpu")
    with autocast(cpu, cpu_bf16=True):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        out = build_model(CFG)(torch.zeros(2, 24, dtype=torch.long), doc_ids=doc_ids(2))
    assert out.logits.dtype == torch.bfloat16


@pytest.mark.slow
def test_bench_cores_dry_run_times_each_layout_in_child_processes(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_cores

    argv = ["--dry-run", "--shapes", "multihop-1x2", "--layouts", "1x1", "1x2+1x1", "--batch-size", "4"]
    results = bench_cores.main([*argv, "--cache", str(tmp_path)])["multihop-1x2"]
    assert set(results) == {"1x1 eager", "1x2+1x1 eager"} and results["1x1 eager"]["ratio"] == 1
    mixed = results["1x2+1x1 eager"]
    assert mixed["sum"] > mixed["one"] > 0  # the two-thread run's rate, and both runs' summed
    one = results["1x1 eager"]
    assert one["sum"] == one["one"] > 0 and one["tokens"] == pytest.approx(4 * 12 * one["sum"])  # 4 rows of 12 tokens
    assert "multihop-1x2 (batch 4):" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["2", "0x1", "2x", "ax1", "2x-1", "1x2+", "1x2+x1"])
def test_bench_cores_names_a_bad_layout(text):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_cores

    with pytest.raises(SystemExit):
        bench_cores.main(["--layouts", text])
