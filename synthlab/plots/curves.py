"""Training curves of runs, read from their metrics.jsonl: `synthlab curves RUN [RUN...]`.

One figure (PNG + SVG) of three panels, every run overlaid:
- the training objective over optimizer steps (log scale);
- the loss read out after each recurrent step t = 1..T at the end of training (the mean over the
  last logged 10% of steps, as `synthlab steps` takes it): what each extra loop buys;
- the learning rate over optimizer steps;
and, for runs trained with `eval_every`, a second figure (`<name>_groups`): the accuracy per
group (Mano length, hops, distance, attribute) on held-out and training prompts over the steps,
one panel per run: when each length is learned.

Runs are coloured by group: each run its own, or, for the runs of a sweep folder (one with
results.csv), the value of a factor (`by`, e.g. loops), so seeds of one setting share a colour.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from synthlab.errors import SynthlabError
from synthlab.plots.style import pyplot, save
from synthlab.sweeps.results_table import RESULTS, find_model_dir, read_results
from synthlab.training.run_folders import read_metrics

EVAL_ACCURACY = re.compile(
    r"^eval/(train_)?acc_(.+)$"
)  # train.logging.eval_every's records (synthlab.evaluation.groups.GroupProbe)


@dataclass(frozen=True)
class Curve:
    """One run to draw: its folder, its name in the legend and its group (the colour)."""

    run_dir: Path
    label: str
    group: str


def _label(run_dir: Path) -> str:
    return run_dir.parent.name if run_dir.name == "model" else run_dir.name  # a sweep's runs/<id>/model


def collect(paths: list[Path], by: str | None = None) -> list[Curve]:
    """The runs named by `paths`: run folders, and the runs of sweep folders (grouped by `by`)."""
    curves = []
    for path in map(Path, paths):
        if (path / RESULTS).is_file():
            table = read_results(path)
            if by is not None and by not in table.columns:
                raise SynthlabError(
                    f"--by {by}: no such column in {path / RESULTS}; columns: {', '.join(table.columns)}"
                )
            for _, row in table.iterrows():
                run_dir = find_model_dir(path, str(row["run_dir"]))
                if any(curve.run_dir == run_dir for curve in curves):  # points sharing one model: one curve
                    continue
                group = f"{by}={row[by]}" if by else _label(run_dir)
                seed = f"seed {int(row['seed'])}" if "seed" in row and pd.notna(row["seed"]) else ""
                label = ", ".join(part for part in (group if by else "", seed, _label(run_dir)) if part)
                curves.append(Curve(run_dir, label, group))
        elif (path / "metrics.jsonl").is_file():
            curves.append(Curve(path, _label(path), _label(path)))
        else:
            raise SynthlabError(f"{path} is neither a run folder (metrics.jsonl) nor a sweep folder ({RESULTS})")
    if not curves:
        raise SynthlabError("no runs to draw")
    return curves


def _tables(curves: list[Curve]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run and logged step, one row per run and recurrent step)."""
    over_training, per_step = [], []
    for curve in curves:
        records = read_metrics(curve.run_dir)
        if not records:
            raise SynthlabError(f"{curve.run_dir / 'metrics.jsonl'} is empty (no step logged yet)")
        for r in records:
            over_training.append(
                {"run": curve.label, "group": curve.group, "step": r["step"], "loss": r["loss"], "lr": r["lr"]}
            )
        tail = [r["loss_per_step"] for r in records[-max(1, len(records) // 10) :]]
        for t in range(len(tail[-1])):
            values = [losses[t] for losses in tail if len(losses) == len(tail[-1])]
            per_step.append(
                {"run": curve.label, "group": curve.group, "recurrent step": t + 1, "loss": sum(values) / len(values)}
            )
    return pd.DataFrame(over_training), pd.DataFrame(per_step)


def plot_curves(curves: list[Curve], out: str | Path, name: str = "curves") -> list[Path]:
    """Draw `curves` into OUT/<name>.png and .svg; returns the paths."""
    training, per_step = _tables(curves)
    plt, sns = pyplot()
    from matplotlib.ticker import FormatStrFormatter, NullFormatter  # where a figure is drawn (package docstring)

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    order = list(dict.fromkeys(c.group for c in curves))
    style = {"hue": "group", "hue_order": order, "units": "run", "estimator": None, "legend": False}
    sns.lineplot(data=training, x="step", y="loss", ax=axes[0], **style)
    axes[0].set(yscale="log", xlabel="optimizer step", ylabel="training objective (nats/token)", title="loss")
    axes[0].yaxis.set_major_formatter(FormatStrFormatter("%.3g"))  # 2.4, not 2.4 x 10^0
    positive = training["loss"][training["loss"] > 0]
    narrow = len(positive) and positive.max() / positive.min() < 10  # within a decade: label the minor ticks too
    axes[0].yaxis.set_minor_formatter(FormatStrFormatter("%.3g") if narrow else NullFormatter())
    sns.lineplot(data=per_step, x="recurrent step", y="loss", marker="o", ax=axes[1], **style)
    axes[1].set(
        xlabel="recurrent step t", ylabel="loss after step t (nats/token)", title="loss per recurrent step (end)"
    )
    axes[1].set_xticks(sorted(per_step["recurrent step"].unique()))  # whole steps (one loop: just 1)
    sns.lineplot(data=training, x="step", y="lr", ax=axes[2], **{**style, "legend": "auto"})
    axes[2].set(xlabel="optimizer step", ylabel="learning rate", title="schedule")
    axes[2].legend(title=None, fontsize="small", loc="best")
    paths = save(fig, Path(out), name)
    learning = _learning(curves)
    if not learning.empty:
        paths += plot_learning(learning, out, f"{name}_groups")
    return paths


def _learning(curves: list[Curve]) -> pd.DataFrame:
    """One row per run, evaluated step, group and prompt kind (held-out or training)."""
    rows = []
    for curve in curves:
        for r in read_metrics(curve.run_dir):
            for key, value in r.items():
                if match := EVAL_ACCURACY.match(key):
                    rows.append(
                        {
                            "run": curve.label,
                            "step": r["step"],
                            "group": match[2],
                            "acc": 100 * value,
                            "prompts": "training" if match[1] else "held-out",
                        }
                    )
    return pd.DataFrame(rows)


def plot_learning(learning: pd.DataFrame, out: str | Path, name: str) -> list[Path]:
    """Accuracy per group over optimizer steps, held-out solid and training dashed, one panel per run."""
    plt, sns = pyplot()
    runs = list(dict.fromkeys(learning["run"]))
    fig, axes = plt.subplots(1, len(runs), figsize=(4.5 * len(runs), 3.8), squeeze=False, sharey=True)
    for ax, run in zip(axes[0], runs):
        sns.lineplot(
            data=learning[learning["run"] == run],
            x="step",
            y="acc",
            hue="group",
            hue_order=list(dict.fromkeys(learning["group"])),
            style="prompts",
            style_order=["held-out", "training"],
            marker="o",
            ax=ax,
            legend=ax is axes[0][-1],
        )
        ax.set(xlabel="optimizer step", ylabel="exact-match accuracy (%)", ylim=(-2, 102), title=run)
    return save(fig, Path(out), name)
