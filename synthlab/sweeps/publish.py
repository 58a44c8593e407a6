"""A sweep published into a results folder (`synthlab publish SWEEP RESULTS`): its table, its record
and its points' learning curves, merged with what the folder already holds, so that a sweep run
in several sittings, from several folders, lands in one place and nothing published before is lost.

- results.csv: the folder's rows stay, byte for byte and in order; the sweep's rows are added, and
  a point in both takes the sweep's row where the two differ (`results_table.append_rows`).
- sweep.json: the sweep's record, with the folder's commands first and the sweep's after them
  (each once), the earliest `data_began` of the two (a sweep resumed from a copied table records
  none, and the first run's start is what `synthlab.claims.prereg` reads) and each rule's earliest
  time. The stores (this machine's paths) are left out.
- curves/NAME/: a point's `capacity_curve.csv` and `capacity*.json` (written by `synthlab capacity
  MODEL --curve`), NAME built from the factors that vary over the preset's grid (`loops4-lr3e-3`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text, lab_output
from synthlab.sweeps import experiments
from synthlab.sweeps.info import read_info
from synthlab.sweeps.results_table import RESULTS, append_rows, factor_column, find_model_dir, sweep_rows

CURVE = "capacity_curve.csv"
_MACHINE_KEYS = ("stores",)  # absolute paths on the machine that ran the sweep


@dataclasses.dataclass(frozen=True)
class Published:
    rows_added: int  # rows new to the folder or changed in it
    curves: dict[str, str]  # point_id -> the curve folder it was copied to
    without_curve: dict[str, Path]  # point_id -> its model folder, where no curve has been estimated


def publish(sweep_dir: Path, dest: Path) -> Published:
    """Merge the sweep in `sweep_dir` into the results folder `dest` (module docstring); every check
    is made before anything is written."""
    sweep_dir, dest = Path(sweep_dir), Path(dest)
    info = read_info(sweep_dir)
    if not info or not (sweep_dir / RESULTS).is_file():
        raise SynthlabError(f"{sweep_dir} is not a sweep with results (no sweep.json and results.csv)")
    held = _check_dest(dest, info)
    rows = sweep_rows(sweep_dir / RESULTS)
    old = {r["point_id"]: r for r in sweep_rows(dest / RESULTS)} if (dest / RESULTS).is_file() else {}
    names = curve_names(info, [*old.values(), *rows])
    models = {r["point_id"]: _trained_model(sweep_dir, r.get("run_dir", "")) for r in rows}

    dest.mkdir(parents=True, exist_ok=True)
    changed = [r["point_id"] for r in rows if r["point_id"] in old and old[r["point_id"]] != r]
    lock = dest / f"{RESULTS}.lock"
    had_lock = lock.exists()
    added = append_rows(dest / RESULTS, rows, replace=changed)
    if not had_lock:  # the table's lock is the writer's, not a result
        lock.unlink(missing_ok=True)
    atomic_write_text(dest / "sweep.json", json.dumps(merged_record(held, info), indent=1) + "\n")
    curves, missing = {}, {}
    for point_id, model in models.items():
        if model is None or not (model / CURVE).is_file():
            missing[point_id] = model
            continue
        folder = dest / "curves" / names[point_id]
        folder.mkdir(parents=True, exist_ok=True)
        for path in [model / CURVE, *sorted(model.glob("capacity*.json"))]:
            shutil.copyfile(path, folder / path.name)
        curves[point_id] = str(folder)
    return Published(rows_added=added, curves=curves, without_curve=missing)


def _check_dest(dest: Path, info: dict[str, Any]) -> dict[str, Any]:
    """The record `dest` holds ({} for a new or empty folder); a folder of something else, or of
    another sweep, is refused."""
    if not dest.exists():
        return {}
    if not dest.is_dir():
        raise SynthlabError(f"{dest} is a file, not a results folder")
    held = read_info(dest)
    if not held:
        if any(dest.iterdir()):
            other = lab_output(dest) or "files that are not a published sweep"
            raise SynthlabError(f"{dest} holds {other}: publish into a new folder or a published sweep's")
        return {}
    for key in ("experiment", "preset"):
        if held.get(key) != info.get(key):
            raise SynthlabError(
                f"{dest} holds sweep {held.get('experiment')}/{held.get('preset')}, not "
                f"{info.get('experiment')}/{info.get('preset')}: publish into its own folder"
            )
    return held


def merged_record(held: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """The sweep's record merged with the one already published (module docstring)."""
    record = {k: v for k, v in {**held, **info}.items() if k not in _MACHINE_KEYS}
    record["commands"] = list(dict.fromkeys([*held.get("commands", []), *info.get("commands", [])]))
    began = [r["data_began"] for r in (held, info) if r.get("data_began")]
    if began:
        record["data_began"] = min(began)
    rules = {**held.get("rules", {})}
    for rule, first_seen in info.get("rules", {}).items():
        rules[rule] = min(rules.get(rule, first_seen), first_seen)
    if rules:
        record["rules"] = rules
    return record


def curve_names(info: dict[str, Any], rows: list[dict[str, str]]) -> dict[str, str]:
    """point_id -> its curve folder's name: `column value` for each factor column that varies over
    the preset's grid (its axes, seeds included), joined by '-', so that a name stays the same
    however many of the points are published; `point` for a grid of one point."""
    experiment = experiments.load_recorded(info["definition"])
    preset = info["preset"]
    if "seeds" in info:
        experiment = experiments.with_seeds(experiment, preset, info["seeds"])
    points = experiment.points(preset)
    columns = [factor_column(axis) for axis in points[0].factors if len({str(p.factors[axis]) for p in points}) > 1]
    return {r["point_id"]: "-".join(_part(c, r.get(c, "")) for c in columns) or "point" for r in rows}


def _part(column: str, value: str) -> str:
    """One factor of a curve folder's name: `lr3e-3`, `loops4`, `seed0`; a label as it is (`d64-L1_N7109`)."""
    name = column.rsplit(".", 1)[-1]
    try:
        number = float(value)
    except ValueError:
        return value.replace(" ", "_").replace("/", "_")
    if number.is_integer() and abs(number) < 1e6:
        return f"{name}{int(number)}"
    mantissa, exponent = f"{number:e}".split("e")
    return f"{name}{float(mantissa):g}e{int(exponent)}"


def _trained_model(sweep_dir: Path, run_dir: str) -> Path | None:
    """A row's trained model folder (`results_table.find_model_dir`), None where it is not on this machine."""
    try:
        return find_model_dir(sweep_dir, run_dir) if run_dir else None
    except SynthlabError:
        return None
