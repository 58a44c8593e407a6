"""The Ray executor on a real local Ray cluster gives the table the local executor gives."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from synthlab.sweeps import driver, experiments, runner_protocol
from synthlab.sweeps import results_table as results
from synthlab.sweeps.results_table import read_rows

ray = pytest.importorskip("ray")
TESTS = Path(__file__).parent
FAKE = TESTS / "fixtures" / "sweep_fake.toml"
sys.path.insert(0, str(TESTS))
RUNNER = "sweep_fake_runner"  # imported by name where it runs (sys.path here, PYTHONPATH in Ray workers)


def _table(results: Path) -> list[tuple]:
    return sorted(
        tuple(sorted((k, v) for k, v in r.items() if k not in ("wall_s", "run_dir"))) for r in read_rows(results)
    )


@pytest.fixture
def local_cluster(monkeypatch):
    # Ray's workers are fresh interpreters: they find the test runner through PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    # ray.init installs process-wide SIGTERM/SIGINT handlers; give the other tests theirs back.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.mark.slow  # a local Ray cluster
def test_ray_executor_matches_local(local_cluster, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    exp = experiments.load(FAKE)
    remote = driver.run_sweep(
        exp, "smoke", tmp_path / "ray", executor="ray", runner=runner_protocol.load_runner(RUNNER), progress=False
    )
    local = driver.run_sweep(
        exp, "smoke", tmp_path / "local", runner=runner_protocol.load_runner(RUNNER), progress=False
    )
    assert len(results.read_rows(remote)) == 8
    assert _table(remote) == _table(local)
    # a rerun through Ray finds every point done and submits nothing
    driver.run_sweep(
        exp, "smoke", tmp_path / "ray", executor="ray", runner=runner_protocol.load_runner(RUNNER), progress=False
    )
    assert _table(remote) == _table(local)
