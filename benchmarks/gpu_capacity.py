"""Knowledge capacity on one GPU at the CPU calibration's grid: the peak bits/param of each model over N.

The grid is the capacity experiment's presets, read, not restated (experiments/capacity.toml;
default calib64, then calib1000-64): each point's width, depth, population N (the data ceilings
of about 1.5, 3 and 6 bits/param), pool scale, exposures and recipe, so that a GPU run extends the
CPU table point for point. To it are added: every model at each loop count of --loops (the same
unique parameters), each arm at its own learning rate as the presets state it (one rate per loop
count across them); and, for a model the presets train on several N, one larger N (--larger times
its largest). Each case is the sweep's point run by the sweep's stages (synthlab.sweeps.lab_runner:
train, then the capacity estimate), on CUDA with bf16 autocast, compiled unless --no-compile.

Cases run in the order above (the first preset's plain models first), --jobs at a time on the one
GPU (the models are small: several processes share it), within --budget-s seconds: a case whose
measured rate (another case of its model, or its own progress) says it would end after the
budget is not started, or is stopped, and reported as not fitting, with its estimate. After every
case OUT/gpu_capacity.json and OUT/gpu_capacity.md are rewritten: each case's bits/param, its
data ceiling (max_bits / P) and whether it is data-limited (bits within 10% of max_bits: a lower
bound, as the presets' rule reads it), and each model's PEAK bits/param over the N it finished,
printed beside Physics of LMs 3.3's figure at its exposures, labelled as the paper's; a case of
1000 exposures or more also gets its learning curve (bits/param at each kept checkpoint), which
says whether its bits had stopped rising (saturation, C1's regime) by the run's end.

`--seeds 0,1,2` runs each point at the presets' three training seeds (default: seed 0 alone), as
C1's rule needs; a model's peak is then the N with the highest mean over its seeds, with the
standard error, as the calibration reads it (synthlab.evaluation.capacity.peak_capacity).

`--presets screen1000-64` runs the learning-rate screen of calib1000-64's arms instead (a screen
preset's points as they are: loops 1 and 4 at each rate, on its own seed) and reports the rate each
arm takes by the screen's stated rule (`screen_choices`), for calib1000-64 to be set to before it runs.

    python benchmarks/gpu_capacity.py --out DIR                 # one GPU (benchmarks/gpu_all.sh)
    python benchmarks/gpu_capacity.py --dry-run --out DIR       # toy sizes on the CPU

--dry-run: the same cases at toy sizes (N / 200, d = 16, exposures / 50) on the CPU, two at a
time within 60 s: the path, not a measurement.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from synthlab.claims.screens import Choice

PAPER_BITS_PER_PARAM = {100: 1.0, 1000: 2.0}  # Physics of LMs 3.3 by exposures: reference lines, not results
CURVE_EXPOSURES = 1000  # runs this long get a learning curve (bits/param at each kept checkpoint)
DATA_LIMITED = 0.9  # bits at or above this fraction of max_bits: the data, not the model, is the limit


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="new or empty folder for the data, runs and reports")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (default: off)")
    parser.add_argument(
        "--presets",
        default="calib64,calib1000-64",
        help="capacity presets, in order (default calib64,calib1000-64; screen1000-64 screens each arm's rate)",
    )
    parser.add_argument("--loops", default="1,4", help="loop counts of every model (default 1,4)")
    parser.add_argument(
        "--larger", type=float, default=2.0, help="the added N, times a model's largest preset N (default 2.0; 0: none)"
    )
    parser.add_argument(
        "--seeds",
        type=seed_list,
        default="0",
        help="the presets' training seeds to run, comma-separated (default 0; C1's rule needs three: 0,1,2)",
    )
    parser.add_argument("--jobs", type=int, default=None, help="cases at a time on the GPU (default 8; dry run 2)")
    parser.add_argument("--budget-s", type=float, default=None, help="seconds for all cases (default 180; dry run 60)")
    parser.add_argument("--no-compile", action="store_true", help="train eagerly (default: torch.compile on CUDA)")
    parser.add_argument(
        "--case",
        type=Path,
        default=None,
        help="run only the one case in this file (how the cases are started; default: all)",
    )
    args = parser.parse_args(argv)
    args.presets = args.presets.split(",")
    args.jobs = args.jobs or (2 if args.dry_run else 8)
    args.budget_s = args.budget_s or (60.0 if args.dry_run else 180.0)
    return args


def seed_list(text: str) -> list[int]:
    """--seeds: comma-separated training seeds, each a non-negative integer."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,1,2, got {text!r}") from None
    if any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"seeds are non-negative, got {text!r}")
    return seeds


def arm_rates(points) -> dict[int, float]:
    """{loops: learning rate} as the presets' points state it; two rates for one arm is an error."""
    from synthlab import SynthlabError

    rates: dict[int, float] = {}
    for p in points:
        loops, lr = p.config["model"].get("loops", 1), p.config["train"]["lr"]
        if rates.setdefault(loops, lr) != lr:
            raise SynthlabError(f"the presets give loops {loops} two learning rates ({rates[loops]} and {lr})")
    return rates


def toy(config: dict) -> dict:
    """The dry run's version of a case: the same structure at a size the CPU trains in seconds."""
    config["data"]["n_people"] = max(20, config["data"]["n_people"] // 200)
    config["model"].update(d_model=16, n_heads=2)
    config["train"].update(
        exposures=config["train"]["exposures"] / 50, checkpoints=2, keep_checkpoints=2, warmup_steps=2, log_every=2
    )
    return config


def cases(args) -> list[dict]:
    """The cases in the order they run: a screen preset's points as they are (each arm at each rate
    it screens, on its own seed) first, then per other preset its points at every loop count (plain
    first, each arm at its preset rate), then, for a model trained on several N, the larger N."""
    from synthlab.sweeps import experiments

    exp = experiments.load("capacity")
    screens = {name: exp.points(name) for name in args.presets if exp.is_screen(name)}
    by_preset = {
        name: [p for p in exp.points(name) if p.factors.get("seed", 0) in args.seeds]
        for name in args.presets
        if name not in screens
    }
    rates = arm_rates([p for points in by_preset.values() for p in points])
    loops = [int(t) for t in args.loops.split(",")]
    out, seen = [], set()

    def add(preset: str, config: dict, n_people: int, t: int, lr: float | None = None) -> None:
        config = copy.deepcopy(config)
        config["data"]["n_people"] = n_people
        config["model"]["loops"] = t
        lr = lr if lr is not None else rates.get(t, rates.get(1))
        config["train"].update(lr=lr, device="auto", compile=not args.no_compile)
        curve = config["train"]["exposures"] >= CURVE_EXPOSURES
        if args.dry_run:
            config = toy(config)
            config["train"].update(device="cpu", compile=False)
        m, x = config["model"], config["train"]["exposures"]
        model = f"d{m['d_model']}-L{m['n_layers']} loops {t} {x:g}x" + (f" lr {lr:g}" if preset in screens else "")
        seed = seed_of(config)
        key = (model, config["data"]["n_people"], seed)
        if key not in seen:
            seen.add(key)
            label = f"{model} N{config['data']['n_people']}" + (f" seed {seed}" if len(args.seeds) > 1 else "")
            out.append(
                {
                    "label": label,
                    "model": model,
                    "preset": preset,
                    "screen": preset in screens,
                    "curve": curve,
                    "config": config,
                }
            )

    for name, points in screens.items():  # a screen's points as they are: each its own loops, rate and seed
        for p in points:
            add(name, p.config, p.config["data"]["n_people"], p.config["model"]["loops"], p.config["train"]["lr"])
    for name, points in by_preset.items():
        for t in loops:
            for p in points:
                add(name, p.config, p.config["data"]["n_people"], t)
        largest: dict[tuple, dict] = {}  # (d_model, n_layers, seed): the config of its largest N
        for p in points:
            ns = {q.config["data"]["n_people"] for q in points if model_seed(q.config) == model_seed(p.config)}
            if args.larger and len(ns) > 1 and p.config["data"]["n_people"] == max(ns):
                largest[model_seed(p.config)] = p.config
        for t in loops:
            for config in largest.values():
                add(f"{name} (larger N)", config, round(args.larger * config["data"]["n_people"]), t)
    return out


def seed_of(config: dict) -> int:
    """A point's training seed (a seed-0 point's config leaves it at its default)."""
    return config["train"].get("seed", 0)


def model_seed(config: dict) -> tuple[int, int, int]:
    """(d_model, n_layers, seed): the points of one model and seed, across N."""
    return config["model"]["d_model"], config["model"]["n_layers"], seed_of(config)


def run_case(path: Path) -> None:
    """A child: train the case's point and estimate its capacity; write the row beside the case file."""
    from synthlab.evaluation.capacity import learning_curve
    from synthlab.sweeps import lab_runner

    case = json.loads(path.read_text())
    start = time.perf_counter()
    row = lab_runner.run_point(lab_runner.parse(case["config"]), Path(case["run_dir"]), cache_dir=Path(case["cache"]))
    if case.get("curve"):
        curve = learning_curve(Path(case["run_dir"]) / "model", device=case["config"]["train"]["device"])
        row["curve"] = [[int(s), float(b)] for s, b in zip(curve["checkpoint"], curve["bits_per_param"])]
    row["seconds"] = time.perf_counter() - start
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(row, indent=1) + "\n")
    tmp.replace(path.with_suffix(".row.json"))


def progress(run_dir: Path) -> tuple[int, int] | None:
    """(optimizer steps logged, total steps) of a training run in progress, or None before its first log."""
    try:
        total = json.loads((run_dir / "model" / "config.json").read_text())["derived"]["total_steps"]
        lines = (run_dir / "model" / "metrics.jsonl").read_text().strip().splitlines()
        return (json.loads(lines[-1])["step"], total) if lines else None
    except (OSError, ValueError, KeyError):
        return None


class Scheduler:
    """Runs the cases --jobs at a time as child processes, within the budget, and reports as it goes."""

    def __init__(self, args, out: Path, todo: list[dict]) -> None:
        self.args, self.out, self.cases, self.todo = args, out, todo, list(todo)
        self.deadline = time.monotonic() + args.budget_s
        self.running: dict[str, dict] = {}
        # model -> (start-up seconds, seconds per person-exposure) of its last finished case
        self.rate: dict[str, tuple[float, float]] = {}
        for case in todo:
            case.update(
                status="waiting", run_dir=str(out / "runs" / case["label"].replace(" ", "_")), cache=str(out / "cache")
            )

    def estimate(self, case: dict) -> float | None:
        """Seconds the case would take at its model's measured rate (None before one of its model finished)."""
        if case["model"] not in self.rate:
            return None
        startup, per_unit = self.rate[case["model"]]
        return startup + per_unit * case["config"]["data"]["n_people"] * case["config"]["train"]["exposures"]

    def start(self, case: dict) -> None:
        path = self.out / "cases" / (Path(case["run_dir"]).name + ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(case, indent=1) + "\n")
        log = open(path.with_suffix(".log"), "w")
        proc = subprocess.Popen(
            [sys.executable, __file__, "--out", str(self.out), "--case", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopping it stops its compile workers too
        )
        case.update(status="running")
        self.running[case["label"]] = {"case": case, "proc": proc, "path": path, "log": log, "t0": time.monotonic()}

    def stop(self, label: str, status: str, **extra) -> None:
        job = self.running.pop(label)
        if job["proc"].poll() is None:  # SIGKILL: on SIGTERM the trainer would stop early and the estimate run on it
            os.killpg(job["proc"].pid, signal.SIGKILL)
            job["proc"].wait()
        job["log"].close()
        job["case"].update(status=status, **extra)

    def poll(self) -> None:
        now = time.monotonic()
        for label, job in list(self.running.items()):
            case, elapsed = job["case"], now - job["t0"]
            if job["proc"].poll() is not None:
                row = job["path"].with_suffix(".row.json")
                if job["proc"].returncode == 0 and row.is_file():
                    self.stop(label, "done", row=json.loads(row.read_text()), seconds=round(elapsed, 1))
                    units = case["config"]["data"]["n_people"] * case["config"]["train"]["exposures"]
                    startup = job.get("first", (elapsed, 0))[0]
                    self.rate[case["model"]] = (startup, (elapsed - startup) / units)
                else:
                    log = job["path"].with_suffix(".log").name
                    self.stop(label, f"failed (exit {job['proc'].returncode}: see {log})")
                continue
            done = progress(Path(case["run_dir"]))
            if done and done[0] > 0:
                job.setdefault("first", (elapsed, done[0]))  # start-up (data, compile) ends at the first log
            first, projected = job.get("first"), None
            if done and first and done[0] > first[1] and elapsed - first[0] >= 5:
                # the steady rate since the first log, over the steps left
                projected = elapsed + (done[1] - done[0]) * (elapsed - first[0]) / (done[0] - first[1])
            if projected is not None and job["t0"] + projected > self.deadline:
                self.stop(label, "stopped: projected past the budget", projected_s=round(projected, 1))
            elif now > self.deadline:
                self.stop(label, "stopped: budget spent")

    def run(self, report) -> None:
        """Until every case is done, failed, stopped or not run; `report()` after each change of a status."""
        while self.todo or self.running:
            before = [c["status"] for c in self.cases]
            while self.todo and len(self.running) < self.args.jobs:
                case = self.todo.pop(0)
                estimate, left = self.estimate(case), self.deadline - time.monotonic()
                if left <= 0:
                    case.update(status="not run: budget spent")
                    continue
                if estimate is not None and estimate > left:
                    case.update(status="not run: estimated past the budget", estimated_s=round(estimate, 1))
                    continue
                self.start(case)
            self.poll()
            if [c["status"] for c in self.cases] != before:
                report()
            time.sleep(0.5)

    def stop_all(self) -> None:
        for label in list(self.running):
            self.stop(label, "stopped: interrupted")


def summary(all_cases: list[dict]) -> tuple[list[dict], dict[str, dict]]:
    """(a row per case, {model: its peak over the N it finished}). The peak is the calibration's
    (synthlab.evaluation.capacity.peak_capacity): the N with the highest mean bits/param over the
    seeds finished there, with its standard error where two or more seeds finished."""
    import pandas as pd

    from synthlab.evaluation.capacity import peak_capacity

    rows = []
    for case in all_cases:
        row = {k: case[k] for k in ("label", "model", "preset", "status")} | {"screen": case.get("screen", False)}
        row.update({k: case[k] for k in ("seconds", "estimated_s", "projected_s") if k in case})
        row.update(n_people=case["config"]["data"]["n_people"], exposures=case["config"]["train"]["exposures"])
        row.update(lr=case["config"]["train"]["lr"], loops=case["config"]["model"]["loops"])
        row.update(seed=seed_of(case["config"]))
        if case["status"] == "done":
            r = case["row"]
            row.update({k: r[k] for k in ("bits", "bits_per_param", "max_bits", "params", "params_capacity")})
            row.update(fraction_of_max=r["fraction_of_max"], ceiling=r["max_bits"] / r["params_capacity"])
            if "curve" in r:
                row["curve"] = r["curve"]
            row["data_limited"] = r["bits"] >= DATA_LIMITED * r["max_bits"]
        rows.append(row)
    peaks = {}
    done = pd.DataFrame([r for r in rows if r["status"] == "done"])
    for model, table in done.groupby("model", sort=False) if len(done) else ():
        peak = peak_capacity(table, data_limited=DATA_LIMITED).iloc[0]
        n = int(peak["n_people"])
        peaks[model] = {
            "bits_per_param": float(peak["bits_per_param"]),
            "se": None if pd.isna(peak["se"]) else float(peak["se"]),
            "seeds": int(peak["seeds"]),
            "n_people": n,
            "ceiling": float(table.loc[table["n_people"] == n, "ceiling"].mean()),
            "data_limited": bool(peak["data_limited"]),
            "exposures": float(table["exposures"].iloc[0]),  # one model label, one exposure count
        }
    return rows, peaks


def markdown(rows: list[dict], peaks: dict[str, dict]) -> str:
    lines = [
        "| case | status | ceiling (max_bits / P) | bits/param | of the data | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        measured = "ceiling" in r
        seconds = r.get("seconds") or r.get("projected_s") or r.get("estimated_s")
        lines.append(
            f"| {r['label']} | {r['status']} | {r['ceiling']:.2f} | {r['bits_per_param']:.3f} | {r['fraction_of_max']:.1%} | {seconds} |"
            if measured
            else f"| {r['label']} | {r['status']} | | | | {'' if seconds is None else f'~{seconds:.0f}'} |"
        )
    lines += [
        "",
        "Peak bits/param per model (the best over the N it finished; the paper's figure beside it, not measured here):",
        "",
    ]
    for model, p in peaks.items():
        paper = PAPER_BITS_PER_PARAM.get(int(p["exposures"]))
        beside = (
            f"Physics of LMs 3.3 at {p['exposures']:g} exposures: about {paper:g} (paper)"
            if paper
            else "no paper figure"
        )
        spread = f" (± {p['se']:.3f} over {p['seeds']} seeds)" if p.get("se") is not None else ""
        lines.append(
            f"- {model}: peak {p['bits_per_param']:.3f} bits/param{spread} at N {p['n_people']:,} (ceiling {p['ceiling']:.2f}"
            f"{', data-limited: a lower bound' if p['data_limited'] else ''}); {beside}"
        )
    curves = [r for r in rows if r.get("curve")]
    if curves:
        lines += ["", "Learning curves (bits/param at each kept checkpoint: flat at the end means saturated):", ""]
        lines += [f"- {r['label']}: " + ", ".join(f"{b:.3f} @ {s:,}" for s, b in r["curve"]) for r in curves]
    from synthlab.claims.screens import choice_lines

    for _, choice, chosen in screen_choices(rows):
        lines += ["", *choice_lines(chosen, choice)]
    return "\n".join(lines) + "\n"


def screen_choices(rows: list[dict]) -> list[tuple[str, Choice, pd.DataFrame]]:
    """Per screen preset among the rows: its stated rule (the preset's `choose` table) and each arm's
    choice by it (synthlab.claims.screens.choose, as the CPU sweep's report applies it)."""
    import pandas as pd

    from synthlab.claims.screens import choose
    from synthlab.sweeps import experiments

    exp, out = experiments.load("capacity"), []
    for preset in dict.fromkeys(r["preset"] for r in rows if r.get("screen")):
        choice, mine = exp.screen_choice(preset), [r for r in rows if r.get("screen") and r["preset"] == preset]
        if choice is None or (choice.setting, choice.per) != ("train.lr", ("loops",)):
            raise SystemExit(f"{preset}: this benchmark applies a screen of train.lr per loops, not {choice}")
        grid = pd.DataFrame({"loops": [r["loops"] for r in mine], "train.lr": [r["lr"] for r in mine]})
        table = grid.assign(**{choice.metric: [r.get(choice.metric, float("nan")) for r in mine]})
        out.append((preset, choice, choose(table, choice, grid)))
    return out


def write_report(args, out: Path, all_cases: list[dict], started: float) -> None:
    import torch

    from synthlab.files import atomic_write_text

    rows, peaks = summary(all_cases)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.dry_run else "cpu"
    report = {
        "presets": args.presets,
        "seeds": args.seeds,
        "loops": args.loops,
        "budget_s": args.budget_s,
        "jobs": args.jobs,
        "compile": not args.no_compile and not args.dry_run,
        "dry_run": args.dry_run,
        "device": device,
        "torch": torch.__version__,
        "wall_s": round(time.monotonic() - started, 1),
        "paper_bits_per_param": PAPER_BITS_PER_PARAM,
        "cases": rows,
        "peaks": peaks,
        "points": {c["label"]: c["config"] for c in all_cases},  # each case's full point config
    }
    atomic_write_text(out / "gpu_capacity.json", json.dumps(report, indent=1) + "\n")
    atomic_write_text(out / "gpu_capacity.md", f"# Capacity on {device}\n\n" + markdown(rows, peaks))


def main(argv=None) -> None:
    from synthlab import SynthlabError

    args = parse_args(argv)
    if args.case is not None:
        return run_case(args.case)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SynthlabError(f"--out {out} is not empty")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        raise SynthlabError("no CUDA device: run with --dry-run to check the path on the CPU")
    out.mkdir(parents=True, exist_ok=True)
    all_cases = cases(args)
    started = time.monotonic()
    print(
        f"{len(all_cases)} cases, {args.jobs} at a time, {args.budget_s:.0f} s: "
        + "; ".join(c["label"] for c in all_cases)
    )
    scheduler = Scheduler(args, out, all_cases)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's SIGTERM: stop the children, report
    try:
        scheduler.run(lambda: write_report(args, out, all_cases, started))
    finally:
        scheduler.stop_all()
        write_report(args, out, all_cases, started)
    print(markdown(*summary(all_cases)), end="")


if __name__ == "__main__":
    from synthlab import SynthlabError

    try:
        main()
    except SynthlabError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
