"""`synthlab sweep`, `plot`, `steps`, `report`, `publish`: experiments as data, run, shown and published.

Their options: SweepOptions (synthlab.sweeps.options) and ReportOptions (synthlab.report.options),
the packages' own; plot's and steps' beside their commands (`PlotOptions`, `StepsOptions`). The
commands import the sweep, plot and report modules (torch, pandas, matplotlib) inside their
functions, so that the CLI starts without them.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from pathlib import Path
from typing import List

import typer

from synthlab.cli import flags
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text, check_writable
from synthlab.report.options import ReportOptions
from synthlab.serialize import option
from synthlab.sweeps.options import SweepOptions


def _sweep(name: str, **kwargs) -> None:
    from synthlab.sweeps import cost, driver, experiments  # torch: only when the command runs
    from synthlab.sweeps import lab_runner as point_runner
    from synthlab.sweeps.plan import plan
    from synthlab.sweeps.runner_protocol import load_runner

    options = SweepOptions(**kwargs)
    exp = experiments.load(name)
    if options.seeds is not None:
        exp = experiments.with_seeds(exp, options.preset, options.seeds)
    preset, out = options.preset, options.out_dir(exp.name)
    runner_module = load_runner(options.runner) if options.runner else point_runner
    if options.dry_run:
        gpu, calibration = preset == "gpu", options.calibration
        with cost.measured(
            calibration=cost.load_calibration(calibration) if gpu and calibration is not None else None,
            host_rates=cost.host_rates() if gpu else None,  # measured on this machine
        ):
            rows = plan(exp, preset, out, runner=runner_module, runs_dir=options.runs, gpu=gpu, jobs=options.jobs or 1)
            if options.only:
                chosen = {p.point_id for p in driver.select_points(exp.points(preset), options.only)}
                rows = [row for row in rows if row["point_id"] in chosen]
            _print_plan(rows, calibration)
        if runner_module is point_runner and not gpu:
            _print_cpu_basis(
                rows, {p.point_id: point_runner.parse(p.config) for p in exp.points(preset)}, options.jobs or 1
            )
        typer.echo(
            f"seeds per point: {exp.presets[preset].get('seeds', 1)} "
            f"({'--seeds' if options.seeds is not None else 'the preset'}; the cost above counts every seed)"
        )
        return
    try:
        results = driver.run_sweep(
            exp,
            preset,
            out,
            runner=runner_module,
            jobs=options.jobs,
            executor=options.executor,
            ray_address=options.ray_address,
            cache_dir=options.cache,
            runs_dir=options.runs,
            threads=options.threads,
            nproc_per_node=options.nproc(),
            reevaluate=options.reevaluate,
            only=options.only or (),
        )
    except driver.SweepInterrupted as stop:
        again = ["synthlab", "sweep", str(name), "--preset", preset, "--out", str(out)]
        again += ["--seeds", str(options.seeds)] if options.seeds is not None else []
        again += ["--runner", options.runner] if options.runner else []
        again += [arg for text in options.only or () for arg in ("--only", text)]
        typer.echo(
            f"interrupted: {stop.finished} of {stop.total} points finished (their rows are in {stop.results}); "
            f"resume with: {shlex.join(again)}",
            err=True,
        )
        raise typer.Exit(code=130) from None
    if runner_module is point_runner:  # the lab's own columns: say what was measured
        from synthlab.report.markdown import summary_lines  # pandas and scipy: only for the summary

        for line in summary_lines(out):
            typer.echo(line)
    typer.echo(f"results: {results}")


sweep = flags.with_signature(
    _sweep,
    [
        flags.argument("name", str, "Experiment name (capacity, mano, ...) or path to a TOML definition."),
        *flags.dataclass_options(SweepOptions),
    ],
    "sweep",
    "Run every point of an experiment's grid: data, training, evaluation; one row per run in OUT/results.csv.",
)


def _print_plan(rows: list[dict], calibration: Path | None = None) -> None:
    import pandas as pd

    from synthlab.sweeps import cost

    table = pd.DataFrame(rows)
    total = table["cost_s"].sum(min_count=1)
    table["cost"] = [f"{_duration(s)} ({src})" for s, src in zip(table["cost_s"], table["cost"])]
    typer.echo(table.drop(columns=["cost_s", "gpu_h_shared", "run_dir"], errors="ignore").to_string(index=False))
    todo = table[~table["status"].str.startswith("done")]
    changed = int((table["status"] == "done, config changed").sum())
    typer.echo(
        f"{len(table)} points, {len(todo)} to run; total cost {_duration(total)}"
        + (
            f"; {changed} done point(s) whose model was trained with another configuration than the "
            f"definition now asks for (their rows are kept; sweep into a new --out to rerun them)"
            if changed
            else ""
        )
    )
    models = table["run_dir"].drop_duplicates()
    typer.echo(
        f"trained models: in {Path(models.iloc[0]).parent} ({sum(Path(m).is_dir() for m in models)} of "
        f"{len(models)} already there, reused or resumed; --runs names another store)"
    )
    if "gpu_h" in table:
        mfu = ", ".join(f"{m:.0%}" for m in sorted(set(table["mfu"].dropna()), reverse=True)) or "-"
        source = (
            f"measured by the GPU check in {calibration} (packed points; the others assumed)"
            if calibration
            else "assumed: 35% compiled, 25% eager, just under the 38.6% / 25.7% measured in "
            "results/gpu; small shapes run below it (--calibration FILE: measured)"
        )
        typer.echo(
            f"gpu cost on one {cost.GPU}: {total / 3600:.1f} h at an MFU of {mfu} of "
            f"{cost.peak_flops() / 1e12:.0f} TFLOP/s ({source}); host work included (stall_h, eval_h); "
            f"largest peak {table['peak_gib'].max():.1f} GiB of {cost.GPU_MEMORY_GIB:.0f}."
        )
        rates = cost._host_rates
        if rates:
            typer.echo(
                f"host rates measured here (best of three): packing {rates['pack_s_per_example'] * 1e6:.1f} us "
                f"per example, checkpoints written at {1e-9 / rates['write_s_per_byte']:.2f} GB/s, snapshots "
                f"copied at {1e-9 / rates['snapshot_s_per_byte']:.2f} GB/s (a busy machine measures slower rates)"
            )
        typer.echo(
            "columns: pflop = training FLOPs / 1e15; layer_mib = activations of one layer application on one "
            "micro-batch (packed rows: fused/dense attention); act_gib = all activations kept, without/with "
            "activation checkpointing; peak_gib = weights, gradients, AdamW, activations (dense for packed "
            "rows) and logits, as configured; OUROBOROS points: from the Qwen2.5-3B step times and "
            "memory measured on one H200 (results/gpu); host, at rates measured on this machine: "
            "pack_h = packing every epoch and ckpt_h = writing ckpt_n checkpoints (both off the training "
            "thread), stall_h = what of the host's work the GPU waits for (in gpu_h), eval_h = the "
            "evaluation stages on the GPU (a forward over the training records each; in gpu_h)"
        )


def _print_cpu_basis(rows: list[dict], points: dict, jobs: int) -> None:
    """What the lab's CPU estimates rest on, and the points that train.compile would repay."""
    import os

    from synthlab.sweeps import step_rate

    typer.echo(
        f"estimated: each point's steps at the seconds per step of the sweep's finished runs of its training "
        f"shape; without any, of a few steps timed here ({step_rate.timed_shapes()} shape(s), one thread: CPU "
        f"seconds over the share of a core each of --jobs {jobs} at a time gets beside the work running now, "
        f"load average {os.getloadavg()[0]:.1f}), times how much slower the sweep's finished runs trained than "
        f"that; plus what finished runs of its stages and model spent past training (evaluation, OUROBOROS), "
        f"none before one finishes; more work later slows the runs down"
    )
    repaid = step_rate.compile_repays(rows, points)
    if repaid:
        typer.echo(
            f"train.compile would repay its compile time ({step_rate.COMPILE_COLD_S:.0f} s cold, "
            f"{step_rate.COMPILE_WARM_S:.1f} s warm, {step_rate.COMPILE_SPEEDUP:.2f}x faster steps measured on this "
            f"CPU: benchmarks/bench_compile.py) at {len(repaid)} point(s): {', '.join(repaid)} (it rounds "
            f"otherwise than eager: a new preset, not a committed one's rerun)"
        )


def _duration(seconds: float) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "?"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


@dataclasses.dataclass(frozen=True)
class PlotOptions:
    """Where `synthlab plot` draws, and which column. Beside the command rather than in
    synthlab.plots, which imports pandas and matplotlib on import (the CLI starts without them)."""

    out: Path | None = option(None, "Figure directory (default: SWEEP_DIR/figures).", short="-o")
    metric: str | None = option(
        None,
        "Draw this results column with the generic figure of the grid (default: the definition's figure; without "
        "one, the task's headline metric).",
    )


def _plot(name: str, sweep_dir: Path, **kwargs) -> None:
    from synthlab import plots
    from synthlab.plots import generic
    from synthlab.sweeps import experiments
    from synthlab.sweeps.results_table import read_results

    (options,) = flags.parsed(kwargs, PlotOptions)
    out = options.out or Path(sweep_dir) / "figures"
    check_writable(out)
    table = read_results(sweep_dir)
    if name in experiments.available() or name.endswith(".toml"):
        paths = generic.draw(experiments.load(name), table, out, metric=options.metric)
    else:
        paths = plots.plot(name, table, out)
    for path in paths:
        typer.echo(str(path))


plot = flags.with_signature(
    _plot,
    [
        flags.argument(
            "name", str, "Experiment name (capacity, mano, ...), path to a TOML definition, or a built-in plot kind."
        ),
        flags.argument("sweep_dir", Path, "Sweep directory holding results.csv."),
        *flags.dataclass_options(PlotOptions),
    ],
    "plot",
    """Draw an experiment's figures (PNG and SVG) from a sweep's results.csv: its built-in figure, or
    the generic figure of its grid (a definition without `plot`, or --metric).""",
)


@dataclasses.dataclass(frozen=True)
class StepsOptions:
    """Where `synthlab steps` writes its table (purely the command's: the file)."""

    out: Path | None = option(None, "CSV to write (default: SWEEP_DIR/steps.csv).", short="-o")


def _steps(sweep_dir: Path, **kwargs) -> None:
    import pandas as pd

    from synthlab.sweeps.results_table import step_rows

    (options,) = flags.parsed(kwargs, StepsOptions)
    rows = step_rows(sweep_dir)
    path = options.out or Path(sweep_dir) / "steps.csv"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, pd.DataFrame(rows).to_csv(index=False))
    except OSError as err:
        raise SynthlabError(f"cannot write --out {path}: {err.strerror}") from None
    typer.echo(f"{len(rows)} rows: {path}")


steps = flags.with_signature(
    _steps,
    [
        flags.argument("sweep_dir", Path, "Sweep directory holding results.csv and its runs/."),
        *flags.dataclass_options(StepsOptions),
    ],
    "steps",
    "Export one row per (run, recurrent step) with that step's loss: the table `synthlab fit steps` fits.",
)


def _report(sweep_dirs: list[Path], **kwargs) -> None:
    from synthlab.report import markdown as reporting

    (options,) = flags.parsed(kwargs, ReportOptions)
    if not sweep_dirs:
        raise SynthlabError("report needs at least one sweep directory")
    if options.notes is not None and not options.notes.is_file():
        raise SynthlabError(f"--notes file not found: {options.notes}")
    check_writable(options.out)
    path = reporting.write_report(
        sweep_dirs,
        options.out,
        copy_results=options.copy_results,
        notes=options.notes,
        title=options.title,
        index=options.index,
    )
    typer.echo(str(path))


report = flags.with_signature(
    _report,
    [
        flags.argument("sweep_dirs", List[Path], "Sweep directories (each with results.csv)."),
        *flags.dataclass_options(ReportOptions),
    ],
    "report",
    "Write a Markdown report with each sweep's claim, commands, table, figures and verdict.",
)


def _publish(sweep_dir: Path, results_dir: Path) -> None:
    from synthlab.sweeps.publish import publish as publish_sweep

    published = publish_sweep(sweep_dir, results_dir)
    typer.echo(f"{results_dir / 'results.csv'}: {published.rows_added} row(s) added or updated")
    for point_id, folder in published.curves.items():
        typer.echo(f"curve of {point_id}: {folder}")
    for point_id, model in published.without_curve.items():
        where = f"`synthlab capacity {model} --curve`, then publish again" if model else "its model is not here"
        typer.echo(f"no learning curve for {point_id}: {where}")


publish = flags.with_signature(
    _publish,
    [
        flags.argument("sweep_dir", Path, "Sweep directory (sweep.json, results.csv, runs/)."),
        flags.argument("results_dir", Path, "Results folder to merge it into (new, or this sweep's published one)."),
    ],
    "publish",
    """Merge a sweep into a results folder: its rows (the folder's kept), its record (commands added,
    the earliest data_began kept) and its points' learning curves (curves/NAME/).""",
)
