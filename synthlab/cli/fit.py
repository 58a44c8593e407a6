"""`synthlab fit LAW TABLE.csv`: fit a loss law to a results table, with bootstrap intervals and hold-outs.

The fitting is `synthlab.scaling.fit_table`; this module parses the options and prints or writes
what it returns.
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

LAW_HELP = (
    "chinchilla: L = E + A/N^alpha + B/D^beta. looplm: L = E + A/(N+t1)^alpha + B/(D+t2)^beta + "
    "C/(Tm+t3)^gamma. steps: the LoopLM form with T (recurrent step) for Tm, fitted once per Tm. "
    "power: L = E + A/(x+t)^alpha."
)


def _fit_json(group) -> dict:
    from synthlab import scaling

    result, boot = group.result, group.bootstrap
    nan_to_none = lambda v: None if isinstance(v, float) and math.isnan(v) else v  # noqa: E731 (JSON has no NaN)
    out = dict(result.params)
    out.update(
        r2=result.r2,
        rmse_log=result.rmse_log,
        objective=result.objective,
        converged=result.converged,
        message=result.message,
        n_rows=result.n_rows,
        n_starts=result.n_starts,
        n_reached=result.n_reached,
        derived=group.derived,
        fit_space=dict(
            zip(scaling.get_law(result.law).params, map(float, result.theta))
        ),  # exact, unlike exp'd constants
        intervals={k: list(v) for k, v in boot.intervals.items()} if boot else {},
        level=boot.level if boot else None,
        bootstrap=boot.n_resamples if boot else 0,
        bootstrap_converged=boot.n_converged if boot else 0,
        bootstrap_refused=boot.refused if boot else "",
        holdout=[{k: nan_to_none(v) for k, v in vars(r).items()} for r in group.holdout],
        implausible=sorted(scaling.implausible(result.params)),
        lack_of_fit=vars(group.lack_of_fit) if group.lack_of_fit else None,
    )
    return out


def _fit_text(law, group) -> str:
    from synthlab import scaling

    result, boot = group.result, group.bootstrap
    lines = [
        group.title,
        f"  {law.formula}",
        f"  objective {result.objective:.7g} (summed Huber on log loss), converged: "
        f"{'yes' if result.converged else 'no'} ({result.message}); "
        f"{result.n_reached} of {result.n_starts} starts reached it before the polish",
        f"  R^2 {result.r2:.4f} (loss space), RMSE {result.rmse_log:.4g} (log space), {result.n_rows} rows",
    ]

    def interval(name: str) -> str:
        if not boot or name not in boot.intervals:
            return ""
        lo, hi = boot.intervals[name]
        return f"  [{lo:.5g}, {hi:.5g}]"

    if boot:
        cold = f" ({boot.n_cold} refitted cold from the full-data fit)" if boot.n_cold else ""
        lines.append(
            f"  {int(100 * boot.level)}% bootstrap intervals from the {boot.n_converged} of {boot.n_resamples} "
            f"resamples whose refit converged{cold}"
            if not boot.refused
            else f"  bootstrap: {boot.refused}{cold}; the constants below have no interval"
        )
    lines += [f"  {k:>6} = {v:<12.5g}{interval(k)}" for k, v in {**result.params, **group.derived}.items()]
    bad = scaling.implausible(result.params)
    if bad:
        lines.append(
            f"  WARNING: degenerate fit ({', '.join(f'{k} = {v:.3g}' for k, v in bad.items())}): "
            "these data do not identify the law; do not read its constants"
        )
    lof = group.lack_of_fit
    if lof:
        over_runs = (
            f"p = {lof.p_runs:.3g} over {lof.runs} runs ({lof.resamples} wild-bootstrap draws); "
            if lof.resamples
            else ""
        )
        lines.append(
            f"  lack of fit (least squares, log loss, {lof.cells} design points with replicates): {over_runs}"
            f"F = {lof.f:.3g} on {lof.cells - lof.params} and {lof.rows - lof.cells} df, p = {lof.p:.3g} "
            f"if rows were independent; R^2 ceiling {lof.r2_ceiling:.4f} (the points' mean losses)"
        )
    if group.holdout:
        lines.append(f"  {'hold-out':<26} {'train':>6} {'test':>5} {'R2 train':>9} {'R2 test':>8} {'RMSE test':>10}")
        lines += [
            f"  {r.split:<26} {r.train_rows:>6} {r.test_rows:>5} {r.r2_train:>9.4f} {r.r2_test:>8.4f} "
            f"{r.rmse_log_test:>10.4g}" + (f"  (fitted on {r.thin}: not identified)" if r.thin else "")
            for r in group.holdout
        ]
    return "\n".join(lines)


def fit(
    law: str = typer.Argument(..., help=LAW_HELP),
    table: Path = typer.Argument(..., help="Results CSV, one row per run (or per checkpoint)."),
    n_col: str = typer.Option("params", help="Column with N, the model size in parameters."),
    d_col: Optional[str] = typer.Option(
        None,
        help="Column with D, the training tokens (see --tokens-from-flops); default eval_tokens where the "
        "table has eval_tokens and eval_loss (a sweep's heldout stage), else tokens.",
    ),
    t_col: Optional[str] = typer.Option(
        None,
        help="Column with the recurrence variable: Tm for looplm (default 'loops', the maximum "
        "recurrent steps), T for steps (default 'step', the recurrent step).",
    ),
    tm_col: str = typer.Option("loops", help="steps law only: column with Tm; one law is fitted per Tm."),
    x_col: str = typer.Option("params", help="power law only: column with x."),
    loss_col: Optional[str] = typer.Option(
        None,
        help="Column with the loss (or the quantity the law predicts); default eval_loss where the table "
        "has eval_tokens and eval_loss, else loss.",
    ),
    tokens_from_flops: Optional[str] = typer.Option(
        None, help="Derive D = C / (6 N) from this training-FLOP column instead of reading --d-col."
    ),
    drop_top_loss: int = typer.Option(0, min=0, help="Drop the K rows with the highest loss first (Epoch drops 5)."),
    bootstrap: int = typer.Option(1000, min=0, help="Bootstrap resamples over runs for intervals; 0 = none."),
    lack_of_fit_resamples: int = typer.Option(
        1000,
        min=0,
        help="Wild-bootstrap draws of the lack-of-fit test over runs (where rows repeat a design "
        "point, e.g. seeds); 0 = only the F test that takes rows as independent.",
    ),
    run_col: Optional[str] = typer.Option(
        None,
        help="Column naming each row's training run (default run_dir where the table has it): the "
        "lack-of-fit test keeps a run's checkpoints and steps together.",
    ),
    level: float = typer.Option(0.95, help="Coverage of the percentile intervals."),
    seed: int = typer.Option(0, help="Seed of the bootstrap's and the lack-of-fit test's random draws."),
    compute: Optional[float] = typer.Option(None, help="Compute C = 6ND at which to report N_opt and D_opt."),
    holdout: Optional[str] = typer.Option(
        None,
        help="Hold-out table: size (fit on the smallest 60% of sizes, at least 3 of 4), data (the first 3, 4, ... of D's levels where it has at most 8, else the first 25/50/75% of D), "
        "steps (leave each Tm, or T, out).",
    ),
    delta: float = typer.Option(1e-3, help="Huber delta on log loss."),
    json_out: bool = typer.Option(
        False,
        "--json",
        help="Print JSON: E, A, B, alpha, beta (+ C, gamma, t1..t3), "
        "r2, objective, intervals, derived, holdout, lack_of_fit.",
    ),
    plot: Optional[Path] = typer.Option(None, help="Write a fit and residual plot (PNG) here."),
    save: Optional[Path] = typer.Option(
        None,
        help="Also write the fit as JSON here (what --json prints, plus this command and a digest of the "
        "fitted numbers): `synthlab report` decides an experiment's [[laws]] rule from it.",
    ),
) -> None:
    """Fit a loss law to TABLE by Huber regression on log loss, summed over runs, from a grid of starts.

    Example (Epoch's Chinchilla data): synthlab fit chinchilla chinchilla_svg_extracted.csv
    --n-col "Model Size" --tokens-from-flops "Training FLOP" --drop-top-loss 5
    """
    from synthlab import scaling
    from synthlab.files import atomic_write_text, check_writable

    for path, option in ((plot, "--plot"), (save, "--save")):
        if path is not None:
            check_writable(path, option)
    columns = scaling.TableColumns(
        n_col=n_col,
        d_col=d_col,
        t_col=t_col,
        tm_col=tm_col,
        x_col=x_col,
        loss_col=loss_col,
        tokens_from_flops=tokens_from_flops,
        drop_top_loss=drop_top_loss,
        run_col=run_col,
    )
    fitted = scaling.fit_table(
        table,
        law,
        columns,
        bootstrap=bootstrap,
        lack_of_fit_resamples=lack_of_fit_resamples,
        level=level,
        seed=seed,
        compute=compute,
        holdout=holdout,
        delta=delta,
    )
    if fitted.skipped:
        typer.echo(
            f"skipped (one step, or too few rows for {len(fitted.law.params)} parameters): {', '.join(fitted.skipped)}",
            err=True,
        )
    if plot is not None:
        from synthlab.plots.scaling import plot_fit

        plot_fit(fitted.law, [(g.title, g.data, g.result) for g in fitted.fits], plot)
    if fitted.law.name == "steps":
        payload = {"law": law, "fits": [{"Tm": g.tm, **_fit_json(g)} for g in fitted.fits]}
    else:
        payload = {"law": law, **_fit_json(fitted.fits[0])}
    if save is not None:
        command = "synthlab " + shlex.join(sys.argv[1:])
        atomic_write_text(save, scaling.fit_json({"command": command, **payload, **fitted.source}) + "\n")
    if json_out:
        typer.echo(scaling.fit_json(payload))
    else:
        typer.echo("\n".join(_fit_text(fitted.law, g) for g in fitted.fits))
    if not json_out:
        for path in (p for p in (plot, save) if p is not None):
            typer.echo(f"wrote {path}")
