"""Loss scaling laws and a fast, exact fitter for them (numpy, scipy, pandas; no torch). Their figures
are drawn above, in `synthlab.plots.scaling`.

- `laws`: the law type, sums of power laws, the registry and the built-in laws (chinchilla,
  looplm, steps, power), the runs to fit (`Data`) and `implausible` parameters.
- `optimize`: the summed Huber objective, batched L-BFGS over a grid of starts, and `fit`.
- `uncertainty`: bootstrap intervals, compute-optimal quantities, hold-out evaluation, the
  lack-of-fit test against seed noise.
- `table`: `fit_table`, a law fitted to a results table with all of the above (`synthlab fit`), and
  the digest of the numbers a fit was fitted to (`data_digest`, `digest_now`), a fit's record
  as strict JSON (`fit_json`, `read_fit_json`).
"""

from synthlab.scaling.laws import (
    CHINCHILLA,
    LAWS,
    LOOPLM,
    POWER,
    STEPS,
    Data,
    Law,
    PowerTerm,
    get_law,
    implausible,
    power_sum_law,
    register_law,
)
from synthlab.scaling.optimize import (
    STATUS,
    BatchResult,
    FitOptions,
    FitResult,
    fit,
    goodness,
    huber_objective,
    minimize_batched,
)
from synthlab.scaling.table import (
    GroupFit,
    TableColumns,
    TableFit,
    data_digest,
    default_columns,
    digest_now,
    fit_json,
    fit_table,
    read_fit_json,
    saved_fit,
    table_data,
)
from synthlab.scaling.uncertainty import (
    HOLDOUT_KINDS,
    BootstrapResult,
    HoldoutRow,
    LackOfFit,
    bootstrap,
    cold_refits,
    derived,
    design_cells,
    design_levels,
    holdout,
    holdout_splits,
    lack_of_fit,
    lack_of_fit_test,
)

__all__ = [
    "CHINCHILLA",
    "HOLDOUT_KINDS",
    "LAWS",
    "LOOPLM",
    "POWER",
    "STATUS",
    "STEPS",
    "BatchResult",
    "BootstrapResult",
    "Data",
    "FitOptions",
    "FitResult",
    "GroupFit",
    "HoldoutRow",
    "LackOfFit",
    "Law",
    "PowerTerm",
    "TableColumns",
    "TableFit",
    "bootstrap",
    "cold_refits",
    "data_digest",
    "digest_now",
    "default_columns",
    "derived",
    "design_cells",
    "design_levels",
    "fit",
    "fit_json",
    "fit_table",
    "get_law",
    "goodness",
    "holdout",
    "holdout_splits",
    "huber_objective",
    "implausible",
    "lack_of_fit",
    "lack_of_fit_test",
    "minimize_batched",
    "power_sum_law",
    "read_fit_json",
    "register_law",
    "saved_fit",
    "table_data",
]
