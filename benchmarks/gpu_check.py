"""The parts of the GPU check (benchmarks/gpu_check.sh runs each in its own process, under its own
timeout, and then `report`). Each part writes OUT/parts/<part>.json as it goes, so a part cut
short by its timeout still leaves what it measured.

    throughput  bf16 training step of the d = 1024 Mano model (experiments/mano.toml gpu preset:
                the 2 x 6 looped point at the largest L, its batch and row length) eager and with
                torch.compile, against a minimal reference GPT of the same shape (12 layers, the
                same FLOPs) in the same run: tokens/s and MFU (3 x forward FLOPs from
                synthlab.models.flops_per_token, over the device's dense bf16 peak); peak memory of
                each, the Mano model's against the GPU cost model's (synthlab.sweeps.cost.peak_gib).
    learn       a 200-step Mano run through the real trainer (`synthlab.training.trainer.train`, device auto:
                CUDA + bf16 autocast; d = 512, 2 layers x 2 loops) on one-operator expressions mod
                7: the loss falls, and the accuracy on one-operator prompts (training ones, and
                the held-out test ones).
    ouroboros   the OUROBOROS controller system on random weights of the Qwen2.5-3B config:
                SVD bases on the GPU, trainable parameters, forward/backward step time and peak
                memory per depth, a no-grad evaluation.
    report      OUT/gpu_check.json (every part) and OUT/gpu_check.md (a table per part).

--dry-run: the same code on the CPU at tiny sizes (torch.compile with the aot_eager backend).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["throughput", "learn", "ouroboros", "report"])
    parser.add_argument("--out", type=Path, required=True, help="folder of the results")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per throughput case (default 20; dry 1)")
    return parser.parse_args()


class Part:
    """The results of one part, rewritten to OUT/parts/<name>.json after every record."""

    def __init__(self, out: Path, name: str, dry: bool) -> None:
        self.path = out / "parts" / f"{name}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data = {"part": name, "dry_run": dry, "done": False, **environment(dry)}
        self.save()

    def record(self, key: str, value) -> None:
        self.data[key] = value
        self.save()
        print(f"[{self.data['part']}] {key}: {json.dumps(value)}", flush=True)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)


def environment(dry: bool) -> dict:
    cuda = torch.cuda.is_available() and not dry
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    return {"device": name, "torch": torch.__version__, "peak_bf16_flops": peak}


def device_of(dry: bool) -> torch.device:
    if dry:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --dry-run on the CPU)")
    return torch.device("cuda")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


# --- throughput ------------------------------------------------------------------------------------
class RefGPT(nn.Module):
    """A minimal GPT (nanoGPT's shape with the Mano model's choices: RMSNorm, RoPE, GELU MLP 4d,
    no biases, tied head): the speed to beat for a model of the same size."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "n1": nn.RMSNorm(d),
                    "qkv": nn.Linear(d, 3 * d, bias=False),
                    "o": nn.Linear(d, d, bias=False),
                    "n2": nn.RMSNorm(d),
                    "up": nn.Linear(d, 4 * d, bias=False),
                    "down": nn.Linear(4 * d, d, bias=False),
                }
            )
            for _ in range(layers)
        )
        self.norm = nn.RMSNorm(d)
        half = d // heads // 2
        freqs = torch.arange(seq)[:, None] * 10000.0 ** (-torch.arange(half) / half)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, -1)
        cos, sin = self.cos[: x.shape[-2]].to(x.dtype), self.sin[: x.shape[-2]].to(x.dtype)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, S = idx.shape
        x = self.embed(idx)
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["n1"](x)).view(B, S, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
            x = x + blk["o"](y.transpose(1, 2).reshape(B, S, -1))
            x = x + blk["down"](F.gelu(blk["up"](blk["n2"](x))))
        return F.linear(self.norm(x), self.embed.weight)


def mano_gpu_shape(dry: bool):
    """(ModelConfig of the gpu preset's most looped point at its largest L, TrainConfig, row length);
    dry: 1 x 2 layers of d = 32, 2 rows of 16."""
    from synthlab.sweeps import experiments
    from synthlab.sweeps.lab_runner import parse

    points = [parse(p.config) for p in experiments.load("mano").points("gpu")]
    # the most looped point (2 x 6 today), at its largest L
    point = max(points, key=lambda p: (p.model.loops, p.model.n_layers * p.model.loops, p.data.L))
    model, train = point.model, point.train
    seq = point.spec.shape(point.data).row_len
    if dry:
        model = dataclasses.replace(model, d_model=32, n_heads=2, n_layers=1, loops=2)
        train = train.replaced(batch_size=2)
        seq = 16
    return model, train, seq


def time_steps(step, device: torch.device, warmup: int, steps: int) -> float:
    """Seconds per step after `warmup` steps (the first ones compile)."""
    for _ in range(warmup):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - start) / steps


def throughput(args, part: Part) -> None:
    from synthlab.models import build_model, count_params, flops_per_token
    from synthlab.models.losses import token_losses
    from synthlab.sweeps.cost import peak_gib
    from synthlab.training.trainer import build_optimizer

    device = device_of(args.dry_run)
    torch.set_float32_matmul_precision("high")  # what training does on CUDA (TrainConfig.tf32)
    cfg, train_cfg, seq = mano_gpu_shape(args.dry_run)
    batch, steps = train_cfg.batch.batch_size, args.steps or (1 if args.dry_run else 20)
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
    targets = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
    ref_cfg = dataclasses.replace(cfg, n_layers=cfg.n_layers * cfg.loops, loops=1)
    flops = 3 * flops_per_token(cfg, seq, all_steps=False) * batch * seq  # == the reference's
    part.record(
        "shape",
        {
            "d_model": cfg.d_model,
            "n_heads": cfg.n_heads,
            "n_layers": cfg.n_layers,
            "loops": cfg.loops,
            "vocab": cfg.vocab_size,
            "batch": batch,
            "seq": seq,
            "tokens_per_step": batch * seq,
            "train_flops_per_step": flops,
            "reference_flops_per_step": 3 * flops_per_token(ref_cfg, seq) * batch * seq,
            # the cost model's peak (synthlab.sweeps.cost), to hold against mano_eager's measured peak_gib
            "predicted_peak_gib": round(peak_gib(cfg, seq, batch * seq, all_steps=False), 3),
        },
    )
    backend = "aot_eager" if args.dry_run else "inductor"
    for name in ("mano_eager", "reference_eager", "mano_compiled", "reference_compiled"):
        torch.manual_seed(0)
        if name.startswith("mano"):
            model = build_model(cfg, seed=0).to(device).train()
            optimizer = build_optimizer(model, train_cfg)

            def forward(x, model=model):  # as synthlab.training.trainer: only the last step read out
                return model(x, all_steps=False).step_logits
        else:
            model = RefGPT(cfg.vocab_size, cfg.d_model, cfg.n_heads, ref_cfg.n_layers, seq).to(device).train()
            optimizer = build_optimizer(model, train_cfg)  # the same AdamW for both

            def forward(x, model=model):
                return model(x)[None]

        compiled = name.endswith("compiled")
        fn = torch.compile(forward, backend=backend) if compiled else forward

        def step(fn=fn, model=model, optimizer=optimizer):
            with autocast(device):
                loss = token_losses(fn(inputs), targets).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        step()  # the first step (compiles)
        sync(device)
        first = time.perf_counter() - start
        seconds = time_steps(step, device, 1 if args.dry_run else 3, steps)
        peak = part.data["peak_bf16_flops"]
        part.record(
            name,
            {
                "params": count_params(model)
                if name.startswith("mano")
                else sum(p.numel() for p in model.parameters()),
                "first_step_s": round(first, 2),
                "step_ms": round(seconds * 1e3, 3),
                "tokens_per_s": round(batch * seq / seconds),
                "flops_per_s": flops / seconds,
                "mfu": None if peak is None else round(flops / seconds / peak, 4),
                "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
                if device.type == "cuda"
                else None,
            },
        )
        del model, optimizer, fn
        if device.type == "cuda":
            torch.cuda.empty_cache()
    d = part.data
    part.record(
        "ratios",
        {
            "mano_vs_reference_eager": d["reference_eager"]["step_ms"] / d["mano_eager"]["step_ms"],
            "mano_vs_reference_compiled": d["reference_compiled"]["step_ms"] / d["mano_compiled"]["step_ms"],
            "compile_speedup_mano": d["mano_eager"]["step_ms"] / d["mano_compiled"]["step_ms"],
            "compile_speedup_reference": d["reference_eager"]["step_ms"] / d["reference_compiled"]["step_ms"],
        },
    )


# --- learn ---------------------------------------------------------------------------------------
def learn(args, part: Part) -> None:
    from synthlab.cli.train import resolve_run_config
    from synthlab.data.datasets import load_dataset
    from synthlab.evaluation.evaluate import evaluate_run
    from synthlab.evaluation.groups import split_items
    from synthlab.evaluation.scoring import score_answers
    from synthlab.training.run_folders import load_model, read_metrics
    from synthlab.training.trainer import train
    from synthlab_generators import TASKS, write_dataset

    dry = args.dry_run
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))  # data and run: not results
    spec = TASKS["mano"]
    # one-operator expressions only (L = 1): 147 facts mod 7, 30 of them held out as the test split
    params = spec.params_cls(L=1, n_train=400 if dry else 20000, n_test=30, mod=7)
    data = write_dataset(spec, params, 0, work / f"mano_{'dry' if dry else 'gpu'}")
    model = {"d_model": 32 if dry else 512, "n_heads": 2 if dry else 8, "n_layers": 2, "loops": 2, "max_seq_len": 32}
    steps = 30 if dry else 200
    run = resolve_run_config(
        {},
        model,
        {
            "task": "mano",
            "data": str(data),
            "steps": steps,
            "batch_size": 32 if dry else 128,
            "lr": 1e-3,
            "warmup_steps": 20,
            "log_every": 10,
            "checkpoint_every": steps,
            "device": "cpu" if dry else "auto",
        },
    )
    run_dir = work / f"learn_{time.strftime('%H%M%S')}"
    start = time.perf_counter()
    result = train(run_dir, run, progress=False)
    seconds = time.perf_counter() - start
    metrics = read_metrics(run_dir)
    first, last = metrics[0]["loss"], metrics[-1]["loss"]
    part.record(
        "train",
        {
            "model": model,
            "steps": result.step,
            "seconds": round(seconds, 1),
            "device": json.loads((run_dir / "config.json").read_text())["derived"]["device"],
            "loss_first_log": first,
            "loss_last": last,
            "loss_fell": last < 0.7 * first,
            "tokens_per_s_last_window": round(metrics[-1]["tokens_per_s"]),
        },
    )
    device = torch.device("cpu" if dry else "cuda")
    net = load_model(run_dir, device)
    dataset = load_dataset(data, "mano")
    prompts, answers, _ = split_items(dataset, "train")
    scores = score_answers(net, prompts[:1000], answers[:1000], pad_id=dataset.pad_id, device=device)
    test = evaluate_run(run_dir, device=device.type)
    part.record(
        "accuracy",
        {
            "one_operator_train_prompts": float(scores.correct[-1].mean()),
            "one_operator_unseen_test_prompts": test["accuracy"],
            "chance": 1 / params.mod,
        },
    )
    shutil.rmtree(work)


# --- ouroboros -------------------------------------------------------------------------------------
def ouroboros(args, part: Part) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from synthlab.ouroboros import OuroborosConfig, OuroborosLM, lm_loss, trainable_breakdown
    from synthlab.ouroboros.train import OuroborosTrainConfig, make_optimizer
    from synthlab.training.run_folders import float32_matmul

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_ouroboros import SHAPE_3B, SHAPE_TINY

    dry = args.dry_run
    device = device_of(dry)
    dtype = torch.float32 if dry else torch.bfloat16
    batch, seq = (2, 32) if dry else (4, 2048)
    depths = (2, 3) if dry else (4, 8, 16)
    torch.manual_seed(0)
    config = Qwen2Config(**(SHAPE_TINY if dry else SHAPE_3B), attn_implementation="sdpa")
    start = time.perf_counter()
    with torch.device(device):
        base = Qwen2ForCausalLM._from_config(config, dtype=dtype)
    base.eval().requires_grad_(False)
    sync(device)
    part.record(
        "base",
        {
            "shape": "tiny" if dry else "Qwen2.5-3B",
            "params": sum(p.numel() for p in base.parameters()),
            "dtype": str(dtype),
            "build_s": round(time.perf_counter() - start, 1),
        },
    )
    start = time.perf_counter()
    model = OuroborosLM(base, OuroborosConfig(), torch.Generator().manual_seed(0))
    sync(device)
    part.record(
        "system",
        {
            "bases_s": round(time.perf_counter() - start, 1),
            "split": model.split.__dict__,
            "trainable": trainable_breakdown(model),
        },
    )
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
    optimizer = make_optimizer(model, OuroborosTrainConfig())

    def train_step(depth):
        loss = lm_loss(model(ids, depth), ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    with float32_matmul(device, True):
        model.train()
        train_step(1)  # warm-up: kernels, allocator, optimizer state
        rows = {}
        for depth in depths:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            seconds = time_steps(lambda d=depth: train_step(d), device, 0, 2)
            peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
            rows[depth] = {
                "step_s": round(seconds, 3),
                "tokens_per_s": round(batch * seq / seconds),
                "peak_gib": round(peak, 2),
            }
            part.record("train_steps", {"batch": batch, "seq": seq, "by_depth": rows})
        model.eval()
        with torch.no_grad():
            seconds = time_steps(lambda: lm_loss(model(ids, depths[-1]), ids), device, 1, 2)
        part.record("eval", {"depth": depths[-1], "step_s": round(seconds, 3)})


# --- report --------------------------------------------------------------------------------------
def report(args) -> None:
    parts = {}
    for path in sorted((args.out / "parts").glob("*.json")):
        parts[path.stem] = json.loads(path.read_text())
    parts["exit_codes"] = {path.stem: int(path.read_text()) for path in sorted(args.out.glob("*.rc"))}
    pytest_log = args.out / "pytest.log"
    if pytest_log.is_file():
        tail = pytest_log.read_text().strip().splitlines()
        parts["pytest"] = {"summary": tail[-1] if tail else "", "done": True}
    (args.out / "gpu_check.json").write_text(json.dumps(parts, indent=1) + "\n")
    lines = ["# GPU check", ""]
    for name, data in parts.items():
        done = data.get("done", name == "exit_codes")
        lines += [f"## {name}" + ("" if done else " (cut short or failed: see its log)"), ""]
        for key, value in data.items():
            if key not in ("part", "done"):
                lines.append(f"- **{key}**: `{json.dumps(value)}`")
        lines.append("")
    (args.out / "gpu_check.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "report":
        return report(args)
    part = Part(args.out, args.part, args.dry_run)
    {"throughput": throughput, "learn": learn, "ouroboros": ouroboros}[args.part](args, part)
    part.data["done"] = True
    part.save()


if __name__ == "__main__":
    main()
