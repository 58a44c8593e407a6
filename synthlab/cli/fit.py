"""`synthlab fit LAW TABLE.csv`: fit a loss law to a results table, with bootstrap intervals and hold-outs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from synthlab.errors import SynthlabError

LAW_HELP = (
    "chinchilla: L = E + A/N^alpha + B/D^beta. looplm: L = E + A/(N+t1)^alpha + B/(D+t2)^beta + "
    "C/(Tm+t3)^gamma. steps: the LoopLM form with T (recurrent step) for Tm, fitted once per Tm. "
    "power: L = E + A/(x+t)^alpha."
)


def _read_table(path: Path):
    import pandas as pd

    if not path.is_file():
        raise SynthlabError(f"TABLE '{path}' does not exist")
    try:
        return pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as err:
        raise SynthlabError(f"TABLE '{path}' is not a readable CSV: {str(err).splitlines()[0]}") from None


def _column(table, name: str, option: str, path: Path) -> np.ndarray:
    if name not in table.columns:
        columns = ", ".join(map(str, table.columns))
        raise SynthlabError(f"column '{name}' ({option}) not in {path.name}; columns: {columns}")
    values = table[name]
    if values.dtype.kind not in "iuf":
        raise SynthlabError(f"column '{name}' ({option}) is not numeric")
    return values.to_numpy(float)


def _fit_json(result, boot, holdout_rows, derived: dict) -> dict:
    from synthlab import scaling

    nan_to_none = lambda v: None if isinstance(v, float) and math.isnan(v) else v  # noqa: E731 (JSON has no NaN)
    out = dict(result.params)
    out.update(
        r2=result.r2, rmse_log=result.rmse_log, objective=result.objective, converged=result.converged,
        message=result.message, n_rows=result.n_rows, n_starts=result.n_starts, n_reached=result.n_reached,
        derived=derived,
        intervals={k: list(v) for k, v in boot.intervals.items()} if boot else {},
        level=boot.level if boot else None,
        bootstrap=boot.n_resamples if boot else 0,
        holdout=[{k: nan_to_none(v) for k, v in vars(r).items()} for r in holdout_rows],
        implausible=sorted(scaling.implausible(result.params)),
    )
    return out


def _fit_text(title: str, law, result, boot, holdout_rows, derived: dict) -> str:
    from synthlab import scaling

    lines = [title, f"  {law.formula}",
             f"  objective {result.objective:.7g} (summed Huber on log loss), converged: "
             f"{'yes' if result.converged else 'no'} ({result.message}); "
             f"{result.n_reached} of {result.n_starts} starts reached it before the polish",
             f"  R^2 {result.r2:.4f} (loss space), RMSE {result.rmse_log:.4g} (log space), {result.n_rows} rows"]

    def interval(name: str) -> str:
        if not boot or name not in boot.intervals:
            return ""
        lo, hi = boot.intervals[name]
        return f"  [{lo:.5g}, {hi:.5g}]"

    if boot:
        lines.append(f"  {int(100 * boot.level)}% bootstrap intervals from {boot.n_resamples} resamples "
                     f"({boot.n_converged} converged)")
    lines += [f"  {k:>6} = {v:<12.5g}{interval(k)}" for k, v in {**result.params, **derived}.items()]
    bad = scaling.implausible(result.params)
    if bad:
        lines.append(f"  WARNING: degenerate fit ({', '.join(f'{k} = {v:.3g}' for k, v in bad.items())}): "
                     "these data do not identify the law; do not read its constants")
    if holdout_rows:
        lines.append(f"  {'hold-out':<26} {'train':>6} {'test':>5} {'R2 train':>9} {'R2 test':>8} {'RMSE test':>10}")
        lines += [f"  {r.split:<26} {r.train_rows:>6} {r.test_rows:>5} {r.r2_train:>9.4f} {r.r2_test:>8.4f} "
                  f"{r.rmse_log_test:>10.4g}" for r in holdout_rows]
    return "\n".join(lines)


def fit(
    law: str = typer.Argument(..., help=LAW_HELP),
    table: Path = typer.Argument(..., help="Results CSV, one row per run (or per checkpoint)."),
    n_col: str = typer.Option("params", help="Column with N, the model size in parameters."),
    d_col: str = typer.Option("tokens", help="Column with D, the training tokens (see --tokens-from-flops)."),
    t_col: Optional[str] = typer.Option(
        None, help="Column with the recurrence variable: Tm for looplm (default 'loops', the maximum "
        "recurrent steps), T for steps (default 'step', the recurrent step)."),
    tm_col: str = typer.Option("loops", help="steps law only: column with Tm; one law is fitted per Tm."),
    x_col: str = typer.Option("params", help="power law only: column with x."),
    loss_col: str = typer.Option("loss", help="Column with the loss (or the quantity the law predicts)."),
    tokens_from_flops: Optional[str] = typer.Option(
        None, help="Derive D = C / (6 N) from this training-FLOP column instead of reading --d-col."),
    drop_top_loss: int = typer.Option(0, min=0, help="Drop the K rows with the highest loss first (Epoch drops 5)."),
    bootstrap: int = typer.Option(1000, min=0, help="Bootstrap resamples over runs for intervals; 0 = none."),
    level: float = typer.Option(0.95, help="Coverage of the percentile intervals."),
    seed: int = typer.Option(0, help="Seed of the bootstrap's random generator."),
    compute: Optional[float] = typer.Option(None, help="Compute C = 6ND at which to report N_opt and D_opt."),
    holdout: Optional[str] = typer.Option(
        None, help="Hold-out table: size (fit on the smallest 60% of sizes), data (first 25/50/75% of D), "
        "steps (leave each Tm, or T, out)."),
    delta: float = typer.Option(1e-3, help="Huber delta on log loss."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON: E, A, B, alpha, beta (+ C, gamma, t1..t3), "
                                  "r2, objective, intervals, derived, holdout."),
    plot: Optional[Path] = typer.Option(None, help="Write a fit and residual plot (PNG) here."),
) -> None:
    """Fit a loss law to TABLE by Huber regression on log loss, summed over runs, from a grid of starts.

    Example (Epoch's Chinchilla data): synthlab fit chinchilla chinchilla_svg_extracted.csv
    --n-col "Model Size" --tokens-from-flops "Training FLOP" --drop-top-loss 5
    """
    from synthlab import scaling, scaling_eval

    the_law = scaling.get_law(law)
    if compute is not None and compute <= 0:
        raise SynthlabError(f"--compute must be > 0, got {compute:g}")
    options = scaling.FitOptions(delta=delta)
    frame = _read_table(table)
    loss = _column(frame, loss_col, "--loss-col", table)
    if drop_top_loss:
        if drop_top_loss >= len(frame):
            raise SynthlabError(f"--drop-top-loss {drop_top_loss} would drop all {len(frame)} rows")
        keep = np.argsort(np.argsort(-loss, kind="stable"), kind="stable") >= drop_top_loss
        frame, loss = frame[keep], loss[keep]
    t_col = t_col or {"looplm": "loops", "steps": "step"}.get(law, "loops")
    variables, labels = {}, {"loss": loss_col}
    for var in the_law.variables:
        if var == "D" and tokens_from_flops:
            n = _column(frame, n_col, "--n-col", table)
            variables["D"] = _column(frame, tokens_from_flops, "--tokens-from-flops", table) / (6 * n)
            labels["D"] = f"{tokens_from_flops} / (6 {n_col})"
            continue
        col, option = {"N": (n_col, "--n-col"), "D": (d_col, "--d-col"), "Tm": (t_col, "--t-col"),
                       "T": (t_col, "--t-col"), "x": (x_col, "--x-col")}[var]
        variables[var], labels[var] = _column(frame, col, option, table), col
    data = scaling.Data(variables, loss, labels)
    groups = [(f"{the_law.name} fit to {table.name}", data)]
    if law == "steps":
        tm = _column(frame, tm_col, "--tm-col", table)
        parts_by_tm = {v: data.subset(tm == v) for v in np.unique(tm)}
        # a Tm with one recurrent step, or too few rows, cannot identify the law: skip it, saying so
        fittable = {v: p for v, p in parts_by_tm.items()
                    if len(p.loss) > len(the_law.params) and len(np.unique(p.variables["T"])) > 1}
        if not fittable:
            raise SynthlabError(f"no {tm_col} value has more than {len(the_law.params)} rows over several steps")
        skipped = [f"{tm_col} = {v:g} ({len(p.loss)} rows)" for v, p in parts_by_tm.items() if v not in fittable]
        if skipped:
            typer.echo(f"skipped (one step, or too few rows for {len(the_law.params)} parameters): "
                       f"{', '.join(skipped)}", err=True)
        tm_values = list(fittable)
        groups = [(f"steps fit for {tm_col} = {v:g}", p) for v, p in fittable.items()]
    if holdout is not None and holdout not in scaling_eval.HOLDOUT_KINDS:
        raise SynthlabError(f"--holdout must be one of {', '.join(scaling_eval.HOLDOUT_KINDS)}, got '{holdout}'")
    reports, parts = [], []
    for title, part in groups:
        result = scaling.fit(the_law, part, options)
        boot = scaling_eval.bootstrap(the_law, part, result, np.random.default_rng(seed), n_resamples=bootstrap,
                                      level=level, compute=compute, options=options) if bootstrap else None
        rows = scaling_eval.holdout(the_law, part, holdout, options) if holdout else []
        derived = scaling_eval.derived(result.params, compute)
        reports.append((title, result, boot, rows, derived))
        parts.append((title, part, result))
    if plot is not None:
        from synthlab.fit_plots import plot_fit

        plot_fit(the_law, parts, plot)
    if json_out:
        outs = [_fit_json(r, b, h, d) for _, r, b, h, d in reports]
        if law == "steps":
            payload = {"law": law, "fits": [{"Tm": float(v), **o} for v, o in zip(tm_values, outs)]}
        else:
            payload = {"law": law, **outs[0]}
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo("\n".join(_fit_text(t, the_law, r, b, h, d) for t, r, b, h, d in reports))
    if plot is not None and not json_out:
        typer.echo(f"wrote {plot}")
