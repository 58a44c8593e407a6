"""OUROBOROS on a local Qwen2-family checkpoint (claim C11): the looped system and its baselines.

Public API:
    OuroborosConfig, OuroborosLM, resolve_split, describe_split, lm_loss, trainable_breakdown, summary
    TARGETS, lora_bases, mean_residual, ModulatedLinear     (synthlab.ouroboros.lora)
    load_base, meta_base, base_layers, load_tokenizer       (synthlab.ouroboros.checkpoint)
    read_texts, pack, split_heldout                         (synthlab.ouroboros.data)
    OuroborosTrainConfig, train, mean_loss                  (synthlab.ouroboros.train)
    build_variant, train_run, eval_run                      (synthlab.ouroboros.runs: run folders)
    export_run, export_model, qwen2_refusal, hf_tokenizer   (synthlab.ouroboros.export: synthlab -> Qwen2)
    model_card                                              (synthlab.ouroboros.card: an export's README.md)
    parse_section, run_stage                                (synthlab.ouroboros.stage: the sweep stage `ouroboros`)
Importing this package imports torch (not transformers, which is loaded by the loaders).
"""

from synthlab.ouroboros.lora import TARGETS, lora_bases
from synthlab.ouroboros.system import (
    LOOPED_VARIANTS,
    VARIANTS,
    OuroborosConfig,
    OuroborosLM,
    lm_loss,
    resolve_split,
    summary,
    trainable_breakdown,
)

__all__ = [
    "LOOPED_VARIANTS",
    "TARGETS",
    "VARIANTS",
    "OuroborosConfig",
    "OuroborosLM",
    "lm_loss",
    "lora_bases",
    "resolve_split",
    "summary",
    "trainable_breakdown",
]
