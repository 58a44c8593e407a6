"""`synthlab sweep`'s options as one typed dataclass: its flags and their help come from the fields
(`synthlab.cli.flags`), and a script runs a sweep with the same object.

Light on purpose (no pandas, no torch): the CLI builds its flags from it when it starts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from synthlab.errors import SynthlabError
from synthlab.serialize import option


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """How to run an experiment's grid (`synthlab sweep NAME`): which preset, where, on what."""

    preset: str = option(
        "smoke",
        "Grid size: smoke (~1 min), cpu (a 2-core machine: 0.4-2.3 core-hours per experiment), gpu (one H200), "
        "or another the definition names; --dry-run prints the cost.",
        short="-p",
    )
    out: Path | None = option(None, "Sweep directory (default: runs/NAME-PRESET).", short="-o")
    jobs: int | None = option(
        None,
        "Points run in parallel processes (local executor); default: one per GPU (each on its own GPUs by "
        "CUDA_VISIBLE_DEVICES; more jobs than GPUs share them where the points' estimated peak memory fits), else 1.",
        short="-j",
    )
    executor: str = option("local", "Where points run: local or ray.")
    ray_address: str | None = option(
        None, "Ray cluster address (HOST:6379, or 'auto' on its head node); --executor ray needs one."
    )
    threads: int | None = option(
        None, "Torch threads (Ray: CPUs) per run (default: idle cores/jobs locally, 1 on Ray)."
    )
    launcher: str = option(
        "process",
        "How a point trains: process (in its worker) or torchrun (data-parallel, --nproc-per-node processes; "
        "Ray asks as many GPUs).",
    )
    nproc_per_node: int = option(1, "Processes per torchrun job (one GPU each on CUDA).")
    cache: Path | None = option(
        None,
        "Dataset cache directory (default: the one this sweep used before, else OUT/datasets); "
        "share it between sweeps.",
    )
    runs: Path | None = option(
        None,
        "Trained-model store (default: the one this sweep used before, else OUT/runs); share it between sweeps "
        "to train a model once.",
    )
    runner: str | None = option(
        None, "A point runner module (parse, run_point) (default: synthlab.sweeps.lab_runner, the lab's own)."
    )
    dry_run: bool = option(
        False,
        "Print the grid with each point's status and cost; run nothing. CPU presets: each point's steps at the "
        "seconds per step of its shape, from finished runs or a few steps timed here. "
        "For a gpu preset: tokens, FLOPs, memory and hours on one H200.",
        flag="--dry-run",
    )
    seeds: int | None = option(
        None,
        "Run every point over training seeds 0..N-1 instead of the preset's `seeds` (seed 0 keeps its point ids); "
        "default: the preset's.",
        min=1,
    )
    calibration: Path | None = option(
        None,
        "With --dry-run of a gpu preset: the cost_calibration.json a GPU check wrote (benchmarks/gpu_check.sh): "
        "measured MFU, memory and trainer overhead instead of the assumed ones.",
    )
    only: list[str] | None = option(
        None,
        "Run only the grid points whose factor column has this value, COLUMN=VALUE as results.csv names it "
        "(seed=2, 'size=d64-L1 N3447', loops=4); repeatable: a column given twice takes either value, two "
        "columns must both match. The others are left for a later sweep into the same --out; --dry-run lists "
        "the selected points.",
        metavar="COLUMN=VALUE",
    )
    reevaluate: bool = option(
        False,
        "Run the finished points again too, on their trained models (after an evaluator change); each new row "
        "replaces the old, its time added.",
        flag="--reevaluate",
    )

    def __post_init__(self) -> None:
        # --jobs, --threads and --executor are the driver's own checks (`driver.run_sweep`)
        if self.launcher not in ("process", "torchrun"):
            raise SynthlabError(f"--launcher must be 'process' or 'torchrun', got '{self.launcher}'")
        if self.nproc_per_node < 1:
            raise SynthlabError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if self.executor == "ray" and self.ray_address is None and not self.dry_run:
            # a cluster started here would be open to the network: only a running one is joined
            raise SynthlabError(
                "--executor ray needs --ray-address of a running cluster (`ray start --head` on a trusted "
                "network, then HOST:6379, or 'auto' on its head node); none is started here"
            )

    def out_dir(self, experiment: str) -> Path:
        """The sweep directory: --out, else runs/EXPERIMENT-PRESET."""
        return self.out or Path("runs") / f"{experiment}-{self.preset}"

    def nproc(self) -> int:
        """Processes per point's training as the driver takes it: 0 trains in the worker (process)."""
        return self.nproc_per_node if self.launcher == "torchrun" else 0
