"""The fake runner of tests/sweep_fake_runner.py with an estimated GPU memory per point (50 GiB x
model.width), recording the CUDA_VISIBLE_DEVICES its worker was given and when it ran."""

from __future__ import annotations

import os
import time
from pathlib import Path

import sweep_fake_runner

parse = sweep_fake_runner.parse


def gpu_memory_gib(config: dict) -> float:
    return 50.0 * config["model"]["width"]


def run_point(config: dict, run_dir: Path, *, cache_dir: Path) -> dict:
    start = time.time()
    metrics = sweep_fake_runner.run_point(config, run_dir, cache_dir=cache_dir)
    return {
        **metrics,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
        "t0": start,
        "t1": time.time(),
        "gib": gpu_memory_gib(config),
    }
