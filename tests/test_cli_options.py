"""The command line's conventions: every options-dataclass field is a flag with help and its default
shown (sweep's and fit's options are such fields and nothing else); importing the CLI stays light;
--version; shell completion; --set overrides in the run.toml's keys; the threads warning."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys

import click
import pytest
import typer
from typer.testing import CliRunner

from synthlab import __version__
from synthlab.cli import app
from synthlab.cli.fit import FitOutput
from synthlab.cli.flags import flag_name
from synthlab.models import ModelConfig
from synthlab.scaling import TableColumns, TableFitOptions
from synthlab.sweeps.options import SweepOptions
from synthlab.training.configs import OuroborosConfig, OuroborosTrainConfig, TrainConfig
from synthlab_generators import TASKS

runner = CliRunner()
ROOT = typer.main.get_command(app)

# command path -> the options dataclasses its flags come from (fields left out: what the command sets itself)
GENERATED = {
    ("train",): [(TrainConfig, ()), (ModelConfig, ("vocab_size",))],
    ("ouroboros", "build"): [(OuroborosConfig, ())],
    ("ouroboros", "train"): [(OuroborosTrainConfig, ()), (OuroborosConfig, ("variant",))],
    **{("gen", task): [(spec.params_cls, ())] for task, spec in TASKS.items()},
    ("sweep",): [(SweepOptions, ())],
    ("fit",): [(TableColumns, ()), (TableFitOptions, ()), (FitOutput, ())],
}
# commands whose every option is a field of their options dataclasses (nothing written by hand)
ALL_GENERATED = [("sweep",), ("fit",)]


def _command(path: tuple[str, ...]) -> click.Command:
    command = ROOT
    for name in path:
        command = command.get_command(click.Context(command), name)
    return command


def _commands(group: click.Command = ROOT, path: tuple[str, ...] = ()):
    if isinstance(group, click.Group):
        for name in group.list_commands(click.Context(group)):
            yield from _commands(group.get_command(click.Context(group), name), (*path, name))
    else:
        yield path, group


@pytest.mark.parametrize("path", GENERATED, ids=" ".join)
def test_every_field_is_a_flag_with_help_and_its_default(path):
    options = {p.name: p for p in _command(path).params if p.param_type_name == "option"}
    for cls, left_out in GENERATED[path]:
        for f in dataclasses.fields(cls):
            if f.name in left_out:
                continue
            assert f.name in options, f"{' '.join(path)}: {cls.__name__}.{f.name} has no flag"
            option = options[f.name]
            assert flag_name(f) in option.opts and option.help and f.metadata.get("help") in option.help
            if f.default not in (None, "", dataclasses.MISSING):  # the default is in the help (or shown by click)
                assert "[default:" in option.help or option.show_default, (path, f.name)


@pytest.mark.parametrize("path", ALL_GENERATED, ids=" ".join)
def test_no_option_is_written_by_hand(path):
    command = _command(path)
    options = {p.name for p in command.params if p.param_type_name == "option"} - {"help"}
    assert options == {f.name for cls, _ in GENERATED[path] for f in dataclasses.fields(cls)}
    # the function behind the command takes **kwargs (its parameters come from flags.with_signature):
    # a signature of typer.Option defaults written out again fails here
    function = inspect.unwrap(command.callback)
    assert function.__code__.co_flags & inspect.CO_VARKEYWORDS and "typer.Option(" not in inspect.getsource(function)


def test_the_flags_of_sweep_and_fit_are_short_aliases_bounds_and_plain_switches_as_before():
    sweep, fit = ({p.name: p for p in _command(path).params if p.param_type_name == "option"} for path in ALL_GENERATED)
    assert [sweep[n].opts for n in ("preset", "out", "jobs")] == [["--preset", "-p"], ["--out", "-o"], ["--jobs", "-j"]]
    assert sweep["seeds"].min == 1 and fit["bootstrap"].min == 0 and fit["drop_top_loss"].min == 0
    for switch, flag in [
        (sweep["dry_run"], "--dry-run"),
        (sweep["reevaluate"], "--reevaluate"),
        (fit["json_out"], "--json"),
    ]:
        assert switch.is_flag and switch.opts == [flag] and not switch.secondary_opts  # no --no-dry-run
    result = runner.invoke(app, ["sweep", "mano", "--seeds", "0"])
    assert result.exit_code == 2 and "--seeds" in result.output


def test_importing_the_cli_imports_neither_pandas_nor_scipy():
    """The fit's flags come from synthlab.scaling.options, which the package loads without its fitter."""
    code = "import sys, synthlab.cli; print(sorted({'pandas', 'scipy', 'torch'} & set(sys.modules)))"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )


def test_every_option_of_every_command_has_help():
    missing = [
        f"{' '.join(path)} {p.opts[0]}"
        for path, command in _commands()
        for p in command.params
        if p.param_type_name == "option" and not p.help and p.name != "help"
    ]
    assert missing == []


def test_train_help_shows_the_defaults():
    text = runner.invoke(app, ["train", "--help"], terminal_width=200).output
    assert "Optimizer steps (or use exposures)." in text and "Peak learning rate.  [default: 0.001]" in text


def test_version_and_completion():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == __version__
    assert "--show-completion" in runner.invoke(app, ["--help"]).output


def test_set_overrides_in_the_toml_keys(tmp_path, mano):
    config = tmp_path / "run.toml"
    config.write_text("[model]\nd_model = 48\nn_heads = 2\nn_layers = 1\nmax_seq_len = 32\n[train]\nsteps = 5\n")
    result = runner.invoke(
        app,
        [
            "train",
            "--data",
            str(mano),
            "--out",
            str(tmp_path / "run"),
            "--config",
            str(config),
            "--set",
            "model.d_model=32",
            "--set",
            "train.steps=2",
            "--set",
            "train.schedule=wsd",
            "--set",
            "train.lr=3e-3",
            "--batch-size",
            "8",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["d_model"] == 32 and saved["train"]["steps"] == 2  # --set over the file
    assert saved["train"]["schedule"] == "wsd" and saved["train"]["lr"] == 3e-3 and saved["train"]["batch_size"] == 8
    for bad, said in [
        (["--set", "d_model=32"], "--set takes model.FIELD=VALUE"),
        (["--set", "model.d_modle=32"], "d_modle"),
        (["--set", "train.steps=3"], "given twice"),
    ]:
        result = runner.invoke(
            app, ["train", "--data", str(mano), "--out", str(tmp_path / "bad"), "--steps", "1", *bad]
        )
        assert result.exit_code == 2 and said in result.output, result.output


@pytest.mark.parametrize("load,warned", [(0.0, False), (50.0, True)])
def test_a_warning_when_threads_exceed_the_idle_cores(monkeypatch, capsys, load, warned):
    import torch

    from synthlab.cli.train import _set_threads

    threads = torch.get_num_threads()
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    try:
        _set_threads(2)
    finally:
        torch.set_num_threads(threads)
    assert ("warning: 2 torch threads but about 0 of 4 cores are idle" in capsys.readouterr().err) == warned
