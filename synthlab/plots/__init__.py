"""One figure per experiment kind, drawn with seaborn from a sweep's results table.

Each plotter takes the table (a pandas DataFrame with the columns of `synthlab.results`)
and an output folder, saves the figure as PNG and SVG, and returns the paths. Axes carry units:
"bits", "parameters (unique)", "accuracy (%)", "tokens", "recurrent steps", "bytes". A sweep over
seeds is drawn as the mean over seeds with a band (or bar) of one standard error, and every seed
as a point (`synthlab.plots.style`); a heatmap cell shows the mean, and under it every seed's value (Mano)
or the seeds' range (faithfulness).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from synthlab import schema
from synthlab.errors import SynthlabError
from synthlab.files import warn
from synthlab.plots.style import bars_and_seeds, layer_passes, mean_and_seeds, pyplot, save, seed_count, seeds_note
from synthlab.results import RESULTS, check_numbers, factor_column, read_rows

STEP_COLUMN, DEPTH_COLUMN, AGREE_COLUMN = schema.ACC_STEP.regex, schema.LOSS_DEPTH.regex, schema.AGREE.regex
LENGTH_COLUMN = re.compile(r"^(train_)?acc_l(\d+)$")  # Mano per-length accuracy (synthlab.evaluate.group_columns)
HOP_COLUMN = re.compile(r"^acc_h(\d+)$")  # multihop held-out accuracy per hop count


def read_results(sweep_dir: str | Path) -> pd.DataFrame:
    """A sweep's results.csv, its whole rows only (one cut short is left out, with a warning); a
    grid-axis column that duplicates a descriptor (`model.loops` beside `loops`, written by older
    versions) is dropped, one without its descriptor (`train.seed`) is renamed to it (`seed`)."""
    path = Path(sweep_dir) / RESULTS
    if not path.is_file():
        raise SynthlabError(f"no results.csv in {sweep_dir} (run `synthlab sweep` first)")
    rows = read_rows(path)
    if not rows:
        raise SynthlabError(f"{path} has no whole row (run `synthlab sweep` again to finish it)")
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    table = check_numbers(pd.read_csv(io.StringIO(text.getvalue())), path)  # types inferred as from the file
    table = table.drop(columns=[c for c in table if factor_column(c) != c and factor_column(c) in table])
    table = table.rename(columns={c: factor_column(c) for c in table})
    table.attrs["sweep_dir"] = str(sweep_dir)  # where a plotter finds the sweep's saved fits (fit_looplm.json)
    return table


def _need(table: pd.DataFrame, kind: str, *columns: str) -> None:
    if missing := [c for c in columns if c not in table.columns]:
        raise SynthlabError(f"plot '{kind}' needs column(s) {missing} in results.csv")


def _percent(table: pd.DataFrame, column: str = "accuracy") -> pd.Series:
    return 100.0 * table[column]


def plot_capacity(table: pd.DataFrame, out: Path) -> list[Path]:
    """Bits stored vs unique parameters, log-log; colour = N people, marker = loops; 1 and 2 bit/param."""
    # P as the estimate counts it (used embedding rows only) when the sweep recorded it
    params = "params_capacity" if "params_capacity" in table else "params"
    _need(table, "capacity", params, "bits", "n_people", "loops")
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    data = table.assign(bits_shown=table["bits"].clip(lower=1.0))  # log axis: an empty model stores ~0 (or < 0)
    sns.scatterplot(data=data, x=params, y="bits_shown", hue="n_people", style="loops", s=70,
                    palette="viridis", ax=ax)
    empty = data[data["bits"] < 1.0]
    if len(empty):  # say so, rather than let a clipped point pass for a measured one
        ax.scatter(empty[params], empty["bits_shown"], marker="o", s=160, facecolors="none", edgecolors="red",
                   label="below 1 bit, negative too (drawn at 1)")
    p = np.geomspace(table[params].min() / 1.5, table[params].max() * 1.5, 50)
    for rate, dash in ((1, ":"), (2, "--")):
        ax.plot(p, rate * p, dash, color="grey", label=f"{rate} bit/param")
    if "max_bits" in table:  # the data's own limit: above it a run measures the data, not the model
        for n, group in table.groupby("n_people"):
            ax.axhline(group["max_bits"].iloc[0], ls="-.", lw=0.8, color="black", alpha=0.6,
                       label=f"all the data (N = {n:,})")
    ax.set(xscale="log", yscale="log", xlabel="parameters (unique, count)", ylabel="knowledge stored (bits)",
           title="bioS capacity: bits vs parameters")
    ax.legend(fontsize=7)
    return save(fig, out, "capacity")


def _layers_loops(label: str) -> tuple:
    """Sort key of a "k x m" model label: by distinct layers, then loops (other labels last)."""
    match = re.fullmatch(r"(\d+)x(\d+)", str(label))
    return (0, int(match[1]), int(match[2])) if match else (1, 0, 0, str(label))


def plot_mano(table: pd.DataFrame, out: Path) -> list[Path]:
    """Exact-match accuracy at l = L: heatmap of model (k x m) by L."""
    _need(table, "mano", "model", "L", "accuracy")
    plt, sns = pyplot()
    scored = table.assign(acc=_percent(table))
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
                "\n(" + ", ".join(f"{v:.0f}" for v in values) + ")" if n > 1 and len(values) > 1 else "")
    fig, ax = plt.subplots(figsize=(1.5 + 1.3 * grid.shape[1], 1.2 + (0.7 if n > 1 else 0.45) * grid.shape[0]))
    sns.heatmap(grid, annot=labels.to_numpy(), fmt="", vmin=0, vmax=100, cmap="viridis", ax=ax,
                annot_kws={"fontsize": 8}, cbar_kws={"label": "exact-match accuracy at l = L (%)"})
    ax.set(xlabel="L (operators in the test expression)", ylabel="model (layers x loops)",
           title="Mano" + (f" (mean of {n} seeds; each seed below)" if n > 1 else ""))
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
    long = table.melt(id_vars=["model", "L", *seeds], value_vars=columns, var_name="column",
                      value_name="acc").dropna(subset=["acc"])
    parts = long["column"].str.extract(LENGTH_COLUMN)
    long = long.assign(length=parts[1].astype(int), acc=100 * long["acc"],
                       prompts=np.where(parts[0].notna(), "training", "held-out"))
    panels = sorted(long["L"].unique())
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False, sharey=True)
    order = sorted(long["model"].unique(), key=_layers_loops)
    for ax, L in zip(axes[0], panels):
        mean_and_seeds(sns, ax, long[long["L"] == L], "length", "acc", hue="model", hue_order=order, style="prompts",
                       style_order=["held-out", "training"], legend=ax is axes[0][-1])
        ax.set(xlabel="l (operators in the expression)", ylabel="exact-match accuracy (%)", ylim=(-2, 102),
               title=f"Mano L = {L}", xticks=range(1, int(L) + 1))
    fig.suptitle("Mano per expression length" + seeds_note(table), fontsize=9)
    return save(fig, out, "mano_lengths")


def plot_multihop(table: pd.DataFrame, out: Path) -> list[Path]:
    """k-hop accuracy vs the number of unique k-hop training questions, one curve per model (loop
    count), held-out questions solid and training ones dashed (memorised vs generalised); the band
    spans the seeds."""
    x = "train_questions" if "train_questions" in table else "train_fraction"  # older tables: the fraction
    _need(table, "multihop", x, "accuracy", "model")
    plt, sns = pyplot()
    hops = [int(m[1]) for m in map(HOP_COLUMN.match, table.columns) if m]
    long = table.assign(acc=_percent(table), prompts="held-out")
    train_column = f"train_acc_h{max(hops)}" if hops else None
    if train_column in table:
        long = pd.concat([long, table.assign(acc=_percent(table, train_column), prompts="training")])
    fig, ax = plt.subplots(figsize=(5.5, 4))
    mean_and_seeds(sns, ax, long, x, "acc", hue="model", style="prompts",
                    hue_order=sorted(table["model"].unique(), key=_layers_loops), style_order=["held-out", "training"])
    ax.set(xscale="log", xlabel="unique k-hop training questions" if x == "train_questions" else x,
           ylabel="k-hop accuracy (%)", ylim=(0, 100), title="Multi-hop QA" + seeds_note(table))
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
    _need(table, "reach", "loops", "accuracy", "diameter")
    plt, sns = pyplot()
    table = layer_passes(table)
    per_distance = reach_distances(table)
    diameters = sorted(per_distance["diameter"].unique())
    fig, axes = plt.subplots(1, 1 + len(diameters), figsize=(5 * (1 + len(diameters)), 4), squeeze=False)
    mean_and_seeds(sns, axes[0][0], table.assign(acc=_percent(table)), "passes", "acc", hue="diameter",
                    style="kind", palette="viridis")
    axes[0][0].set(title="all test queries" + seeds_note(table))
    for ax, D in zip(axes[0][1:], diameters):
        rows = per_distance[per_distance["diameter"] == D]
        mean_and_seeds(sns, ax, rows.assign(acc=100 * rows["acc"]), "passes", "acc", hue="distance",
                        style="kind", palette="rocket_r")
        ax.set(title=f"per distance d (both classes), D = {D}")
    for ax in axes[0]:
        ax.axhline(50, color="grey", ls=":", label="chance")
        ax.set(xlabel="layer passes (loops x distinct layers; FLOPs)", ylabel="accuracy (%)", ylim=(0, 100),
               xticks=sorted(table["passes"].unique()))
    return save(fig, out, "reach")


def fit_scaling(table: pd.DataFrame):
    """The LoopLM fit saved beside the table if it fitted these numbers (the report's verdict's), else
    a fit of the richest law the table supports: LoopLM if loops vary and rows allow, else Chinchilla."""
    from synthlab import scaling

    try:
        if "sweep_dir" in table.attrs and (saved := scaling.saved_fit(table, Path(table.attrs["sweep_dir"]))):
            return saved
    except SynthlabError as err:
        warn(f"{err}; the figure draws a refit of its own")
    variables = {v: table[c].to_numpy(float) for v, c in (("N", "params"), ("D", "tokens"), ("Tm", "loops"))}
    data = scaling.Data(variables, table["loss"].to_numpy(float))
    if table["params"].nunique() < 3 or table["tokens"].nunique() < 3:
        return None  # two sizes cannot pin an exponent plus a constant: any fit would be degenerate
    laws = ("looplm", "chinchilla") if table["loops"].nunique() >= 2 else ("chinchilla",)
    return next((scaling.fit(law, data) for law in laws if len(table) > len(scaling.get_law(law).params)), None)


def plot_scaling(table: pd.DataFrame, out: Path) -> list[Path]:
    """Loss vs N, D and T (three panels); dashed: the fitted law's prediction at each run."""
    from matplotlib.ticker import NullFormatter

    from synthlab import scaling

    d_col, loss_col = scaling.default_columns(table.columns)  # as `synthlab fit` reads the table
    if d_col != "tokens":  # the heldout stage: the held-out loss at each scored checkpoint
        table = table.assign(tokens=table[d_col], loss=table[loss_col])
    _need(table, "scaling", "params", "tokens", "loops", "loss")
    plt, sns = pyplot()

    result = fit_scaling(table)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.8), sharey=True)
    if result is not None:
        law = scaling.get_law(result.law)
        X = table[[{"N": "params", "D": "tokens", "Tm": "loops"}[v] for v in law.variables]].to_numpy(float)
        table = table.assign(predicted=law.predict(result.theta, X))
    # one level per grid value (a run's D differs from its seed-mates' by a few tokens): ticks, legend, lines
    table = table.assign(**{c: table[c].map(lambda v: int(float(f"{v:.3g}"))) for c in ("params", "tokens")})
    panels = (("params", "model size N (parameters)", "tokens"), ("tokens", "data D (training tokens)", "params"),
              ("loops", "recurrent depth T (loops)", "params"))
    for ax, (x, label, hue) in zip(axes, panels):
        sns.scatterplot(data=table, x=x, y="loss", hue=hue, style="loops" if x != "loops" else None,
                        palette="viridis", ax=ax, legend="full" if x != "tokens" else False)
        if result is not None:
            for _, group in table.sort_values(x).groupby([c for c in ("params", "tokens", "loops") if c != x]):
                ax.plot(group[x], group["predicted"], "--", color="grey", lw=0.8)
        ax.set(xlabel=label, ylabel="loss (nats/token)", xscale="log" if x != "loops" else "linear")
        ax.xaxis.set_minor_formatter(NullFormatter())  # log-axis minor labels overlap
        values = sorted(table[x].unique())  # label the grid's own values (often within one decade)
        ax.set_xticks(values, [f"{v:.3g}" for v in values], rotation=30 if x != "loops" else 0)
    for ax, ncol in ((axes[0], 2), (axes[-1], 5)):  # under their panels, off the points; the middle one's colours are the last's
        sns.move_legend(ax, "upper center", bbox_to_anchor=(0.5, -0.4), ncol=ncol, fontsize=7, title_fontsize=8, frameon=False)
    fig.suptitle(scaling_title(result), fontsize=8)
    return save(fig, out, "scaling")


def scaling_title(result) -> str:
    """The scaling figure's title: the fitted constants, or, for a degenerate fit (as `synthlab fit`
    warns), that its constants are not identified, naming those that ran off. The law's verdict
    (which also tests its form) is the report's."""
    from synthlab import scaling

    if result is None:
        return "no law fitted (needs >= 3 model sizes, >= 3 data sizes and more runs than parameters)"
    if bad := scaling.implausible(result.params):
        return (f"{result.law}: degenerate fit (dashed, R² = {result.r2:.3f}; "
                + ", ".join(f"{k}={v:.3g}" for k, v in bad.items())
                + "): its constants are not identified; the verdict is the claims table's")
    return f"fitted {result.law}: R² = {result.r2:.3f}, " + ", ".join(f"{k}={v:.3g}" for k, v in result.params.items())


def plot_exit(table: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy vs mean exit step, one curve per exit strategy (thresholds along each curve)."""
    _need(table, "exit", "strategy", "mean_exit_step", "accuracy")
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    data = table.assign(acc=_percent(table))
    rule = [c for c in ("strategy", "threshold") if c in data]
    means = data.groupby(rule, as_index=False)[["mean_exit_step", "acc"]].mean().sort_values("mean_exit_step")
    sns.lineplot(data=means, x="mean_exit_step", y="acc", hue="strategy", style="strategy", markers=True, sort=False,
                 ax=ax)
    if seed_count(data) > 1:  # every seed of every exit rule as a point under the mean curve
        sns.scatterplot(data=data, x="mean_exit_step", y="acc", hue="strategy", alpha=0.4, s=14, legend=False, ax=ax)
    ax.set(xlabel="mean exit step (recurrent steps per token)", ylabel="accuracy (%)",
           title="Early exit" + (f" (mean of {seed_count(data)} seeds; points: seeds)" if seed_count(data) > 1 else ""))
    return save(fig, out, "exit")


def plot_kvcache(table: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy and decode-time KV-cache memory per strategy (two panels)."""
    _need(table, "kvcache", "kv", "accuracy", "kv_bytes")
    plt, sns = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    order = [s for s in ("full", "first", "last", "mean") if s in set(table["kv"])]
    bars_and_seeds(sns, left, table.assign(acc=_percent(table)), "kv", "acc", order=order)
    left.set(xlabel="KV-cache strategy", ylabel="accuracy (%)", ylim=(0, 100))
    sns.barplot(data=table.assign(kib=table["kv_bytes"] / 1024), x="kv", y="kib", order=order, ax=right)
    right.set(xlabel="KV-cache strategy", ylabel="cache memory (KiB)")
    fig.suptitle("KV-cache reuse at decode time" + seeds_note(table))
    return save(fig, out, "kvcache")


def plot_topology(table: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy per topology (sandwich, full-stack loop, injection and state-init variants)."""
    _need(table, "topology", "model", "accuracy")
    plt, sns = pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.8 + 0.4 * table["model"].nunique()))
    data = table.assign(acc=_percent(table))
    order = data.groupby("model")["acc"].mean().sort_values(ascending=False).index
    bars_and_seeds(sns, ax, data, "acc", "model", order=order)
    ax.set(xlabel="accuracy (%)", ylabel="topology", xlim=(0, 100), title="Recurrence topology" + seeds_note(table))
    return save(fig, out, "topology")


def plot_recipe(table: pd.DataFrame, out: Path) -> list[Path]:
    """Held-out accuracy and final training loss per recipe: every seed as a point, the mean as a bar."""
    _need(table, "recipe", "recipe", "accuracy", "train_loss")
    plt, sns = pyplot()
    data = table.assign(acc=_percent(table))
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
    long = table.melt(id_vars=[c for c in table.columns if c not in steps], value_vars=steps,
                      var_name="column", value_name="acc_at_step").dropna(subset=["acc_at_step"])
    return long.assign(step=long["column"].str.extract(STEP_COLUMN, expand=False).astype(int))


def plot_depth(table: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy vs the number of recurrent steps at evaluation, past the trained depth (dotted)."""
    _need(table, "depth", "loops")
    plt, sns = pyplot()
    long = _step_long(table)
    note = seeds_note(table).strip()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    mean_and_seeds(sns, ax, long.assign(acc=100 * long["acc_at_step"]), "step", "acc", hue="loops",
                    palette="viridis")
    for loops in sorted(table["loops"].unique()):
        ax.axvline(loops, color="grey", ls=":", lw=0.8)
    ax.set(xlabel="recurrent steps at evaluation T", ylabel="accuracy (%)", ylim=(0, 100),
           title="Depth extrapolation (dotted: trained loops)" + ("\n" + note if note else ""))
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
            matrix, per_seed.min(axis=0), per_seed.max(axis=0))
        sns.heatmap(matrix, annot=labels if len(matrix) <= 8 else False, fmt="", vmin=0, vmax=100, cmap="viridis",
                    ax=ax, xticklabels=ticks, yticklabels=ticks, annot_kws={"fontsize": 7 if many else 9},
                    cbar_kws={"label": "answers agreeing (%)"})
        title = f"{row.get('model', '')} trained {row['loops']} loops" + (
            f", {row['train.loss']} loss" if "train.loss" in row else "") + (
            f"\n(mean of {seed_count(group)} seeds; under it the seeds' range)" if seed_count(group) > 1 else "")
        ax.set(xlabel="recurrent step", ylabel="recurrent step", title=title)
    return save(fig, out, "faithfulness")


def plot_ouroboros(table: pd.DataFrame, out: Path) -> list[Path]:
    """C11: held-out loss vs recurrent depth per OUROBOROS variant (mean over seeds +- s.e., every
    seed a point); the full base and the truncated model (no loop) as horizontal references."""
    _need(table, "ouroboros", "variant", "loss_base", "loss_truncated")
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


PLOTTERS: dict[str, Callable[[pd.DataFrame, Path], list[Path]]] = {
    "capacity": plot_capacity,
    "mano": plot_mano,
    "multihop": plot_multihop,
    "reach": plot_reach,
    "scaling": plot_scaling,
    "exit": plot_exit,
    "kvcache": plot_kvcache,
    "topology": plot_topology,
    "recipe": plot_recipe,
    "depth": plot_depth,
    "faithfulness": plot_faithfulness,
    "ouroboros": plot_ouroboros,
}


def plot(kind: str, table: pd.DataFrame, out: str | Path) -> list[Path]:
    if kind not in PLOTTERS:
        raise SynthlabError(f"unknown plot kind '{kind}' (have {', '.join(PLOTTERS)}; a definition without `plot` gets the generic figure)")
    if table.empty:
        raise SynthlabError("results.csv has no rows to plot")
    return PLOTTERS[kind](table, Path(out))
