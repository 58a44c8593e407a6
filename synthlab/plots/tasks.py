"""The built-in figures of the task experiments: bioS capacity (bits vs parameters), Mano (accuracy
by model and length), multi-hop QA (accuracy per hop count) and reachability (accuracy per diameter
and distance).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from synthlab.evaluation.capacity import peak_capacity
from synthlab.plots.style import (
    layer_passes,
    mean_and_seeds,
    need,
    percent,
    pyplot,
    save,
    seed_count,
    seeds_note,
    short_count,
)

LENGTH_COLUMN = re.compile(
    r"^(train_)?acc_l(\d+)$"
)  # Mano per-length accuracy (synthlab.evaluation.groups.group_columns)
HOP_COLUMN = re.compile(r"^acc_h(\d+)$")  # multihop held-out accuracy per hop count


def plot_capacity(table: pd.DataFrame, out: Path) -> list[Path]:
    """Bits stored vs unique parameters, log-log; colour = N people, marker = loops; 1 and 2 bit/param;
    a star on each model's peak capacity ratio over the population sizes it was trained on."""
    # P as the estimate counts it (used embedding rows only) when the sweep recorded it
    params = "params_capacity" if "params_capacity" in table else "params"
    need(table, "capacity", params, "bits", "n_people", "loops")
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    data = table.assign(bits_shown=table["bits"].clip(lower=1.0))  # log axis: an empty model stores ~0 (or < 0)
    sns.scatterplot(
        data=data, x=params, y="bits_shown", hue="n_people", style="loops", s=70, palette="viridis", ax=ax, zorder=3
    )
    empty = data[data["bits"] < 1.0]
    if len(empty):  # say so, rather than let a clipped point pass for a measured one
        ax.scatter(
            empty[params],
            empty["bits_shown"],
            marker="o",
            s=160,
            facecolors="none",
            edgecolors="red",
            label="below 1 bit, negative too (drawn at 1)",
        )
    if {"bits_per_param", "fraction_of_max"} <= set(table.columns):
        peaks = peak_capacity(table)
        ax.scatter(
            peaks["params_counted"],
            peaks["bits"].clip(lower=1.0),
            marker="*",
            s=420,
            facecolors="none",
            edgecolors="black",
            linewidths=0.8,
            zorder=2,  # under the runs' own markers, which stay visible inside it
            label="each model's peak over N (mean of seeds)",
        )
    p = np.geomspace(table[params].min() / 1.5, table[params].max() * 1.5, 50)
    for rate, dash in ((1, ":"), (2, "--")):
        ax.plot(p, rate * p, dash, color="grey", label=f"{rate} bit/param")
    if "max_bits" in table:  # the data's own limit: above it a run measures the data, not the model
        for n, group in table.groupby("n_people"):
            ax.axhline(
                group["max_bits"].iloc[0], ls="-.", lw=0.8, color="black", alpha=0.6, label=f"all the data (N = {n:,})"
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="parameters (unique, count)",
        ylabel="knowledge stored (bits)",
        title="bioS capacity: bits vs parameters",
    )
    # Ticks at 1, 2 and 5 x 10^k, labelled 20K, 500K, 2M: a range within a decade has no power of ten
    # to label, and labelled minor ticks of a log axis overlap. (matplotlib: where a figure is drawn)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: short_count(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)  # beside: never over a run
    return save(fig, out, "capacity")


def _layers_loops(label: str) -> tuple:
    """Sort key of a "k x m" model label: by distinct layers, then loops (other labels last)."""
    match = re.fullmatch(r"(\d+)x(\d+)", str(label))
    return (0, int(match[1]), int(match[2])) if match else (1, 0, 0, str(label))


def plot_mano(table: pd.DataFrame, out: Path) -> list[Path]:
    """Exact-match accuracy at l = L: heatmap of model (k x m) by L."""
    need(table, "mano", "model", "L", "accuracy")
    plt, sns = pyplot()
    scored = table.assign(acc=percent(table))
    grid = scored.pivot_table(index="model", columns="L", values="acc", aggfunc="mean")
    grid = grid.loc[sorted(grid.index, key=_layers_loops)]
    n = seed_count(table)
    # each cell: the mean over seeds, and under it every seed's own value
    seeds = scored.pivot_table(index="model", columns="L", values="acc", aggfunc=list).reindex_like(grid)
    labels = grid.copy().astype(object)
    for model in grid.index:
        for L in grid.columns:
            values = seeds.loc[model, L] if isinstance(seeds.loc[model, L], list) else []
            labels.loc[model, L] = f"{grid.loc[model, L]:.1f}" + (
                "\n(" + ", ".join(f"{v:.0f}" for v in values) + ")" if n > 1 and len(values) > 1 else ""
            )
    fig, ax = plt.subplots(figsize=(1.5 + 1.3 * grid.shape[1], 1.2 + (0.7 if n > 1 else 0.45) * grid.shape[0]))
    sns.heatmap(
        grid,
        annot=labels.to_numpy(),
        fmt="",
        vmin=0,
        vmax=100,
        cmap="viridis",
        ax=ax,
        annot_kws={"fontsize": 8},
        cbar_kws={"label": "exact-match accuracy at l = L (%)"},
    )
    ax.set(
        xlabel="L (operators in the test expression)",
        ylabel="model (layers x loops)",
        title="Mano" + (f" (mean of {n} seeds; each seed below)" if n > 1 else ""),
    )
    paths = save(fig, out, "mano")
    if any(LENGTH_COLUMN.match(c) for c in table.columns):  # per-length diagnostics recorded
        paths += plot_lengths(table, out)
    return paths


def plot_lengths(table: pd.DataFrame, out: Path) -> list[Path]:
    """Mano accuracy per expression length l = 1..L, held-out (solid) and training prompts
    (dashed), one panel per L, one colour per model: which lengths a model has learned. Drawn
    with the Mano figure when results.csv has per-length columns (acc_l<l>, train_acc_l<l>)."""
    columns = [c for c in table.columns if LENGTH_COLUMN.match(c)]
    plt, sns = pyplot()
    seeds = [c for c in ("seed", "data_seed") if c in table]
    long = table.melt(id_vars=["model", "L", *seeds], value_vars=columns, var_name="column", value_name="acc").dropna(
        subset=["acc"]
    )
    parts = long["column"].str.extract(LENGTH_COLUMN)
    long = long.assign(
        length=parts[1].astype(int), acc=100 * long["acc"], prompts=np.where(parts[0].notna(), "training", "held-out")
    )
    panels = sorted(long["L"].unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False, sharey=True)
    order = sorted(long["model"].unique(), key=_layers_loops)
    for ax, L in zip(axes[0], panels):
        mean_and_seeds(
            sns,
            ax,
            long[long["L"] == L],
            "length",
            "acc",
            hue="model",
            hue_order=order,
            style="prompts",
            style_order=["held-out", "training"],
            legend=ax is axes[0][-1],
        )
        ax.set(
            xlabel="l (operators in the expression)",
            ylabel="exact-match accuracy (%)",
            ylim=(-2, 102),
            title=f"Mano L = {L}",
            xticks=range(1, int(L) + 1),
        )
    fig.suptitle("Mano per expression length" + seeds_note(table), fontsize=9)
    return save(fig, out, "mano_lengths")


def plot_multihop(table: pd.DataFrame, out: Path) -> list[Path]:
    """k-hop accuracy vs the number of unique k-hop training questions, one curve per model (loop
    count), held-out questions solid and training ones dashed (memorised vs generalised); the band
    spans the seeds."""
    x = "train_questions" if "train_questions" in table else "train_fraction"  # older tables: the fraction
    need(table, "multihop", x, "accuracy", "model")
    plt, sns = pyplot()
    hops = [int(m[1]) for m in map(HOP_COLUMN.match, table.columns) if m]
    long = table.assign(acc=percent(table), prompts="held-out")
    train_column = f"train_acc_h{max(hops)}" if hops else None
    if train_column in table:
        long = pd.concat([long, table.assign(acc=percent(table, train_column), prompts="training")])
    fig, ax = plt.subplots(figsize=(5.5, 4))
    mean_and_seeds(
        sns,
        ax,
        long,
        x,
        "acc",
        hue="model",
        style="prompts",
        hue_order=sorted(table["model"].unique(), key=_layers_loops),
        style_order=["held-out", "training"],
    )
    ax.set(
        xscale="log",
        xlabel="unique k-hop training questions" if x == "train_questions" else x,
        ylabel="k-hop accuracy (%)",
        ylim=(0, 100),
        title="Multi-hop QA" + seeds_note(table),
    )
    return save(fig, out, "multihop")


REACH_COLUMN = re.compile(r"^acc_d(\d+)_(yes|no)$")  # reach accuracy per distance and class


def reach_distances(table: pd.DataFrame) -> pd.DataFrame:
    """Reach accuracy per row and distance d, both classes pooled (each class's held-out accuracy
    weighted by its count `n_d<d>_<class>`): columns diameter, loops, the seed columns, distance,
    acc (a fraction)."""
    keep = [c for c in ("diameter", "loops", "passes", "kind", "seed", "data_seed") if c in table]
    parts = []
    for d in sorted({int(m[1]) for m in map(REACH_COLUMN.match, table.columns) if m}):
        classes = [c for c in ("yes", "no") if f"acc_d{d}_{c}" in table]
        n = sum(table[f"n_d{d}_{c}"] for c in classes)
        hits = sum(table[f"acc_d{d}_{c}"] * table[f"n_d{d}_{c}"] for c in classes)
        parts.append(table[keep].assign(distance=d, acc=hits / n))
    if not parts:  # a table from before the per-distance columns
        return pd.DataFrame(columns=[*keep, "distance", "acc"])
    return pd.concat(parts, ignore_index=True).dropna(subset=["acc"])


def plot_reach(table: pd.DataFrame, out: Path) -> list[Path]:
    """Reach accuracy vs layer passes (plain k x 1 at equal FLOPs marked apart): all queries, a curve
    per diameter D (left); per distance d, classes pooled (a panel per D); bands span seeds."""
    need(table, "reach", "loops", "accuracy", "diameter")
    plt, sns = pyplot()
    table = layer_passes(table)
    per_distance = reach_distances(table)
    diameters = sorted(per_distance["diameter"].unique())
    fig, axes = plt.subplots(1, 1 + len(diameters), figsize=(5 * (1 + len(diameters)), 4), squeeze=False)
    mean_and_seeds(
        sns,
        axes[0][0],
        table.assign(acc=percent(table)),
        "passes",
        "acc",
        hue="diameter",
        style="kind",
        palette="viridis",
    )
    axes[0][0].set(title="all test queries" + seeds_note(table))
    for ax, D in zip(axes[0][1:], diameters):
        rows = per_distance[per_distance["diameter"] == D]
        mean_and_seeds(
            sns,
            ax,
            rows.assign(acc=100 * rows["acc"]),
            "passes",
            "acc",
            hue="distance",
            style="kind",
            palette="rocket_r",
        )
        ax.set(title=f"per distance d (both classes), D = {D}")
    for ax in axes[0]:
        ax.axhline(50, color="grey", ls=":", label="chance")
        ax.set(
            xlabel="layer passes (loops x distinct layers; FLOPs)",
            ylabel="accuracy (%)",
            ylim=(0, 100),
            xticks=sorted(table["passes"].unique()),
        )
    return save(fig, out, "reach")
