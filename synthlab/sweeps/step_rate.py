"""A point's training time on this CPU, the estimate `synthlab sweep NAME --dry-run` prints for a
point still to run: its optimizer steps times the seconds per step of its training shape (the
model, the rows of a batch, the objective and the optimizer's settings), from the sweep's finished
runs of the same shape where there are any, else timed here: a few steps of the lab's own training
step (`engine.step` over `objectives.step_losses`, one torch thread) on synthetic rows of the
shape, once per shape in a process, in CPU seconds of the training thread, over the share of a
core each of the sweep's --jobs would get beside the work running now. Also which points would repay `train.compile`.

Timed, not derived from FLOPs: small models are bound by per-operation overhead, not arithmetic,
and shapes of equal FLOPs differ (topology's confirm preset: its seven models have equal FLOPs);
a FLOP rate ran about 2x short under load. The load is the estimate's largest uncertainty: one
shape of that preset trained at 77 ms a step and, an hour later beside more work, 189 ms.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from synthlab import serialize
from synthlab.data.datasets import Batcher, Examples
from synthlab.models import build_model
from synthlab.sweeps.cost import positions
from synthlab.training import engine
from synthlab.training.distributed import World, share
from synthlab.training.objectives import model_forward, step_losses, to_device
from synthlab.training.run_folders import autocast
from synthlab.training.trainer import build_optimizer, lr_schedule

TIMED_S = 1.5  # wall seconds of steps timed per shape, after one warm-up step
MIN_STEPS = 3
# by training shape, timed in this process: (CPU seconds of a step, cores the other work kept busy)
_TIMED: dict[str, tuple[float, float]] = {}

# train.compile on this CPU (benchmarks/bench_compile.py, one thread, beside two training jobs):
# the first step of a shape in a process with an empty inductor cache (cold: 94 s at mano-3x1,
# 59 s at calib64-L1), the same with the cache on disk (warm: 4.2 s, 8.6 s; every later run of the
# shape on this machine) and the compiled step's speed over eager (1.05x, 1.17x). The longer times
# and the smaller speedup: a point named repays compiling at either shape.
COMPILE_COLD_S = 94.0
COMPILE_WARM_S = 8.6
COMPILE_SPEEDUP = 1.05


def training_shape(point) -> str:
    """What sets the time of a training step of a PointConfig (not its length, seed or rates)."""
    train = point.train
    _, seq = positions(point)
    pack = train.batch.pack if train.batch.pack is not None else point.spec.pack
    record = point.spec.shape(point.data).tokens_per_record if pack else None
    return json.dumps(
        {
            "model": serialize.to_dict(point.model),
            "rows": [train.batch.batch_size, seq, pack, None if record is None else round(record)],
            "loss": train.loss,
            "grad_accum": train.batch.grad_accum,
            "clip": train.optim.grad_clip > 0,
            "optimizer_impl": train.optim.optimizer_impl,
            "cpu_bf16": train.system.cpu_bf16,
            "activation_checkpointing": train.system.activation_checkpointing,
            "compile": train.system.compile,
        },
        sort_keys=True,
    )


def estimate_seconds(point, *, finished: list[dict[str, Any]], jobs: int = 1, trained: bool = False) -> float:
    """Wall time of a PointConfig: its training (its steps at the seconds per step of the sweep's
    finished runs of the same training shape; without any, at the CPU seconds per step timed here
    (`seconds_per_step`, with the sweep's `jobs` one-thread jobs at a time), times how much slower
    the sweep's finished runs of other shapes trained than their shapes time here (the load they
    share the machine with; 1 without any); a point that compiles at the measured COMPILE_SPEEDUP,
    plus a cold compile), plus the time finished runs of its stages and model spent past training
    (`after_training_seconds`); only the latter with `trained` (an earlier point trains its model).
    `finished`: the rows, each with its PointConfig as "point" where the grid still has it (as
    `plan` passes them); a row whose model another row trained counts once for the step rate."""
    after = after_training_seconds(point, finished)
    if trained:
        return after
    runs = [
        r
        for r in finished
        if r.get("point") is not None
        and str(r.get("model_reused")) != "1"
        and r.get("train_s")
        and r.get("train_steps")
    ]
    shape, (steps, _) = training_shape(point), positions(point)
    return _training_seconds(point, shape, steps, runs, jobs) + after


def after_training_seconds(point, finished: list[dict[str, Any]]) -> float:
    """The mean wall seconds past training (evaluation, an OUROBOROS stage) of the finished rows
    whose point has the same stages and model: a row that trained its model, its wall time less
    its training; one that reused a model, all of it. 0 without any (the estimate is then training
    only)."""
    alike = [
        float(r["wall_s"]) if str(r.get("model_reused")) == "1" else max(0.0, float(r["wall_s"]) - float(r["train_s"]))
        for r in finished
        if r.get("point") is not None
        and r.get("wall_s")
        and (r.get("train_s") or str(r.get("model_reused")) == "1")
        and r["point"].stages == point.stages
        and r["point"].model == point.model
    ]
    return sum(alike) / len(alike) if alike else 0.0


def _training_seconds(point, shape: str, steps: int, runs: list[dict[str, Any]], jobs: int) -> float:
    same = [r for r in runs if training_shape(r["point"]) == shape]
    if same:
        return steps * sum(float(r["train_s"]) for r in same) / sum(float(r["train_steps"]) for r in same)
    slower = (
        sum(float(r["train_s"]) for r in runs)
        / sum(float(r["train_steps"]) * seconds_per_step(r["point"], jobs) for r in runs)
        if runs
        else 1.0
    )
    eager = steps * seconds_per_step(point, jobs) * slower
    return eager / COMPILE_SPEEDUP + COMPILE_COLD_S if point.train.system.compile else eager


def seconds_per_step(point, jobs: int = 1) -> float:
    """Wall seconds per step of the point's shape for a job started now, one of `jobs` at a time,
    timed here once per shape: the CPU seconds of the training thread per step (the step's cost on
    this CPU as loaded now) over the share of a core such a job would get beside the work running
    now and the sweep's other jobs (`core_share`)."""
    shape = training_shape(point)
    if shape not in _TIMED:
        _TIMED[shape] = _time_steps(point)
    cpu_s, others = _TIMED[shape]
    return cpu_s / core_share(others, jobs)


def timed_shapes() -> int:
    """How many training shapes this process has timed."""
    return len(_TIMED)


def synthetic_batcher(point, seq: int, rows: int) -> Batcher:
    """Batches of the point's row shape: random tokens, examples of the task's mean length packed
    end to end (with their document masks), or one full-length example per row."""
    train, model = point.train, point.model
    pack = train.batch.pack if train.batch.pack is not None else point.spec.pack
    length = min(seq + 1, max(2, round(point.spec.shape(point.data).tokens_per_record))) if pack else seq + 1
    n = rows * (seq // (length - 1) + 1) if pack else rows
    rng = np.random.default_rng(0)
    examples = Examples(
        tokens=rng.integers(1, model.vocab_size, n * length),
        target=np.arange(n * length) % length > 0,
        offsets=np.arange(0, n * length + 1, length),
    )
    return Batcher(examples, batch_size=train.batch.batch_size, seq_len=seq, pack=pack, pad_id=0, seed=0)


def _time_steps(point) -> tuple[float, float]:
    """(CPU seconds of the training thread per step, cores the other work kept busy meanwhile)."""
    _, seq = positions(point)
    train = point.train.replaced(compile=False)  # timed eager (compiling takes a minute or more)
    model = build_model(point.model).train()
    state = engine.TrainState(model, build_optimizer(model, train), lr_schedule(train, 10**6))
    forward = model_forward(model, False, train.system.activation_checkpointing)
    generator, cpu = torch.Generator().manual_seed(0), torch.device("cpu")
    batcher = synthetic_batcher(point, seq, train.batch.batch_size * (MIN_STEPS + 1))

    def step() -> None:  # the trainer's step (synthlab.training.trainer._loop) without its logging
        rows = batcher.next_batch()
        total = max(int(rows.loss_mask.sum()), 1)

        def micro(i: int):
            part = share(rows, i, train.batch.grad_accum)
            inputs, targets, mask, doc_ids = to_device(part, cpu)
            with autocast(cpu, train.system.cpu_bf16):
                objective, _ = step_losses(forward, inputs, targets, mask, doc_ids, train, generator, False)
            weight = int(part.loss_mask.sum()) / total
            return objective * weight, (objective.detach() * weight,)

        engine.step(state, train.batch.grad_accum, micro, world=World(), grad_clip=train.optim.grad_clip, check=False)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the sweep's jobs train on a busy machine
    try:
        step()  # warm-up: allocations, the optimizer's state
        n, start, thread, busy = 0, time.perf_counter(), time.thread_time(), _busy()
        while n < MIN_STEPS or time.perf_counter() - start < TIMED_S:
            step()
            n += 1
        return (time.thread_time() - thread) / n, busy_elsewhere(busy, _busy(), time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)


def _busy() -> tuple[float, float] | None:
    """(seconds the cores have spent on processes, this process's CPU seconds), or None where
    /proc/stat is not there to say."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system = (int(f) for f in fields[1:4])
    own = resource.getrusage(resource.RUSAGE_SELF)
    return (user + nice + system) / os.sysconf("SC_CLK_TCK"), own.ru_utime + own.ru_stime


def busy_elsewhere(before, after, seconds: float) -> float:
    """The cores other processes kept busy between two `_busy` readings (0 where /proc/stat is not
    there to say). Niced work counts as much as any: where the scheduler groups processes by login
    group (autogroup), nice does not make them yield to a job."""
    if before is None or after is None or seconds <= 0:
        return 0.0
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / seconds


def core_share(others: float, jobs: int = 1) -> float:
    """The share of a core each of `jobs` one-thread jobs gets beside other work that keeps
    `others` cores busy: all of one where a core is left for every job, else an equal share with
    each busy core's worth of work."""
    return min(1.0, len(os.sched_getaffinity(0)) / (others + jobs))


def compile_repays(rows: list[dict[str, Any]], points: dict[str, Any]) -> list[str]:
    """Point ids of the plan's rows still to run whose estimated time saved by train.compile
    (COMPILE_SPEEDUP) exceeds its compile time: cold for the first point of a training shape,
    warm (the inductor cache on disk) for the later ones. `points`: PointConfig by point id."""
    repaid, compiled = [], set()
    for row in rows:
        point = points.get(row["point_id"])
        if point is None or point.train.system.compile or row.get("cost") != "estimated":
            continue
        shape = training_shape(point)
        cost = COMPILE_WARM_S if shape in compiled else COMPILE_COLD_S
        compiled.add(shape)
        if float(row["cost_s"]) * (1 - 1 / COMPILE_SPEEDUP) > cost:
            repaid.append(row["point_id"])
    return repaid
