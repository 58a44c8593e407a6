"""The command line's conventions: every option of every command is a field of an options
dataclass, with its help and its default shown, and no command writes a typer.Option by hand (the
whole app walked); importing the CLI stays light; --version; shell completion; --set overrides in
the run.toml's keys; the threads warning."""

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
from synthlab.cli.curves import CurvesOptions
from synthlab.cli.export import ExportOptions
from synthlab.cli.fit import FitOutput
from synthlab.cli.flags import flag_name, leaf_fields
from synthlab.cli.gen import GenOptions
from synthlab.cli.ouroboros import BuildOptions, EvalOptions, TrainFiles, TrainRuntime
from synthlab.cli.sample import SampleOptions
from synthlab.cli.sweep import PlotOptions, StepsOptions
from synthlab.cli.train import CapacityOutput, ProcessOptions, TrainCommand
from synthlab.evaluation.options import CapacityOptions, EvalRunOptions
from synthlab.models import ModelConfig
from synthlab.report.options import ReportOptions
from synthlab.scaling import TableColumns, TableFitOptions
from synthlab.sweeps.options import SweepOptions
from synthlab.training.configs import OuroborosConfig, OuroborosTrainConfig, TrainConfig
from synthlab_generators import TASKS

runner = CliRunner()
ROOT = typer.main.get_command(app)

# command path -> the options dataclasses its flags come from (fields left out: what the command
# does not take); every command of the app is here, those without options with none
GENERATED = {
    ("train",): [(TrainCommand, ()), (TrainConfig, ()), (ModelConfig, ("vocab_size",)), (ProcessOptions, ())],
    ("eval",): [(EvalRunOptions, ()), (ProcessOptions, ())],
    ("capacity",): [(CapacityOptions, ()), (CapacityOutput, ()), (ProcessOptions, ("threads",))],
    ("sample",): [(SampleOptions, ()), (ProcessOptions, ())],
    ("ouroboros", "build"): [(BuildOptions, ()), (OuroborosConfig, ())],
    ("ouroboros", "train"): [
        (TrainFiles, ()),
        (OuroborosTrainConfig, ()),
        (OuroborosConfig, ("variant",)),
        (TrainRuntime, ()),
    ],
    ("ouroboros", "eval"): [(EvalOptions, ())],
    **{("gen", task): [(spec.params_cls, ()), (GenOptions, ())] for task, spec in TASKS.items()},
    ("sweep",): [(SweepOptions, ())],
    ("plot",): [(PlotOptions, ())],
    ("steps",): [(StepsOptions, ())],
    ("report",): [(ReportOptions, ())],
    ("fit",): [(TableColumns, ()), (TableFitOptions, ()), (FitOutput, ())],
    ("curves",): [(CurvesOptions, ())],
    ("export",): [(ExportOptions, ())],
    ("prereg", "check"): [],
    ("publish",): [],
    ("version",): [],
    ("columns",): [],
}


def _command(path: tuple[str, ...]) -> click.Command:
    command = ROOT
    for name in path:
        command = command.get_command(click.Context(command), name)
    return command


def _commands(group: click.Command = ROOT, path: tuple[str, ...] = ()):
    """Every command of the app, subcommands of its groups included (typer's groups are those of the
    click it vendors, not click.Group: a group is what lists commands)."""
    if hasattr(group, "list_commands"):
        for name in group.list_commands(click.Context(group)):
            yield from _commands(group.get_command(click.Context(group), name), (*path, name))
    else:
        yield path, group


def _options(path: tuple[str, ...]) -> dict[str, click.Option]:
    return {p.name: p for p in _command(path).params if p.param_type_name == "option" and p.name != "help"}


@pytest.mark.parametrize("path", GENERATED, ids=" ".join)
def test_every_field_is_a_flag_with_help_and_its_default(path):
    options = _options(path)
    for cls, left_out in GENERATED[path]:
        for f in leaf_fields(cls):  # a section's fields are flags of their own
            if f.name in left_out:
                continue
            assert f.name in options, f"{' '.join(path)}: {cls.__name__}.{f.name} has no flag"
            option = options[f.name]
            flag = flag_name(f).split("/")[0]  # an on/off pair as written ('--index/--one-file'): its first
            assert flag in option.opts and option.help and f.metadata.get("help") in option.help
            if f.default not in (None, "", dataclasses.MISSING):  # the default is in the help (or shown by click)
                assert "[default:" in option.help or option.show_default, (path, f.name)
            assert option.required == (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


@pytest.mark.parametrize("path", [path for path, _ in _commands()], ids=" ".join)
def test_no_option_is_written_by_hand(path):
    """Every command of the app (subcommands included): its options are the fields of its options
    dataclasses and nothing else, and the function behind it declares none itself (its parameters
    come from flags.with_signature): a typer.Option, or a one-off flag beside the dataclasses, fails."""
    assert path in GENERATED, f"{' '.join(path)}: a command whose options come from no dataclass"
    fields = {f.name for cls, left_out in GENERATED[path] for f in leaf_fields(cls) if f.name not in left_out}
    assert set(_options(path)) == fields
    function = inspect.unwrap(_command(path).callback)
    assert "typer.Option(" not in inspect.getsource(function)
    if _command(path).params:
        assert "__signature__" in vars(function), f"{' '.join(path)}: parameters written by hand"


def test_groups_have_no_options_but_the_apps_own():
    """Only the app itself takes options before a command: --version (eager: it answers before any
    command is parsed, so it is the one typer.Option written out) and shell completion."""
    assert {p.name for p in ROOT.params} == {"version", "install_completion", "show_completion"}
    for name in ("gen", "ouroboros", "prereg"):
        assert [p.name for p in _command((name,)).params if p.name != "help"] == []


def test_the_flags_are_short_aliases_bounds_switches_metavars_and_required_as_before():
    sweep, fit = _options(("sweep",)), _options(("fit",))
    assert [sweep[n].opts for n in ("preset", "out", "jobs")] == [["--preset", "-p"], ["--out", "-o"], ["--jobs", "-j"]]
    for path in [("plot",), ("steps",), ("report",), ("curves",)]:
        assert _options(path)["out"].opts == ["--out", "-o"], path
    assert sweep["seeds"].min == 1 and fit["bootstrap"].min == 0 and fit["drop_top_loss"].min == 0
    for switch, flag in [
        (sweep["dry_run"], "--dry-run"),
        (sweep["reevaluate"], "--reevaluate"),
        (fit["json_out"], "--json"),
        (_options(("capacity",))["as_json"], "--json"),
        (_options(("export",))["overwrite"], "--overwrite"),
        (_options(("ouroboros", "eval"))["fsdp"], "--fsdp"),
        (_options(("gen", "mano"))["overwrite"], "--overwrite"),
    ]:
        assert switch.is_flag and switch.opts == [flag] and not switch.secondary_opts  # no --no-dry-run
    report = _options(("report",))
    assert (report["copy_results"].opts, report["copy_results"].secondary_opts) == (["--copy"], ["--no-copy"])
    assert (report["index"].opts, report["index"].secondary_opts) == (["--index"], ["--one-file"])
    assert _options(("export",))["fmt"].opts == ["--format"]
    assert _options(("eval",))["max_prompts"].metavar == "K"
    assert _options(("train",))["set"].metavar == "SECTION.FIELD=VALUE" and _options(("train",))["set"].multiple
    assert _options(("sample",))["prompt"].multiple and _options(("sample",))["prompt"].required
    assert all(_options(("ouroboros", "train"))[n].required for n in ("base", "corpus", "out"))
    result = runner.invoke(app, ["sweep", "mano", "--seeds", "0"])
    assert result.exit_code == 2 and "--seeds" in result.output


@pytest.mark.parametrize(
    "args, said",
    [
        (["eval", "RUN", "--max-prompts", "0"], "error: --max-prompts must be >= 1"),
        (["sample", "RUN", "--prompt", "x", "--temperature", "-1"], "error: --temperature must be"),
        (["sample", "RUN", "--prompt", "x", "--max-new-tokens", "0"], "error: --max-new-tokens must be >= 1"),
        (["ouroboros", "build", "--out", "OUT"], "error: give exactly one of --base PATH or --base-config"),
        (["ouroboros", "eval", "RUN", "--depths", ","], "error: --depths must name at least one value"),
        (["ouroboros", "eval", "RUN", "--depths", "1,x"], "error: --depths takes comma-separated int values"),
    ],
)
def test_an_options_dataclass_refuses_bad_values_in_one_line_before_any_work(args, said):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.output.startswith(said), result.output


def test_importing_the_cli_imports_neither_pandas_nor_scipy():
    """The fit's flags come from synthlab.scaling.options, which the package loads without its fitter."""
    code = "import sys, synthlab.cli; print(sorted({'pandas', 'scipy', 'torch'} & set(sys.modules)))"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )


def test_reading_definitions_and_their_preregistration_does_not_import_torch():
    """`prereg check` and a definition's checks need the stage names only (synthlab.sweeps.stages)."""
    code = (
        "import sys, synthlab.sweeps.experiments as e, synthlab.claims.prereg; e.load('exit'); "
        "print('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == (
        "False"
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
            "train.schedule.kind=wsd",
            "--set",
            "train.optim.lr=3e-3",
            "--batch-size",
            "8",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    train = saved["train"]  # written in its sections; the file and --set train.steps in the flat form
    assert saved["model"]["d_model"] == 32 and train["schedule"]["steps"] == 2  # --set over the file
    assert train["schedule"]["kind"] == "wsd" and train["optim"]["lr"] == 3e-3 and train["batch"]["batch_size"] == 8
    for bad, said in [
        (["--set", "d_model=32"], "--set takes model.FIELD=VALUE"),
        (["--set", "model.d_modle=32"], "d_modle"),
        (["--set", "train.steps=3"], "given twice"),
        (["--set", "train.schedule.steps=3"], "given twice"),
        (["--set", "train.optim.lrr=3"], "did you mean 'lr'"),
        (["--set", "train.warmup=3"], "did you mean 'schedule.warmup_steps'"),
    ]:
        result = runner.invoke(
            app, ["train", "--data", str(mano), "--out", str(tmp_path / "bad"), "--steps", "1", *bad]
        )
        assert result.exit_code == 2 and said in result.output, result.output


def test_train_help_lists_the_options_by_the_sections_of_a_run_toml():
    """--help follows the nesting: each section's flags under its heading, in the order of the
    dataclass, the flags keeping their names."""
    result = runner.invoke(app, ["train", "--help"], terminal_width=200)
    headings = [line for line in result.output.splitlines() if line and not line.startswith(" ")]
    sections = [h.split(":")[0] for h in headings if h.startswith(("train", "model"))]
    assert sections == [
        "train",
        *(f"train.{f.name}" for f in dataclasses.fields(TrainConfig) if "section" in f.metadata),
        "model",
    ]
    after = result.output.split("train.optim: AdamW:")[1]
    assert after.lstrip().startswith("--lr") and after.index("--lr") < after.index("train.schedule")


@pytest.mark.parametrize("load,cores,warned", [(0.0, 4, False), (50.0, 4, True), (0.2, 2, False), (0.6, 2, True)])
def test_a_warning_when_threads_exceed_the_idle_cores(monkeypatch, capsys, load, cores, warned):
    import torch

    from synthlab.cli.train import _set_threads

    threads = torch.get_num_threads()
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    try:
        _set_threads(2)
    finally:
        torch.set_num_threads(threads)
    idle = {0.0: 4, 50.0: 0, 0.2: 2, 0.6: 1}[load]  # the cores less the load, to the nearest whole one
    assert (f"warning: 2 torch threads but about {idle} of {cores} cores are idle" in capsys.readouterr().err) == warned
