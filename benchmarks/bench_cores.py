"""How to spend this machine's cores on runs of one shape: one run on every core or one run per
core, eager or compiled, in wall-clock steps per second, every layout measured in the same
invocation and printed as a ratio to the first.

A layout `PxT` is P runs side by side with T torch threads each; `1x2+1x1` is a two-thread run
beside a one-thread one (a machine oversubscribed). A run that has to finish within
one sitting wants the most steps per second of one run; a grid of runs at the shape (a screen, a
seed grid) finishes soonest with the most steps per second summed over the runs. Both are printed.

Each run of a layout is a child process (`--child`): it builds bench_shapes' lab step (what
`synthlab train` runs) on one fixed batch of the shape, takes warm-up steps (the compile, when
compiled, is among them), says it is ready, and on the parent's word steps for --seconds of wall
time. All of a layout's runs start together. Layouts take turns, in an order rotated from round
to round, and each ratio is against the first layout of the same round. Unlike bench_shapes'
CPU-second rates these are wall-clock rates: they count time spent waiting for a busy core,
which is what differs between layouts, so run this on an otherwise idle machine (the load
average at the start is printed).

Measured (`--compile --seconds 40 --rounds 2`, calib1000-64-x4: d 64 x 1 layer x 4 loops, 8 x 128
packed bioS rows; 2 cores, nothing else running; the median over the two rounds):

    layout         one run, steps/s   summed, steps/s   summed / 1x2 eager
    1x2 eager           30.5               30.5              1.00
    2x1 eager           20.5               41.0              1.34
    1x2 compiled        41.5               41.5              1.36
    2x1 compiled        25.2               50.4              1.65

So one looped run at C1's point finishes soonest compiled on both cores (446,125 steps in about
3.0 hours), and two of them side by side each on one core, compiled (about 4.9 hours each, 1.21x
the pair's throughput of running them one after the other on two threads). Oversubscribed
(`--layouts 1x2 1x2+1x1 --compile --seconds 40 --rounds 1`), the two-thread run fell to 2.6 steps/s
eager and 3.5 compiled beside a one-thread run, against 32.0 and 41.8 alone; the pair summed 22.4
and 28.2, less than the two-thread run alone.

    .venv/bin/python benchmarks/bench_cores.py [--shapes calib1000-64-x4] [--layouts 1x2 2x1 1x2+1x1]
        [--compile] [--batch-size 8] [--seconds 60] [--rounds 2] [--dry-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_shapes  # noqa: E402  (a sibling script: the shapes and the lab's step)

WARMUP_STEPS = 3  # the first compiles (when compiled); the rest settle the allocator


@dataclasses.dataclass(frozen=True)
class Layout:
    groups: tuple[tuple[int, int], ...]  # (runs, threads each), e.g. ((1, 2), (1, 1)) for 1x2+1x1
    compiled: bool

    @property
    def name(self) -> str:
        return "+".join(f"{r}x{t}" for r, t in self.groups) + (" compiled" if self.compiled else " eager")

    @property
    def threads(self) -> list[int]:
        """Each run's torch threads, the first group's runs first."""
        return [t for runs, t in self.groups for _ in range(runs)]


def parse_layout(text: str) -> tuple[tuple[int, int], ...]:
    groups = []
    for group in text.split("+"):
        runs, sep, threads = group.partition("x")
        if not sep or not runs.isdigit() or not threads.isdigit() or int(runs) < 1 or int(threads) < 1:
            raise argparse.ArgumentTypeError(f"a layout is RUNSxTHREADS[+RUNSxTHREADS...], e.g. 2x1, not {text!r}")
        groups.append((int(runs), int(threads)))
    return tuple(groups)


def child(shape: str, cache: Path, batch_size: int | None, compiled: bool, threads: int) -> None:
    """One run of a layout: warm up, say ready, step for the seconds the parent names, report."""
    torch.set_num_threads(threads)
    run, batch, _ = bench_shapes.resolve(shape, cache, batch_size)
    if compiled:
        run = dataclasses.replace(run, train=run.train.replaced(compile=True))
    step = bench_shapes.lab_step(run, batch)
    for _ in range(WARMUP_STEPS):
        step()
    print("ready", flush=True)
    seconds = float(sys.stdin.readline())
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        step()
        steps += 1
    tokens = batch[0].numel() * steps
    print(json.dumps({"steps": steps, "seconds": elapsed, "tokens": tokens}), flush=True)


def run_layout(layout: Layout, shape: str, cache: Path, batch_size: int | None, seconds: float) -> list[dict]:
    """Every run of the layout, started together once all are warm; each run's steps and tokens per second."""
    command = [sys.executable, __file__, "--child", shape, "--cache", str(cache)]
    command += ["--compile"] * layout.compiled + ["--batch-size", str(batch_size)] * (batch_size is not None)
    procs = [
        subprocess.Popen(
            [*command, "--threads", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        )
        for threads in layout.threads
    ]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"error: a {layout.name} run of {shape} failed before its first timed step")
        for proc in procs:
            proc.stdin.write(f"{seconds}\n")
            proc.stdin.flush()
        results = [json.loads(proc.stdout.readline()) for proc in procs]
    finally:  # a run that failed or hangs must not go on competing with the next layout's
        for proc in procs:
            proc.kill()
            proc.wait()
    return [{"steps_per_s": r["steps"] / r["seconds"], "tokens_per_s": r["tokens"] / r["seconds"]} for r in results]


def measure(shape: str, layouts: list[Layout], args) -> dict[str, dict[str, float]]:
    """Per layout: the median over rounds of one run's steps/s (the mean over the first group's runs),
    the summed steps/s and tokens/s, and the summed rate's ratio to the first layout's in the same round."""
    rows: dict[str, dict[str, list[float]]] = {
        lay.name: {"one": [], "sum": [], "tokens": [], "ratio": []} for lay in layouts
    }
    for r in range(args.rounds):
        order = layouts[r % len(layouts) :] + layouts[: r % len(layouts)]
        sums = {}
        for layout in order:
            runs = run_layout(layout, shape, args.cache, args.batch_size, args.seconds)
            sums[layout.name] = sum(x["steps_per_s"] for x in runs)
            row = rows[layout.name]
            row["one"].append(statistics.mean(x["steps_per_s"] for x in runs[: layout.groups[0][0]]))
            row["sum"].append(sums[layout.name])
            row["tokens"].append(sum(x["tokens_per_s"] for x in runs))
        for layout in layouts:
            rows[layout.name]["ratio"].append(sums[layout.name] / sums[layouts[0].name])
    return {name: {key: statistics.median(values) for key, values in row.items()} for name, row in rows.items()}


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    cores = len(os.sched_getaffinity(0))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=["calib1000-64-x4"],
        choices=list(bench_shapes.SHAPES),
        help="bench_shapes' shapes (default: calib1000-64-x4, C1's looped arm)",
    )
    parser.add_argument(
        "--layouts",
        nargs="+",
        type=parse_layout,
        default=[((1, cores),), ((cores, 1),)],
        help=f"RUNSxTHREADS[+RUNSxTHREADS...], the first the baseline (default: 1x{cores} {cores}x1, this machine's cores)",
    )
    parser.add_argument("--compile", action="store_true", help="also time every layout compiled (train.system.compile)")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per step (default: the preset's)")
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="timed wall seconds per layout per round (default: 60)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the layouts (default: 2)")
    bench_shapes.add_cache_option(parser)
    parser.add_argument("--dry-run", action="store_true", help="one round of one second (a check, not a timing)")
    parser.add_argument("--child", metavar="SHAPE", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, not {args.batch_size}")
    if args.child:
        child(args.child, args.cache, args.batch_size, args.compile, args.threads)
        return {}
    if args.dry_run:
        args.rounds, args.seconds = 1, 1.0
    layouts = [Layout(groups, c) for c in [False, True][: 1 + args.compile] for groups in args.layouts]
    print(
        f"{cores} cores, load average {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {args.seconds:g} s per layout"
    )
    results = {}
    for shape in args.shapes:
        bench_shapes.resolve(shape, args.cache, args.batch_size)  # the dataset, once, before any layout is timed
        results[shape] = measure(shape, layouts, args)
        print(f"{shape} ({'preset batch' if args.batch_size is None else f'batch {args.batch_size}'}):")
        for name, row in results[shape].items():
            print(
                f"  {name:18s} one run {row['one']:7.1f} steps/s   summed {row['sum']:7.1f} steps/s "
                f"{row['tokens']:9,.0f} tokens/s   summed / {layouts[0].name}: {row['ratio']:.2f}"
            )
    return results


if __name__ == "__main__":
    main()
