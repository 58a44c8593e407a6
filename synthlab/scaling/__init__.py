"""Loss scaling laws and a fast, exact fitter for them (numpy, scipy, pandas; no torch). Their figures
are drawn above, in `synthlab.plots.scaling`.

- `laws`: the law type, sums of power laws, the registry and the built-in laws (chinchilla,
  looplm, steps, power), the runs to fit (`Data`) and `implausible` parameters.
- `optimize`: the summed Huber objective, batched L-BFGS over a grid of starts, and `fit`.
- `uncertainty`: bootstrap intervals, compute-optimal quantities, hold-out evaluation, the
  lack-of-fit test against seed noise.
- `options`: what `fit_table` is told (`TableColumns`, `TableFitOptions`; `synthlab fit`'s flags).
- `table`: `fit_table`, a law fitted to a results table with all of the above (`synthlab fit`), and
  the digest of the numbers a fit was fitted to (`data_digest`, `digest_now`), a fit's record
  as strict JSON (`fit_json`, `read_fit_json`).
"""

import importlib

from synthlab.scaling.options import HOLDOUT_KINDS, TableColumns, TableFitOptions

# Everything else is imported on first use (PEP 562), so that the CLI's `synthlab fit` flags (from
# the options above) do not pay for importing scipy and pandas at every start.
_LAZY = {
    name: module
    for module, names in {
        "laws": (
            "CHINCHILLA",
            "LAWS",
            "LOOPLM",
            "POWER",
            "STEPS",
            "Data",
            "Law",
            "PowerTerm",
            "get_law",
            "implausible",
            "power_sum_law",
            "register_law",
        ),
        "optimize": (
            "STATUS",
            "BatchResult",
            "FitOptions",
            "FitResult",
            "fit",
            "goodness",
            "huber_objective",
            "minimize_batched",
        ),
        "table": (
            "GroupFit",
            "TableFit",
            "data_digest",
            "default_columns",
            "digest_now",
            "fit_json",
            "fit_table",
            "read_fit_json",
            "saved_fit",
            "table_data",
        ),
        "uncertainty": (
            "BootstrapResult",
            "HoldoutRow",
            "LackOfFit",
            "bootstrap",
            "cold_refits",
            "derived",
            "design_cells",
            "design_levels",
            "holdout",
            "holdout_splits",
            "lack_of_fit",
            "lack_of_fit_test",
        ),
    }.items()
    for name in names
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"synthlab.scaling.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'synthlab.scaling' has no attribute '{name}'")


__all__ = ["HOLDOUT_KINDS", "TableColumns", "TableFitOptions", *_LAZY]
