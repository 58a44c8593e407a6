"""`synthlab ouroboros`: build, train and evaluate OUROBOROS on a local Qwen2 checkpoint (C11)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from synthlab.cli import flags
from synthlab.errors import SynthlabError
from synthlab.files import check_out

app = typer.Typer(
    help="OUROBOROS on a local Qwen2/Qwen2.5 checkpoint: a controller rewrites one recurrent layer per step.",
    no_args_is_help=True,
    rich_markup_mode=None,  # help text as written: no [markup] (it ate '[default: ...]', 'W[h; h]')
)


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SynthlabError(f"{name} must be comma-separated integers, got '{text}'") from None
    if not values:
        raise SynthlabError(f"{name} must name at least one value")
    return values


_DEVICE_HELP = "Device (default: cuda if available, else cpu)."


def _build(**kwargs) -> None:
    import torch

    from synthlab import serialize
    from synthlab.files import atomic_write_text
    from synthlab.ouroboros.checkpoint import base_layers, load_base, meta_base, resolve_dtype
    from synthlab.ouroboros.system import OuroborosLM, describe_split, resolve_split, summary
    from synthlab.training.configs import OuroborosConfig
    from synthlab.training.run_folders import resolve_device

    out, base, base_config, device, overwrite = (
        kwargs.pop(k) for k in ("out", "base", "base_config", "device", "overwrite")
    )
    if (base is None) == (base_config is None):
        raise SynthlabError("give exactly one of --base PATH or --base-config CONFIG.json")
    check_out(out, overwrite, own=_is_build)
    config = serialize.merge(OuroborosConfig(), flags.given(kwargs, OuroborosConfig))
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
    typer.echo(
        f"{config.variant}: {info['trainable_params']:,} trainable parameters "
        f"({info['trainable_params'] / 1e6:.2f}M); {describe_split(system.split)} -> {out / 'summary.json'}"
    )


def _is_build(folder: Path) -> bool:
    """Whether `folder` holds an earlier `build`'s summary.json and nothing else."""
    from synthlab.files import lab_output

    return lab_output(folder) == "an OUROBOROS build" and {p.name for p in folder.iterdir()} == {"summary.json"}


_OVERWRITE_HELP = (
    "Write into --out although it holds files this command did not write (never another command's output)."
)


def _build_command():
    """`synthlab ouroboros build`: every OuroborosConfig field is a flag (help from the field)."""
    from synthlab.training.configs import OuroborosConfig

    params = [
        flags.option("out", Path, ..., "--out", "Folder to write summary.json into (an earlier build's is replaced)."),
        flags.option("overwrite", bool, False, "--overwrite", _OVERWRITE_HELP),
        flags.option("base", Optional[Path], None, "--base", "Local Qwen2 checkpoint folder (config.json + weights)."),
        flags.option(
            "base_config",
            Optional[Path],
            None,
            "--base-config",
            "A Qwen2 config.json instead of --base: shapes only, on the meta device.",
        ),
        *flags.dataclass_options(OuroborosConfig, unset=True),
        flags.option("device", Optional[str], None, "--device", _DEVICE_HELP),
    ]
    return flags.with_signature(
        _build,
        params,
        "build",
        "Build the system (SVD bases included) and write "
        "DIR/summary.json: trainable_params, split, rank, alpha. The split is checked against the "
        "base's depth (config.json) before the base is read or anything written.",
    )


def _train(**kwargs) -> None:
    from synthlab import serialize
    from synthlab.ouroboros.checkpoint import base_layers
    from synthlab.ouroboros.runs import train_run
    from synthlab.ouroboros.system import resolve_split
    from synthlab.training.configs import OuroborosConfig, OuroborosTrainConfig
    from synthlab.training.distributed import reporting

    base, corpus, out, variants, config, overwrite = (
        kwargs.pop(k) for k in ("base", "corpus", "out", "variants", "config", "overwrite")
    )
    train_config = serialize.load(OuroborosTrainConfig, config) if config else OuroborosTrainConfig()
    train_config = serialize.merge(train_config, flags.given(kwargs, OuroborosTrainConfig))
    ouroboros = serialize.merge(OuroborosConfig(), flags.given(kwargs, OuroborosConfig))
    resolve_split(base_layers(base), ouroboros)  # a bad split is an error before the base is read
    names = [v.strip() for v in variants.split(",") if v.strip()]
    run = train_run(
        str(base),
        str(corpus),
        out,
        names,
        ouroboros,
        train_config,
        device=kwargs["device"],
        dtype=kwargs["dtype"],
        attn=kwargs["attn"],
        text_field=kwargs["text_field"],
        fsdp=kwargs["fsdp"],
        overwrite=overwrite,
    )
    if not reporting():
        return
    if "base_held" in run:
        held = run["base_held"]
        typer.echo(
            f"FSDP: at most {held['most_per_process']:,} of the base's {held['total']:,} parameters on one process"
        )
    typer.echo(f"trained {', '.join(names)} -> {out}")


def _train_command():
    """`synthlab ouroboros train`: every OuroborosTrainConfig and OuroborosConfig field is a flag."""
    from synthlab.training.configs import OuroborosConfig, OuroborosTrainConfig

    params = [
        flags.option("base", Path, ..., "--base", "Local Qwen2 checkpoint folder (with its tokenizer)."),
        flags.option("corpus", Path, ..., "--corpus", "Training text: .txt, .jsonl (field --text-field) or .parquet."),
        flags.option(
            "out", Path, ..., "--out", "Run folder: run.json, <variant>/trainable.safetensors, logs (a rerun resumes)."
        ),
        flags.option("overwrite", bool, False, "--overwrite", _OVERWRITE_HELP),
        flags.option(
            "variants", str, "controller,static,nogate", "--variants", "Looped variants to train, comma-separated."
        ),
        flags.option("config", Optional[Path], None, "--config", "TOML/JSON OuroborosTrainConfig; flags override it."),
        *flags.dataclass_options(OuroborosTrainConfig, unset=True),
        *flags.dataclass_options(OuroborosConfig, unset=True, exclude=("variant",)),
        flags.option(
            "text_field", str, "text", "--text-field", "Field / column holding the text in .jsonl / .parquet."
        ),
        flags.option("device", Optional[str], None, "--device", _DEVICE_HELP),
        flags.option(
            "dtype",
            Optional[str],
            None,
            "--dtype",
            "Base dtype: bfloat16 (GPU default), float32 (CPU default), float16.",
        ),
        flags.option("attn", str, "sdpa", "--attn", "Attention implementation: sdpa or eager (always causal-masked)."),
        flags.option(
            "fsdp",
            bool,
            False,
            "--fsdp",
            "Under torchrun: shard the frozen base over the processes with PyTorch's FSDP (1/K of it on "
            "each), for a base that does not fit one device; same training and checkpoints.",
        ),
    ]
    return flags.with_signature(
        _train,
        params,
        "train",
        "Train the looped variants on a local corpus (resumes "
        "when rerun); checkpoints hold the trainable parameters only.",
    )


app.command("build")(_build_command())
app.command("train")(_train_command())


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
    """Loss vs depth for every variant; writes results.csv, results.json, c11_loss_vs_depth.png and
    sequence_losses.csv (each sequence's summed loss per variant and depth).
    Under torchrun each process evaluates its share of the sequences (the same numbers as one process)."""
    from synthlab.ouroboros.runs import eval_run
    from synthlab.ouroboros.system import VARIANT_ROWS
    from synthlab.training.distributed import reporting

    table = eval_run(
        run_dir,
        _int_list(depths, "depths"),
        str(corpus) if corpus else None,
        batch_size=batch_size,
        max_sequences=max_sequences,
        device=device,
        dtype=dtype,
        fsdp=fsdp,
    )
    if not reporting():
        return
    wide = table.pivot_table(index=["corpus", "variant"], columns="depth", values="loss", observed=True)
    typer.echo(wide.round(4).to_string())
    typer.echo(
        "loss: mean next-token cross-entropy (nats) over the corpus's sequences, lower is better; columns: "
        "recurrent depth"
    )
    for variant in table["variant"].cat.categories:
        typer.echo(f"  {variant}: {VARIANT_ROWS[variant]}")
    for name, rows in table[table["depth"] == table["depth"].min()].groupby("corpus", observed=True):
        loss = rows.set_index("variant")["loss"]
        if loss["base"] > loss["truncated"]:
            typer.echo(
                f"  {name}: base is {loss['base'] - loss['truncated']:.2f} nats above truncated: on this corpus "
                f"the full checkpoint predicts worse than its own cut-down copy (the layers cut out hurt "
                f"here); the looped variants start from truncated"
            )
    typer.echo(f"-> {run_dir / 'results.csv'}, {run_dir / 'c11_loss_vs_depth.png'}")
