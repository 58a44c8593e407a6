"""Training loop: one function, `train(run_dir)`, that starts or resumes a run directory.

A run directory describes itself:
- `config.json`: the fully resolved RunConfig (model + train) and what was derived from the data
  (vocabulary size, row length, packing, total steps, device, processes, torch threads);
- `metrics.jsonl`: one line every `log_every` steps (step, tokens seen, loss, loss per recurrent
  step, learning rate, tokens/s); with `eval_every` K, every K steps also the per-group accuracy
  and answer loss on fixed samples of held-out and training prompts (`eval/acc_l1`, ...);
- `checkpoint-<step>.pt` (+ its sha256; `checkpoint.pt` is the newest): the `TrainState` (model,
  optimizer, step, tokens seen, data position, RNG states; the learning rate follows from the
  step); written atomically (temporary sibling + rename) every `checkpoint_every` steps (or
  `checkpoints` times over the run), at the end, and when SIGINT or SIGTERM arrives, off the
  training thread (`checkpointer`); the newest `keep_checkpoints` are kept (a stop's off-schedule
  one only until the next is written: `run_folders.save_checkpoint`);
- `model.safetensors`: the weights alone, written at the end (`synthlab.load_model` reads them);
- `summary.json`: final numbers, written at the end (`stopped_by`, `stopped_at_step`: below).

Each optimizer step is `engine.step` (shared with the OUROBOROS trainer); this module adds the
lab's data, losses (per batch: `objectives`), logging and run folder, in one loop (`_loop`).

A finished run trains on to N steps with `train(run_dir, extend_to=N)` (`--resume RUN --steps N`):
its schedule keeps the length it was laid out over, the steps past it run at the rate of its last
step (config.json: derived.extension). `train.schedule.stop_when` ends a run, finished, at the first probe
that meets it (the schedule stays the budget's; config.json: derived.stop): it stays finished,
neither resumed nor extended.

Resuming a run stopped before its first checkpoint starts it again from step 0. Resuming replays
nothing: the batcher's state is (epoch, cursor) and the torch RNG states are
restored, so on CPU a resumed run produces the same losses as an uninterrupted one, bit for bit.

Objectives (`TrainConfig.loss`), all over the task's loss mask: the last step's loss, the mean of
the per-step losses, Ouro stage I (exit gate, entropy-regularised) and Ouro stage II (the gate
alone, LM frozen, starting from a stage I run's weights via `init_from`).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from synthlab import serialize
from synthlab.data.datasets import Batcher, Dataset, load_dataset, row_layout, training_examples
from synthlab.errors import SynthlabError
from synthlab.evaluation.groups import GroupProbe
from synthlab.files import atomic_write_text, check_writable, folder_lock
from synthlab.models import build_model
from synthlab.progress import Progress
from synthlab.training import checkpointer, distributed, engine
from synthlab.training.configs import TrainConfig, check_run
from synthlab.training.engine import TrainState
from synthlab.training.loggers import Loggers, check_loggers
from synthlab.training.objectives import model_forward, step_losses, to_device
from synthlab.training.optim import adamw, lr_factor
from synthlab.training.run_folders import (
    WEIGHTS,
    RunConfig,
    autocast,
    checkpoint_files,
    clear_unstarted,
    data_sha256,
    float32_matmul,
    load_checkpoint,
    load_run,
    load_weights,
    record_stop,
    resolve_device,
    save_checkpoint,
    save_weights,
    stopped,
    trained_data,
    trim_metrics,
)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (2-D weights, embeddings included) and none on vectors."""
    return adamw(
        model.parameters(),
        lambda p: p.dim() >= 2,
        lr=cfg.optim.lr,
        weight_decay=cfg.optim.weight_decay,
        betas=(cfg.optim.beta1, cfg.optim.beta2),
        eps=cfg.optim.eps,
        impl=cfg.optim.optimizer_impl,
    )


def lr_schedule(cfg: TrainConfig, total_steps: int):
    """The learning rate of a (0-based) step: the peak `lr` times the schedule's factor; past
    `total_steps` (an extended run) the rate of its last step, held constant."""
    return lambda step: (
        cfg.optim.lr
        * lr_factor(
            min(step, total_steps - 1),
            warmup=cfg.schedule.warmup_steps,
            total=total_steps,
            min_ratio=cfg.schedule.min_lr_ratio,
            schedule=cfg.schedule.kind,
            decay_fraction=cfg.schedule.decay_fraction,
        )
    )


def _extension(
    run_dir: Path, cfg: TrainConfig, recorded: dict[str, Any], planned: int, steps: int | None
) -> dict[str, Any]:
    """The derived settings of a resumed run, lengthened to `steps` when given (`--resume RUN --steps N`).

    The schedule keeps the length it was laid out over (`planned`, the configured run: steps
    already trained keep their rates, so does a resume of the extension); every step past it runs
    at the rate of its last step, constant. config.json records it under "extension"."""
    total = recorded.get("total_steps", planned)
    if steps is None or steps == total:
        return {"total_steps": total, **({"extension": recorded["extension"]} if "extension" in recorded else {})}
    if "stop" in recorded:
        raise SynthlabError(
            f"{run_dir} ended at step {total}, its train.schedule.stop_when met: it is finished, not extended"
        )
    if steps < total:
        raise SynthlabError(f"--steps {steps}: the run in {run_dir} is already {total} steps long; extend it to more")
    if (run_dir / "points").is_dir():
        raise SynthlabError(
            f"{run_dir} holds a sweep's points (points/): extending it would change the model their rows "
            "measured; copy the folder without points/ and extend the copy"
        )
    rate = lr_schedule(cfg, planned)(planned - 1)
    if rate <= 0:
        raise SynthlabError(
            f"the run's {cfg.schedule.kind} schedule ends at lr 0: steps past it at that rate would not train"
        )
    return {"total_steps": steps, "extension": {"schedule_steps": planned, "after": "constant", "lr": rate}}


def prepare_run(run: RunConfig, data: Dataset) -> tuple[dict[str, Any], Batcher]:
    """Check the model fits the data (vocabulary, lengths), build the batcher, derive the run length."""
    cfg = run.train
    examples = training_examples(data)
    pack, seq_len = row_layout(cfg, run.model.max_seq_len, examples, data.task)
    if seq_len > run.model.max_seq_len:
        raise SynthlabError(f"rows need {seq_len} positions but model.max_seq_len is {run.model.max_seq_len}")
    check_run(run.model, cfg)
    if run.model.vocab_size != len(data.tokenizer):
        raise SynthlabError(
            f"model.vocab_size is {run.model.vocab_size} but the data's vocabulary has {len(data.tokenizer)} tokens"
        )
    batcher = Batcher(
        examples, batch_size=cfg.batch.batch_size, seq_len=seq_len, pack=pack, pad_id=data.pad_id, seed=cfg.seed
    )
    steps = cfg.schedule.steps or math.ceil(cfg.schedule.exposures * batcher.rows_per_epoch / cfg.batch.batch_size)
    derived = {
        "total_steps": steps,
        "seq_len": seq_len,
        "pack": pack,
        "rows_per_epoch": batcher.rows_per_epoch,
        "n_examples": len(examples),
        "vocab_size": len(data.tokenizer),
    }
    return derived, batcher


@dataclass
class TrainResult:
    step: int
    total_steps: int
    final_loss: float
    interrupted: bool
    main: bool = True  # the process that wrote the run (rank 0 under torchrun): the one that reports
    stopped_by: str = ""  # the train.schedule.stop_when that ended the run ("": it ran its steps)


def train(
    run_dir: str | Path,
    run: RunConfig | None = None,
    *,
    progress: bool = True,
    data: str | Path | None = None,
    extend_to: int | None = None,
) -> TrainResult:
    """Start a run in `run_dir` from `run`, or resume the run already there when `run` is None
    (from `data` when its dataset moved: the same dataset, checked by the recorded sha256s), to
    `extend_to` steps when given (more than it was trained for: `_extension`)."""
    run_dir = Path(run_dir)
    resume = run is None
    if extend_to is not None and not resume:
        raise SynthlabError("extend_to lengthens a resumed run; a new run takes its length from train.schedule.steps")
    if resume:
        run, recorded = load_run(run_dir)
        run.train.data = str(trained_data(run_dir, run, recorded, moved_to=data))
        ckpt = load_checkpoint(run_dir, missing_ok=True)  # None: stopped before its first checkpoint
    check_writable(run_dir)
    if not resume and run.train.checkpoint.init_from is not None:  # a bad --init-from fails before the folder exists
        load_run(run.train.checkpoint.init_from)
        load_weights(build_model(run.model), run.train.checkpoint.init_from)
    data = load_dataset(run.train.data, run.train.task or None)
    derived, batcher = prepare_run(run, data)
    planned = derived["total_steps"]  # the configured length: the schedule's
    if resume:
        length = _extension(run_dir, run.train, recorded, planned, extend_to)
        derived.update(length)
    extending = resume and derived["total_steps"] != recorded.get("total_steps", planned)
    cfg = run.train
    device = resolve_device(cfg.system.device)
    derived["device"] = device.type
    derived["data_sha256"] = data_sha256(run.train.data)  # checked when the run is resumed or evaluated
    check_loggers(cfg)  # a missing tensorboard / wandb package fails before anything is written
    probe = (
        GroupProbe(data, seed=cfg.seed, stop_when=cfg.schedule.stop_when) if cfg.logging.eval_every else None
    )  # so does a bad rule
    # Under torchrun every process gets here. Rank 0 alone looks at the folder, once the group exists
    # (under NCCL joining it does not wait for the others: a late process would see rank 0's files),
    # and every process learns its answer in one collective before rank 0 writes anything.
    with distributed.process_group(device) as (world, device):
        if not resume and distributed.any_of(world, world.main and _not_empty(run_dir), device):
            raise SynthlabError(f"--out {run_dir} is not empty; choose a new folder or --resume it")
        distributed.check_split(cfg.batch.batch_size, world, cfg.batch.grad_accum)
        # processes and torch CPU threads at the run's start (a resumed run may use other numbers)
        derived |= {"processes": world.size, "threads": torch.get_num_threads()}
        if world.main and not resume:
            run_dir.mkdir(parents=True, exist_ok=True)
            _write_config(run_dir, run, derived)
        # Weights come from build_model's own seeded generator; torch's global RNG only drives dropout.
        # It is forked so that training can seed and checkpoint it without touching the caller's state.
        with (
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
            float32_matmul(device, cfg.system.tf32),
            folder_lock(run_dir, "training", world.main),
        ):
            if world.main and extending:  # until the extension ends, the run reads as unfinished
                _write_config(run_dir, run, {**recorded, **length})
                for name in ("summary.json", WEIGHTS):
                    (run_dir / name).unlink(missing_ok=True)
            state = _start(run_dir, run, planned, batcher, device, world, ckpt if resume else None)

            def where() -> str:
                return f"at step {state.step + 1}; {_kept(run_dir, cfg)} (continue with: synthlab train --resume {run_dir})"

            writer = checkpointer.Writer(
                lambda snapshot: save_checkpoint(
                    run_dir, snapshot, keep=cfg.checkpoint.keep_checkpoints, every=_every(cfg, derived["total_steps"])
                )
            )
            try:
                with distributed.peers_lost_as_error(world, where):
                    return _loop(
                        run_dir,
                        cfg,
                        derived["total_steps"],
                        state,
                        device,
                        world,
                        progress,
                        probe,
                        writer,
                    )
            finally:
                writer.settle()


def _write_config(run_dir: Path, run: RunConfig, derived: dict[str, Any]) -> None:
    atomic_write_text(
        run_dir / "config.json", json.dumps({**serialize.to_dict(run), "derived": derived}, indent=2) + "\n"
    )


def _not_empty(run_dir: Path) -> bool:
    """Whether `run_dir` holds anything but a run that stopped before its first step (that one is cleared)."""
    return run_dir.exists() and any(run_dir.iterdir()) and not clear_unstarted(run_dir)


def _every(cfg: TrainConfig, total: int) -> int:
    """Steps between checkpoints (train.checkpoint.checkpoints spaces them over the run)."""
    return checkpointer.every(total, cfg.checkpoint.checkpoint_every, cfg.checkpoint.checkpoints)


def _start(
    run_dir: Path,
    run: RunConfig,
    total: int,
    batcher: Batcher,
    device: torch.device,
    world: distributed.World,
    ckpt: dict[str, Any] | None,
) -> TrainState:
    """The training state with its model, fresh (global RNG seeded) or restored from the checkpoint `ckpt`."""
    cfg = run.train
    torch.manual_seed(cfg.seed)
    model = build_model(run.model, seed=cfg.seed).to(device)
    if cfg.checkpoint.init_from is not None and ckpt is None:
        load_weights(model, cfg.checkpoint.init_from, device)
    if cfg.loss == "ouro_stage2":  # Ouro stage II: the LM is frozen, only the exit gate learns
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("exit_gate."))
    elif cfg.loss in ("last", "mean") and model.exit_gate is not None:  # no gradient reaches the gate (DDP
        model.exit_gate.requires_grad_(False)  # expects one for every parameter that requires it)
    # draws inside the model (sampled depth, random initial state) come from `model_rng`; the
    # global RNG drives dropout
    state = TrainState(
        model,
        build_optimizer(model, cfg),
        lr_schedule(cfg, total),
        data={"batcher": batcher},
        generators={"model_rng": torch.Generator().manual_seed(cfg.seed + 1)},
        global_rng=True,
    )
    if ckpt is not None:
        state.load_state_dict(ckpt)
    if world.main:  # lines logged after the checkpoint, or (resumed from step 0) all of them
        trim_metrics(run_dir, state.step)
    return state


def _kept(run_dir: Path, cfg: TrainConfig) -> str:
    """What a stopped run leaves behind, for its error line."""
    if checkpoint_files(run_dir):
        return f"the last good checkpoint in {run_dir} is kept"
    first = (
        f"step {cfg.checkpoint.checkpoint_every}"
        if not cfg.checkpoint.checkpoints
        else f"1/{cfg.checkpoint.checkpoints} of the run"
    )
    return f"no checkpoint in {run_dir} yet (the first was due at {first})"


def _save(
    run_dir: Path, cfg: TrainConfig, state: TrainState, world: distributed.World, writer: checkpointer.Writer
) -> None:
    """Checkpoint the state, unless the last update left non-finite weights (then stop, keeping
    the last good checkpoint: the loss checked before the update could not see it)."""
    if not state.weights_finite():
        raise SynthlabError(
            f"training diverged at step {state.step}: the weights are not finite (lr {cfg.optim.lr}); {_kept(run_dir, cfg)}"
        )
    if world.main:
        writer.submit(state.state_dict())  # written off the training thread


def _loop(
    run_dir: Path,
    cfg: TrainConfig,
    total: int,
    state: TrainState,
    device: torch.device,
    world: distributed.World,
    progress: bool,
    probe: GroupProbe | None,
    writer: checkpointer.Writer,
) -> TrainResult:
    """Train to the end (or a signal); `probe` scores per-group accuracy every `eval_every` steps.

    Every process draws the same batch and runs its share (`distributed.share`) as `grad_accum`
    micro-batches, each weighted by its share of the batch's target tokens (every objective is a
    masked mean over them), so that the parts sum to the whole batch's. The losses are the whole
    batch's on logging and checkpoint steps, when a non-finite loss also stops the run with one
    error line before anything is written; checking every step would cost a device sync on a GPU.
    """
    batcher, generator = state.data["batcher"], state.generators["model_rng"]
    parallel = distributed.wrap(state.model, world, device)
    forward = model_forward(parallel, cfg.system.compile, cfg.system.activation_checkpointing)
    state.model.train()
    record: dict[str, Any] = {}
    board = Loggers(run_dir, cfg) if world.main else None
    window_tokens, window_start = 0, time.perf_counter()
    bar = Progress(total, initial=state.step, enabled=progress and world.main, desc=f"train {cfg.task}", unit="step")
    metrics_path = run_dir / "metrics.jsonl" if world.main else os.devnull  # rank 0 writes the log
    with distributed.StopOnSignal() as stop, open(metrics_path, "a") as metrics:
        # a signal reaching any process stops all of them at the same step
        while state.step < total and not distributed.stop_now(world, stop.signum is not None, state.step, device):
            done = state.step + 1
            eval_now = probe is not None and done % cfg.logging.eval_every == 0
            log_now = done % cfg.logging.log_every == 0 or done == total or eval_now
            save_now = done % _every(cfg, total) == 0 or done == total
            rows = batcher.next_batch()
            targets_total = max(int(rows.loss_mask.sum()), 1)
            mine = distributed.share(rows, world.rank, world.size)
            draws = generator.get_state()

            def micro(i: int):
                generator.set_state(draws)  # the model's draws (sampled depth) are the step's, in every micro-batch
                part = distributed.share(mine, i, cfg.batch.grad_accum)
                inputs, targets, mask, doc_ids = to_device(part, device)
                with autocast(device, cfg.system.cpu_bf16):
                    objective, per_step = step_losses(forward, inputs, targets, mask, doc_ids, cfg, generator, log_now)
                weight = int(part.loss_mask.sum()) / targets_total
                # DDP averages over the processes: the factor K undoes its 1/K
                return objective * (weight * world.size), (objective.detach() * weight, per_step.detach() * weight)

            done_step = engine.step(
                state,
                cfg.batch.grad_accum,
                micro,
                world=world,
                grad_clip=cfg.optim.grad_clip,
                check=log_now or save_now,
                parallel=parallel,
                where=lambda: f" (lr {cfg.optim.lr}); {_kept(run_dir, cfg)}",
            )
            batch_tokens = int((rows.inputs != batcher.pad_id).sum())  # real tokens, padding excluded
            state.tokens_seen += batch_tokens
            window_tokens += batch_tokens
            bar.update(1)
            if log_now:
                objective, per_step = done_step.logged
                now = time.perf_counter()
                speed = window_tokens / max(now - window_start, 1e-9)
                window_tokens, window_start = 0, now
                record = {
                    "step": state.step,
                    "tokens": state.tokens_seen,
                    "loss": float(objective),
                    "loss_per_step": per_step.float().cpu().tolist(),
                    "lr": done_step.lr,
                    "tokens_per_s": speed,
                }
                if eval_now and world.main:
                    record.update(probe(state.model, device))
                    window_start = time.perf_counter()  # the probe's time is not training time
                if eval_now and probe.stop and distributed.any_of(world, world.main and probe.met(record), device):
                    total, save_now = state.step, True  # train.schedule.stop_when met: the run ends here, finished
                    if world.main:
                        record_stop(run_dir, cfg.schedule.stop_when, total)
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
                if board is not None:
                    board.log(record)
                bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{speed:,.0f}")
            if save_now:
                _save(run_dir, cfg, state, world, writer)
        if state.step < total:  # stopped by a signal
            _save(run_dir, cfg, state, world, writer)
        writer.close()
    bar.close()
    if board is not None:
        board.close()
    interrupted = state.step < total
    if not interrupted and record and world.main:
        save_weights(run_dir, state.model)  # the weights alone, for load_model
        record |= stopped(run_dir)
        atomic_write_text(run_dir / "summary.json", json.dumps(record, indent=2) + "\n")
    elif not record and (run_dir / "summary.json").is_file():  # resumed a finished run: nothing to do
        record = json.loads((run_dir / "summary.json").read_text())
    loss = record.get("loss", float("nan"))
    return TrainResult(state.step, total, loss, interrupted, world.main, record.get("stopped_by", ""))
