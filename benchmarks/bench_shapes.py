"""The lab's training step against a minimal reference at the experiments' own shapes, in one run.

Each shape is one grid point of a committed experiment preset: its dataset (generated once into
--cache, with a smaller training set where the row shape does not depend on it), its packed rows
and document masks (`synthlab.training.trainer.prepare_run`'s batcher), its model config and its recipe. The
lab's step is what `synthlab train` runs (`objectives.step_losses` inside `engine.step`: masked
loss, backward, clip, AdamW); the reference is a GPT written the short way with the same
architecture (norm, bias, positions, head, loops as whole-stack passes), the same boolean document
mask handed to SDPA, the same masked cross-entropy, clip and torch's default AdamW. Both train on
the same fixed batch. Within a round the contenders take one step each in turn (the order
rotated from round to round), so a burst of load from other processes lands on all alike (each
step then starts with the caches the other left), and rates are steps per CPU second of the (one)
training thread, so time spent waiting for a busy core is left out; per shape the median of the
per-round ratios lab / reference is printed with its min and max.

Optional contenders: `--impl foreach fused` (train.optim.optimizer_impl), `--bf16` (train.system.cpu_bf16: bf16
autocast on the CPU), `--compile` (train.system.compile; the first compile is timed and excluded).

Measured (`--impl fused`, one thread, 30 rounds, load average 3 on 2 cores beside two training
jobs; median ratio to the reference, the lab's default / fused AdamW): calib1000-small 1.12 /
1.11; calib64-L1 1.00 / 1.02; calib64-L2 1.02 / 1.01; mano-3x1 0.98 / 1.03; mano-1x3 1.00 / 1.03;
reach-4x1 0.97 / 0.97; multihop-1x2 1.02 / 1.03; and `--shapes bench --rounds 15` 1.02.
Later, beside two one-thread training jobs (load 2.2-2.5): calib1000-64-x4 1.03 / 1.03.
Per-round ratios spread from 0.5 to 1.8 under that load, so fused AdamW is within noise of the
default. An earlier run (`--impl foreach fused
--bf16`, 9 rounds, load 8-10) put bf16 autocast at 0.09-0.37 of the reference: 3-11x slower on
this CPU, which has no bf16 units (no avx512_bf16 / amx in /proc/cpuinfo).

    .venv/bin/python benchmarks/bench_shapes.py [--shapes calib64-L1 ...] [--rounds 30]
        [--chunk 0.2] [--impl fused] [--bf16] [--compile] [--threads 1] [--dry-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from synthlab.data.datasets import load_dataset
from synthlab.models import ModelConfig, build_model
from synthlab.sweeps import experiments, lab_runner
from synthlab.training import engine
from synthlab.training.distributed import World
from synthlab.training.objectives import model_forward, step_losses, to_device
from synthlab.training.run_folders import RunConfig, autocast
from synthlab.training.trainer import build_optimizer, lr_schedule, prepare_run


@dataclasses.dataclass(frozen=True)
class Shape:
    experiment: str
    preset: str
    factors: dict  # the grid point's factor values (a subset), seed 0
    data: dict = dataclasses.field(default_factory=dict)  # overrides that leave the row shape as it is


BENCH_MODEL = {"d_model": 256, "n_layers": 4, "n_heads": 4, "max_seq_len": 256}
SHAPES = {
    "calib1000-small": Shape("capacity", "calib1000-small", {}),
    "calib64-L1": Shape("capacity", "calib64", {"size": "d64-L1 N3447"}),
    "calib64-L2": Shape("capacity", "calib64", {"size": "d64-L2 N5575"}),
    "calib1000-64-x4": Shape("capacity", "calib1000-64", {"model.loops": 4}),  # C1's looped arm
    "mano-3x1": Shape("mano", "cpu", {"data.L": 3, "arch": "3x1"}, {"n_train": 2000}),
    "mano-1x3": Shape("mano", "cpu", {"data.L": 3, "arch": "1x3"}, {"n_train": 2000}),
    "reach-4x1": Shape("reach", "cpu", {"arch": "4x1"}, {"n_train": 2000, "lookup_queries": 1000}),
    "multihop-1x2": Shape("multihop", "cpu", {"data.train_fraction": 0.5, "arch": "1x2"}),
    "bench": Shape("capacity", "calib64", {"size": "d64-L1 N3447"}),  # bench_model's model on bioS rows
}


# --- the reference ---------------------------------------------------------------------------------
class RefBlock(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        d, self.n_heads = c.d_model, c.n_heads
        norm = (lambda: nn.RMSNorm(d, eps=1e-5)) if c.norm_type == "rmsnorm" else (lambda: nn.LayerNorm(d, bias=c.bias))
        self.ln1, self.ln2 = norm(), norm()
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=c.bias), nn.Linear(d, d, bias=c.bias)
        self.fc, self.out = nn.Linear(d, c.ff_dim, bias=c.bias), nn.Linear(c.ff_dim, d, bias=c.bias)

    def forward(self, x, rope, mask):
        B, S, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            half = q.shape[-1] // 2
            q, k = (t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin for t in (q, k))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        x = x + self.proj(y.transpose(1, 2).reshape(B, S, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class RefGPT(nn.Module):
    """Whole-stack loops (Ouro's topology, the input state, no injection), read out once at the end."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        if c.mlp != "gelu" or c.topology != "ouro" or c.injection != "none":
            raise SystemExit(f"the reference has no {c.mlp} / {c.topology} / {c.injection} model")
        self.loops, self.wte = c.loops, nn.Embedding(c.vocab_size, c.d_model)
        self.blocks = nn.ModuleList(RefBlock(c) for _ in range(c.n_layers))
        self.ln_f = nn.RMSNorm(c.d_model, eps=1e-5) if c.norm_type == "rmsnorm" else nn.LayerNorm(c.d_model)
        self.wpe = nn.Embedding(c.max_seq_len, c.d_model) if c.positions == "learned" else None
        self.head = None if c.tie_head else nn.Linear(c.d_model, c.vocab_size, bias=False)
        dh = c.d_model // c.n_heads
        freqs = torch.outer(torch.arange(c.max_seq_len).float(), c.rope_base ** (-torch.arange(0, dh, 2) / dh))
        freqs = torch.cat([freqs, freqs], -1)
        self.rope = c.positions == "rope"
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, idx, doc_ids):
        S = idx.shape[1]
        mask = None
        if doc_ids is not None:
            causal = torch.ones(S, S, dtype=torch.bool).tril()
            mask = (causal & (doc_ids[:, :, None] == doc_ids[:, None, :]))[:, None]
        x = self.wte(idx) + (self.wpe.weight[:S] if self.wpe is not None else 0)
        rope = (self.cos[:S], self.sin[:S]) if self.rope else None
        for _ in range(self.loops):
            for block in self.blocks:
                x = block(x, rope, mask)
        return self.ln_f(x) @ (self.wte.weight if self.head is None else self.head.weight).T


def reference_step(c: ModelConfig, cfg, batch) -> Callable[[], None]:
    model = RefGPT(c)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps
    )
    inputs, targets, mask, doc_ids = batch
    labels = targets.masked_fill(~mask, -100).view(-1)

    def step():
        logits = model(inputs, doc_ids)
        F.cross_entropy(logits.view(-1, logits.shape[-1]), labels).backward()
        if cfg.optim.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def lab_step(run: RunConfig, batch) -> Callable[[], None]:
    """One `synthlab train` step (no logging) on the fixed batch."""
    model = build_model(run.model, seed=run.train.seed).train()
    state = engine.TrainState(model, build_optimizer(model, run.train), lr_schedule(run.train, 10**6))
    forward, generator = model_forward(model, run.train.system.compile), torch.Generator().manual_seed(1)

    def micro(_):
        with autocast(torch.device("cpu"), run.train.system.cpu_bf16):
            objective, _ = step_losses(forward, *batch, run.train, generator, False)
        return objective, (objective.detach(),)

    return lambda: engine.step(state, 1, micro, world=World(), grad_clip=run.train.optim.grad_clip, check=False)


# --- one shape -------------------------------------------------------------------------------------
def resolve(name: str, cache: Path, batch_size: int | None = None) -> tuple[RunConfig, tuple[torch.Tensor, ...], dict]:
    """The shape's run config and one batch of its packed rows (batch_size rows, if given, instead of the preset's)."""
    shape = SHAPES[name]
    points = experiments.load(shape.experiment).points(shape.preset)
    wanted = {**shape.factors}
    matches = [p for p in points if all(p.factors.get(k, v) == v for k, v in wanted.items())]
    config = matches[0].config
    config["data"] = {**config.get("data", {}), **shape.data}
    point = lab_runner.parse(config)
    data_dir = lab_runner.dataset(point, cache)
    model, train = point.model, dataclasses.replace(point.train, data=str(data_dir))
    if name == "bench":  # bench_model.py's model, rows of 256 tokens, batch 16
        model = dataclasses.replace(model, **BENCH_MODEL)
        train = train.replaced(seq_len=256, batch_size=16)
    if batch_size is not None:
        train = train.replaced(batch_size=batch_size)
    run = RunConfig(model, train)
    derived, batcher = prepare_run(run, load_dataset(data_dir))
    batch = to_device(batcher.next_batch(), torch.device("cpu"))
    return run, batch, derived


def contenders(run: RunConfig, batch, impls: list[str], bf16: bool, compile: bool) -> dict[str, Callable]:
    train = run.train
    found = {"reference": reference_step(run.model, train, batch), "lab": lab_step(run, batch)}
    for impl in impls:
        found[f"lab {impl}"] = lab_step(dataclasses.replace(run, train=train.replaced(optimizer_impl=impl)), batch)
    if bf16:
        found["lab bf16"] = lab_step(dataclasses.replace(run, train=train.replaced(cpu_bf16=True)), batch)
    if compile:
        found["lab compile"] = lab_step(dataclasses.replace(run, train=train.replaced(compile=True)), batch)
    return found


def measure(steps: dict[str, Callable], rounds: int, chunk: float) -> dict[str, list[float]]:
    """Steps per CPU second of every contender per round, a step of each in turn, the order
    rotated from round to round. CPU time of this (one) thread, not wall time: on a shared machine the time spent
    waiting for a core is the other processes', and it swamps the differences measured here."""
    repeats = {}
    for name, step in steps.items():  # warm-up (allocator, kernels, compiles) and the chunk size
        start = time.perf_counter()
        step()
        first = time.perf_counter() - start
        start = time.perf_counter()
        step()
        repeats[name] = max(1, round(chunk / max(time.perf_counter() - start, 1e-6)))
        if first > 2.0:  # a compile
            print(f"  {name}: first step {first:.1f} s (excluded)")
    n = max(repeats.values()) if repeats else 1
    rates: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        spent = dict.fromkeys(names, 0.0)
        for _ in range(n):  # step by step in turn, so a burst of other work lands on every contender
            for name in order:
                start = time.thread_time()
                steps[name]()
                spent[name] += time.thread_time() - start
        for name in names:
            rates[name].append(n / spent[name])
    return rates


def report(name: str, run: RunConfig, derived: dict, batch, rates: dict[str, list[float]]) -> dict[str, float]:
    c, (inputs, *_rest, doc_ids) = run.model, batch
    docs = "" if doc_ids is None else f", {float((doc_ids.max(1).values + 1).float().mean()):.1f} docs/row"
    print(
        f"{name}: d {c.d_model} x {c.n_layers} layers x {c.loops} loops, {c.n_heads} heads, vocab {c.vocab_size}, "
        f"rows {tuple(inputs.shape)}{docs}"
    )
    ref = rates["reference"]
    medians = {}
    for key, values in rates.items():
        ratios = [v / r for v, r in zip(values, ref)]
        medians[key] = statistics.median(ratios)
        print(
            f"  {key:12s} {statistics.median(values):8.1f} steps/CPU-s  ratio / reference {medians[key]:.3f} "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
        )
    return medians


def add_cache_option(parser: argparse.ArgumentParser) -> None:
    """--cache: where the shapes' datasets are generated once, shared by the benchmarks built on these shapes."""
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "synthlab-bench-data",
        help="dataset cache (default: $TMPDIR/synthlab-bench-data)",
    )


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=[s for s in SHAPES if s != "bench"],
        choices=list(SHAPES),
        help="(default: all but bench, whose 3 s steps at one thread take a few minutes alone)",
    )
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds per shape (default: 30)")
    parser.add_argument(
        "--chunk", type=float, default=0.2, help="seconds of steps per contender per round (default: 0.2)"
    )
    parser.add_argument(
        "--impl", nargs="*", default=[], choices=["foreach", "fused"], help="also time these train.optim.optimizer_impl"
    )
    parser.add_argument("--bf16", action="store_true", help="also time bf16 autocast on the CPU")
    parser.add_argument("--compile", action="store_true", help="also time train.system.compile (compile time excluded)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    add_cache_option(parser)
    parser.add_argument(
        "--dry-run", action="store_true", help="one round of one step per contender (a check, not a timing)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds, chunk = (1, 0.0) if args.dry_run else (args.rounds, args.chunk)
    print(f"threads {args.threads}, {rounds} rounds, ~{chunk} s per contender per round, fp32 unless named")
    results = {}
    for name in args.shapes:
        run, batch, derived = resolve(name, args.cache)
        rates = measure(contenders(run, batch, args.impl, args.bf16, args.compile), rounds, chunk)
        results[name] = report(name, run, derived, batch, rates)
    return results


if __name__ == "__main__":
    main()
