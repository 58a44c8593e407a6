"""Law claims (`[[laws]]`): `synthlab fit --save` records a fit and a digest of what it fitted;
`synthlab report` decides the rule from that record, and only while the table still holds those
numbers. A fit does not depend on the order of the table's rows."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pandas as pd
import pytest
from test_scaling_cli import looplm_table, run
from test_scaling_eval import CPU_TRUTH
from test_verdicts import FAKE
from typer.testing import CliRunner

from synthlab import scaling
from synthlab.claims import law_verdicts, rules
from synthlab.cli import app
from synthlab.errors import SynthlabError
from synthlab.report.markdown import law_verdict
from synthlab.sweeps import experiments


def test_a_fit_and_its_bootstrap_do_not_depend_on_the_row_order(tmp_path):
    table = pd.read_csv(looplm_table(tmp_path))
    shuffled = table.sample(frac=1.0, random_state=3)
    first, second = (
        scaling.fit_table(t, "looplm", options=scaling.TableFitOptions(bootstrap=6, seed=1)) for t in (table, shuffled)
    )
    assert first.fits[0].result.params == second.fits[0].result.params
    assert first.fits[0].bootstrap.intervals == second.fits[0].bootstrap.intervals
    assert first.source["data_sha256"] == second.source["data_sha256"]
    changed = table.assign(loss=table["loss"].where(table.index != 7, table["loss"] * 1.01))
    assert (
        scaling.fit_table(changed, "looplm", options=scaling.TableFitOptions(bootstrap=0)).source["data_sha256"]
        != first.source["data_sha256"]
    )


def cpu_shaped_table(tmp_path):
    """A known LoopLM law (0.1% noise) on the cpu scaling preset's grid (4 sizes x 4 checkpoints x
    Tm 1-4): identified, and its 3 smallest sizes predict the largest (tests/test_scaling_eval.py)."""
    n, d, t = (
        a.ravel()
        for a in np.meshgrid(
            [1.58e4, 5.6e4, 1.21e5, 2.11e5], [4.5e5, 9e5, 1.8e6, 3.6e6], [1.0, 2.0, 3.0, 4.0], indexing="ij"
        )
    )
    clean = scaling.LOOPLM.predict(scaling.LOOPLM.theta(CPU_TRUTH), np.column_stack([n, d, t]))
    loss = clean * np.exp(np.random.default_rng(0).normal(0, 1e-3, clean.shape))
    path = tmp_path / "results.csv"
    pd.DataFrame({"params": n, "tokens": d, "loops": t, "loss": loss}).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def saved_fit(tmp_path_factory):
    """(the folder, the record) of `synthlab fit looplm --bootstrap 6 --holdout size --save` run once
    on the cpu-shaped table: the tests below read copies of that folder."""
    folder = tmp_path_factory.mktemp("saved")
    path, out_path = cpu_shaped_table(folder), folder / "fit_looplm.json"
    argv = ["synthlab", "fit", "looplm", str(path), "--bootstrap", "6", "--holdout", "size", "--save", str(out_path)]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(sys, "argv", argv)  # what the saved `command` is read from
        out = run(*argv[2:])
    assert out.exit_code == 0, out.output
    assert f"wrote {out_path}" in out.output
    return folder, scaling.read_fit_json(out_path.read_text())


def _copy_of(saved_fit, tmp_path):
    """The saved fit's folder copied into tmp_path (a test may edit its table); the table's path."""
    shutil.copytree(saved_fit[0], tmp_path, dirs_exist_ok=True)
    return tmp_path / "results.csv"


def _refuse(constant: str):
    raise ValueError(f"non-strict JSON: {constant}")


def test_a_diverged_fit_is_strict_json_and_reads_back_as_floats():
    record = {
        "A": float("inf"),
        "C": float("-inf"),
        "r2": float("nan"),
        "alpha": 85.3,
        "law": "looplm",
        "holdout": [{"split": "smallest 3 of 4 sizes", "r2_test": float("-inf")}],
        "interval": [1.0, float("inf")],
    }
    text = scaling.fit_json(record)
    strict = json.loads(text, parse_constant=_refuse)  # what jq and other strict readers accept
    assert strict["A"] == "inf" and strict["holdout"][0]["r2_test"] == "-inf"
    back = scaling.read_fit_json(text)
    assert back["A"] == np.inf and back["C"] == -np.inf and np.isnan(back["r2"]) and back["interval"] == [1.0, np.inf]
    assert back["alpha"] == 85.3 and back["law"] == "looplm" and back["holdout"][0]["split"] == "smallest 3 of 4 sizes"


def test_save_records_the_command_the_columns_and_the_digest(saved_fit):
    folder, saved = saved_fit
    path = folder / "results.csv"
    assert (
        saved["command"]
        == f"synthlab fit looplm {path} --bootstrap 6 --holdout size --save {folder / 'fit_looplm.json'}"
    )
    assert saved["columns"]["loss_col"] == "loss" and saved["columns"]["n_col"] == "params"
    assert scaling.digest_now(saved, path) == saved["data_sha256"]
    assert saved["holdout_kind"] == "size" and saved["holdout"][0]["split"] == "smallest 3 of 4 sizes"
    assert saved["bootstrap"] == 6 and saved["r2"] > 0.99


def _rule(**kw) -> rules.LawRule:
    return rules.LawRule(**{"claim": "C5", "says": "the law holds", "fit": "fit_looplm.json", **kw})


def test_a_well_identified_law_is_reproduced_and_a_stricter_rule_contradicts_it(saved_fit, tmp_path):
    _copy_of(saved_fit, tmp_path)
    verdict = law_verdict(_rule(), tmp_path)
    assert verdict.outcome == "reproduced" and verdict.estimate > 0.99 and verdict.n == 64, verdict.why
    assert "smallest 3 of 4 sizes: test R^2" in verdict.why and "n = 64 rows" in verdict.summary()
    strict = law_verdict(_rule(min_r2=1.0), tmp_path)
    assert strict.outcome == "contradicted" and "< 1" in strict.why


def test_no_fit_a_stale_fit_or_another_holdout_is_no_data(saved_fit, tmp_path):
    assert law_verdict(_rule(), tmp_path).outcome == "no data"
    path = _copy_of(saved_fit, tmp_path)
    assert law_verdict(_rule(holdout="data"), tmp_path).why.startswith("fit_looplm.json has hold-out size")
    table = pd.read_csv(path)
    table.sample(frac=1.0, random_state=0).to_csv(path, index=False)  # the same rows: still this fit's
    assert law_verdict(_rule(), tmp_path).outcome == "reproduced"
    table.loc[0, "loss"] *= 1.5
    table.to_csv(path, index=False)
    stale = law_verdict(_rule(), tmp_path)
    assert stale.outcome == "no data" and "other numbers than results.csv holds now" in stale.why


def test_an_unidentified_fit_says_why():
    part = {
        "converged": False,
        "implausible": ["A"],
        "A": float("inf"),
        "bootstrap": 100,
        "bootstrap_converged": 55,
        "bootstrap_refused": "55 of 100",
        "r2": 0.81,
        "n_rows": 192,
        "holdout": [{"split": "smallest 3 of 4 sizes", "r2_test": 0.54, "thin": ""}],
    }
    verdict = law_verdicts.decide_law(_rule(), {**part, "data_sha256": "x", "holdout_kind": "size"}, "x")
    assert verdict.outcome == "not identified" and "smallest 3 of 4 sizes: test R^2 0.540" in verdict.why
    steps = {
        "fits": [
            {**part, "Tm": 2.0},
            {**part, "Tm": 3.0, "converged": True, "implausible": [], "bootstrap_refused": "", "holdout": []},
        ],
        "data_sha256": "x",
        "holdout_kind": None,
    }
    verdict = law_verdicts.decide_law(_rule(holdout=""), steps, "x")
    assert verdict.outcome == "not identified" and verdict.n == 384 and verdict.estimate == pytest.approx(0.81)
    assert verdict.why == (
        "Tm = 2: not converged, A = inf, 55 of 100 refits converged, R^2 0.810, smallest 3 of 4 "
        "sizes: test R^2 0.540; Tm = 3: R^2 0.810"
    )
    thin = {
        **part,
        "converged": True,
        "implausible": [],
        "bootstrap_refused": "",
        "holdout": [{"split": "first 2 of 3 D levels", "r2_test": 0.9, "thin": "D: 2 levels"}],
    }
    verdict = law_verdicts.decide_law(_rule(holdout="data"), {**thin, "data_sha256": "x", "holdout_kind": "data"}, "x")
    assert verdict.outcome == "not identified" and "every hold-out split leaves too few levels" in verdict.why


def test_a_law_whose_form_the_seeds_reject_is_contradicted_unless_its_fit_is_degenerate():
    lof = {
        "rows": 192,
        "cells": 64,
        "params": 10,
        "ss_pure": 3.6,
        "ss_lack": 6.0,
        "f": 3.9,
        "p": 1e-9,
        "r2_ceiling": 0.88,
    }
    part = {
        "converged": True,
        "implausible": [],
        "A": 3.0,
        "bootstrap": 0,
        "r2": 0.81,
        "n_rows": 192,
        "holdout": [],
        "lack_of_fit": lof,
        "data_sha256": "x",
        "holdout_kind": None,
    }
    verdict = law_verdicts.decide_law(_rule(holdout=""), part, "x")
    assert verdict.outcome == "contradicted", verdict.why
    assert (
        verdict.why == "the law's form departs from the data beyond seed noise (lack of fit F = 3.9, p = 1e-09 < 0.05)"
    )
    # the C5 LoopLM fit's shape: not converged, A = inf, alpha = 668, gamma = -5.3, lack of fit rejected
    degenerate = {**part, "converged": False, "implausible": ["A", "alpha", "gamma"], "A": "inf", "alpha": 667.6}
    verdict = law_verdicts.decide_law(_rule(holdout=""), {**degenerate, "gamma": -5.32}, "x")
    assert verdict.outcome == "not identified", verdict.why
    assert verdict.why.startswith("not converged, A = inf, alpha = 668, gamma = -5.32, no bootstrap")
    assert "lack of fit F = 3.9, p = 1e-09" in verdict.why  # reported beside, deciding nothing
    at_bound = law_verdicts.decide_law(_rule(holdout=""), {**part, "C": "-inf"}, "x")  # unflagged infinity
    assert at_bound.outcome == "not identified" and "C = -inf" in at_bound.why
    off = law_verdicts.decide_law(_rule(holdout="", lack_of_fit_level=0), part, "x")
    assert off.outcome == "not identified" and "lack of fit F = 3.9, p = 1e-09, R^2 ceiling 0.880" in off.why
    within = law_verdicts.decide_law(_rule(holdout=""), {**part, "lack_of_fit": {**lof, "p": 0.055}}, "x")
    assert within.outcome == "not identified" and "p = 0.055" in within.why
    assert "no lack of fit beyond seed noise at p < 0.05" in _rule().condition()
    steps = {
        "fits": [
            {**part, "Tm": 2.0, "lack_of_fit": {**lof, "p": 0.03}},
            {**part, "Tm": 3.0, "lack_of_fit": {**lof, "p": 0.2}},
        ],
        "data_sha256": "x",
        "holdout_kind": None,
    }
    assert law_verdicts.decide_law(_rule(holdout=""), steps, "x").outcome == "not identified"  # 0.03 > 0.05 / 2 fits
    steps["fits"][0]["lack_of_fit"]["p"] = 0.02
    verdict = law_verdicts.decide_law(_rule(holdout=""), steps, "x")
    assert (
        verdict.outcome == "contradicted"
        and verdict.why.startswith("Tm = 2: the law's form departs")
        and "< 0.025" in verdict.why
    )
    steps["fits"][0] = {**steps["fits"][0], **degenerate}  # the rejecting fit degenerate: it decides nothing
    assert law_verdicts.decide_law(_rule(holdout=""), steps, "x").outcome == "not identified"
    with pytest.raises(SynthlabError, match="lack_of_fit_level"):
        _rule(lack_of_fit_level=1.0)


def test_a_degenerate_fit_of_a_synthetic_table_is_not_identified(tmp_path):
    """A table the law cannot describe (the loss flat in N and D, rising with Tm): `synthlab fit
    --save` writes a fit that does not converge, and its law rule reads "not identified"."""
    n, d, t = (
        a.ravel()
        for a in np.meshgrid(
            [1.58e4, 5.6e4, 1.21e5, 2.11e5], [4.5e5, 9e5, 1.8e6, 3.6e6], [1.0, 2.0, 3.0, 4.0], indexing="ij"
        )
    )
    loss = 2.0 * np.exp(np.random.default_rng(0).normal(0, 0.02, n.shape)) * (1 + 0.05 * (t > 2))
    pd.DataFrame({"params": n, "tokens": d, "loops": t, "loss": loss}).to_csv(tmp_path / "results.csv", index=False)
    out = run("looplm", tmp_path / "results.csv", "--bootstrap", "0", "--save", tmp_path / "fit_looplm.json")
    assert out.exit_code == 0, out.output
    saved = scaling.read_fit_json((tmp_path / "fit_looplm.json").read_text())
    assert law_verdicts.degenerate(saved)  # the fitter itself says it did not converge
    verdict = law_verdict(_rule(holdout=""), tmp_path)
    assert verdict.outcome == "not identified" and verdict.why.startswith("not converged"), verdict.why


def test_law_rules_parse_from_a_definition_and_bad_ones_are_one_line_errors():
    import tomllib

    raw = tomllib.loads(FAKE.read_text())
    raw["laws"] = [{"claim": "C5", "says": "s", "fit": "f.json", "min_r2": 0.9}]
    assert experiments.parse(raw).laws[0].fit == "f.json"
    raw["laws"] = [{"claim": "C5", "says": "s", "fit": "f.json", "min_r": 0.9}]
    with pytest.raises(SynthlabError, match="law 1: min_r"):
        experiments.parse(raw)
    with pytest.raises(SynthlabError, match="min_r2"):
        _rule(min_r2=1.5)
    for name in ("scaling", "scaling_bios"):
        assert {r.fit for r in experiments.load(experiments.builtin_dir() / f"{name}.toml").laws} == {
            "fit_looplm.json",
            "fit_steps.json",
        }


def test_the_report_puts_a_law_in_the_claims_table(saved_fit, tmp_path):
    _copy_of(saved_fit, tmp_path)
    definition = tmp_path / "lawful.toml"
    definition.write_text(
        FAKE.read_text().replace('name = "sweep_fake"', 'name = "lawful"')
        + '\n[[laws]]\nclaim = "C5"\nsays = "the law holds"\nfit = "fit_looplm.json"\n'
    )
    table = pd.read_csv(tmp_path / "results.csv").assign(point_id=lambda t: [f"p{i}" for i in range(len(t))])
    table.to_csv(tmp_path / "results.csv", index=False)  # the fitted columns unchanged: the fit still holds
    (tmp_path / "sweep.json").write_text(
        json.dumps(
            {
                "experiment": "lawful",
                "preset": "smoke",
                "claim": "C5",
                "title": "t",
                "plot": "none",
                "definition": str(definition),
            }
        )
    )
    out = tmp_path / "report" / "README.md"
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--out", str(out), "--copy"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert (
        "| C5 | lawful | the law holds: fit_looplm.json: " in text
        and "| 64 | exploratory: first run not recorded; rule not committed" in text
    )
    assert "test R^2 >= 0.8 | reproduced (" in text
    assert (out.parent / "lawful" / "fit_looplm.json").is_file()  # --copy takes the saved fit along
