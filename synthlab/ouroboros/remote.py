"""Any synthlab model (loops, sandwich, exit gate, controller) as a Hugging Face folder with remote
code: `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` loads it without synthlab.

The folder ships the lab's own model code, so the logits are the lab's by construction: the
modules of `synthlab/models` the forward pass needs are copied as `synthlab_<name>.py` with their
imports made relative (the three names they take from outside the package come from a small
`synthlab_support.py`), beside `configuration_synthlab.py` and `modeling_synthlab.py` (the
transformers classes; config.json's auto_map names them). The recurrent steps are set at load
(`from_pretrained(DIR, trust_remote_code=True, steps=8)`) or per call (`model(ids, steps=8)`);
`generate` recomputes the whole sequence at every token (no KV cache: the lab's caches are per
recurrent step, which transformers' cache classes do not hold).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import safetensors.torch
import torch

from synthlab import serialize

# the modules of synthlab/models the forward pass imports (not pretrained.py, counting.py, losses.py)
VENDORED = ("config", "controller", "exits", "inference", "layers", "model", "recurrence")
CONFIG_CLASS, MODEL_CLASS = "SynthlabLoopedConfig", "SynthlabLoopedForCausalLM"

SUPPORT = '''"""What the vendored synthlab model modules import from outside their package."""

import dataclasses
import json


class SynthlabError(Exception):
    """A model option or input the model cannot take."""


def option(default, help):
    return dataclasses.field(default=default, metadata={"help": help})


def to_dict(config):
    return json.loads(json.dumps(dataclasses.asdict(config)))


class PretrainedMixin:
    """(synthlab's save_pretrained / from_pretrained: transformers' own serve here)"""
'''

CONFIGURATION = f'''"""The configuration of an exported synthlab model: its ModelConfig fields under `synthlab`."""

from transformers import PretrainedConfig


class {CONFIG_CLASS}(PretrainedConfig):
    model_type = "synthlab_looped"

    def __init__(self, synthlab=None, steps=None, **kwargs):
        self.synthlab = dict(synthlab or {{}})
        self.steps = steps  # recurrent steps per forward pass (None: the trained loops)
        super().__init__(**kwargs)
'''

MODELING = f'''"""An exported synthlab model as a transformers causal LM (the lab's own LoopedGPT inside)."""

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_synthlab import {CONFIG_CLASS}
from .synthlab_config import ModelConfig
from .synthlab_layers import Rotary
from .synthlab_model import LoopedGPT


class {MODEL_CLASS}(PreTrainedModel, GenerationMixin):
    config_class = {CONFIG_CLASS}
    base_model_prefix = "looped"
    _supports_cache_class = False

    def __init__(self, config):
        super().__init__(config)
        fields = {{k: tuple(v) if isinstance(v, list) else v for k, v in config.synthlab.items()}}
        self.looped = LoopedGPT(ModelConfig(**fields))
        self.post_init()

    def _init_weights(self, module):
        pass  # LoopedGPT initialises itself; the saved weights replace it

    def get_input_embeddings(self):
        return self.looped.embed

    def _derived_buffers(self):
        """The RoPE tables again: transformers builds the model without memory and loads only the
        saved tensors, and these (derived from the config) are not saved."""
        c = self.looped.config
        for module in self.looped.modules():
            if isinstance(module, Rotary):
                fresh = Rotary(c.head_dim, c.max_seq_len, c.rope_base)
                module.cos, module.sin = fresh.cos.to(self.device), fresh.sin.to(self.device)
        self._derived_ready = True

    def forward(self, input_ids=None, attention_mask=None, steps=None, labels=None, **kwargs):
        """Logits of the last recurrent step (`steps`, else config.steps, else the trained loops);
        with labels, the mean next-token cross-entropy."""
        if not getattr(self, "_derived_ready", False):
            self._derived_buffers()
        out = self.looped(input_ids, steps=steps or self.config.steps, all_steps=False)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(
                out.logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=out.logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {{"input_ids": input_ids}}  # the whole sequence every token: no cache
'''


def vendored_source(name: str) -> str:
    """synthlab/models/<name>.py with its imports pointing into the exported folder."""
    text = (Path(__file__).resolve().parent.parent / "models" / f"{name}.py").read_text(encoding="utf-8")
    text = re.sub(r"from synthlab\.models\.(\w+) import", r"from .synthlab_\1 import", text)
    text = text.replace("from .synthlab_pretrained import", "from .synthlab_support import")
    for outside in ("errors", "serialize"):
        text = text.replace(f"from synthlab.{outside} import", "from .synthlab_support import")
    if re.search(r"^\s*(from|import) synthlab\b", text, flags=re.M):
        raise RuntimeError(f"synthlab/models/{name}.py imports synthlab in a way the export does not rewrite")
    return text


def write_remote(model, folder: Path, special_ids: dict[str, int]) -> None:
    """Write `model` (a LoopedGPT) into `folder` as remote code: the code files, config.json,
    model.safetensors and generation_config.json (greedy, no cache)."""
    for name in VENDORED:
        (folder / f"synthlab_{name}.py").write_text(vendored_source(name), encoding="utf-8")
    (folder / "synthlab_support.py").write_text(SUPPORT, encoding="utf-8")
    (folder / "configuration_synthlab.py").write_text(CONFIGURATION, encoding="utf-8")
    (folder / "modeling_synthlab.py").write_text(MODELING, encoding="utf-8")
    config = {
        "model_type": "synthlab_looped",
        "architectures": [MODEL_CLASS],
        "auto_map": {
            "AutoConfig": f"configuration_synthlab.{CONFIG_CLASS}",
            "AutoModelForCausalLM": f"modeling_synthlab.{MODEL_CLASS}",
        },
        "synthlab": serialize.to_dict(model.config),
        "steps": None,
        "vocab_size": model.config.vocab_size,
        "tie_word_embeddings": False,  # the lab's head reads the embedding itself: nothing to tie
        "torch_dtype": "float32",
        **special_ids,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    state = {f"looped.{k}": v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    safetensors.torch.save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    generation = {"do_sample": False, "use_cache": False, **special_ids}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
