"""The GPU cost model (synthlab.sweeps.cost, synthlab.models.counting): activation bytes re-measured on
the CPU under CUDA autocast's op policy, and every gpu preset within one H200 day and memory."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import pytest
import torch
from test_autocast_policy import cuda_autocast_policy
from test_checkpointing import saved_bytes
from torch.nn.attention import SDPBackend, sdpa_kernel

from synthlab.models import ModelConfig, activation_bytes_per_token, build_model, flops_per_token
from synthlab.sweeps import cost, experiments
from synthlab.sweeps import lab_runner as point_runner
from synthlab.sweeps import plan as sweep_plan
from synthlab.training.configs import parse_point

B, S = 8, 128
MEASURED = {
    "plain": dict(),
    "looped 1x3": dict(loops=3),
    "2x2 all steps": dict(n_layers=2, loops=2, all_steps=True),
    "swiglu sandwich-norm": dict(mlp="swiglu", norm="sandwich", loops=2),
    "layernorm learned positions": dict(norm_type="layernorm", positions="learned", loops=2),
    "packed rows": dict(loops=3, masked=True),
    "packed rows, dense attention": dict(loops=3, masked=True, dense=True),
    "8 heads dense": dict(n_heads=8, loops=2, masked=True, dense=True),
    "sandwich concat": dict(topology="sandwich", n_layers=3, n_prelude=1, n_coda=1, loops=3, injection="concat"),
    "sandwich diagonal gate": dict(
        topology="sandwich",
        n_layers=3,
        n_prelude=1,
        n_coda=1,
        loops=2,
        injection="diagonal",
        recurrence_gate=True,
        all_steps=True,
    ),
    "checkpointed 1x4": dict(loops=4, checkpoint=True),
    "checkpointed 2x3 all steps": dict(n_layers=2, loops=3, checkpoint=True, all_steps=True),
}


@pytest.mark.parametrize("name", list(MEASURED))
def test_activation_model_matches_the_bytes_autograd_saves_under_cuda_autocast(name):
    options = dict(MEASURED[name])
    run = {k: options.pop(k, False) for k in ("all_steps", "masked", "dense", "checkpoint")}
    config = ModelConfig(**{"vocab_size": 50, "d_model": 64, "n_heads": 4, "n_layers": 1, "max_seq_len": S, **options})
    torch.set_num_threads(1)
    idx = torch.randint(0, 50, (B, S), generator=torch.Generator().manual_seed(0))
    doc_ids = torch.tensor([[0] * (S // 2) + [1] * (S // 2)] * B) if run["masked"] else None
    kernel = sdpa_kernel(SDPBackend.MATH) if run["dense"] else contextlib.nullcontext()
    with cuda_autocast_policy(), kernel:
        measured = saved_bytes(
            build_model(config).train(), idx, doc_ids=doc_ids, all_steps=run["all_steps"], checkpoint=run["checkpoint"]
        ) / (B * S)
    predicted, _ = activation_bytes_per_token(config, S, **run)
    # the model leaves out the bf16 copies of the weights (outside checkpointed steps), 1-3% here
    assert measured == pytest.approx(predicted, rel=0.05)


EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


@pytest.mark.parametrize("name", sorted(p.stem for p in EXPERIMENTS.glob("*.toml")))
def test_every_gpu_preset_fits_one_h200_day_a_seed_and_its_memory(name, tmp_path):
    """A seed's points within one H200 day: the seeds (at least 3, from the power statement) are
    independent runs that a node's GPUs take in parallel (`synthlab sweep --jobs`, one per GPU)."""
    experiment = experiments.load(EXPERIMENTS / f"{name}.toml")
    if "gpu" not in experiment.presets:
        pytest.skip("no gpu preset")
    rows = sweep_plan.plan(experiment, "gpu", tmp_path, runner=point_runner, gpu=True)
    seeds = experiment.presets["gpu"].get("seeds", 1)
    hours = sum(row["cost_s"] for row in rows) / 3600 / seeds  # points sharing a trained model count once
    assert hours <= 24, f"{name}: {hours:.1f} h a seed"
    peak = max(row["peak_gib"] for row in rows)
    assert peak <= cost.GPU_MEMORY_GIB, f"{name}: {peak:.1f} GiB"


def test_gpu_cost_counts_tokens_flops_and_hours_of_a_point():
    point = parse_point(
        {
            "task": "mano",
            "data": {"L": 10, "mod": 23},
            "model": {"d_model": 256, "n_heads": 4, "n_layers": 2, "loops": 3},
            "train": {"steps": 1000, "batch_size": 64, "compile": True},
        }
    )
    steps, seq = cost.positions(point)
    got = cost.gpu_cost(point)
    assert got["tokens"] == 1000 * 64 * seq
    flops = 3 * flops_per_token(point.model, seq, all_steps=False) * got["tokens"]
    assert got["pflop"] == pytest.approx(flops / 1e15, abs=0.05)
    assert got["gpu_h"] == pytest.approx(flops / (0.35 * cost.GPU_PEAK_FLOPS) / 3600, abs=0.005)
    checkpointed = cost.gpu_cost(dataclasses.replace(point, train=point.train.replaced(activation_checkpointing=True)))
    assert checkpointed["gpu_h"] == pytest.approx(got["gpu_h"] * 4 / 3, abs=0.005)  # one more forward
    plain, ckpt = (float(x) for x in got["act_gib"].split("/"))
    assert checkpointed["peak_gib"] == pytest.approx(got["peak_gib"] - plain + ckpt, abs=0.11)


def test_ouroboros_cost_gives_back_the_measured_h200_steps():
    from synthlab.ouroboros.stage import parse_section

    for depth, (seconds, peak) in cost.OUROBOROS_3B_MEASURED.items():
        options = parse_section(
            {"steps": 1000, "batch_size": 4, "seq_len": 2048, "grad_accum": 8, "depths": [depth], "max_steps": 16}
        )
        tokens, hours, peak_gib = cost.ouroboros_cost(options)
        assert tokens == 1000 * 8 * 4 * 2048
        assert hours == pytest.approx(8000 * seconds / 3600, rel=0.02)  # a line through three measurements
        assert peak_gib == pytest.approx(peak, rel=0.02)
