"""`synthlab ouroboros`: build, train and evaluate OUROBOROS on a local Qwen2 checkpoint (C11)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from synthlab.errors import SynthlabError
from synthlab.files import check_writable

app = typer.Typer(
    help="OUROBOROS on a local Qwen2/Qwen2.5 checkpoint: a controller rewrites one recurrent layer per step.",
    no_args_is_help=True,
    rich_markup_mode=None,  # help text as written: no [markup] (it ate '[default: ...]', 'W[h; h]')
)

_VARIANT_HELP = "controller, static, nogate, truncated or base"


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SynthlabError(f"{name} must be comma-separated integers, got '{text}'") from None
    if not values:
        raise SynthlabError(f"{name} must name at least one value")
    return values


def _ouroboros_config(variant, prelude_layers, recurrent_layer, coda_layers, rank, alpha, controller_hidden,
                      max_steps):
    from synthlab import config as cfgio
    from synthlab.hf.system import OuroborosConfig

    return cfgio.merge(OuroborosConfig(), {
        "variant": variant, "prelude_layers": prelude_layers, "recurrent_layer": recurrent_layer,
        "coda_layers": coda_layers, "rank": rank, "alpha": alpha, "controller_hidden": controller_hidden,
        "max_steps": max_steps,
    })


@app.command()
def build(
    out: Path = typer.Option(..., "--out", help="Folder to write summary.json into."),
    base: Path | None = typer.Option(None, "--base", help="Local Qwen2 checkpoint folder (config.json + weights)."),
    base_config: Path | None = typer.Option(
        None, "--base-config", help="A Qwen2 config.json instead of --base: shapes only, on the meta device."),
    variant: str = typer.Option("controller", help=f"System variant: {_VARIANT_HELP}."),
    prelude_layers: int | None = typer.Option(
        None, help="Prelude layers (default: round(8 L / 36), at least 1, fewer where the base is too shallow)."),
    recurrent_layer: int | None = typer.Option(
        None, help="Index of the recurrent layer (default: L // 2, or the middle of what lies between prelude and coda)."),
    coda_layers: int | None = typer.Option(
        None, help="Coda layers (default: round(8 L / 36), at least 1, fewer where the base is too shallow)."),
    rank: int = typer.Option(32, help="LoRA rank r of the fixed SVD bases."),
    alpha: float = typer.Option(16.0, help="LoRA alpha; the update is scaled by alpha / r."),
    controller_hidden: int = typer.Option(320, help="Width of the controller MLP."),
    max_steps: int = typer.Option(16, help="Largest recurrent depth (per-step norms and step embeddings)."),
    device: str | None = typer.Option(None, help="Device for --base (default: cuda if available, else cpu)."),
) -> None:
    """Build the system (SVD bases included) and write DIR/summary.json: trainable_params, split, rank, alpha.
    The split is checked against the base's depth (config.json) before the base is read or anything written."""
    import torch

    from synthlab.files import atomic_write_text
    from synthlab.hf.checkpoint import base_layers, load_base, meta_base, resolve_dtype
    from synthlab.hf.system import OuroborosLM, describe_split, resolve_split, summary
    from synthlab.runs import resolve_device

    if (base is None) == (base_config is None):
        raise SynthlabError("give exactly one of --base PATH or --base-config CONFIG.json")
    check_writable(out)
    config = _ouroboros_config(variant, prelude_layers, recurrent_layer, coda_layers, rank, alpha,
                               controller_hidden, max_steps)
    resolve_split(base_layers(base or base_config), config)
    if base is not None:
        dev = resolve_device(device or "auto")
        model = load_base(base, device=dev, dtype=resolve_dtype(None, dev))
    else:
        model = meta_base(base_config)
    system = OuroborosLM(model, config, torch.Generator().manual_seed(0))
    info = summary(system) | {"base": str(base or base_config), "meta": base is None}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "summary.json", json.dumps(info, indent=2) + "\n")
    typer.echo(f"{config.variant}: {info['trainable_params']:,} trainable parameters "
               f"({info['trainable_params'] / 1e6:.2f}M); {describe_split(system.split)} -> {out / 'summary.json'}")


@app.command()
def train(
    base: Path = typer.Option(..., "--base", help="Local Qwen2 checkpoint folder (with its tokenizer)."),
    corpus: Path = typer.Option(..., "--corpus", help="Training text: .txt, .jsonl (field --text-field) or .parquet."),
    out: Path = typer.Option(..., "--out", help="Run folder: run.json, <variant>/trainable.safetensors, logs."),
    variants: str = typer.Option("controller,static,nogate", help="Looped variants to train, comma-separated."),
    config: Path | None = typer.Option(None, "--config", help="TOML/JSON OuroborosTrainConfig; flags override it."),
    steps: int | None = typer.Option(None, help="Optimiser steps per variant (default 1000)."),
    seq_len: int | None = typer.Option(None, help="Packed sequence length (default 2048)."),
    batch_size: int | None = typer.Option(None, help="Sequences per micro-batch (default 4)."),
    grad_accum: int | None = typer.Option(None, help="Micro-batches per step (default 8: effective batch 32)."),
    lr: float | None = typer.Option(None, help="Peak learning rate (default 3e-4)."),
    warmup_steps: int | None = typer.Option(None, help="Warmup steps (default min(2000, steps // 10))."),
    depths: str | None = typer.Option(None, help="Depths drawn per step, e.g. 4,8,16 (one value: fixed)."),
    seed: int | None = typer.Option(None, help="Seed of the data order, depth draws and controller init."),
    checkpoint_every: int | None = typer.Option(
        None, help="Save the whole training state every K steps (default 0: at the end only); rerunning the same "
                   "command into --out resumes a variant from its last checkpoint."),
    per_document: bool | None = typer.Option(
        None, "--per-document/--packed", help="One document per sequence (padded, BOS first: how a synthlab base "
                                              "was trained) or a packed stream (default)."),
    rank: int = typer.Option(32, help="LoRA rank r."),
    alpha: float = typer.Option(16.0, help="LoRA alpha."),
    controller_hidden: int = typer.Option(320, help="Width of the controller MLP."),
    max_steps: int = typer.Option(16, help="Largest recurrent depth."),
    prelude_layers: int | None = typer.Option(None, help="Prelude layers (default proportional)."),
    recurrent_layer: int | None = typer.Option(None, help="Recurrent layer index (default L // 2)."),
    coda_layers: int | None = typer.Option(None, help="Coda layers (default proportional)."),
    text_field: str = typer.Option("text", help="Field / column holding the text in .jsonl / .parquet."),
    device: str | None = typer.Option(None, help="Device (default: cuda if available, else cpu)."),
    dtype: str | None = typer.Option(None, help="Base dtype: bfloat16 (GPU default), float32 (CPU default), float16."),
    attn: str = typer.Option("sdpa", help="Attention implementation: sdpa or eager (always causal-masked)."),
    fsdp: bool = typer.Option(
        False, "--fsdp", help="Under torchrun: shard the frozen base over the processes with PyTorch's FSDP (1/K of "
                              "it on each), for a base that does not fit one device; same training and checkpoints."),
) -> None:
    """Train the looped variants on a local corpus (resumes when rerun); checkpoints hold the trainable parameters only."""
    from synthlab import config as cfgio
    from synthlab.distributed import reporting
    from synthlab.hf.checkpoint import base_layers
    from synthlab.hf.runs import train_run
    from synthlab.hf.system import resolve_split
    from synthlab.hf.train import OuroborosTrainConfig

    check_writable(out)
    train_config = cfgio.load(OuroborosTrainConfig, config) if config else OuroborosTrainConfig()
    train_config = cfgio.merge(train_config, {
        "steps": steps, "seq_len": seq_len, "batch_size": batch_size, "grad_accum": grad_accum, "lr": lr,
        "warmup_steps": warmup_steps, "seed": seed, "checkpoint_every": checkpoint_every,
        "per_document": per_document,
        "depths": _int_list(depths, "depths") if depths else None,
    })
    ouroboros = _ouroboros_config("controller", prelude_layers, recurrent_layer, coda_layers, rank, alpha,
                                  controller_hidden, max_steps)
    resolve_split(base_layers(base), ouroboros)  # a bad split is an error before the base is read
    names = [v.strip() for v in variants.split(",") if v.strip()]
    run = train_run(str(base), str(corpus), out, names, ouroboros, train_config, device=device, dtype=dtype,
                    attn=attn, text_field=text_field, fsdp=fsdp)
    if not reporting():
        return
    if "base_held" in run:
        held = run["base_held"]
        typer.echo(f"FSDP: at most {held['most_per_process']:,} of the base's {held['total']:,} parameters "
                   f"on one process")
    typer.echo(f"trained {', '.join(names)} -> {out}")


@app.command("eval")
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run folder written by `synthlab ouroboros train`."),
    depths: str = typer.Option("1,4,8,16", help="Recurrent depths to evaluate, comma-separated."),
    corpus: Path | None = typer.Option(None, "--corpus", help="A second corpus (another distribution)."),
    batch_size: int = typer.Option(4, help="Sequences per evaluation batch."),
    max_sequences: int | None = typer.Option(None, help="Evaluate at most this many sequences per corpus."),
    device: str | None = typer.Option(None, help="Device (default: cuda if available, else cpu)."),
    dtype: str | None = typer.Option(None, help="Base dtype (default bfloat16 on GPU, float32 on CPU)."),
    fsdp: bool = typer.Option(False, "--fsdp", help="Under torchrun: shard the base over the processes (FSDP)."),
) -> None:
    """Loss vs depth for every variant; writes results.csv, results.json and c11_loss_vs_depth.png.
    Under torchrun each process evaluates its share of the sequences (the same numbers as one process)."""
    from synthlab.distributed import reporting
    from synthlab.hf.runs import eval_run
    from synthlab.hf.system import VARIANT_ROWS

    table = eval_run(run_dir, _int_list(depths, "depths"), str(corpus) if corpus else None, batch_size=batch_size,
                     max_sequences=max_sequences, device=device, dtype=dtype, fsdp=fsdp)
    if not reporting():
        return
    wide = table.pivot_table(index=["corpus", "variant"], columns="depth", values="loss", observed=True)
    typer.echo(wide.round(4).to_string())
    typer.echo("loss: mean next-token cross-entropy (nats) over the corpus's sequences, lower is better; columns: "
               "recurrent depth")
    for variant in table["variant"].cat.categories:
        typer.echo(f"  {variant}: {VARIANT_ROWS[variant]}")
    for name, rows in table[table["depth"] == table["depth"].min()].groupby("corpus", observed=True):
        loss = rows.set_index("variant")["loss"]
        if loss["base"] > loss["truncated"]:
            typer.echo(f"  {name}: base is {loss['base'] - loss['truncated']:.2f} nats above truncated: on this corpus "
                       f"the full checkpoint predicts worse than its own cut-down copy (the layers cut out hurt "
                       f"here); the looped variants start from truncated")
    typer.echo(f"-> {run_dir / 'results.csv'}, {run_dir / 'c11_loss_vs_depth.png'}")
