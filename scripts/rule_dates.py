"""Date the committed results' rules from the git history: when each rule was fixed, when the data began.

A sweep run by `synthlab sweep` records in its sweep.json when its first point started
(`data_began`) and the fingerprint of every `[[verdicts]]` / `[[laws]]` rule of its definition
with the time it was first seen (`rules`); `synthlab report` marks a verdict whose rule was not
fixed before the data as exploratory. Sweeps committed before that record existed get it from
git here, at commit granularity:

- data_began: the committer date of the first commit of the experiment's `results.csv` (followed
  through renames, and under any name its definition had before), whichever version of its grid
  it held: a rule written after results of its claim had been seen is not fixed before the data;
- rules: for each rule in the definition now, the committer date of the first commit whose
  `experiments/<name>.toml` (followed through renames) holds a rule with its fingerprint.

A rule first committed before its data's first commit may still have been written while the runs
were under way; one committed with the data or later was certainly fixed after it. The fields
are written into each sweep.json with `rules_from = "git history"`; run from the repository root:

    python scripts/rule_dates.py results/mano results/reach ...
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import tomllib

from synthlab import experiments
from synthlab.files import atomic_write_text
from synthlab.rules import LawRule, Rule, fingerprint, table_fingerprint


def _history(path: str) -> list[tuple[str, str, str]]:
    """(commit, committer date, the file's path then), oldest first, following renames."""
    out = subprocess.run(
        ["git", "log", "--follow", "--format=@%H %cI", "--name-only", "--", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found, head = [], None
    for line in out.splitlines():
        if line.startswith("@"):
            head = line[1:].split()
        elif line.strip() and head:
            found.append((head[0], head[1], line.strip()))
            head = None
    return found[::-1]


def _show(commit: str, path: str) -> str | None:
    done = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def data_began(results: Path, definition: Path) -> str | None:
    """The date of the claim's first committed results: of any version of this table, or of the
    table of a name the definition had before (a renamed experiment keeps its earlier data)."""
    names = {Path(path).stem for _, _, path in _history(str(definition))}
    tables = {str(results), *(str(results.parent.parent / name / "results.csv") for name in names)}
    dates = [history[0][1] for table in tables if (history := _history(table))]
    return min(dates, key=datetime.datetime.fromisoformat) if dates else None


def rules_fixed(definition: Path) -> dict[str, str]:
    """Fingerprint of each rule in the definition now -> the date it first appeared."""
    exp = experiments.load(definition)
    wanted = {fingerprint(r) for r in (*exp.verdicts, *exp.laws)}
    fixed: dict[str, str] = {}
    for commit, date, path in _history(str(definition)):
        try:
            raw = tomllib.loads(_show(commit, path) or "")
        except tomllib.TOMLDecodeError:
            continue
        for kind, key in ((Rule, "verdicts"), (LawRule, "laws")):
            for table in raw.get(key, []):
                found = table_fingerprint(kind, table)
                if found in wanted:
                    fixed.setdefault(found, date)
    return fixed


def main(dirs: list[str]) -> None:
    for folder in map(Path, dirs):
        info = json.loads((folder / "sweep.json").read_text())
        definition = Path("experiments") / f"{Path(info['definition']).stem}.toml"
        info.update(
            definition=str(definition),
            data_began=data_began(folder / "results.csv", definition),
            rules=rules_fixed(definition),
            rules_from="git history",
        )
        atomic_write_text(folder / "sweep.json", json.dumps(info, indent=1))
        print(
            f"{folder}: data began {info['data_began']}; rules fixed "
            + ", ".join(f"{k} {v[:10]}" for k, v in info["rules"].items())
        )


if __name__ == "__main__":
    main(sys.argv[1:])
