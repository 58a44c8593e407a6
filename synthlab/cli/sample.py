"""`synthlab sample`: continue prompts with a trained run's model, through its cached decoding
(`LoopedGPT.generate`, synthlab/models/inference.py) and its dataset's tokenizer.

Its options are `SampleOptions` here: this command is the only place that samples from a run (no
library function takes them), so they live beside it, as `FitOutput` beside `synthlab fit`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from synthlab.cli import flags
from synthlab.cli.train import ProcessOptions, _set_threads
from synthlab.errors import SynthlabError
from synthlab.evaluation.options import DEVICE_HELP, at_least_one
from synthlab.serialize import option


@dataclasses.dataclass(frozen=True)
class SampleOptions:
    """What `synthlab sample RUN_DIR` continues, and how: the prompts, their length, depth, decode
    cache, temperature and seed, the run's moved dataset, the device."""

    prompt: list[str] = option(
        dataclasses.MISSING,
        "Text in the run's vocabulary, e.g. '<len_2> + 3 4 <ans>' (`<bos>` is added unless it is "
        "there); repeatable: one output line per prompt.",
    )
    max_new_tokens: int = option(8, "Tokens generated after each prompt.")
    steps: int | None = option(
        None, "Recurrent steps per token (default: the trained loops; more tests extrapolation)."
    )
    kv: str = option("full", "Decode-time KV-cache strategy: full (exact), first, last or mean.")
    temperature: float = option(0.0, "0: greedy; above 0: each token drawn from softmax(logits / temperature).")
    seed: int = option(0, "Seed of the draws (sampling, a random initial state).")
    data: Path | None = option(None, "The run's dataset at its new place, if it moved (its tokenizer).")
    device: str = option("auto", DEVICE_HELP)

    def __post_init__(self) -> None:
        # --steps and --kv are checked against the run's model (`check_eval_steps`, `generate`)
        at_least_one(max_new_tokens=self.max_new_tokens)
        if not 0 <= self.temperature < float("inf"):
            raise SynthlabError(f"--temperature must be a finite number >= 0 (0: greedy), got {self.temperature}")


def _sample(run_dir: Path, **kwargs) -> None:
    import torch  # torch, the data and the model: only when the command runs (the CLI starts without them)

    from synthlab.data.datasets import load_dataset, unverified_data
    from synthlab.evaluation.evaluate import check_eval_steps
    from synthlab.training.run_folders import autocast, load_run, open_run, resolve_device, trained_data

    options, process = flags.parsed(kwargs, SampleOptions, ProcessOptions)
    _set_threads(process.threads)
    check_eval_steps(options.steps, load_run(run_dir)[0].model.loops)
    dev = resolve_device(options.device)
    model, run, derived = open_run(run_dir, dev)
    with unverified_data(not process.verify):
        dataset = load_dataset(trained_data(run_dir, run, derived, moved_to=options.data), run.train.task)
    generator = torch.Generator(device=dev).manual_seed(options.seed)
    for text in options.prompt:
        try:
            ids = dataset.encode_prompt(text)
        except SynthlabError as err:
            raise SynthlabError(f"--prompt {text!r}: {str(err).split(': ', 1)[-1]}") from None
        with autocast(dev):
            out = model.generate(
                torch.tensor([ids], device=dev),
                options.max_new_tokens,
                kv_strategy=options.kv,
                steps=options.steps,
                generator=generator,
                temperature=options.temperature,
            )
        new = out.tokens[0, len(ids) :].tolist()
        if dataset.eos_id in new:
            new = new[: new.index(dataset.eos_id)]
        typer.echo(dataset.tokenizer.decode(new))


sample = flags.with_signature(
    _sample,
    [
        flags.argument("run_dir", Path, "Run directory made by `synthlab train` (finished or interrupted)."),
        *flags.dataclass_options(SampleOptions),
        *flags.dataclass_options(ProcessOptions),
    ],
    "sample",
    """Continue each --prompt with the run's model: one line per prompt, the generated tokens up to
    `<eos>` (not shown) or --max-new-tokens of them.""",
)
