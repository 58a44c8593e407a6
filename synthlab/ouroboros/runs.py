"""Run directories for the Qwen2 system: train the looped variants, evaluate every variant by depth.

Layout of a run directory (what `synthlab ouroboros train` writes and `eval` reads):

    run.json                        base path, corpus, OuroborosConfig, OuroborosTrainConfig, variants
    <variant>/trainable.safetensors the trainable parameters only (the base is never copied)
    <variant>/train_log.csv         step, depth, loss, lr, grad_norm (written when the variant finished)
    <variant>/state.pt              the last checkpoint's whole training state, while training (resume)
    results.csv, results.json       loss per (variant, corpus, depth)           [eval]
    c11_loss_vs_depth.png           the C11 plot                                [eval]
    sequence_losses.csv             per evaluated sequence (corpus, sequence, targets): its summed
                                    loss per variant@depth, for paired comparisons    [eval]
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
import safetensors.torch
import torch

from synthlab import serialize
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write, check_out, lab_output, warn
from synthlab.ouroboros.checkpoint import empty_base, load_base, load_tokenizer, resolve_dtype
from synthlab.ouroboros.data import documents, pack, read_texts, split_heldout
from synthlab.ouroboros.system import LOOPED_VARIANTS, VARIANTS, OuroborosConfig, OuroborosLM, trainable_breakdown
from synthlab.ouroboros.train import OuroborosTrainConfig, plot_loss_vs_depth, sequence_losses, train
from synthlab.progress import Progress
from synthlab.training import distributed
from synthlab.training.configs import ouroboros_train_keys
from synthlab.training.run_folders import load_state_file, resolve_device

CHECKPOINT = "trainable.safetensors"
STATE = "state.pt"
LOG = "train_log.csv"
SEQUENCE_LOSSES = "sequence_losses.csv"


def _read_run(run_dir: Path) -> dict[str, Any]:
    """run.json, its training options under their current names (a run of either age resumes)."""
    run = json.loads((Path(run_dir) / "run.json").read_text())
    return {**run, "train": ouroboros_train_keys(run["train"])}


def corpus_rows(docs: list[str], tokenizer, config: OuroborosTrainConfig, max_sequences: int | None = None):
    """The corpus as (N, seq_len) rows: one document per row with config.per_document, else packed."""
    layout = documents if config.per_document else pack
    return layout(docs, tokenizer, config.seq_len, max_sequences)


def is_run(folder: Path) -> bool:
    """Whether `folder` holds an OUROBOROS training run (its run.json): `train` resumes it."""
    return lab_output(folder) == "an OUROBOROS training run" and (Path(folder) / "run.json").is_file()


def build_variant(base, config: OuroborosConfig, variant: str, seed: int) -> OuroborosLM:
    """`variant` of the system on a loaded base; several variants may share one base."""
    generator = torch.Generator().manual_seed(seed)
    return OuroborosLM(base, dataclasses.replace(config, variant=variant), generator)


def save_trainable(model: OuroborosLM, path: Path) -> None:
    state = {k: v.contiguous().cpu() for k, v in model.trainable_state().items()}
    atomic_write(path, lambda tmp: safetensors.torch.save_file(state, str(tmp)))


def read_state(path: Path) -> dict:
    """A variant's saved training state (tensors and plain values only: nothing in it runs)."""
    try:
        return load_state_file(path)
    except ValueError as why:
        raise SynthlabError(
            f"damaged training state {path} ({why}); delete {path.parent} to train {path.parent.name} again"
        ) from None


def load_trainable(model: OuroborosLM, path: Path) -> None:
    try:
        state = safetensors.torch.load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for a damaged file
        raise SynthlabError(
            f"damaged weights {path} ({type(err).__name__}); train {path.parent.name} again (delete {path.parent})"
        ) from None
    expected = model.trainable_state()
    if set(state) != set(expected):
        raise SynthlabError(f"{path}: parameters {sorted(set(state) ^ set(expected))} do not match this variant")
    shapes = [k for k, v in state.items() if v.shape != expected[k].shape]
    if shapes:
        raise SynthlabError(
            f"{path}: {shapes[0]} has shape {tuple(state[shapes[0]].shape)}, this variant's is "
            f"{tuple(expected[shapes[0]].shape)} (trained with another config?); train {path.parent.name} again"
        )
    model.load_state_dict(state, strict=False)


class _Base:
    """The frozen base of every variant of a run. Without FSDP: loaded once onto the device, shared.
    Under FSDP each variant needs a base of its own (attaching the OUROBOROS bases and sharding
    rewrite it). Rank 0 reads the checkpoint once per run into host memory (the base's size in its
    dtype, on rank 0 only: 140 GB for a 70B base in bf16) and builds each variant's base on those
    same tensors; the other processes build theirs on the meta device (no memory) and receive their
    shards from rank 0 (`shard`): they never hold more than 1/K of the base."""

    def __init__(self, path: str, dev: torch.device, dtype: str | None, attn: str, fsdp: bool, world):
        self.path, self.dev, self.dtype, self.attn, self.fsdp, self.world = (
            path,
            dev,
            resolve_dtype(dtype, dev),
            attn,
            fsdp,
            world,
        )
        self.full: dict | None = None
        self.shared = None if fsdp else load_base(path, device=dev, dtype=self.dtype, attn=attn)

    def get(self):
        if self.shared is not None:
            return self.shared
        base = empty_base(self.path, dtype=self.dtype, attn=self.attn)
        if self.world.main:
            if self.full is None:
                whole = load_base(self.path, device=torch.device("cpu"), dtype=self.dtype, attn=self.attn)
                self.full = {**whole.state_dict(), **dict(whole.named_buffers())}
            base.to_empty(device="cpu")
            base.load_state_dict({k: v for k, v in self.full.items() if k in base.state_dict()}, assign=True)
            for name, value in self.full.items():  # the non-persistent buffers (rotary tables)
                owner, _, leaf = name.rpartition(".")
                if leaf in base.get_submodule(owner)._buffers:
                    base.get_submodule(owner)._buffers[leaf] = value
            base.tie_weights()
        return base

    def shard(self, model: OuroborosLM) -> dict:
        """The variant's frozen base sharded by FSDP, a group per decoder layer (the embeddings and
        final norm in the root's group), filled from rank 0; its trainable parameters whole on every
        process. Returns the base's parameter count and the most that one process holds."""
        full = {**model.base.state_dict(), **dict(model.base.named_buffers())} if self.world.main else {}
        buffers = {k: v.detach().cpu() for k, v in model.base.named_buffers()} if self.world.main else {}
        full = {k: v.detach().cpu() for k, v in full.items() if k not in buffers}
        distributed.shard(
            model,
            list(model.base.model.layers),
            [p for p in model.parameters() if p.requires_grad],
            self.world,
            self.dev,
        )
        distributed.fill_from_rank0(model.base, full, buffers, self.world, self.dev)
        return {
            "total": sum(p.numel() for p in model.base.parameters()),
            "most_per_process": distributed.most_held(self.world, model.base.parameters(), self.dev),
        }


def train_run(
    base_path: str,
    corpus: str,
    out: str | Path,
    variants: list[str],
    config: OuroborosConfig,
    train_config: OuroborosTrainConfig,
    *,
    device: str | None = None,
    dtype: str | None = None,
    attn: str = "sdpa",
    text_field: str = "text",
    progress: bool = True,
    fsdp: bool = False,
    overwrite: bool = False,
) -> dict:
    """Train each looped variant in `variants` on `corpus` into `out` (a rerun resumes, skipping the
    finished ones); returns run.json's content and each variant's trainable parameter count.
    Under torchrun (`torchrun --nproc-per-node K -m synthlab ouroboros train ...`) data-parallel:
    see synthlab.ouroboros.train.train. With `fsdp` (under torchrun) the frozen base is sharded by
    PyTorch's FSDP, 1/K of it on each process (`base_held` in the result: its parameters and the
    most one process holds), for a base that does not fit one device; the trainable parameters
    stay whole on every process, so checkpoints and the training itself are the same.
    `out` is an earlier run of this command (resumed), a new or empty folder, or, with `overwrite`,
    another folder (its run.json replaced); never the working directory or another command's output."""
    check_out(Path(out), overwrite, own=is_run)
    bad = [v for v in variants if v not in LOOPED_VARIANTS]
    if bad or not variants:
        raise SynthlabError(f"variants must be among {', '.join(LOOPED_VARIANTS)}, got {variants}")
    docs = read_texts(corpus, text_field)  # a bad corpus fails before the (slow) model load
    # under torchrun: each process its own base (its GPU on CUDA), its share of every batch; rank 0 writes
    with distributed.process_group(resolve_device(device or "auto")) as (world, dev):
        if fsdp:
            distributed.check_shardable(world, dev)
        return _train_run(
            base_path,
            corpus,
            Path(out),
            variants,
            config,
            train_config,
            docs,
            dev,
            dtype,
            attn,
            text_field,
            progress,
            world,
            fsdp,
        )


def _train_run(
    base_path, corpus, out, variants, config, train_config, docs, dev, dtype, attn, text_field, progress, world, fsdp
) -> dict:
    base = _Base(base_path, dev, dtype, attn, fsdp, world)
    sequences = corpus_rows(docs, load_tokenizer(base_path), train_config)
    train_seqs, heldout = split_heldout(sequences, train_config.heldout_fraction)
    if world.main:
        out.mkdir(parents=True, exist_ok=True)
    run = {
        "base": str(Path(base_path).resolve()),
        "corpus": str(Path(corpus).resolve()),
        "text_field": text_field,
        "attn": attn,
        "variants": variants,
        "ouroboros": serialize.to_dict(config),
        "train": serialize.to_dict(train_config),
        "sequences": {"train": len(train_seqs), "heldout": len(heldout)},
    }
    trained = any((out / v / name).is_file() for v in VARIANTS for name in (STATE, CHECKPOINT, LOG))
    if (out / "run.json").is_file() and trained:  # a rerun resumes: it must be the same run
        if _read_run(out) != json.loads(json.dumps(run)):
            raise SynthlabError(f"{out} holds another OUROBOROS run (its run.json differs): use a new --out")
    elif world.main:
        if (out / "run.json").is_file() and _read_run(out) != json.loads(json.dumps(run)):
            warn(f"replacing {out / 'run.json'}: its run stopped before any variant was trained")
        atomic_write(out / "run.json", lambda tmp: tmp.write_text(json.dumps(run, indent=2) + "\n"))
    counts, held = {}, {}
    for variant in variants:
        folder = out / variant
        model = build_variant(base.get(), config, variant, train_config.seed)
        counts[variant] = trainable_breakdown(model)["total"]
        if (folder / LOG).is_file():  # finished earlier
            continue
        if fsdp:
            held = base.shard(model)
        if world.main:
            folder.mkdir(exist_ok=True)
        # on the CPU: under torchrun every process reads the file rank 0 wrote from its own device
        state = folder / STATE
        resume = read_state(state) if state.is_file() else None
        if resume is not None and "data" not in resume:
            raise SynthlabError(
                f"{state} holds a training state of an earlier layout; remove it to train {variant} "
                f"again from its first step"
            )

        def checkpoint(state, m=model, f=folder):
            save_trainable(m, f / CHECKPOINT)
            atomic_write(f / STATE, lambda tmp: torch.save(state, tmp))

        def where(v=variant, f=folder) -> str:
            return f"while training {v}; the last checkpoint in {f} is kept (rerun the same command to resume)"

        with distributed.peers_lost_as_error(world, where):
            log = train(
                model, train_seqs, train_config, progress=progress, on_checkpoint=checkpoint, resume=resume, world=world
            )
        if world.main:
            atomic_write(folder / LOG, lambda tmp, rows=log: pd.DataFrame(rows).to_csv(tmp, index=False))
            (folder / STATE).unlink()
    return run | {"trainable_params": counts} | ({"base_held": held} if held else {})


def eval_run(
    run_dir: str | Path,
    depths: list[int],
    corpus: str | None = None,
    *,
    batch_size: int = 4,
    max_sequences: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    progress: bool = True,
    fsdp: bool = False,
):
    """Loss of every variant (trained looped ones, truncated, base) at each depth, on the held-out
    part of the training corpus and on `corpus` (another distribution); writes the table and plot.
    Returns (the loss table, the per-sequence table written to SEQUENCE_LOSSES).

    Truncated and base do not loop: each is evaluated once per corpus and its loss is listed at
    every depth (a flat reference line in the plot). Under torchrun each process evaluates its share
    of every corpus and the sums are added up (synthlab.ouroboros.train.sequence_losses): every process returns the
    one-process table, rank 0 writes it; `fsdp` shards the base as in `train_run`.
    """
    run_dir = Path(run_dir)
    if batch_size < 1:
        raise SynthlabError(f"--batch-size must be >= 1, got {batch_size}")
    if max_sequences is not None and max_sequences < 1:
        raise SynthlabError(f"--max-sequences must be >= 1 (or left out: all), got {max_sequences}")
    if not (run_dir / "run.json").is_file():
        raise SynthlabError(f"run directory '{run_dir}' has no run.json (train into it first)")
    run = _read_run(run_dir)
    config = serialize.from_dict(OuroborosConfig, run["ouroboros"])
    train_config = serialize.from_dict(OuroborosTrainConfig, run["train"])
    if not depths or min(depths) < 1 or max(depths) > config.max_steps:
        raise SynthlabError(f"depths must lie in 1..{config.max_steps}, got {depths}")
    unfinished = [v for v in run["variants"] if not (run_dir / v / LOG).is_file()]
    if unfinished:
        raise SynthlabError(f"{run_dir}: {', '.join(unfinished)} did not finish training (rerun train to resume)")
    docs = {"heldout": read_texts(run["corpus"], run["text_field"])}
    if corpus is not None:
        name = Path(corpus).stem
        docs["other" if name == "heldout" else name] = read_texts(corpus, run["text_field"])
    tokenizer = load_tokenizer(run["base"])
    sequences = corpus_rows(docs.pop("heldout"), tokenizer, train_config)
    corpora = {"heldout": split_heldout(sequences, train_config.heldout_fraction)[1][:max_sequences]}
    for name, texts in docs.items():
        corpora[name] = corpus_rows(texts, tokenizer, train_config, max_sequences)

    with distributed.process_group(resolve_device(device or "auto")) as (world, dev):
        if fsdp:
            distributed.check_shardable(world, dev)
        with distributed.peers_lost_as_error(world, lambda: "while evaluating; nothing was written"):
            rows, per_sequence = _eval_rows(
                run, run_dir, config, train_config, depths, corpora, batch_size, dev, dtype, progress, world, fsdp
            )
    table = pd.DataFrame(rows)
    table["variant"] = pd.Categorical(table["variant"], [v for v in VARIANTS if v in set(table["variant"])])
    table = table.sort_values(["corpus", "variant", "depth"]).reset_index(drop=True)
    if world.main:
        atomic_write(run_dir / "results.csv", lambda tmp: table.to_csv(tmp, index=False))
        atomic_write(
            run_dir / "results.json", lambda tmp: tmp.write_text(table.to_json(orient="records", indent=2) + "\n")
        )
        atomic_write(run_dir / "c11_loss_vs_depth.png", lambda tmp: plot_loss_vs_depth(table, tmp))
        atomic_write(run_dir / SEQUENCE_LOSSES, lambda tmp: per_sequence.to_csv(tmp, index=False))
    return table, per_sequence


def _eval_rows(
    run, run_dir, config, train_config, depths, corpora, batch_size, dev, dtype, progress, world, fsdp
) -> list[dict]:
    base = _Base(run["base"], dev, dtype, run["attn"], fsdp, world)
    jobs = [(v, [1]) for v in ("truncated", "base")] + [(v, depths) for v in run["variants"]]
    rows, per_sequence = [], {name: {"sequence": range(len(seqs))} for name, seqs in corpora.items()}
    bar = Progress(
        sum(len(d) for _, d in jobs) * len(corpora), enabled=progress and world.main, desc="eval", unit="evaluation"
    )
    for variant, variant_depths in jobs:
        model = build_variant(base.get(), config, variant, train_config.seed)
        if variant in LOOPED_VARIANTS:
            load_trainable(model, run_dir / variant / CHECKPOINT)
        if fsdp:
            base.shard(model)
        for name, seqs in corpora.items():
            for depth in variant_depths:
                sums, counts = sequence_losses(model, seqs, depth, batch_size, train_config.tf32, world)
                loss = float(sums.sum() / counts.sum())
                per_sequence[name] |= {"targets": counts.numpy(), f"{variant}@{depth}": sums.numpy()}
                listed = depths if variant not in LOOPED_VARIANTS else [depth]
                rows += [
                    {"variant": variant, "corpus": name, "depth": d, "loss": loss, "sequences": len(seqs)}
                    for d in listed
                ]
                bar.update()
    bar.close()
    return rows, pd.concat([pd.DataFrame({"corpus": name, **c}) for name, c in per_sequence.items()])
