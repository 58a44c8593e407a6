"""Data-parallel training (synthlab.training.distributed) on CPU with gloo, 2 processes: the same losses as
one process on the same global batch, resume from a 2-process run with 1 process, and a process
that dies stops the others with one error line and nothing half written."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_train import datasets, losses_of, run_config  # noqa: F401  (datasets is a fixture)

from synthlab.data.datasets import Rows
from synthlab.errors import SynthlabError
from synthlab.training import distributed
from synthlab.training.distributed import World, check_split, share
from synthlab.training.run_folders import load_checkpoint
from synthlab.training.trainer import train

STEPS = 20
# the exit gate gets no gradient under the `last` loss: the trainer must freeze it for DDP
MODEL = {"loops": 2, "exit_gate": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(rank, size, jobs, results):
    """A training process as torchrun starts one, running jobs (port, run_dir, run, event_at, event)
    until None; at batch `event_at` rank 0 gets SIGTERM (event "stop") or rank 1 dies ("die")."""
    torch.set_num_threads(1)
    batcher = train.__globals__["Batcher"]
    next_batch, calls = batcher.next_batch, [0]

    def counted(self):
        calls[0] += 1
        if calls[0] == event_at and (event, rank) in (("stop", 0), ("die", 1)):
            os.kill(os.getpid(), signal.SIGTERM if event == "stop" else signal.SIGKILL)
        return next_batch(self)

    batcher.next_batch = counted
    while (job := jobs.get()) is not None:
        port, run_dir, run, event_at, event = job
        os.environ.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        calls[0] = 0
        try:
            train(run_dir, run, progress=False)
            results.put((rank, ""))
        except SynthlabError as err:
            results.put((rank, str(err)))
        except Exception as err:  # the test fails with it instead of waiting
            results.put((rank, f"{type(err).__name__}: {err}"))


@pytest.fixture(scope="module")
def processes():
    """run(run_dir, run, event_at, event) -> [(rank, error line or "")] of the ranks that finished.

    Two processes serve the whole module (starting one costs seconds); a job that kills one must
    be the module's last."""
    ctx = multiprocessing.get_context("spawn")
    jobs, results = [ctx.Queue() for _ in range(2)], ctx.Queue()
    procs = [ctx.Process(target=_serve, args=(rank, 2, jobs[rank], results)) for rank in range(2)]
    for p in procs:
        p.start()

    def run(run_dir, run, event_at=0, event=""):
        port = _free_port()
        for q in jobs:
            q.put((port, run_dir, run, event_at, event))
        got, deadline = [], time.monotonic() + 300
        while len(got) < (1 if event == "die" else 2):
            try:
                got.append(results.get(timeout=1))
            except queue.Empty:
                gone = [r for r, p in enumerate(procs) if not p.is_alive() and (r, event) != (1, "die")]
                assert not gone and time.monotonic() < deadline, f"training process {gone} died or hangs"
        return sorted(got)

    yield run, procs
    for q, p in zip(jobs, procs):
        if p.is_alive():
            q.put(None)
        p.join(30)
        if p.is_alive():
            p.kill()


@pytest.mark.parametrize("parts", [1, 2, 4])
def test_shares_are_contiguous_and_cover_the_batch(parts):
    ids = np.arange(8 * 3).reshape(8, 3)
    rows = Rows(ids, ids + 1, ids % 2 == 0, ids // 3)
    pieces = [share(rows, i, parts) for i in range(parts)]
    for field in ("inputs", "targets", "loss_mask", "doc_ids"):
        assert np.array_equal(np.concatenate([getattr(p, field) for p in pieces]), getattr(rows, field))


def test_a_batch_that_does_not_split_is_one_line():
    check_split(8, World(1, 2), 4)
    with pytest.raises(SynthlabError, match="batch_size 12 does not split into 2 processes x 4 micro-batches"):
        check_split(12, World(0, 2), 4)


def test_python_dash_m_runs_the_cli():  # what `torchrun ... -m synthlab train` starts
    out = subprocess.run([sys.executable, "-m", "synthlab", "version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, datasets):
    """The reference: one process, the whole batch at once."""
    run_dir = tmp_path_factory.mktemp("one") / "run"
    train(run_dir, run_config(datasets("mano"), "mano", MODEL, steps=STEPS, device="cpu"), progress=False)
    return run_dir


def assert_same_curve(run_dir, reference):
    got, want = losses_of(run_dir), losses_of(reference)
    assert len(got) == len(want) == STEPS
    for a, b in zip(got, want):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


@pytest.mark.slow  # two spawned training processes; in one process, test_grad_accum.py
def test_two_processes_follow_the_one_process_curve(tmp_path, datasets, processes, one_process):
    run_dir = tmp_path / "two"
    run = run_config(datasets("mano"), "mano", MODEL, steps=STEPS, device="cpu", grad_accum=2)
    assert processes[0](run_dir, run) == [(0, ""), (1, "")]
    assert_same_curve(run_dir, one_process)
    ref, got = load_checkpoint(one_process)["model"], load_checkpoint(run_dir)["model"]
    assert all(torch.allclose(ref[k], got[k], rtol=1e-4, atol=1e-6) for k in ref)


@pytest.mark.slow  # a torchrun job of two processes, then a resume
def test_a_two_process_run_resumes_in_one_process(tmp_path, datasets, processes, one_process):
    run_dir = tmp_path / "two"
    run = run_config(datasets("mano"), "mano", MODEL, steps=STEPS, device="cpu", checkpoint_every=100)
    # rank 0 alone gets the signal
    assert processes[0](run_dir, run, event_at=10, event="stop") == [(0, ""), (1, "")]
    # the processes poll for a stop every STOP_POLL steps (no host sync per step): both stopped at
    # the first poll after the signal; rank 0 wrote its checkpoint
    assert load_checkpoint(run_dir)["step"] == math.ceil(10 / distributed.STOP_POLL) * distributed.STOP_POLL < STEPS
    assert not (run_dir / "summary.json").exists()
    result = train(run_dir, None, progress=False)
    assert (result.step, result.interrupted) == (STEPS, False)
    assert_same_curve(run_dir, one_process)


@pytest.mark.slow  # a torchrun job of two processes
def test_a_stop_rule_rank_0_reads_stops_every_process_at_its_probe(tmp_path, datasets, processes):
    run_dir = tmp_path / "two"
    # rank 0 alone scores the probe; both processes end at its step
    run = run_config(
        datasets("mano"), "mano", MODEL, steps=STEPS, device="cpu", eval_every=5, stop_when="train_acc_l1 >= 0"
    )
    assert processes[0](run_dir, run) == [(0, ""), (1, "")]
    assert json.loads((run_dir / "summary.json").read_text())["stopped_at_step"] == 5
    assert load_checkpoint(run_dir)["step"] == 5 and len(losses_of(run_dir)) == 5


@pytest.mark.slow  # a torchrun job of two processes
def test_a_killed_process_stops_the_others_with_one_line(tmp_path, datasets, processes):
    run, procs = processes
    run_dir = tmp_path / "two"
    [(rank, line)] = run(
        run_dir,
        run_config(datasets("mano"), "mano", steps=STEPS, device="cpu", checkpoint_every=2),
        event_at=7,
        event="die",
    )  # rank 1 dies in step 7
    procs[1].join(30)
    assert procs[1].exitcode == -signal.SIGKILL
    assert rank == 0 and "\n" not in line and "lost contact with the others at step" in line
    step = load_checkpoint(run_dir)["step"]
    assert step in (4, 6)  # the last checkpoint before the death, whole
    # no temporary file left; the run folder's lock (.lock, .lock.pid) stays, freed
    assert all(
        p.name in (".lock", ".lock.pid") or not p.name.startswith(".") and "tmp" not in p.name
        for p in run_dir.iterdir()
    )
    assert [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]
    result = train(run_dir, None, progress=False)  # and the run goes on in one process
    assert (result.step, result.interrupted) == (STEPS, False)


@pytest.mark.slow
def test_the_readme_torchrun_lines_run_as_written(tmp_path):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Running bigger", 1)[1].split("```", 2)[1]
    lines = [
        line
        for line in section.splitlines()
        if line.startswith(("synthlab gen mano", "torchrun --nproc-per-node 2 -m synthlab train "))
    ]
    assert len(lines) == 2
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for line in lines:
        out = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("done:") == 1  # rank 0 alone reports
    assert (tmp_path / "runs" / "mano-ddp" / "summary.json").is_file()


def _processes_naming(text: str) -> list[int]:
    """Pids of the live processes whose command line contains `text` (zombies left out)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        if text in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow  # a torchrun job of two processes, started by a worker that is then killed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_sweep_worker_takes_its_torchrun_job_with_it(tmp_path, datasets):
    """A sweep worker that dies (kill -9: its driver ended) leaves no torchrun agent and no rank
    training on: the agent ends with the worker, each rank with the agent."""
    from synthlab import serialize

    run_dir = tmp_path / "run"
    run = run_config(datasets("mano"), "mano", MODEL, steps=10**6, device="cpu", checkpoint_every=10**6)
    (tmp_path / "run.json").write_text(json.dumps(serialize.to_dict(run)))
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, sys; from pathlib import Path; from synthlab.sweeps import lab_runner as point_runner; from synthlab import serialize; "
            "from synthlab.training.trainer import RunConfig; "
            "run = serialize.from_dict(RunConfig, json.loads(Path(sys.argv[1]).read_text())); "
            "point_runner._torchrun_train(Path(sys.argv[2]), run, 2)",
            str(tmp_path / "run.json"),
            str(run_dir),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "metrics.jsonl").exists():  # both ranks are training
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        assert len(_processes_naming(str(run_dir))) >= 3  # the agent and two ranks
        worker.kill()
        worker.wait()
        deadline = time.monotonic() + 30
        while (left := _processes_naming(str(run_dir))) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == []
    finally:
        worker.kill()
        for pid in _processes_naming(str(run_dir)):
            os.kill(pid, signal.SIGKILL)
