"""Run folders: what a run is, and reading one back without the trainer.

A run directory (written by `synthlab.train`) describes itself:
- `config.json`: the resolved `RunConfig` (model + train) and what was derived from the data
  (vocabulary size, row length, packing, total steps, device) under "derived";
- `metrics.jsonl`: one JSON line per logged step;
- `checkpoint.pt`: the training state (model, optimizer, scheduler, RNG states, data position);
- `model.safetensors`: the weights alone, written when training finished (`load_model` reads them);
- `summary.json`: final numbers, written when training finished.

Everything that reads a run (evaluation, capacity, the point runner, `synthlab eval`) goes through
this module, never through `synthlab.train`: like nanoGPT's `sample.py`, it rebuilds the model from
the config and loads the weights.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from synthlab import config as configlib
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write
from synthlab.models import ModelConfig, build_model
from synthlab.options import TrainConfig


WEIGHTS = "model.safetensors"


@dataclass
class RunConfig:
    """Everything a run needs: the `[model]` and `[train]` sections of a run.toml, resolved."""

    model: ModelConfig
    train: TrainConfig


def resolve_device(name: str) -> torch.device:
    """`auto` (CUDA if present, else CPU), `cpu` or `cuda`; asking for a missing GPU is an error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SynthlabError(f"device is {name} but no CUDA device is available")
    return torch.device(name)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; fp32 (no autocast) on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def load_run(run_dir: str | Path) -> tuple[RunConfig, dict[str, Any]]:
    """(RunConfig, derived settings) from a run directory's config.json."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise SynthlabError(f"{run_dir} is not a run directory (no config.json)")
    data = configlib.load_dict(path)
    derived = data.pop("derived", {})
    return configlib.from_dict(RunConfig, data), derived


def load_checkpoint(run_dir: str | Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The run's checkpoint; a missing or unreadable one is a SynthlabError (nothing is touched)."""
    path = Path(run_dir) / "checkpoint.pt"
    if not path.is_file():
        raise SynthlabError(f"no checkpoint in {run_dir} (checkpoint.pt missing)")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as err:  # torch raises many types for a damaged file
        raise SynthlabError(f"corrupt checkpoint {path}: {type(err).__name__}") from None
    if not isinstance(ckpt, dict) or not {"model", "step"} <= ckpt.keys():
        raise SynthlabError(f"corrupt checkpoint {path}: missing model state")
    return ckpt


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> None:
    """Write a training state as the run's checkpoint (atomically: the old one or the new one)."""
    atomic_write(Path(run_dir) / "checkpoint.pt", lambda tmp: torch.save(state, tmp))


def save_weights(run_dir: str | Path, model: torch.nn.Module) -> None:
    """Write the model's weights as the run's model.safetensors (atomically; tied tensors once)."""
    from safetensors.torch import save_model

    atomic_write(Path(run_dir) / WEIGHTS, lambda tmp: save_model(model, str(tmp)))


def load_weights(model: torch.nn.Module, run_dir: str | Path, device: torch.device | str = "cpu") -> None:
    """Load the weights of the run in `run_dir` into `model` (which must have the run's shape):
    model.safetensors of a finished run, else the checkpoint of an interrupted one."""
    path = Path(run_dir) / WEIGHTS
    try:
        if path.is_file():
            from safetensors.torch import load_model as load_safetensors

            load_safetensors(model, str(path), device=str(device))
        else:
            model.load_state_dict(load_checkpoint(run_dir, device)["model"])
    except RuntimeError as err:
        raise SynthlabError(f"the weights in {run_dir} do not fit this model: {str(err).splitlines()[0]}") from None


def open_run(run_dir: str | Path, device: torch.device | str = "cpu"):
    """(model in eval mode, RunConfig, derived) from a finished or interrupted run."""
    run, derived = load_run(run_dir)
    model = build_model(run.model).to(device)  # weights come from the run folder
    load_weights(model, run_dir, device)
    return model.eval(), run, derived


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


def trained_data(run_dir: str | Path, run: RunConfig, derived: dict[str, Any], moved_to: str | Path | None = None) -> Path:
    """The data folder the run was trained on (or `moved_to`, its new place), checked: there, and
    the same dataset (the sha256s recorded at training start; older runs are only looked for)."""
    path = Path(moved_to if moved_to is not None else run.train.data).resolve()
    if not (path / "meta.json").is_file() and moved_to is not None:
        raise SynthlabError(f"--data {moved_to} is not a dataset folder (no meta.json)")
    if not (path / "meta.json").is_file():
        raise SynthlabError(f"run {run_dir} was trained on {path}, which is gone (moved?); pass --data DIR "
                            f"with the dataset's new place")
    recorded = derived.get("data_sha256")
    if recorded is not None:
        changed = sorted(n for n, digest in data_sha256(path).items() if recorded.get(n) != digest)
        changed += sorted(set(recorded) - set(data_sha256(path)))
        if changed:
            raise SynthlabError(f"{path} is not the dataset run {run_dir} was trained on ({changed[0]} changed: "
                                f"regenerated?); pass --data DIR with the original dataset")
    return path


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl records, in order."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise SynthlabError(f"no metrics.jsonl in {run_dir}")
    return [json.loads(line) for line in path.read_text().splitlines() if line]
