"""`synthlab ouroboros`: build, train and evaluate OUROBOROS on a local Qwen2 checkpoint (C11).

The commands import torch and `synthlab.ouroboros` (which loads torch) inside their functions, so
that the CLI starts without them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from synthlab import serialize
from synthlab.cli import flags
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text, check_out, lab_output
from synthlab.serialize import option
from synthlab.training.configs import OuroborosConfig, OuroborosTrainConfig, ouroboros_train_keys

app = typer.Typer(
    help="OUROBOROS on a local Qwen2/Qwen2.5 checkpoint: a controller rewrites one recurrent layer per step.",
    no_args_is_help=True,
    rich_markup_mode=None,  # help text as written: no [markup] (it ate '[default: ...]', 'W[h; h]')
)

# The options of build, train and eval beside the system's and training's configs (OuroborosConfig,
# OuroborosTrainConfig): which base, corpus and folder, and how the base runs. They are the
# arguments of train_run / eval_run, and live here rather than in synthlab.ouroboros because that
# package imports torch on import, which the CLI must not at its start.
_DEVICE_HELP = "Device (default: cuda if available, else cpu)."
_OVERWRITE_HELP = (
    "Write into --out although it holds files this command did not write (never another command's output)."
)


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """Where `ouroboros build` writes its summary, the base it reads (or only its config), on what device."""

    out: Path = option(dataclasses.MISSING, "Folder to write summary.json into (an earlier build's is replaced).")
    overwrite: bool = option(False, _OVERWRITE_HELP, flag="--overwrite")
    base: Path | None = option(None, "Local Qwen2 checkpoint folder (config.json + weights).")
    base_config: Path | None = option(None, "A Qwen2 config.json instead of --base: shapes only, on the meta device.")
    device: str | None = option(None, _DEVICE_HELP)

    def __post_init__(self) -> None:
        if (self.base is None) == (self.base_config is None):
            raise SynthlabError("give exactly one of --base PATH or --base-config CONFIG.json")


@dataclasses.dataclass(frozen=True)
class TrainFiles:
    """What `ouroboros train` trains on what, and where: the base, the corpus, the run folder, the
    variants, a config file of OuroborosTrainConfig."""

    base: Path = option(dataclasses.MISSING, "Local Qwen2 checkpoint folder (with its tokenizer).")
    corpus: Path = option(dataclasses.MISSING, "Training text: .txt, .jsonl (field --text-field) or .parquet.")
    out: Path = option(
        dataclasses.MISSING, "Run folder: run.json, <variant>/trainable.safetensors, logs (a rerun resumes)."
    )
    overwrite: bool = option(False, _OVERWRITE_HELP, flag="--overwrite")
    variants: tuple[str, ...] = option(("controller", "static", "nogate"), "Looped variants to train.")
    config: Path | None = option(None, "TOML/JSON OuroborosTrainConfig; flags override it.")


@dataclasses.dataclass(frozen=True)
class TrainRuntime:
    """How `ouroboros train` reads its corpus and runs the base: text field, device, dtype,
    attention, FSDP."""

    text_field: str = option("text", "Field / column holding the text in .jsonl / .parquet.")
    device: str | None = option(None, _DEVICE_HELP)
    dtype: str | None = option(None, "Base dtype: bfloat16 (GPU default), float32 (CPU default), float16.")
    attn: str = option("sdpa", "Attention implementation: sdpa or eager (always causal-masked).")
    fsdp: bool = option(
        False,
        "Under torchrun: shard the frozen base over the processes with PyTorch's FSDP (1/K of it on "
        "each), for a base that does not fit one device; same training and checkpoints.",
        flag="--fsdp",
    )


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """What `ouroboros eval RUN_DIR` scores: the depths, a second corpus, how many sequences, and how
    the base runs."""

    depths: tuple[int, ...] = option((1, 4, 8, 16), "Recurrent depths to evaluate.")
    corpus: Path | None = option(None, "A second corpus (another distribution).")
    batch_size: int = option(
        4, "Sequences per forward pass: a chunk that bounds memory, not an optimizer batch (nothing is trained)."
    )
    max_sequences: int | None = option(None, "Evaluate at most this many sequences per corpus.")
    device: str | None = option(None, _DEVICE_HELP)
    dtype: str | None = option(None, "Base dtype (default bfloat16 on GPU, float32 on CPU).")
    fsdp: bool = option(False, "Under torchrun: shard the base over the processes (FSDP).", flag="--fsdp")

    def __post_init__(self) -> None:
        # --batch-size and --max-sequences are eval_run's own checks, each depth against the run's
        if not self.depths:
            raise SynthlabError("--depths must name at least one value")


def _build(**kwargs) -> None:
    import torch  # torch and synthlab.ouroboros: only when a command runs (the CLI starts without them)

    from synthlab.ouroboros.checkpoint import base_layers, load_base, meta_base, resolve_dtype
    from synthlab.ouroboros.system import OuroborosLM, describe_split, resolve_split, summary
    from synthlab.training.run_folders import resolve_device

    (build,) = flags.parsed(kwargs, BuildOptions)
    out, base, base_config = build.out, build.base, build.base_config
    check_out(out, build.overwrite, own=_is_build)
    config = serialize.merge(OuroborosConfig(), flags.given(kwargs, OuroborosConfig))
    resolve_split(base_layers(base or base_config), config)
    if base is not None:
        dev = resolve_device(build.device or "auto")
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
    return lab_output(folder) == "an OUROBOROS build" and {p.name for p in folder.iterdir()} == {"summary.json"}


def _build_command():
    """`synthlab ouroboros build`: every OuroborosConfig field is a flag (help from the field)."""
    params = [*flags.dataclass_options(BuildOptions), *flags.dataclass_options(OuroborosConfig, unset=True)]
    return flags.with_signature(
        _build,
        params,
        "build",
        "Build the system (SVD bases included) and write "
        "DIR/summary.json: trainable_params, split, rank, alpha. The split is checked against the "
        "base's depth (config.json) before the base is read or anything written.",
    )


def _train(**kwargs) -> None:
    from synthlab.ouroboros.checkpoint import base_layers
    from synthlab.ouroboros.runs import train_run
    from synthlab.ouroboros.system import resolve_split
    from synthlab.training.distributed import reporting

    files, runtime = flags.parsed(kwargs, TrainFiles, TrainRuntime)
    base, out = files.base, files.out
    train_config = (
        serialize.from_dict(OuroborosTrainConfig, ouroboros_train_keys(serialize.load_dict(files.config)))
        if files.config
        else OuroborosTrainConfig()
    )
    train_config = serialize.merge(train_config, flags.given(kwargs, OuroborosTrainConfig))
    ouroboros = serialize.merge(OuroborosConfig(), flags.given(kwargs, OuroborosConfig))
    resolve_split(base_layers(base), ouroboros)  # a bad split is an error before the base is read
    names = list(files.variants)
    run = train_run(
        str(base),
        str(files.corpus),
        out,
        names,
        ouroboros,
        train_config,
        device=runtime.device,
        dtype=runtime.dtype,
        attn=runtime.attn,
        text_field=runtime.text_field,
        fsdp=runtime.fsdp,
        overwrite=files.overwrite,
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
    params = [
        *flags.dataclass_options(TrainFiles),
        *flags.dataclass_options(OuroborosTrainConfig, unset=True),
        *flags.dataclass_options(OuroborosConfig, unset=True, exclude=("variant",)),
        *flags.dataclass_options(TrainRuntime),
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


def _evaluate(run_dir: Path, **kwargs) -> None:
    from synthlab.ouroboros.runs import eval_run
    from synthlab.ouroboros.system import VARIANT_ROWS
    from synthlab.training.distributed import reporting

    (options,) = flags.parsed(kwargs, EvalOptions)
    table, _ = eval_run(
        run_dir,
        list(options.depths),
        str(options.corpus) if options.corpus else None,
        batch_size=options.batch_size,
        max_sequences=options.max_sequences,
        device=options.device,
        dtype=options.dtype,
        fsdp=options.fsdp,
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


app.command("eval")(
    flags.with_signature(
        _evaluate,
        [
            flags.argument("run_dir", Path, "A run folder written by `synthlab ouroboros train`."),
            *flags.dataclass_options(EvalOptions),
        ],
        "eval",
        """Loss vs depth for every variant; writes results.csv, results.json, c11_loss_vs_depth.png and
    sequence_losses.csv (each sequence's summed loss per variant and depth).
    Under torchrun each process evaluates its share of the sequences (the same numbers as one process).""",
    )
)
