"""A sweep directory's record, DIR/sweep.json: the experiment and preset it holds, the stores outside
DIR it uses (the dataset cache and the trained-model store: a rerun without --cache / --runs finds
them), every command that ran in it, and its rules' fingerprints (`synthlab.claims.rules.record_rules`)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from synthlab.claims.rules import record_rules
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text, file_lock, warn
from synthlab.sweeps.experiments import Experiment, recorded_path
from synthlab.sweeps.results_table import RESULTS

STORES = {"cache": ("--cache", "datasets"), "runs": ("--runs", "runs")}  # key: (option, default under OUT)


def read_info(out: Path) -> dict[str, Any]:
    """DIR/sweep.json as a dict ({} where there is none yet); a damaged one is one error line."""
    path = Path(out) / "sweep.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise SynthlabError(f"{path} is not valid JSON ({err}); repair or remove it") from None


def store(out: Path, key: str, given: Path | None) -> Path:
    """The sweep's dataset cache (key "cache") or trained-model store ("runs"): the one given, else
    the one a command in `out` was given before (sweep.json keeps it, so a rerun without --cache /
    --runs finds its models where they are instead of training them again), else OUT/datasets or
    OUT/runs."""
    option, default = STORES[key]
    if given is not None:
        return Path(given)
    recorded = read_info(out).get("stores", {}).get(key)
    if recorded:
        warn(f"{option} {recorded}: the store this sweep used before (sweep.json)")
        return Path(recorded)
    return Path(out) / default


def _command_line() -> str | None:
    """This process's command as a user would type it (quoted where an argument needs it), when it is synthlab's command line (the
    entry point or `python -m synthlab`), else None (a library caller such as a test)."""
    prog = Path(sys.argv[0])
    if prog.name == "synthlab" or (prog.name == "__main__.py" and prog.parent.name == "synthlab"):
        return shlex.join(["synthlab", *sys.argv[1:]])
    return None


def record_invocation(out: Path, experiment: Experiment, preset: str, cache_dir: Path, runs_dir: Path) -> None:
    """DIR/sweep.json: what this directory holds, the stores it uses outside it, and every command
    that ran in it (for reports); its rules' fingerprints (`rules.record_rules`)."""
    path = out / "sweep.json"
    with file_lock(out / "sweep.json.lock"):  # two sweeps may share a directory
        info = read_info(out) or {"commands": []}
        if info.get("experiment", experiment.name) != experiment.name or info.get("preset", preset) != preset:
            raise SynthlabError(
                f"--out {out} holds sweep {info['experiment']}/{info['preset']}, not "
                f"{experiment.name}/{preset}; choose another --out"
            )
        command = _command_line()
        info.update(
            experiment=experiment.name,
            preset=preset,
            claim=experiment.claim,
            title=experiment.title,
            plot=experiment.plot,
            definition=recorded_path(experiment.source),
            notes=experiment.notes.strip(),
        )
        outside = {
            key: str(folder.resolve())
            for key, folder in (("cache", cache_dir), ("runs", runs_dir))
            if folder.resolve() != (out / STORES[key][1]).resolve()
        }
        if outside or "stores" in info:
            info["stores"] = outside
        if command:
            info["commands"].append(command)
        record_rules(info, experiment, preset, starting=not (out / RESULTS).is_file())  # no results: all to run
        atomic_write_text(path, json.dumps(info, indent=1))
