"""docs/experiments.md is enough to write an experiment: its worked example, copied as written into a
folder of its own, sweeps its only preset, plots with the generic figure and reports under its real
path."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.sweeps import experiments

DOC = Path(__file__).resolve().parents[1] / "docs" / "experiments.md"


def worked_example() -> str:
    """The TOML block that follows the worked-example marker in the doc."""
    text = DOC.read_text()
    found = re.search(r"<!-- worked example:.*?-->\s*```toml\n(.*?)```", text, re.S)
    assert found, "docs/experiments.md lost its worked example"
    return found.group(1)


def cli(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_worked_example_runs_end_to_end_from_its_own_folder(tmp_path):
    definition = tmp_path / "mine" / "isoflop.toml"
    definition.parent.mkdir()
    definition.write_text(worked_example())
    experiment = experiments.load(definition)
    assert list(experiment.presets) == ["smoke"] and experiment.plot == ""  # no cpu / gpu preset, no plot kind

    out = tmp_path / "sweep"
    cli("sweep", definition, "--preset", "smoke", "--out", out)
    table = pd.read_csv(out / "results.csv")
    assert sorted(zip(table["arch"], table["seed"])) == [("1x2", 0), ("1x2", 1), ("2x1", 0), ("2x1", 1)]
    assert table["accuracy"].between(0, 1).all()

    printed = cli("plot", definition, out)
    assert (out / "figures" / "isoflop.png").is_file() and "isoflop.svg" in printed

    report = tmp_path / "report" / "report.md"
    cli("report", out, "--out", report)
    text = report.read_text()
    assert f"definition `{experiments.shown_path(definition)}`" in text  # where it really lives, not experiments/
    assert experiments.shown_path(definition).endswith("mine/isoflop.toml")
    assert "![isoflop](isoflop/isoflop.png)" in text and (report.parent / "isoflop" / "isoflop.png").is_file()
    assert "C2, Loop 1x2 is within 10 points of the iso-FLOP Base 2x1: **" in text
    assert "| C2 | isoflop |" in text  # the claims table

    index = tmp_path / "site" / "README.md"
    cli("report", out, "--out", index, "--index")
    page = (index.parent / "isoflop" / "README.md").read_text()
    assert page.startswith("[All results](../README.md)") and "![isoflop](isoflop.png)" in page
    assert "definition `" in page and (index.parent / "isoflop" / "isoflop.png").is_file()
    head = index.read_text()
    assert "[isoflop](isoflop/README.md)" in head and "2 seeds (`smoke`)" in head
    assert "| C2 | Loop 1x2 is within 10 points of the iso-FLOP Base 2x1: accuracy[" in head

    # a second sweep of the experiment, in a folder inside the index's, gets a page of its own there
    site = tmp_path / "site2"
    for folder in ("isoflop", "isoflop/more"):
        (site / folder).mkdir(parents=True)
        for name in ("results.csv", "sweep.json"):
            shutil.copy(out / name, site / folder / name)
    notes = tmp_path / "notes.toml"
    notes.write_text('isoflop = "the first reading"\n"isoflop/more" = "the second reading"\n')
    cli("report", site / "isoflop", site / "isoflop" / "more", "--out", site / "README.md", "--index", "--notes", notes)
    head = (site / "README.md").read_text()
    assert "[isoflop](isoflop/README.md)" in head and "[isoflop/more](isoflop/more/README.md)" in head
    assert head.count("| C2 | Loop 1x2 is within 10 points") == 2  # one verdict per sweep
    first, second = ((site / f / "README.md").read_text() for f in ("isoflop", "isoflop/more"))
    assert first.startswith("[All results](../README.md)") and "Reading: the first reading" in first
    assert second.startswith("[All results](../../README.md)") and "Reading: the second reading" in second
    assert "![isoflop](isoflop.png)" in second and (site / "isoflop" / "more" / "isoflop.png").is_file()
    # a sweep from elsewhere named like one inside would share its page: refused in one line
    shutil.copytree(out, site / "sweep")
    result = CliRunner().invoke(
        app, ["report", str(out), str(site / "sweep"), "--out", str(site / "README.md"), "--index"]
    )
    assert result.exit_code == 2 and "two sweeps would share the page sweep/README.md" in result.output

    # the same table under a preset marked a screen: reported, and no rule decided on it
    definition.write_text(worked_example().replace("[presets.smoke]\n", "[presets.smoke]\nscreen = true\n", 1))
    assert experiments.load(definition).is_screen("smoke") and experiments.load(definition).points("smoke")
    cli("report", out, "--out", tmp_path / "screen" / "report.md")
    text = (tmp_path / "screen" / "report.md").read_text()
    assert "Verdict: none: `smoke` is a screen" in text and "| C2 |" not in text and "C2, Loop 1x2" not in text
    assert "Preset `smoke`: 4 of 4 grid points finished" in text  # same points: the key changes no id
    # its stated choice, applied to the table: the arch with the higher mean accuracy over seeds
    chosen = table.groupby("arch")["accuracy"].mean()
    chosen = min(a for a in chosen.index if chosen[a] == chosen.max())
    choose = '[presets.smoke.choose]\nsetting = "arch"\nmetric = "accuracy"\n'
    definition.write_text(worked_example().replace("[presets.smoke]\n", "[presets.smoke]\nscreen = true\n", 1) + choose)
    cli("report", out, "--out", tmp_path / "screen" / "report.md")
    text = (tmp_path / "screen" / "report.md").read_text()
    assert "Choice (the screen's stated rule: it takes the arch with the most accuracy):" in text
    assert f"- all: **arch {chosen}** (accuracy by setting: 1x2: " in text


def test_screen_is_true_or_false_and_a_preset_like_a_screen_is_one(tmp_path):
    raw = worked_example().replace("[presets.smoke]\n", "[presets.smoke]\nscreen = 1\n", 1)
    (tmp_path / "isoflop.toml").write_text(raw)
    with pytest.raises(SynthlabError, match="presets.smoke: screen must be true or false, got 1"):
        experiments.load(tmp_path / "isoflop.toml")
    raw = worked_example().replace("[presets.smoke]\n", "[presets.smoke]\nscreen = true\n", 1)
    (tmp_path / "isoflop.toml").write_text(
        raw + '\n[presets.again]\nlike = "smoke"\n[presets.decides]\nlike = "smoke"\nscreen = false\n'
    )
    experiment = experiments.load(tmp_path / "isoflop.toml")
    assert [experiment.is_screen(p) for p in ("smoke", "again", "decides")] == [True, True, False]
    assert not experiments.load("capacity").is_screen("calib1000-64") and experiments.load("capacity").is_screen(
        "screen1000-64"
    )


def test_a_preset_the_definition_lacks_is_one_error_line(tmp_path):
    definition = tmp_path / "isoflop.toml"
    definition.write_text(worked_example())
    result = CliRunner().invoke(app, ["sweep", str(definition), "--preset", "cpu", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "unknown preset 'cpu' for isoflop (have smoke)" in result.output


def test_a_definition_needs_one_preset_and_its_own_file_name(tmp_path):
    raw = worked_example()
    (tmp_path / "isoflop.toml").write_text(raw.split("[presets.smoke]")[0])
    with pytest.raises(SynthlabError, match="missing key 'presets'"):
        experiments.load(tmp_path / "isoflop.toml")
    (tmp_path / "other.toml").write_text(raw)
    with pytest.raises(SynthlabError, match="does not match the file name"):
        experiments.load(tmp_path / "other.toml")


def test_the_report_names_a_shipped_definition_by_its_place_in_the_repository():
    assert experiments.shown_path(str(experiments.builtin_dir() / "mano.toml")) == "experiments/mano.toml"
    assert experiments.shown_path("/elsewhere/checkout/experiments/mano.toml") == "experiments/mano.toml"
    assert experiments.shown_path("/elsewhere/mine/isoflop.toml") == "/elsewhere/mine/isoflop.toml"
    assert experiments.shown_path("results/scaling/pilots/scaling.toml") == "results/scaling/pilots/scaling.toml"


def test_kept_definitions_beside_results_reproduce_their_runs():
    """Pilots and past grids live beside their results (results/<experiment>/...) with the definition
    they ran under: every such sweep's preset expands to exactly the point ids its table holds."""
    import json

    root = Path(__file__).resolve().parents[1]
    checked = 0
    for info_path in sorted((root / "results").rglob("sweep.json")):
        info = json.loads(info_path.read_text())
        definition = root / info.get("definition", "")
        if not definition.is_relative_to(root / "results") or not definition.is_file():
            continue
        ids = {p.point_id for p in experiments.load(definition).points(info["preset"])}
        assert ids == set(pd.read_csv(info_path.parent / "results.csv")["point_id"]), info_path
        checked += 1
    assert checked >= 6  # the five scaling pilots and the one-layer grid


def test_shipped_definitions_still_give_the_point_ids_of_their_committed_results():
    """Every committed sweep of a shipped definition (sweep.json naming experiments/<name>.toml): the
    point ids its results.csv holds are among those the definition gives now, so the way configs are
    read (nested sections, renamed keys) moved no point. A preset may since have been renamed (a
    point ran as `calib100` that `calib100-screened` now names): all the definition's presets count.
    Folders under `earlier/` ran under earlier versions of their presets (their README says so)."""
    import json

    root = Path(__file__).resolve().parents[1]
    checked = 0
    for info_path in sorted((root / "results").rglob("sweep.json")):
        info = json.loads(info_path.read_text())
        definition = Path(info.get("definition", ""))
        if definition.parent.name != "experiments" or "earlier" in info_path.relative_to(root).parts:
            continue
        experiment = experiments.load(experiments.builtin_dir() / definition.name)
        assert info["preset"] in experiment.presets, info_path
        ids = {p.point_id for preset in experiment.presets for p in experiment.points(preset)}
        table = pd.read_csv(info_path.parent / "results.csv")
        assert set(table["experiment"]) == {experiment.name}, info_path
        assert set(table["point_id"]) <= ids, info_path
        checked += 1
    assert checked >= 25  # each experiment's main table, its confirmatory rerun, the capacity calibration


def test_index_pages_rebase_links_and_state_scale():
    from synthlab.report import results_index as ri

    old, new = Path("/r"), Path("/r/scaling")
    text = "see [pilots](scaling/pilots/README.md), [fig](scaling/a.png), [claims](../docs/claims.md), [web](https://x.org/a)"
    assert ri.rebase_links(text, old, new) == (
        "see [pilots](pilots/README.md), [fig](a.png), [claims](../../docs/claims.md), [web](https://x.org/a)"
    )
    table = pd.DataFrame({"params": [28_500, 409_000, 409_000], "tokens": [1.79e6] * 3, "seed": [0, 1, 2]})
    assert ri.scale(table) == "28K-410K params, 1.8M tokens, 3 seeds"
    assert ri.scale(pd.DataFrame({"params": [658_752]})) == "660K params, 1 seed"


def test_the_generic_figure_draws_a_numeric_axis_as_lines_and_names_a_missing_metric(tmp_path):
    from synthlab.plots import generic

    table = pd.DataFrame(
        {
            "d_model": [32, 32, 512, 512] * 2,
            "loops": [1, 4] * 4,
            "seed": [0] * 4 + [1] * 4,
            "eval_loss": [1.0, 0.9, 0.5, 0.4, 1.1, 0.8, 0.6, 0.3],
        }
    )
    paths = generic.plot_grid(table, tmp_path, "mine", ["seed", "d_model", "loops"], "eval_loss")
    assert [p.name for p in paths] == ["mine.png", "mine.svg"] and all(p.stat().st_size > 0 for p in paths)
    svg = paths[1].read_text()
    assert "d_model" in svg and "loops" in svg  # the axis and the legend of the other factor
    with pytest.raises(SynthlabError, match="needs column 'accuracy'.*have d_model, loops, seed, eval_loss"):
        generic.plot_grid(table, tmp_path, "mine", ["d_model"], "accuracy")
