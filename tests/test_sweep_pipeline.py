"""End to end with the real runner (generate -> train -> evaluate) on a tiny Mano grid."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synthlab import experiments, sweep

FIXTURE = Path(__file__).parent / "fixtures" / "mano_tiny.toml"
# Columns that measure time, or say where things are, legitimately differ between two runs.
VOLATILE = {"wall_s", "train_s", "run_dir"}


def _table(results: Path) -> list[tuple]:
    return sorted(tuple(sorted((k, v) for k, v in r.items() if k not in VOLATILE)) for r in sweep.read_rows(results))


def _cli(out: Path, preset: str) -> list[str]:
    return [str(Path(sys.executable).parent / "synthlab"), "sweep", str(FIXTURE), "--preset", preset, "--out", str(out)]


def test_smoke_sweep_end_to_end(tmp_path):
    results = sweep.run_sweep(experiments.load(FIXTURE), "smoke", tmp_path, progress=False)
    rows = {r["model"]: r for r in sweep.read_rows(results)}
    assert set(rows) == {"1x1", "1x2"}
    for row in rows.values():
        assert 0.0 <= float(row["accuracy"]) <= 1.0 and int(row["train_steps"]) == 12
        assert float(row["acc_step_" + row["loops"]]) == float(row["accuracy"])
        assert Path(row["run_dir"], "model", "checkpoint.pt").is_file()
    # a looped block is counted once; its FLOPs per step (the `last` loss reads out the last step only)
    assert rows["1x1"]["params"] == rows["1x2"]["params"]
    assert 1.5 < float(rows["1x2"]["train_flops"]) / float(rows["1x1"]["train_flops"]) < 2
    assert rows["1x1"]["acc_step_2"] == ""  # a 1-step model has no step-2 column value
    # one dataset, generated once for both points
    assert len([p for p in (tmp_path / "datasets").iterdir() if not p.name.startswith(".")]) == 1
    before = _table(results)
    sweep.run_sweep(experiments.load(FIXTURE), "smoke", tmp_path, progress=False)
    assert _table(results) == before


@pytest.mark.slow  # three sweeps in fresh interpreters (torch start-up each); the fast suite
# covers kill -9 with the cheap runner in test_sweep.py
def test_killed_real_sweep_resumes_from_checkpoints_to_the_same_table(tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cli(killed, "cpu"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list(killed.glob("runs/*/model/checkpoint.pt")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    checkpoints = list(killed.glob("runs/*/model/checkpoint.pt"))
    assert checkpoints and not list(killed.glob("runs/*/model/summary.json"))  # killed mid-training
    subprocess.run(_cli(killed, "cpu"), check=True, capture_output=True)
    subprocess.run(_cli(tmp_path / "clean", "cpu"), check=True, capture_output=True)
    table = _table(killed / sweep.RESULTS)
    assert len(table) == 2 and table == _table(tmp_path / "clean" / sweep.RESULTS)


@pytest.mark.parametrize("name", ["mano", "multihop", "reach"])
def test_cost_estimate_shapes_match_the_generated_data(name, tmp_path):
    # the dry run guesses vocabulary and row length before any data exists; check them on real data
    from synthlab import pipeline
    from synthlab.data import load_dataset
    from synthlab.train import prepare_run

    config = experiments.load(name).points("smoke")[0].config
    data_dir = pipeline.dataset(config, tmp_path)
    data = load_dataset(data_dir, config["task"])
    derived, _ = prepare_run(pipeline._run_config(config, data_dir, len(data.tokenizer)), data)
    vocab, seq = pipeline._shape_guess(config["task"], config["data"])
    assert vocab >= len(data.tokenizer) and vocab <= 2 * len(data.tokenizer) + 16
    assert seq == pytest.approx(derived["seq_len"], abs=2)
    # once the data is cached the estimate uses its exact shape
    assert pipeline._positions(config, tmp_path) == (derived["total_steps"], derived["seq_len"])


def test_eval_results_flatten_to_columns():
    from synthlab import pipeline

    result = {"accuracy": 0.5, "accuracy_at_trained_depth": 0.4, "answer_loss_per_step": [2.0, 1.0],
              "eval_steps": 2, "accuracy_per_step": [0.4, 0.5], "agreement": [[1.0, 0.7], [0.7, 1.0]],
              "exit_accuracy": 0.45, "mean_exit_step": 1.5}
    plain = pipeline.eval_metrics(result, pipeline.EvalOptions())
    assert plain["acc_step_2"] == plain["accuracy"] == 0.5 and "agree_1_2" not in plain
    exits = pipeline.eval_metrics(result, pipeline.EvalOptions(exit="q:0.8", agreement=True))
    assert (exits["strategy"], exits["threshold"], exits["accuracy"]) == ("q", 0.8, 0.45)
    assert exits["agree_1_2"] == exits["agree_2_1"] == 0.7


def test_definitions_are_checked_against_the_real_config_classes():
    import tomllib

    from synthlab.errors import SynthlabError

    raw = tomllib.loads(FIXTURE.read_text())
    raw["base"]["model"]["d_modle"] = 32
    with pytest.raises(SynthlabError, match="did you mean 'd_model'"):
        experiments.validate_points(experiments.parse(raw), "smoke")
    raw = tomllib.loads(FIXTURE.read_text())
    raw["presets"]["smoke"]["grid"]["data.L"] = [0]
    with pytest.raises(SynthlabError, match="--L"):
        experiments.validate_points(experiments.parse(raw), "smoke")


def test_dry_run_of_a_shipped_experiment_estimates_every_point(tmp_path):
    from typer.testing import CliRunner

    from synthlab.cli import app

    result = CliRunner().invoke(app, ["sweep", "capacity", "--preset", "gpu", "--dry-run", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "30 points, 30 to run" in result.output and "(estimated)" in result.output and "?" not in result.output
    assert not (tmp_path / "results.csv").exists()
