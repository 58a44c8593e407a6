"""Fit a loss law to a results table: everything `synthlab fit` does between parsing and printing.

`fit_table` reads the law's variables from named columns (D optionally derived from training
FLOPs as C / 6N), drops the highest-loss rows if asked, splits the step-wise law's rows by Tm,
and fits each group, with bootstrap intervals, derived quantities, hold-outs and, where rows repeat
a design point (seeds), the lack-of-fit test. Error messages
name the `synthlab fit` option that sets each argument (--n-col for n_col, and so on).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from synthlab.errors import SynthlabError
from synthlab.files import warn
from synthlab.scaling import uncertainty
from synthlab.scaling.laws import Data, Law, get_law
from synthlab.scaling.optimize import FitOptions, FitResult, fit
from synthlab.scaling.options import TableColumns, TableFitOptions
from synthlab.scaling.uncertainty import BootstrapResult, HoldoutRow, LackOfFit


@dataclasses.dataclass(frozen=True)
class GroupFit:
    """The fit of one group of rows: the whole table, or one Tm's rows for the step-wise law."""

    title: str  # "chinchilla fit to results.csv", or "steps fit for loops = 4"
    data: Data
    result: FitResult
    bootstrap: BootstrapResult | None  # None without resamples
    holdout: list[HoldoutRow]  # empty without a hold-out
    derived: dict[str, float]  # compute-optimal quantities (`uncertainty.derived`)
    tm: float | None  # the step-wise law's Tm; None for the other laws
    lack_of_fit: LackOfFit | None = None  # None without replicated design points


@dataclasses.dataclass(frozen=True)
class TableFit:
    """A law fitted to a table: one group for most laws, one per fittable Tm for the step-wise law."""

    law: Law
    fits: list[GroupFit]
    skipped: list[str]  # step-wise law: Tm values not fitted (one step, or too few rows), e.g. "loops = 1 (25 rows)"
    source: dict[str, object] = dataclasses.field(default_factory=dict)  # the table's name, the columns
    # as resolved, the fitted numbers' digest (`data_digest`), hold-out kind, bootstrap seed, delta


def _read_table(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise SynthlabError(f"TABLE '{path}' does not exist")
    try:
        return pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as err:
        raise SynthlabError(f"TABLE '{path}' is not a readable CSV: {str(err).splitlines()[0]}") from None


def _column(table: pd.DataFrame, name: str, option: str, source: str) -> np.ndarray:
    if name not in table.columns:
        columns = ", ".join(map(str, table.columns))
        raise SynthlabError(f"column '{name}' ({option}) not in {source}; columns: {columns}")
    values = table[name]
    if values.dtype.kind not in "iuf":
        raise SynthlabError(f"column '{name}' ({option}) is not numeric")
    return values.to_numpy(float)


def default_columns(columns) -> tuple[str, str]:
    """(D column, loss column) a results table is fitted on unless told otherwise: eval_tokens and
    eval_loss where it has both (a sweep's heldout stage: the held-out loss at each checkpoint and
    the tokens seen by then), else tokens and loss."""
    return ("eval_tokens", "eval_loss") if {"eval_loss", "eval_tokens"} <= set(columns) else ("tokens", "loss")


def table_data(
    table: pd.DataFrame, law: Law, columns: TableColumns = TableColumns(), *, name: str
) -> tuple[Data, np.ndarray | None, TableColumns]:
    """(the law's variables and loss from `table`, the step-wise law's Tm per row (else None), the
    columns as resolved), rows in a canonical order: sorted by the law's variables, Tm and the
    loss, so that a fit and its bootstrap resamples do not depend on the file's row order. `name`
    is what errors call the table."""
    default_d, default_loss = default_columns(table.columns)
    n_col, tm_col, x_col, tokens_from_flops, drop_top_loss = (
        columns.n_col,
        columns.tm_col,
        columns.x_col,
        columns.tokens_from_flops,
        columns.drop_top_loss,
    )
    d_col, loss_col = columns.d_col or default_d, columns.loss_col or default_loss
    if loss_col == "loss" and "eval_loss" in table.columns and "loss" not in table.columns:
        raise SynthlabError(f"{name} has eval_loss but no eval_tokens: pass --d-col and --loss-col eval_loss")
    loss = _column(table, loss_col, "--loss-col", name)
    if drop_top_loss:
        if drop_top_loss >= len(table):
            raise SynthlabError(f"--drop-top-loss {drop_top_loss} would drop all {len(table)} rows")
        keep = np.argsort(np.argsort(-loss, kind="stable"), kind="stable") >= drop_top_loss
        table, loss = table[keep], loss[keep]
    t_col = columns.t_col or {"looplm": "loops", "steps": "step"}.get(law.name, "loops")
    variables, labels = {}, {"loss": loss_col}
    for var in law.variables:
        if var == "D" and tokens_from_flops:
            n = _column(table, n_col, "--n-col", name)
            variables["D"] = _column(table, tokens_from_flops, "--tokens-from-flops", name) / (6 * n)
            labels["D"] = f"{tokens_from_flops} / (6 {n_col})"
            continue
        col, option = {
            "N": (n_col, "--n-col"),
            "D": (d_col, "--d-col"),
            "Tm": (t_col, "--t-col"),
            "T": (t_col, "--t-col"),
            "x": (x_col, "--x-col"),
        }[var]
        variables[var], labels[var] = _column(table, col, option, name), col
    tm = _column(table, tm_col, "--tm-col", name) if law.name == "steps" else None
    run_col = columns.run_col or ("run_dir" if "run_dir" in table.columns else None)
    if run_col is not None and run_col not in table.columns:
        raise SynthlabError(f"column '{run_col}' (--run-col) not in {name}")
    runs = table[run_col].astype(str).to_numpy() if run_col else np.arange(len(loss)).astype(str)
    keys = [loss, *([tm] if tm is not None else []), *(variables[v] for v in reversed(law.variables))]
    order = np.lexsort(keys)  # the last key sorts first: the law's first variable
    data = Data({k: v[order] for k, v in variables.items()}, loss[order], labels, runs[order])
    resolved = dataclasses.replace(columns, d_col=d_col, t_col=t_col, loss_col=loss_col, run_col=run_col)
    return data, (None if tm is None else tm[order]), resolved


def data_digest(law: Law, data: Data, tm: np.ndarray | None = None) -> str:
    """sha256 of the numbers a fit is fitted to (the law's variables, the loss and Tm, in
    `table_data`'s canonical order): what tells a saved fit from a fit of another table."""
    arrays = [*(data.variables[v] for v in law.variables), data.loss, *([tm] if tm is not None else [])]
    return hashlib.sha256(np.column_stack([np.asarray(a, dtype=float) for a in arrays]).tobytes()).hexdigest()


def digest_now(saved: dict, table: pd.DataFrame | Path, name: str = "") -> str:
    """The digest of the numbers the saved fit `saved` (a record `fit_json` wrote) would fit in
    `table` (a results table or its path) now, read with its columns: its `data_sha256` iff it was
    fitted to them."""
    law = get_law(saved["law"])
    if isinstance(table, Path):
        table, name = _read_table(table), table.name
    data, tm, _ = table_data(table, law, TableColumns(**saved["columns"]), name=name)
    return data_digest(law, data, tm)


def saved_fit(table: pd.DataFrame, sweep_dir: Path, name: str = "fit_looplm.json") -> FitResult | None:
    """The fit `synthlab fit --save` wrote to `sweep_dir / name` if it fitted the numbers `table`
    holds now (the saved digest, its columns read from `table`): a figure then draws the fit the
    report's verdict is decided from instead of a refit of its own. None without the file; a
    SynthlabError saying why for a file that cannot be read, holds another law's or an older
    format's record (no fit_space), or was fitted to other numbers. One law per file (not `steps`)."""
    path = Path(sweep_dir) / name
    if not path.is_file():
        return None
    try:
        saved = read_fit_json(path.read_text())
        law = get_law(saved["law"])
        theta = np.array([saved["fit_space"][p] for p in law.params], dtype=float)
        digest = digest_now(saved, table, path.name)
    except (OSError, SynthlabError, KeyError, TypeError, ValueError) as err:
        raise SynthlabError(f"cannot use {path}: {type(err).__name__}: {err}") from err
    if digest != saved.get("data_sha256"):
        raise SynthlabError(f"{path} was fitted to other numbers than the table holds now")
    return FitResult(
        law=law.name,
        theta=theta,
        params=law.report(theta),
        objective=saved["objective"],
        converged=saved["converged"],
        message=saved["message"],
        n_starts=saved["n_starts"],
        n_reached=saved["n_reached"],
        r2=saved["r2"],
        rmse_log=saved["rmse_log"],
        n_rows=saved["n_rows"],
        basins=theta[None, :],
    )


NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def fit_json(payload: object) -> str:
    """A fit's record as strict JSON (jq and other readers refuse `Infinity`): a non-finite number,
    such as a diverged constant, is written as the string "inf", "-inf" or "nan"."""

    def finite(value: object) -> object:
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    return json.dumps(finite(payload), indent=1, allow_nan=False)


def read_fit_json(text: str) -> dict:
    """A record `fit_json` wrote, its non-finite numbers floats again."""

    def restore(value: object) -> object:
        if isinstance(value, str):
            return NON_FINITE.get(value, value)
        if isinstance(value, dict):
            return {k: restore(v) for k, v in value.items()}
        if isinstance(value, list):
            return [restore(v) for v in value]
        return value

    return restore(json.loads(text))


def _warn_constant(data: Data, title: str) -> None:
    """One warning line where a variable of the law takes one value in every row: the law's term in
    it is a constant the fit cannot tell from E, so its constants (and R^2) mean nothing."""
    constant = [f"{data.labels.get(v, v)} = {x[0]:g}" for v, x in data.variables.items() if len(np.unique(x)) == 1]
    if constant:
        warn(
            f"{title}: {', '.join(constant)} in every row: the law's term in it is not identified "
            f"(vary it to fit the law; do not read these constants)"
        )


def fit_table(
    table: pd.DataFrame | str | Path,
    law: Law | str,
    columns: TableColumns = TableColumns(),
    options: TableFitOptions = TableFitOptions(),
    *,
    name: str | None = None,
) -> TableFit:
    """Fit `law` to a results table (a DataFrame, or the path of a CSV), one row per run.

    `columns` names the law's variables' columns (`TableColumns`); the step-wise law is fitted once
    per value of its tm_col. `options` (`TableFitOptions`): `bootstrap` resamples of the runs
    (0 = none), seeded by `seed`, give intervals at `level`; `lack_of_fit_resamples` wild-bootstrap
    draws (also seeded by `seed`) give the lack-of-fit test's p over runs
    (`uncertainty.lack_of_fit`); `compute` is where N_opt and D_opt are reported; `holdout` one of
    HOLDOUT_KINDS (or None); `delta` the Huber delta. `name` is what titles and errors call the
    table (default: the file's name). The rows are fitted in `table_data`'s canonical order, so the
    same rows in another order give the same fit and bootstrap.
    """
    the_law = get_law(law) if isinstance(law, str) else law
    seed, compute, holdout = options.seed, options.compute, options.holdout
    fit_options = FitOptions(delta=options.delta)
    if not isinstance(table, pd.DataFrame):
        name = name or Path(table).name
        table = _read_table(Path(table))
    name = name or "table"
    data, tm, resolved = table_data(table, the_law, columns, name=name)
    source = {
        "table": name,
        "columns": dataclasses.asdict(resolved),
        "data_sha256": data_digest(the_law, data, tm),
        "holdout_kind": holdout,
        "bootstrap_seed": seed,
        "delta": options.delta,
    }
    groups, skipped = [(f"{the_law.name} fit to {name}", data, None)], []
    if tm is not None:
        parts_by_tm = {v: data.subset(tm == v) for v in np.unique(tm)}
        # a Tm with one recurrent step, or too few rows, cannot identify the law: skip it, listed in `skipped`
        fittable = {
            v: p
            for v, p in parts_by_tm.items()
            if len(p.loss) > len(the_law.params) and len(np.unique(p.variables["T"])) > 1
        }
        if not fittable:
            raise SynthlabError(
                f"no {columns.tm_col} value has more than {len(the_law.params)} rows over several steps"
            )
        skipped = [
            f"{columns.tm_col} = {v:g} ({len(p.loss)} rows)" for v, p in parts_by_tm.items() if v not in fittable
        ]
        groups = [(f"steps fit for {columns.tm_col} = {v:g}", p, float(v)) for v, p in fittable.items()]
    fits = []
    for title, part, tm_value in groups:
        result = fit(the_law, part, fit_options)
        _warn_constant(part, title)  # after the fit's own checks: a refused table is one error line
        boot = (
            uncertainty.bootstrap(
                the_law,
                part,
                result,
                np.random.default_rng(seed),
                n_resamples=options.bootstrap,
                level=options.level,
                compute=compute,
                options=fit_options,
            )
            if options.bootstrap
            else None
        )
        rows = uncertainty.holdout(the_law, part, holdout, fit_options) if holdout else []
        lack = uncertainty.lack_of_fit(
            the_law,
            part,
            result.basins[:3],
            np.random.default_rng([seed, 1]),
            options.lack_of_fit_resamples,
            fit_options,
        )
        fits.append(
            GroupFit(title, part, result, boot, rows, uncertainty.derived(result.params, compute), tm_value, lack)
        )
    return TableFit(the_law, fits, skipped, source)
