"""benchmarks/gpu_all.sh --dry-run: every part of the one-call GPU measurement on the CPU at toy
sizes, so the script cannot rot between the rare runs on a GPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("check", "learn", "calibrate", "pytest", "capacity", "cost", "mfu")


@pytest.mark.slow  # about a dozen fresh interpreters: 4 minutes on 2 busy cores
def test_gpu_all_dry_run_runs_every_part_within_its_stated_budget(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_all.sh"), "--dry-run", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    # the GPU limits, printed first, sum (kills included) to at most 12 minutes
    limits = run.stdout.splitlines()[0]
    assert limits.startswith("limits (s, each +10 to kill)")
    assert int(re.search(r"at most (\d+) s in all", limits).group(1)) <= 720
    assert all(f"{p}=0" in run.stdout.splitlines()[-1] for p in PARTS), run.stdout[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    for name in ("learn", "calibrate", "cost_check", "mfu"):
        assert report[name]["done"] and report[name]["dry_run"], name
    assert "skipped" in report["pytest"]["summary"]  # no GPU here: the cuda tests are collected, skipped
    assert len(report["cost_check"]["chosen"]) == 2  # a plain and a looped gpu-preset point
    for row in report["cost_check"]["points"]:
        assert row["ratio_assumed"] == pytest.approx(row["measured"]["total_s"] / row["predicted_assumed"]["total_s"])
    assert {k for k in report["mfu"] if re.fullmatch(r"d\d+_\w+", k)} == {"d16_eager", "d32_eager"}
    capacity = json.loads((out / "capacity" / "gpu_capacity.json").read_text())
    cases = capacity["cases"]
    assert cases[0]["status"] == "done" and cases[0]["preset"] == "calib64"
    assert cases[-1]["preset"] == "calib1000-64"
    done = [c for c in cases if c["status"] == "done"]
    assert all(c["status"].split(":")[0] in {"done", "not run", "stopped"} for c in cases)
    for model, peak in capacity["peaks"].items():  # the best bits/param over the N each model finished
        assert peak["bits_per_param"] == max(c["bits_per_param"] for c in done if c["model"] == model)
    assert (out / "capacity" / "gpu_capacity.md").read_text().count("Peak bits/param per model") == 1


def test_gpu_all_refuses_to_run_without_an_output_folder():
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_all.sh")], env=env, capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("error: no output folder")
