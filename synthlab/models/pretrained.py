"""`save_pretrained` / `from_pretrained` for synthlab models: a folder with config.json (the
ModelConfig) and model.safetensors, the layout of huggingface_hub's PyTorchModelHubMixin, read
and written with no network.

The mixin itself is not used: it would serialise the config with `dataclasses.asdict` (no
validation, unknown keys passed through) and write its own README; here the config goes through
synthlab.serialize, so a misspelt or invalid field fails with one line naming it. A run folder
(config.json with a [model] section, model.safetensors written at the end of training) also loads
with `from_pretrained`.
"""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import torch

from synthlab import serialize
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write, atomic_write_text
from synthlab.models.config import ModelConfig

CONFIG, WEIGHTS = "config.json", "model.safetensors"


def _read_config(folder: Path) -> tuple[dict, bool] | None:
    """(the model's config dict, whether `folder` is a run folder), or None when there is no config.json."""
    path = folder / CONFIG
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SynthlabError(f"{path} is not readable JSON: {err}") from None
    is_run = isinstance(data, dict) and isinstance(data.get("model"), dict) and "train" in data
    return (data["model"] if is_run else data), is_run


class PretrainedMixin:
    """Adds `save_pretrained(folder)` and `cls.from_pretrained(folder)` to a module built from
    `cls(config: ModelConfig)`."""

    config: ModelConfig

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write config.json and model.safetensors (tied weights once) into `folder`; refuses a run
        folder (its config.json is the run's) and a config.json that is not a synthlab model's."""
        folder = Path(folder)
        found = _read_config(folder)
        if found is not None:
            if found[1]:
                raise SynthlabError(f"{folder} is a training run: save_pretrained into another folder")
            serialize.from_dict(ModelConfig, found[0])  # ours to replace
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / WEIGHTS, lambda tmp: safetensors.torch.save_model(self, str(tmp)))
        atomic_write_text(folder / CONFIG, json.dumps(serialize.to_dict(self.config), indent=2) + "\n")
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: torch.device | str = "cpu"):
        """The model saved in `folder` (by `save_pretrained`, or a finished training run), in eval mode."""
        folder = Path(folder)
        found = _read_config(folder)
        if found is None:
            raise SynthlabError(f"{folder} has no {CONFIG}: not a saved synthlab model")
        if not (folder / WEIGHTS).is_file():
            hint = " (an unfinished run: synthlab.load_model reads its checkpoint)" if found[1] else ""
            raise SynthlabError(f"{folder} has no {WEIGHTS}{hint}")
        config = serialize.from_dict(ModelConfig, found[0])
        model = cls(config).to(device)  # type: ignore[call-arg]
        try:
            safetensors.torch.load_model(model, str(folder / WEIGHTS), device=str(device))
        except RuntimeError as err:
            raise SynthlabError(f"the weights in {folder} do not fit its config: {str(err).splitlines()[0]}") from None
        return model.eval()
