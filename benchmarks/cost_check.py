"""The GPU cost model checked against the real trainer on this CPU: what `synthlab sweep NAME --preset
gpu --dry-run` prints for a point (synthlab.sweeps.cost.gpu_cost: training FLOPs at a calibrated MFU, the
host's stall, the evaluation stages) against the wall time of that point's stages run here.

    calibrate  the cost model's inputs measured here as benchmarks/gpu_calibrate.py measures them on
               a GPU, into its file format (OUT/cost_calibration.json, read back with
               synthlab.sweeps.cost.load_calibration): the device's peak (here the best float32 matmul of
               one thread), the MFU of each part of a bare training step (the layers, the head:
               synthlab.sweeps.cost.part_mfus, from the first point's model plain at one layer and at
               four) on packed rows of many documents at each checked d (gpu_calibrate.train_step;
               eager, as the checked points run), the real
               trainer's tokens/s against a bare loop (gpu_calibrate.trainer in its CPU mode), and
               the host rates of the dry run (synthlab.sweeps.cost.host_rates);
    predict    gpu_cost of capacity gpu-preset points cut down to run here in minutes (d, layers,
               heads, people, exposures, batch; eager), keeping the preset's packed rows of 512,
               20 checkpoints a run and stages (train, then the capacity estimate); the parts' MFUs
               are measured again just before and after each point, on the first point's model (so
               a looped point tests that the parts' rates carry across loops, as the cost model
               assumes), and the prediction uses their mean: other work on the machine changes
               its speed within minutes; the point's own model is measured after it too (reported, not used);
    measure    each point's stages as the sweep runs them (synthlab.sweeps.lab_runner.STAGES: the trainer
               synthlab.training.trainer.train, then synthlab.evaluation.capacity), timed, with one torch thread; the
               dataset is generated first, untimed (the cost model does not count it);
    report     OUT/cost_check.json and a table: predicted and measured seconds per point (and per
               part), measured / predicted; exit 1 when one is off by more than --tolerance.

The calibration is measured in the same run as the points, so a machine that other work slows
slows both (the load average before and after, and the MFU before and after each point, are in the
report). --quick: tiny shapes and few steps, for the tests: the report's structure, not its
timing (no verdict, exit 0).

    OMP_NUM_THREADS=1 python benchmarks/cost_check.py --out DIR [--quick]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import gpu_calibrate
import torch
from gpu_calibrate import trainer
from gpu_check import Part

from synthlab.sweeps import cost

# Capacity gpu-preset points cut down: (label, people, d, layers, loops, exposures, batch).
POINTS = [("d64-L2 loops 1", 200, 64, 2, 1, 16, 8), ("d64-L2 loops 4", 200, 64, 2, 4, 16, 8)]
QUICK_POINTS = [("d16-L1 loops 1", 20, 16, 1, 1, 1, 4), ("d16-L1 loops 2", 20, 16, 1, 2, 1, 4)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder of the results")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, no verdict (default: off)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed bare steps per MFU measurement, after two untimed (default 5; --quick 3)",
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.15, help="largest |measured / predicted - 1| (default 0.15)"
    )
    args = parser.parse_args()
    args.repeats = 3 if args.quick else args.repeats
    return args


def points(quick: bool) -> list[tuple[str, object]]:
    """(label, PointConfig) of the checked points: the capacity gpu preset's first point, cut down."""
    from synthlab.sweeps import experiments, lab_runner

    base = experiments.load("capacity").points("gpu")[0].config
    out = []
    for label, people, d, layers, loops, exposures, batch in QUICK_POINTS if quick else POINTS:
        config = copy.deepcopy(base)
        config["data"]["n_people"] = people
        config["model"].update(d_model=d, n_layers=layers, loops=loops, n_heads=max(1, d // 32))
        config["train"].update(exposures=exposures, batch_size=batch, warmup_steps=10, compile=False, device="cpu")
        out.append((label, lab_runner.parse(config)))
    return out


def matmul_peak(size: int, repeats: int) -> float:
    """The best float32 matmul FLOP/s of `repeats` tries: the CPU's peak, as the cost model counts it."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def step_parts(model_point, point, peak: float, repeats: int) -> dict[str, float]:
    """MFU of each part (the layers, the head: synthlab.sweeps.cost.part_mfus) of a bare training step
    (forward and backward, no optimizer) at `point`'s d, micro-batch and row length, on packed rows
    of many documents, from `model_point`'s model plain at one layer and at four: what
    gpu_calibrate.py measures at each d on a GPU (there compiled, from its model and a one-layer twin)."""
    config = dataclasses.replace(model_point.model, d_model=point.model.d_model, n_heads=point.model.n_heads)
    timed = [timed_step(dataclasses.replace(config, n_layers=n, loops=1), point, repeats) for n in (1, 4)]
    return cost.part_mfus(timed, peak)


def step_mfu(point, peak: float, repeats: int) -> float:
    """MFU of the whole bare training step of `point`'s own model (reported beside the parts)."""
    flops, seconds = timed_step(point.model, point, repeats)
    return sum(flops.values()) / seconds / peak


def timed_step(config, point, repeats: int):
    _, seq = cost.positions(point)
    rows = point.train.batch.batch_size // point.train.batch.grad_accum
    return gpu_calibrate.timed_step(config, point.train, rows, seq, torch.device("cpu"), False, 2, repeats)


def calibrate(args, out: Path, checked: list) -> dict:
    """Measure the cost model's inputs here; write and read back OUT/cost_calibration.json."""
    part = Part(out, "cost_check_calibrate", False)
    part.data["device"] = "cpu"
    peak = matmul_peak(256 if args.quick else 1024, 3 if args.quick else 10)
    part.record("peak_flops", peak)
    mfu = {str(p.model.d_model): step_parts(checked[0][1], p, peak, args.repeats) for _, p in checked}
    part.record("eager_mfu_packed", mfu)
    trainer(argparse.Namespace(dry_run=True), part, torch.device("cpu"), 30 if args.quick else 150)  # Mano d = 32
    rates = cost.host_rates(1 if args.quick else 3)
    part.record("host_rates", rates)
    calibration = {
        "device": "cpu",
        "torch": torch.__version__,
        "dry_run": False,
        "peak_flops": peak,
        "compiled_mfu_packed": {},
        "eager_mfu_packed": {"sdpa": mfu},
        "memory_measured_over_predicted": None,
        "trainer_vs_bare": part.data["trainer_vs_bare"],
        "checkpoint_s": part.data["trainer"]["checkpoint_s"],
    }
    path = out / "cost_calibration.json"
    path.write_text(json.dumps(calibration, indent=1) + "\n")
    return {**cost.load_calibration(path), "host_rates": rates}


def predict(point) -> dict:
    """The dry run's numbers for `point` in seconds, with its parts."""
    row = cost.gpu_cost(point, exact=True)
    compute_s = (row["gpu_h_shared"] - row["stall_h"]) * 3600
    return {
        "mfu": row["mfu"],
        "compute_s": compute_s,
        "stall_s": row["stall_h"] * 3600,
        "eval_s": row["eval_h"] * 3600,
        "pack_s": row["pack_h"] * 3600,
        "ckpt_n": row["ckpt_n"],
        "ckpt_s": row["ckpt_h"] * 3600,
        "total_s": row["gpu_h"] * 3600,
    }


def measure(point, cache: Path, run_dir: Path) -> dict:
    """Seconds of each stage of `point` (the sweep's stage functions), after an untimed dataset."""
    from synthlab.sweeps import lab_runner
    from synthlab.training.run_folders import read_metrics

    work = lab_runner.Work(point, run_dir, cache, 0, lab_runner.dataset(point, cache), run_dir / "model")
    seconds = {}
    for name, stage in lab_runner.STAGES.items():
        if name == "train" or name in point.stages:
            start = time.perf_counter()
            stage.run(work)
            seconds[name] = time.perf_counter() - start
    metrics = read_metrics(work.model_dir)
    # the training loop's own time: each logged window's tokens over its tokens/s (steps and
    # checkpoint snapshots; not the run's start, its last checkpoint write and its final weights)
    tokens = [0] + [m["tokens"] for m in metrics]
    loop_s = sum((tokens[i + 1] - tokens[i]) / m["tokens_per_s"] for i, m in enumerate(metrics))
    return {
        "stages_s": seconds,
        "loop_s": loop_s,
        "total_s": sum(seconds.values()),
        "steps": metrics[-1]["step"],
        "checkpoints_kept": len(list(work.model_dir.glob("checkpoint-*.pt"))),
    }


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    checked = points(args.quick)
    load_before = os.getloadavg()
    started = time.perf_counter()
    calibration = calibrate(args, args.out, checked)
    cost.use_calibration(calibration)
    cost.use_host_rates(calibration["host_rates"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, point in checked:
            # the parts' MFUs again just before and after the point (a busy machine's speed drifts;
            # the calibration file keeps the first): the prediction uses their mean
            d = str(point.model.d_model)
            before = step_parts(checked[0][1], point, calibration["peak_flops"], args.repeats)
            measured = measure(point, Path(tmp) / "cache", Path(tmp) / label.replace(" ", "_"))
            after = step_parts(checked[0][1], point, calibration["peak_flops"], args.repeats)
            mean = {k: (before[k] + after[k]) / 2 for k in before}
            cost.use_calibration({**calibration, "eager_mfu_packed": {"sdpa": {d: mean}}})
            own = step_mfu(point, calibration["peak_flops"], args.repeats)  # the point's own model
            predicted = {**predict(point), "step_mfu_before": before, "step_mfu_after": after, "step_mfu_own": own}
            ratio = measured["total_s"] / predicted["total_s"]
            rows.append({"point": label, "predicted": predicted, "measured": measured, "ratio": ratio})
            print(
                f"{label}: predicted {predicted['total_s']:.1f} s, measured {measured['total_s']:.1f} s, "
                f"measured / predicted {ratio:.3f}",
                flush=True,
            )
    within = None if args.quick else all(abs(r["ratio"] - 1) <= args.tolerance for r in rows)
    report = {
        "quick": args.quick,
        "tolerance": args.tolerance,
        "torch_threads": torch.get_num_threads(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
        "calibration": calibration,
        "points": rows,
        "within": within,
    }
    (args.out / "cost_check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(table(rows))
    print(
        f"load average {load_before[0]:.1f} before, {report['load_after'][0]:.1f} after; "
        f"{'no verdict (--quick)' if within is None else 'within' if within else 'OFF'} "
        f"(tolerance {args.tolerance:.0%})"
    )
    return 0 if within is not False else 1


def table(rows: list[dict]) -> str:
    """predicted | measured per point, seconds: training (compute + stall) and the evaluation stages."""
    lines = [
        "| point | steps | ckpts | MFU | predicted train s | measured train s (its loop) | predicted eval s | "
        "measured eval s | predicted s | measured s | measured / predicted |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        p, m = r["predicted"], r["measured"]
        evals = sum(v for k, v in m["stages_s"].items() if k != "train")
        lines.append(
            f"| {r['point']} | {m['steps']} | {p['ckpt_n']} | {p['mfu']:.3f} | "
            f"{p['compute_s'] + p['stall_s']:.1f} | {m['stages_s']['train']:.1f} ({m['loop_s']:.1f}) | {p['eval_s']:.1f} | "
            f"{evals:.1f} | {p['total_s']:.1f} | {m['total_s']:.1f} | {r['ratio']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
