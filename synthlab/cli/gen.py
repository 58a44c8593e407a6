"""`synthlab gen TASK [options] --seed S --out DIR [--overwrite]`: write a task's dataset.

One subcommand per entry of the generator registry (`synthlab_generators.TASKS`); each command's
options are built from the fields of that task's params dataclass (flag, type, default and help
text live in the dataclass), so the CLI and the library cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import shutil
import signal
from pathlib import Path

import click
import typer
from typer.core import TyperGroup

from synthlab.cli import flags
from synthlab.errors import SynthlabError
from synthlab.files import check_out
from synthlab.progress import Progress
from synthlab.serialize import option, to_dict
from synthlab_generators import TASKS, TaskSpec, write_dataset


class _TaskGroup(TyperGroup):
    """An unknown task is one line naming it (SynthlabError), not click's usage block."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, list(TASKS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SynthlabError(f"unknown task '{name}'{hint}; tasks: {', '.join(TASKS)}")
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=_TaskGroup,
    help="Generate a task's dataset: DIR/meta.json, vocab.json, train.jsonl, test.jsonl (+ extras).",
    no_args_is_help=True,
    rich_markup_mode=None,  # help text as written: no [markup] (it ate '[default: ...]', 'W[h; h]')
)


def default_out(task: str, params, seed: int) -> Path:
    """data/<task>-<8 hex digits of sha256(params, seed, generator version if not 1)>: one folder
    per distinct dataset."""
    key = json.dumps({"params": to_dict(params), "seed": seed, **TASKS[task].version_key()}, sort_keys=True)
    return Path("data") / f"{task}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


# Bytes on disk per training token, lowest and highest over the tasks (measured on their
# defaults: extra files, test splits and JSON syntax included); tokens come from the task's shape.
BYTES_PER_TOKEN = (7.0, 30.0)


def check_size(spec: TaskSpec, params, out: Path) -> None:
    """State a big generation's expected size (over ~1 GB: records, tokens, bytes) and refuse one
    that cannot fit on the disk (even at its lowest estimate) before anything is written."""
    shape = spec.shape(params)
    tokens = shape.tokens_per_record * shape.train_records
    low, high = (tokens * b / 1e9 for b in BYTES_PER_TOKEN)
    if high < 1:
        return
    typer.echo(
        f"gen {spec.name}: {shape.train_records:,} training records, about {tokens:,.0f} tokens: "
        f"expect {low:.1f}-{high:.1f} GB on disk",
        err=True,
    )
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free / 1e9
    if low > free:
        raise SynthlabError(f"--out {out}: the dataset needs at least {low:.1f} GB but {folder} has {free:.1f} GB free")


def _raise_exit(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


@dataclasses.dataclass(frozen=True)
class GenOptions:
    """What every `synthlab gen TASK` adds to its task's params: the seed, and where the dataset
    goes. Purely the command line's (`write_dataset` takes them as its arguments, the default
    folder is this command's `default_out`)."""

    seed: int = option(0, "Seed of the random generator; same command and seed give byte-identical files.")
    out: Path | None = option(
        None,
        "Output folder (default: data/<task>-<hash of the parameters and seed>). "
        "Written to a temporary sibling, renamed at the end.",
    )
    overwrite: bool = option(False, "Replace --out if it exists and is not empty.", flag="--overwrite")


def _command(spec: TaskSpec):
    """A typer command whose options are the params dataclass's fields + GenOptions'."""
    options = flags.dataclass_options(spec.params_cls) + flags.dataclass_options(GenOptions)

    def command(**kwargs) -> None:
        params, gen = flags.parsed(kwargs, spec.params_cls, GenOptions)
        seed, out, overwrite = gen.seed, gen.out, gen.overwrite
        out = out if out is not None else default_out(spec.name, params, seed)
        check_out(Path(out), overwrite, kind="a dataset")
        check_size(spec, params, Path(out))
        # SIGTERM (kill, a scheduler) as an exception, so the temporary folder is removed too
        previous = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            write_dataset(
                spec,
                params,
                seed,
                out,
                overwrite=overwrite,
                progress=lambda total: Progress(total, desc=f"gen {spec.name}", unit="record"),
            )
        finally:
            signal.signal(signal.SIGTERM, previous)
        meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
        counts = ", ".join(f"{k} {v}" for k, v in meta["counts"].items())
        typer.echo(f"wrote {out} ({counts})")

    return flags.with_signature(command, options, spec.name, spec.help)


for _spec in TASKS.values():
    app.command(_spec.name, help=_spec.help)(_command(_spec))
