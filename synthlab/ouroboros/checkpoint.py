"""Loading a local Qwen2-family checkpoint (never downloading), or a config-only meta model.

transformers (about 3 s to import) is imported inside the functions that use it: the lab's sweeps
load this module with `synthlab.ouroboros.export` (`synthlab.sweeps.lab_runner` checks every point
with it) and most of their points never read a Qwen2 checkpoint.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from synthlab.data.tokenizer import WordTokenizer
from synthlab.errors import SynthlabError

# Implementations that honour the explicit 4-D additive causal mask the system passes to every layer.
ATTENTION = ("sdpa", "eager")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WORD_VOCAB = "synthlab_vocab.json"  # the lab's word vocabulary, in an exported folder (synthlab.ouroboros.export)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """bfloat16 on a GPU, float32 on the CPU, unless given."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise SynthlabError(f"dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    return DTYPES[dtype]


def base_layers(path: str | Path) -> int:
    """The number of decoder layers of a base (a checkpoint folder or its config.json), read from
    the config alone, so that a split can be checked before the weights are."""
    path = Path(path)
    config_path = path / "config.json" if path.is_dir() else path
    try:
        layers = json.loads(config_path.read_text(encoding="utf-8"))["num_hidden_layers"]
    except FileNotFoundError:
        raise SynthlabError(f"base: no config.json at '{config_path}'") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SynthlabError(f"base: cannot read num_hidden_layers from {config_path}: {err}") from None
    if not isinstance(layers, int) or isinstance(layers, bool):
        raise SynthlabError(f"base: num_hidden_layers in {config_path} is not an integer: {layers!r}")
    return layers


def load_base(path: str | Path, *, device: torch.device, dtype: torch.dtype, attn: str = "sdpa") -> nn.Module:
    """A Qwen2ForCausalLM from a local folder (config.json + weights), frozen, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM  # see the module docstring

    if attn not in ATTENTION:
        raise SynthlabError(
            f"attn must be one of {', '.join(ATTENTION)} (both get the explicit causal mask), got '{attn}'"
        )
    path = Path(path)
    if not (path / "config.json").is_file():
        raise SynthlabError(f"base: no config.json in '{path}' (expected a local checkpoint folder)")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type != "qwen2":
        raise SynthlabError(f"base: '{path}' is model_type '{config.model_type}', not a Qwen2-family checkpoint")
    with without_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype, attn_implementation=attn)
    return model.to(device).eval().requires_grad_(False)


def empty_base(path: str | Path, *, dtype: torch.dtype, attn: str = "sdpa") -> nn.Module:
    """The Qwen2ForCausalLM of a local folder as `load_base` builds it, on the meta device: its
    shapes and dtypes without weights (FSDP fills each process's shards, `distributed.fill_from_rank0`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(Path(path), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    return model.eval().requires_grad_(False)


@contextmanager
def without_progress_bars():
    """transformers' loading and saving bars off (a bar over a few dozen tensors, once per run, is
    noise in a sweep's log), then back as they were."""
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def meta_base(config_path: str | Path) -> nn.Module:
    """A Qwen2ForCausalLM on the meta device built from a config.json alone (shapes, no weights)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config_path = Path(config_path)
    if not config_path.is_file():
        raise SynthlabError(f"base-config: file not found: {config_path}")
    try:
        config = Qwen2Config.from_json_file(str(config_path))
    except (ValueError, OSError) as err:
        raise SynthlabError(f"base-config: cannot read {config_path}: {err}") from None
    with torch.device("meta"):
        return Qwen2ForCausalLM(config).eval().requires_grad_(False)


def load_tokenizer(path: str | Path):
    """The checkpoint's own tokenizer.

    A folder written by `synthlab export` carries the lab's word vocabulary (WORD_VOCAB): its
    documents are read with the lab's own tokenizer, as the base was trained (a document's first
    word needs no leading space there, unlike in the byte-level form AutoTokenizer loads).
    Otherwise tokenizer.json, when present, is loaded as exactly that file
    (PreTrainedTokenizerFast): transformers 5's AutoTokenizer picks the tokenizer class from
    config.json's model_type and may rebuild it from vocab/merges, which silently mis-tokenises a
    folder whose tokenizer.json is not the stock Qwen one.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(path)
    if (path / WORD_VOCAB).is_file():
        return WordTokenizer.from_file(path / WORD_VOCAB).transformers_tokenizer()
    if (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as err:
        raise SynthlabError(f"base: no usable tokenizer in '{path}': {err}") from None
