"""`synthlab publish`: a sweep run in several sittings lands in one results folder, nothing published
before lost: rows kept byte for byte, the first run's start kept, curves named by their factors."""

from __future__ import annotations

import json
import shutil

import pytest
from test_sweep import FAKE, RUNNER, _table  # the sweep tests' fake grid and runner
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.sweeps import driver, experiments, results_table
from synthlab.sweeps.publish import _part, merged_record, publish


def _sitting(tmp_path, name, only=(), table_from=None):
    """One sitting's sweep folder: started from a copy of a published table, as a resumed run is."""
    out = tmp_path / name
    if table_from is not None:
        out.mkdir()
        shutil.copyfile(table_from / "results.csv", out / "results.csv")
    driver.run_sweep(experiments.load(FAKE), "smoke", out, runner=RUNNER, progress=False, only=list(only))
    return out


def test_two_sittings_publish_to_the_whole_table_with_the_first_start_and_first_rows_kept(tmp_path):
    dest = tmp_path / "results" / "smoke"
    first = _sitting(tmp_path, "first", only=["arch=b"])
    assert publish(first, dest).rows_added == 4
    published_text = (dest / "results.csv").read_text()
    began = json.loads((first / "sweep.json").read_text())["data_began"]

    second = _sitting(tmp_path, "second", table_from=dest)
    assert "data_began" not in json.loads((second / "sweep.json").read_text())  # why publish keeps the first's
    assert publish(second, dest).rows_added == 4
    whole = _sitting(tmp_path, "whole")
    assert _table(dest / "results.csv") == _table(whole / "results.csv")
    assert (dest / "results.csv").read_text().startswith(published_text)  # the first rows, byte for byte
    record = json.loads((dest / "sweep.json").read_text())
    assert record["data_began"] == began and record["preset"] == "smoke" and "stores" not in record
    assert not (dest / "results.csv.lock").exists()
    assert publish(second, dest).rows_added == 0  # publishing again changes nothing


def test_learning_curves_are_copied_under_their_varying_factors_and_missing_ones_named(tmp_path):
    sweep = _sitting(tmp_path, "sweep", only=["arch=a", "data.size=10"])
    rows = results_table.read_rows(sweep / "results.csv")
    model = sweep / "runs" / rows[0]["run_dir"].rsplit("/", 1)[-1] / "model"
    model.mkdir()
    (model / "metrics.jsonl").write_text("{}\n")
    (model / "capacity_curve.csv").write_text("exposures,bits_per_param\n1,0.5\n")
    (model / "capacity_checkpoint5.json").write_text("{}")
    published = publish(sweep, tmp_path / "dest")
    # named by every factor that varies over the grid, though only arch a and size 10 have run
    names = [f"size10-a-probe{p}" for p in (1, 2)]
    assert sorted(published.curves.values()) == [str(tmp_path / "dest" / "curves" / n) for n in names]
    folder = tmp_path / "dest" / "curves" / names[0]
    assert sorted(p.name for p in folder.iterdir()) == ["capacity_checkpoint5.json", "capacity_curve.csv"]
    assert not published.without_curve

    other = _sitting(tmp_path, "other", only=["arch=b", "data.size=10"])
    result = CliRunner().invoke(app, ["publish", str(other), str(tmp_path / "dest")])
    assert result.exit_code == 0 and result.output.count("no learning curve for") == 2


def test_a_folder_of_another_sweep_or_of_other_files_is_refused_before_anything_is_written(tmp_path):
    sweep = _sitting(tmp_path, "sweep", only=["arch=a", "data.size=10"])
    other = tmp_path / "other"
    other.mkdir()
    (other / "sweep.json").write_text(json.dumps({"experiment": "sweep_fake", "preset": "cpu"}))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("mine")
    for dest, message in [(other, "holds sweep sweep_fake/cpu"), (notes, "publish into a new folder")]:
        before = sorted(p.name for p in dest.iterdir())
        with pytest.raises(SynthlabError, match=message):
            publish(sweep, dest)
        assert sorted(p.name for p in dest.iterdir()) == before
    result = CliRunner().invoke(app, ["publish", str(tmp_path / "missing"), str(tmp_path / "x")])
    assert result.exit_code != 0 and "error: " in result.output and "not a sweep" in result.output
    assert not (tmp_path / "x").exists()


def test_merged_record_keeps_every_command_once_and_the_earliest_times():
    held = {"commands": ["a", "b"], "data_began": "2026-01-02T00:00:00+00:00", "rules": {"r": "2026-01-02"}}
    new = {"commands": ["b", "c"], "rules": {"r": "2026-01-03", "s": "2026-01-04"}, "stores": {"runs": "/x"}}
    record = merged_record(held, new)
    assert record["commands"] == ["a", "b", "c"] and record["data_began"] == held["data_began"]
    assert record["rules"] == {"r": "2026-01-02", "s": "2026-01-04"} and "stores" not in record
    assert merged_record({}, {"data_began": "2026-01-05", "commands": []})["data_began"] == "2026-01-05"


@pytest.mark.parametrize(
    "column, value, part",
    [
        ("train.lr", "0.003", "lr3e-3"),
        ("train.lr", "0.0015", "lr1.5e-3"),
        ("loops", "4", "loops4"),
        ("seed", "0", "seed0"),
        ("size", "d64-L1 N7109", "d64-L1_N7109"),
    ],
)
def test_curve_folder_names_read_as_the_factor_and_its_value(column, value, part):
    assert _part(column, value) == part
