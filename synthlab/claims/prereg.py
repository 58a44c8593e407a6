"""One preregistration policy: a verdict is confirmatory only if its rule and its preset were
committed before the first run of its data started; otherwise exploratory.

- The rule: the first commit whose experiment definition (followed through renames) holds a rule
  with the rule's fingerprint (`rules.fingerprint`: every field but its wording), from `git log`.
- The preset: the first commit whose definition expands the preset to the same grid as now (every
  resolved field of every point, seeds and screened choices included: `Point.config`); seeds
  given on the command line instead (`synthlab sweep --seeds`) were not committed.
- The first run's start: as the sweep recorded it in its own sweep.json when its first point
  started (`data_began`, written by `synthlab sweep`; an earlier committed version of that file is
  read where a later one lost it). Where no run recorded its start, the latest it can have been is
  said instead (the first commit of the results table, less the longest run's wall time) and the
  row is exploratory: a start that was not recorded cannot show that the rule came first.

`check(results_dir)` gives a `Status` per rule; `synthlab prereg check DIR` prints them and
`synthlab report` marks its rows with them.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import json
import subprocess
from pathlib import Path

import pandas as pd
import tomllib

from synthlab.claims.rules import LawRule, Rule, fingerprint, table_fingerprint
from synthlab.serialize import content_hash
from synthlab.sweeps import experiments

when = datetime.datetime.fromisoformat


@dataclasses.dataclass(frozen=True)
class Commit:
    sha: str
    date: str  # the committer date, ISO 8601

    def __str__(self) -> str:
        return f"{self.sha[:7]} {self.date[:16].replace('T', ' ')}"


@dataclasses.dataclass(frozen=True)
class Status:
    rule: Rule | LawRule
    rule_commit: Commit | None  # None: the rule's text was never committed
    preset_commit: Commit | None
    start: str | None  # the first run's start (ISO 8601), or the latest it can have been
    start_recorded: bool  # the start is the sweep's own record, not a bound
    start_source: str  # where the start comes from, in words
    confirmatory: bool
    why: str  # what made it exploratory ("" when confirmatory)

    @property
    def status(self) -> str:
        return "confirmatory" if self.confirmatory else "exploratory"

    def summary(self) -> str:
        """ "confirmatory: first run 2026-12-02 21:19; rule 2e408f1 2026-12-02 01:40; preset 6c51abd
        2026-12-02 21:19", "exploratory: first run 2026-11-30 19:57 at the latest (not recorded);
        rule 4e42516 2026-12-03 10:39, later; ..." (the report's column)."""
        start = "not recorded" if self.start is None else self.start[:16].replace("T", " ")
        start += "" if self.start_recorded or self.start is None else " at the latest (not recorded)"

        def commit(c: Commit | None) -> str:
            late = c is not None and self.start is not None and when(c.date) >= when(self.start)
            return "not committed" if c is None else f"{c}, later" if late else str(c)

        said = ("after the first run started", "not committed", "not recorded")  # shown by the facts
        other = [w for w in self.why.split("; ") if w and not any(x in w for x in said)]
        facts = f"first run {start}; rule {commit(self.rule_commit)}; preset {commit(self.preset_commit)}"
        return f"{self.status}: {facts}" + "".join(f"; {w}" for w in other)


def _git(root: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def repository(path: Path) -> Path | None:
    """The git work tree holding `path` (None outside one, or without git)."""
    folder = path if path.is_dir() else path.parent
    top = _git(folder, "rev-parse", "--show-toplevel") if folder.is_dir() else None
    return Path(top.strip()) if top else None


def history(root: Path, path: Path) -> list[tuple[Commit, str]]:
    """(commit, the file's path then) for each commit of `path`, oldest first, following renames;
    merges included (`-m`: a merge's resolution may be the first commit of a rule's text)."""
    relative = path.resolve().relative_to(root.resolve()).as_posix()
    out = _git(root, "log", "--follow", "-m", "--format=@%H %cI", "--name-only", "--", relative) or ""
    found, head = {}, None
    for line in out.splitlines():
        if line.startswith("@"):
            head = Commit(*line[1:].split())
        elif line.strip() and head:
            found.setdefault(head, line.strip())  # a merge is listed once per parent
            head = None
    return list(found.items())[::-1]


@functools.lru_cache(maxsize=4096)  # a commit's file never changes; a report reads each many times
def _show(root: Path, commit: Commit, path: str) -> str | None:
    return _git(root, "show", f"{commit.sha}:{path}")


def rule_commits(root: Path, definition: Path) -> dict[str, Commit]:
    """Every rule fingerprint the definition ever held -> the first commit that held it."""
    first: dict[str, Commit] = {}
    for commit, path in history(root, definition):
        try:
            raw = tomllib.loads(_show(root, commit, path) or "")
        except tomllib.TOMLDecodeError:
            continue
        for kind, key in ((Rule, "verdicts"), (LawRule, "laws")):
            for table in raw.get(key, []) if isinstance(raw.get(key), list) else []:
                found = table_fingerprint(kind, table) if isinstance(table, dict) else None
                if found and (found not in first or when(commit.date) < when(first[found].date)):
                    first[found] = commit  # log order is not date order across merged branches
    return first


@functools.lru_cache(maxsize=4096)
def _grid_hash(text: str, preset: str) -> str | None:
    """The hash of a definition's expanded preset (None where this code cannot read that version);
    its rules are left out (they are dated apart, and an old rule may not parse today)."""
    try:
        raw = {k: v for k, v in tomllib.loads(text).items() if k not in ("verdicts", "laws")}
        return content_hash([p.config for p in experiments.parse(raw).points(preset)])
    except Exception:  # noqa: BLE001 - an old version in a format this code no longer reads
        return None


def preset_commit(root: Path, definition: Path, preset: str) -> Commit | None:
    """The first commit whose definition expands `preset` to the grid it has now (branches merged
    later count from their own commit, as the rules do)."""
    now = _grid_hash(definition.read_text(), preset)
    same = [c for c, path in history(root, definition) if now and _grid_hash(_show(root, c, path) or "", preset) == now]
    return min(same, key=lambda c: when(c.date), default=None)


def run_start(results_dir: Path, root: Path | None) -> tuple[str | None, bool, str]:
    """(the first run's start, whether it is recorded, where it comes from): the sweep's own
    record in sweep.json (or in an earlier committed version of it), else a bound from git."""
    info = json.loads((results_dir / "sweep.json").read_text())
    if info.get("data_began") and not info.get("rules_from"):
        return info["data_began"], True, "recorded by the sweep when its first point started"
    if root is None:
        return None, False, "not recorded, and the results are not in a git repository"
    for commit, path in history(root, results_dir / "sweep.json"):
        try:
            earlier = json.loads(_show(root, commit, path) or "{}")
        except ValueError:
            continue
        if earlier.get("data_began") and not earlier.get("rules_from"):
            return earlier["data_began"], True, f"recorded by the sweep (sweep.json at {commit.sha[:7]})"
    tables = history(root, results_dir / "results.csv")
    if not tables:
        return None, False, "not recorded, and results.csv was never committed"
    first, path = tables[0]
    longest = 0.0
    try:
        rows = pd.read_csv(io.StringIO(_show(root, first, path) or ""))
        longest = float(pd.to_numeric(rows.get("wall_s", pd.Series(dtype=float))).max() or 0.0)
    except ValueError:
        pass
    latest = (when(first.date) - datetime.timedelta(seconds=longest if longest == longest else 0.0)).isoformat()
    return (
        latest,
        False,
        (
            f"not recorded by its runs; at the latest {latest[:16].replace('T', ' ')} (results.csv first "
            f"committed at {first}, less the longest run's wall time)"
        ),
    )


def check(results_dir: Path) -> list[Status]:
    """Each rule of the results directory's definition (those that apply to its preset) with the
    commits that fixed it and its preset, the first run's start, and its status."""
    results_dir = Path(results_dir)
    info = json.loads((results_dir / "sweep.json").read_text())
    experiment = experiments.load_recorded(info["definition"])
    definition = Path(experiment.source)
    root = repository(definition)
    commits = rule_commits(root, definition) if root else {}
    preset = preset_commit(root, definition, info["preset"]) if root else None
    start, recorded, source = run_start(results_dir, repository(results_dir))
    out = []
    for rule in (*experiment.verdicts, *experiment.laws):
        if not rule.applies_to(info["preset"]) or experiment.is_screen(info["preset"]):
            continue
        commit = commits.get(fingerprint(rule))
        late = [
            f"{what} {'not committed' if c is None else f'committed {c}, after the first run started'}"
            for what, c in (("rule", commit), ("preset", preset))
            if c is None or (start is not None and when(c.date) >= when(start))
        ]
        if "seeds" in info and info["seeds"] != experiment.presets[info["preset"]].get("seeds", 1):
            late.append(f"seeds {info['seeds']} given by `synthlab sweep --seeds`, not in the committed preset")
        if not recorded and not late:
            late = ["the first run's start was not recorded"]
        why = "; ".join(late)
        out.append(Status(rule, commit, preset, start, recorded, source, not why, why))
    return out


def lines(statuses: list[Status]) -> list[str]:
    """`synthlab prereg check`'s output: one line per rule, and where the start comes from."""
    out = [f"{s.rule.claim} {fingerprint(s.rule)} {s.summary()}; {s.rule.says}" for s in statuses]
    return out + ([f"first run: {statuses[0].start_source}"] if statuses else [])
