"""GPU assignment (synthlab.sweeps.gpu_scheduling) with faked GPUs: workers on their own GPUs, small points
sharing one where their estimated memory fits, torchrun points on disjoint sets, Ray fractions."""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from pathlib import Path

import pytest

from synthlab.errors import SynthlabError
from synthlab.sweeps import driver, executor, experiments
from synthlab.sweeps import gpu_scheduling as devices
from synthlab.sweeps.gpu_scheduling import Demand, Gpus
from synthlab.sweeps.results_table import read_rows

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
import sweep_gpu_runner  # noqa: E402  (a module beside the tests)


def test_two_large_points_get_two_gpus_and_small_ones_share():
    gpus = Gpus([140.0] * 8)
    big = Demand(1, 82.9)
    first, second = gpus.take(big), gpus.take(big)
    assert first != second  # today's code put both on cuda:0: out of memory
    small = [gpus.take(Demand(1, 6.0)) for _ in range(3)]
    assert small == [first] * 3  # beside a large one (126 GiB usable): the empty GPUs stay empty
    assert gpus.take(Demand(1, 40.0)) == second  # 25 GiB left beside the first, 43 beside the second
    assert gpus.take(Demand(1, 100.0)) not in (first, second)


def test_torchrun_points_get_disjoint_gpu_sets_and_wait_for_room():
    gpus = Gpus([80.0] * 8)
    a, b = gpus.take(Demand(4, 10.0)), gpus.take(Demand(4, 10.0))
    assert len(set(a)) == 4 and len(set(b)) == 4 and not set(a) & set(b)
    assert gpus.take(Demand(2, 70.0)) is None  # 62 GiB left on each: no room now
    gpus.give(a, Demand(4, 10.0))
    assert set(gpus.take(Demand(2, 70.0))) <= set(a)


def test_a_point_without_an_estimate_holds_its_gpu_alone():
    gpus = Gpus([80.0, 80.0])
    alone = gpus.take(Demand(1, None))
    other = gpus.take(Demand(1, 1.0))
    assert alone != other and gpus.take(Demand(1, 1.0)) == other
    assert gpus.take(Demand(1, None)) is None  # the other GPU holds points
    gpus.give(alone, Demand(1, None))
    assert gpus.take(Demand(1, None)) == alone


def test_a_point_larger_than_any_gpu_is_one_line_before_anything_runs():
    with pytest.raises(SynthlabError, match="needs 1 GPU"):
        devices.run_placed(["x"], [Demand(1, 200.0)], Gpus([140.0]), 1, None, None)
    with pytest.raises(SynthlabError, match="needs 4 GPU"):
        devices.run_placed(["x"], [Demand(4, 1.0)], Gpus([140.0] * 2), 1, None, None)


def test_placed_points_never_overfill_a_gpu_and_respect_jobs():
    """Simulated: 12 points of varied size on 3 faked GPUs; at every moment each GPU's running
    estimates fit in it and no more than `jobs` points run."""
    sizes = [90, 30, 30, 60, 10, 10, 10, 120, 45, 45, 5, 70]
    demands = [Demand(2 if i % 5 == 4 else 1, float(s)) for i, s in enumerate(sizes)]
    lock, running, seen = threading.Lock(), {}, []
    pool = concurrent.futures.ThreadPoolExecutor(8)

    def work(i, got):
        with lock:
            running[i] = got
            load = [sum(demands[j].gib for j, g in running.items() if k in g) for k in range(3)]
            seen.append((len(running), load))
        time.sleep(0.01 * (1 + i % 3))
        with lock:
            del running[i]
        return i, got

    results = []
    devices.run_placed(
        list(range(12)), demands, Gpus([140.0] * 3), 5, lambda i, got: pool.submit(work, i, got), results.append
    )
    assert sorted(i for i, _ in results) == list(range(12))
    assert all(len(got) == demands[i].gpus for i, got in results)
    assert all(n <= 5 and max(load) <= 0.9 * 140 for n, load in seen)
    assert max(n for n, _ in seen) >= 3  # small points did run side by side


def test_visible_devices_index_the_parents_own_list():
    assert devices.visible((0, 2)) == "0,2"
    assert devices.visible((0, 2), "4,5,6") == "4,6"  # inside a Slurm allocation of GPUs 4-6


def test_ray_asks_the_share_of_a_gpu_the_estimate_needs():
    assert devices.ray_gpus(Demand(1, 6.0), 8, 140.0) == pytest.approx(1 / 16)
    assert devices.ray_gpus(Demand(1, 63.0), 8, 140.0) == pytest.approx(0.5)
    assert devices.ray_gpus(Demand(1, 130.0), 8, 140.0) == 1.0
    assert devices.ray_gpus(Demand(1, None), 8, 140.0) == 1
    assert devices.ray_gpus(Demand(4, 6.0), 8, 140.0) == 4
    assert devices.ray_gpus(Demand(1, 6.0), 0, 140.0) == 0
    unit = executor.Unit(runner="r", run_dir="r", cache_dir="c", points=[], threads=2, gib=6.0)
    assert devices.ray_resources(unit, 8.0, 140.0) == {"num_cpus": 2, "num_gpus": pytest.approx(1 / 16)}


def test_jobs_default_to_one_per_gpu():
    assert devices.default_jobs(8) == 8 and devices.default_jobs(0) == 1


@pytest.mark.slow  # spawns worker processes
def test_a_sweep_on_faked_gpus_gives_each_worker_its_own(tmp_path):
    """Three models (estimates 100, 50 and 50 GiB) on two faked 140 GiB GPUs, three jobs: each
    worker saw one GPU of the parent's list; the 100 GiB one had its GPU to itself while it ran,
    the two 50 GiB ones could share the other."""
    raw = {
        "name": "gpus",
        "claim": "none",
        "title": "t",
        "task": "fake",
        "plot": "mano",
        "stages": ["train"],
        "base": {"data": {"size": 10, "seed": 0}, "train": {"steps": 5, "sleep": 0.1}},
        "presets": {
            p: {
                "grid": {"arch": [{"label": str(i), "model.width": w, "data.seed": i} for i, w in enumerate([2, 1, 1])]}
            }
            for p in ("smoke", "cpu", "gpu")
        },
    }
    results = driver.run_sweep(
        experiments.parse(raw),
        "smoke",
        tmp_path / "s",
        runner=sweep_gpu_runner,
        jobs=3,
        threads=1,
        progress=False,
        gpus=[140.0, 140.0],
    )
    rows = read_rows(results)
    assert len(rows) == 3 and {r["visible"] for r in rows} <= {"0", "1"}
    big = next(r for r in rows if float(r["gib"]) == 100)
    for other in rows:
        overlap = other is not big and float(other["t0"]) < float(big["t1"]) and float(big["t0"]) < float(other["t1"])
        assert not (overlap and other["visible"] == big["visible"])
