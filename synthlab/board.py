"""Optional TensorBoard logging (`train.tensorboard`): every metrics.jsonl record of a run also as
scalars in RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR`); a list (the loss per recurrent
step) as one scalar per entry, `loss_per_step/1`, `loss_per_step/2`, ...

The tensorboard package is an extra (`pip install 'synthlab[tensorboard]'`); torch.utils.tensorboard
is imported only when the option is on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from synthlab.errors import SynthlabError


def summary_writer():
    """torch's SummaryWriter class; a missing tensorboard package is one error line."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise SynthlabError("train.tensorboard needs the tensorboard package: pip install 'synthlab[tensorboard]'") from None
    return SummaryWriter


class Board:
    """Writes metrics records into RUN_DIR/tensorboard."""

    def __init__(self, run_dir: str | Path):
        self._writer = summary_writer()(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        step = record["step"]
        for key, value in record.items():
            values = enumerate(value, 1) if isinstance(value, list) else [(None, value)]
            for t, v in values:
                if key != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._writer.add_scalar(key if t is None else f"{key}/{t}", v, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
