"""MFU of a bare training step (forward and backward through the trainer's own loss, bf16 autocast;
gpu_calibrate.timed_step) at d = 64, 128, 256 and 1024, eager and compiled, on the capacity gpu
preset's packed rows (its micro-batch of 512-token rows of many biographies) with its model at
that width and --layers layers (n_heads = d / 64): how the GPU's use grows with width, the capacity
calibration's d = 64 beside the widths the cost model is calibrated at. MFU is the step's training
FLOPs (3 x forward, synthlab.models.flops_per_token_parts) over the device's dense bf16 peak.
OUT/parts/mfu.json is rewritten after each measurement, smallest d first.

--dry-run: d = 16 and 32, two rows of 64 tokens, eager only, on the CPU (no peak: step times only).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
from gpu_calibrate import timed_step
from gpu_check import Part, device_of


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder of the results")
    parser.add_argument("--dry-run", action="store_true", help="toy widths on the CPU, eager (default: off)")
    parser.add_argument("--layers", type=int, default=2, help="layers of every model (default 2)")
    return parser.parse_args()


def main() -> None:
    from synthlab.sweeps import experiments, lab_runner

    args = parse_args()
    device = device_of(args.dry_run)
    torch.set_float32_matmul_precision("high")  # what training does on CUDA (TrainConfig.tf32)
    part = Part(args.out, "mfu", args.dry_run)
    point = lab_runner.parse(experiments.load("capacity").points("gpu")[0].config)
    rows, seq = (2, 64) if args.dry_run else (point.train.batch.batch_size // point.train.batch.grad_accum, 512)
    warmup, repeats = (1, 1) if args.dry_run else (2, 5)
    peak = part.data["peak_bf16_flops"]
    for d in (16, 32) if args.dry_run else (64, 128, 256, 1024):
        cfg = dataclasses.replace(
            point.model, d_model=d, n_heads=max(1, d // 64), n_layers=args.layers, loops=1, max_seq_len=seq
        )
        for compile in (False,) if args.dry_run else (False, True):
            flops, seconds = timed_step(cfg, point.train, rows, seq, device, compile, warmup, repeats)
            part.record(
                f"d{d}_{'compiled' if compile else 'eager'}",
                {
                    "rows": rows,
                    "seq": seq,
                    "layers": args.layers,
                    "step_ms": round(seconds * 1e3, 3),
                    "tokens_per_s": round(rows * seq / seconds),
                    "mfu": None if peak is None else round(sum(flops.values()) / seconds / peak, 4),
                },
            )
            if device.type == "cuda":
                torch.cuda.empty_cache()
    part.data["done"] = True
    part.save()


if __name__ == "__main__":
    main()
