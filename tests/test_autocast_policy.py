"""The GPU path on the CPU: CUDA autocast's op policy enforced on CPU tensors, and the defects a
review of the CUDA path found (device mixes, host copies, banned ops), each pinned by a test.

`cuda_autocast_policy()` runs CPU bf16 autocast with torch's AutocastCUDA dispatch key also
active in this thread (included, and no longer excluded), so CUDA autocast's kernels run on CPU
tensors too: an op CUDA autocast rejects (F.binary_cross_entropy) raises here as it would on a
GPU. (CUDA's casts apply to CUDA tensors only; the casts here are CPU autocast's, which put the
same matmuls in bf16.) Every model option, training objective, evaluation, early exit, generation
and the OUROBOROS variants run under it.
"""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
import torch.nn.functional as F

from synthlab.cli.train import resolve_run_config
from synthlab.evaluation import evaluate as evaluate_module
from synthlab.evaluation import scoring as scoring_module
from synthlab.evaluation.evaluate import evaluate_run
from synthlab.models import ModelConfig, build_model
from synthlab.models.losses import continue_logit, ouro_stage2_loss, token_losses
from synthlab.models.recurrence import initial_state
from synthlab.sweeps.executor import Unit
from synthlab.sweeps.gpu_scheduling import ray_resources
from synthlab.training import trainer as train_module
from synthlab.training.run_folders import float32_matmul
from synthlab.training.trainer import train
from synthlab_generators import TASKS, write_dataset
from tests.tiny_qwen2 import tiny_qwen2


@contextlib.contextmanager
def cuda_autocast_policy():
    """CPU bf16 autocast with CUDA autocast's kernels (banned ops) also dispatched to."""
    key = torch._C.DispatchKey.AutocastCUDA
    included = torch._C._dispatch_tls_is_dispatch_key_included(key)
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded(key)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch._C._dispatch_tls_set_dispatch_key_included(key, True)
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
        try:
            yield
        finally:
            torch._C._dispatch_tls_set_dispatch_key_included(key, included)
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_policy_rejects_what_cuda_autocast_rejects_and_casts_matmuls():
    p, w = torch.rand(4, requires_grad=True), torch.rand(4)
    with cuda_autocast_policy():
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, w)
        assert (torch.randn(3, 3) @ torch.randn(3, 3)).dtype == torch.bfloat16
        assert F.binary_cross_entropy_with_logits(p, w).dtype == torch.float32
    F.binary_cross_entropy(p, w)  # outside, allowed again: the thread's dispatch state is restored


# --- the model: every option, forward and backward under the policy ---------------------------
V, S = 40, 10
BASE = dict(vocab_size=V, d_model=32, n_heads=4, n_layers=2, max_seq_len=32)
OPTIONS = {
    "plain": dict(),
    "ouro_gate": dict(loops=3, exit_gate=True),
    "swiglu_sandwichnorm_layernorm_bias": dict(
        loops=2, mlp="swiglu", norm="sandwich", norm_type="layernorm", bias=True
    ),
    "learned_positions_untied": dict(positions="learned", tie_head=False, loops=2),
    "no_positions_dropout": dict(positions="none", dropout=0.1),
    "sandwich_add_zero": dict(
        topology="sandwich", n_layers=3, n_prelude=1, n_coda=1, loops=3, injection="add", state_init="zero"
    ),
    "sandwich_concat_normal": dict(
        topology="sandwich", n_layers=3, n_prelude=1, n_coda=1, loops=2, injection="concat", state_init="normal"
    ),
    "sandwich_diagonal_sampled": dict(
        topology="sandwich",
        n_layers=3,
        n_prelude=1,
        n_coda=1,
        loops=2,
        injection="diagonal",
        step_sampling=True,
        backprop_last_k=1,
    ),
    "controller_gate_norm": dict(
        loops=3, controller="controller", recurrence_gate=True, step_norm=True, exit_gate=True
    ),
    "static_lora_fixed": dict(
        loops=2, controller="static_lora", lora_bases="fixed", mlp="swiglu", lora_targets=("q", "v", "gate", "down")
    ),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_model_option_runs_forward_backward_and_inference_under_the_policy(name):
    model = build_model(ModelConfig(**{**BASE, **OPTIONS[name]}), seed=0).train()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, V, (3, S), generator=g)
    with cuda_autocast_policy():
        out = model(idx, generator=g)
        losses = token_losses(out.step_logits, idx.roll(-1, 1))
        loss = losses.mean()
        if out.exit_lambdas is not None:
            loss = loss + ouro_stage2_loss(losses, out.exit_lambdas.float())
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(gr).all() for gr in grads)
    model.eval()
    with torch.no_grad(), cuda_autocast_policy():
        rule = "q:0.5" if model.exit_gate is not None else "kl:0.01"
        assert torch.isfinite(model.forward_exit(idx, rule).logits.float()).all()
        assert model.generate(idx[:, :4], 3, kv_strategy="mean").tokens.shape == (3, 7)


def test_the_residual_stream_stays_float32_under_autocast_whatever_the_injection():
    """A bf16 linear output must not become the core's residual stream (the concat injection's did:
    a bf16 stream through every loop, and norms fed bf16 inputs with float32 weights)."""
    for injection in ("none", "add", "concat", "diagonal"):
        model = build_model(
            ModelConfig(**{**BASE, **OPTIONS["sandwich_concat_normal"], "injection": injection}), seed=0
        )
        seen = []
        model.core[0].register_forward_pre_hook(lambda _, args: seen.append(args[0].dtype))
        with torch.no_grad(), cuda_autocast_policy():
            model(torch.zeros((1, S), dtype=torch.long))
        assert seen and set(seen) == {torch.float32}, (injection, seen)


# --- the trainer: every objective, evaluation, early exit and generation ------------------------
@pytest.fixture(scope="module")
def mano_data(tmp_path_factory):
    spec = TASKS["mano"]
    return write_dataset(
        spec, spec.params_cls(L=2, n_train=200, n_test=30, mod=5), 0, tmp_path_factory.mktemp("d") / "mano"
    )


def _run(data, loss, **train):
    model = {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_seq_len": 32, "loops": 2, "exit_gate": True}
    train = {"steps": 4, "batch_size": 8, "warmup_steps": 1, "log_every": 2, "loss": loss, "device": "cpu", **train}
    return resolve_run_config({}, model, {"task": "mano", "data": str(data), **train})


def test_every_objective_evaluation_exit_and_generation_under_the_policy(tmp_path, mano_data, monkeypatch):
    monkeypatch.setattr(train_module, "autocast", lambda device, *_: cuda_autocast_policy())
    monkeypatch.setattr(evaluate_module, "autocast", lambda device, *_: cuda_autocast_policy())
    monkeypatch.setattr(scoring_module, "autocast", lambda device, *_: cuda_autocast_policy())
    for loss in ("last", "mean", "ouro"):
        assert math.isfinite(train(tmp_path / loss, _run(mano_data, loss), progress=False).final_loss), loss
    checkpointed = _run(mano_data, "mean", activation_checkpointing=True)  # steps recomputed under autocast
    assert math.isfinite(train(tmp_path / "checkpointed", checkpointed, progress=False).final_loss)
    stage2 = train(
        tmp_path / "stage2", _run(mano_data, "ouro_stage2", init_from=str(tmp_path / "ouro")), progress=False
    )
    assert math.isfinite(stage2.final_loss)
    for rule, kv in (("q:0.8", "full"), ("diff:0.01", "mean"), ("kl:0.001", "first")):
        result = evaluate_run(tmp_path / "stage2", exit_rule=rule, kv=kv, device="cpu")
        assert 0 <= result["exit_accuracy"] <= 1 and 0 <= result["kv_accuracy"] <= 1
        assert all(math.isfinite(x) for x in result["answer_loss_per_step"])


# --- OUROBOROS: a bf16 base without autocast (the GPU setting) and a float32 one under the policy
transformers = pytest.importorskip("transformers")


def _tiny_qwen2(dtype):
    return tiny_qwen2().to(dtype).eval().requires_grad_(False)


@pytest.mark.parametrize("dtype,policy", [(torch.bfloat16, False), (torch.float32, True)])
def test_every_ouroboros_variant_trains_and_evaluates(dtype, policy):
    from synthlab.ouroboros import OuroborosConfig, OuroborosLM, lm_loss
    from synthlab.ouroboros.train import OuroborosTrainConfig, mean_loss
    from synthlab.ouroboros.train import train as hf_train

    base = _tiny_qwen2(dtype)
    batch = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    context = cuda_autocast_policy if policy else contextlib.nullcontext
    for variant in ("controller", "static", "nogate", "truncated", "base"):
        model = OuroborosLM(base, OuroborosConfig(variant=variant, max_steps=4), torch.Generator().manual_seed(0))
        with context():
            if variant in ("truncated", "base"):
                assert math.isfinite(mean_loss(model, batch, 1, 2))
                continue
            loss = lm_loss(model(batch, 3), batch)
            loss.backward()
            assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
            log = hf_train(
                model,
                batch.repeat(4, 1),
                OuroborosTrainConfig(steps=2, seq_len=12, micro_batch_size=2, grad_accum=2, depths=(1, 2)),
                progress=False,
            )
            assert all(isinstance(row["loss"], float) and math.isfinite(row["loss"]) for row in log)
            assert math.isfinite(mean_loss(model, batch, 2, 2))


# --- the defects, one test each -----------------------------------------------------------------
def test_stage2_logits_form_equals_binary_cross_entropy_in_float32():
    # where 1 - lambda is exact in float32 (and at the clamped ends 0 and 1): the same values and
    # gradients as F.binary_cross_entropy on the continue probability
    lam = torch.tensor([0.0, 0.01, 0.2, 0.5, 0.75, 0.9, 0.99, 1.0], dtype=torch.float32)
    w = torch.linspace(0, 1, lam.numel())
    ours, ref = lam.clone().requires_grad_(), lam.clone().requires_grad_()
    got = F.binary_cross_entropy_with_logits(continue_logit(ours), w, reduction="none")
    want = F.binary_cross_entropy(1 - ref, w, reduction="none")
    torch.testing.assert_close(got[1:-1], want[1:-1], rtol=1e-5, atol=1e-6)
    got[1:-1].sum().backward()
    want[1:-1].sum().backward()
    torch.testing.assert_close(ours.grad[1:-1], ref.grad[1:-1], rtol=1e-4, atol=1e-6)
    # a saturated gate (lambda exactly 0 or 1): a finite loss and no gradient, never NaN
    ours.grad = None
    saturated = F.binary_cross_entropy_with_logits(continue_logit(ours), w, reduction="none")
    saturated.sum().backward()
    assert torch.isfinite(saturated).all() and ours.grad[0] == 0 and ours.grad[-1] == 0
    # near 0 (where 1 - lambda rounds in float32) the logits form keeps the exact value
    tiny = torch.tensor([1e-30, 1e-6], dtype=torch.float32)
    exact = -(0.5 * torch.log1p(-tiny.double()) + 0.5 * torch.log(tiny.double()))
    got = F.binary_cross_entropy_with_logits(continue_logit(tiny), torch.full((2,), 0.5), reduction="none")
    torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=0)
    # the whole stage II loss, random steps / positions, still matches the probability form
    g = torch.Generator().manual_seed(0)
    losses, lambdas = torch.rand(4, 2, 5, generator=g) * 3, torch.rand(4, 2, 5, generator=g)
    improvement = (losses[:-1] - losses[1:]).clamp_min(0.0)
    target = torch.sigmoid(50.0 * (improvement - 0.005))
    expected = F.binary_cross_entropy(1 - lambdas[1:], target)
    torch.testing.assert_close(ouro_stage2_loss(losses, lambdas), expected, rtol=1e-5, atol=1e-6)


def test_lora_bases_stay_on_the_residual_device_in_float32():
    from synthlab.ouroboros.lora import lora_bases

    residual = torch.randn(12, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a, b = lora_bases(residual, 4)
    assert a.device == residual.device and b.device == residual.device
    assert a.dtype == b.dtype == torch.float32 and a.shape == (4, 8) and b.shape == (12, 4)


def test_normal_initial_state_is_drawn_on_the_state_device_from_the_generator():
    e = torch.zeros(2, 3, 4, dtype=torch.bfloat16)
    h = initial_state("normal", e, 0.5, torch.Generator().manual_seed(3))
    want = torch.randn(e.shape, generator=torch.Generator().manual_seed(3)) * 0.5
    assert h.dtype == torch.bfloat16 and h.device == e.device
    torch.testing.assert_close(h, want.to(torch.bfloat16))  # on a generator of e's device: a direct draw


def test_tf32_is_on_for_cuda_float32_matmuls_by_default_and_can_be_turned_off():
    from synthlab.training.configs import TrainConfig

    assert TrainConfig.flat(steps=1).system.tf32 and not TrainConfig.flat(steps=1, tf32=False).system.tf32
    before = torch.get_float32_matmul_precision()
    with float32_matmul(torch.device("cuda"), True):
        assert torch.get_float32_matmul_precision() == "high"
    with float32_matmul(torch.device("cuda"), False):
        assert torch.get_float32_matmul_precision() == "highest"
    with float32_matmul(torch.device("cpu"), True):
        assert torch.get_float32_matmul_precision() == before  # the CPU is left alone
    assert torch.get_float32_matmul_precision() == before


def test_ray_asks_for_a_gpu_per_point_when_the_cluster_has_one():
    unit = Unit("runner", "run", "cache", [], threads=2)
    assert ray_resources(unit, 0) == {"num_cpus": 2, "num_gpus": 0}
    assert ray_resources(unit, 8.0) == {"num_cpus": 2, "num_gpus": 1}


def test_unmarked_tests_see_no_gpu():
    import os

    assert not torch.cuda.is_available() and os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_stage2_run_config_records_tf32(tmp_path, mano_data):
    run = _run(mano_data, "last", tf32=False)
    train(tmp_path / "r", run, progress=False)
    assert json.loads((tmp_path / "r" / "config.json").read_text())["train"]["system"]["tf32"] is False
