"""The `[ouroboros]` section of an experiment and the sweep stage that runs it (claim C11).

A point of `experiments/ouroboros.toml` trains a synthlab base (stage `train`), exports it as a
Qwen2 checkpoint (stage `export`, synthlab.ouroboros.export) and then, in stage `ouroboros`, trains ONE
looped variant of the system on that checkpoint with the base's own training text (resumable:
synthlab.ouroboros.runs) and evaluates it at every depth of `eval_depths` on the held-out end of that text
(the last `heldout_fraction` of the packed sequences, never trained on by the system), with the
truncated and full base as references.

The section's keys are the fields of OuroborosConfig (the system: `variant`, `rank`, `alpha`,
split...), of OuroborosTrainConfig (`steps`, `seq_len`, `lr`, `depths`, `seed`...), the
evaluation's own (`eval_depths`, `eval_batch_size`, `eval_max_sequences`) and the source's
(`base`, `corpus`, `text_field`: a local Qwen2 checkpoint and corpus given by the user instead of
the synthlab base and its text; the point then trains no synthlab model), flat, so a grid axis is
"ouroboros.variant" or "ouroboros.seed".

Row columns: `trainable_params`, `loss_depth_<k>` (held-out loss of the variant at depth k),
`loss_truncated`, `loss_base`, `ouro_steps`, `ouro_train_loss` (mean of the last 10% of steps).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synthlab import serialize
from synthlab.errors import SynthlabError
from synthlab.ouroboros.system import LOOPED_VARIANTS, OuroborosConfig
from synthlab.ouroboros.train import OuroborosTrainConfig
from synthlab.serialize import content_hash


@dataclass
class OuroborosEval:
    eval_depths: tuple[int, ...] = (1, 2, 4, 8)
    eval_batch_size: int = 8
    eval_max_sequences: int | None = None

    def __post_init__(self) -> None:
        if not self.eval_depths or min(self.eval_depths) < 1:
            raise SynthlabError(f"ouroboros.eval_depths must be positive integers, got {self.eval_depths}")
        if self.eval_batch_size < 1:
            raise SynthlabError(f"ouroboros.eval_batch_size must be >= 1, got {self.eval_batch_size}")


@dataclass
class OuroborosSource:
    base: str | None = None  # a local Qwen2 checkpoint folder (default: the exported synthlab base)
    corpus: str | None = None  # its training text (default: the synthlab dataset's train.jsonl)
    text_field: str = "text"

    def __post_init__(self) -> None:
        if (self.base is None) != (self.corpus is None):
            raise SynthlabError("ouroboros.base and ouroboros.corpus go together (a given checkpoint and its text)")


@dataclass
class OuroborosOptions:
    """A point's `[ouroboros]` section, parsed: the system, its training, evaluation and source."""

    system: OuroborosConfig = field(default_factory=OuroborosConfig)
    train: OuroborosTrainConfig = field(default_factory=OuroborosTrainConfig)
    eval: OuroborosEval = field(default_factory=OuroborosEval)
    source: OuroborosSource = field(default_factory=OuroborosSource)

    def to_dict(self) -> dict[str, Any]:
        return {
            **serialize.to_dict(self.system),
            **serialize.to_dict(self.train),
            **serialize.to_dict(self.eval),
            **serialize.to_dict(self.source),
        }


def parse_section(raw: dict[str, Any]) -> OuroborosOptions:
    """The section's flat keys, each given to the dataclass that owns it (unknown keys fail)."""
    classes = (OuroborosConfig, OuroborosTrainConfig, OuroborosEval, OuroborosSource)
    names = [{f.name for f in dataclasses.fields(cls)} for cls in classes]
    unknown = sorted(set(raw).difference(*names))
    if unknown:
        raise SynthlabError(f"ouroboros.{unknown[0]}: unknown field (have {', '.join(sorted(set().union(*names)))})")
    options = OuroborosOptions(
        *(
            serialize.from_dict(cls, {k: v for k, v in raw.items() if k in keys}, where="ouroboros.")
            for cls, keys in zip(classes, names)
        )
    )
    if options.system.variant not in LOOPED_VARIANTS:
        raise SynthlabError(
            f"ouroboros.variant must be one of {', '.join(LOOPED_VARIANTS)} (truncated and base "
            f"are evaluated with every point), got '{options.system.variant}'"
        )
    too_deep = max(options.train.depths + options.eval.eval_depths)
    if too_deep > options.system.max_steps:
        raise SynthlabError(f"ouroboros: depth {too_deep} exceeds max_steps {options.system.max_steps}")
    return options


def run_stage(options: OuroborosOptions, base: Path, corpus: Path, out: Path) -> dict[str, Any]:
    """Train the point's variant on `base` with `corpus` (or the section's own source) in
    out/<hash of the options> (resumed when rerun), evaluate it by depth; returns the row's columns."""
    import pandas as pd

    from synthlab.ouroboros.runs import LOG, eval_run, train_run

    folder = Path(out) / content_hash(options.to_dict())
    variant = options.system.variant
    if options.source.base is not None:
        base, corpus = Path(options.source.base), Path(options.source.corpus)
    run = train_run(
        str(base),
        str(corpus),
        folder,
        [variant],
        options.system,
        options.train,
        text_field=options.source.text_field,
        progress=False,
    )
    table = eval_run(
        folder,
        list(options.eval.eval_depths),
        batch_size=options.eval.eval_batch_size,
        max_sequences=options.eval.eval_max_sequences,
        progress=False,
    )
    loss = {(row.variant, row.depth): row.loss for row in table.itertuples()}
    log = pd.read_csv(folder / variant / LOG)
    tail = log["loss"].iloc[-max(1, len(log) // 10) :]
    depth = options.eval.eval_depths[0]
    return {
        "trainable_params": run["trainable_params"][variant],
        "ouro_steps": len(log),
        "ouro_train_loss": float(tail.mean()),
        **{f"loss_depth_{d}": loss[(variant, d)] for d in options.eval.eval_depths},
        "loss_truncated": loss[("truncated", depth)],
        "loss_base": loss[("base", depth)],
    }
