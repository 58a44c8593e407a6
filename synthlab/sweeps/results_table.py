"""The results table of a sweep (`results.csv`): reading and appending rows, and its columns.

Its columns, what each means, its type and which stage writes it: `synthlab.sweeps.schema` (printed by
`synthlab columns`). The functions here build a stage's columns from its result.

Rows are written whole (a temporary file renamed under a lock), never edited in place.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from synthlab.errors import SynthlabError
from synthlab.evaluation.groups import group_columns
from synthlab.files import atomic_write_text, file_lock, warn
from synthlab.sweeps.schema import ACC_STEP, AGREE, BITS_ATTRIBUTE, EVAL_LOSS_STEP, PER_STEP
from synthlab.training.configs import flat_train
from synthlab.training.run_folders import read_metrics
from synthlab_generators import TASKS

RESULTS = "results.csv"
# Grid axes written under a descriptor's name (one column, not two).
_AXIS_COLUMNS = {
    "model.loops": "loops",
    "model.d_model": "d_model",
    "train.seed": "seed",
    "data.seed": "data_seed",
    **{f"data.{f}": c for spec in TASKS.values() for f, c in dict(spec.data_columns).items()},
}


def factor_column(axis: str) -> str:
    """The results.csv column of a grid axis: `model.loops` -> `loops`, `data.L` -> `L`, else the axis."""
    return _AXIS_COLUMNS.get(axis, axis)


def parse_only(only: Iterable[str], columns: Collection[str]) -> dict[str, list[str]]:
    """`--only COLUMN=VALUE` filters as {factor column: the values it may take}: one column given
    twice takes either value, two columns must both match. Checked against the grid's `columns`."""
    wanted: dict[str, list[str]] = {}
    for text in only:
        column, sep, value = text.partition("=")
        column, value = column.strip(), value.strip()
        if not sep or not column or not value:
            raise SynthlabError(f"--only takes COLUMN=VALUE (e.g. seed=2), got '{text}'")
        if column not in columns:
            raise SynthlabError(
                f"--only {text}: the grid has no factor '{column}' (it has {', '.join(sorted(columns))})"
            )
        wanted.setdefault(column, []).append(value)
    return wanted


def selected(factors: dict[str, Any], wanted: dict[str, list[str]]) -> bool:
    """Whether a point (its factor columns and values) passes `parse_only`'s filters; numbers match
    by value (`lr=3e-3` is 0.003)."""
    return all(any(_same(factors.get(column), value) for value in values) for column, values in wanted.items())


def _same(value: Any, text: str) -> bool:
    if str(value) == text:
        return True
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        return False


def read_rows(path: str | Path, *, warn_damaged: bool = True) -> list[dict[str, str]]:
    """The whole rows of a results table as strings, exactly as written (none if there is no file yet).

    A row that is not whole (cut short by a crash or a copy: fewer or more cells than the header,
    the file's last line without its line end, a blank point_id) is left out, with a warning unless
    `warn_damaged` is false: its point counts as unfinished, and the next write drops it.
    """
    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    records = _parse_csv(text)
    if not records:
        return []
    header, rows, damaged = records[0], [], []
    for number, cells in enumerate(records[1:], 2):
        whole = len(cells) == len(header) and (number < len(records) or text.endswith("\n"))
        row = dict(zip(header, cells))
        if whole and (row.get("point_id") or "point_id" not in header):  # a table made elsewhere may have none
            rows.append(row)
        else:
            damaged.append(str(number))
    if not text.endswith("\n") and len(records) == 1:
        damaged.append("1 (the header)")
    if damaged and warn_damaged:
        warn(f"{path}: line {', '.join(damaged)} is not a whole row (cut short?); its point counts as unfinished")
    return rows


def sweep_rows(path: str | Path, *, warn_damaged: bool = True) -> list[dict[str, str]]:
    """`read_rows` of a sweep's own table: a results.csv without a point_id column (a file the sweep
    did not write) is a SynthlabError, before any point runs; the file is left as it is."""
    path = Path(path)
    if path.is_file():
        header = _parse_csv(path.read_text(encoding="utf-8").split("\n", 1)[0] + "\n")
        if not header or "point_id" not in header[0]:
            raise SynthlabError(
                f"{path} is not a sweep's results table (no point_id column): choose a new --out, or move the file"
            )
    return read_rows(path, warn_damaged=warn_damaged)


def _check_repeats(rows: list[dict[str, str]], path: Path) -> None:
    """A row whose point (its point_id; every cell in a table without one) is in the table twice,
    copied by hand, would count as one more seed: a SynthlabError naming both lines."""
    first: dict[tuple, int] = {}
    for line, row in enumerate(rows, 2):
        key = (row["point_id"],) if "point_id" in row else tuple(row.values())
        if key in first:
            what = f"point {row['point_id']}" if "point_id" in row else "the same row"
            raise SynthlabError(
                f"{path}: {what} is on rows {first[key]} and {line} (a repeated row would count as another "
                f"seed): delete one of them"
            )
        first[key] = line


def check_numbers(table, path: Path):
    """`table` (read from `path`), checked: a column of numbers with a cell that is not one (edited
    by hand, damaged) is a SynthlabError naming the cell; a column mostly of labels is left alone."""
    import pandas as pd  # only readers of a whole table need it, not the sweep workers that append rows

    for column in [c for c in table.columns if not pd.api.types.is_numeric_dtype(table[c])]:
        numbers = pd.to_numeric(table[column], errors="coerce")
        bad = table[column].notna() & numbers.isna()
        if bad.any() and numbers.notna().sum() > bad.sum():
            raise _not_a_number(path, table[bad].iloc[0], column)
    return table


def read_results(sweep_dir: str | Path):
    """A sweep's results.csv, its whole rows only (one cut short is left out, with a warning); a
    grid-axis column that duplicates a descriptor (`model.loops` beside `loops`, written by older
    versions) is dropped, one without its descriptor (`train.seed`) is renamed to it (`seed`)."""
    import pandas as pd  # only readers of a whole table need it, not the sweep workers that append rows

    path = Path(sweep_dir) / RESULTS
    if not path.is_file():
        raise SynthlabError(f"no results.csv in {sweep_dir} (run `synthlab sweep` first)")
    rows = read_rows(path)
    if not rows:
        raise SynthlabError(f"{path} has no whole row (run `synthlab sweep` again to finish it)")
    _check_repeats(rows, path)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    table = check_numbers(pd.read_csv(io.StringIO(text.getvalue())), path)  # types inferred as from the file
    table = table.drop(columns=[c for c in table if factor_column(c) != c and factor_column(c) in table])
    table = table.rename(columns={c: factor_column(c) for c in table})
    table.attrs["sweep_dir"] = str(sweep_dir)  # where a plotter finds the sweep's saved fits (fit_looplm.json)
    return table


def cell_number(row: dict[str, str], column: str, path: Path) -> float:
    """The number in `row`'s cell `column` of the table at `path`; a SynthlabError naming it if it is not one."""
    try:
        return float(row[column])
    except (KeyError, TypeError, ValueError):
        raise _not_a_number(path, row, column) from None


def _not_a_number(path: Path, row, column: str) -> SynthlabError:
    return SynthlabError(
        f"{path}: point {row.get('point_id', '?')}, column {column}: {row.get(column)!r} is not a "
        f"number (fix or delete that row; a deleted point is run again)"
    )


def _parse_csv(text: str) -> list[list[str]]:
    """The records of a CSV text; a record cut inside a quoted cell (at the end) is left out."""
    while text:
        try:
            return [cells for cells in csv.reader(io.StringIO(text)) if cells]
        except csv.Error:
            text = text[: text.rstrip("\n").rfind("\n") + 1]
    return []


def missing_columns(row: dict[str, str], columns: Iterable[str]) -> list[str]:
    """The columns of `columns` that `row` leaves blank (a point's stages write every one of them)."""
    return [c for c in columns if row.get(c) in (None, "")]


def append_rows(path: Path, rows: list[dict[str, Any]], replace: Collection[str] = ()) -> int:
    """Add rows whose point_id is not in the table yet (or is in `replace`: those rows are replaced);
    returns how many were added.

    The whole table is rewritten (old rows byte-for-byte as strings, new columns appended at the
    right; rows that are not whole are dropped) and renamed into place under a lock, so
    concurrent writers and kill -9 are safe.
    """
    with file_lock(path.with_name(path.name + ".lock")):
        old = sweep_rows(path, warn_damaged=False)
        seen = {r["point_id"] for r in old} - set(replace)
        new = [r for r in rows if r["point_id"] not in seen]
        if not new:
            return 0
        replaced = {r["point_id"] for r in new}
        old = [r for r in old if r["point_id"] not in replaced]
        columns = list(old[0].keys()) if old else []
        for row in new:
            columns += [c for c in row if c not in columns]
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(old)
        writer.writerows({k: _cell(v) for k, v in r.items()} for r in new)
        atomic_write_text(path, out.getvalue())
        return len(new)


def _cell(value: Any) -> Any:
    """Floats keep full precision (repr round-trips); lists/dicts become JSON."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return value


def describe(point) -> dict[str, Any]:
    """Columns that say what was trained, whatever the grid axes were (`point`: a PointConfig)."""
    m = point.model
    if m.topology == "sandwich":
        label = f"{m.n_prelude}+{m.n_core}x{m.loops}+{m.n_coda} {m.injection}"
        if m.state_init != "input":
            label += f" init={m.state_init}"
    else:
        label = f"{m.n_layers}x{m.loops}"
    out = {
        "model": label,
        "loops": m.loops,
        "d_model": m.d_model,
        "seed": point.train.seed,
        "data_seed": point.data_seed,
    }
    out.update({column: getattr(point.data, field) for field, column in dict(point.spec.data_columns).items()})
    return out


def train_metrics(model_dir: Path) -> dict[str, Any]:
    """Training columns from a run's metrics log (`loss`: mean of the last logged 10% of steps), and
    where the run has a `train.schedule.stop_when`, the step it met it (`stopped_at_step`)."""
    lines = read_metrics(model_dir)
    tail = lines[-max(1, len(lines) // 10) :]
    loss = sum(r["loss"] for r in tail) / len(tail)
    # training time, measured: each log line's tokens since the previous line over its tokens/s
    seconds, before = 0.0, 0
    for r in lines:
        seconds += (r["tokens"] - before) / max(r["tokens_per_s"], 1e-9)
        before = r["tokens"]
    out = {
        "train_steps": lines[-1]["step"],
        "tokens": lines[-1]["tokens"],
        "train_loss": loss,
        "loss": loss,
        "train_s": seconds,
    }
    config = json.loads((Path(model_dir) / "config.json").read_text())
    if flat_train(config["train"]).get("stop_when"):  # blank: the run never met its rule and ran its whole budget
        out["stopped_at_step"] = config["derived"].get("stop", {}).get("at_step")
    return out


def eval_metrics(result: dict[str, Any], options) -> dict[str, Any]:
    """Flatten an evaluate_run result (with its EvalOptions) into results.csv columns."""
    out = {
        "accuracy": result["accuracy"],
        "accuracy_at_trained_depth": result["accuracy_at_trained_depth"],
        "answer_loss": result["answer_loss_per_step"][-1],
        "eval_steps": result["eval_steps"],
        "n_test": result.get("n_examples"),
        "groups_at_step": result.get("groups_at_step"),
    }
    out.update({ACC_STEP.name(t): a for t, a in enumerate(result["accuracy_per_step"], 1)})
    out.update(group_columns(result.get("groups", {})))
    if options.agreement:
        for i, row in enumerate(result["agreement"], 1):
            out.update({AGREE.name(i, j): a for j, a in enumerate(row, 1)})
    if options.exit is not None:
        kind, _, value = options.exit.partition(":")
        out.update(
            strategy=kind,
            threshold=float(value),
            mean_exit_step=result["mean_exit_step"],
            accuracy=result["exit_accuracy"],
            accuracy_all_steps=result["accuracy"],
        )
    if options.kv is not None:
        out.update(
            kv=options.kv,
            kv_bytes=result["kv_cache_bytes_per_sequence"],
            accuracy=result["kv_accuracy"],
            accuracy_teacher_forced=result["accuracy"],
        )
    return out


def heldout_columns(result: dict[str, Any]) -> dict[str, Any]:
    """Flatten a synthlab.evaluation.heldout.heldout_loss result into results.csv columns."""
    out = {
        "eval_loss": result["loss_per_step"][-1],
        "eval_tokens": result["tokens"],
        "eval_checkpoint": result["step"],
        "eval_n_tokens": result["n_tokens"],
    }
    out.update({EVAL_LOSS_STEP.name(t): v for t, v in enumerate(result["loss_per_step"], 1)})
    if "seen" in result:
        out["eval_seen"] = result["seen"]
    return out


def capacity_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """Capacity columns from an estimate_capacity report."""
    keys = (
        "p1",
        "p2",
        "bits",
        "bits_name",
        "bits_attributes",
        "max_bits",
        "bits_per_param",
        "bits_per_param_nonemb",
        "fraction_of_max",
        "n_people",
        "exposures",
    )
    out = {k: report[k] for k in keys if k in report}
    out.update({BITS_ATTRIBUTE.name(a): row["bits"] for a, row in report.get("per_attribute", {}).items()})
    out["params_capacity"] = report["params"]  # P as the estimate counts it (used embedding rows only)
    return out


def step_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per (run, recurrent step) of a finished sweep, for the step-wise law (`synthlab fit steps`).

    Each row is repeated for t = 1..loops with `step` = t and `loss` = the loss read out after step
    t: the held-out loss (`eval_loss_step_<t>`, with `tokens` = `eval_tokens`, and in `eval_loss`
    too, which `synthlab fit` reads by default: the row's own eval_loss is the last step's) where
    the sweep ran the heldout stage, else the training loss (the mean over the last logged 10% of optimizer steps,
    like `loss`); the per-step accuracy and loss columns are dropped (they belong to the row, not
    to the step).
    """
    rows = read_rows(Path(sweep_dir) / RESULTS)
    if not rows:
        raise SynthlabError(f"no results.csv rows in {sweep_dir} (run `synthlab sweep` first)")
    out = []
    for row in rows:
        held = sorted((int(m[0]), float(v)) for k, v in row.items() if (m := EVAL_LOSS_STEP.match(k)) and v != "")
        if held:
            per_step = [v for _, v in held]
        else:  # every logged record has every step's loss (train.py reads all steps out on log steps)
            lines = read_metrics(find_model_dir(Path(sweep_dir), row["run_dir"]))
            tail = lines[-max(1, len(lines) // 10) :]
            per_step = [
                sum(r["loss_per_step"][t] for r in tail) / len(tail) for t in range(len(tail[0]["loss_per_step"]))
            ]
        base = {k: v for k, v in row.items() if not any(f.match(k) for f in PER_STEP)}
        for t, loss in enumerate(per_step, 1):
            step = {**base, "step": t, "loss": loss}
            if held:  # step t's held-out loss where `synthlab fit` reads it by default
                step.update(tokens=row["eval_tokens"], eval_loss=loss)
            out.append(step)
    return out


def find_model_dir(sweep_dir: Path, run_dir: str) -> Path:
    """A point's trained model: under run_dir as recorded, else under this sweep's runs/ (moved sweeps)."""
    for candidate in (Path(run_dir), sweep_dir / "runs" / Path(run_dir).name):
        if (candidate / "model" / "metrics.jsonl").is_file():
            return candidate / "model"
    raise SynthlabError(f"no model/metrics.jsonl for run {run_dir} (looked beside {sweep_dir} too)")
