"""The built-in figures of the looped mechanisms: early exit, KV-cache reuse, recurrence topology,
training recipes, depth extrapolation, step-to-step faithfulness and OUROBOROS on a Qwen2 base.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from synthlab.errors import SynthlabError
from synthlab.plots.style import (
    bars_and_seeds,
    mean_and_seeds,
    need,
    percent,
    pyplot,
    save,
    seed_count,
    seeds_note,
)
from synthlab.sweeps import schema

STEP_COLUMN, DEPTH_COLUMN, AGREE_COLUMN = schema.ACC_STEP.regex, schema.LOSS_DEPTH.regex, schema.AGREE.regex


def plot_exit(table: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy vs mean exit step, one curve per exit strategy (thresholds along each curve)."""
    need(table, "exit", "strategy", "mean_exit_step", "accuracy")
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    data = table.assign(acc=percent(table))
    rule = [c for c in ("strategy", "threshold") if c in data]
    means = data.groupby(rule, as_index=False)[["mean_exit_step", "acc"]].mean().sort_values("mean_exit_step")
    sns.lineplot(
        data=means, x="mean_exit_step", y="acc", hue="strategy", style="strategy", markers=True, sort=False, ax=ax
    )
    if seed_count(data) > 1:  # every seed of every exit rule as a point under the mean curve
        sns.scatterplot(data=data, x="mean_exit_step", y="acc", hue="strategy", alpha=0.4, s=14, legend=False, ax=ax)
    ax.set(
        xlabel="mean exit step (recurrent steps per token)",
        ylabel="accuracy (%)",
        title="Early exit" + (f" (mean of {seed_count(data)} seeds; points: seeds)" if seed_count(data) > 1 else ""),
    )
    return save(fig, out, "exit")


def plot_kvcache(table: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy and decode-time KV-cache memory per strategy (two panels)."""
    need(table, "kvcache", "kv", "accuracy", "kv_bytes")
    plt, sns = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    order = [s for s in ("full", "first", "last", "mean") if s in set(table["kv"])]
    bars_and_seeds(sns, left, table.assign(acc=percent(table)), "kv", "acc", order=order)
    left.set(xlabel="KV-cache strategy", ylabel="accuracy (%)", ylim=(0, 100))
    sns.barplot(data=table.assign(kib=table["kv_bytes"] / 1024), x="kv", y="kib", order=order, ax=right)
    right.set(xlabel="KV-cache strategy", ylabel="cache memory (KiB)")
    fig.suptitle("KV-cache reuse at decode time" + seeds_note(table))
    return save(fig, out, "kvcache")


def plot_topology(table: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy per topology (sandwich, full-stack loop, injection and state-init variants)."""
    need(table, "topology", "model", "accuracy")
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.8 + 0.4 * table["model"].nunique()))
    data = table.assign(acc=percent(table))
    order = data.groupby("model")["acc"].mean().sort_values(ascending=False).index
    bars_and_seeds(sns, ax, data, "acc", "model", order=order)
    ax.set(xlabel="accuracy (%)", ylabel="topology", xlim=(0, 100), title="Recurrence topology" + seeds_note(table))
    return save(fig, out, "topology")


def plot_recipe(table: pd.DataFrame, out: Path) -> list[Path]:
    """Held-out accuracy and final training loss per recipe: every seed as a point, the mean as a bar."""
    need(table, "recipe", "recipe", "accuracy", "train_loss")
    plt, sns = pyplot()
    data = table.assign(acc=percent(table))
    order = data.groupby("recipe")["acc"].mean().sort_values(ascending=False).index
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 0.9 + 0.4 * len(order)), sharey=True)
    sns.barplot(data=data, y="recipe", x="acc", order=order, errorbar=None, color="lightsteelblue", ax=left)
    sns.stripplot(data=data, y="recipe", x="acc", order=order, color="black", size=5, jitter=False, ax=left)
    left.set(xlabel="held-out accuracy at l = L (%)", ylabel="recipe", xlim=(0, 100))
    sns.stripplot(data=data, y="recipe", x="train_loss", order=order, color="black", size=5, jitter=False, ax=right)
    right.set(xlabel="training loss, last 10% of steps (nats)", xscale="log")
    fig.suptitle("Training recipes (points: seeds; bars: their mean)")
    return save(fig, out, "recipe")


def _step_long(table: pd.DataFrame) -> pd.DataFrame:
    steps = [c for c in table.columns if STEP_COLUMN.match(c)]
    if not steps:
        raise SynthlabError("plot 'depth' needs acc_step_<T> columns in results.csv")
    long = table.melt(
        id_vars=[c for c in table.columns if c not in steps],
        value_vars=steps,
        var_name="column",
        value_name="acc_at_step",
    ).dropna(subset=["acc_at_step"])
    return long.assign(step=long["column"].str.extract(STEP_COLUMN, expand=False).astype(int))


def plot_depth(table: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy vs the number of recurrent steps at evaluation, past the trained depth (dotted)."""
    need(table, "depth", "loops")
    plt, sns = pyplot()
    long = _step_long(table)
    note = seeds_note(table).strip()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    mean_and_seeds(sns, ax, long.assign(acc=100 * long["acc_at_step"]), "step", "acc", hue="loops", palette="viridis")
    for loops in sorted(table["loops"].unique()):
        ax.axvline(loops, color="grey", ls=":", lw=0.8)
    ax.set(
        xlabel="recurrent steps at evaluation T",
        ylabel="accuracy (%)",
        ylim=(0, 100),
        title="Depth extrapolation (dotted: trained loops)" + ("\n" + note if note else ""),
    )
    return save(fig, out, "depth")


def agreement_matrix(row: pd.Series) -> np.ndarray:
    """The step x step answer-agreement matrix stored in a row's agree_<i>_<j> columns."""
    cells = {tuple(map(int, m.groups())): row[c] for c in row.index if (m := AGREE_COLUMN.match(c))}
    size = max(max(k) for k in cells)
    matrix = np.full((size, size), np.nan)
    for (i, j), value in cells.items():
        matrix[i - 1, j - 1] = value
    return matrix


def plot_faithfulness(table: pd.DataFrame, out: Path) -> list[Path]:
    """Step x step agreement of the answers (%), one heatmap per model (the mean over its seeds, with
    their range under it)."""
    if not any(AGREE_COLUMN.match(c) for c in table.columns):
        raise SynthlabError("plot 'faithfulness' needs agree_<i>_<j> columns in results.csv")
    plt, sns = pyplot()
    keys = [c for c in ("model", "loops", "train.loss") if c in table]
    groups = [g for _, g in table.groupby(keys, sort=False, dropna=False)] if keys else [table]
    many = seed_count(table) > 1
    size = 6.2 if many else 4.2
    fig, axes = plt.subplots(1, len(groups), figsize=(size * len(groups), size - 0.4), squeeze=False)
    for ax, group in zip(axes[0], groups):
        row = group.iloc[0]
        per_seed = 100 * np.array([agreement_matrix(r) for _, r in group.iterrows()])
        matrix = per_seed.mean(axis=0)
        ticks = list(range(1, len(matrix) + 1))
        # each cell: the mean over seeds, and under it the seeds' lowest and highest value
        labels = np.vectorize(lambda mean, low, high: f"{mean:.0f}" + (f"\n{low:.0f}-{high:.0f}" if many else ""))(
            matrix, per_seed.min(axis=0), per_seed.max(axis=0)
        )
        sns.heatmap(
            matrix,
            annot=labels if len(matrix) <= 8 else False,
            fmt="",
            vmin=0,
            vmax=100,
            cmap="viridis",
            ax=ax,
            xticklabels=ticks,
            yticklabels=ticks,
            annot_kws={"fontsize": 7 if many else 9},
            cbar_kws={"label": "answers agreeing (%)"},
        )
        title = (
            f"{row.get('model', '')} trained {row['loops']} loops"
            + (f", {row['train.loss']} loss" if "train.loss" in row else "")
            + (f"\n(mean of {seed_count(group)} seeds; under it the seeds' range)" if seed_count(group) > 1 else "")
        )
        ax.set(xlabel="recurrent step", ylabel="recurrent step", title=title)
    return save(fig, out, "faithfulness")


def plot_ouroboros(table: pd.DataFrame, out: Path) -> list[Path]:
    """C11: held-out loss vs recurrent depth per OUROBOROS variant (mean over seeds +- s.e., every
    seed a point); the full base and the truncated model (no loop) as horizontal references."""
    need(table, "ouroboros", "variant", "loss_base", "loss_truncated")
    depths = [c for c in table.columns if DEPTH_COLUMN.match(c)]
    if not depths:
        raise SynthlabError("plot 'ouroboros' needs loss_depth_<k> columns in results.csv")
    seeds = [c for c in ("seed", "data_seed") if c in table]
    long = table.melt(id_vars=["variant", *seeds], value_vars=depths, value_name="heldout")
    long["depth"] = long["variable"].str.extract(DEPTH_COLUMN, expand=False).astype(int)
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    mean_and_seeds(sns, ax, long, "depth", "heldout", hue="variant", hue_order=list(dict.fromkeys(table["variant"])))
    for column, label, style in (("loss_base", "full base", "-"), ("loss_truncated", "truncated (no loop)", "--")):
        ax.axhline(table[column].mean(), color="grey", ls=style, lw=1, label=label)
    ticks = sorted(long["depth"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set(xlabel="recurrent depth", ylabel="held-out loss (nats/token)", title="OUROBOROS (C11)" + seeds_note(table))
    ax.legend(fontsize=7)
    return save(fig, out, "ouroboros")
