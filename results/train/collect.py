"""Copy the small, self-describing files of the runs behind results/train/ (no checkpoints, no data).

.venv/bin/python results/train/collect.py
"""

import shutil
from pathlib import Path

RUNS = {
    "bios_capacity": ["bios-plain-2x1", "bios-loop-2x4", "bios3k-plain-1x1", "bios3k-loop-1x4"],
    "mano": [
        "mano-base-1x1",
        "mano-loop-1x4",
        "manoL2-base-1x1",
        "manoL2-loop-1x4",
        "manoL2-base-1x1-seed1",
        "manoL2-loop-1x4-seed1",
    ],
}
FILES = ["config.json", "summary.json", "metrics.jsonl", "capacity.json"]

for group, names in RUNS.items():
    for name in names:
        src, dst = Path("runs") / name, Path("results/train") / group / name
        if not (src / "summary.json").is_file():
            print(f"skip {name}: not finished")
            continue
        dst.mkdir(parents=True, exist_ok=True)
        for f in FILES:
            if (src / f).is_file():
                shutil.copy2(src / f, dst / f)
        if (src / "eval").is_dir():
            shutil.copytree(src / "eval", dst / "eval", dirs_exist_ok=True)
        print(f"copied {name}")
