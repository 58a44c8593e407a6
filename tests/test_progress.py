"""Progress off a terminal: plain, periodic lines (never carriage returns); on a terminal a bar."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synthlab.progress import Progress
from synthlab_generators import TASKS, write_dataset


def test_off_a_terminal_lines_come_at_the_interval_and_at_close():
    out = io.StringIO()
    bar = Progress(10, initial=2, desc="train mano", unit="step", interval=0.0, stream=out)
    for step in range(3, 11):
        bar.set_postfix(loss=f"{1 / step:.4f}")
        bar.update(1)
    bar.close()
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 8  # one per update, none more on close
    assert lines[0].startswith("train mano: step 3/10 (30%) loss=0.3333 elapsed") and "eta" in lines[0]
    assert lines[-1].startswith("train mano: step 10/10 (100%) loss=0.1000") and "eta" not in lines[-1]

    quiet = io.StringIO()
    bar = Progress(1000, stream=quiet, interval=3600)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert quiet.getvalue().count("\n") == 1 and "1000/1000" in quiet.getvalue()  # only the last line

    off = io.StringIO()
    bar = Progress(5, enabled=False, stream=off, interval=0.0)
    bar.update(5)
    bar.close()
    assert off.getvalue() == ""


@pytest.mark.slow  # a training in a fresh interpreter, end to end; the interval rule is tested above in process
def test_a_training_through_a_pipe_writes_few_plain_lines(tmp_path):
    spec = TASKS["mano"]
    data = write_dataset(spec, spec.params_cls(L=2, n_train=200, n_test=20, mod=5), 0, tmp_path / "mano")
    exe = Path(sys.executable).parent / "synthlab"
    args = [
        exe,
        "train",
        "--task",
        "mano",
        "--data",
        data,
        "--out",
        tmp_path / "run",
        "--steps",
        200,
        "--d-model",
        16,
        "--n-heads",
        2,
        "--n-layers",
        1,
        "--max-seq-len",
        32,
        "--batch-size",
        4,
        "--threads",
        1,
    ]
    start = time.monotonic()
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "step " in line and "/200" in line]
    # at most one line per 30 s interval plus the last one, whatever the machine's speed
    assert 1 <= len(lines) <= 2 + wall / 30 and "step 200/200 (100%) loss=" in lines[-1]
    assert len(proc.stderr.splitlines()) <= 4 + wall / 30


def test_gen_through_a_pipe_writes_one_line(tmp_path):
    exe = Path(sys.executable).parent / "synthlab"
    args = [exe, "gen", "mano", "--L", "2", "--n-train", "300", "--n-test", "20", "--out", tmp_path / "d"]
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and re.match(r"gen mano: record (\d+)/\1 \(100%\)", proc.stderr.splitlines()[-1])
