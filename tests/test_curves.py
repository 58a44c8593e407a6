"""`synthlab curves`: training curves drawn from real tiny runs, one or many, and a sweep's runs by a factor."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.cli.train import resolve_run_config
from synthlab.errors import SynthlabError
from synthlab.plots.curves import collect
from synthlab.training.trainer import train
from synthlab_generators import TASKS, write_dataset

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished tiny mano runs: loops 1 and loops 2."""
    root = tmp_path_factory.mktemp("curves")
    spec = TASKS["mano"]
    data = write_dataset(spec, spec.params_cls(L=2, n_train=200, n_test=20, mod=5), 0, root / "data")
    made = []
    for loops in (1, 2):
        run = resolve_run_config(
            {},
            {"d_model": 16, "n_heads": 2, "n_layers": 1, "max_seq_len": 32, "loops": loops},
            {"task": "mano", "data": str(data), "steps": 8, "batch_size": 8, "log_every": 2},
        )
        train(root / f"loops{loops}", run, progress=False)
        made.append(root / f"loops{loops}")
    return made


def _svg_texts(path):
    """The texts of a matplotlib SVG (drawn as paths, each preceded by a comment holding its text)."""
    import re

    return set(re.findall(r"<!-- (.*?) -->", path.read_text()))


def test_curves_of_runs_overlaid_with_a_legend(runs, tmp_path):
    result = runner.invoke(app, ["curves", *map(str, runs), "--out", str(tmp_path / "fig")])
    assert result.exit_code == 0, result.output
    png, svg = tmp_path / "fig" / "curves.png", tmp_path / "fig" / "curves.svg"
    assert result.output.split() == [str(png), str(svg)]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    texts = _svg_texts(svg)
    assert {"loops1", "loops2", "loss per recurrent step (end)", "learning rate"} <= texts

    again = runner.invoke(app, ["curves", *map(str, runs), "--out", str(tmp_path / "again")])
    assert again.exit_code == 0 and (tmp_path / "again" / "curves.svg").read_bytes() == svg.read_bytes()


def test_a_sweep_folder_draws_its_runs_grouped_by_a_factor(runs, tmp_path):
    sweep = tmp_path / "sweep"
    rows = ["point_id,run_dir,loops,seed"]
    for i, run in enumerate(runs + runs):  # each setting twice, as two seeds would be
        shutil.copytree(run, sweep / "runs" / f"p{i}" / "model")
        rows.append(f"p{i},{sweep / 'runs' / f'p{i}'},{1 + i % 2},{i // 2}")
    (sweep / "results.csv").write_text("\n".join(rows) + "\n")

    result = runner.invoke(app, ["curves", str(sweep), "--by", "loops"])
    assert result.exit_code == 0, result.output
    texts = _svg_texts(sweep / "figures" / "curves.svg")
    assert {"loops=1", "loops=2"} <= texts and not {"p0", "p1"} & texts  # one legend entry per value
    # each run named by its factor and seed (the per-run panels' titles)
    assert [c.label for c in collect([sweep], by="loops")][:2] == ["loops=1, seed 0, p0", "loops=2, seed 0, p1"]
    (sweep / "results.csv").write_text("\n".join(rows + [rows[1].replace("p0,", "q0,", 1)]) + "\n")
    assert len(collect([sweep], by="loops")) == len(rows) - 1  # a second point on p0's model: still one curve

    result = runner.invoke(app, ["curves", str(sweep), "--by", "depth"])
    assert result.exit_code == 2 and "--by depth" in result.output and "loops" in result.output
    result = runner.invoke(app, ["curves", str(tmp_path)])
    assert result.exit_code == 2 and "neither a run folder" in result.output


def _tiny(data, **train_options):
    return resolve_run_config(
        {},
        {"d_model": 16, "n_heads": 2, "n_layers": 1, "max_seq_len": 32, "loops": 2},
        {"task": "mano", "data": str(data), "steps": 4, "batch_size": 8, "log_every": 2, **train_options},
    )


def test_tensorboard_logs_the_metrics_records(runs, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tmp_path / "run", _tiny(runs[0].parent / "data", tensorboard=True), progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    for tag, values in (
        ("loss", [r["loss"] for r in records]),
        ("loss_per_step/2", [r["loss_per_step"][1] for r in records]),
    ):
        logged = events.Scalars(tag)
        assert [e.step for e in logged] == [r["step"] for r in records]
        assert [e.value for e in logged] == pytest.approx(values, rel=1e-6)


def test_tensorboard_without_the_package_is_one_line_and_writes_nothing(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were not installed
    with pytest.raises(SynthlabError, match=r"^train.logging.tensorboard needs the tensorboard package: pip install"):
        train(tmp_path / "run", _tiny(runs[0].parent / "data", tensorboard=True), progress=False)
    assert not (tmp_path / "run").exists()
