"""What `fit_table` is told, as typed dataclasses: the columns a law is fitted to (`TableColumns`)
and how it is fitted and judged (`TableFitOptions`). `synthlab fit`'s flags and their help come
from these fields (`synthlab.cli.flags`); a script passes the same objects to `fit_table`.

Light on purpose (no numpy, scipy or pandas): the CLI builds its flags from it when it starts.
"""

from __future__ import annotations

import dataclasses
import math

from synthlab.errors import SynthlabError
from synthlab.serialize import option

HOLDOUT_KINDS = ("size", "data", "steps")


@dataclasses.dataclass(frozen=True)
class TableColumns:
    """Which columns of a results table a law is fitted to (`synthlab fit`'s column options; a saved
    fit's `columns`, resolved). None: the default `table_data` picks from the table and the law."""

    n_col: str = option("params", "Column with N, the model size in parameters.")
    d_col: str | None = option(
        None,
        "Column with D, the training tokens (see --tokens-from-flops); default eval_tokens where the table has "
        "eval_tokens and eval_loss (a sweep's heldout stage), else tokens.",
    )
    t_col: str | None = option(
        None,
        "Column with the recurrence variable: Tm for looplm (default 'loops', the maximum recurrent steps), "
        "T for steps (default 'step', the recurrent step).",
    )
    tm_col: str = option("loops", "steps law only: column with Tm; one law is fitted per Tm.")
    x_col: str = option("params", "power law only: column with x.")
    loss_col: str | None = option(
        None,
        "Column with the loss (or the quantity the law predicts); default eval_loss where the table has "
        "eval_tokens and eval_loss, else loss.",
    )
    tokens_from_flops: str | None = option(
        None, "Derive D = C / (6 N) from this training-FLOP column instead of reading --d-col."
    )
    drop_top_loss: int = option(0, "Drop the K rows with the highest loss first (Epoch drops 5).", min=0)
    run_col: str | None = option(
        None,
        "Column naming each row's training run (default run_dir where the table has it): the lack-of-fit test "
        "keeps a run's checkpoints and steps together.",
    )  # without one (and no run_dir column) each row is its own run


@dataclasses.dataclass(frozen=True)
class TableFitOptions:
    """How a law is fitted to a table and what is reported beside the fit: intervals, hold-outs, the
    lack-of-fit test, the compute-optimal point."""

    bootstrap: int = option(1000, "Bootstrap resamples over runs for intervals; 0 = none.", min=0)
    lack_of_fit_resamples: int = option(
        1000,
        "Wild-bootstrap draws of the lack-of-fit test over runs (where rows repeat a design point, e.g. seeds); "
        "0 = only the F test that takes rows as independent.",
        min=0,
    )
    level: float = option(0.95, "Coverage of the percentile intervals.")
    seed: int = option(0, "Seed of the bootstrap's and the lack-of-fit test's random draws.")
    compute: float | None = option(None, "Compute C = 6ND at which to report N_opt and D_opt.")
    holdout: str | None = option(
        None,
        "Hold-out table: size (fit on the smallest 60% of sizes, at least 3 of 4), data (the first 3, 4, ... of "
        "D's levels where it has at most 8, else the first 25/50/75% of D), steps (leave each Tm, or T, out).",
    )
    delta: float = option(1e-3, "Huber delta on log loss.")  # checked by the optimizer's FitOptions

    def __post_init__(self) -> None:
        if self.compute is not None and (not math.isfinite(self.compute) or self.compute <= 0):
            raise SynthlabError(f"--compute must be a finite number > 0, got {self.compute:g}")
        if self.holdout is not None and self.holdout not in HOLDOUT_KINDS:
            raise SynthlabError(f"--holdout must be one of {', '.join(HOLDOUT_KINDS)}, got '{self.holdout}'")
