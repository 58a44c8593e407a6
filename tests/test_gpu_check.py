"""benchmarks/gpu_check.sh --dry-run: the GPU check's code on the CPU at tiny sizes, so the script
cannot rot between runs on a GPU (it is run once, for real, when a device is lent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # four fresh interpreters and two torch.compile traces: about two minutes on 2 cores
def test_gpu_check_dry_run_writes_every_part(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert all(f"{p}=0" in run.stdout for p in ("throughput", "learn", "ouroboros", "calibrate")), run.stdout[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert all(report[p]["done"] and report[p]["dry_run"] for p in ("throughput", "learn", "ouroboros"))
    speed = report["throughput"]
    for case in ("mano_eager", "reference_eager", "mano_compiled", "reference_compiled"):
        assert speed[case]["tokens_per_s"] > 0
    # the reference GPT has the Mano model's FLOPs: the same work, so the ratio compares overhead
    assert speed["shape"]["train_flops_per_step"] == speed["shape"]["reference_flops_per_step"]
    assert 0 <= report["learn"]["accuracy"]["one_operator_train_prompts"] <= 1
    assert report["ouroboros"]["system"]["trainable"]["total"] > 0
    calibrate = report["calibrate"]  # the cost model's inputs, tiny on the CPU
    assert calibrate["done"] and calibrate["trainer"]["tokens_per_s"] > 0 and calibrate["bare_loop"]["tokens_per_s"] > 0
    assert json.loads((tmp_path / "cost_calibration.json").read_text())["dry_run"] is True
    assert "skipped" in report["pytest"]["summary"]  # no GPU here: the cuda tests are collected, skipped
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU check")
