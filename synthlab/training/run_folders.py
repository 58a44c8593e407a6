"""Run folders: what a run is, and reading one back without the trainer.

A run directory (written by `synthlab.training.trainer`) describes itself:
- `config.json`: the resolved `RunConfig` (model + train) and what was derived from the data
  (vocabulary size, row length, packing, total steps, device) under "derived";
- `metrics.jsonl`: one JSON line per logged step;
- `checkpoint-<step>.pt`: the training state (model, optimizer, step, RNG states, data
  position), the newest `keep_checkpoints`, each with its sha256 in `checkpoint-<step>.pt.sha256`;
  `checkpoint.pt` is the newest under a fixed name; readers fall back from a damaged one;
- `model.safetensors`: the weights alone, written when training finished (`load_model` reads them);
- `summary.json`: final numbers, written when training finished (with `stopped_by` and
  `stopped_at_step` when its `train.schedule.stop_when` ended it: `record_stop`).

Everything that reads a run (evaluation, capacity, the point runner, `synthlab eval`) goes through
this module, never through `synthlab.training.trainer`: like nanoGPT's `sample.py`, it rebuilds the model from
the config and loads the weights.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from synthlab import serialize
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write, atomic_write_text, sha256_file, warn
from synthlab.models import ModelConfig, build_model
from synthlab.training.configs import TrainConfig, nested_train

WEIGHTS = "model.safetensors"
CHECKPOINT = "checkpoint.pt"  # the newest checkpoint-<step>.pt under a fixed name


@dataclass
class RunConfig:
    """Everything a run needs: the `[model]` and `[train]` sections of a run.toml, resolved."""

    model: ModelConfig
    train: TrainConfig


def resolve_device(name: str) -> torch.device:
    """`auto` (CUDA if present, else CPU), `cpu` or `cuda`; asking for a missing GPU is an error."""
    if name != "auto" and not re.fullmatch(r"cpu|mps|cuda(:\d+)?", name):
        raise SynthlabError(f"--device must be auto, cpu, cuda or cuda:N, got '{name}'")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SynthlabError(f"device is {name} but no CUDA device is available")
    return torch.device(name)


def autocast(device: torch.device, cpu_bf16: bool = False):
    """bf16 autocast on CUDA; on the CPU fp32 (no autocast) unless `cpu_bf16` (train.system.cpu_bf16)."""
    if device.type == "cuda" or cpu_bf16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def float32_matmul(device: torch.device, tf32: bool = True):
    """While the block runs: TF32 tensor cores for float32 matmuls on CUDA (`tf32`) or full float32
    (the parts autocast leaves in float32: norms' neighbours, gates, the OUROBOROS trainables).
    The previous setting comes back afterwards; on the CPU nothing changes."""
    if device.type != "cuda":
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def load_run(run_dir: str | Path) -> tuple[RunConfig, dict[str, Any]]:
    """(RunConfig, derived settings) from a run directory's config.json."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise SynthlabError(f"{run_dir} is not a run directory (no config.json)")
    data = serialize.load_dict(path)
    derived = data.pop("derived", {})
    if isinstance(data.get("train"), dict):  # a run written before train's sections: its flat table
        data["train"] = nested_train(data["train"])
    return serialize.from_dict(RunConfig, data), derived


def clear_unstarted(run_dir: str | Path) -> bool:
    """Empty `run_dir` if it holds a run that stopped before its first step (out of memory, a bad
    shape): its config.json, an empty metrics.jsonl and hidden files (temporary, lock), nothing else. Says so in a
    warning and returns True; anything more (or a config.json that is not a run's) is left alone."""
    run_dir = Path(run_dir)
    started = {p.name for p in run_dir.iterdir() if not p.name.startswith(".")} - {"config.json", "metrics.jsonl"}
    if (
        started
        or not (run_dir / "config.json").is_file()
        or (run_dir / "metrics.jsonl").is_file()
        and (run_dir / "metrics.jsonl").stat().st_size
    ):
        return False
    try:
        load_run(run_dir)
    except SynthlabError:
        return False
    warn(f"replacing {run_dir}: a run that stopped before its first step (nothing of it was trained)")
    for path in run_dir.iterdir():
        if not path.is_dir():
            path.unlink()
    return True


def checkpoint_files(run_dir: str | Path) -> list[Path]:
    """The run's checkpoints, newest first: checkpoint-<step>.pt (or, from a run written before
    checkpoints were numbered, checkpoint.pt alone)."""
    numbered = [
        (int(path.stem[len("checkpoint-") :]), path)
        for path in Path(run_dir).glob("checkpoint-*.pt")
        if path.stem[len("checkpoint-") :].isdigit()
    ]
    if numbered:
        return [path for _, path in sorted(numbered, reverse=True)]
    legacy = Path(run_dir) / CHECKPOINT
    return [legacy] if legacy.is_file() else []


def load_state_file(path: str | Path, device: torch.device | str = "cpu") -> Any:
    """A file written by `torch.save` of tensors and plain values (dicts, lists, numbers, strings),
    read without running code from it: `weights_only=True` refuses any other object (a crafted
    pickle's `__reduce__` included). ValueError(why) for a refused or damaged file."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:  # weights_only's refusal (a damaged file also lands here)
        raise ValueError("refused: not only tensors and plain values (or damaged)") from None
    except Exception as err:  # torch raises many types for a damaged file
        raise ValueError(f"unreadable, {type(err).__name__}") from None


def _read_checkpoint(path: Path, device: torch.device | str) -> dict[str, Any]:
    """One checkpoint file, checked against the sha256 written beside it; ValueError(why) if damaged."""
    checksum = path.with_name(path.name + ".sha256")
    if checksum.is_file() and checksum.read_text().strip() != sha256_file(path):
        raise ValueError("checksum mismatch")
    ckpt = load_state_file(path, device)
    if not isinstance(ckpt, dict) or not {"model", "step"} <= ckpt.keys() or not isinstance(ckpt["model"], dict):
        raise ValueError("no model state")
    for key in ("torch_rng", "model_rng"):  # damage a missing sha256 cannot reveal (the trainer saves
        try:  # only finite weights and valid generator states)
            if key in ckpt:
                torch.Generator().set_state(ckpt[key])
        except (RuntimeError, TypeError):
            raise ValueError(f"invalid {key}") from None
    if _finite(ckpt["model"]) is not None:
        raise ValueError(f"non-finite {_finite(ckpt['model'])}")
    return ckpt


def load_checkpoint(
    run_dir: str | Path, device: torch.device | str = "cpu", *, missing_ok: bool = False
) -> dict[str, Any] | None:
    """The run's newest intact checkpoint; a damaged newer one is skipped with a warning on stderr.

    No checkpoint at all is a SynthlabError, or None with `missing_ok` (a run stopped before its
    first checkpoint); none intact is a SynthlabError naming each file. Nothing is touched.
    """
    paths = checkpoint_files(run_dir)
    if not paths:
        if missing_ok:
            return None
        raise SynthlabError(f"no checkpoint in {run_dir} (no checkpoint-<step>.pt)")
    damaged = []
    for path in paths:
        try:
            ckpt = _read_checkpoint(path, device)
        except ValueError as why:
            damaged.append(f"{path} ({why})")
            continue
        if damaged:
            warn(f"damaged checkpoint {', '.join(damaged)}; using {path.name} (step {ckpt['step']})")
        return ckpt
    raise SynthlabError(f"corrupt checkpoint: no intact checkpoint in {run_dir}: {'; '.join(damaged)}")


def save_checkpoint(run_dir: str | Path, state: dict[str, Any], keep: int = 2, every: int = 0) -> None:
    """Write a training state as checkpoint-<step>.pt with its sha256 beside it (atomically: a
    reader sees the old files or the new ones), point checkpoint.pt at it, keep the newest `keep`.

    checkpoint.pt is a hard link to the newest (a copy where the file system has no links); the
    numbered files past this step (damaged ones a resume fell back from) are removed. With `every`
    (the run's checkpoint_every), an older checkpoint off that schedule (one a stop wrote) was only
    a resume point: it is removed and takes none of the `keep` places, so a run stopped and resumed
    keeps the same scheduled checkpoints as one that ran through (an evaluation may read them).
    """
    run_dir, step = Path(run_dir), int(state["step"])
    path = run_dir / f"checkpoint-{step}.pt"
    checksum = path.with_name(path.name + ".sha256")
    checksum.unlink(missing_ok=True)  # a stale one, of a step written again after a fallback
    digest: list[str] = []

    def write(tmp: Path) -> None:
        try:
            torch.save(state, tmp)
        except RuntimeError as err:  # torch's zip writer reports a full disk as a RuntimeError
            raise SynthlabError(
                f"cannot write {path} ({str(err).splitlines()[0][:120]}: is the disk full?); the "
                f"older checkpoints are kept: free space, then synthlab train --resume "
                f"{run_dir}"
            ) from None
        digest.append(sha256_file(tmp))

    atomic_write(path, write)
    atomic_write_text(checksum, digest[0] + "\n")

    def link(tmp: Path) -> None:
        tmp.unlink(missing_ok=True)  # a leftover must not be written through
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)

    atomic_write(run_dir / CHECKPOINT, link)

    def step_of(p: Path) -> int:
        return int(p.stem[len("checkpoint-") :])

    older = [p for p in checkpoint_files(run_dir) if step_of(p) <= step]
    stops = [p for p in older if every and step_of(p) % every and step_of(p) != step]
    older = [p for p in older if p not in stops]
    for old in [p for p in checkpoint_files(run_dir) if step_of(p) > step] + stops + older[keep:]:
        old.unlink(missing_ok=True)
        old.with_name(old.name + ".sha256").unlink(missing_ok=True)


def save_weights(run_dir: str | Path, model: torch.nn.Module) -> None:
    """Write the model's weights as the run's model.safetensors (atomically; tied tensors once)."""
    atomic_write(Path(run_dir) / WEIGHTS, lambda tmp: safetensors.torch.save_model(model, str(tmp)))


def record_stop(run_dir: str | Path, condition: str, step: int) -> None:
    """Record in config.json that `train.schedule.stop_when` (`condition`) ended the run at `step`:
    derived.total_steps becomes `step` (the run's length: train_flops counts it, a resume trains no
    further), derived.stop keeps the condition, the step and the step budget it ended inside.
    Written before the step's checkpoint, so a run cut off between the two resumes to the same stop."""
    path = Path(run_dir) / "config.json"
    config = json.loads(path.read_text())
    derived = config["derived"]
    budget = derived.get("stop", {}).get("budget_steps", derived["total_steps"])
    derived |= {"total_steps": step, "stop": {"by": condition, "at_step": step, "budget_steps": budget}}
    atomic_write_text(path, json.dumps(config, indent=2) + "\n")


def stopped(run_dir: str | Path) -> dict[str, Any]:
    """summary.json's record of a run `train.schedule.stop_when` ended ({} for any other run):
    stopped_by (the condition) and stopped_at_step."""
    stop = json.loads((Path(run_dir) / "config.json").read_text())["derived"].get("stop")
    return {"stopped_by": stop["by"], "stopped_at_step": stop["at_step"]} if stop else {}


def _finite(state: dict[str, Any]) -> str | None:
    """The name of the first floating tensor in `state` holding NaN or inf, else None."""
    return next(
        (
            k
            for k, v in state.items()
            if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())
        ),
        None,
    )


def _load_safetensors(model: torch.nn.Module, path: Path, device: torch.device | str) -> bool:
    """Load `path` into `model`: True, or False when it is absent or damaged (said in a warning).
    A RuntimeError (weights of another shape) goes to the caller."""
    if not path.is_file():
        return False
    try:
        safetensors.torch.load_model(model, str(path), device=str(device))
        return True
    except RuntimeError:
        raise
    except Exception as err:  # a damaged file: safetensors raises its own types
        warn(f"damaged {path} ({type(err).__name__}); reading the newest intact checkpoint instead")
        return False


def load_weights(model: torch.nn.Module, run_dir: str | Path, device: torch.device | str = "cpu") -> None:
    """Load the weights of the run in `run_dir` into `model` (which must have the run's shape):
    model.safetensors of a finished run, else (interrupted, or that file damaged) its newest intact
    checkpoint. Weights holding NaN or inf are an error: nothing is evaluated with them."""
    try:
        if not _load_safetensors(model, Path(run_dir) / WEIGHTS, device):
            model.load_state_dict(load_checkpoint(run_dir, device)["model"])
    except RuntimeError as err:
        raise SynthlabError(f"the weights in {run_dir} do not fit this model: {str(err).splitlines()[0]}") from None
    bad = _finite(model.state_dict())
    if bad is not None:
        raise SynthlabError(f"the weights in {run_dir} are not finite ({bad} holds NaN or inf)")


def open_run(run_dir: str | Path, device: torch.device | str = "cpu"):
    """(model in eval mode, RunConfig, derived) from a finished or interrupted run."""
    run, derived = load_run(run_dir)
    model = build_model(run.model).to(device)  # weights come from the run folder
    load_weights(model, run_dir, device)
    return model.eval(), run, derived


def open_checkpoint(run_dir: str | Path, step: int, device: torch.device | str = "cpu"):
    """(model in eval mode with the weights of checkpoint-<step>.pt, RunConfig, the checkpoint's
    tokens seen) of a run that kept that checkpoint (train.checkpoint.keep_checkpoints)."""
    run, _ = load_run(run_dir)
    path = Path(run_dir) / f"checkpoint-{step}.pt"
    if not path.is_file():
        kept = sorted(int(p.stem[len("checkpoint-") :]) for p in checkpoint_files(run_dir) if p.stem != "checkpoint")
        raise SynthlabError(
            f"no checkpoint of step {step} in {run_dir} (kept: {kept or 'none'}; raise "
            f"train.checkpoint.keep_checkpoints to keep more)"
        )
    try:
        ckpt = _read_checkpoint(path, device)
    except ValueError as err:
        raise SynthlabError(f"damaged checkpoint {path}: {err}") from None
    model = build_model(run.model).to(device)
    model.load_state_dict(ckpt["model"])
    return model.eval(), run, int(ckpt["tokens_seen"])


def load_model(run_dir: str | Path, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The trained model of the run in `run_dir`, in eval mode, on `device` (`synthlab.load_model`).

    One call, no training code: the model is rebuilt from config.json and its weights read from
    model.safetensors (or, for a run interrupted before the end, from checkpoint.pt)."""
    return open_run(run_dir, device)[0]


def data_sha256(data_dir: str | Path) -> dict[str, str]:
    """{file name: sha256} of a dataset folder, as its meta.json records them (recorded in a run's
    config.json "derived" at training start)."""
    meta = Path(data_dir) / "meta.json"
    try:
        files = json.loads(meta.read_text()).get("files", {})
    except (OSError, ValueError):
        raise SynthlabError(f"{data_dir} is not a dataset folder (no readable meta.json)") from None
    return {name: entry["sha256"] for name, entry in sorted(files.items())}


def trained_data(
    run_dir: str | Path, run: RunConfig, derived: dict[str, Any], moved_to: str | Path | None = None
) -> Path:
    """The data folder the run was trained on (or `moved_to`, its new place), checked: there, and
    the same dataset (the sha256s recorded at training start; older runs are only looked for)."""
    path = Path(moved_to if moved_to is not None else run.train.data).resolve()
    if not (path / "meta.json").is_file() and moved_to is not None:
        raise SynthlabError(f"--data {moved_to} is not a dataset folder (no meta.json)")
    if not (path / "meta.json").is_file():
        raise SynthlabError(
            f"run {run_dir} was trained on {path}, which is gone (moved?); pass --data DIR with the dataset's new place"
        )
    recorded = derived.get("data_sha256")
    if recorded is not None:
        changed = sorted(n for n, digest in data_sha256(path).items() if recorded.get(n) != digest)
        changed += sorted(set(recorded) - set(data_sha256(path)))
        if changed:
            raise SynthlabError(
                f"{path} is not the dataset run {run_dir} was trained on ({changed[0]} changed: "
                f"regenerated?); pass --data DIR with the original dataset"
            )
    return path


def _metrics_lines(path: Path) -> list[tuple[dict[str, Any], str]]:
    """(record, line) of each whole line of a metrics.jsonl; a last line cut off mid-write (a full
    disk, a kill) is skipped with a warning, a damaged line before it is a SynthlabError."""
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append((json.loads(line), line))
        except ValueError:
            if number == len(lines):  # no newline after it: the write never finished
                warn(f"{path}:{number}: skipping a line cut off mid-write")
                continue
            raise SynthlabError(f"{path}:{number}: not a JSON record (damaged metrics)") from None
    return records


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl records, in order."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise SynthlabError(f"no metrics.jsonl in {run_dir}")
    return [record for record, _ in _metrics_lines(path)]


def trim_metrics(run_dir: str | Path, step: int) -> None:
    """Cut metrics.jsonl back to its whole lines logged at or before `step` (a resumed run logs the
    rest again; a line cut off mid-write goes too)."""
    path = Path(run_dir) / "metrics.jsonl"
    if path.is_file():
        kept = [line for record, line in _metrics_lines(path) if record.get("step", 0) <= step]
        atomic_write_text(path, "".join(line + "\n" for line in kept))
