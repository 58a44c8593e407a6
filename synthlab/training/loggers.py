"""Optional experiment loggers beside metrics.jsonl: TensorBoard (`train.logging.tensorboard`: scalars in
RUN_DIR/tensorboard, `tensorboard --logdir RUN_DIR`) and Weights & Biases (`train.logging.wandb = PROJECT`:
a W&B run in that project, its local files in RUN_DIR/wandb; WANDB_MODE=offline keeps it on disk
for `wandb sync` later). Every metrics.jsonl record is logged at its step; a list (the loss per
recurrent step) as one scalar per entry, `loss_per_step/1`, `loss_per_step/2`, ...

Both packages are extras (`pip install 'synthlab[tensorboard]'`, `'synthlab[wandb]'`), imported
only when their option is on; a missing one is one error line before the run folder is written.

`LoggingConfig` is the `[train.logging]` section of a run (synthlab.training.configs.TrainConfig):
what is logged, how often, and where besides metrics.jsonl.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text
from synthlab.serialize import check_at_least, option

WANDB_ID = "wandb_id"  # RUN_DIR/wandb_id: the W&B run a resumed run goes on logging into


@dataclass
class LoggingConfig:
    """`[train.logging]`: metrics.jsonl's cadence, the held-out probe, TensorBoard and W&B."""

    log_every: int = option(10, "Append to metrics.jsonl every K steps.")
    eval_every: int = option(
        0,
        "Every K steps, log per-group accuracy and answer loss on fixed samples of held-out "
        "and training prompts to metrics.jsonl (eval/acc_l1, eval/train_acc_l1, ...; 0: off).",
    )
    tensorboard: bool = option(
        False,
        "Also log the metrics to RUN_DIR/tensorboard (needs the tensorboard package: "
        "pip install 'synthlab[tensorboard]').",
    )
    wandb: str | None = option(
        None,
        "Also log the metrics to Weights & Biases, in this project (needs the wandb "
        "package: pip install 'synthlab[wandb]'; WANDB_MODE=offline keeps the run in "
        "RUN_DIR/wandb for `wandb sync`).",
    )

    def __post_init__(self) -> None:
        check_at_least("train.logging.", 1, log_every=self.log_every)
        check_at_least("train.logging.", 0, eval_every=self.eval_every)  # 0: off


def summary_writer():
    """torch's SummaryWriter class; a missing tensorboard package is one error line."""
    try:
        # optional extras, here and in wandb_module: imported only when a run asks for them
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise SynthlabError(
            "train.logging.tensorboard needs the tensorboard package: pip install 'synthlab[tensorboard]'"
        ) from None
    return SummaryWriter


def wandb_module():
    """The wandb package; a missing one is one error line."""
    try:
        import wandb
    except ImportError:
        raise SynthlabError("train.logging.wandb needs the wandb package: pip install 'synthlab[wandb]'") from None
    return wandb


def check_loggers(cfg) -> None:
    """Fail before any work when a logger `cfg` (a TrainConfig) asks for is not installed."""
    if cfg.logging.tensorboard:
        summary_writer()
    if cfg.logging.wandb:
        wandb_module()


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record by name (lists one per entry, from 1), `step` left out."""
    out = {}
    for key, value in record.items():
        values = enumerate(value, 1) if isinstance(value, list) else [(None, value)]
        for t, v in values:
            if key != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[key if t is None else f"{key}/{t}"] = v
    return out


class Board:
    """Writes metrics records into RUN_DIR/tensorboard."""

    def __init__(self, run_dir: str | Path):
        self._writer = summary_writer()(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        for name, value in scalars(record).items():
            self._writer.add_scalar(name, value, record["step"])
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbLog:
    """Logs metrics records to a W&B run of `project`, named after the run folder, with the run's
    config.json (resolved config and what was derived) as its config; a resumed run (RUN_DIR/wandb_id
    present) continues the same W&B run."""

    def __init__(self, run_dir: str | Path, project: str):
        wandb = wandb_module()
        run_dir = Path(run_dir)
        config = json.loads((run_dir / "config.json").read_text())
        id_file = run_dir / WANDB_ID
        run_id = id_file.read_text().strip() if id_file.is_file() else None  # None: W&B picks one
        self._run = wandb.init(
            project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir), config=config
        )
        atomic_write_text(id_file, self._run.id + "\n")

    def log(self, record: dict[str, Any]) -> None:
        self._run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self._run.finish()


class Loggers:
    """The loggers a TrainConfig turns on, as one (`log`, `close`); none on: nothing happens."""

    def __init__(self, run_dir: str | Path, cfg):
        self._all = ([Board(run_dir)] if cfg.logging.tensorboard else []) + (
            [WandbLog(run_dir, cfg.logging.wandb)] if cfg.logging.wandb else []
        )

    def log(self, record: dict[str, Any]) -> None:
        for logger in self._all:
            logger.log(record)

    def close(self) -> None:
        for logger in self._all:
            logger.close()
