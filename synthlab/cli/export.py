"""`synthlab export RUN --format qwen2 --out DIR`: a trained model as a checkpoint other tools load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from synthlab.cli import flags
from synthlab.files import check_writable
from synthlab.serialize import option


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """Where `synthlab export` writes, in what format, from which dataset. These are the arguments
    of export_run, beside the command rather than in synthlab.ouroboros, which imports torch on
    import (the CLI starts without it)."""

    out: Path = option(
        dataclasses.MISSING,
        "Checkpoint folder to write (an earlier export there is replaced; anything else only with --overwrite).",
    )
    fmt: str = option(
        "qwen2",
        "Checkpoint format: qwen2 (Qwen2ForCausalLM + tokenizer: a loops = 1 model with Qwen2's block) or "
        "remote (any model, the lab's model code in the folder: from_pretrained(DIR, trust_remote_code=True), "
        "steps=N at load or per call; generate recomputes each token, no KV cache).",
        flag="--format",
    )  # checked by export_run against its FORMATS
    data: Path | None = option(
        None, "The run's dataset at its new place, if it moved (its vocabulary becomes the tokenizer)."
    )
    overwrite: bool = option(
        False,
        "Replace a non-empty --out that is not an earlier export (never the run, the working directory or a "
        "folder holding either).",
        flag="--overwrite",
    )


def _export(run_dir: Path, **kwargs) -> None:
    from synthlab.ouroboros.export import export_run  # torch: only when the command runs

    (options,) = flags.parsed(kwargs, ExportOptions)
    check_writable(options.out)
    path = export_run(run_dir, options.out, options.fmt, options.data, options.overwrite)
    trust = ", trust_remote_code=True" if options.fmt == "remote" else ""
    typer.echo(f"{run_dir} -> {path} ({options.fmt}: AutoModelForCausalLM / AutoTokenizer.from_pretrained(DIR{trust}))")


export = flags.with_signature(
    _export,
    [
        flags.argument("run_dir", Path, "Run directory of a trained model (qwen2: a loops = 1 model)."),
        *flags.dataclass_options(ExportOptions),
    ],
    "export",
    """Write the model as a Hugging Face folder with its tokenizer and a model card (README.md):
    AutoModelForCausalLM and AutoTokenizer load it with the lab's logits and token ids.""",
)
