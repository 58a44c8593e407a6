"""experiments/ouroboros.toml (C11): the smoke preset end to end (train -> export -> ouroboros on one
shared base, one row per variant x seed), its plot, the section's checks, and a given checkpoint."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from synthlab import plots  # noqa: E402
from synthlab.errors import SynthlabError  # noqa: E402
from synthlab.sweeps import driver, experiments, runner_protocol  # noqa: E402
from synthlab.sweeps import lab_runner as point_runner
from synthlab.sweeps.results_table import read_results  # noqa: E402

TOML = Path(__file__).resolve().parents[1] / "experiments" / "ouroboros.toml"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("ouroboros-smoke")
    driver.run_sweep(experiments.load(TOML), "smoke", out, runner=point_runner, progress=False)
    return out


@pytest.mark.slow  # the smoke sweep: trains, exports and trains OUROBOROS variants
def test_smoke_preset_runs_every_variant_and_seed_on_one_base(smoke):
    table = read_results(smoke)
    assert sorted(zip(table["variant"], table["seed"])) == sorted(
        (v, s) for v in ("controller", "static", "nogate") for s in (0, 1)
    )
    assert table["run_dir"].nunique() == 1  # one synthlab base, trained and exported once
    run_dir = Path(table["run_dir"].iloc[0])
    assert (run_dir / "qwen2" / "config.json").is_file()
    assert len(list((run_dir / "ouroboros").iterdir())) == 6  # one OUROBOROS run per point
    for column in ("loss_depth_1", "loss_depth_2", "loss_depth_4", "loss_truncated", "loss_base"):
        assert table[column].map(math.isfinite).all(), column
    assert (table["ouro_steps"] == 3).all()
    # the references do not depend on the variant; the seed changes a trained controller
    assert table["loss_base"].nunique() == 1 and table["loss_truncated"].nunique() == 1
    controller = table[table["variant"] == "controller"].set_index("seed")
    assert controller.loc[0, "loss_depth_2"] != controller.loc[1, "loss_depth_2"]
    # static: r deltas per (step, target) + gate + step norms; the controller adds its MLP
    sizes = table.groupby("variant")["trainable_params"].first()
    assert sizes["nogate"] < sizes["static"] < sizes["controller"]


@pytest.mark.slow  # the smoke sweep: trains, exports and trains OUROBOROS variants
def test_rerun_has_nothing_to_do_and_the_plot_shows_seeds(smoke, monkeypatch):
    before = (smoke / "results.csv").read_text()
    monkeypatch.setattr(point_runner, "run_point", lambda *a, **k: pytest.fail("a finished point ran again"))
    driver.run_sweep(experiments.load(TOML), "smoke", smoke, runner=point_runner, progress=False)
    assert (smoke / "results.csv").read_text() == before
    paths = plots.plot("ouroboros", read_results(smoke), smoke / "figures")
    assert [p.name for p in paths] == ["ouroboros.png", "ouroboros.svg"] and all(p.stat().st_size for p in paths)


def _smoke_config(**section):
    config = copy.deepcopy(experiments.load(TOML).points("smoke")[0].config)
    config["ouroboros"].update(section)
    return config


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c["ouroboros"].update(colour=1), "ouroboros.colour: unknown field"),
        (lambda c: c["ouroboros"].update(variant="base"), "ouroboros.variant must be one of"),
        (lambda c: c["ouroboros"].update(eval_depths=[1, 8]), "exceeds max_steps"),
        (lambda c: c["ouroboros"].update(base="/somewhere"), "go together"),
        (lambda c: c.update(stages=["train", "ouroboros"]), "needs the export stage"),
        (lambda c: c["model"].update(mlp="gelu"), "Qwen2 cannot express this model: mlp = gelu"),
    ],
)
def test_bad_points_fail_with_one_line(change, message):
    config = _smoke_config()
    change(config)
    with pytest.raises(SynthlabError, match=message):
        point_runner.parse(config)


def test_every_preset_validates_and_gpu_uses_the_given_checkpoint():
    exp = experiments.load(TOML)
    for preset in experiments.PRESETS:
        assert runner_protocol.parse_points(point_runner, exp, preset, exp.points(preset))
    gpu = [point_runner.parse(p.config) for p in exp.points("gpu")]
    assert {p.ouroboros.system.variant for p in gpu} == {"controller", "static", "nogate"}
    assert {p.ouroboros.train.seed for p in gpu} == {0, 1, 2}
    assert all(p.ouroboros.source.base and point_runner.columns(p) == ["loss_base"] for p in gpu)
    first = gpu[0].ouroboros
    assert (
        first.system.rank,
        first.system.controller_hidden,
        first.train.seq_len,
        first.train.micro_batch_size * first.train.grad_accum,
        first.train.depths,
    ) == (32, 320, 2048, 32, (4, 8, 16))


@pytest.mark.slow  # needs the smoke sweep (train, export, OUROBOROS): end to end, as its two neighbours
def test_a_given_checkpoint_trains_no_synthlab_base(smoke, tmp_path):
    table = read_results(smoke)
    run_dir = Path(table["run_dir"].iloc[0])
    corpus = next((smoke / "datasets").glob("bios-*")) / "train.jsonl"
    point = point_runner.parse(_smoke_config(base=str(run_dir / "qwen2"), corpus=str(corpus), steps=2))
    metrics = point_runner.run_point(point, tmp_path / "run", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "run" / "model").exists() and not (tmp_path / "cache").exists()
    assert metrics["ouro_steps"] == 2 and metrics["loss_base"] == pytest.approx(table["loss_base"].iloc[0])


def test_the_cpu_static_control_has_the_controllers_trainable_parameters(tmp_path):
    """static-r148's rank gives the trainable count nearest the controller's, both counted on the
    built systems (the cpu base's shape), and alpha / r stays that of the rank-8 variants."""
    import dataclasses

    import torch
    import transformers

    from synthlab.ouroboros import OuroborosLM, trainable_breakdown
    from synthlab.ouroboros.checkpoint import meta_base

    points = {
        p.factors["variant"]: point_runner.parse(p.config)
        for p in experiments.load(TOML).points("cpu")
        if p.factors["seed"] == "0"
    }
    model, path = points["controller"].model, tmp_path / "config.json"
    transformers.Qwen2Config(
        hidden_size=model.d_model,
        intermediate_size=model.ff_dim,
        num_hidden_layers=model.n_layers,
        num_attention_heads=model.n_heads,
        vocab_size=64,
    ).to_json_file(path)

    def count(system) -> int:  # a fresh base each time: one base carries the bases of one rank
        return trainable_breakdown(OuroborosLM(meta_base(path), system, torch.Generator().manual_seed(0)))["total"]

    control, controller = points["static-r148"].ouroboros.system, points["controller"].ouroboros.system
    target = count(controller)
    gaps = {
        r: abs(count(dataclasses.replace(control, rank=r)) - target) for r in range(control.rank - 2, control.rank + 3)
    }
    assert min(gaps, key=gaps.get) == control.rank
    assert (target, count(control), count(points["static"].ouroboros.system)) == (17080, 17056, 9216)
    assert control.variant == "static" and control.alpha / control.rank == controller.alpha / controller.rank


@pytest.mark.slow  # trains a smoke base, exports it and trains one OUROBOROS point
def test_new_people_and_per_sequence_outcomes_pair_the_variants(tmp_path):
    import pandas as pd

    from synthlab.claims import paired

    point = point_runner.parse(_smoke_config(eval_data_seed=1, eval_max_sequences=2))
    metrics = point_runner.run_point(point, tmp_path / "run", cache_dir=tmp_path / "cache")
    depths = point.ouroboros.eval.eval_depths
    assert len(list((tmp_path / "cache").glob("bios-*"))) == 2  # the base's people and the new ones
    outcomes = pd.read_csv(tmp_path / "run" / metrics["outcomes"])
    assert len(outcomes) == 2
    row = {**metrics, "run_dir": str(tmp_path / "run")}
    for d in depths:
        for column in (f"loss_depth_{d}", f"loss_new_depth_{d}"):
            # each sequence's loss scaled so that the mean over sequences is the row's token mean
            assert outcomes[column].mean() == pytest.approx(metrics[column], rel=1e-9)
            assert paired.prompt_vector(row, column) == pytest.approx(outcomes[column].to_numpy())
    # people the base never saw: their attributes cannot be recalled, so the base's loss is higher
    assert metrics["loss_new_base"] > metrics["loss_base"]
    with pytest.raises(SynthlabError, match="the base's own data seed"):
        point_runner.run_point(
            point_runner.parse(_smoke_config(eval_data_seed=0, eval_max_sequences=2)),
            tmp_path / "run",
            cache_dir=tmp_path / "cache",
        )


@pytest.mark.parametrize(
    "section, message",
    [
        ({"eval_data_seed": 1, "eval_max_sequences": None}, "needs eval_max_sequences"),
        ({"eval_data_seed": -1, "eval_max_sequences": 2}, "must be an integer >= 0"),
        ({"eval_max_sequences": 0}, "eval_max_sequences must be >= 1"),
        ({"eval_data_seed": 1, "eval_max_sequences": 2, "base": "/b", "corpus": "/c"}, "not a given base"),
    ],
)
def test_new_people_options_are_checked(section, message):
    with pytest.raises(SynthlabError, match=message):
        point_runner.parse(_smoke_config(**section))


def test_the_confirm_preset_replicates_over_bases_with_a_full_rank_control():
    points = [point_runner.parse(p.config) for p in experiments.load(TOML).points("confirm")]
    assert {p.train.seed for p in points} == {1, 2, 3} and {p.ouroboros.train.seed for p in points} == {0}
    full = [p.ouroboros.system for p in points if p.ouroboros.system.rank == 64]
    assert full and all(s.variant == "static" and s.alpha / s.rank == 2 for s in full)
    assert {p.ouroboros.eval.eval_data_seed for p in points} == {1} != {p.data_seed for p in points}
