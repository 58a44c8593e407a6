"""A tiny random Qwen2 for the OUROBOROS tests, built here (code never downloads a model)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SMALL = {  # 6 layers of width 32: deep enough for a prelude, a recurrent block and a coda
    "vocab_size": 32,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
    "initializer_range": 0.1,
}


def tiny_qwen2(**overrides):
    """SMALL (with `overrides`), initialised from seed 0 without moving the global generator: the
    HF initialiser draws from it, and a test's own draws must not depend on which model came first."""
    import transformers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**{**SMALL, **overrides}))


def save_checkpoint(folder: Path, words: list[str], docs: list[str], **overrides) -> Path:
    """A checkpoint folder as a real one is laid out: the model, a WordLevel tokenizer over `words`
    (with <unk> and <eos>), and `docs` as the training corpus train.jsonl beside them."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(folder)
    tiny_qwen2(**overrides).save_pretrained(folder)
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return folder
