"""A cheap point runner for the sweep driver's tests: deterministic 'training' that checkpoints.

Its metrics depend only on the config, whether or not training was interrupted and resumed, so
an interrupted-and-resumed sweep must produce exactly the table of an uninterrupted one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from synthlab.files import atomic_write_text, cached_dir
from synthlab.sweeps.experiments import data_part


def _build_data(tmp: Path, size: int) -> None:
    tmp.mkdir(parents=True)
    (tmp / "data.json").write_text(json.dumps(list(range(size))))


def parse(config: dict) -> dict:
    """This runner's points are their config dicts (it defines its own sections)."""
    return config


def run_point(config: dict, run_dir: Path, *, cache_dir: Path) -> dict:
    data_dir = cached_dir(cache_dir, data_part(config), lambda t: _build_data(t, config["data"]["size"]), "fake-")
    data = json.loads((data_dir / "data.json").read_text())
    ckpt = run_dir / "ckpt.json"
    state = json.loads(ckpt.read_text()) if ckpt.is_file() else {"step": 0, "acc": 1}
    with open(run_dir / "starts.log", "a") as log:  # lets tests see that a resume happened
        log.write(f"{state['step']}\n")
    while state["step"] < config["train"]["steps"]:
        time.sleep(config["train"]["sleep"])
        state["step"] += 1
        state["acc"] = (state["acc"] * 31 + sum(data) + config["model"]["width"]) % 100003
        atomic_write_text(ckpt, json.dumps(state))
    return {
        "accuracy": state["acc"] / 100003 * config["eval"].get("probe", 1),
        "steps": state["step"],
        "data_dir": data_dir.name,
    }


def estimate_seconds(config: dict, *, finished: list) -> float:
    return config["train"]["steps"] * config["train"]["sleep"]
