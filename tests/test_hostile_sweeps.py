"""Hostile sweep tables and processes: a non-numeric cell is one `error:` line naming it, a report
copy keeps each sweep's table, a killed driver takes its workers with it, and the ray executor
never starts a cluster of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_hostile import invoke, one_error_line

# --- sweeps' tables -----------------------------------------------------------------------------

FAKE = Path(__file__).parent / "fixtures" / "sweep_fake.toml"


@pytest.fixture
def fake_sweep(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))

    def run(out: Path) -> Path:
        result = invoke("sweep", FAKE, "--runner", "sweep_fake_runner", "--out", out)
        assert result.exit_code == 0, result.output
        return out

    return run


@pytest.mark.parametrize("column", ["accuracy", "wall_s"])
def test_a_non_numeric_cell_is_one_error_line_naming_it(column, fake_sweep, tmp_path):
    sweep_dir = fake_sweep(tmp_path / "sweep")
    lines = (sweep_dir / "results.csv").read_text().splitlines()
    header, row = lines[0].split(","), lines[1].split(",")
    row[header.index(column)] = "0.5x"
    (sweep_dir / "results.csv").write_text("\n".join([lines[0], ",".join(row), *lines[2:]]) + "\n")
    for args in (
        ["plot", "mano", sweep_dir],
        ["report", sweep_dir, "--out", tmp_path / "r.md"],
        ["sweep", FAKE, "--runner", "sweep_fake_runner", "--out", sweep_dir, "--dry-run"],
    ):
        if args[0] != "sweep" or column == "wall_s":  # a sweep reads its measured times, not the metrics
            one_error_line(invoke(*args), column, "'0.5x'", row[header.index("point_id")])


def test_report_copy_gives_each_sweep_of_one_experiment_its_own_folder(fake_sweep, tmp_path):
    first, second = fake_sweep(tmp_path / "first"), fake_sweep(tmp_path / "second")
    lines = (second / "results.csv").read_text().splitlines()
    (second / "results.csv").write_text("\n".join(lines[:3]) + "\n")  # two rows: tables that differ
    result = invoke("report", first, second, "--copy", "--out", tmp_path / "out" / "report.md")
    assert result.exit_code == 0, result.output
    copied = {d: (tmp_path / "out" / d / "results.csv").read_text().splitlines() for d in ("first", "second")}
    assert len(copied["first"]) == len((first / "results.csv").read_text().splitlines()) and len(copied["second"]) == 3
    report = (tmp_path / "out" / "report.md").read_text()
    assert "(first/results.csv)" in report and "(second/results.csv)" in report


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow  # two spawned workers import torch: tens of seconds on 2 cores
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from /proc")
def test_sweep_workers_die_with_a_killed_driver(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    slow = tmp_path / "sweep_fake.toml"  # every point 'trains' for a minute
    slow.write_text(FAKE.read_text().replace("steps = 5\nsleep = 0.0", "steps = 600\nsleep = 0.1"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "synthlab",
            "sweep",
            str(slow),
            "--runner",
            "sweep_fake_runner",
            "--out",
            str(tmp_path / "sweep"),
            "--jobs",
            "2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list((tmp_path / "sweep").rglob("starts.log"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # both workers are inside a point
        workers = [c for c in _children(driver.pid) if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
        assert len(workers) == 2
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 10
    while (
        any(
            Path(f"/proc/{w}").exists() and "Z" not in Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1][:3]
            for w in workers
        )
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert not [
        w
        for w in workers
        if Path(f"/proc/{w}").exists() and "Z" not in Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1][:3]
    ]


# --- network ------------------------------------------------------------------------------------


def test_the_ray_executor_never_starts_a_local_cluster(fake_sweep, tmp_path):
    one_error_line(
        invoke("sweep", FAKE, "--runner", "sweep_fake_runner", "--out", tmp_path / "s", "--executor", "ray"),
        "--ray-address",
    )
    assert not (tmp_path / "s" / "results.csv").exists()
