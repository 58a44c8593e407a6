"""The stages a sweep point can run, in the order they run: the columns each fills in the row and
the stages it needs before it. Torch-free, so that a definition's stages are checked (and
`prereg check`, `report` read a definition) without importing torch; their work is in
`synthlab.sweeps.lab_runner`."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StageSpec:
    columns: tuple[str, ...]
    requires: tuple[str, ...]


# In the order they run; training always runs.
STAGE_SPECS = {
    "train": StageSpec(("loss", "params"), ()),
    "gate": StageSpec(("gate_loss",), ("train",)),
    "eval": StageSpec(("accuracy",), ("train",)),
    "heldout": StageSpec(("eval_loss",), ("train",)),
    "generate": StageSpec(("accuracy",), ("train",)),
    "capacity": StageSpec(("bits",), ("train",)),
    "export": StageSpec((), ("train",)),
    "ouroboros": StageSpec(("loss_base",), ("export",)),
}
