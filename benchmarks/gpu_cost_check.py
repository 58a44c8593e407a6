"""The GPU cost model against real preset points on one GPU: what `synthlab sweep NAME --preset gpu
--dry-run` estimates for a point (synthlab.sweeps.cost.gpu_cost with the host rates measured here) against
the wall time of that point's stages run here, unchanged (benchmarks/cost_check.py's predict and
measure; that script checks the same on the CPU with cut-down points).

Two points are checked, chosen from the gpu presets of --experiments by the dry run's own estimate
(the assumed MFU, no calibration): the plain point (one loop) and the looped point with the largest
estimate at or under --max-s. Each is reported with the estimate at the assumed MFU and, when
--calibration names the GPU check's cost_calibration.json, at the calibrated MFU; the dry run does
not count compiling or the process's start, so those show as the measured excess. OUT/parts/
cost_check.json is rewritten after each point (a part stopped by its timeout keeps the first).

--dry-run: the same selection, then cost_check's two toy capacity points timed on the CPU instead.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from cost_check import measure, points, predict
from gpu_check import Part

from synthlab.sweeps import cost


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder of the results")
    parser.add_argument("--dry-run", action="store_true", help="toy points on the CPU (default: off)")
    parser.add_argument(
        "--experiments",
        default="reach,scaling",
        help="experiments whose gpu points are candidates (default reach,scaling)",
    )
    parser.add_argument("--max-s", type=float, default=20.0, help="largest estimate of a chosen point (default 20)")
    parser.add_argument(
        "--calibration", type=Path, default=None, help="the GPU check's cost_calibration.json (default: none)"
    )
    return parser.parse_args()


def choose(names: list[str], max_s: float) -> list[tuple[str, object]]:
    """(label, PointConfig) of the plain and the looped gpu-preset point with the largest estimate <= max_s."""
    from synthlab.sweeps import experiments, lab_runner

    best: dict[bool, tuple[float, str, object]] = {}
    for name in names:
        for p in experiments.load(name).points("gpu"):
            point = lab_runner.parse(p.config)
            if {"gate", "ouroboros"} & set(point.stages):  # stages the predict/measure pair does not time apart
                continue
            seconds = cost.gpu_cost(point, exact=True)["gpu_h"] * 3600
            looped = point.model.loops > 1
            if seconds <= max_s and seconds > best.get(looped, (0.0,))[0]:
                label = f"{name} " + " ".join(f"{k}={v}" for k, v in p.factors.items())
                best[looped] = (seconds, label, point)
    return [(best[k][1], best[k][2]) for k in (False, True) if k in best]


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    part = Part(args.out, "cost_check", args.dry_run)
    rates = cost.host_rates(1 if args.dry_run else 3)
    cost.use_host_rates(rates)
    chosen = choose(args.experiments.split(","), args.max_s)
    part.record("chosen", [label for label, _ in chosen])
    if args.dry_run:
        chosen = points(quick=True)
    calibration = None
    if args.calibration is not None and args.calibration.is_file() and not args.dry_run:
        calibration = cost.load_calibration(args.calibration)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, point in chosen:
            assumed = predict(point)
            calibrated = None
            if calibration is not None:
                with cost.measured(calibration, rates):
                    calibrated = predict(point)
            measured = measure(point, Path(tmp) / "cache", Path(tmp) / f"point{len(rows)}")
            rows.append(
                {
                    "point": label,
                    "predicted_assumed": assumed,
                    "predicted_calibrated": calibrated,
                    "measured": measured,
                    "ratio_assumed": measured["total_s"] / assumed["total_s"],
                    "ratio_calibrated": None if calibrated is None else measured["total_s"] / calibrated["total_s"],
                }
            )
            part.record("points", rows)
    part.data["done"] = True
    part.save()


if __name__ == "__main__":
    main()
