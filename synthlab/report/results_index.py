"""A results folder as an index and one page per experiment (`synthlab report --index`).

The index (OUT) holds a claims table with the scale each verdict was reached at (unique
parameters, training tokens per run and seeds, read from the results table), one line per
sweep linking to its page (`README.md` in the sweep's folder: `<experiment>/README.md`, or e.g.
`capacity/calibration/calib100/README.md` for a second sweep of one experiment), and the notes'
preamble. Each page holds that sweep's section: the same text `synthlab report` writes into one
file, its links rebased to its folder.
Provenance is by commit: where the folder is in a git checkout, each line names the commit that
last changed the experiment's results table.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pandas as pd

from synthlab.claims.rules import LawRule
from synthlab.files import atomic_write_text
from synthlab.plots.style import seed_count, short_count
from synthlab.sweeps.info import read_info
from synthlab.sweeps.results_table import read_results

LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def _span(values: pd.Series) -> str:
    values = pd.to_numeric(values, errors="coerce").dropna()
    if values.empty:
        return ""
    low, high = short_count(values.min()), short_count(values.max())
    return low if low == high else f"{low}-{high}"


def scale(table: pd.DataFrame) -> str:
    """ "28K-410K params, 1.3M tokens, 3 seeds": what the runs of a results table were."""
    parts = [
        f"{span} {what}"
        for column, what in (("params", "params"), ("tokens", "tokens"))
        if column in table and (span := _span(table[column]))
    ]
    n = seed_count(table)
    return ", ".join([*parts, f"{n} seed{'s' if n != 1 else ''}"])


def rebase_links(text: str, old: Path, new: Path) -> str:
    """Relative Markdown links written for a page in folder `old`, rewritten for one in `new`."""

    def fix(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"^[a-z]+:|^/|^#", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        moved = os.path.relpath(old / path, new).replace(os.sep, "/")
        return f"{match.group(1)}{moved}{'#' + anchor if anchor else ''}{match.group(3)}"

    return LINK.sub(fix, text)


def last_commit(path: Path) -> str:
    """ "39758b8, 2026-12-01": the commit that last changed `path` ("" outside a git checkout)."""
    try:
        done = subprocess.run(
            ["git", "log", "-1", "--format=%h, %ad", "--date=short", "--", path.name],
            cwd=path.parent,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def claims_lines(found: list, scales: dict[str, str], claim_key) -> list[str]:
    """The index's claims table: per rule its claim, how it was tested, the verdict and the scale
    it was reached at, and a link to the experiment's page."""
    lines = ["| claim | claim as tested | verdict | scale (preset) | experiment |", "|---|---|---|---|---|"]
    for folder, v in sorted(found, key=lambda f: claim_key(f[1].rule.claim)):
        if isinstance(v.rule, LawRule):  # its estimate is the fit's R^2
            shown = "" if math.isnan(v.estimate) else f" (R^2 {v.estimate:.3g})"
        else:
            shown = ("" if math.isnan(v.estimate) else f" {v.estimate:+.3g}") + (
                "" if math.isnan(v.low) else f" [{v.low:.3g}, {v.high:.3g}]"
            )
        why = f" ({v.why})" if v.outcome == "not tested" and v.why else ""  # out of regime, or what was not learned
        verdict = f"**{v.outcome}**{why}{shown}" + (f"; {v.fixed}" if v.fixed else "")
        verdict += "".join(f"<br>{extra}" for extra in (v.equivalence(), v.per_cell()) if extra)
        said = f"{v.rule.says}: {v.rule.condition()}".replace("|", "\\|")
        lines.append(
            f"| {v.rule.claim} | {said} | {verdict} | {scales.get(folder, '')} | [{folder}]({folder}/README.md) |"
        )
    return lines


def experiment_line(info: dict, table: pd.DataFrame, results_file: Path, folder: str) -> str:
    """One index line: the sweep's page, its claim and title, preset, runs and provenance."""
    commit = last_commit(results_file) if results_file.is_file() else ""
    where = f"; table of {commit}" if commit else ""
    return (
        f"- [{folder}]({folder}/README.md) ({info['claim']}): {info['title']}. Preset `{info['preset']}`, "
        f"{len(table)} rows, {scale(table)}{where}."
    )


def write_index(
    folders: dict[Path, str], sections: list[str], found: list, out: Path, title: str, preamble: str, claim_key
) -> Path:
    """`out` as the index, each sweep's section as `<folder>/README.md` beside it (folders: sweep
    directory -> its page folder relative to out's; sections written for a page in out's folder,
    their links rebased)."""
    root = out.parent
    scales, lines = {}, []
    for (directory, folder), section in zip(folders.items(), sections):
        info, table = read_info(directory), read_results(directory)
        scales[folder] = f"{scale(table)} (`{info['preset']}`)"
        lines.append(experiment_line(info, table, root / folder / "results.csv", folder))
        page = "# " + section.removeprefix("## ")
        page = rebase_links(page, root, root / folder)
        back = os.path.relpath(out, root / folder).replace(os.sep, "/")
        atomic_write_text(root / folder / "README.md", f"[All results]({back})\n\n{page.strip()}\n")
    parts = [
        f"# {title}",
        "## Claims\n\nEach verdict comes from the rule stated in the experiment's definition, decided by "
        "`synthlab report` over seeds (the estimate, its 95% interval and the rule are on the experiment's page); "
        "the scale is the runs' unique parameters, training tokens per run and seeds, at the preset named.\n\n"
        + "\n".join(claims_lines(found, scales, claim_key)),
        "## Experiments\n\n" + "\n".join(lines),
        f"## About these results\n\n{preamble.strip()}" if preamble.strip() else "",
    ]
    atomic_write_text(out, "\n\n".join(p for p in parts if p).strip() + "\n")
    return out
