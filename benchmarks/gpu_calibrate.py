"""The GPU check's calibration part (benchmarks/gpu_check.sh runs it as part `calibrate`): what the
cost model (synthlab.sweeps.cost) assumes, measured, and written to OUT/cost_calibration.json, which
`synthlab sweep NAME --preset gpu --dry-run --calibration FILE` reads.

    memory     peak memory of one training micro-batch (the real forward, loss and backward) at the
               largest shapes of the gpu presets, without and with activation checkpointing,
               against synthlab.sweeps.cost.peak_gib;
    packed     compiled training step of capacity-shaped models (d = 128, 256, 384) on packed rows
               of many documents: MFU with the dense mask (sdpa) and with flex_attention (flex), of
               the whole step and of its parts (the layers, the head), from the model and its
               one-layer twin (synthlab.sweeps.cost.part_mfus);
    trainer    the real trainer (synthlab.training.trainer.train) against the same steps in a bare loop run
               just before and just after it (their mean: a steady drift of a busy machine's speed
               cancels): tokens/s of each, and the wall time one checkpoint adds.

--dry-run: the same code on the CPU at tiny sizes (flex, which has no CPU backward, left out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch
from gpu_check import Part, device_of, sync, time_steps


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder of the results")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    return parser.parse_args()


def train_step(model, cfg, inputs, targets, doc_ids, checkpoint: bool, compile: bool = False):
    """One optimizer-free training micro-batch through the trainer's own forward and loss."""
    from synthlab.training.objectives import model_forward, step_losses
    from synthlab.training.run_folders import autocast

    forward = model_forward(model, compile, checkpoint)
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones_like(targets, dtype=torch.bool)

    def step():
        with autocast(inputs.device):
            objective, _ = step_losses(forward, inputs, targets, mask, doc_ids, cfg, generator, False)
        objective.backward()

    return step


def largest_points(count: int) -> list:
    """The `count` gpu-preset points with the largest predicted peak memory (one per experiment)."""
    from synthlab.sweeps import cost, experiments, lab_runner

    best = {}
    for name in experiments.available():
        exp = experiments.load(name)
        if "gpu" not in exp.presets:
            continue
        for point in exp.points("gpu"):
            typed = lab_runner.parse(point.config)
            if "ouroboros" in typed.stages and typed.ouroboros is not None and typed.ouroboros.source.base:
                continue
            gib = cost.gpu_cost(typed)["peak_gib"]
            if gib > best.get(name, (0, None))[0]:
                best[name] = (gib, typed)
    return [typed for _, typed in sorted(best.values(), key=lambda x: -x[0])[:count]]


def memory(args, part: Part, device: torch.device) -> None:
    from synthlab.models import build_model
    from synthlab.sweeps import cost

    for point in largest_points(1 if args.dry_run else 3):
        model_cfg, train = point.model, point.train
        steps, seq = cost.positions(point)
        rows = train.batch.batch_size // train.batch.grad_accum
        if args.dry_run:
            model_cfg, rows, seq = dataclasses.replace(model_cfg, d_model=32, n_heads=2), 2, min(seq, 32)
        pack = train.batch.pack if train.batch.pack is not None else point.spec.pack
        for checkpoint in (False, True):
            name = f"{point.task}_d{model_cfg.d_model}_{'ckpt' if checkpoint else 'plain'}"
            predicted = cost.peak_gib(
                model_cfg,
                seq,
                rows * seq,
                all_steps=train.loss != "last",
                masked=pack,
                dense=pack,
                checkpoint=checkpoint,
            )
            try:
                model = build_model(model_cfg, seed=0).to(device).train()
                g = torch.Generator().manual_seed(0)
                inputs = torch.randint(0, model_cfg.vocab_size, (rows, seq), generator=g).to(device)
                doc_ids = (torch.arange(seq) // 64).expand(rows, seq).contiguous().to(device) if pack else None
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                train_step(model, train, inputs, inputs, doc_ids, checkpoint)()
                sync(device)
                measured = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
                part.record(
                    name,
                    {
                        "rows": rows,
                        "seq": seq,
                        "predicted_gib": round(predicted, 2),
                        "measured_gib": None if measured is None else round(measured, 2),
                    },
                )
            except torch.OutOfMemoryError:
                part.record(
                    name, {"rows": rows, "seq": seq, "predicted_gib": round(predicted, 2), "measured_gib": "oom"}
                )
            finally:
                model = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()


def timed_step(cfg, train, rows: int, seq: int, device: torch.device, compile: bool, warmup: int, repeats: int):
    """(training FLOPs per part, seconds) of one bare step of `cfg` on `rows` packed rows of `seq`
    tokens, many bioS-sized documents a row: one measurement for `synthlab.sweeps.cost.part_mfus`."""
    from synthlab.models import build_model, flops_per_token_parts

    model = build_model(cfg, seed=0).to(device).train()
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, cfg.vocab_size, (rows, seq), generator=g).to(device)
    doc_ids = (torch.arange(seq) // 40).expand(rows, seq).contiguous().to(device)
    step = train_step(model, train, inputs, inputs, doc_ids, False, compile=compile)
    seconds = time_steps(step, device, warmup, repeats)
    per_token = flops_per_token_parts(cfg, seq, all_steps=train.loss != "last")
    return {k: 3 * v * rows * seq for k, v in per_token.items()}, seconds


def one_layer(cfg):
    """The same shape with one layer applied once: beside the full model it separates the time of
    the layers from the head's (synthlab.sweeps.cost.part_mfus)."""
    return dataclasses.replace(cfg, n_layers=1, loops=1, n_prelude=0, n_coda=0)


def packed(args, part: Part, device: torch.device) -> None:
    from synthlab.sweeps import cost, experiments, lab_runner

    point = lab_runner.parse(experiments.load("capacity").points("gpu")[-1].config)
    rows, seq = (2, 64) if args.dry_run else (point.train.batch.batch_size // point.train.batch.grad_accum, 512)
    kinds = ("sdpa",) if args.dry_run else ("sdpa", "flex")
    warmup, repeats = (1, 1) if args.dry_run else (3, 10)
    peak = part.data["peak_bf16_flops"]  # None on the CPU (dry run) and on a GPU of unknown peak
    for d in (32,) if args.dry_run else (128, 256, 384):
        for kind in kinds:
            cfg = dataclasses.replace(point.model, d_model=d, n_heads=max(2, d // 64), attention=kind, max_seq_len=seq)
            full, single = (
                timed_step(c, point.train, rows, seq, device, not args.dry_run, warmup, repeats)
                for c in (cfg, one_layer(cfg))
            )
            flops, seconds = full
            part.record(
                f"d{d}_{kind}",
                {
                    "rows": rows,
                    "seq": seq,
                    "model": f"{cfg.n_layers}x{cfg.loops}",
                    "step_ms": round(seconds * 1e3, 3),
                    "one_layer_step_ms": round(single[1] * 1e3, 3),
                    "tokens_per_s": round(rows * seq / seconds),
                    "mfu": None if peak is None else round(sum(flops.values()) / seconds / peak, 4),
                    "parts": None
                    if peak is None
                    else {k: round(v, 4) for k, v in cost.part_mfus([full, single], peak).items()},
                },
            )


def trainer(args, part: Part, device: torch.device, steps: int | None = None) -> None:
    """The real trainer's tokens/s against a bare loop, and the time a checkpoint adds, over `steps`
    steps (default 300; 30 on the CPU)."""
    from synthlab.cli.train import resolve_run_config
    from synthlab.training.run_folders import read_metrics
    from synthlab.training.trainer import train
    from synthlab_generators import TASKS, write_dataset

    steps = steps or (30 if args.dry_run else 300)
    model = {
        "d_model": 32 if args.dry_run else 256,
        "n_heads": 2 if args.dry_run else 4,
        "n_layers": 2,
        "loops": 2,
        "max_seq_len": 64,
    }
    with tempfile.TemporaryDirectory() as tmp:
        spec = TASKS["mano"]
        data = write_dataset(spec, spec.params_cls(L=2, n_train=5000, n_test=50, mod=7), 0, Path(tmp) / "data")
        walls, bares = {}, []
        for label, extra in (("none", {"checkpoint_every": 10**9}), ("ten", {"checkpoints": 10})):
            run = resolve_run_config(
                {},
                model,
                {
                    "task": "mano",
                    "data": str(data),
                    "steps": steps,
                    "batch_size": 64,
                    "log_every": steps,
                    "device": device.type,
                    **extra,
                },
            )
            if label == "none":  # a bare loop before and after it: the machine's drift cancels
                bares.append(bare_loop(run, data, device, steps))
            start = time.perf_counter()
            train(Path(tmp) / label, run, progress=False)
            walls[label] = time.perf_counter() - start
            if label == "none":
                tokens_per_s = read_metrics(Path(tmp) / label)[-1]["tokens_per_s"]
                bares.append(bare_loop(run, data, device, steps))
        part.record(
            "trainer",
            {
                "steps": steps,
                "wall_s": round(walls["none"], 3),
                "tokens_per_s": round(tokens_per_s),
                "checkpoint_s": round(max(0.0, walls["ten"] - walls["none"]) / 10, 4),
            },
        )
        bare = sum(bares) / 2
        part.record("bare_loop", {"tokens_per_s": round(bare), "before_after": [round(b) for b in bares]})
        part.record("trainer_vs_bare", round(tokens_per_s / bare, 4))


def bare_loop(run, data, device: torch.device, steps: int) -> float:
    """Tokens/s of the trainer's steps without the trainer: the same batches, model and optimizer."""
    from synthlab.data.datasets import load_dataset
    from synthlab.models import build_model
    from synthlab.training.objectives import to_device
    from synthlab.training.trainer import build_optimizer, prepare_run

    _, batcher = prepare_run(run, load_dataset(data, "mano"))
    model = build_model(run.model, seed=0).to(device).train()
    optimizer = build_optimizer(model, run.train)
    batches = [batcher.next_batch() for _ in range(steps)]
    tokens = sum(int((b.inputs != batcher.pad_id).sum()) for b in batches)
    start = time.perf_counter()
    for rows in batches:
        inputs, targets, mask, doc_ids = to_device(rows, device)
        train_step(model, run.train, inputs, targets, doc_ids, False)()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync(device)
    return tokens / (time.perf_counter() - start)


def write_calibration(out: Path, part: Part) -> None:
    """OUT/cost_calibration.json: the numbers synthlab.sweeps.cost.load_calibration reads (those measured
    so far: a missing one leaves the cost model's assumption in place)."""
    from synthlab.files import atomic_write_text

    d = part.data
    mfu = {k[1:].split("_")[0]: v["parts"] for k, v in d.items() if k.startswith("d") and k.endswith("_sdpa")}
    flex = {k[1:].split("_")[0]: v["parts"] for k, v in d.items() if k.startswith("d") and k.endswith("_flex")}
    ratios = [
        v["measured_gib"] / v["predicted_gib"]
        for v in d.values()
        if isinstance(v, dict) and isinstance(v.get("measured_gib"), float) and v["predicted_gib"]
    ]
    calibration = {
        "device": d["device"],
        "torch": d["torch"],
        "dry_run": d["dry_run"],
        "peak_flops": d["peak_bf16_flops"],  # what the MFUs are fractions of
        "compiled_mfu_packed": {"sdpa": mfu, "flex": flex},
        "memory_measured_over_predicted": max(ratios) if ratios else None,
        "trainer_vs_bare": d.get("trainer_vs_bare"),
        "checkpoint_s": d.get("trainer", {}).get("checkpoint_s"),
    }
    atomic_write_text(out / "cost_calibration.json", json.dumps(calibration, indent=1) + "\n")
    part.record("calibration", calibration)


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = device_of(args.dry_run)
    part = Part(args.out, "calibrate", args.dry_run)
    for measure in (memory, packed, trainer):
        measure(args, part, device)
        write_calibration(args.out, part)  # after each: a part stopped by its timeout keeps what it measured
    part.data["done"] = True
    part.save()


if __name__ == "__main__":
    main()
