"""Start-up time of the command line: `synthlab --help` and friends, each in a fresh process.

    .venv/bin/python benchmarks/bench_startup.py [--runs 7] [--baseline OTHER_CHECKOUT]

Times `python -m synthlab --help`, `... train --help`, `... sweep --help` and `python -c "import
synthlab.cli"` (wall time of the whole process, median of --runs), and lists the heavy libraries
each one loads (read from `sys.modules` in the child at exit). The source tree measured is this
script's checkout (run from it, PYTHONPATH at it and its generators/); `--baseline DIR` measures another
checkout the same way, in interleaved rounds, and prints this tree's time over the baseline's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pandas", "scipy", "matplotlib", "seaborn", "transformers", "safetensors", "numpy")
CASES = {  # label: the child's arguments after `python`
    "synthlab --help": ["-m", "synthlab", "--help"],
    "synthlab train --help": ["-m", "synthlab", "train", "--help"],
    "synthlab sweep --help": ["-m", "synthlab", "sweep", "--help"],
    "import synthlab.cli": ["-c", "import synthlab.cli"],
}
# The probe runs a case as `python -c`, printing the tree it imported synthlab from and the heavy
# libraries in sys.modules at exit (typer's --help exits through SystemExit, atexit still runs).
PROBE = """import atexit, runpy, sys
def report():
    print(sys.modules['synthlab'].__file__, *(m for m in {heavy} if m in sys.modules), file=sys.stderr)
atexit.register(report)
args = {args}
if args[0] == '-m':
    sys.argv = ['synthlab', *args[2:]]
    runpy.run_module(args[1], run_name='__main__', alter_sys=True)
else:
    exec(args[1])
"""


def environment(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'generators'}"}


def heavy_modules(tree: Path, args: list[str]) -> str:
    """The heavy libraries a case loads (also the untimed warm-up: byte code compiled, files cached)."""
    code = PROBE.format(heavy=HEAVY, args=args)
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=environment(tree), capture_output=True, text=True)
    path, *loaded = done.stderr.strip().splitlines()[-1].split()
    if not Path(path).resolve().is_relative_to(tree.resolve()):
        sys.exit(f"error: the child imported synthlab from {path}, not from {tree}")
    return ", ".join(loaded) or "-"


def seconds(tree: Path, args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=tree, env=environment(tree), capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per command and tree (default 7)")
    parser.add_argument("--baseline", type=Path, help="another checkout, measured in the same rounds")
    args = parser.parse_args()
    trees = [HERE] + ([args.baseline.resolve()] if args.baseline else [])
    loads = {(tree, label): heavy_modules(tree, case) for tree in trees for label, case in CASES.items()}
    times: dict[tuple[Path, str], list[float]] = {key: [] for key in loads}
    for _ in range(args.runs):  # interleaved: a slow spell of the machine hits every column alike
        for label, case in CASES.items():
            for tree in trees:
                times[tree, label].append(seconds(tree, case))
    median = {key: statistics.median(values) for key, values in times.items()}

    print(f"{sys.executable}, median of {args.runs} runs; this tree: {HERE}")
    if args.baseline:
        print(f"baseline: {trees[1]}")
        print("| command | this tree | baseline | ratio | heavy modules (this tree) | heavy modules (baseline) |")
        print("|---|---|---|---|---|---|")
    else:
        print("| command | time | heavy modules |")
        print("|---|---|---|")
    for label in CASES:
        row = [f"`{label}`", f"{median[HERE, label]:.3f} s"]
        if args.baseline:
            base = trees[1]
            row += [f"{median[base, label]:.3f} s", f"{median[HERE, label] / median[base, label]:.2f}"]
            row += [loads[HERE, label], loads[base, label]]
        else:
            row.append(loads[HERE, label])
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
