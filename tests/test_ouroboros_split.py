"""The OUROBOROS split: every combination of given and default layer options either gives a valid
split or one error line naming the options given; defaults fit any base of 2 layers or more (and
are the proportional rule wherever it fits); `ouroboros build` checks the split before it reads the
base or writes anything."""

from __future__ import annotations

import itertools
import json

import pytest

pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from synthlab.cli import app  # noqa: E402
from synthlab.errors import SynthlabError  # noqa: E402
from synthlab.ouroboros import OuroborosConfig, resolve_split  # noqa: E402

OPTIONS = ("prelude_layers", "coda_layers", "recurrent_layer")


def _valid(split, layers: int) -> bool:
    kept = [*split.prelude, split.recurrent, *split.coda]
    return (
        split.prelude == tuple(range(len(split.prelude)))
        and split.coda == tuple(range(layers - len(split.coda), layers))
        and len(split.prelude) <= split.recurrent < layers - len(split.coda)
        and len(split.removed) >= 1
        and sorted(kept + list(split.removed)) == list(range(layers))
    )


@pytest.mark.parametrize("layers", [1, 2, 3, 4, 5, 8, 24, 28, 36])
def test_every_combination_is_a_valid_split_or_one_line_naming_the_given_options(layers):
    values = [None, -1, 0, 1, 2, layers // 2, layers - 1, layers]
    for combo in itertools.product(values, repeat=3):
        given = {name: v for name, v in zip(OPTIONS, combo) if v is not None}
        try:
            split = resolve_split(layers, OuroborosConfig(**given))
        except SynthlabError as err:
            message = str(err)
            assert "\n" not in message
            assert layers < 2 or any(name in message for name in given), (given, message)
            continue
        assert layers >= 2 and _valid(split, layers), (given, split)
        assert len(split.prelude) == given.get("prelude_layers", len(split.prelude))
        assert len(split.coda) == given.get("coda_layers", len(split.coda))
        assert split.recurrent == given.get("recurrent_layer", split.recurrent)


def test_defaults_fit_every_depth_and_keep_the_proportional_rule_where_it_fits():
    for layers in range(2, 80):
        split = resolve_split(layers, OuroborosConfig())
        assert _valid(split, layers)
        share = max(1, round(layers * 8 / 36))
        if 2 * share + 2 <= layers:  # the rule's own split is possible: it is the one taken
            assert (len(split.prelude), split.recurrent, len(split.coda)) == (share, layers // 2, share)
    assert resolve_split(3, OuroborosConfig()).recurrent == 1 and resolve_split(2, OuroborosConfig()).removed == (0,)
    # a given prelude moves a defaulted recurrent layer only where L // 2 would not fit
    assert resolve_split(36, OuroborosConfig(prelude_layers=4)).recurrent == 18
    assert resolve_split(36, OuroborosConfig(prelude_layers=20)).recurrent == 24


def _base_config(tmp_path, layers: int):
    from transformers import Qwen2Config

    path = tmp_path / f"qwen2_{layers}.json"
    Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
    ).to_json_file(str(path))
    return path


def test_build_checks_the_split_before_writing_and_reports_empty_parts(tmp_path):
    runner = CliRunner()
    two = _base_config(tmp_path, 2)
    result = runner.invoke(
        app,
        [
            "ouroboros",
            "build",
            "--base-config",
            str(two),
            "--out",
            str(tmp_path / "a"),
            "--rank",
            "4",
            "--controller-hidden",
            "8",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "prelude none, recurrent 1, coda none" in result.output
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["split"]["recurrent"] == 1
    four = _base_config(tmp_path, 4)
    result = runner.invoke(
        app,
        [
            "ouroboros",
            "build",
            "--base-config",
            str(four),
            "--out",
            str(tmp_path / "b"),
            "--prelude-layers",
            "0",
            "--coda-layers",
            "0",
            "--recurrent-layer",
            "0",
            "--rank",
            "4",
            "--controller-hidden",
            "8",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "prelude none, recurrent 0, coda none" in result.output
    for flags, culprit in (
        (["--prelude-layers", "2", "--coda-layers", "1"], "pass --prelude-layers / --coda-layers"),
        (["--recurrent-layer", "3"], "pass --recurrent-layer from 1 to 2"),
    ):
        result = runner.invoke(
            app, ["ouroboros", "build", "--base-config", str(four), "--out", str(tmp_path / "c"), *flags]
        )
        assert result.exit_code == 2 and result.output.startswith("error: ") and culprit in result.output
        assert len(result.output.strip().splitlines()) == 1
        assert not (tmp_path / "c").exists()
    result = runner.invoke(
        app, ["ouroboros", "build", "--base", str(tmp_path / "missing"), "--out", str(tmp_path / "c")]
    )
    assert result.exit_code == 2 and "no config.json" in result.output and not (tmp_path / "c").exists()
