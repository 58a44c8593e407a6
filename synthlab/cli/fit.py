"""`synthlab fit LAW TABLE.csv`: fit a loss law to a results table, with bootstrap intervals and hold-outs.

The fitting is `synthlab.scaling.fit_table`, told by the options objects its flags are generated
from (`TableColumns`, `TableFitOptions`); this module adds where the fit goes (`FitOutput`: purely
the command's, printing and files) and prints or writes what `fit_table` returns.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import sys
from pathlib import Path

import typer

from synthlab import scaling  # the package loads scipy and pandas on first use of a fitting name
from synthlab.cli import flags
from synthlab.files import atomic_write_text, check_writable
from synthlab.scaling.options import TableColumns, TableFitOptions
from synthlab.serialize import option

LAW_HELP = (
    "chinchilla: L = E + A/N^alpha + B/D^beta. looplm: L = E + A/(N+t1)^alpha + B/(D+t2)^beta + "
    "C/(Tm+t3)^gamma. steps: the LoopLM form with T (recurrent step) for Tm, fitted once per Tm. "
    "power: L = E + A/(x+t)^alpha."
)


def _fit_json(group) -> dict:
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


@dataclasses.dataclass(frozen=True)
class FitOutput:
    """Where `synthlab fit` puts what it fitted: the terminal (text or JSON), a figure, a saved record."""

    json_out: bool = option(
        False,
        "Print JSON: E, A, B, alpha, beta (+ C, gamma, t1..t3), r2, objective, intervals, derived, holdout, "
        "lack_of_fit.",
        flag="--json",
    )
    plot: Path | None = option(None, "Write a fit and residual plot (PNG) here.")
    save: Path | None = option(
        None,
        "Also write the fit as JSON here (what --json prints, plus this command and a digest of the fitted "
        "numbers): `synthlab report` decides an experiment's [[laws]] rule from it.",
    )


def _fit(law: str, table: Path, **kwargs) -> None:
    columns, options, output = flags.parsed(kwargs, TableColumns, TableFitOptions, FitOutput)
    for path, flag in ((output.plot, "--plot"), (output.save, "--save")):
        if path is not None:
            check_writable(path, flag)
    fitted = scaling.fit_table(table, law, columns, options)
    if fitted.skipped:
        typer.echo(
            f"skipped (one step, or too few rows for {len(fitted.law.params)} parameters): {', '.join(fitted.skipped)}",
            err=True,
        )
    if output.plot is not None:
        from synthlab.plots.scaling import plot_fit  # pandas and matplotlib: only with --plot

        plot_fit(fitted.law, [(g.title, g.data, g.result) for g in fitted.fits], output.plot)
    if fitted.law.name == "steps":
        payload = {"law": law, "fits": [{"Tm": g.tm, **_fit_json(g)} for g in fitted.fits]}
    else:
        payload = {"law": law, **_fit_json(fitted.fits[0])}
    if output.save is not None:
        command = "synthlab " + shlex.join(sys.argv[1:])
        atomic_write_text(output.save, scaling.fit_json({"command": command, **payload, **fitted.source}) + "\n")
    if output.json_out:
        typer.echo(scaling.fit_json(payload))
    else:
        typer.echo("\n".join(_fit_text(fitted.law, g) for g in fitted.fits))
        for path in (p for p in (output.plot, output.save) if p is not None):
            typer.echo(f"wrote {path}")


fit = flags.with_signature(
    _fit,
    [
        flags.argument("law", str, LAW_HELP),
        flags.argument("table", Path, "Results CSV, one row per run (or per checkpoint)."),
        *(p for cls in (TableColumns, TableFitOptions, FitOutput) for p in flags.dataclass_options(cls)),
    ],
    "fit",
    """Fit a loss law to TABLE by Huber regression on log loss, summed over runs, from a grid of starts.

    Example (Epoch's Chinchilla data): synthlab fit chinchilla chinchilla_svg_extracted.csv
    --n-col "Model Size" --tokens-from-flops "Training FLOP" --drop-top-loss 5
    """,
)
