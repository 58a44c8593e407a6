"""benchmarks/cost_check.py (the GPU cost model against the real trainer on the CPU): its --quick run
writes the report and a calibration the cost model reads; and the calibration's CPU terms (the
device's peak, eager MFU) change the cost as stated. Timing is the benchmark's, not the tests'."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from synthlab.sweeps import cost, experiments, lab_runner

ROOT = Path(__file__).resolve().parents[1]


def test_a_calibrations_peak_and_eager_mfu_set_an_eager_points_hours():
    point = lab_runner.parse(experiments.load("capacity").points("gpu")[0].config)
    point = dataclasses.replace(point, train=point.train.replaced(compile=False))
    assumed = cost.gpu_cost(point, exact=True)
    assert assumed["mfu"] == cost.ASSUMED_MFU[False]
    d = str(point.model.d_model)
    calibration = {
        "peak_flops": cost.GPU_PEAK_FLOPS / 4,
        "eager_mfu_packed": {"sdpa": {d: {"layers": 0.5, "head": 0.5}}},
        "trainer_vs_bare": 0.8,
    }
    with cost.measured(calibration=calibration):
        measured = cost.gpu_cost(point, exact=True)
        compiled = cost.gpu_cost(dataclasses.replace(point, train=point.train.replaced(compile=True)))
    assert measured["mfu"] == pytest.approx(0.5 * 0.8)
    # the same FLOPs at 0.4 of a quarter of the peak instead of 0.25 of all of it
    assert measured["gpu_h"] == pytest.approx(assumed["gpu_h"] * 0.25 / (0.4 / 4))
    assert compiled["mfu"] == cost.ASSUMED_MFU[True]  # no compiled MFU measured: assumed
    rounded = cost.gpu_cost(point)
    assert rounded["gpu_h"] == round(assumed["gpu_h"], 2)


def test_part_mfus_recover_each_parts_rate_from_two_steps():
    """An oracle: step times made from known MFUs of the layers and the head give them back."""
    peak, rates = 1e12, {"layers": 0.4, "head": 0.1}
    shapes = [{"layers": 3e9, "head": 2e9}, {"layers": 18e9, "head": 2e9}]  # one layer; six

    def seconds(flops):
        return sum(n / (rates[p] * peak) for p, n in flops.items())

    got = cost.part_mfus([(f, seconds(f)) for f in shapes], peak)
    assert got == pytest.approx(rates)
    # a head lost in the noise (its time at or below zero): one rate for both, fitted to both steps
    noisy = cost.part_mfus([(shapes[0], 2.5e9 / (0.4 * peak)), (shapes[1], 20e9 / (0.4 * peak))], peak)
    assert noisy["head"] == noisy["layers"] == pytest.approx(0.4 * 425 / 412.5)
    with pytest.raises(ValueError, match="same proportion"):
        cost.part_mfus([(shapes[0], 1.0), ({k: 2 * v for k, v in shapes[0].items()}, 2.0)], peak)


def test_a_looped_point_runs_at_its_own_mix_of_the_parts_rates():
    """With a slow head (memory-bound softmax) and fast layers, four loops spend more of the step in
    the layers, so the looped point's MFU is higher than the plain one's, by the FLOPs-weighted
    harmonic mean of the two rates."""
    from synthlab.models import flops_per_token_parts

    point = lab_runner.parse(experiments.load("capacity").points("gpu")[0].config)
    point = dataclasses.replace(point, train=point.train.replaced(compile=False))
    d = str(point.model.d_model)
    calibration = {"eager_mfu_packed": {"sdpa": {d: {"layers": 0.4, "head": 0.1}}}, "trainer_vs_bare": 1.0}
    _, seq = cost.positions(point)
    mfus = {}
    with cost.measured(calibration=calibration):
        for loops in (1, 4):
            model = dataclasses.replace(point.model, loops=loops)
            mfus[loops] = cost.gpu_cost(dataclasses.replace(point, model=model), exact=True)["mfu"]
            parts = flops_per_token_parts(model, seq, all_steps=point.train.loss != "last")
            assert mfus[loops] == pytest.approx(sum(parts.values()) / (parts["layers"] / 0.4 + parts["head"] / 0.1))
    assert 0.1 < mfus[1] < mfus[4] < 0.4


@pytest.mark.slow  # calibration, a 30-step Mano run twice and two tiny bioS points: about a minute on 2 busy cores
def test_cost_check_quick_writes_the_report_and_a_calibration(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cost_check.py"), "--quick", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "cost_check.json").read_text())
    assert report["quick"] and report["within"] is None and report["torch_threads"] == 1
    calibration = cost.load_calibration(tmp_path / "cost_calibration.json")  # the format the dry run reads
    assert calibration["device"] == "cpu" and calibration["peak_flops"] > 0 and calibration["trainer_vs_bare"] > 0
    assert set(calibration["eager_mfu_packed"]["sdpa"]) == {"16"}
    assert all(v > 0 for v in calibration["eager_mfu_packed"]["sdpa"]["16"].values())
    assert len(report["points"]) == 2
    for row in report["points"]:
        p, m = row["predicted"], row["measured"]
        assert p["total_s"] == pytest.approx(p["compute_s"] + p["stall_s"] + p["eval_s"])
        assert set(m["stages_s"]) == {"train", "capacity"} and all(s > 0 for s in m["stages_s"].values())
        assert row["ratio"] == pytest.approx(m["total_s"] / p["total_s"])
        assert m["steps"] >= 1 and m["checkpoints_kept"] >= 1 and 0 < m["loop_s"] < m["stages_s"]["train"]
    assert "measured / predicted" in run.stdout
