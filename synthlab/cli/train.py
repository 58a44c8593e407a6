"""`synthlab train`, `synthlab eval`, `synthlab capacity`: thin wrappers over synthlab.train,
synthlab.evaluate and synthlab.capacity (torch is imported inside the commands)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from synthlab.errors import SynthlabError


def train(
    task: Optional[str] = typer.Option(None, help="Task of the data: bios, mano, multihop or reach (checked against DIR/meta.json)."),
    data: Optional[Path] = typer.Option(None, help="Dataset folder written by `synthlab gen`."),
    out: Optional[Path] = typer.Option(None, help="New (or empty) run directory to create."),
    config: Optional[Path] = typer.Option(None, "--config", help="run.toml (or .json) with a model table and a train table; flags override it."),
    resume: Optional[Path] = typer.Option(None, help="Continue the run in this directory from its checkpoint (no other run options)."),
    # --- model ---
    d_model: Optional[int] = typer.Option(None, help="Hidden size d."),
    n_layers: Optional[int] = typer.Option(None, help="Distinct layers (prelude + core + coda)."),
    n_heads: Optional[int] = typer.Option(None, help="Attention heads."),
    loops: Optional[int] = typer.Option(None, help="Recurrent steps T (whole-stack passes for ouro, core steps for sandwich)."),
    max_seq_len: Optional[int] = typer.Option(None, help="Longest sequence the model accepts (RoPE table)."),
    topology: Optional[str] = typer.Option(None, help="ouro (loop the whole stack) or sandwich (prelude / core / coda)."),
    n_prelude: Optional[int] = typer.Option(None, help="Sandwich: prelude layers run once."),
    n_coda: Optional[int] = typer.Option(None, help="Sandwich: coda layers run once."),
    injection: Optional[str] = typer.Option(None, help="Sandwich input injection: none, add, concat or diagonal."),
    state_init: Optional[str] = typer.Option(None, help="Sandwich state init: zero, input or normal."),
    mlp: Optional[str] = typer.Option(None, help="MLP kind: gelu or swiglu."),
    norm: Optional[str] = typer.Option(None, help="Norm placement: pre or sandwich."),
    exit_gate: Optional[bool] = typer.Option(None, "--exit-gate/--no-exit-gate", help="Ouro exit gate (needed by --loss ouro and q: exits)."),
    # --- training ---
    seed: Optional[int] = typer.Option(None, help="Seed of the initial weights and the data order."),
    steps: Optional[int] = typer.Option(None, help="Optimizer steps (or use --exposures)."),
    exposures: Optional[float] = typer.Option(None, help="Passes over the training data (bioS: times each biography is seen)."),
    batch_size: Optional[int] = typer.Option(None, help="Rows per batch."),
    seq_len: Optional[int] = typer.Option(None, help="Row length when packing (default: --max-seq-len)."),
    pack: Optional[bool] = typer.Option(None, "--pack/--no-pack", help="Pack examples into rows with document masking (default: bios only)."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate."),
    min_lr_ratio: Optional[float] = typer.Option(None, help="Cosine decays to lr times this."),
    warmup_steps: Optional[int] = typer.Option(None, help="Linear warmup steps."),
    weight_decay: Optional[float] = typer.Option(None, help="AdamW weight decay on 2-D weights."),
    grad_clip: Optional[float] = typer.Option(None, help="Gradient norm clip (0: off)."),
    loss: Optional[str] = typer.Option(None, help="Objective: last (last step), mean (of steps), ouro (stage I, needs --exit-gate) or ouro_stage2 (gate only, needs --init-from)."),
    init_from: Optional[Path] = typer.Option(None, help="Start from the weights of this run's checkpoint (e.g. stage II after a stage I run)."),
    checkpoint_every: Optional[int] = typer.Option(None, help="Write a checkpoint every K steps."),
    log_every: Optional[int] = typer.Option(None, help="Append to metrics.jsonl every K steps."),
    device: Optional[str] = typer.Option(None, help="auto (CUDA with bf16 if present, else CPU fp32), cpu or cuda."),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile the model."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's choice)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show the progress bar."),
) -> None:
    """Train a model of the looped family on a generated dataset, into a self-describing run directory."""
    import torch

    from synthlab import config as configlib
    from synthlab.train import resolve_run_config
    from synthlab.train import train as run_training

    if threads is not None:
        if threads < 1:
            raise SynthlabError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    model_flags = dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads, loops=loops, max_seq_len=max_seq_len,
                       topology=topology, n_prelude=n_prelude, n_coda=n_coda, injection=injection,
                       state_init=state_init, mlp=mlp, norm=norm, exit_gate=exit_gate)
    train_flags = dict(task=task, data=str(data) if data else None, seed=seed, steps=steps, exposures=exposures,
                       batch_size=batch_size, seq_len=seq_len, pack=pack, lr=lr, min_lr_ratio=min_lr_ratio,
                       warmup_steps=warmup_steps, weight_decay=weight_decay, grad_clip=grad_clip, loss=loss,
                       init_from=str(init_from) if init_from else None,
                       checkpoint_every=checkpoint_every, log_every=log_every, device=device, compile=compile)
    if resume is not None:
        given = [k for k, v in {**model_flags, **train_flags, "out": out, "config": config}.items() if v is not None]
        if given:
            raise SynthlabError(f"--resume continues a run as configured; drop --{given[0].replace('_', '-')}")
        result = run_training(resume, None, progress=progress)
        run_dir = resume
    else:
        if out is None:
            raise SynthlabError("--out RUN_DIR is required (or --resume RUN_DIR)")
        file = configlib.load_dict(config) if config else {}
        run = resolve_run_config(file, model_flags, train_flags)
        result = run_training(out, run, progress=progress)
        run_dir = out
    if result.interrupted:
        typer.echo(f"interrupted at step {result.step}/{result.total_steps}; checkpoint written; continue with: synthlab train --resume {run_dir}", err=True)
        raise typer.Exit(code=130)
    typer.echo(f"done: {result.step} steps, final loss {result.final_loss:.4f}, run in {run_dir}")


def evaluate(
    run_dir: Path = typer.Argument(..., help="Run directory made by `synthlab train`."),
    data: Optional[Path] = typer.Option(None, help="Dataset folder to test on (default: the run's own)."),
    steps: Optional[int] = typer.Option(None, help="Recurrent steps at evaluation (past the trained depth to test extrapolation)."),
    exit: Optional[str] = typer.Option(None, "--exit", help="Exit rule per token: static:T, q:0.8, diff:0.01 or kl:0.001."),
    kv: Optional[str] = typer.Option(None, help="Decode with this KV-cache strategy: full, first, last or mean."),
    batch_size: int = typer.Option(128, help="Examples per forward pass."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
) -> None:
    """Exact-match accuracy (QA accuracy and loss per attribute for bios) at every recurrent step -> RUN_DIR/eval/*.json."""
    from synthlab.evaluate import evaluate_run

    if steps is not None and steps < 1:
        raise SynthlabError(f"--steps must be >= 1, got {steps}")
    result = evaluate_run(run_dir, data_dir=data, steps=steps, exit_rule=exit, kv=kv, batch_size=batch_size, device=device)
    per_step = " ".join(f"{a:.3f}" for a in result["accuracy_per_step"])
    typer.echo(f"{result['task']}: accuracy {result['accuracy']:.4f} on {result['n_examples']} test items; per step: {per_step}")
    for key in ("exit_accuracy", "mean_exit_step", "kv_accuracy"):
        if key in result:
            typer.echo(f"{key}: {result[key]:.4f}")
    typer.echo(f"wrote {Path(run_dir) / result['file']}")


def capacity(
    run_dir: Path = typer.Argument(..., help="Run directory of a model trained on bios."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole report as JSON."),
    steps: Optional[int] = typer.Option(None, help="Recurrent steps to read the model at (default: the trained loops)."),
    batch_size: int = typer.Option(64, help="Biographies per forward pass."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
) -> None:
    """Bits of knowledge stored (Physics of LMs 3.3, Def. 4.3) and bits per parameter -> RUN_DIR/capacity.json."""
    if steps is not None and steps < 1:
        raise SynthlabError(f"--steps must be >= 1, got {steps}")
    from synthlab.capacity import estimate_capacity

    report = estimate_capacity(run_dir, batch_size=batch_size, device=device, steps=steps)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(
        f"N = {report['n_people']}: p1 = {report['p1']:.3f}, p2 = {report['p2']:.3f} nats; "
        f"bits = {report['bits']:,.0f} of max {report['max_bits']:,.0f}; "
        f"P = {report['params']:,}; bits/param = {report['bits_per_param']:.3f}"
    )
    for name, row in report["per_attribute"].items():
        typer.echo(f"  {name:<11} loss {row['loss']:.3f} nats  bits {row['bits']:,.0f}  (of log2 {row['values']} per person)")
