"""The lab's point runner: data (cached) -> train (resumable) -> [gate] -> eval / generate -> capacity;
or train -> export (as a Qwen2 checkpoint) -> ouroboros (C11 on that checkpoint, synthlab.ouroboros.stage).

This module is a point runner (the contract: `synthlab.sweeps.runner_protocol.PointRunner`); its stages are the
registry `STAGES`, each with the columns it fills in the point's row (`synthlab.sweeps.schema`), the
stages it needs before it, and its work.

The model is trained in `run_dir/model` (a synthlab.training.trainer run directory): an existing checkpoint
is resumed, a finished run is reused by every point that evaluates it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from synthlab import serialize
from synthlab.errors import SynthlabError, from_tasks
from synthlab.evaluation.evaluate import biography_generation, evaluate_run
from synthlab.evaluation.heldout import HELDOUT_SEED_OFFSET, heldout_loss
from synthlab.files import cached_dir
from synthlab.ouroboros.export import export_run, qwen2_refusal
from synthlab.ouroboros.stage import parse_section, run_stage
from synthlab.serialize import content_hash
from synthlab.sweeps.cost import gpu_cost, size_metrics
from synthlab.sweeps.results_table import capacity_metrics, describe, eval_metrics, heldout_columns, train_metrics
from synthlab.sweeps.stages import STAGE_SPECS
from synthlab.sweeps.step_rate import estimate_seconds
from synthlab.training.configs import PointConfig, parse_point
from synthlab.training.run_folders import RunConfig, load_run
from synthlab.training.trainer import train
from synthlab_generators import write_dataset

__all__ = ["columns", "estimate_seconds", "gpu_cost", "gpu_memory_gib", "parse", "run_point"]


def parse(config: dict[str, Any]) -> PointConfig:
    """The point's options, typed (raises SynthlabError naming the section and field)."""
    stages = ("train", *config.get("stages", ()))
    for name in stages:
        if name not in STAGES:
            raise SynthlabError(f"unknown stage '{name}' (have {', '.join(STAGES)})")
        missing = [r for r in STAGES[name].requires if r not in stages]
        if missing:
            raise SynthlabError(f"the {name} stage needs the {missing[0]} stage")
    point = parse_point(config)
    if "ouroboros" not in point.stages:
        return point
    if "ouroboros" not in config:
        raise SynthlabError("the ouroboros stage needs an [ouroboros] section")
    if qwen2_refusal(point.model):
        raise SynthlabError(f"model: {qwen2_refusal(point.model)} (the export stage needs it)")
    return dataclasses.replace(point, ouroboros=parse_section(config["ouroboros"]))


def gpu_memory_gib(point: PointConfig) -> float:
    """The point's estimated peak GPU memory (`synthlab.sweeps.cost.gpu_cost`: dense attention for packed
    rows, the larger of its training and OUROBOROS stages)."""
    return float(gpu_cost(point)["peak_gib"])


def _given_base(point: PointConfig) -> bool:
    """An ouroboros point on a Qwen2 checkpoint the user gives: no synthlab model is trained."""
    return point.ouroboros is not None and point.ouroboros.source.base is not None


def columns(point: PointConfig) -> list[str]:
    """The columns a finished row of `point` fills: a row missing one makes the sweep run it again."""
    if _given_base(point):
        return list(STAGES["ouroboros"].columns)
    return list(dict.fromkeys(c for stage in ("train", *point.stages) for c in STAGES[stage].columns))


def dataset(point: PointConfig, cache_dir: Path) -> Path:
    """The point's dataset, generated once per (task, params, seed) into the cache."""
    key = {"task": point.task, **point.data_key, **point.spec.version_key()}
    with from_tasks():
        return cached_dir(
            cache_dir,
            key,
            lambda tmp: write_dataset(point.spec, point.data, point.data_seed, tmp),
            prefix=f"{point.task}-",
        )


def train_model(point: PointConfig, data_dir: Path, model_dir: Path, nproc: int = 0) -> dict[str, Any]:
    """Train (or resume, or reuse) the point's model in model_dir; returns the training metrics."""

    def new_run():
        train = dataclasses.replace(point.train, data=str(Path(data_dir).resolve()))
        return RunConfig(point.model, train)

    reused = _train_or_resume(model_dir, new_run, nproc)
    return {**train_metrics(model_dir), "model_reused": int(reused)}


def train_gate(point: PointConfig, model_dir: Path, run_dir: Path, nproc: int = 0) -> tuple[Path, dict[str, Any]]:
    """Ouro stage II on the trained stage I model in model_dir; returns (its run dir, gate_* metrics).

    One stage II run per gate config, beside the stage I model (points that share both share it).
    """
    gate_dir = run_dir / f"gate-{content_hash(dataclasses.asdict(point.gate))}"

    def new_run():
        stage1, _ = load_run(model_dir)
        stage1.train = point.stage2_train(stage1.train, str(model_dir.resolve()))
        return stage1

    _train_or_resume(gate_dir, new_run, nproc)
    stage2 = train_metrics(gate_dir)
    return gate_dir, {
        "gate_steps": stage2["train_steps"],
        "gate_loss": stage2["train_loss"],
        "gate_s": stage2["train_s"],
    }


def _train_or_resume(run_dir: Path, new_run, nproc: int = 0) -> bool:
    """Reuse a finished run (returns True), resume a started one, or start `new_run()` (a RunConfig)
    afresh (False); in this process, or (nproc >= 1) as a torchrun job of nproc processes."""
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


# Train options that change no number a run produces (where things are written, how often it logs),
# by their paths in the [train] table.
_OPERATIONAL = {
    "data",
    "system.device",
    "checkpoint.checkpoint_every",
    "checkpoint.checkpoints",
    "checkpoint.keep_checkpoints",
    "logging.log_every",
    "logging.tensorboard",
    "logging.wandb",
}


def _paths(table: dict[str, Any]) -> dict[str, Any]:
    """A config's table with its sections' fields by path (`{"optim": {"lr": 1}}`: `optim.lr`)."""
    out = {}
    for key, value in table.items():
        out |= {f"{key}.{k}": v for k, v in _paths(value).items()} if isinstance(value, dict) else {key: value}
    return out


def check_same_run(
    run_dir: Path,
    wanted,
    *,
    asked: str = "its point asks for",
    remedy: str = "move the folder away to train the point again, or sweep into a new --out",
) -> None:
    """Refuse to reuse or resume `run_dir` for a point whose configuration (`wanted`, a RunConfig) is
    not the one the run was trained with: a changed default or definition keeps a point's id.
    `asked` and `remedy` word the error for the caller (a sweep's point, `train --resume auto`)."""
    stored, _ = load_run(run_dir)
    changed = []
    for section, old, new in [
        ("model", stored.model.as_built(), wanted.model.as_built()),
        ("train", _paths(serialize.to_dict(stored.train)), _paths(serialize.to_dict(wanted.train))),
    ]:
        changed += [
            f"{section}.{k} {old.get(k)!r} -> {new.get(k)!r}"
            for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k) and not (section == "train" and k in _OPERATIONAL)
        ]
    if changed:
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise SynthlabError(f"{run_dir} was trained with another configuration than {asked} ({shown}): {remedy}")


# torchrun's launcher (`python -m torch.distributed.run`) made to end with the process that starts
# it, kill -9 included: a sweep worker whose driver is gone leaves no agent behind (and each rank
# ends with its agent: synthlab.training.distributed.process_group).
LAUNCH_TORCHRUN = (
    "from synthlab.files import die_with_parent; die_with_parent(); from torch.distributed.run import main; main()"
)


def _torchrun_train(run_dir: Path, run, nproc: int) -> bool:
    """`torchrun --standalone --nproc-per-node nproc -m synthlab train` of `run` (a RunConfig, or
    None to resume run_dir) in a child process, with this process's torch threads per process;
    True if a signal interrupted it (a checkpoint was written). A failure is one error line."""
    with tempfile.TemporaryDirectory() as tmp:
        if run is None:
            args = ["--resume", str(run_dir)]
        else:
            config = Path(tmp) / "run.json"
            config.write_text(json.dumps(serialize.to_dict(run)))
            args = ["--config", str(config), "--out", str(run_dir)]
        command = [
            sys.executable,
            "-c",
            LAUNCH_TORCHRUN,
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "synthlab",
            "train",
            *args,
            "--threads",
            str(torch.get_num_threads()),
            "--no-progress",
        ]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 and "interrupted at step" in done.stderr:  # rank 0's line (torchrun's code is 1)
        return True
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")] or done.stderr.splitlines()[
            -1:
        ]
        raise SynthlabError(
            f"training {run_dir} under torchrun ({nproc} processes) failed with exit code "
            f"{done.returncode}: {lines[0] if lines else 'no output'}"
        )
    return False


def heldout_metrics(point: PointConfig, model_dir: Path, cache_dir: Path, device: str = "cpu") -> dict[str, Any]:
    """The held-out loss columns of the point's model (or its eval.checkpoint) on a fresh dataset:
    the same generator parameters under the data seed + HELDOUT_SEED_OFFSET."""
    seed = point.data_seed + HELDOUT_SEED_OFFSET
    fresh = dataclasses.replace(point, data_seed=seed, data_key={**point.data_key, "seed": seed})
    result = heldout_loss(
        model_dir,
        dataset(fresh, cache_dir),
        rows=point.eval.heldout_rows,
        checkpoint=point.eval.checkpoint,
        batch_size=min(point.eval.batch_size, 16),
        train_dir=dataset(point, cache_dir),
        device=device,
    )
    return heldout_columns(result)


def changed_since(point: PointConfig, run_dir: Path) -> str:
    """Why the model in `run_dir` is not the one `point` asks for now ("" when it is, or when no
    model is there): a finished point whose definition or defaults changed keeps its id and row."""
    model_dir = Path(run_dir) / "model"
    if _given_base(point) or not (model_dir / "config.json").is_file():
        return ""
    try:
        check_same_run(model_dir, RunConfig(point.model, point.train))
    except SynthlabError as err:
        return str(err)
    return ""


@dataclasses.dataclass
class Work:
    """What the stages of one point share: the point, its folders, the model later stages read."""

    point: PointConfig
    run_dir: Path
    cache_dir: Path
    nproc: int
    data_dir: Path
    model_dir: Path  # the trained model; after the gate stage, the stage II model

    @property
    def device(self) -> str:
        """The device the model trained on: every later stage runs there (a GPU's run on the GPU)."""
        return json.loads((self.model_dir / "config.json").read_text())["derived"].get("device", "cpu")

    def beside_run(self, path: str) -> str:
        """A file of the model's (relative to model_dir) relative to the point's run_dir, the folder
        results.csv names (the gate stage's model lies in a subfolder of it)."""
        return (self.model_dir / path).relative_to(self.run_dir).as_posix()


def _train(work: Work) -> dict[str, Any]:
    metrics = train_model(work.point, work.data_dir, work.model_dir, work.nproc)
    return metrics | size_metrics(json.loads((work.model_dir / "config.json").read_text()))


def _gate(work: Work) -> dict[str, Any]:  # the later stages evaluate the stage II model
    work.model_dir, metrics = train_gate(work.point, work.model_dir, work.run_dir, work.nproc)
    return metrics


def _eval(work: Work) -> dict[str, Any]:
    options = work.point.eval
    result = evaluate_run(
        work.model_dir,
        steps=options.steps,
        exit_rule=options.exit,
        kv=options.kv,
        batch_size=options.batch_size,
        device=work.device,
        max_prompts=options.max_prompts,
    )
    return eval_metrics(result, options) | {"outcomes": work.beside_run(result["outcomes"])}


def _heldout(work: Work) -> dict[str, Any]:
    return heldout_metrics(work.point, work.model_dir, work.cache_dir, work.device)


def _generate(work: Work) -> dict[str, Any]:
    result = biography_generation(
        work.model_dir, kv=work.point.eval.kv or "full", steps=work.point.eval.steps, device=work.device
    )
    return result | {"outcomes": work.beside_run(result["outcomes"])}


def _capacity(work: Work) -> dict[str, Any]:
    # pandas: only a point with this stage loads it (a sweep's worker processes run without it)
    from synthlab.evaluation.capacity import estimate_capacity

    return capacity_metrics(estimate_capacity(work.model_dir, device=work.device))


def _export(work: Work) -> dict[str, Any]:  # once per trained model: the points on it share the folder
    qwen2 = work.run_dir / "qwen2"
    if not (qwen2 / "config.json").is_file():
        export_run(work.model_dir, qwen2)
    return {}


def _ouroboros(work: Work) -> dict[str, Any]:
    options, new_people = work.point.ouroboros, None
    if options.eval.eval_data_seed is not None:
        if options.eval.eval_data_seed == work.point.data_seed:
            raise SynthlabError(
                f"ouroboros.eval_data_seed {options.eval.eval_data_seed} is the base's own data seed: "
                "its people are the base's; give another"
            )
        seed = options.eval.eval_data_seed
        other = dataclasses.replace(work.point, data_seed=seed, data_key={**work.point.data_key, "seed": seed})
        new_people = dataset(other, work.cache_dir) / "train.jsonl"
    return run_stage(
        options, work.run_dir / "qwen2", work.data_dir / "train.jsonl", work.run_dir / "ouroboros", new_people
    )


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a point: the columns it fills in the row, the stages it needs before it, its work."""

    name: str
    columns: tuple[str, ...]
    requires: tuple[str, ...]
    run: Callable[[Work], dict[str, Any]]


_WORK = {
    "train": _train,
    "gate": _gate,
    "eval": _eval,
    "heldout": _heldout,
    "generate": _generate,
    "capacity": _capacity,
    "export": _export,
    "ouroboros": _ouroboros,
}
# In the order they run (synthlab.sweeps.stages); training always runs.
STAGES = {name: Stage(name, spec.columns, spec.requires, _WORK[name]) for name, spec in STAGE_SPECS.items()}


def run_point(point: PointConfig, run_dir: Path, *, cache_dir: Path, nproc: int = 0) -> dict[str, Any]:
    """Run the point's stages in the registry's order (data first, training always); returns the
    row's metrics. nproc >= 1: the training stages run as torchrun jobs of nproc processes."""
    if _given_base(point):
        return run_stage(point.ouroboros, None, None, Path(run_dir) / "ouroboros")
    work = Work(point, Path(run_dir), cache_dir, nproc, dataset(point, cache_dir), Path(run_dir) / "model")
    metrics = describe(point)
    for stage in STAGES.values():
        if stage.name == "train" or stage.name in point.stages:
            metrics.update(stage.run(work))
    return metrics
