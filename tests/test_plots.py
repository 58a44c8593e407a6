"""Every plot kind draws from a fixture table, writes PNG and SVG, and labels its axes with units."""

from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from synthlab import plots
from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.plots import mechanisms, style, tasks
from synthlab.plots import scaling as scaling_plots


def _grid(**axes) -> pd.DataFrame:
    return pd.DataFrame(list(itertools.product(*axes.values())), columns=list(axes))


def _fixtures() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    cap = _grid(n_people=[1000, 5000], params=[2e5, 8e5], loops=[1, 4])
    cap["max_bits"] = 60.0 * cap["n_people"]
    cap["bits"] = np.minimum(2 * cap["params"], cap["max_bits"]) * rng.uniform(0.8, 1.0, len(cap))
    cap.loc[0, "bits"] = 0.0  # a model that stored nothing
    mano = _grid(model=["2x1", "2x6", "12x1"], L=[3, 5])
    mano["accuracy"] = rng.uniform(0, 1, len(mano))
    multi = _grid(model=["6x1", "6x2", "6x4"], train_fraction=[0.025, 0.1, 0.25])
    multi["train_questions"] = (1e5 * multi["train_fraction"]).round()
    multi["accuracy"] = multi["acc_h3"] = rng.uniform(0, 1, len(multi))
    multi["train_acc_h3"] = rng.uniform(0.5, 1, len(multi))
    reach = _grid(loops=[1, 2, 4], diameter=[2, 8])
    reach["accuracy"] = 0.5 + 0.5 * rng.uniform(0, 1, len(reach))
    for d, answer in itertools.product(range(1, 9), ("yes", "no")):
        reach[f"acc_d{d}_{answer}"] = np.where(reach["diameter"] >= d, rng.uniform(0, 1, len(reach)), np.nan)
        reach[f"n_d{d}_{answer}"] = np.where(reach["diameter"] >= d, 10 + d, np.nan)
    scal = _grid(params=[1e5, 3e5, 1e6], tokens=[1e6, 4e6, 1.6e7], loops=[1, 2])
    scal["loss"] = 1.5 + 300 / scal["params"] ** 0.5 + 900 / scal["tokens"] ** 0.4
    exit_ = _grid(strategy=["static", "q", "diff"], threshold=[1, 2, 3])
    exit_["mean_exit_step"] = exit_["threshold"] + rng.uniform(0, 0.5, len(exit_))
    exit_["accuracy"] = 0.2 * exit_["mean_exit_step"]
    kv = pd.DataFrame(
        {
            "kv": ["full", "first", "last", "mean"],
            "accuracy": [0.8, 0.2, 0.8, 0.79],
            "kv_bytes": [4096, 1024, 1024, 1024],
        }
    )
    topo = pd.DataFrame({"model": ["sandwich concat", "full-stack loop", "sandwich add"], "accuracy": [0.6, 0.4, 0.5]})
    recipe = pd.DataFrame(
        {
            "recipe": ["lab", "lab", "reference", "reference"],
            "accuracy": [0.3, 0.35, 0.4, 0.38],
            "train_loss": [0.9, 0.8, 0.1, 0.12],
        }
    )
    depth = pd.DataFrame({"loops": [2, 4], **{f"acc_step_{t}": [0.1 * t, 0.05 * t] for t in range(1, 9)}})
    faith = pd.DataFrame(
        {
            "loops": [4],
            "model": ["1x4"],
            **{f"agree_{i}_{j}": [1.0 if i == j else 0.5] for i in range(1, 5) for j in range(1, 5)},
        }
    )
    ouro = _grid(variant=["controller", "static", "nogate"], seed=[0, 1, 2])
    ouro = ouro.assign(
        loss_base=2.0,
        loss_truncated=3.0,
        **{f"loss_depth_{d}": 2.5 + 0.1 * d * rng.uniform(0, 1, len(ouro)) for d in (1, 2, 4, 8)},
    )
    return {
        "capacity": cap,
        "mano": mano,
        "multihop": multi,
        "reach": reach,
        "scaling": scal,
        "exit": exit_,
        "kvcache": kv,
        "topology": topo,
        "recipe": recipe,
        "depth": depth,
        "faithfulness": faith,
        "ouroboros": ouro,
    }


UNITS = {
    "capacity": "(bits)",
    "mano": "(%)",
    "multihop": "(%)",
    "reach": "(%)",
    "scaling": "(nats/token)",
    "exit": "(recurrent steps per token)",
    "kvcache": "(KiB)",
    "topology": "(%)",
    "recipe": "(%)",
    "depth": "(%)",
    "faithfulness": "(%)",
    "ouroboros": "(nats/token)",
}


@pytest.mark.parametrize("kind", sorted(plots.PLOTTERS))
def test_every_plot_writes_png_and_svg_with_labelled_axes(kind, tmp_path):
    paths = plots.plot(kind, _fixtures()[kind], tmp_path)
    assert {p.suffix for p in paths} == {".png", ".svg"}
    assert all(p.stat().st_size > 1000 for p in paths)
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = next(p for p in paths if p.suffix == ".svg").read_text()
    assert UNITS[kind] in svg  # seaborn writes labels as text in the SVG
    again = plots.plot(kind, _fixtures()[kind], tmp_path / "again")
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]  # regenerating churns nothing


def test_scaling_plot_fits_the_law_that_generated_the_fixture():
    table = _fixtures()["scaling"]
    result = scaling_plots.fit_scaling(table[table["loops"] == 1])
    assert result.law == "chinchilla" and result.r2 > 0.999
    assert result.params["E"] == pytest.approx(1.5, rel=0.02)
    assert result.params["alpha"] == pytest.approx(0.5, rel=0.05)


def test_scaling_title_names_a_degenerate_fit_instead_of_its_constants():
    fitted = scaling_plots.fit_scaling(_fixtures()["scaling"].query("loops == 1"))
    assert scaling_plots.scaling_title(fitted).startswith("fitted chinchilla: R² = ")
    runaway = dataclasses.replace(fitted, params={**fitted.params, "A": float("inf"), "alpha": 90.0})
    title = scaling_plots.scaling_title(runaway)
    assert title.startswith("chinchilla: degenerate fit") and "A=inf" in title and "alpha=90" in title
    assert "not identified" in title
    assert "beta=" not in title  # the plausible constants are not printed as if they meant something


def test_agreement_matrix_is_rebuilt_from_its_columns():
    row = pd.Series({"loops": 3, **{f"agree_{i}_{j}": 10 * i + j for i in range(1, 4) for j in range(1, 4)}})
    matrix = mechanisms.agreement_matrix(row)
    assert matrix.shape == (3, 3) and matrix[1, 2] == 23 and matrix[2, 0] == 31


@pytest.mark.parametrize(
    "kind, column", [("kvcache", "accuracy"), ("exit", "mean_exit_step"), ("ouroboros", "loss_base")]
)
def test_a_built_in_figure_refuses_a_needed_column_empty_in_every_row(kind, column, tmp_path):
    table = _fixtures()[kind].assign(**{column: np.nan})
    with pytest.raises(SynthlabError, match=f"plot '{kind}' needs column.*'{column}'.*empty in every row"):
        plots.plot(kind, table, tmp_path)
    assert not any(tmp_path.iterdir())


def test_missing_columns_and_unknown_kind_are_named(tmp_path):
    with pytest.raises(SynthlabError, match="'capacity' needs column"):
        plots.plot("capacity", pd.DataFrame({"params": [1.0]}), tmp_path)
    with pytest.raises(SynthlabError, match="unknown plot kind"):
        plots.plot("nope", pd.DataFrame({"a": [1]}), tmp_path)


def test_plot_cli_reads_a_sweep_dir(tmp_path):
    _fixtures()["mano"].to_csv(tmp_path / "results.csv", index=False)
    result = CliRunner().invoke(app, ["plot", "mano", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "figures" / "mano.svg").is_file()
    result = CliRunner().invoke(app, ["plot", "mano", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no results.csv" in result.output


def _fake_sweep_dir(path, kind: str):
    import json

    path.mkdir(parents=True)
    table = _fixtures()[kind].assign(
        point_id=lambda t: [f"p{i}" for i in range(len(t))],
        run_dir=lambda t: [f"/abs/runs/r{i}" for i in range(len(t))],
    )
    table.to_csv(path / "results.csv", index=False)
    (path / "sweep.json").write_text(
        json.dumps(
            {
                "experiment": kind,
                "preset": "smoke",
                "claim": "C2",
                "title": "a title",
                "plot": kind,
                "commands": [f"synthlab sweep {kind} --preset smoke"],
            }
        )
    )
    return table


def test_report_has_tables_figures_commands_and_verdicts(tmp_path):
    table = _fake_sweep_dir(tmp_path / "runs" / "mano", "mano")
    _fake_sweep_dir(tmp_path / "runs" / "kv", "kvcache")
    notes = tmp_path / "notes.toml"
    notes.write_text('preamble = "Made on 2 cores."\nmano = "Loops help at this scale."\n')
    out = tmp_path / "results" / "README.md"
    result = CliRunner().invoke(
        app,
        [
            "report",
            str(tmp_path / "runs" / "mano"),
            str(tmp_path / "runs" / "kv"),
            "--out",
            str(out),
            "--copy",
            "--notes",
            str(notes),
        ],
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("# synthlab results\n\nMade on 2 cores.")
    assert "## mano (C2)" in text and "## kvcache (C2)" in text
    assert "synthlab sweep mano --preset smoke" in text and "Reading: Loops help at this scale." in text
    assert "![mano](mano/mano.png)" in text and (out.parent / "mano" / "mano.png").is_file()
    # every run is a table row, with its accuracy to 4 significant figures
    assert all(f"| {a:.4g} |" in text for a in table["accuracy"])
    copied = pd.read_csv(out.parent / "mano" / "results.csv")
    assert list(copied["run_dir"]) == [f"r{i}" for i in range(len(table))]  # no absolute paths committed
    # regenerating the report changes no byte: committed results do not churn
    before = {p: p.read_bytes() for p in out.parent.rglob("*") if p.is_file()}
    again = CliRunner().invoke(
        app,
        [
            "report",
            str(tmp_path / "runs" / "mano"),
            str(tmp_path / "runs" / "kv"),
            "--out",
            str(out),
            "--copy",
            "--notes",
            str(notes),
        ],
    )
    assert again.exit_code == 0 and {p: p.read_bytes() for p in out.parent.rglob("*") if p.is_file()} == before


def test_capacity_plot_marks_empty_models_and_the_data_limit(tmp_path):
    paths = plots.plot("capacity", _fixtures()["capacity"], tmp_path)
    svg = next(p for p in paths if p.suffix == ".svg").read_text()
    assert "below 1 bit, negative too (drawn at 1)" in svg and "all the data (N = 5,000)" in svg
    assert not list(tmp_path.glob(".*"))  # atomic saves leave no temporaries behind


def test_capacity_plot_labels_a_parameter_range_within_one_decade(tmp_path, monkeypatch):
    # one model size (every calibration point): no power of ten to label, minor labels would overlap
    table = _fixtures()["capacity"].assign(params=18_032, params_capacity=18_032)
    seen = {}
    import matplotlib.figure

    save_fig = matplotlib.figure.Figure.savefig

    def keep_labels(fig, *args, **kwargs):
        fig.canvas.draw()
        axis = fig.axes[0].xaxis
        seen["major"] = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
        seen["minor"] = [t.get_text() for t in axis.get_ticklabels(minor=True) if t.get_text()]
        return save_fig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep_labels)
    plots.plot("capacity", table, tmp_path)
    assert len(seen["major"]) >= 2 and all(re.fullmatch(r"\d+(\.\d+)?[KMB]?", t) for t in seen["major"])
    assert {"12K", "20K"} <= set(seen["major"]) and not seen["minor"]


def test_report_counts_grid_points_apart_from_runs_of_an_earlier_grid(tmp_path):
    import json
    from pathlib import Path

    from synthlab.sweeps import experiments

    fixture = Path(__file__).parent / "fixtures" / "mano_tiny.toml"
    grid = [p.point_id for p in experiments.load(fixture).points("smoke")]
    table = _fake_sweep_dir(tmp_path / "runs" / "mano", "mano")
    table.assign(point_id=[grid[0]] + [f"old{i}" for i in range(1, len(table))]).to_csv(
        tmp_path / "runs" / "mano" / "results.csv", index=False
    )
    info = json.loads((tmp_path / "runs" / "mano" / "sweep.json").read_text())
    (tmp_path / "runs" / "mano" / "sweep.json").write_text(json.dumps({**info, "definition": str(fixture)}))
    out = tmp_path / "report.md"
    result = CliRunner().invoke(app, ["report", str(tmp_path / "runs" / "mano"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert f"1 of 2 grid points finished, plus {len(table) - 1} run(s) of an earlier version" in text
    assert "| arch |" in text and "| 1x1 |" in text  # the grid's factor filled in for the row it knows


@pytest.mark.parametrize("kind", ["mano", "multihop", "reach", "exit", "kvcache", "topology", "depth", "faithfulness"])
def test_plots_over_seeds_show_the_mean_and_every_seed(kind, tmp_path):
    base = _fixtures()[kind]
    rng = np.random.default_rng(1)
    table = pd.concat([base.assign(seed=s) for s in range(3)], ignore_index=True)
    for column in ("accuracy", *[c for c in table if c.startswith("acc_step_")]):
        if column in table:
            table[column] = (table[column] + rng.normal(0, 0.02, len(table))).clip(0, 1)
    assert style.seed_count(table) == 3 and style.seed_count(base) == 1
    paths = plots.plot(kind, table, tmp_path)
    svg = next(p for p in paths if p.suffix == ".svg").read_text()
    assert "mean of 3 seeds" in svg  # the figure says what its marks are


def test_reach_pools_both_classes_of_a_distance_by_their_counts():
    table = pd.DataFrame(
        {
            "diameter": [2, 2],
            "loops": [1, 2],
            "acc_d1_yes": [1.0, 0.5],
            "n_d1_yes": [3, 3],
            "acc_d1_no": [0.0, 0.5],
            "n_d1_no": [1, 1],
            "acc_d2_yes": [0.5, 1.0],
            "n_d2_yes": [2, 2],
            "acc_d2_no": [1.0, 1.0],
            "n_d2_no": [2, 2],
        }
    )
    long = tasks.reach_distances(table)
    assert long[["loops", "distance", "acc"]].values.tolist() == [[1, 1, 0.75], [2, 1, 0.5], [1, 2, 0.75], [2, 2, 1.0]]
    assert tasks.reach_distances(table[["diameter", "loops"]]).empty  # a table from before


def test_mano_heatmap_shows_every_seed_under_the_mean(tmp_path):
    rows = [
        {"model": m, "L": L, "seed": s, "accuracy": acc}
        for m, base in (("1x1", 0.2), ("1x3", 0.5))
        for L in (2, 3)
        for s, acc in enumerate((base, base + 0.1, base + 0.3))
    ]
    paths = plots.plot("mano", pd.DataFrame(rows), tmp_path)
    svg = next(p for p in paths if p.suffix == ".svg" and p.stem == "mano").read_text()
    assert "(50, 60, 80)" in svg and "63.3" in svg and "each seed below" in svg


def test_mano_lengths_draws_every_seed_as_a_point_beside_the_mean(tmp_path, monkeypatch):
    rows = [
        {
            "model": m,
            "L": 2,
            "seed": s,
            "accuracy": 0.5,
            "acc_l1": 0.9 - 0.1 * s - k / 100,
            "acc_l2": 0.4 + 0.1 * s + k / 100,
            "train_acc_l1": 0.95 - 0.05 * s - k / 100,
        }
        for k, m in enumerate(("1x1", "1x3"))
        for s in range(3)
    ]
    figures = []
    monkeypatch.setattr(tasks, "save", lambda fig, out, name: figures.append(fig) or [out / f"{name}.png"])
    tasks.plot_lengths(pd.DataFrame(rows), tmp_path)
    ax = figures[0].axes[0]
    points = {round(float(y), 6) for c in ax.collections for y in c.get_offsets()[:, 1]}
    for row in rows:  # every seed's own value is drawn, not only the mean over seeds
        assert {round(100 * row[c], 6) for c in ("acc_l1", "acc_l2", "train_acc_l1")} <= points
    assert "mean of 3 seeds" in figures[0]._suptitle.get_text()


def test_faithfulness_heatmap_shows_the_seeds_range_under_the_mean(tmp_path):
    rows = [
        {
            "model": "1x4",
            "loops": 4,
            "seed": s,
            **{f"agree_{i}_{j}": (1.0 if i == j else 0.5 + 0.1 * s) for i in range(1, 4) for j in range(1, 4)},
        }
        for s in range(3)
    ]
    paths = plots.plot("faithfulness", pd.DataFrame(rows), tmp_path)
    svg = next(p for p in paths if p.suffix == ".svg").read_text()
    assert "50-70" in svg and "seeds' range" in svg  # off the diagonal: mean 60, seeds 50, 60, 70
