"""OUROBOROS across processes (torchrun, gloo, 2 processes on the CPU) on the tiny random Qwen2 of
test_ouroboros: data-parallel training with exact per-document means, FSDP (the base sharded, the same
losses, resume into it), evaluation split over the processes with the one-process numbers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from test_ouroboros import checkpoint, one_thread  # noqa: E402,F401  (fixtures)

from synthlab.errors import SynthlabError  # noqa: E402
from synthlab.ouroboros import OuroborosConfig  # noqa: E402
from synthlab.ouroboros.train import OuroborosTrainConfig  # noqa: E402
from synthlab.training.distributed import World, check_shardable  # noqa: E402

TINY = [
    "--seq-len",
    "16",
    "--micro-batch-size",
    "4",
    "--grad-accum",
    "2",
    "--depths",
    "1,2,3",
    "--max-steps",
    "4",
    "--lr",
    "1e-2",
    "--device",
    "cpu",
]


def _cli(*args, code=0):
    from typer.testing import CliRunner

    from synthlab.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result


def _torchrun(*args) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "synthlab",
            *map(str, args),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(folder / "trainable.safetensors")


def _same_weights(a, b):
    # AdamW divides each gradient by its own scale: rounding in near-zero gradients moves a weight
    # by up to ~1e-5 here (lr 1e-2, a few steps; measured 1.7e-5 at most)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-4) for k in a)


@pytest.mark.slow  # a torchrun job of two processes loading transformers
def test_two_processes_train_padded_documents_as_one(checkpoint, tmp_path):
    # `torchrun --nproc-per-node 2 -m synthlab ouroboros train --per-document`: documents of 1 to 4
    # sentences padded to 40 tokens, so the two halves of a micro-batch hold different numbers of
    # targets; each process's mean weighted by its share gives the one-process loss and step
    from test_ouroboros import _corpus_docs

    docs = [" ".join(d.split(" . ")[: 1 + i % 4]) + " ." for i, d in enumerate(_corpus_docs(40, 2))]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    args = [
        "ouroboros",
        "train",
        "--base",
        checkpoint,
        "--corpus",
        tmp_path / "docs.jsonl",
        "--variants",
        "controller",
        "--steps",
        "4",
        "--per-document",
        *TINY,
        "--seq-len",
        "40",
    ]
    _cli(*args, "--out", tmp_path / "one")
    _torchrun(*args, "--out", tmp_path / "two")
    logs = [pd.read_csv(tmp_path / run / "controller" / "train_log.csv") for run in ("one", "two")]
    assert list(logs[0]["depth"]) == list(logs[1]["depth"])
    assert logs[1]["loss"].tolist() == pytest.approx(logs[0]["loss"].tolist(), rel=1e-5)
    _same_weights(*(_weights(tmp_path / run / "controller") for run in ("one", "two")))


@pytest.mark.slow  # torchrun jobs of two processes
def test_fsdp_shards_the_base_trains_as_one_process_and_resumes_into_it(checkpoint, tmp_path, monkeypatch):
    # one process to the end, and one stopped after its step-2 checkpoint; the stopped run resumed
    # by 2 processes with the base sharded by FSDP ends where the whole run did
    import synthlab.ouroboros.runs as runs

    args = [
        "ouroboros",
        "train",
        "--base",
        checkpoint,
        "--corpus",
        checkpoint / "train.jsonl",
        "--variants",
        "controller",
        "--steps",
        "6",
        "--checkpoint-every",
        "2",
        *TINY,
    ]
    _cli(*args, "--out", tmp_path / "whole")
    real_write = runs.atomic_write

    def stop_after_first_state(path, write):
        real_write(path, write)
        if path.name == runs.STATE:
            raise KeyboardInterrupt

    monkeypatch.setattr(runs, "atomic_write", stop_after_first_state)
    _cli(*args, "--out", tmp_path / "sharded", code=130)  # interrupted
    monkeypatch.undo()
    assert torch.load(tmp_path / "sharded" / "controller" / runs.STATE, weights_only=True)["step"] == 2
    out = _torchrun(*args, "--out", tmp_path / "sharded", "--fsdp")
    held, total = (
        int(x.replace(",", "")) for x in re.search(r"FSDP: at most ([\d,]+) of the base's ([\d,]+)", out).groups()
    )
    assert total == 57_120 and held <= total / 2 + 64  # each process half of every tensor (dim 0 padded to even)
    logs = [pd.read_csv(tmp_path / run / "controller" / "train_log.csv") for run in ("whole", "sharded")]
    assert list(logs[0]["depth"]) == list(logs[1]["depth"]) and len(logs[1]) == 6
    assert logs[1]["loss"].tolist() == pytest.approx(logs[0]["loss"].tolist(), rel=1e-5)
    _same_weights(*(_weights(tmp_path / run / "controller") for run in ("whole", "sharded")))
    assert not (tmp_path / "sharded" / "controller" / runs.STATE).exists()


@pytest.mark.slow  # a torchrun job of two processes
def test_two_processes_evaluate_as_one(checkpoint, tmp_path):
    # each process its half of the rows (3 held out: the second half filled up with a PAD row), the
    # sums added up: the one-process table; with the base sharded by FSDP as well
    _cli(
        "ouroboros",
        "train",
        "--base",
        checkpoint,
        "--corpus",
        checkpoint / "train.jsonl",
        "--variants",
        "static",
        "--steps",
        "2",
        *TINY,
        "--out",
        tmp_path / "run",
    )
    evaluate = [
        "ouroboros",
        "eval",
        tmp_path / "run",
        "--depths",
        "1,3",
        "--max-sequences",
        "3",
        "--batch-size",
        "2",
        "--device",
        "cpu",
    ]
    _cli(*evaluate)
    tables = [pd.read_csv(tmp_path / "run" / "results.csv")]
    for extra in ([], ["--fsdp"]):
        out = _torchrun(*evaluate, *extra)
        assert out.count("-> ") == 1  # one process reports
        tables.append(pd.read_csv(tmp_path / "run" / "results.csv"))
    assert set(tables[0]["sequences"]) == {3}
    for table in tables[1:]:
        pd.testing.assert_frame_equal(table.drop(columns="loss"), tables[0].drop(columns="loss"))
        assert table["loss"].tolist() == pytest.approx(tables[0]["loss"].tolist(), rel=1e-6)


def test_fsdp_without_processes_to_shard_over_is_one_line(checkpoint, tmp_path):
    from synthlab.ouroboros.runs import eval_run, train_run

    config = OuroborosTrainConfig(steps=1, seq_len=16, micro_batch_size=4, grad_accum=1, depths=(1,))
    with pytest.raises(SynthlabError, match=r"FSDP shards the model across processes and this is the only one"):
        train_run(
            str(checkpoint),
            str(checkpoint / "train.jsonl"),
            tmp_path / "run",
            ["controller"],
            OuroborosConfig(max_steps=4),
            config,
            progress=False,
            fsdp=True,
        )
    assert not (tmp_path / "run").exists()
    with pytest.raises(SynthlabError, match="no run.json"):  # eval checks its run before it starts
        eval_run(tmp_path / "run", [1], fsdp=True)
    with pytest.raises(SynthlabError, match=r"^FSDP runs on cpu \(gloo\) or cuda \(NCCL\), not on mps$"):
        check_shardable(World(0, 2), torch.device("mps"))


@pytest.mark.slow
def test_the_readme_ouroboros_torchrun_lines_run_as_written(tmp_path):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = readme.split("## Running bigger", 1)[1].split("```")
    gen = [line for line in blocks[1].splitlines() if line.startswith("synthlab gen mano")]
    lines = gen + [line for line in blocks[3].splitlines()[1:] if line]
    assert len(lines) == 5 and lines[-1].startswith("torchrun --nproc-per-node 2 -m synthlab ouroboros eval")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    outs = []
    for line in lines:
        done = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(done.stdout)
    assert "FSDP: at most 398,656 of the base's 797,312 parameters on one process" in outs[3]
    table = pd.read_csv(tmp_path / "runs" / "ouro-fsdp" / "results.csv")
    assert set(table["variant"]) == {"controller", "truncated", "base"} and set(table["depth"]) == {1, 2, 4}


def test_under_fsdp_rank_0_reads_the_base_once_and_the_others_never(checkpoint, monkeypatch):
    """A 70B base on 8 ranks needed ~1 TB of host memory (every rank read the whole base, once per
    variant): now rank 0 reads it once per run and builds each variant's base on the same tensors;
    the other ranks build theirs on the meta device (their shards come from rank 0)."""
    import synthlab.ouroboros.runs as runs
    from synthlab.training.distributed import World

    reads = []
    real_load = runs.load_base
    monkeypatch.setattr(runs, "load_base", lambda *a, **k: reads.append(1) or real_load(*a, **k))
    cpu = torch.device("cpu")
    other = runs._Base(str(checkpoint), cpu, None, "sdpa", True, World(rank=1, size=2))
    assert all(p.is_meta for p in other.get().parameters()) and not reads
    main = runs._Base(str(checkpoint), cpu, None, "sdpa", True, World(rank=0, size=2))
    first, second = main.get(), main.get()
    assert len(reads) == 1 and first is not second
    pointers = [{p.data_ptr() for p in base.parameters()} for base in (first, second)]
    assert pointers[0] == pointers[1]  # the same host tensors: one copy of the base in memory
    assert not any(p.is_meta for p in first.parameters()) and not any(b.is_meta for b in first.buffers())
