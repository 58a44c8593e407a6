"""benchmarks/bench_learning_grid.sh and bench_learning_seeds.py: a grid of real (tiny) bench runs is
summarised as paired differences over seeds, and the verdict rule reads the intervals' signs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_learning_seeds as seeds  # noqa: E402


def write_run(folder: Path, name: str, syn: float, ref: float) -> None:
    pd.DataFrame(
        [{"step": 10, "syn_train_acc_l1": syn, "ref_train_acc_l1": ref, "syn_acc_l2": 0.5, "ref_acc_l2": 0.5}]
    ).to_csv(folder / f"{name}.csv", index=False)


def test_verdict_reads_the_interval(tmp_path):
    rng = np.random.default_rng(0)
    for seed in range(6):
        ref = 0.8 + 0.01 * rng.standard_normal()
        write_run(tmp_path, f"mano_behind_s{seed}", ref - 0.1, ref)  # synthlab clearly behind
        write_run(tmp_path, f"mano_noisy_s{seed}", ref + (0.05 if seed % 2 else -0.05), ref)  # mean 0
    table = seeds.paired(seeds.read_runs([tmp_path]))
    verdict = dict(zip(seeds.verdicts(table)["candidate"], seeds.verdicts(table)["verdict"]))
    assert verdict["behind"] == "below at train_acc_l1@10"
    assert verdict["noisy"] == "at or above"
    row = table[(table.candidate == "behind") & (table.metric == "train_acc_l1")].iloc[0]
    assert row.n == 6 and row["diff"] == pytest.approx(-0.1) and row.high < 0 and row.seeds_at_or_above == 0


def test_nats_are_oriented_lower_is_better(tmp_path):
    for seed in range(3):
        pd.DataFrame(
            [
                {
                    "step": 5,
                    "syn_name_nats": 5.0 + seed * 0.01,
                    "ref_name_nats": 6.0,
                    "syn_attr_acc": 1.0,
                    "ref_attr_acc": 0.5,
                }
            ]
        ).to_csv(tmp_path / f"bios_x_s{seed}.csv", index=False)
    table = seeds.paired(seeds.read_runs([tmp_path]))
    nats = table[table.metric == "name_nats"].iloc[0]
    assert nats["diff"] == pytest.approx(0.99) and nats.low > 0


@pytest.mark.slow
def test_grid_runs_and_summarises_real_runs(tmp_path):
    args = tmp_path / "args.txt"
    args.write_text(
        "".join(
            f"--task mano --seed {s} --steps 6 --eval-at 3,6 --max-eval 20 --data n_train=500,n_test=20 "
            f"--out g/mano_tiny_s{s}\n"
            for s in range(2)
        )
    )
    out = tmp_path / "out"
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "bench_learning_grid.sh"), str(args), str(out), "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},  # the interpreter running the tests, not PATH's python3
    )
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (out / "g").glob("*.csv")) == ["mano_tiny_s0.csv", "mano_tiny_s1.csv"]
    table = seeds.paired(seeds.read_runs([out / "g"]))
    assert set(table.step) == {3, 6} and set(table.n) == {2}
    configs = seeds.configs([out / "g"])
    assert (
        list(configs) == ["mano_tiny"] and configs["mano_tiny"]["synthlab"]["train"]["schedule"]["warmup_steps"] == 50
    )
    json.dumps(configs)
