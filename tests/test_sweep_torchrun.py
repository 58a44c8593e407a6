"""A sweep whose points train as torchrun jobs (`--launcher torchrun --nproc-per-node K`): on the
CPU with gloo, 2 processes per point, the smoke preset of a shipped experiment gives the table the
in-process sweep gives; Ray asks for K GPUs per job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from synthlab.sweeps import driver, experiments
from synthlab.sweeps import lab_runner as point_runner
from synthlab.sweeps.executor import Unit
from synthlab.sweeps.gpu_scheduling import ray_resources
from synthlab.sweeps.results_table import read_rows

MANO = Path(__file__).resolve().parent.parent / "experiments" / "mano.toml"


@pytest.mark.slow  # a sweep with a torchrun job
def test_a_point_trained_as_a_two_process_torchrun_job_matches_the_in_process_sweep(tmp_path):
    raw = tomllib.loads(MANO.read_text())
    raw["presets"]["smoke"]["grid"]["arch"] = raw["presets"]["smoke"]["grid"]["arch"][-1:]  # 1x2: one point
    exp = experiments.parse(raw)
    ddp = driver.run_sweep(
        exp, "smoke", tmp_path / "ddp", runner=point_runner, nproc_per_node=2, threads=1, progress=False
    )
    one = driver.run_sweep(exp, "smoke", tmp_path / "one", runner=point_runner, threads=1, progress=False)
    rows = {r["point_id"]: r for r in read_rows(ddp)}
    assert len(rows) == len(exp.points("smoke")) == 1
    for row in read_rows(one):
        other = rows[row["point_id"]]
        assert float(other["loss"]) == pytest.approx(float(row["loss"]), rel=1e-4)
        assert float(other["accuracy"]) == pytest.approx(float(row["accuracy"]), abs=0.02)
        derived = json.loads((Path(other["run_dir"]) / "model" / "config.json").read_text())["derived"]
        assert derived["processes"] == 2


def test_a_torchrun_job_asks_ray_for_one_gpu_per_process():
    unit = Unit(runner="synthlab.sweeps.lab_runner", run_dir="r", cache_dir="c", points=[], threads=2, nproc=4)
    assert ray_resources(unit, 8.0) == {"num_cpus": 8, "num_gpus": 4}
    assert ray_resources(unit, 0) == {"num_cpus": 8, "num_gpus": 0}
