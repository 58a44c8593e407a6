"""`synthlab export`: a trained synthlab model as a Qwen2 checkpoint folder that transformers loads.

The folder is what `Qwen2ForCausalLM.save_pretrained` and `PreTrainedTokenizerFast.save_pretrained`
write (config.json, model.safetensors, tokenizer.json, tokenizer_config.json, ...), so
`AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load it with no
synthlab code. Only a model whose computation is Qwen2's block stack can be exported: loops = 1 and
no recurrence module, SwiGLU MLP, pre-norm RMSNorm, RoPE, no bias besides q / k / v (`qkv_bias`;
a model without them gets zero biases), the head tied or not. Every other model is refused with
one line naming the option (`qwen2_refusal`).

Weight mapping, layer by layer (prelude, core, coda in order; a loops = 1 sandwich with injection
none and state init input is the same stack):
    attn_norm -> input_layernorm            mlp_norm -> post_attention_layernorm
    attn.qkv (rows q | k | v) -> q_proj, k_proj, v_proj (+ biases)
    attn.o -> o_proj                        mlp.up (rows gate | up) -> gate_proj, up_proj
    mlp.down -> down_proj                   embed, final_norm, lm_head -> embed_tokens, norm, lm_head
The tokenizer is the lab's own (synthlab.data.tokenizer: the dataset's vocab.json, same ids) written in
the one form `AutoTokenizer` keeps for a qwen2 folder. transformers rebuilds any qwen2 tokenizer as
its Qwen2Tokenizer (byte-level BPE: Qwen's digit-splitting regex, a byte-level decoder that joins
tokens with nothing between them), keeping only the vocabulary and the added tokens. So every
vocabulary word is an added token (matched whole, before that regex) whose text carries the space
in front of it, `<bos>` alone excepted: `<bos> <len_2> * 3` is `<bos>`, ` <len_2>`, ` *`, ` 3`, and
decoding joins them back into the same text. Every lab sequence starts with `<bos>`; a text that
does not must start with a space (` Ana was born`): a bare first word matches no added token and,
having no bytes in the vocabulary, is dropped. synthlab itself reads an exported folder's documents
with the lab's tokenizer (WORD_VOCAB, synthlab.ouroboros.checkpoint.load_tokenizer), where it is not.

transformers is imported inside the functions that build its objects: `synthlab.sweeps.lab_runner`
imports this module (`qwen2_refusal` checks a point), and a sweep that exports nothing never pays
for it (about 3 s).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from synthlab.data.tokenizer import WordTokenizer
from synthlab.errors import SynthlabError
from synthlab.files import as_new_file, check_out, make_temp_sibling, replace_dir
from synthlab.models import ModelConfig
from synthlab.ouroboros.card import model_card
from synthlab.ouroboros.checkpoint import WORD_VOCAB, without_progress_bars
from synthlab.ouroboros.remote import write_remote
from synthlab.training.run_folders import load_run, open_run, trained_data

FORMATS = ("qwen2", "remote")
RMS_EPS = 1e-5  # synthlab.models.layers.make_norm's
MARKER = "synthlab_export.json"  # the files an export wrote: a rerun may replace exactly those


def qwen2_refusal(c: ModelConfig) -> str | None:
    """Why Qwen2 cannot express a model of config `c` (one line), or None when it can."""
    plain_sandwich = c.injection == "none" and c.state_init == "input"
    checks = [
        (
            c.loops == 1,
            f"loops = {c.loops}: Qwen2 has no recurrence (export a loops = 1 model, or use --format remote)",
        ),
        (
            c.topology == "ouro" or plain_sandwich,
            f"a sandwich with injection = {c.injection}, state_init = {c.state_init} is not a plain layer stack",
        ),
        (c.mlp == "swiglu", f"mlp = {c.mlp}: Qwen2's MLP is SwiGLU"),
        (c.positions == "rope", f"positions = {c.positions}: Qwen2 uses RoPE"),
        (c.norm == "pre", f"norm = {c.norm}: Qwen2 is pre-norm"),
        (c.norm_type == "rmsnorm", f"norm_type = {c.norm_type}: Qwen2 uses RMSNorm"),
        (not c.bias, "bias = true: Qwen2 has biases on q, k, v only (train with qkv_bias instead)"),
        (c.controller == "none", f"controller = {c.controller}: Qwen2 has no LoRA modulation"),
        (not c.recurrence_gate and not c.step_norm, "a recurrence gate or step norm has no Qwen2 equivalent"),
        (not c.exit_gate, "exit_gate = true: Qwen2 has no exit gate"),
    ]
    return next(
        (f"Qwen2 cannot express this model: {why} (--format remote exports any model)" for ok, why in checks if not ok),
        None,
    )


def qwen2_config(c: ModelConfig, tokenizer: WordTokenizer):
    from transformers import Qwen2Config  # see the module docstring

    ids = {
        name: tokenizer.id(tok) if tok in tokenizer.tokens else None
        for name, tok in (("pad", "<pad>"), ("bos", "<bos>"), ("eos", "<eos>"))
    }
    return Qwen2Config(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.ff_dim,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_heads,
        hidden_act="silu",
        max_position_embeddings=c.max_seq_len,
        rms_norm_eps=RMS_EPS,
        tie_word_embeddings=c.tie_head,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_base},
        use_sliding_window=False,
        attention_dropout=0.0,
        pad_token_id=ids["pad"],
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
    )


@torch.no_grad()
def qwen2_state(model) -> dict[str, torch.Tensor]:
    """The Qwen2ForCausalLM state dict of a loops = 1 synthlab model (float32, CPU)."""
    c = model.config
    d, f = c.d_model, c.ff_dim
    state = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.final_norm.weight}
    if model.lm_head is not None:
        state["lm_head.weight"] = model.lm_head.weight
    for i, block in enumerate([*model.prelude, *model.core, *model.coda]):
        p = f"model.layers.{i}."
        qkv = block.attn.qkv
        bias = qkv.bias if qkv.bias is not None else torch.zeros(3 * d)
        for k, name in enumerate(("q_proj", "k_proj", "v_proj")):
            state[f"{p}self_attn.{name}.weight"] = qkv.weight[k * d : (k + 1) * d]
            state[f"{p}self_attn.{name}.bias"] = bias[k * d : (k + 1) * d]
        state[f"{p}self_attn.o_proj.weight"] = block.attn.o.weight
        state[f"{p}mlp.gate_proj.weight"] = block.mlp.up.weight[:f]
        state[f"{p}mlp.up_proj.weight"] = block.mlp.up.weight[f:]
        state[f"{p}mlp.down_proj.weight"] = block.mlp.down.weight
        state[f"{p}input_layernorm.weight"] = block.attn_norm.weight
        state[f"{p}post_attention_layernorm.weight"] = block.mlp_norm.weight
    return {k: v.detach().float().cpu().contiguous() for k, v in state.items()}


def hf_tokenizer(tokenizer: WordTokenizer):
    """The lab's vocabulary as the PreTrainedTokenizerFast that `AutoTokenizer` loads back unchanged
    (module docstring): same ids, decoding gives the text back."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    texts = [tok if tok == "<bos>" else f" {tok}" for tok in tokenizer.tokens]
    core = Tokenizer(
        BPE(
            vocab={text: i for i, text in enumerate(texts)},
            merges=[],
            unk_token=None,
            fuse_unk=False,
            byte_fallback=False,
            continuing_subword_prefix="",
            end_of_word_suffix="",
        )
    )
    # Qwen2Tokenizer's own pipeline, so that a PreTrainedTokenizerFast reading tokenizer.json and
    # AutoTokenizer's rebuild agree; the vocabulary is matched by the added tokens before it runs.
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    special = set(tokenizer.special_tokens)
    core.add_tokens(
        [AddedToken(text, normalized=False, special=tok in special) for tok, text in zip(tokenizer.tokens, texts)]
    )
    named = {
        name: texts[tokenizer.tokens.index(tok)]
        for name, tok in (("pad_token", "<pad>"), ("bos_token", "<bos>"), ("eos_token", "<eos>"))
        if tok in tokenizer.tokens
    }
    extra = [texts[i] for i, tok in enumerate(tokenizer.tokens) if tok in special and texts[i] not in named.values()]
    # unk_token None: Qwen2Tokenizer would otherwise append its own <|endoftext|> as a new id
    return PreTrainedTokenizerFast(
        tokenizer_object=core, clean_up_tokenization_spaces=False, unk_token=None, extra_special_tokens=extra, **named
    )


def finish_folder(tokenizer: WordTokenizer, folder: Path, card: str | None) -> None:
    """Beside the saved model: the tokenizer files AutoTokenizer reads, the lab's vocabulary
    (WORD_VOCAB), the model card; every file readable like any new file (safetensors writes 0600)."""
    hf_tokenizer(tokenizer).save_pretrained(folder)
    (folder / WORD_VOCAB).write_text(tokenizer.to_json(), encoding="utf-8")
    if card is not None:
        (folder / "README.md").write_text(card, encoding="utf-8")
    for path in folder.iterdir():
        as_new_file(path)


def export_model(
    model,
    tokenizer: WordTokenizer,
    out: str | Path,
    overwrite: bool = False,
    card: str | None = None,
    fmt: str = "qwen2",
) -> Path:
    """Write a synthlab `model` and its vocabulary to `out` as a Qwen2 checkpoint folder, or (`fmt`
    remote) any model with the lab's code beside it (synthlab.ouroboros.remote); written beside
    `out` and swapped into place at the end, with `card` as its README.md. Refuses a model Qwen2
    cannot express, and an `out` holding anything but an earlier export unless `overwrite` (`check_out`)."""
    if fmt == "remote":
        specials = {f"{name}_token_id": tokenizer.id(f"<{name}>") for name in ("bos", "eos", "pad")}

        def save(folder: Path) -> None:
            write_remote(model, folder, specials)
    else:
        from transformers import Qwen2ForCausalLM

        why = qwen2_refusal(model.config)
        if why is not None:
            raise SynthlabError(why)
        with torch.random.fork_rng(devices=[]):  # HF's init draws from the global generator: left as it was
            hf = Qwen2ForCausalLM(qwen2_config(model.config, tokenizer))
        missing, unexpected = hf.load_state_dict(qwen2_state(model), strict=False)
        if unexpected or set(missing) - {"lm_head.weight"} or (missing and not model.config.tie_head):
            raise SynthlabError(f"export: weights do not map onto Qwen2 (missing {missing}, unexpected {unexpected})")

        def save(folder: Path) -> None:
            with without_progress_bars():
                hf.eval().save_pretrained(folder)

    out = Path(out)
    check_out(out, overwrite, own=is_export)
    tmp = make_temp_sibling(out)
    try:
        save(tmp)
        finish_folder(tokenizer, tmp, card)
        files = sorted(p.name for p in tmp.iterdir())  # what a later export may replace without --overwrite
        (tmp / MARKER).write_text(json.dumps({"format": fmt, "files": files}, indent=1) + "\n")
        replace_dir(tmp, out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError):  # a full disk: one line, the earlier export untouched
            raise SynthlabError(f"cannot write --out {out}: {err.strerror or err}") from None
        raise
    return out


def is_export(folder: Path) -> bool:
    """Whether `folder` holds an earlier export and nothing else (its marker lists every file)."""
    try:
        listed = set(json.loads((folder / MARKER).read_text())["files"]) | {MARKER}
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return {p.name for p in folder.iterdir()} <= listed


def export_run(
    run_dir: str | Path, out: str | Path, fmt: str = "qwen2", data: str | Path | None = None, overwrite: bool = False
) -> Path:
    """The trained model of `run_dir`, with its dataset's vocabulary (`data`: the dataset's new
    place if it moved), exported to `out` in format `fmt`."""
    if fmt not in FORMATS:
        raise SynthlabError(f"--format must be one of {', '.join(FORMATS)}, got '{fmt}'")
    check_out(Path(out), overwrite, own=is_export, source=Path(run_dir))
    run, derived = load_run(run_dir)
    why = qwen2_refusal(run.model) if fmt == "qwen2" else None  # before reading any weights
    if why is not None:
        raise SynthlabError(why)
    data_dir = trained_data(run_dir, run, derived, data)
    card = model_card(run_dir, run, derived, data_dir, remote=fmt == "remote")
    return export_model(open_run(run_dir)[0], WordTokenizer.from_file(data_dir), out, overwrite, card, fmt)
