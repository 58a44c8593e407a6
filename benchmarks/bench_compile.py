"""What `train.compile` costs and repays on this CPU at the lab's shapes: the first compiled step
in a process with an empty inductor cache (cold), the same in a second process that finds the
first one's cache on disk (warm: every later run of the shape on this machine), and the compiled
step's speed against eager, in steps per CPU second of the training thread (`bench_shapes.measure`:
interleaved rounds, the median of the per-round ratios). Shapes are bench_shapes.py's; the numbers
below are what `synthlab sweep --dry-run` weighs (synthlab.sweeps.step_rate: COMPILE_*).

Measured (one thread, load average 4-6 on 2 cores beside two training jobs; 5 rounds; one run per shape):

    shape        cold compile   warm compile   compiled / eager (min-max)
    mano-3x1         93.9 s          4.2 s        1.05x (1.04-1.06)
    calib64-L1       58.6 s          8.6 s        1.17x (1.05-1.27)

The dry run takes the longer compile times and the smaller speedup (94 s, 8.6 s, 1.05x), so it
names only points that repay compiling at either shape.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_compile.py [--shapes mano-3x1 calib64-L1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_shapes  # noqa: E402  (a sibling script: the shapes, the lab's step, the timing)


def child(shape: str, data_cache: Path, rounds: int) -> dict:
    """In this process: the first compiled step's seconds, then (rounds > 0) eager vs compiled rates."""
    torch.set_num_threads(1)
    run, batch, _ = bench_shapes.resolve(shape, data_cache)
    compiled = bench_shapes.lab_step(dataclasses.replace(run, train=run.train.replaced(compile=True)), batch)
    start = time.perf_counter()
    compiled()
    first = time.perf_counter() - start
    if rounds == 0:
        return {"first_s": first}
    rates = bench_shapes.measure({"eager": bench_shapes.lab_step(run, batch), "compiled": compiled}, rounds, 0.2)
    ratios = [c / e for c, e in zip(rates["compiled"], rates["eager"])]
    return {"first_s": first, "speedup": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def in_process(shape: str, args, inductor: Path, rounds: int) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, __file__, "--child", shape, "--rounds", str(rounds), "--cache", str(args.cache)]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["mano-3x1"], choices=list(bench_shapes.SHAPES))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default: 5)")
    bench_shapes.add_cache_option(parser)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.rounds)))
        return
    print(f"{'shape':<16} {'cold s':>8} {'warm s':>8} {'compiled/eager':>15} (min-max)")
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as inductor:  # empty: the first process compiles cold
            cold = in_process(shape, args, Path(inductor), 0)
            warm = in_process(shape, args, Path(inductor), args.rounds)
        print(
            f"{shape:<16} {cold['first_s']:>8.1f} {warm['first_s']:>8.1f} {warm['speedup']:>14.2f}x "
            f"({warm['min']:.2f}-{warm['max']:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
