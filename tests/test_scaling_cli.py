"""`synthlab fit` as a user runs it: the published Chinchilla optimum, LoopLM and step-wise tables, errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from test_scaling import CHINCHILLA_CSV, PUBLISHED, TRUTH, synthetic
from typer.testing import CliRunner

from synthlab import scaling
from synthlab.cli import app
from synthlab.errors import SynthlabError


def run(*args: str):
    return CliRunner().invoke(app, ["fit", *map(str, args)])


def test_reproduces_published_chinchilla_fit_from_the_shipped_csv():
    if not CHINCHILLA_CSV.is_file():
        pytest.skip(f"{CHINCHILLA_CSV} absent: the shared data folder must sit beside the repository")
    out = run(
        "chinchilla",
        CHINCHILLA_CSV,
        "--n-col",
        "Model Size",
        "--tokens-from-flops",
        "Training FLOP",
        "--drop-top-loss",
        "5",
        "--bootstrap",
        "20",
        "--compute",
        "5.76e23",
        "--json",
    )
    assert out.exit_code == 0, out.output
    fit = json.loads(out.output)
    for name, value in PUBLISHED.items():
        assert f"{fit[name]:.3g}" == f"{value:.3g}", name
    assert fit["objective"] == pytest.approx(0.0010183, rel=1e-4) and fit["n_rows"] == 240
    assert {"a", "b", "G", "N_opt", "D_opt"} <= set(fit["derived"]) and len(fit["intervals"]["alpha"]) == 2


def looplm_table(tmp_path):
    data, _ = synthetic("looplm", 1e-4, np.random.default_rng(20))
    path = tmp_path / "results.csv"
    pd.DataFrame(
        {
            "params": data.variables["N"],
            "tokens": data.variables["D"],
            "loops": data.variables["Tm"],
            "loss": data.loss,
            "run": np.arange(len(data.loss)),
        }
    ).to_csv(path, index=False)
    return path


def test_looplm_json_holdout_and_plot(tmp_path):
    path = looplm_table(tmp_path)
    png = tmp_path / "plots" / "fit.png"
    out = run("looplm", path, "--bootstrap", "10", "--holdout", "size", "--json", "--plot", png)
    assert out.exit_code == 0, out.output
    fit = json.loads(out.output)
    assert {"E", "A", "B", "C", "alpha", "beta", "gamma", "t1", "t2", "t3", "r2", "objective"} <= set(fit)
    assert fit["r2"] > 0.999 and set(fit["intervals"]) >= {"C", "gamma", "t3"}
    (row,) = fit["holdout"]
    assert row["split"] == "smallest 3 of 5 sizes" and row["train_rows"] == 60 and row["r2_train"] > 0.999
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_heldout_stage_table_is_fitted_on_its_heldout_columns_by_default(tmp_path):
    """A scaling sweep's results.csv has the run's last training loss and total tokens (`loss`,
    `tokens`: the same for every checkpoint of a run) beside the held-out loss at each checkpoint
    and the tokens seen by then (`eval_loss`, `eval_tokens`); the law is about the latter."""
    data, _ = synthetic("chinchilla", 1e-4, np.random.default_rng(3))
    path = tmp_path / "results.csv"
    pd.DataFrame(
        {
            "params": data.variables["N"],
            "eval_tokens": data.variables["D"],
            "eval_loss": data.loss,
            "tokens": data.variables["D"].max(),
            "loss": 1.0 + 0.1 * np.arange(len(data.loss)),
        }
    ).to_csv(path, index=False)
    by_default = json.loads(run("chinchilla", path, "--bootstrap", "0", "--json").output)
    assert by_default["r2"] > 0.999 and by_default["alpha"] == pytest.approx(TRUTH["chinchilla"]["alpha"], rel=1e-2)
    explicit = json.loads(
        run(
            "chinchilla", path, "--bootstrap", "0", "--json", "--d-col", "eval_tokens", "--loss-col", "eval_loss"
        ).output
    )
    assert explicit == by_default
    training = run("chinchilla", path, "--bootstrap", "0", "--json", "--d-col", "tokens", "--loss-col", "loss")
    assert "tokens = " in training.stderr  # D is the same in every row: warned, not identified
    assert training.exit_code == 2 or json.loads(training.stdout)["r2"] < 0.99  # the old defaults: not the law


def test_text_output_power_law(tmp_path):
    x = np.geomspace(1e3, 1e6, 25)
    path = tmp_path / "capacity.csv"
    pd.DataFrame({"params": x, "bits": 0.1 + 2.0 * x**0.9}).to_csv(path, index=False)
    out = run("power", path, "--loss-col", "bits", "--bootstrap", "0")
    assert out.exit_code == 0, out.output
    assert "L = E + A/(x + t)^alpha" in out.output and "alpha = -0.9" in out.output


def test_fit_table_takes_a_dataframe():
    x = np.geomspace(1e3, 1e6, 25)
    fitted = scaling.fit_table(
        pd.DataFrame({"params": x, "bits": 0.1 + 2.0 * x**0.9}),
        "power",
        scaling.TableColumns(loss_col="bits"),
        scaling.TableFitOptions(bootstrap=0),
    )
    (group,) = fitted.fits
    assert fitted.law is scaling.POWER and group.title == "power fit to table" and group.bootstrap is None
    assert group.result.params["alpha"] == pytest.approx(-0.9, rel=1e-4)


def test_steps_law_is_fitted_per_max_steps(tmp_path):
    rows = []
    for tm in (2, 4):
        data, _ = synthetic("steps", 1e-4, np.random.default_rng(tm))
        rows.append(
            pd.DataFrame(
                {
                    "params": data.variables["N"],
                    "tokens": data.variables["D"],
                    "step": data.variables["T"],
                    "loops": tm,
                    "loss": data.loss,
                }
            )
        )
    one_step = rows[0][rows[0]["step"] == 1].assign(loops=1)  # a plain model's runs: one step, no T to fit
    path = tmp_path / "steps.csv"
    pd.concat([one_step, *rows]).to_csv(path, index=False)
    out = run("steps", path, "--bootstrap", "0", "--json")
    assert out.exit_code == 0, out.output
    assert "skipped" in out.stderr and "loops = 1" in out.stderr
    fits = json.loads(out.stdout)["fits"]
    assert [f["Tm"] for f in fits] == [2.0, 4.0] and all(f["r2"] > 0.999 for f in fits)
    assert all(f["gamma"] == pytest.approx(1.0, rel=0.05) for f in fits)


@pytest.mark.parametrize(
    "edit,args,message",
    [
        (None, ["--n-col", "size"], "column 'size' (--n-col) not in results.csv"),
        ("nan", [], "'loss' has 1 NaN"),
        ("negative", [], "'params' has 1 non-positive"),
        ("few", [], "10 parameters but only 5 rows"),
        (None, ["--holdout", "tokens"], "--holdout must be one of"),
        (None, ["--drop-top-loss", "500"], "would drop all"),
    ],
)
def test_bad_input_is_one_line(tmp_path, edit, args, message):
    path = looplm_table(tmp_path)
    table = pd.read_csv(path)
    if edit == "nan":
        table.loc[3, "loss"] = np.nan
    elif edit == "negative":
        table.loc[0, "params"] = -1.0
    elif edit == "few":
        table = table.head(5)
    table.to_csv(path, index=False)
    out = run("looplm", path, "--bootstrap", "0", *args)
    assert out.exit_code == 2
    assert message in out.output and out.output.count("\n") == 1 and out.output.startswith("error: ")


def test_a_table_with_eval_loss_but_no_eval_tokens_says_which_flags_to_pass(tmp_path):
    path = looplm_table(tmp_path)
    pd.read_csv(path).rename(columns={"loss": "eval_loss"}).to_csv(path, index=False)
    out = run("looplm", path, "--bootstrap", "0")
    assert (
        out.exit_code == 2 and "has eval_loss but no eval_tokens: pass --d-col and --loss-col eval_loss" in out.output
    )


def test_unknown_law_suggests():
    out = run("chinchila", "missing.csv")
    assert out.exit_code == 2 and "did you mean 'chinchilla'" in out.output


def test_a_fit_of_seeds_prints_and_saves_its_lack_of_fit(tmp_path):
    from test_scaling_eval import replicated_chinchilla

    data = replicated_chinchilla(np.random.default_rng(2), 0.02)
    path = tmp_path / "results.csv"
    pd.DataFrame(
        {"params": data.variables["N"], "tokens": data.variables["D"], "loss": data.loss, "run_dir": data.runs}
    ).to_csv(path, index=False)
    out = run("chinchilla", path, "--bootstrap", "0", "--lack-of-fit-resamples", "200", "--save", tmp_path / "fit.json")
    assert out.exit_code == 0, out.output
    assert "lack of fit (least squares, log loss, 16 design points with replicates): p = " in out.output
    assert "over 12 runs (200 wild-bootstrap draws); F = " in out.output and "on 11 and 32 df" in out.output
    saved = json.loads((tmp_path / "fit.json").read_text())
    lof = saved["lack_of_fit"]
    assert lof["cells"] == 16 and lof["rows"] == 48 and lof["runs"] == 12 and 0 < lof["p"] <= 1
    assert 1 / 201 <= lof["p_runs"] <= 1 and saved["columns"]["run_col"] == "run_dir"
    out = run("chinchilla", path, "--bootstrap", "0", "--run-col", "seed")
    assert out.exit_code == 2 and "column 'seed' (--run-col) not in results.csv" in out.output
    pd.read_csv(path).iloc[::3].to_csv(path, index=False)  # one seed: no pure error, no test
    out = run("chinchilla", path, "--bootstrap", "0", "--json")
    assert out.exit_code == 0 and json.loads(out.output)["lack_of_fit"] is None, out.output


@pytest.fixture(scope="module")
def saved_looplm(tmp_path_factory):
    """A folder holding the LoopLM table and its `synthlab fit looplm --save fit_looplm.json`, fitted
    once: each test below edits its own copy."""
    folder = tmp_path_factory.mktemp("saved")
    out = run("looplm", looplm_table(folder), "--bootstrap", "0", "--save", folder / "fit_looplm.json")
    assert out.exit_code == 0, out.output
    return folder


def test_the_scaling_figure_draws_the_saved_fit_of_the_same_numbers_and_refits_other_numbers(saved_looplm, tmp_path):
    from synthlab.plots import scaling as scaling_plots
    from synthlab.sweeps.results_table import read_results

    shutil.copytree(saved_looplm, tmp_path, dirs_exist_ok=True)
    record = json.loads((tmp_path / "fit_looplm.json").read_text())
    assert record["fit_space"]["log_E"] == pytest.approx(np.log(record["E"]))
    record["fit_space"]["log_E"] += 0.1  # marks the file's vector: a refit would not find it
    (tmp_path / "fit_looplm.json").write_text(json.dumps(record))
    table = read_results(tmp_path)
    drawn = scaling_plots.fit_scaling(table)
    assert np.array_equal(drawn.theta, np.array(list(record["fit_space"].values())))
    assert drawn.params["E"] == pytest.approx(record["E"] * np.exp(0.1)) and drawn.r2 == record["r2"]
    assert scaling_plots.plot_scaling(table, tmp_path / "figures")[0].is_file()
    changed = table.assign(loss=table["loss"] * 1.01)  # other numbers: the saved fit is not theirs
    assert scaling.saved_fit(table, tmp_path / "nowhere") is None
    with pytest.raises(SynthlabError, match="fitted to other numbers"):
        scaling.saved_fit(changed, tmp_path)
    assert scaling_plots.fit_scaling(changed).params["E"] != pytest.approx(drawn.params["E"])  # refitted


def test_a_damaged_saved_fit_is_named_on_stderr_and_the_figure_refits(saved_looplm, tmp_path, capsys):
    from synthlab.plots import scaling as scaling_plots
    from synthlab.sweeps.results_table import read_results

    shutil.copytree(saved_looplm, tmp_path, dirs_exist_ok=True)
    (tmp_path / "fit_looplm.json").write_text('{"law": "looplm", "E": ')  # cut short
    table = read_results(tmp_path)
    capsys.readouterr()
    assert scaling_plots.fit_scaling(table).law == "looplm"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"warning: cannot use {tmp_path / 'fit_looplm.json'}: JSONDecodeError"
    ), err
