"""`synthlab train`, `synthlab eval`, `synthlab capacity`: thin wrappers over synthlab.training.trainer,
synthlab.evaluation.evaluate and synthlab.evaluation.capacity. Those, the data and run-folder modules
(torch, tokenizers) are imported inside the commands, so that the CLI starts without them."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import tomllib
import typer

from synthlab import serialize
from synthlab.cli import flags
from synthlab.errors import SynthlabError
from synthlab.evaluation.options import CapacityOptions, EvalRunOptions
from synthlab.files import atomic_write_text, warn
from synthlab.models import ModelConfig
from synthlab.serialize import option
from synthlab.sweeps.gpu_scheduling import default_threads, idle_cores
from synthlab.training.configs import TrainConfig, flat_train, nested_train


@dataclasses.dataclass(frozen=True)
class ProcessOptions:
    """How this process runs a command on a run's data: its torch CPU threads, and whether the
    dataset's files are hashed first. Purely the command line's (`_set_threads`, `unverified_data`
    around the command's work), shared by train, eval, sample and capacity."""

    threads: int | None = option(
        None,
        "torch CPU threads (default: the machine's idle cores, one when they are busy; a warning says when "
        "more than the idle cores are asked).",
    )
    verify: bool = option(
        True,
        "Hash the dataset's files against meta.json before use (once per change of size or mtime); "
        "--no-verify uses them as they are.",
    )


@dataclasses.dataclass(frozen=True)
class TrainCommand:
    """What `synthlab train` is told besides the run's model and training options: where the run
    goes, a config file and overrides of its keys, a run to continue, the progress bar. Purely the
    command line's (how `resolve_run_config` and `--resume` combine them lives here)."""

    out: Path | None = option(None, "New (or empty) run directory to create.")
    config: Path | None = option(None, "run.toml (or .json) with a model table and a train table; flags override it.")
    resume: Path | None = option(
        None,
        "Continue the run in this directory from its checkpoint (no other run options but --steps N: "
        "train a run on to N steps, the steps past its schedule at the rate of its last step; a run "
        "its --stop-when ended is finished and stays so); auto: "
        "with --out and the run's options, start the run there or continue it if it is there "
        "(the same command line for torchrun --max-restarts and a Slurm requeue; ./auto names a "
        "folder called auto).",
    )
    set: list[str] | None = option(
        None,
        "SECTION.FIELD=VALUE, as in a run.toml (model.d_model=32, train.optim.lr=3e-4; train.lr=3e-4, "
        "the key before train's sections, too); repeatable; "
        "overrides --config like the field's own flag.",
        metavar="SECTION.FIELD=VALUE",
    )
    progress: bool = option(True, "Show the progress bar.")


@dataclasses.dataclass(frozen=True)
class CapacityOutput:
    """What `synthlab capacity` reads and prints (purely the command's: one estimate or the curve)."""

    as_json: bool = option(False, "Print the whole report as JSON.", flag="--json")
    curve: bool = option(
        False,
        "Read every kept checkpoint in turn (each into its capacity_checkpointS.json; one already written "
        "after its checkpoint is reused, so a stopped curve goes on): the learning curve, "
        "bits/param against exposures, printed as it goes and written to RUN_DIR/capacity_curve.csv; flat at "
        "the end means the run had saturated.",
        flag="--curve",
    )


def resolve_run_config(file: dict[str, Any], model_flags: dict[str, Any], train_flags: dict[str, Any]):
    """CLI flags > run.toml sections > defaults; the vocabulary size comes from the data folder.

    Paths (the data folder, init_from) are stored absolute, so the run folder works from anywhere.
    """
    from synthlab.data.datasets import load_dataset  # tokenizers, torch: only when a command runs
    from synthlab.training.run_folders import RunConfig

    for section in file:
        if section not in ("model", "train"):
            close = difflib.get_close_matches(section, ["model", "train"], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SynthlabError(f"unknown config section '{section}'{hint}; a run config has [model] and [train]")
    train_dict = {**flat_train(file.get("train", {})), **train_flags}  # a run.toml of either form
    for flag, other in (("steps", "exposures"), ("exposures", "steps")):
        if flag in train_flags and other not in train_flags:
            train_dict.pop(other, None)  # a length on the command line replaces the file's
    for key in ("data", "init_from"):
        if train_dict.get(key):
            train_dict[key] = str(Path(train_dict[key]).resolve())
    train_cfg = serialize.from_dict(TrainConfig, nested_train(train_dict), where="train.")
    if not train_cfg.data:
        raise SynthlabError("no data folder: pass --data DIR (or train.data in the config file)")
    data = load_dataset(train_cfg.data, train_cfg.task or None)
    model_dict = {**file.get("model", {}), **model_flags}
    vocab = len(data.tokenizer)
    if model_dict.setdefault("vocab_size", vocab) != vocab:
        raise SynthlabError(
            f"model.vocab_size is {model_dict['vocab_size']} but the data's vocabulary has {vocab} tokens"
        )
    train_cfg = serialize.merge(train_cfg, {"task": data.task})
    return RunConfig(serialize.from_dict(ModelConfig, model_dict, where="model."), train_cfg)


def _train(**kwargs) -> None:
    from synthlab.data.datasets import unverified_data
    from synthlab.training.trainer import train as run_training

    command, process = flags.parsed(kwargs, TrainCommand, ProcessOptions)
    out, config, resume, progress, verify = (
        command.out,
        command.config,
        command.resume,
        command.progress,
        process.verify,
    )
    _set_threads(process.threads)
    # the training options flat, as their flags are (`lr`; --set train.optim.lr=... too)
    model_flags, train_flags = flags.given(kwargs, ModelConfig), flat_train(flags.given(kwargs, TrainConfig))
    for section, key, value in map(_setting, command.set or []):
        given = model_flags if section == "model" else train_flags
        key = key if section == "model" else next(iter(flat_train({key: value})))
        if key in given:
            raise SynthlabError(f"{section}.{key} is given twice (a flag and --set); keep one")
        given[key] = value
    if resume is not None and str(resume) == "auto":
        resume = _auto_resume(out, config, model_flags, train_flags)
        if resume is not None:
            model_flags, train_flags, out, config = {}, {}, None, None
    if resume is not None:
        moved = train_flags.pop("data", None)  # the run's dataset at a new place (checked by its sha256s)
        longer = train_flags.pop("steps", None)  # a finished run extended to this many steps
        given = [*model_flags, *train_flags] + [k for k, v in {"out": out, "config": config}.items() if v is not None]
        if given:
            raise SynthlabError(
                "--resume continues a run as configured (--steps N extends it, --data DIR finds its moved "
                f"dataset); drop --{given[0].replace('_', '-')}"
            )
        with unverified_data(not verify):
            result = run_training(resume, None, progress=progress, data=moved, extend_to=longer)
        run_dir = resume
    else:
        if out is None:
            raise SynthlabError("--out RUN_DIR is required (or --resume RUN_DIR)")
        file = serialize.load_dict(config) if config else {}
        with unverified_data(not verify):
            run = resolve_run_config(file, model_flags, train_flags)
            result = run_training(out, run, progress=progress)
        run_dir = out
    if result.interrupted:
        if result.main:
            typer.echo(
                f"interrupted at step {result.step}/{result.total_steps}; checkpoint written; continue with: synthlab train --resume {run_dir}",
                err=True,
            )
        raise typer.Exit(code=130)
    if result.main:
        met = f" (train.schedule.stop_when met: {result.stopped_by})" if result.stopped_by else ""
        typer.echo(f"done: {result.step} steps{met}, final loss {result.final_loss:.4f}, run in {run_dir}")


def _auto_resume(out: Path | None, config: Path | None, model_flags: dict, train_flags: dict) -> Path | None:
    """--resume auto: the run in --out to continue (checked to be the run the options describe), or
    None to start it there. Under torchrun every process decides before any writes: rank 0 writes
    only after a collective all of them join (synthlab.training.trainer), so all see the same folder."""
    from synthlab.sweeps.lab_runner import check_same_run

    if out is None:
        raise SynthlabError("--resume auto needs --out RUN_DIR (the run to start, or to continue when it is there)")
    if not (Path(out) / "config.json").is_file():
        return None
    file = serialize.load_dict(config) if config else {}
    check_same_run(
        Path(out),
        resolve_run_config(file, model_flags, train_flags),
        asked="these options describe",
        remedy="train into a new --out, or continue it as it was with --resume RUN_DIR alone",
    )
    return Path(out)


def _setting(text: str) -> tuple[str, str, Any]:
    """--set SECTION.FIELD=VALUE as (section, field, value); VALUE in TOML syntax (32, 1e-3, true,
    [1, 2], "text"), a bare word as text."""
    key, sep, raw = text.partition("=")
    section, dot, field = key.strip().partition(".")
    if not sep or not dot or section not in ("model", "train") or not field:
        raise SynthlabError(
            f"--set takes model.FIELD=VALUE or train.[SECTION.]FIELD=VALUE (the run.toml keys), got '{text}'"
        )
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, field, value


def _train_command():
    """`synthlab train`: every ModelConfig and TrainConfig field is a flag (help from the field)."""
    params = [
        *flags.dataclass_options(TrainCommand),
        *flags.dataclass_options(TrainConfig, unset=True, panel="train: the data, seed and objective"),
        *flags.dataclass_options(ModelConfig, unset=True, exclude=("vocab_size",), panel="model: the architecture"),
        *flags.dataclass_options(ProcessOptions),
    ]
    return flags.with_signature(
        _train,
        params,
        "train",
        "Train a model of the looped family on a generated dataset, into a self-describing run directory.",
    )


train = _train_command()


def _set_threads(threads: int | None) -> None:
    """--threads: torch's CPU threads for this process (None: the idle cores, `default_threads`,
    the choice printed once on a terminal), with a warning when this machine's processes of the run ask for more
    threads than it has idle cores."""
    import torch

    from synthlab.training.distributed import reporting

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun: processes per machine
    if threads is None:
        threads, why = default_threads(local)
        # On a terminal only: off one, the first line a script reads stays the result or the error.
        if reporting() and sys.stderr.isatty():
            print(f"{why} (--threads sets them)", file=sys.stderr, flush=True)
    if threads < 1:
        raise SynthlabError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    cores, load = idle_cores()
    # Idle cores to the nearest whole one, as the warning prints them: a machine at load 0.2 has its
    # 2 cores idle for 2 threads, not 1.8 of them.
    wanted, idle = threads * local, max(0, math.floor(cores - load + 0.5))
    if wanted > max(1, idle) and reporting():
        warn(
            f"{wanted} torch threads but about {idle} of {cores} cores are idle (load average "
            f"{load:.1f}): threads waiting for busy cores can make training several times slower; "
            f"consider --threads {max(1, idle // local)}"
        )


def _evaluate(run_dir: Path, **kwargs) -> None:
    from synthlab.data.datasets import unverified_data
    from synthlab.evaluation.evaluate import evaluate_run

    options, process = flags.parsed(kwargs, EvalRunOptions, ProcessOptions)
    _set_threads(process.threads)
    with unverified_data(not process.verify):
        result = evaluate_run(
            run_dir,
            data_dir=options.data,
            steps=options.steps,
            exit_rule=options.exit,
            kv=options.kv,
            batch_size=options.batch_size,
            device=options.device,
            max_prompts=options.max_prompts,
            progress=options.progress,
        )
    per_step = " ".join(f"{a:.3f}" for a in result["accuracy_per_step"])
    typer.echo(
        f"{result['task']}: accuracy {result['accuracy']:.4f} on {result['n_examples']} test items; per step: {per_step}"
    )
    held, trained = result["groups"]["heldout"], result["groups"].get("train", {})

    def share(stats: dict, group: str) -> str:
        return f"{stats[group]['accuracy']:.3f}" if group in stats else "-"

    cells = [f"{g} {share(held, g)}/{share(trained, g)}" for g in dict.fromkeys([*trained, *held])]
    typer.echo(
        f"per {result['group_key']} at step {result['groups_at_step']}, accuracy held-out/training prompts: "
        f"{', '.join(cells)}"
    )
    for key in ("exit_accuracy", "mean_exit_step", "kv_accuracy"):
        if key in result:
            typer.echo(f"{key}: {result[key]:.4f}")
    typer.echo(f"wrote {Path(run_dir) / result['file']}")


evaluate = flags.with_signature(
    _evaluate,
    [
        flags.argument("run_dir", Path, "Run directory made by `synthlab train`."),
        *flags.dataclass_options(EvalRunOptions),
        *flags.dataclass_options(ProcessOptions),
    ],
    "eval",
    "Exact-match accuracy (QA accuracy and loss per attribute for bios) at every recurrent step -> "
    "RUN_DIR/eval/*.json.",
)


def _capacity(run_dir: Path, **kwargs) -> None:
    from synthlab.data.datasets import unverified_data
    from synthlab.evaluation.capacity import estimate_capacity, learning_curve

    options, output, process = flags.parsed(kwargs, CapacityOptions, CapacityOutput, ProcessOptions)
    if output.curve and options.checkpoint is not None:
        raise SynthlabError("--curve reads every kept checkpoint; --checkpoint names one: give either")
    estimate = {
        "data_dir": options.data,
        "batch_size": options.batch_size,
        "device": options.device,
        "steps": options.steps,
    }
    with unverified_data(not process.verify):
        if output.curve:
            curve = learning_curve(run_dir, on_point=None if output.as_json else _print_curve_point, **estimate)
        else:
            report = estimate_capacity(run_dir, checkpoint=options.checkpoint, **estimate)
    if output.curve:
        path = Path(run_dir) / "capacity_curve.csv"
        atomic_write_text(path, curve.to_csv(index=False))
        typer.echo(curve.to_json(orient="records", indent=2) if output.as_json else f"wrote {path}")
        return
    if output.as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(
        f"N = {report['n_people']}: p1 = {report['p1']:.3f}, p2 = {report['p2']:.3f} nats; "
        f"bits = {report['bits']:,.0f} of max {report['max_bits']:,.0f}; "
        f"P = {report['params']:,}; bits/param = {report['bits_per_param']:.3f}"
    )
    for name, row in report["per_attribute"].items():
        typer.echo(
            f"  {name:<11} loss {row['loss']:.3f} nats  bits {row['bits']:,.0f}  (of log2 {row['values']} per person)"
        )


def _print_curve_point(row: dict) -> None:
    typer.echo(f"step {row['checkpoint']:,}: {row['exposures']:.1f} exposures, {row['bits_per_param']:.3f} bits/param")


capacity = flags.with_signature(
    _capacity,
    [
        flags.argument("run_dir", Path, "Run directory of a model trained on bios."),
        *flags.dataclass_options(CapacityOptions),
        *flags.dataclass_options(CapacityOutput),
        # no --threads: capacity runs on torch's own thread count, as it always has
        *flags.dataclass_options(ProcessOptions, exclude=("threads",)),
    ],
    "capacity",
    "Bits of knowledge stored (Physics of LMs 3.3, Def. 4.3) and bits per parameter -> RUN_DIR/capacity.json.",
)
