"""The lab's point runner: data (cached) -> train (resumable) -> [gate] -> eval / generate -> capacity;
or train -> export (as a Qwen2 checkpoint) -> ouroboros (C11 on that checkpoint, synthlab.hf.point).

A point runner is a module with the functions the sweep engine (synthlab.sweep) calls:
- `parse(config) -> point`: the resolved config dict of a grid point, checked and typed once
  (here: `synthlab.options.PointConfig`); the engine does this in the driver, before any work;
- `run_point(point, run_dir, *, cache_dir, nproc=0) -> dict`: do the work, return the row's
  metrics (columns: synthlab.results); nproc >= 1 trains under torchrun with that many processes;
- `estimate_seconds(point, *, finished) -> float` (optional): the cost `--dry-run` shows;
- `gpu_cost(point) -> dict` (optional): tokens, FLOPs, memory and hours on one GPU, the columns
  `--dry-run` of a gpu preset shows (synthlab.cost);
- `columns(point) -> list[str]` (optional): the columns its finished row fills (else it reruns).

The model is trained in `run_dir/model` (a synthlab.train run directory): an existing checkpoint
is resumed, a finished run is reused by every point that evaluates it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from synthlab.config import content_hash
from synthlab.cost import estimate_seconds, gpu_cost, size_metrics
from synthlab.errors import SynthlabError
from synthlab.files import cached_dir
from synthlab.options import PointConfig, parse_point
from synthlab.results import capacity_metrics, describe, eval_metrics, heldout_columns, train_metrics

__all__ = ["columns", "estimate_seconds", "gpu_cost", "parse", "run_point"]


def parse(config: dict[str, Any]) -> PointConfig:
    """The point's options, typed (raises SynthlabError naming the section and field)."""
    point = parse_point(config)
    if "ouroboros" not in point.stages:
        return point
    from synthlab.hf.export import qwen2_refusal
    from synthlab.hf.point import parse_section

    if "export" not in point.stages or "ouroboros" not in config:
        raise SynthlabError("the ouroboros stage needs the export stage and an [ouroboros] section")
    if qwen2_refusal(point.model):
        raise SynthlabError(f"model: {qwen2_refusal(point.model)} (the export stage needs it)")
    return dataclasses.replace(point, ouroboros=parse_section(config["ouroboros"]))


# the columns each stage fills in a point's row (training always runs)
_STAGE_COLUMNS = {"train": ("loss", "params"), "gate": ("gate_loss",), "eval": ("accuracy",), "heldout": ("eval_loss",),
                  "generate": ("accuracy",), "capacity": ("bits",), "export": (), "ouroboros": ("loss_base",)}


def _given_base(point: PointConfig) -> bool:
    """An ouroboros point on a Qwen2 checkpoint the user gives: no synthlab model is trained."""
    return point.ouroboros is not None and point.ouroboros.source.base is not None


def columns(point: PointConfig) -> list[str]:
    """The columns a finished row of `point` fills: a row missing one makes the sweep run it again."""
    if _given_base(point):
        return list(_STAGE_COLUMNS["ouroboros"])
    return list(dict.fromkeys(c for stage in ("train", *point.stages) for c in _STAGE_COLUMNS[stage]))


def dataset(point: PointConfig, cache_dir: Path) -> Path:
    """The point's dataset, generated once per (task, params, seed) into the cache."""
    from synthlab_generators import write_dataset

    key = {"task": point.task, **point.data_key, **point.spec.version_key()}
    return cached_dir(cache_dir, key, lambda tmp: write_dataset(point.spec, point.data, point.data_seed, tmp),
                      prefix=f"{point.task}-")


def train_model(point: PointConfig, data_dir: Path, model_dir: Path, nproc: int = 0) -> dict[str, Any]:
    """Train (or resume, or reuse) the point's model in model_dir; returns the training metrics."""
    from synthlab.runs import RunConfig

    def new_run():
        train = dataclasses.replace(point.train, data=str(Path(data_dir).resolve()))
        return RunConfig(point.model, train)

    reused = _train_or_resume(model_dir, new_run, nproc)
    return {**train_metrics(model_dir), "model_reused": int(reused)}


def train_gate(point: PointConfig, model_dir: Path, run_dir: Path, nproc: int = 0) -> tuple[Path, dict[str, Any]]:
    """Ouro stage II on the trained stage I model in model_dir; returns (its run dir, gate_* metrics).

    One stage II run per gate config, beside the stage I model (points that share both share it).
    """
    from synthlab.runs import load_run

    gate_dir = run_dir / f"gate-{content_hash(dataclasses.asdict(point.gate))}"

    def new_run():
        stage1, _ = load_run(model_dir)
        stage1.train = point.stage2_train(stage1.train, str(model_dir.resolve()))
        return stage1

    _train_or_resume(gate_dir, new_run, nproc)
    stage2 = train_metrics(gate_dir)
    return gate_dir, {"gate_steps": stage2["train_steps"], "gate_loss": stage2["train_loss"],
                      "gate_s": stage2["train_s"]}


def _train_or_resume(run_dir: Path, new_run, nproc: int = 0) -> bool:
    """Reuse a finished run (returns True), resume a started one, or start `new_run()` (a RunConfig)
    afresh (False); in this process, or (nproc >= 1) as a torchrun job of nproc processes."""
    from synthlab.train import train

    resume = (run_dir / "config.json").is_file()  # resume from the last checkpoint (or step 0 before one)
    if resume:
        check_same_run(run_dir, new_run())
    if (run_dir / "summary.json").is_file():
        return True
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)  # killed before its config was written
    if nproc:
        interrupted = _torchrun_train(run_dir, None if resume else new_run(), nproc)
    else:
        interrupted = train(run_dir, None if resume else new_run(), progress=False).interrupted
    if interrupted:
        raise KeyboardInterrupt(f"training in {run_dir} interrupted by a signal (checkpoint written)")
    return False


# Train options that change no number a run produces (where things are written, how often it logs).
_OPERATIONAL = {"data", "device", "checkpoint_every", "keep_checkpoints", "log_every", "tensorboard", "wandb"}


def check_same_run(run_dir: Path, wanted) -> None:
    """Refuse to reuse or resume `run_dir` for a point whose configuration (`wanted`, a RunConfig) is
    not the one the run was trained with: a changed default or definition keeps a point's id."""
    from synthlab import config as configlib
    from synthlab.runs import load_run

    stored, _ = load_run(run_dir)
    changed = []
    for section, old, new in [("model", stored.model.as_built(), wanted.model.as_built()),
                              ("train", configlib.to_dict(stored.train), configlib.to_dict(wanted.train))]:
        changed += [f"{section}.{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                    if old.get(k) != new.get(k) and not (section == "train" and k in _OPERATIONAL)]
    if changed:
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise SynthlabError(f"{run_dir} was trained with another configuration than its point asks for ({shown}): "
                            f"move the folder away to train the point again, or sweep into a new --out")


def _torchrun_train(run_dir: Path, run, nproc: int) -> bool:
    """`torchrun --standalone --nproc-per-node nproc -m synthlab train` of `run` (a RunConfig, or
    None to resume run_dir) in a child process, with this process's torch threads per process;
    True if a signal interrupted it (a checkpoint was written). A failure is one error line."""
    import subprocess
    import sys
    import tempfile

    import torch

    from synthlab import config as configlib

    with tempfile.TemporaryDirectory() as tmp:
        if run is None:
            args = ["--resume", str(run_dir)]
        else:
            config = Path(tmp) / "run.json"
            config.write_text(json.dumps(configlib.to_dict(run)))
            args = ["--config", str(config), "--out", str(run_dir)]
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                   "-m", "synthlab", "train", *args, "--threads", str(torch.get_num_threads()), "--no-progress"]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 and "interrupted at step" in done.stderr:  # rank 0's line (torchrun's code is 1)
        return True
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")] or done.stderr.splitlines()[-1:]
        raise SynthlabError(f"training {run_dir} under torchrun ({nproc} processes) failed with exit code "
                            f"{done.returncode}: {lines[0] if lines else 'no output'}")
    return False


def heldout_metrics(point: PointConfig, model_dir: Path, cache_dir: Path) -> dict[str, Any]:
    """The held-out loss columns of the point's model (or its eval.checkpoint) on a fresh dataset:
    the same generator parameters under the data seed + HELDOUT_SEED_OFFSET."""
    from synthlab.heldout import HELDOUT_SEED_OFFSET, heldout_loss

    seed = point.data_seed + HELDOUT_SEED_OFFSET
    fresh = dataclasses.replace(point, data_seed=seed, data_key={**point.data_key, "seed": seed})
    result = heldout_loss(model_dir, dataset(fresh, cache_dir), rows=point.eval.heldout_rows,
                          checkpoint=point.eval.checkpoint, batch_size=min(point.eval.batch_size, 16),
                          train_dir=dataset(point, cache_dir))
    return heldout_columns(result)


def changed_since(point: PointConfig, run_dir: Path) -> str:
    """Why the model in `run_dir` is not the one `point` asks for now ("" when it is, or when no
    model is there): a finished point whose definition or defaults changed keeps its id and row."""
    from synthlab.runs import RunConfig

    model_dir = Path(run_dir) / "model"
    if _given_base(point) or not (model_dir / "config.json").is_file():
        return ""
    try:
        check_same_run(model_dir, RunConfig(point.model, point.train))
    except SynthlabError as err:
        return str(err)
    return ""


def run_point(point: PointConfig, run_dir: Path, *, cache_dir: Path, nproc: int = 0) -> dict[str, Any]:
    """Generate, train, evaluate and (for bioS) measure capacity; returns the row's metrics.
    nproc >= 1: the training stages run as torchrun jobs of nproc processes."""
    from synthlab.capacity import estimate_capacity
    from synthlab.evaluate import biography_generation, evaluate_run

    if _given_base(point):
        from synthlab.hf.point import run_stage

        return run_stage(point.ouroboros, None, None, Path(run_dir) / "ouroboros")

    data_dir = dataset(point, cache_dir)
    model_dir = Path(run_dir) / "model"
    metrics = {**describe(point), **train_model(point, data_dir, model_dir, nproc)}
    metrics.update(size_metrics(json.loads((model_dir / "config.json").read_text())))
    options = point.eval
    if "gate" in point.stages:  # evaluate the stage II model from here on
        model_dir, gate_metrics = train_gate(point, model_dir, Path(run_dir), nproc)
        metrics.update(gate_metrics)
    if "eval" in point.stages:
        result = evaluate_run(model_dir, steps=options.steps, exit_rule=options.exit, kv=options.kv,
                              batch_size=options.batch_size)
        metrics.update(eval_metrics(result, options))
    if "heldout" in point.stages:
        metrics.update(heldout_metrics(point, model_dir, cache_dir))
    if "generate" in point.stages:
        metrics.update(biography_generation(model_dir, kv=options.kv or "full", steps=options.steps))
    if "capacity" in point.stages:
        metrics.update(capacity_metrics(estimate_capacity(model_dir)))
    if "export" in point.stages:  # once per trained model: the points on it share the folder
        from synthlab.hf.export import export_run

        qwen2 = Path(run_dir) / "qwen2"
        if not (qwen2 / "config.json").is_file():
            export_run(model_dir, qwen2)
    if "ouroboros" in point.stages:
        from synthlab.hf.point import run_stage

        metrics.update(run_stage(point.ouroboros, qwen2, data_dir / "train.jsonl", Path(run_dir) / "ouroboros"))
    return metrics
