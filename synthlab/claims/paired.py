"""Paired statistics from per-prompt outcomes, and seeds that learned or stayed stuck.

Every seed of a rule is scored on the same test prompts, and two read-outs of one model (exit
rules, KV caches, recurrent steps: C6, C7, C9, C10) answer those prompts with one set of weights.
Their difference is then mostly zero prompt by prompt; treating the two accuracies as independent
binomials (`synthlab.claims.intervals`' bound p_a (1 - p_a) / N + p_b (1 - p_b) / N) counts as noise the
many prompts both read-outs answer alike, and with it a simulated difference of +2 points is
never detected. The evaluator stores each prompt's outcome per read-out beside its eval JSON
(`synthlab.evaluation.evaluate.write_outcomes`); from those, a rule's statistic is formed prompt by prompt
(`rule_data.seed_values` calls `prompt_vector` for each row), and its interval is a seed x prompt
bootstrap (`estimate`), the two levels of the design treated each as it is:

- prompts: the test set is one sample of prompts, shared by every seed (the design is crossed,
  not nested), so its noise is an offset common to all seeds that their spread does not show. It
  is measured by resampling the prompts, the same draw for every seed, BOOTSTRAP times with a
  seeded generator: the variance of the statistic's mean over the draws. For paired read-outs this
  is the variance of the per-prompt difference, not the sum of the two binomials. Those draws
  also carry the seed x prompt residual, which the seeds' spread already holds; its two-way
  estimate is taken out once (Owen's correction of the crossed, "pigeonhole", bootstrap).
- seeds: with three seeds a resample of seeds has ten distinct outcomes, too few for bootstrap
  percentiles, and its variance is the plug-in s^2 (n - 1) / n^2 in closed form; so the seed level
  enters as that variance corrected to s^2 / n, with Student-t quantiles on n - 1 degrees of
  freedom, on the logit scale of the statistic's range (`intervals.SeedEstimate`, which then
  decides, adjusts (Holm) and sizes seeds exactly as for any other rule).

Why not a mixed model (a logistic GLMM with crossed seed and prompt effects): at three seeds its
seed variance sits on the zero boundary in many fits and its Wald intervals then ignore it
(anti-conservative); it assumes a logit-normal form that an interpolated exit curve, an agreement
indicator or a difference of read-outs does not have; and it needs a fitting library the lab does
not carry. The bootstrap needs the outcomes alone, and `tests/test_paired.py` checks its coverage
by simulation under four truths (unimodal, arm-by-prompt interaction, paired read-outs, bimodal).

Bimodal seeds: a one-layer model often escapes a plateau on some seeds and stays on it on others.
Per arm, a seed "learned" when its accuracy (the model's at its trained depth where the table has
it) is at least the rule's `learned_at` (0.5 unless the rule says otherwise; halfway from chance to
1, so a yes/no task's rule sets 0.75), and the arm is bimodal when it has seeds on both sides with a gap of at
least GAP between them. The mean over seeds then estimates a mixture whose weight few seeds
measure badly: when every seed falls in one mode, nothing in the data shows the other. A bimodal
cell is decided only with at least `seeds_for_modes` seeds (the fewest with a chance below 1 -
level that all fall in one mode at the observed learned share); with fewer it reads
"bimodal: n seeds too few" and names the seeds asked for (that, or the power statement's, if more).
"""

from __future__ import annotations

import functools
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from synthlab.claims.intervals import SeedEstimate

BOOTSTRAP = 2000  # prompt resamples per cell (the Monte Carlo error of the variance: about 3%)
GAP = 0.3  # ... and an arm is bimodal only when its learned and stuck seeds lie this far apart (a
# plateau left or not: near chance against near the ceiling, not the spread of partly learned seeds)
AGREE = re.compile(r"^agree_(\d+)_(\d+)$")
STEP = re.compile(r"^acc_step_(\d+)$")


def locate_runs(table, folder: Path):
    """The table with each row's run_dir where its outcomes file is: as recorded, under
    folder/runs/<name> (a moved sweep) or folder/outcomes/<name> (a report's copy, `copy_outcomes`)."""
    if "outcomes" not in table or "run_dir" not in table:
        return table

    def where(run_dir, outcomes):
        if isinstance(run_dir, str) and isinstance(outcomes, str) and outcomes:
            name = Path(run_dir).name
            for candidate in (Path(run_dir), folder / "runs" / name, folder / "outcomes" / name):
                if (candidate / outcomes).is_file():
                    return str(candidate)
        return run_dir

    return table.assign(run_dir=[where(r, o) for r, o in zip(table["run_dir"], table["outcomes"])])


def copy_outcomes(table, to: Path) -> None:
    """Each row's outcomes file (run_dir as `locate_runs` left it) to to/outcomes/<run name>/<path>,
    so that a page folder with its results.csv decides its rules paired as the sweep did."""
    if "outcomes" not in table or "run_dir" not in table:
        return
    for run_dir, outcomes in zip(table["run_dir"], table["outcomes"]):
        if isinstance(run_dir, str) and isinstance(outcomes, str) and (Path(run_dir) / outcomes).is_file():
            target = to / "outcomes" / Path(run_dir).name / outcomes
            if target.resolve() != (Path(run_dir) / outcomes).resolve():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(run_dir) / outcomes, target)


@functools.lru_cache(maxsize=256)
def _read(path: str) -> dict[str, np.ndarray] | None:
    """An outcomes CSV as {column: values} (None when absent)."""
    if not Path(path).is_file():
        return None
    table = pd.read_csv(path, keep_default_na=False)
    return {c: table[c].to_numpy() for c in table.columns}


def _last_step(outcomes: dict) -> np.ndarray:
    return outcomes[f"step_{max(int(c[5:]) for c in outcomes if c.startswith('step_'))}"]


def _column(outcomes: dict, column: str, row) -> np.ndarray | None:
    """One results column per prompt (an outcome 1/0, or a per-sequence loss whose mean is the
    row's), or None where the outcomes do not give it."""
    if column == "accuracy":  # as results.eval_metrics fills it: the KV or exit read-out if set
        named = next((outcomes[k] for k in ("kv", "exit") if k in outcomes), None)
        return named if named is not None else _last_step(outcomes)
    if column in ("accuracy_all_steps", "accuracy_teacher_forced"):
        return _last_step(outcomes)
    if column == "accuracy_at_trained_depth":
        return outcomes.get(f"step_{int(float(row['groups_at_step']))}")
    if m := STEP.match(column):
        return outcomes.get(f"step_{m[1]}")
    if m := AGREE.match(column):
        i, j = outcomes.get(f"answer_{m[1]}"), outcomes.get(f"answer_{m[2]}")
        return None if i is None or j is None else (i == j)
    return outcomes.get(column)  # a column the file holds under the results column's own name (C11's losses)


def prompt_vector(row, metric: str) -> np.ndarray | None:
    """A results row's metric ("col" or "col1 - col2") per test prompt, from the outcomes file the
    row names (column `outcomes`, relative to `run_dir`); None without one."""
    where = row.get("outcomes") if hasattr(row, "get") else None
    if not isinstance(where, str) or not where or not isinstance(row.get("run_dir"), str):
        return None
    outcomes = _read(str(Path(row["run_dir"]) / where))
    if outcomes is None:
        return None
    parts = [_column(outcomes, c, row) for c in metric.split(" - ")]
    if any(p is None for p in parts):
        return None
    parts = [np.asarray(p, float) for p in parts]
    return parts[0] - parts[1] if len(parts) == 2 else parts[0]


def mean_vector(rows, metric: str) -> np.ndarray | None:
    """The mean of the rows' per-prompt vectors (None unless every row has one, of one length)."""
    return mean_of([prompt_vector(row, metric) for _, row in rows.iterrows()])


def curve_vectors(rows, x: str, metric: str, xs: np.ndarray) -> np.ndarray | None:
    """Rows read as a curve along column x, per prompt, at xs (strictly inside its range): the
    linear interpolation `np.interp` makes of the mean, made prompt by prompt (it is linear)."""
    by_x = [(float(value), mean_vector(group, metric)) for value, group in rows.groupby(pd.to_numeric(rows[x]))]
    if any(v is None for _, v in by_x) or len({len(v) for _, v in by_x}) != 1:
        return None
    grid, curve = np.array([g for g, _ in by_x]), np.stack([v for _, v in by_x])
    k = np.clip(np.searchsorted(grid, xs), 1, len(grid) - 1)
    w = ((xs - grid[k - 1]) / (grid[k] - grid[k - 1]))[:, None]
    return (1 - w) * curve[k - 1] + w * curve[k]


def prompt_variance(per_prompt, rng: np.random.Generator, replicates: int = BOOTSTRAP) -> np.ndarray:
    """per_prompt (..., n seeds, N prompts): the variance of the mean over seeds and prompts when
    the shared prompts are resampled (one draw for all seeds), over `replicates` draws."""
    per_prompt = np.asarray(per_prompt, float)
    n_seeds, n_prompts = per_prompt.shape[-2:]
    counts = rng.multinomial(n_prompts, np.full(n_prompts, 1.0 / n_prompts), size=replicates)  # (B, N)
    means = per_prompt.mean(-2) @ counts.T.astype(float) / n_prompts  # (..., B)
    # The resampled prompt means carry the seed x prompt residual too, which the seeds' spread
    # already holds: its two-way estimate is taken out once (Owen's correction of the crossed
    # bootstrap), leaving the prompts' own share, never below zero.
    resid = (per_prompt - per_prompt.mean(-1, keepdims=True) - per_prompt.mean(-2, keepdims=True)) + per_prompt.mean(
        (-2, -1), keepdims=True
    )
    residual = (resid**2).sum((-2, -1)) / max((n_seeds - 1) * (n_prompts - 1), 1)
    # Never below one discordant prompt's worth, (1 - 1/N) / N^2: read-outs that agreed on every
    # prompt seen are not shown to agree on every prompt (the half-prompt shrinkage's counterpart)
    floor = (n_prompts - 1) / n_prompts**3
    return np.maximum(means.var(-1, ddof=1) - residual / (n_seeds * n_prompts), floor)


def estimate(per_prompt, bounds, rng: np.random.Generator | None = None) -> SeedEstimate:
    """The seed x prompt estimate of per_prompt (..., n seeds, N prompts): per-seed means, their
    spread, and the shared prompts' variance from `prompt_variance` (generator seeded 0 unless given,
    so a report is the same every time it is made)."""
    per_prompt = np.asarray(per_prompt, float)
    rng = rng if rng is not None else np.random.default_rng(0)
    return SeedEstimate.of(per_prompt.mean(-1), prompt_variance(per_prompt, rng), bounds, per_prompt.shape[-1])


def modes(accuracy, learned_at: float = 0.5):
    """(learned, stuck, bimodal) of per-seed accuracies (..., n seeds; NaN left out), each of the
    leading shape: seeds at or above `learned_at` (a rule's, halfway from chance to 1), below it,
    and whether both lie GAP or more apart."""
    acc = np.asarray(accuracy, float)
    up, down = acc >= learned_at, acc < learned_at
    gap = np.where(up, acc, np.inf).min(-1) - np.where(down, acc, -np.inf).max(-1)
    learned, stuck = up.sum(-1), down.sum(-1)
    return learned, stuck, (learned > 0) & (stuck > 0) & (gap >= GAP)


def seeds_for_modes(learned: int, n: int, level: float, most: int = 1000) -> int:
    """The fewest seeds with a chance below 1 - level that every seed falls in one mode, at the
    observed learned share learned / n."""
    p = learned / n
    return next((m for m in range(2, most + 1) if p**m + (1 - p) ** m < 1 - level), most)


def modes_note(
    arms: list[tuple[float, ...]], labels: tuple[str, ...], level: float, learned_at: float = 0.5
) -> tuple[str, int]:
    """ "learned (accuracy >= 0.5) / stuck seeds: q 2/1 (bimodal), static 3/0" and the seeds a
    bimodal arm asks for (0 when no arm is bimodal), from each seed's per-arm accuracies."""
    parts, asked = [], 0
    for label, column in zip(labels, zip(*arms)):
        learned, stuck, bimodal = (int(x) for x in modes(column, learned_at))
        if learned + stuck == 0:
            continue
        parts.append(f"{label} {learned}/{stuck}".strip() + (" (bimodal)" if bimodal else ""))
        if bimodal:
            asked = max(asked, seeds_for_modes(learned, learned + stuck, level))
    return (f"learned (accuracy >= {learned_at:g}) / stuck seeds: " + ", ".join(parts) if parts else ""), asked


def mean_of(vectors: list) -> np.ndarray | None:
    """The mean of per-prompt vectors (matched cells of one seed), None unless all are there alike."""
    if not vectors or any(v is None for v in vectors) or len({len(v) for v in vectors}) != 1:
        return None
    return np.mean(vectors, axis=0)


def shared_variance(values) -> tuple[float, int, str] | None:
    """For a cell's per-seed values (`rule_data.SeedValue`): (the shared prompts' variance of the
    mean, measured from the per-prompt outcomes, the prompts, how the interval was made); None
    where a seed lacks per-prompt outcomes (a bounded rule then keeps the binomial bound and says
    so, `UNPAIRED`; an unbounded one, a loss, has no binomial bound and counts the seeds alone,
    `SEEDS_ONLY`).
    A loss read per held-out sequence (C11) is paired sequence by sequence as an outcome is."""
    vectors = [v.per_prompt for v in values]
    if any(v is None for v in vectors) or len({len(v) for v in vectors}) != 1:
        return None
    per_prompt = np.stack(vectors)
    variance = float(prompt_variance(per_prompt, np.random.default_rng(0)))
    return variance, per_prompt.shape[1], f"paired: seed x prompt bootstrap over {per_prompt.shape[1]} shared prompts"


UNPAIRED = "unpaired (no per-prompt outcomes)"
SEEDS_ONLY = "seeds only (no per-prompt outcomes: the noise of the test set every seed shares is not counted)"


def too_few_note(n: int, asked: int, needed: int | None) -> str:
    """ "bimodal: 3 seeds too few (8 asked)": the seeds the modes ask for, or the power
    statement's where it asks more."""
    return f"bimodal: {n} seeds too few ({max(asked, needed or 0)} asked)"
