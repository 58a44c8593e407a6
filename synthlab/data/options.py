"""`BatchConfig`, the `[train.batch]` section of a run (synthlab.training.configs.TrainConfig): what
one optimizer step reads and how its rows are cut (`synthlab.data.datasets` packs and batches them).
Loads without numpy, tokenizers and torch, so that the CLI builds its flags."""

from __future__ import annotations

from dataclasses import dataclass

from synthlab.errors import SynthlabError
from synthlab.serialize import check_at_least, option


@dataclass
class BatchConfig:
    """`[train.batch]`: the optimizer batch, its micro-batches and its rows."""

    batch_size: int = option(
        64,
        "Rows per optimizer step, the whole batch (split into grad_accum micro-batches, and across "
        "torchrun's processes).",
    )
    grad_accum: int = option(
        1,
        "Split each batch into this many micro-batches, gradients accumulated (same "
        "loss as one batch, less memory); batch_size must divide by it.",
    )
    seq_len: int | None = option(None, "Row length when packing (default: the model's max_seq_len).")
    pack: bool | None = option(
        None, "Pack several examples per row with document masking (default: the task's choice, bios only)."
    )

    def __post_init__(self) -> None:
        check_at_least("train.batch.", 1, batch_size=self.batch_size, grad_accum=self.grad_accum)
        if self.batch_size % self.grad_accum:
            raise SynthlabError(
                f"train.batch.grad_accum {self.grad_accum} must divide train.batch.batch_size {self.batch_size}"
            )
        if self.seq_len is not None and self.seq_len < 2:
            raise SynthlabError(f"train.batch.seq_len must be >= 2, got {self.seq_len}")
