"""The repository explains itself: no text points outside it, and none speaks of how the work was
organised (work periods, tickets, who did what); provenance is by date and commit."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".json", ".csv", ".sh", ".cfg", ".yml", ".yaml", ".log", ""}
SKIP_DIRS = {".git", ".venv", "data", "runs", "build", "dist", "__pycache__", ".pytest_cache", "tmp"}

# This file itself is not scanned: it spells out what it looks for.
OUTSIDE = re.compile("|".join([re.escape("../shared"), re.escape("MISSION.md")]))
WORK_PERIOD = re.compile(
    r"\bsessions?\b"  # a work period
    r"|\bissues? ?#?\d"  # a ticket by number
    r"|(?<![\w&#/])#\d{1,4}\b"  # a ticket or pull request by number
    r"|/runs/s\d+\b"  # a run folder named by a work period (a recorded path, e.g. run_dir)
    r"|\bhelpers?\b",  # who did the work
    re.IGNORECASE,
)
# The one unavoidable use: pytest's fixture scope is called "session".
ALLOWED = re.compile(r"""scope=["']session["']""")


def repo_text_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in SKIP_DIRS or any(p in SKIP_DIRS or p.endswith(".egg-info") for p in rel.parts):
            continue
        if path.is_file() and path.suffix in TEXT_SUFFIXES and path != Path(__file__).resolve():
            files.append(path)
    return files


def hits(pattern: re.Pattern) -> list[str]:
    found = []
    for path in repo_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(ALLOWED.sub("", line)):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return found


def test_the_scan_sees_the_repository():
    names = {p.relative_to(ROOT).as_posix() for p in repo_text_files()}
    assert {
        "README.md",
        "docs/claims.md",
        "experiments/mano.toml",
        "results/README.md",
        "synthlab/report/markdown.py",
    } <= names


def test_the_patterns_catch_what_they_are_for():
    for line in [
        "see ../shared/x",
        "the claims in MISSION.md",
        "Session 12 ran it",
        "sessions 8-11",
        "asked for in issue 15",
        "fixed in #42",
        "a helper did it",
        "/work/runs/s12/scaling-cpu/7b126053e9d8",
    ]:
        assert OUTSIDE.search(line) or WORK_PERIOD.search(line), line
    assert Path(__file__).resolve() not in repo_text_files()
    for line in ["color #1f77b4", "scope='session'", "issue a warning", "&#39;", "Python 3.10", "runs/scaling-cpu/s1"]:
        assert not (OUTSIDE.search(line) or WORK_PERIOD.search(ALLOWED.sub("", line))), line


def test_nothing_points_outside_the_repository():
    assert hits(OUTSIDE) == []


def test_no_text_speaks_of_how_the_work_was_organised():
    assert hits(WORK_PERIOD) == []


def test_every_relative_link_in_the_docs_resolves():
    """README, docs and results pages link only to files that exist (a claim or result two clicks
    from the README stays two clicks away)."""
    link = re.compile(r"\]\(([^)\s]+)\)")
    broken = []
    for path in repo_text_files():
        if path.suffix != ".md":
            continue
        for target in link.findall(path.read_text(encoding="utf-8")):
            if not re.match(r"^[a-z]+:|^#", target) and not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_experiment_page_is_two_clicks_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    index = (ROOT / "results" / "README.md").read_text()
    assert "](results/README.md)" in readme and "](docs/claims.md)" in readme
    pages = sorted(p.parent.name for p in (ROOT / "results").glob("*/README.md") if (p.parent / "sweep.json").is_file())
    assert pages and all(f"]({name}/README.md)" in index for name in pages)


def test_every_module_the_docs_name_exists():
    """A dotted `synthlab.x.y` in a page or definition names a module (and attribute) that imports:
    a moved module's old name in the docs is what a reader trips over first."""
    import importlib

    dotted = re.compile(r"(?<![\w/.-])(synthlab(?:_generators)?(?:\.[A-Za-z_]\w*)+)")

    def resolves(name: str) -> bool:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attribute in parts[cut:]:
                if not hasattr(found, attribute):
                    return False
                found = getattr(found, attribute)
            return True
        return False

    names = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in repo_text_files()
        if path.suffix in (".md", ".toml")
        for name in dotted.findall(path.read_text(encoding="utf-8"))
    }
    assert len(names) > 20
    assert sorted(f"{path}: {name}" for path, name in names if not resolves(name)) == []
