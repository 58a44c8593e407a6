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
from synthlab.training.configs import ouroboros_train_keys

NEW = "train"  # eval_run names a corpus by its file's stem: the new people's train.jsonl


@dataclass
class OuroborosEval:
    eval_depths: tuple[int, ...] = (1, 2, 4, 8)
    eval_batch_size: int = 8
    eval_max_sequences: int | None = None
    # A second dataset of the point's task with this data seed (other people, the same generator
    # parameters): text the base never saw, evaluated beside the held-out end of its own text
    # (columns loss_new_depth_<k>). Both corpora are cut to eval_max_sequences, which it needs, so
    # that one outcomes file holds both.
    eval_data_seed: int | None = None

    def __post_init__(self) -> None:
        if not self.eval_depths or min(self.eval_depths) < 1:
            raise SynthlabError(f"ouroboros.eval_depths must be positive integers, got {self.eval_depths}")
        if self.eval_batch_size < 1:
            raise SynthlabError(f"ouroboros.eval_batch_size must be >= 1, got {self.eval_batch_size}")
        if self.eval_max_sequences is not None and self.eval_max_sequences < 1:
            raise SynthlabError(f"ouroboros.eval_max_sequences must be >= 1, got {self.eval_max_sequences}")
        if self.eval_data_seed is not None and (self.eval_data_seed < 0 or self.eval_max_sequences is None):
            raise SynthlabError(
                "ouroboros.eval_data_seed must be an integer >= 0 and needs eval_max_sequences (both corpora are "
                f"cut to it), got seed {self.eval_data_seed}, eval_max_sequences {self.eval_max_sequences}"
            )


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
    raw = ouroboros_train_keys(raw)  # a preset's batch_size: micro_batch_size
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
    if options.source.base is not None and options.eval.eval_data_seed is not None:
        raise SynthlabError("ouroboros.eval_data_seed needs the synthlab base and its task (not a given base)")
    too_deep = max(options.train.depths + options.eval.eval_depths)
    if too_deep > options.system.max_steps:
        raise SynthlabError(f"ouroboros: depth {too_deep} exceeds max_steps {options.system.max_steps}")
    return options


def run_stage(
    options: OuroborosOptions, base: Path, corpus: Path, out: Path, new_corpus: Path | None = None
) -> dict[str, Any]:
    """Train the point's variant on `base` with `corpus` (or the section's own source) in
    out/<hash of the options> (resumed when rerun), evaluate it by depth on the held-out end of
    `corpus` and on `new_corpus` (text the base never saw, `eval_data_seed`); returns the row's
    columns, with `outcomes`: the per-sequence file (relative to out's parent, the point's run
    folder) that pairs two variants on the same sequences (`synthlab.claims.paired`)."""
    # pandas, here and in synthlab.ouroboros.runs: only when the stage runs (synthlab.sweeps.lab_runner
    # imports this module for `parse_section`, in a sweep's worker processes too)
    import pandas as pd

    from synthlab.evaluation.evaluate import write_outcomes
    from synthlab.ouroboros.runs import LOG, eval_run, train_run

    folder = Path(out) / content_hash(ouroboros_train_keys(options.to_dict(), old=True))  # the folders of old runs
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
    depths = list(options.eval.eval_depths)
    table, per_sequence = eval_run(
        folder,
        depths,
        str(new_corpus) if new_corpus is not None else None,
        batch_size=options.eval.eval_batch_size,
        max_sequences=options.eval.eval_max_sequences,
        progress=False,
    )
    loss = {(row.corpus, row.variant, row.depth): row.loss for row in table.itertuples()}
    log = pd.read_csv(folder / variant / LOG)
    tail = log["loss"].iloc[-max(1, len(log) // 10) :]
    corpora = {"heldout": "loss_depth_{}"} | ({NEW: "loss_new_depth_{}"} if new_corpus is not None else {})
    row = {
        "trainable_params": run["trainable_params"][variant],
        "ouro_steps": len(log),
        "ouro_train_loss": float(tail.mean()),
        **{column.format(d): loss[(name, variant, d)] for name, column in corpora.items() for d in depths},
        "loss_truncated": loss[("heldout", "truncated", depths[0])],
        "loss_base": loss[("heldout", "base", depths[0])],
    }
    if new_corpus is not None:
        row |= {
            "loss_new_truncated": loss[(NEW, "truncated", depths[0])],
            "loss_new_base": loss[(NEW, "base", depths[0])],
        }
    outcomes = {}
    for name, column in corpora.items():
        part = per_sequence[per_sequence["corpus"] == name]
        if outcomes and len(part) != len(next(iter(outcomes.values()))):
            raise SynthlabError(
                f"ouroboros: the held-out text gave {len(next(iter(outcomes.values())))} sequences and the new "
                f"people's {len(part)}: lower eval_max_sequences ({options.eval.eval_max_sequences}) to the fewer"
            )
        # each sequence's summed loss over the corpus's mean target count: their mean is the row's loss
        scale = part["targets"].mean()
        outcomes |= {column.format(d): (part[f"{variant}@{d}"] / scale).to_numpy() for d in depths}
    return row | {"outcomes": write_outcomes(folder / variant / "outcomes.csv", outcomes, Path(out).parent)}
