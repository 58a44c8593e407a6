"""bench_learning over seeds: synthlab minus the reference, paired by seed, with 95% intervals.

Reads the `--out` tables of many `bench_learning.py` runs named `TASK_CANDIDATE_sSEED.csv` (the
names `bench_learning_grid.sh` gives them), pairs synthlab with the reference of the same run (same
seed, data and batches) and prints, per task, candidate, printed step and metric: both means, the
mean paired difference oriented so that positive means synthlab ahead (accuracy: syn - ref; nats:
ref - syn), its 95% t-interval over seeds, and how many seeds have synthlab at or above.

Rule (stated with the bench, commit e44b26f): a candidate is "at or above the reference" on a task when
no printed step has a metric whose interval lies entirely below 0.

    python benchmarks/bench_learning_seeds.py DIR [DIR ...] [--table runs.csv] [--markdown summary.md] \\
        [--configs configs.json]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

METRICS = {
    "mano": ["train_acc_l1", "acc_l2"],
    "bios": ["name_nats", "attr_acc"],
    "multihop": ["train_acc_h1", "train_acc_h2", "acc_h2"],
}
NAME = re.compile(r"^(?P<task>[a-z]+)_(?P<candidate>.+)_s(?P<seed>\d+)$")


def read_runs(folders: list[Path]) -> pd.DataFrame:
    """Every evaluation row of every run, with task, candidate and seed from the file name."""
    frames = []
    for folder in folders:
        for path in sorted(folder.glob("*.csv")):
            match = NAME.match(path.stem)
            if match is None:
                continue
            frame = pd.read_csv(path)
            frame.insert(0, "seed", int(match["seed"]))
            frame.insert(0, "candidate", match["candidate"])
            frame.insert(0, "task", match["task"])
            frames.append(frame)
    if not frames:
        raise SystemExit(f"no TASK_CANDIDATE_sSEED.csv tables in {', '.join(map(str, folders))}")
    return pd.concat(frames, ignore_index=True)


def configs(folders: list[Path]) -> dict[str, dict]:
    """Each (task, candidate)'s configuration, from the runs' JSON, checked equal across seeds (seeds removed)."""
    found: dict[str, dict] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            match = NAME.match(path.stem)
            if match is None:
                continue
            config = json.loads(path.read_text())["config"]
            config["data"].pop("batch_seed", None)
            config["synthlab"]["train"].pop("seed", None)
            key = f"{match['task']}_{match['candidate']}"
            if found.setdefault(key, config) != config:
                raise SystemExit(f"{path}: its configuration differs from another seed's of {key} beyond the seed")
    return found


def paired(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, candidate, step, metric): means, paired difference, 95% interval, n."""
    out = []
    for (task, candidate, step), group in runs.groupby(["task", "candidate", "step"], sort=True):
        for metric in METRICS.get(task, []):
            syn, ref = group[f"syn_{metric}"].to_numpy(float), group[f"ref_{metric}"].to_numpy(float)
            diff = ref - syn if metric.endswith("nats") else syn - ref
            n = len(diff)
            half = stats.t.ppf(0.975, n - 1) * diff.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
            out.append(
                {
                    "task": task,
                    "candidate": candidate,
                    "step": int(step),
                    "metric": metric,
                    "n": n,
                    "syn": syn.mean(),
                    "ref": ref.mean(),
                    "diff": diff.mean(),
                    "low": diff.mean() - half,
                    "high": diff.mean() + half,
                    "seeds_at_or_above": int((diff >= 0).sum()),
                }
            )
    return pd.DataFrame(out)


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """Per (task, candidate): at or above unless some interval lies entirely below 0."""
    rows = []
    for (task, candidate), group in table.groupby(["task", "candidate"], sort=True):
        below = group[group["high"] < 0]
        where = ", ".join(f"{m}@{s}" for m, s in zip(below["metric"], below["step"]))
        rows.append(
            {
                "task": task,
                "candidate": candidate,
                "n": int(group["n"].min()),
                "verdict": "below at " + where if where else "at or above",
            }
        )
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, verdict: pd.DataFrame) -> str:
    lines = [
        "| task | candidate | step | metric | n | synthlab | reference | diff (+ = synthlab ahead) "
        "| 95% interval | seeds at or above |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.task} | {r.candidate} | {r.step} | {r.metric} | {r.n} | {r.syn:.3f} | {r.ref:.3f} "
            f"| {r.diff:+.3f} | [{r.low:+.3f}, {r.high:+.3f}] | {r.seeds_at_or_above}/{r.n} |"
        )
    lines += ["", "| task | candidate | n | verdict |", "|---|---|---|---|"]
    lines += [f"| {r.task} | {r.candidate} | {r.n} | {r.verdict} |" for r in verdict.itertuples()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("folders", nargs="+", type=Path, help="folders of bench_learning --out tables")
    ap.add_argument("--table", type=Path, help="also write every run's rows, with task, candidate, seed, to this CSV")
    ap.add_argument("--markdown", type=Path, help="also write the paired table and verdicts as markdown")
    ap.add_argument("--configs", type=Path, help="also write each task and candidate's configuration (JSON)")
    args = ap.parse_args()
    runs = read_runs(args.folders)
    table = paired(runs)
    verdict = verdicts(table)
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))
        print()
        print(verdict.to_string(index=False))
    if args.table:
        runs.to_csv(args.table, index=False)
    if args.markdown:
        args.markdown.write_text(markdown(table, verdict))
    if args.configs:
        args.configs.write_text(json.dumps(configs(args.folders), indent=1) + "\n")


if __name__ == "__main__":
    main()
