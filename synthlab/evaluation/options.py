"""What scoring a trained run is told, as typed dataclasses: `synthlab eval`'s test (`EvalRunOptions`,
the keywords of `evaluate_run`) and `synthlab capacity`'s estimate (`CapacityOptions`, those of
`estimate_capacity`). The commands' flags and their help come from these fields
(`synthlab.cli.flags`); a script passes the same values to the functions.

Light on purpose (no torch): the CLI builds its flags from it when it starts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from synthlab.errors import SynthlabError
from synthlab.serialize import option

DEVICE_HELP = "auto, cpu or cuda."


def at_least_one(**values: int | None) -> None:
    """Each given value (None: not given) >= 1, else one error line naming its flag."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise SynthlabError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


@dataclasses.dataclass(frozen=True)
class EvalRunOptions:
    """How a run is scored on its test split (`synthlab eval RUN_DIR`): which data, depth, exit
    rule, decode cache, batch, how many prompts, on what device."""

    data: Path | None = option(None, "Dataset folder to test on (default: the run's own).")
    steps: int | None = option(None, "Recurrent steps at evaluation (past the trained depth to test extrapolation).")
    exit: str | None = option(None, "Exit rule per token: static:T, q:0.8, diff:0.01 or kl:0.001.")
    kv: str | None = option(None, "Decode with this KV-cache strategy: full, first, last or mean.")
    batch_size: int = option(
        128, "Examples per forward pass: a chunk that bounds memory, not an optimizer batch (nothing is trained)."
    )
    max_prompts: int | None = option(
        None,
        "Score at most K test prompts, and at most K of the other test lengths and of the training "
        "sample: each group (length, hops, attribute) its even share, drawn with seed 0, so the same K "
        "every time (default: all; the file is named ..._maxK.json).",
        metavar="K",
    )
    device: str = option("auto", DEVICE_HELP)
    progress: bool = option(True, "Show each phase's progress (a bar on a terminal, a line every 30 s off one).")

    def __post_init__(self) -> None:
        # --steps, --exit and --kv are checked against the run they read (`evaluate_run`)
        at_least_one(batch_size=self.batch_size, max_prompts=self.max_prompts)


@dataclasses.dataclass(frozen=True)
class CapacityOptions:
    """How a bios run's knowledge capacity is estimated (`synthlab capacity RUN_DIR`)."""

    data: Path | None = option(None, "The run's dataset at its new place, if it moved (checked to be the same data).")
    steps: int | None = option(None, "Recurrent steps to read the model at (default: the trained loops).")
    batch_size: int = option(
        64, "Biographies per forward pass: a chunk that bounds memory, not an optimizer batch (nothing is trained)."
    )
    device: str = option("auto", DEVICE_HELP)
    checkpoint: int | None = option(
        None,
        "Read the kept checkpoint of this optimizer step instead of the final weights (a point of the learning curve).",
    )

    def __post_init__(self) -> None:
        at_least_one(batch_size=self.batch_size)
