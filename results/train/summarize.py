"""Print the tables of results/train/README.md from the collected run files.

.venv/bin/python results/train/summarize.py
"""

import json
from pathlib import Path

ROOT = Path(__file__).parent


def load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def train_seconds(run: Path) -> float:
    """Training wall time: each metrics line's new tokens over its measured tokens/s."""
    seconds, before = 0.0, 0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        seconds += (record["tokens"] - before) / record["tokens_per_s"]
        before = record["tokens"]
    return seconds


def label(config: dict) -> str:
    m = config["model"]
    return f"{m['n_layers']}x{m['loops']} d={m['d_model']}"


print(
    "| bioS run | model | N | exposures | steps | train min | final train loss | p1 | p2 | bits | max bits | P | bits/param | name / attribute terms |"
)
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for run in sorted((ROOT / "bios_capacity").glob("*/")):
    config, summary, cap = load(run / "config.json"), load(run / "summary.json"), load(run / "capacity.json")
    print(
        f"| {run.name} | {label(config)} | {cap['n_people']} | {config['train']['exposures']:g} | {summary['step']} "
        f"| {train_seconds(run) / 60:.1f} "
        f"| {summary['loss']:.3f} | {cap['p1']:.2f} | {cap['p2']:.2f} | {cap['bits']:,.0f} | {cap['max_bits']:,.0f} "
        f"| {cap['params']:,} | {cap['bits_per_param']:.3f} | {cap['bits_name']:,.0f} / {cap['bits_attributes']:,.0f} |"
    )

print()
print("| bioS run | per attribute: loss nats (bits) | biography recall accuracy per attribute |")
print("|---|---|---|")
for run in sorted((ROOT / "bios_capacity").glob("*/")):
    cap = load(run / "capacity.json")
    ev = load(next((run / "eval").glob("steps*.json")))
    attrs = ", ".join(f"{a} {r['loss']:.2f} ({r['bits']:,.0f})" for a, r in cap["per_attribute"].items())
    recall = ", ".join(f"{a} {r['accuracy']:.2f}" for a, r in ev["biography_recall"].items())
    print(f"| {run.name} | {attrs} | {recall} |")

print()
print(
    "| Mano run | model | data | seed | steps | train min | final train loss per step | eval file | accuracy per step (test, l = L) |"
)
print("|---|---|---|---|---|---|---|---|---|")
for run in sorted((ROOT / "mano").glob("*/")):
    config, summary = load(run / "config.json"), load(run / "summary.json")
    for ev_path in sorted((run / "eval").glob("*.json")):
        ev = load(ev_path)
        extra = (
            f"; exit {ev['exit_rule']}: {ev['exit_accuracy']:.3f} at mean step {ev['mean_exit_step']:.2f}"
            if "exit_rule" in ev
            else ""
        )
        print(
            f"| {run.name} | {label(config)} | {Path(config['train']['data']).name} | {config['train']['seed']} "
            f"| {summary['step']} | {train_seconds(run) / 60:.1f} "
            f"| {' '.join(f'{v:.3f}' for v in summary['loss_per_step'])} | {ev_path.name} "
            f"| {' '.join(f'{a:.3f}' for a in ev['accuracy_per_step'])}{extra} |"
        )
