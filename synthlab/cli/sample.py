"""`synthlab sample`: continue prompts with a trained run's model, through its cached decoding
(`LoopedGPT.generate`, synthlab/models/inference.py) and its dataset's tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from synthlab.cli.train import VERIFY_HELP, _at_least_one, _set_threads
from synthlab.errors import SynthlabError


def sample(
    run_dir: Path = typer.Argument(..., help="Run directory made by `synthlab train` (finished or interrupted)."),
    prompt: List[str] = typer.Option(
        ...,
        "--prompt",
        help="Text in the run's vocabulary, e.g. '<len_2> + 3 4 <ans>' (`<bos>` is added unless it is "
        "there); repeatable: one output line per prompt.",
    ),
    max_new_tokens: int = typer.Option(8, "--max-new-tokens", help="Tokens generated after each prompt."),
    steps: Optional[int] = typer.Option(
        None, help="Recurrent steps per token (default: the trained loops; more tests extrapolation)."
    ),
    kv: str = typer.Option("full", help="Decode-time KV-cache strategy: full (exact), first, last or mean."),
    temperature: float = typer.Option(
        0.0, help="0: greedy; above 0: each token drawn from softmax(logits / temperature)."
    ),
    seed: int = typer.Option(0, help="Seed of the draws (sampling, a random initial state)."),
    data: Optional[Path] = typer.Option(None, help="The run's dataset at its new place, if it moved (its tokenizer)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's choice)."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help=VERIFY_HELP),
) -> None:
    """Continue each --prompt with the run's model: one line per prompt, the generated tokens up to
    `<eos>` (not shown) or --max-new-tokens of them."""
    import torch

    from synthlab.data.datasets import load_dataset, unverified_data
    from synthlab.evaluation.evaluate import check_eval_steps
    from synthlab.training.run_folders import autocast, load_run, open_run, resolve_device, trained_data

    _at_least_one(max_new_tokens=max_new_tokens)
    if not 0 <= temperature < float("inf"):
        raise SynthlabError(f"--temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    _set_threads(threads)
    check_eval_steps(steps, load_run(run_dir)[0].model.loops)
    dev = resolve_device(device)
    model, run, derived = open_run(run_dir, dev)
    with unverified_data(not verify):
        dataset = load_dataset(trained_data(run_dir, run, derived, moved_to=data), run.train.task)
    generator = torch.Generator(device=dev).manual_seed(seed)
    for text in prompt:
        try:
            ids = dataset.encode_prompt(text)
        except SynthlabError as err:
            raise SynthlabError(f"--prompt {text!r}: {str(err).split(': ', 1)[-1]}") from None
        with autocast(dev):
            out = model.generate(
                torch.tensor([ids], device=dev),
                max_new_tokens,
                kv_strategy=kv,
                steps=steps,
                generator=generator,
                temperature=temperature,
            )
        new = out.tokens[0, len(ids) :].tolist()
        if dataset.eos_id in new:
            new = new[: new.index(dataset.eos_id)]
        typer.echo(dataset.tokenizer.decode(new))
