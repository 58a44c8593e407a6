"""`synthlab export RUN --format qwen2 --out DIR`: a trained model as a checkpoint other tools load."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from synthlab.files import check_writable


def export(
    run_dir: Path = typer.Argument(..., help="Run directory of a trained model (qwen2: a loops = 1 model)."),
    out: Path = typer.Option(
        ...,
        "--out",
        help="Checkpoint folder to write (an earlier export there is replaced; anything else only with --overwrite).",
    ),
    fmt: str = typer.Option(
        "qwen2",
        "--format",
        help="Checkpoint format: qwen2 (Qwen2ForCausalLM + tokenizer: a loops = 1 model with Qwen2's block) or "
        "remote (any model, the lab's model code in the folder: from_pretrained(DIR, trust_remote_code=True), "
        "steps=N at load or per call; generate recomputes each token, no KV cache).",
    ),
    data: Optional[Path] = typer.Option(
        None, help="The run's dataset at its new place, if it moved (its vocabulary becomes the tokenizer)."
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace a non-empty --out that is not an earlier "
        "export (never the run, the working directory or a "
        "folder holding either).",
    ),
) -> None:
    """Write the model as a Hugging Face folder with its tokenizer and a model card (README.md):
    AutoModelForCausalLM and AutoTokenizer load it with the lab's logits and token ids."""
    from synthlab.ouroboros.export import export_run

    check_writable(out)
    path = export_run(run_dir, out, fmt, data, overwrite)
    trust = ", trust_remote_code=True" if fmt == "remote" else ""
    typer.echo(f"{run_dir} -> {path} ({fmt}: AutoModelForCausalLM / AutoTokenizer.from_pretrained(DIR{trust}))")
