"""benchmarks/gpu_capacity.py: its cases are the capacity presets' grid (widths, N per data
ceiling, per-arm learning rates), read from experiments/capacity.toml, with the loop arms and the
larger N added; and its refusals. The whole path runs in tests/test_gpu_all.py (the dry run)."""

import copy
import sys
from pathlib import Path

import pandas as pd
import pytest

from synthlab import SynthlabError
from synthlab.sweeps import experiments

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_capacity  # noqa: E402


def preset(name):
    return [p for p in experiments.load("capacity").points(name) if p.factors["seed"] == 0]


def test_the_cases_are_the_presets_points_at_each_arm_then_a_larger_n():
    cases = gpu_capacity.cases(gpu_capacity.parse_args(["--out", "x"]))
    calib64, calib1000 = preset("calib64"), preset("calib1000-64")
    grid = [(p.config["model"]["n_layers"], p.config["data"]["n_people"]) for p in calib64]
    # calib64's points at loops 1, then the same points at loops 4 (the same unique parameters)
    for i, loops in enumerate((1, 4)):
        block = cases[i * len(grid) : (i + 1) * len(grid)]
        assert [(c["config"]["model"]["n_layers"], c["config"]["data"]["n_people"]) for c in block] == grid
        assert {c["config"]["model"]["loops"] for c in block} == {loops}
        for case, point in zip(block, calib64):  # everything else as the preset says, on the GPU
            expected = copy.deepcopy(point.config)
            expected["model"]["loops"] = loops
            expected["train"].update(device="auto", compile=True)
            assert case["config"] == expected
    # then each model's larger N (2 x its largest), both arms
    larger = cases[2 * len(grid) : 2 * len(grid) + 4]
    assert [
        (c["config"]["model"]["n_layers"], c["config"]["data"]["n_people"], c["config"]["model"]["loops"])
        for c in larger
    ] == [(1, 2 * 14646, 1), (2, 2 * 23701, 1), (1, 2 * 14646, 4), (2, 2 * 23701, 4)]
    # then calib1000-64's own two arms, at its exposures and rates
    assert [c["config"] for c in cases[2 * len(grid) + 4 :]] == [
        {**p.config, "train": {**p.config["train"], "device": "auto", "compile": True}} for p in calib1000
    ]
    assert cases[0]["label"] == "d64-L1 loops 1 100x N3447" and cases[-1]["label"] == "d64-L1 loops 4 1000x N7109"
    assert len({c["label"] for c in cases}) == len(cases)


def test_each_arm_takes_its_rate_from_the_presets_and_two_rates_are_refused():
    points = preset("calib1000-64")
    assert gpu_capacity.arm_rates(points) == {1: 3e-3, 4: 3e-3}
    looped = copy.deepcopy(points[1])
    looped.config["train"]["lr"] = 1e-3
    assert gpu_capacity.arm_rates([points[0], looped]) == {1: 3e-3, 4: 1e-3}
    with pytest.raises(SynthlabError, match="loops 4 two learning rates"):
        gpu_capacity.arm_rates([*points, looped])


def test_refuses_a_full_run_without_cuda_and_a_used_out_folder(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(SynthlabError, match="not empty"):
        gpu_capacity.main(["--dry-run", "--out", str(tmp_path)])
    if not __import__("torch").cuda.is_available():
        with pytest.raises(SynthlabError, match="no CUDA device"):
            gpu_capacity.main(["--out", str(tmp_path / "new")])


def test_a_screen_preset_runs_its_points_as_they_are_and_reports_each_arms_rate():
    cases = gpu_capacity.cases(gpu_capacity.parse_args(["--out", "x", "--presets", "screen1000-64"]))
    points = experiments.load("capacity").points("screen1000-64")
    assert [c["config"] for c in cases] == [
        {**p.config, "train": {**p.config["train"], "device": "auto", "compile": True}} for p in points
    ]
    assert {(c["config"]["model"]["loops"], c["config"]["train"]["lr"]) for c in cases} == {
        (t, lr) for t in (1, 4) for lr in (7.5e-4, 1.5e-3, 3e-3, 6e-3)
    }
    assert {c["config"]["train"]["seed"] for c in cases} == {100} and all(c["screen"] for c in cases)
    assert cases[0]["label"] == "d64-L1 loops 1 1000x lr 0.0015 N7109"

    def row(loops, lr, bits=None, screen=True):
        done = {"status": "done", "ceiling": 3.0, "bits_per_param": bits, "fraction_of_max": 0.4, "seconds": 9}
        return {"label": f"{loops} {lr}", "preset": "screen1000-64", "screen": screen, "loops": loops, "lr": lr} | (
            done if bits is not None else {"status": "not run: budget spent"}
        )

    rows = [row(1, 1.5e-3, 1.20), row(1, 3e-3, 1.30), row(1, 6e-3, 1.305), row(4, 1.5e-3, 0.9), row(4, 3e-3, 0.7)]
    rows += [row(4, 6e-3), row(1, 1e-2, 9.0, screen=False)]

    def chosen(rows):
        [(preset, _, arms)] = gpu_capacity.screen_choices(rows)  # the non-screen row is left out
        return preset, arms.set_index("loops")

    preset, arms = chosen(rows)  # loops 4 waits for its third rate
    assert preset == "screen1000-64" and arms.loc[1, "chosen"] == 3e-3  # the lower rate within 0.01
    assert pd.isna(arms.loc[4, "chosen"]) and arms.loc[4, "finished"] == 2
    text = gpu_capacity.markdown(rows, {})
    assert "- loops 1: **train.lr 0.003**" in text and "- loops 4: waiting (2 of 3 settings finished" in text
    rows[5] = row(4, 6e-3, 0.89)  # loops 4's best is its lowest rate: the grid's edge, not taken
    assert pd.isna(chosen(rows)[1].loc[4, "chosen"]) and chosen(rows)[1].loc[4, "edge"] == 1.5e-3
    assert "- loops 4: at the grid's edge (train.lr 0.0015 is best" in gpu_capacity.markdown(rows, {})
    assert "Choice" not in gpu_capacity.markdown(rows[-1:], {})


@pytest.mark.slow
def test_the_screen_dry_run_trains_every_arm_at_every_rate_and_names_each_arms_rate(tmp_path):
    out = tmp_path / "screen"
    gpu_capacity.main(["--dry-run", "--presets", "screen1000-64", "--budget-s", "600", "--out", str(out)])
    report = __import__("json").loads((out / "gpu_capacity.json").read_text())
    assert [c["status"] for c in report["cases"]] == ["done"] * 8
    assert {(c["loops"], c["lr"]) for c in report["cases"]} == {
        (t, lr) for t in (1, 4) for lr in (7.5e-4, 1.5e-3, 3e-3, 6e-3)
    }
    [(_, _, arms)] = gpu_capacity.screen_choices(report["cases"])
    text = (out / "gpu_capacity.md").read_text()
    assert arms["loops"].tolist() == [1, 4] and all(  # each arm's line: taken, or at the grid's edge
        f"- loops {t}: **train.lr" in text or f"- loops {t}: at the grid's edge" in text for t in (1, 4)
    )
    # 1000-exposure runs: bits/param at each kept checkpoint (two at the toy size), the last the row's own
    for case in report["cases"]:
        steps = [s for s, _ in case["curve"]]
        assert (
            len(steps) == 2 and steps == sorted(steps) and case["curve"][-1][1] == pytest.approx(case["bits_per_param"])
        )
    assert text.count("@") >= 12 and "Learning curves" in text


def test_seeds_run_each_point_at_each_seed_and_the_peak_is_the_mean_over_them():
    cases = gpu_capacity.cases(gpu_capacity.parse_args(["--out", "x", "--presets", "calib1000-64", "--seeds", "0,1,2"]))
    assert [(c["config"]["model"]["loops"], gpu_capacity.seed_of(c["config"])) for c in cases] == [
        (t, s) for t in (1, 4) for s in (0, 1, 2)
    ]
    assert cases[0]["label"] == "d64-L1 loops 1 1000x N7109 seed 0" and len({c["label"] for c in cases}) == 6

    def done(case, n, bits_per_param, fraction=0.3):
        case = copy.deepcopy(case)
        case["config"]["data"]["n_people"] = n
        params = 1000
        row = {"bits": bits_per_param * params, "bits_per_param": bits_per_param, "params": params}
        row |= {"params_capacity": params, "max_bits": bits_per_param * params / fraction, "fraction_of_max": fraction}
        return case | {"status": "done", "row": row}

    plain = [c for c in cases if c["config"]["model"]["loops"] == 1]
    # N 100 reads 1.0 and 1.2 (mean 1.1), N 200 reads 1.15 once: the peak is N 200 with one seed, no error
    rows, peaks = gpu_capacity.summary(
        [
            done(plain[0], 100, 1.0),
            done(plain[1], 100, 1.2),
            done(plain[2], 200, 1.15),
            cases[3] | {"status": "waiting"},
        ]
    )
    [(model, peak)] = peaks.items()
    assert model == "d64-L1 loops 1 1000x" and (peak["n_people"], peak["seeds"], peak["se"]) == (200, 1, None)
    assert [r["seed"] for r in rows] == [0, 1, 2, 0] and rows[-1]["status"] == "waiting"
    # with N 200 at 1.05 the peak is N 100's mean over its two seeds, with their standard error
    peak = gpu_capacity.summary([done(plain[0], 100, 1.0), done(plain[1], 100, 1.2), done(plain[2], 200, 1.05)])[1][
        model
    ]
    assert peak["bits_per_param"] == pytest.approx(1.1) and peak["se"] == pytest.approx(0.1) and peak["seeds"] == 2
    assert "1.100 bits/param (± 0.100 over 2 seeds) at N 100" in gpu_capacity.markdown(rows, {model: peak})


def test_a_bad_seed_list_is_one_usage_line(capsys):
    for bad in ("0,x", "-1"):
        with pytest.raises(SystemExit):
            gpu_capacity.parse_args(["--out", "x", "--seeds", bad])
        assert "--seeds" in capsys.readouterr().err
