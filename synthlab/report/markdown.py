"""A Markdown report of one or more sweeps: per experiment its claim, commands, table and figures.

`write_report([DIR, ...], OUT.md)` draws each sweep's figures next to OUT.md (in
`<experiment>/`), writes a section per sweep and, with `copy_results`, copies the sweep's
results.csv there too (run_dir made relative, with the per-prompt outcome files its verdicts
read under `outcomes/<run>/`), so a folder like `results/` is self-contained
and committable without any run directory or checkpoint. Verdicts come from the rules written in
each experiment's definition (`[[verdicts]]`, synthlab.claims.verdicts), decided over seeds: a claims
table at the top and a line per rule in each section. A person's reading of the numbers (it
explains, it does not decide) can be supplied in a TOML notes file: `mano = "text..."`. A grid
run over several seeds is shown as mean +- standard error per cell, with n.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import tomllib

from synthlab import scaling
from synthlab.claims import law_verdicts, paired, prereg, screens, verdicts
from synthlab.claims.per_seed import CONTAINS, DISTINCT, REQUIREMENT
from synthlab.claims.rules import LawRule, fingerprint
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text
from synthlab.plots.generic import figures_of
from synthlab.report import results_index
from synthlab.sweeps import experiments
from synthlab.sweeps.info import read_info
from synthlab.sweeps.results_table import factor_column, read_results
from synthlab.sweeps.schema import ACC_STEP, AGREE, DESCRIPTORS

# Columns that identify a run, or repeat another column, or matter only for bookkeeping: in
# results.csv, left out of the report's tables.
_HIDDEN = {
    "point_id",
    "experiment",
    "preset",
    "run_dir",
    "outcomes",
    "data_dir",
    "loss",
    "train_flops",
    "params_nonemb",
    "model_reused",
    "eval_steps",
    "n_answers",
    "wall_s",
}
_MAX_STEP_COLUMNS = 8


def _cell(value) -> str:
    """Floats to 4 significant figures, NaN as blank, pipes escaped."""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|")


def markdown_table(table: pd.DataFrame) -> str:
    """A GitHub Markdown table of `table`'s rows."""
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def _repeats_a_factor(table: pd.DataFrame, column: str, factors: list[str]) -> bool:
    """A descriptor column (model, loops, L, ...) equal to a grid-factor column adds nothing."""
    values = table[column].astype(str).tolist()
    return any(table[f].astype(str).tolist() == values for f in factors if f != column)


def _shown_columns(table: pd.DataFrame, factors: list[str]) -> list[str]:
    """Factors and metrics; per-step accuracies capped (the figure shows them), agreement cells dropped."""
    columns = [c for c in table.columns if c not in _HIDDEN and not AGREE.regex.match(c)]
    columns = [c for c in columns if c in factors or c not in DESCRIPTORS or not _repeats_a_factor(table, c, factors)]
    steps = [c for c in columns if ACC_STEP.regex.match(c)]
    return [c for c in columns if c not in steps] + steps[:_MAX_STEP_COLUMNS]


def _grid(info: dict) -> tuple[list, list[str], dict[str, dict], tuple | None, tuple, screens.Choice | None]:
    """(the preset's grid points in order, its factor columns (seeds included), each point's
    factors, the definition's verdict rules (None for a screen, which decides none), its law rules,
    a screen's stated choice rule), from the sweep's definition."""
    try:
        experiment = experiments.load_recorded(info["definition"])
        if "seeds" in info:  # the seeds the sweep ran (`synthlab sweep --seeds`)
            experiment = experiments.with_seeds(experiment, info["preset"], info["seeds"])
        points = experiment.points(info["preset"])
        factors = {p.point_id: {factor_column(a): v for a, v in p.factors.items()} for p in points}
        axes = [factor_column(a) for a in points[0].factors] if points else []
        if experiment.is_screen(info["preset"]):  # chooses a setting; decides no claim
            return points, axes, factors, None, (), experiment.screen_choice(info["preset"])
        return points, axes, factors, experiment.verdicts, experiment.laws, None
    except (SynthlabError, KeyError):  # the definition moved or changed: just don't say
        return [], [], {}, (), (), None


def _over_seeds(table: pd.DataFrame, shown: list[str], factors: list[str]) -> pd.DataFrame | None:
    """The shown table as mean ± standard error over seeds per cell (with n), or None if every
    cell has one seed."""
    seeds = [c for c in verdicts.SEED_COLUMNS if c in table]
    keys = [
        c for c in shown if c not in seeds and (c in factors or c in DESCRIPTORS or table[c].dtype.kind not in "iuf")
    ]
    if not seeds or not keys or not table.groupby(keys, dropna=False, sort=False).size().gt(1).any():
        return None
    metrics = [c for c in shown if c not in seeds and c not in keys]
    means = verdicts.aggregate(table, keys, metrics)
    for m in metrics:
        means[m] = [
            f"{_cell(v)} ± {_cell(e)}" if not math.isnan(e) else _cell(v) for v, e in zip(means[m], means[f"{m}_se"])
        ]
    return means[[*keys, "n", *metrics]]


def law_verdict(rule: LawRule, sweep_dir: Path) -> verdicts.Verdict:
    """A `[[laws]]` rule decided from the fit saved in `sweep_dir` (and the digest of the numbers
    its table holds now, read with the saved fit's columns)."""
    path = sweep_dir / rule.fit
    if not path.is_file():
        return law_verdicts.decide_law(rule, None, None)
    try:
        saved = scaling.read_fit_json(path.read_text())
        digest = scaling.digest_now(saved, sweep_dir / rule.table)
    except (SynthlabError, KeyError, TypeError, ValueError) as err:
        return dataclasses.replace(law_verdicts.decide_law(rule, None, None), why=f"cannot read {rule.fit}: {err}")
    return law_verdicts.decide_law(rule, saved, digest)


def _verdict_lines(
    rules, laws, table: pd.DataFrame, factors: list[str], info: dict, sweep_dir: Path
) -> tuple[list[str], list[verdicts.Verdict]]:
    """The rules' verdicts as report lines; a rule scoped to other presets is listed as untested."""
    preset = info["preset"]
    found = verdicts.decide_all([r for r in rules if r.applies_to(preset)], table, factors)
    found += [law_verdict(r, sweep_dir) for r in laws if r.applies_to(preset)]
    found = preregistered(found, sweep_dir)
    rules = [*rules, *laws]
    lines = [
        f"- {v.rule.claim}, {v.rule.says}: **{v.summary()}**"
        f" ({v.rule.condition()}; {v.fixed})"
        + "".join(f"; {extra}" for extra in (v.equivalence(), v.per_cell(), v.per_replicate(), v.statistics) if extra)
        + (
            f"; seeds for a decisive interval at the observed effect and spread: {v.seeds_needed()}"
            if v.seeds_needed()
            else ""
        )
        for v in found
    ]
    lines += [SEEDS_NEEDED] if any(v.seeds_needed() for v in found) else []
    lines += [
        f"- {r.claim}, {r.says}: not tested by preset `{preset}` (the rule is for "
        f"{', '.join(f'`{p}`' for p in r.presets)})"
        for r in rules
        if not r.applies_to(preset)
    ]
    return (
        ["", "Verdicts (the definition's rules, over seeds):", "", *lines]
        if lines
        else ["", "Verdict: the definition states no rule."]
    ), found


def preregistered(found: list[verdicts.Verdict], sweep_dir: Path) -> list[verdicts.Verdict]:
    """The verdicts marked confirmatory or exploratory by `synthlab.claims.prereg` (the rule's and the
    preset's commits against the first run's recorded start)."""
    try:
        status, unknown = {fingerprint(s.rule): s for s in prereg.check(sweep_dir)}, "rule not in the definition"
    except (SynthlabError, KeyError, OSError) as err:  # no sweep.json, or its definition is gone
        status, unknown = {}, f"not checked: {err}"
    return [
        dataclasses.replace(v, fixed=s.summary(), exploratory=not s.confirmatory)
        if (s := status.get(fingerprint(v.rule)))
        else dataclasses.replace(v, fixed=f"exploratory ({unknown})", exploratory=True)
        for v in found
    ]


def regime_columns(table: pd.DataFrame, rules, points: list) -> pd.DataFrame:
    """The table with each preset setting a rule's regime names ("1 in ouroboros.depths") that it
    lacks as a column, read from each row's grid point (the setting's value, e.g. [2, 4, 8])."""
    named = {
        (form.match(c).group(2) if form is CONTAINS else form.match(c).group(1))
        for r in rules
        for c in getattr(r, "regime", ())
        for form in (REQUIREMENT, DISTINCT, CONTAINS)
        if form.match(c)
    }
    for name in sorted(n for n in named if n not in table and "." in n):
        section, key = name.split(".", 1)
        configs = {p.point_id: p.config.get(section, {}) for p in points}
        if any(key in c for c in configs.values()):
            table = table.assign(**{name: table["point_id"].map(lambda i: configs.get(i, {}).get(key))})
    return table


def _section(
    sweep_dir: Path, out_dir: Path, notes: dict[str, str], copy_results: bool, folder: str
) -> tuple[str, list[verdicts.Verdict]]:
    info = read_info(sweep_dir)
    table = paired.locate_runs(read_results(sweep_dir), sweep_dir)
    name = info["experiment"]
    figure_dir = out_dir / folder
    points, factors, point_factors, rules, laws, choice = _grid(info)
    order = [p.point_id for p in points]
    for factor in factors:  # the grid's value wherever a row is in it (an axis added after a run included)
        known = table["point_id"].map(lambda i: point_factors.get(i, {}).get(factor))
        table[factor] = known.where(known.notna(), table[factor]) if factor in table else known
    if order:  # rows in grid order (results.csv is in order of completion)
        rank = {p: i for i, p in enumerate(order)}
        table = table.sort_values("point_id", key=lambda ids: ids.map(lambda i: rank.get(i, len(rank))), kind="stable")
    in_grid = int(table["point_id"].isin(order).sum()) if order else len(table)
    earlier = f", plus {len(table) - in_grid} run(s) of an earlier version of its grid" if len(table) > in_grid else ""
    lines = [
        f"## {name} ({info['claim']}): {info['title']}",
        "",
        f"Preset `{info['preset']}`: {in_grid} of {len(order) or '?'} grid points finished{earlier}; "
        f"definition `{experiments.shown_path(info.get('definition', f'experiments/{name}.toml'))}`.",
    ]
    if info.get("notes"):
        lines += ["", " ".join(info["notes"].split())]
    if info.get("commands"):
        lines += ["", "Commands:", "", "```", *dict.fromkeys(info["commands"]), "```"]
    if rules is None:
        verdict_lines, found = (
            [
                "",
                f"Verdict: none: `{info['preset']}` is a screen (it chooses a setting on seeds that decide no claim).",
            ],
            [],
        )
        if choice is not None:
            chosen = screens.choose(table, choice, pd.DataFrame(point_factors.values()))
            verdict_lines += ["", *screens.choice_lines(chosen, choice)]
    else:
        judged = regime_columns(table, rules, points)
        verdict_lines, found = _verdict_lines(rules, laws, judged, factors, info, sweep_dir)
    lines += verdict_lines
    reading = notes.get(folder, notes.get(name) if Path(folder).name == name else None)
    if reading:
        lines += ["", f"Reading: {reading.strip()}"]
    try:
        figures = [p for p in figures_of(info, table, figure_dir, factors) if p.suffix == ".png"]
    except SynthlabError as err:  # say why instead of failing the whole report
        figures, lines = [], lines + ["", f"No figure: {err}."]
    lines += [""] + [f"![{p.stem}]({p.relative_to(out_dir).as_posix()})" for p in figures]
    if "wall_s" in table:
        lines += ["", compute_line(table)]
    shown = _shown_columns(table, factors)
    constant = [c for c in shown if c not in factors and len(table) > 1 and table[c].nunique(dropna=False) == 1]
    if constant:  # said once, above the table, instead of on every row
        lines += ["", "Same in every run: " + ", ".join(f"{c} = {_cell(table[c].iloc[0])}" for c in constant) + "."]
    shown = [c for c in shown if c not in constant]
    means = _over_seeds(table, shown, factors)
    if means is not None:
        lines += ["", "Mean ± standard error over seeds per cell (n seeds); every run is in results.csv."]
    lines += ["", markdown_table(table[shown] if means is None else means), ""]
    if copy_results:
        figure_dir.mkdir(parents=True, exist_ok=True)
        paired.copy_outcomes(table, figure_dir)  # the per-prompt outcomes the verdicts read, under outcomes/
        portable = table.assign(run_dir=[Path(p).name for p in table["run_dir"]]) if "run_dir" in table else table
        atomic_write_text(figure_dir / "results.csv", portable.to_csv(index=False))
        portable_info = {
            **info,
            "definition": experiments.shown_path(info.get("definition", f"experiments/{name}.toml")),
        }
        atomic_write_text(figure_dir / "sweep.json", json.dumps(portable_info, indent=1))
        for rule in laws:  # the saved fits the law rules read (their tables' numbers are copied unchanged)
            if (sweep_dir / rule.fit).is_file() and (sweep_dir / rule.fit).resolve() != (
                figure_dir / rule.fit
            ).resolve():
                shutil.copyfile(sweep_dir / rule.fit, figure_dir / rule.fit)
        lines.insert(3, f"Table: [`{folder}/results.csv`]({folder}/results.csv).")
    return "\n".join(lines), [(folder, v) for v in found]


def _index_folders(sweep_dirs: list[Path], root: Path) -> dict[Path, str]:
    """For an index in `root`: each sweep's page folder, the sweep folder itself where it lies in
    root (results/capacity/calibration/calib100 -> capacity/calibration/calib100, so two sweeps of
    one experiment have two pages), else as `_folders` names it."""
    named, root = _folders(sweep_dirs), root.resolve()
    folders = {}
    for d in map(Path, sweep_dirs):
        where = d.resolve()
        folders[d] = where.relative_to(root).as_posix() if where.is_relative_to(root) and where != root else named[d]
    shared = sorted({f for f in folders.values() if list(folders.values()).count(f) > 1})
    if shared:
        raise SynthlabError(f"--index: two sweeps would share the page {shared[0]}/README.md; name other folders")
    return folders


def _folders(sweep_dirs: list[Path]) -> dict[Path, str]:
    """The folder beside the report of each sweep's figures and copied table: its experiment's name,
    or, where several sweeps of one experiment are reported, the sweep folder's name (then a number)."""
    names = {}
    for d in map(Path, sweep_dirs):
        if not read_info(d):
            raise SynthlabError(f"{d} is not a sweep directory (no sweep.json)")
        names[d] = read_info(d)["experiment"]
    folders: dict[Path, str] = {}
    for i, (d, name) in enumerate(names.items()):
        folder = name if list(names.values()).count(name) == 1 else d.name
        folders[d] = folder if folder not in folders.values() else f"{name}-{i + 1}"
    return folders


def write_report(
    sweep_dirs: list[Path],
    out: Path,
    *,
    copy_results: bool = False,
    notes: Path | None = None,
    title: str = "synthlab results",
    index: bool = False,
) -> Path:
    """Write the Markdown report to `out` (figures beside it); returns its path.

    notes: a TOML file of readings (prose beside the computed verdicts), `experiment = "..."` (or
    `"folder/of/a/sweep" = "..."` for one of several sweeps of an experiment), and an optional
    `preamble = "..."`.
    index: write `out` as an index and each sweep's section as a page, `README.md` in the sweep's
    folder where it lies beside `out` (else `<experiment>/README.md`; synthlab.report.results_index).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        readings = tomllib.loads(Path(notes).read_text()) if notes else {}
    except tomllib.TOMLDecodeError as err:
        raise SynthlabError(f"cannot parse --notes {notes}: {err}") from None
    folders = _index_folders(sweep_dirs, out.parent) if index else _folders(sweep_dirs)
    sections = [_section(Path(d), out.parent, readings, copy_results, f) for d, f in folders.items()]
    found = [v for _, vs in sections for v in vs]
    if index:
        return results_index.write_index(
            folders,
            [s for s, _ in sections],
            found,
            out,
            title,
            readings.get("preamble", ""),
            _claim_key,
        )
    parts = [f"# {title}", readings.get("preamble", "").strip(), claims_table(found), *(s for s, _ in sections)]
    text = "\n\n".join(p for p in parts if p)
    atomic_write_text(out, text.strip() + "\n")
    return out


def compute_line(table: pd.DataFrame) -> str:
    """ "Compute: X min in all": the rows' wall times, plus the training time (train_s) of each model
    that every one of its rows found already trained (model_reused: trained by another sweep)."""
    total, extra, reused = table["wall_s"].sum(), 0.0, 0
    if {"model_reused", "run_dir", "train_s"} <= set(table.columns):
        for _, rows in table.groupby("run_dir"):
            if (rows["model_reused"] == 1).all():
                extra, reused = extra + float(rows["train_s"].iloc[0]), reused + 1
    shared = f", {extra / 60:.1f} min of it training {reused} model(s) reused from another sweep" if reused else ""
    return f"Compute: {(total + extra) / 60:.1f} min in all (sum of run wall times{shared})."


SEEDS_NEEDED = (
    '\n"Seeds for a decisive interval": the fewest seeds at which, if the per-seed spread and the effect '
    "are what these seeds show, the rule's one-sided test at its level (Bonferroni over cells) decides with "
    '80% power; "none on this test set": the noise the test prompts share bounds the interval from below '
    "at more than the effect, so only more test prompts decide it."
)

CLAIMS_HEADER = (
    "Each verdict comes from the rule stated in the experiment's definition (`[[verdicts]]`), decided by `synthlab "
    'report` over training seeds; "claim as tested" is the rule\'s one-line wording followed by what it computes, '
    "generated from its fields. The interval is the pair of one-sided bounds at the rule's level (95%: a 90% two-sided "
    "interval); for an accuracy or agreement it is taken on the logit scale of the statistic's range, so it stays "
    "inside it, and it adds the test set's binomial noise, which every seed shares, to the seeds' spread "
    "(`synthlab.claims.intervals`); where the compared rows have per-prompt outcomes that noise is measured from them "
    "instead, by a seed x prompt bootstrap that pairs two read-outs of one model prompt by prompt, and each "
    "verdict line says which (`synthlab.claims.paired`). A rule that speaks of each cell (`each`: each L, diameter, fraction, model) is decided "
    "per cell: reproduced only if every cell is, contradicted if any is; the line under the verdict gives each cell "
    "and the cell that decided it. Multiplicity is controlled within a rule: Holm's adjustment over its cells keeps "
    "the chance of any false per-cell statement at 5%; the rows are separate claims, each at its own level, not "
    "corrected against each other (with 30 rows, one or two false calls are to be expected if no claim held). With "
    "fewer seeds than the rule needs it says so instead of guessing, and where a compared model has not learned what "
    'the claim builds on (the rule\'s `requires`) it says "not tested" and shows the estimate anyway; a table outside '
    'the conditions under which the claim applies (its `regime`) reads "not tested: out of regime" and names the '
    "preset that reaches it. A rule follows its claim's direction (one-sided bounds; an equivalence band only where "
    'the claim says "the same"). "preregistration" (`synthlab prereg check`): confirmatory only if the rule\'s exact '
    "fields and the preset's every field were committed (git) before the first run started as the sweep recorded it; "
    "otherwise, or where no run recorded its start, exploratory. A law (`[[laws]]`) is decided from its saved fit: the estimate is its R^2, n the "
    'rows fitted, "contradicted" first where a lack-of-fit test over runs says the law\'s form departs from the '
    'data by more than seed noise, and "not identified" means the data cannot decide it.'
)


def claims_table(found: list) -> str:
    """The claims table: one row per (experiment, rule) with its verdict, estimate, interval and n."""
    if not found:
        return ""

    def verdict(v) -> str:
        text = v.outcome + (f" ({v.why})" if v.why else "")
        text += " (exploratory)" if v.exploratory else ""
        return text + "".join(f"<br>{extra}" for extra in (v.equivalence(), v.per_cell()) if extra)

    rows = [
        (
            v.rule.claim,
            name,
            f"{v.rule.says}: {v.rule.condition()}",
            verdict(v),
            "" if math.isnan(v.estimate) else f"{v.estimate:+.4g}",
            "" if math.isnan(v.low) else f"[{v.low:.4g}, {v.high:.4g}]",
            v.n,
            v.fixed,
        )
        for name, v in sorted(found, key=lambda f: _claim_key(f[1].rule.claim))
    ]
    table = pd.DataFrame(
        rows,
        columns=["claim", "experiment", "claim as tested", "verdict", "estimate", "interval", "n", "preregistration"],
    )
    return "## Claims\n\n" + CLAIMS_HEADER + "\n\n" + markdown_table(table)


def _claim_key(claim: str) -> tuple:
    digits = claim.lstrip("C")
    return (0, int(digits)) if digits.isdigit() else (1, claim)


def summary_lines(sweep_dir: Path) -> list[str]:
    """One line per finished point of a sweep with its headline numbers (what `synthlab sweep`
    prints when it finishes): bits, bits/param and share of the data's bits for capacity sweeps,
    accuracy otherwise."""
    table = read_results(sweep_dir)
    label = table["model"].astype(str) if "model" in table else table["point_id"]
    lines = []
    for name, (_, row) in zip(label, table.iterrows()):
        if "bits_per_param" in table:
            lines.append(
                f"{name} (loops {row.get('loops', '?')}): {row['bits']:,.0f} bits, "
                f"{row['bits_per_param']:.3f} bits/param, {100 * row['fraction_of_max']:.1f}% of the data's "
                f"{row['max_bits']:,.0f} bits"
            )
        elif "accuracy" in table:
            lines.append(f"{name} (loops {row.get('loops', '?')}): accuracy {100 * row['accuracy']:.1f}%")
    return lines
