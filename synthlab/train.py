"""Training loop: one function, `train(run_dir)`, that starts or resumes a run directory.

A run directory describes itself:
- `config.json`: the fully resolved RunConfig (model + train) and what was derived from the data
  (vocabulary size, row length, packing, total steps, device);
- `metrics.jsonl`: one line every `log_every` steps (step, tokens seen, loss, loss per recurrent
  step, learning rate, tokens/s);
- `checkpoint.pt`: model, optimizer, scheduler, torch RNG states, data position, step; written
  atomically (temporary sibling + rename) every `checkpoint_every` steps, at the end, and when
  SIGINT or SIGTERM arrives;
- `summary.json`: final numbers, written at the end.

Resuming replays nothing: the batcher's state is (epoch, cursor) and the torch RNG states are
restored, so on CPU a resumed run produces the same losses as an uninterrupted one, bit for bit.

Objectives (`TrainConfig.loss`), all over the task's loss mask: the last step's loss, the mean of
the per-step losses, Ouro stage I (exit gate, entropy-regularised) and Ouro stage II (the gate
alone, LM frozen, starting from a stage I run's weights via `init_from`).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from synthlab import config as configlib
from synthlab.data import Batcher, Dataset, Rows, load_dataset, training_examples
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write, atomic_write_text
from synthlab.models import ModelConfig, build_model
from synthlab.models.losses import ouro_stage1_loss, ouro_stage2_loss, token_losses

LOSSES = ("last", "mean", "ouro", "ouro_stage2")


@dataclass
class TrainConfig:
    """Optimisation and data settings; `steps` or `exposures` (epochs over the data) sets the length."""

    task: str = ""
    data: str = ""
    seed: int = 0
    batch_size: int = 64
    seq_len: int | None = None  # row length when packing (default: the model's max_seq_len)
    pack: bool | None = None  # pack several examples per row with document masking (default: bioS only)
    steps: int | None = None
    exposures: float | None = None  # how many times each training example is seen
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on 2-D weights only (not norms, biases, gains)
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping
    # last | mean (of per-step losses) | ouro (stage I, needs the exit gate) | ouro_stage2 (the
    # gate alone learns when to stop, LM frozen; start from a stage I run with init_from)
    loss: str = "last"
    entropy_beta: float = 0.05  # Ouro stage I entropy weight
    init_from: str | None = None  # a run directory whose checkpoint weights start this run
    checkpoint_every: int = 1000
    log_every: int = 10
    device: str = "auto"  # auto | cpu | cuda
    compile: bool = False

    def __post_init__(self) -> None:
        if self.task not in ("", "bios", "mano", "multihop", "reach"):
            raise SynthlabError(f"train.task must be bios, mano, multihop or reach, not {self.task!r}")
        if (self.steps is None) == (self.exposures is None):
            raise SynthlabError("set exactly one of train.steps (--steps) and train.exposures (--exposures)")
        if self.steps is not None and self.steps < 1:
            raise SynthlabError(f"train.steps must be >= 1, got {self.steps}")
        if self.exposures is not None and self.exposures <= 0:
            raise SynthlabError(f"train.exposures must be > 0, got {self.exposures}")
        for name in ("batch_size", "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise SynthlabError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len is not None and self.seq_len < 2:
            raise SynthlabError(f"train.seq_len must be >= 2, got {self.seq_len}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise SynthlabError("train.lr must be > 0, train.min_lr_ratio in [0, 1], train.warmup_steps >= 0")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise SynthlabError("train.weight_decay and train.grad_clip must be >= 0")
        if self.loss not in LOSSES:
            raise SynthlabError(f"train.loss must be one of {', '.join(LOSSES)}, not {self.loss!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise SynthlabError(f"train.device must be auto, cpu or cuda, not {self.device!r}")


@dataclass
class RunConfig:
    """Everything a run needs: the `[model]` and `[train]` sections of a run.toml, resolved."""

    model: ModelConfig
    train: TrainConfig


def resolve_run_config(file: dict[str, Any], model_flags: dict[str, Any], train_flags: dict[str, Any]) -> RunConfig:
    """CLI flags > run.toml sections > defaults; the vocabulary size comes from the data folder."""
    for section in file:
        if section not in ("model", "train"):
            close = difflib.get_close_matches(section, ["model", "train"], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SynthlabError(f"unknown config section '{section}'{hint}; a run config has [model] and [train]")
    given = lambda d: {k: v for k, v in d.items() if v is not None}  # noqa: E731
    train_dict = {**file.get("train", {}), **given(train_flags)}
    for flag, other in (("steps", "exposures"), ("exposures", "steps")):
        if flag in given(train_flags) and other not in given(train_flags):
            train_dict.pop(other, None)  # a length on the command line replaces the file's
    train_cfg = configlib.from_dict(TrainConfig, train_dict, where="train.")
    if not train_cfg.data:
        raise SynthlabError("no data folder: pass --data DIR (or train.data in the config file)")
    data = load_dataset(train_cfg.data, train_cfg.task or None)
    model_dict = {**file.get("model", {}), **given(model_flags)}
    vocab = len(data.tokenizer)
    if model_dict.setdefault("vocab_size", vocab) != vocab:
        raise SynthlabError(f"model.vocab_size is {model_dict['vocab_size']} but the data's vocabulary has {vocab} tokens")
    train_cfg = configlib.merge(train_cfg, {"task": data.task})
    return RunConfig(configlib.from_dict(ModelConfig, model_dict, where="model."), train_cfg)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SynthlabError("train.device is cuda but no CUDA device is available")
    return torch.device(name)


def autocast(device: torch.device):
    """bf16 autocast on CUDA; fp32 (no autocast) on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (2-D weights, embeddings included) and none on vectors."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine from 1 to `min_ratio` at `total` steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.warmup_steps, total_steps, cfg.min_lr_ratio)
    )


def to_device(rows: Rows, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(inputs, targets, loss mask, doc ids or None) as tensors on `device`."""
    tensors = [torch.from_numpy(a).to(device, non_blocking=True) for a in (rows.inputs, rows.targets, rows.loss_mask)]
    doc_ids = None if rows.doc_ids is None else torch.from_numpy(rows.doc_ids).to(device, non_blocking=True)
    return (*tensors, doc_ids)


def model_forward(model: torch.nn.Module, compile: bool = False):
    """A function (inputs, doc_ids, generator, all_steps) -> (step_logits, exit p(t), exit lambda_t);
    the last two are None without the exit gate.

    Returning only these keeps torch.compile away from the model output's `logits`, a view of
    `step_logits`: compiled graphs whose outputs alias each other fail at run time (torch 2.13).
    """

    def forward(inputs, doc_ids, generator, all_steps):
        out = model(inputs, doc_ids=doc_ids, generator=generator, all_steps=all_steps)
        return out.step_logits, out.exit_probs, out.exit_lambdas

    return torch.compile(forward) if compile else forward


def step_losses(forward, inputs, targets, mask, doc_ids, cfg: TrainConfig, generator: torch.Generator,
                all_steps: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(objective to minimise, masked mean loss per recurrent step (T,)) for one batch.

    `forward` comes from `model_forward`. With the `last` objective the other steps' read-outs
    only serve the log, so they are computed on logging steps only (`all_steps`); per_step then
    has one entry otherwise.
    """
    all_steps = all_steps or cfg.loss != "last"
    step_logits, exit_probs, exit_lambdas = forward(inputs, doc_ids, generator, all_steps)
    # positions outside the mask (prompt tokens of Mano/QA, padding) get target -100: loss 0
    losses = token_losses(step_logits, targets.masked_fill(~mask, -100))  # (T, B, S) fp32
    per_step = losses.sum((1, 2)) / mask.sum().clamp_min(1)  # (T,) masked means
    if cfg.loss == "last":
        return per_step[-1], per_step
    if cfg.loss == "mean":
        return per_step.mean(), per_step
    if cfg.loss == "ouro":
        return ouro_stage1_loss(losses, exit_probs.float(), mask, beta=cfg.entropy_beta), per_step
    return ouro_stage2_loss(losses, exit_lambdas.float(), mask), per_step


class _StopOnSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks after each step (then checkpoints and exits)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def load_checkpoint(run_dir: Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The run's checkpoint; a missing or unreadable one is a SynthlabError (nothing is touched)."""
    path = Path(run_dir) / "checkpoint.pt"
    if not path.is_file():
        raise SynthlabError(f"no checkpoint in {run_dir} (checkpoint.pt missing)")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as err:  # torch raises many types for a damaged file
        raise SynthlabError(f"corrupt checkpoint {path}: {type(err).__name__}") from None
    if not isinstance(ckpt, dict) or not {"model", "step"} <= ckpt.keys():
        raise SynthlabError(f"corrupt checkpoint {path}: missing model state")
    return ckpt


def load_run(run_dir: str | Path) -> tuple[RunConfig, dict[str, Any]]:
    """(RunConfig, derived settings) from a run directory's config.json."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise SynthlabError(f"{run_dir} is not a run directory (no config.json)")
    data = configlib.load_dict(path)
    derived = data.pop("derived", {})
    return configlib.from_dict(RunConfig, data), derived


def _load_weights(model: torch.nn.Module, run_dir: Path, device) -> None:
    try:
        model.load_state_dict(load_checkpoint(run_dir, device)["model"])
    except RuntimeError as err:
        raise SynthlabError(f"the checkpoint in {run_dir} does not fit this model: {str(err).splitlines()[0]}") from None


def load_trained_model(run_dir: str | Path, device: torch.device | str = "cpu"):
    """(model in eval mode, RunConfig, derived) from a finished or interrupted run."""
    run, derived = load_run(run_dir)
    model = build_model(run.model).to(device)  # weights come from the checkpoint
    _load_weights(model, Path(run_dir), device)
    return model.eval(), run, derived


def prepare_run(run: RunConfig, data: Dataset) -> tuple[dict[str, Any], Batcher]:
    """Check the model fits the data (vocabulary, lengths), build the batcher, derive the run length."""
    cfg = run.train
    examples = training_examples(data)
    pack = cfg.pack if cfg.pack is not None else data.task == "bios"
    longest = int(examples.lengths.max()) - 1  # input positions of the longest example
    seq_len = (cfg.seq_len or run.model.max_seq_len) if pack else longest
    if seq_len > run.model.max_seq_len:
        raise SynthlabError(f"rows need {seq_len} positions but model.max_seq_len is {run.model.max_seq_len}")
    if cfg.loss.startswith("ouro") and not run.model.exit_gate:
        raise SynthlabError(f"train.loss = {cfg.loss} needs the exit gate (--exit-gate)")
    if cfg.loss == "ouro_stage2" and cfg.init_from is None:
        raise SynthlabError("train.loss = ouro_stage2 trains the gate of a trained model: set train.init_from (--init-from RUN_DIR)")
    if run.model.vocab_size != len(data.tokenizer):
        raise SynthlabError(f"model.vocab_size is {run.model.vocab_size} but the data's vocabulary has {len(data.tokenizer)} tokens")
    batcher = Batcher(examples, batch_size=cfg.batch_size, seq_len=seq_len, pack=pack, pad_id=data.pad_id, seed=cfg.seed)
    steps = cfg.steps or math.ceil(cfg.exposures * batcher.rows_per_epoch / cfg.batch_size)
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


def train(run_dir: str | Path, run: RunConfig | None = None, *, progress: bool = True) -> TrainResult:
    """Start a run in `run_dir` from `run`, or resume the run already there when `run` is None."""
    run_dir = Path(run_dir)
    resume = run is None
    if resume:
        run, _ = load_run(run_dir)
        ckpt = load_checkpoint(run_dir)
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise SynthlabError(f"--out {run_dir} is not empty; choose a new folder or --resume it")
    data = load_dataset(run.train.data, run.train.task or None)
    derived, batcher = prepare_run(run, data)
    cfg = run.train
    device = resolve_device(cfg.device)
    derived["device"] = device.type
    if not resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.json", json.dumps({**configlib.to_dict(run), "derived": derived}, indent=2) + "\n")

    # Weights come from build_model's own seeded generator; torch's global RNG only drives dropout.
    # It is forked so that training can seed and checkpoint it without touching the caller's state.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(cfg.seed)
        model = build_model(run.model, seed=cfg.seed).to(device)
        if cfg.init_from is not None and not resume:
            _load_weights(model, Path(cfg.init_from), device)
        if cfg.loss == "ouro_stage2":  # Ouro stage II: the LM is frozen, only the exit gate learns
            for name, p in model.named_parameters():
                p.requires_grad_(name.startswith("exit_gate."))
        # draws inside the model (sampled depth, random initial state) come from this generator
        generator = torch.Generator().manual_seed(cfg.seed + 1)
        optimizer = build_optimizer(model, cfg)
        scheduler = build_scheduler(optimizer, cfg, derived["total_steps"])
        step, tokens_seen = 0, 0
        if resume:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
            batcher.load_state_dict(ckpt["batcher"])
            torch.set_rng_state(ckpt["torch_rng"])
            generator.set_state(ckpt["model_rng"])
            if device.type == "cuda" and ckpt.get("cuda_rng") is not None:
                torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
            step, tokens_seen = ckpt["step"], ckpt["tokens_seen"]
            _truncate_metrics(run_dir / "metrics.jsonl", step)
        return _loop(run_dir, run, derived, model, optimizer, scheduler, batcher, generator, device, step, tokens_seen, progress)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop lines logged after the checkpoint (the resumed run logs them again)."""
    if path.is_file():
        lines = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        atomic_write_text(path, "".join(line + "\n" for line in lines))


def _loop(run_dir, run, derived, model, optimizer, scheduler, batcher, generator, device, step, tokens_seen, progress) -> TrainResult:
    cfg: TrainConfig = run.train
    total = derived["total_steps"]
    forward = model_forward(model, cfg.compile)

    def save() -> None:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "batcher": batcher.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "model_rng": generator.get_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else None,
            "step": step,
            "tokens_seen": tokens_seen,
        }
        atomic_write(run_dir / "checkpoint.pt", lambda tmp: torch.save(state, tmp))

    model.train()
    record: dict[str, Any] = {}
    window_tokens, window_start = 0, time.perf_counter()
    bar = tqdm(total=total, initial=step, disable=not progress, desc=f"train {cfg.task}", unit="step", dynamic_ncols=True)
    with _StopOnSignal() as stop, open(run_dir / "metrics.jsonl", "a") as metrics:
        while step < total and stop.signum is None:
            rows = batcher.next_batch()
            inputs, targets, mask, doc_ids = to_device(rows, device)
            log_now = (step + 1) % cfg.log_every == 0 or step + 1 == total
            with autocast(device):
                objective, per_step = step_losses(forward, inputs, targets, mask, doc_ids, cfg, generator, log_now)
            optimizer.zero_grad(set_to_none=True)
            objective.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            step += 1
            batch_tokens = int((rows.inputs != batcher.pad_id).sum())  # real tokens, padding excluded
            tokens_seen += batch_tokens
            window_tokens += batch_tokens
            bar.update(1)
            if log_now:
                losses = per_step.detach().float().cpu().tolist()
                now = time.perf_counter()
                speed = window_tokens / max(now - window_start, 1e-9)
                window_tokens, window_start = 0, now
                record = {"step": step, "tokens": tokens_seen, "loss": float(objective.detach()), "loss_per_step": losses, "lr": lr, "tokens_per_s": speed}
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
                bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{speed:,.0f}")
            if step % cfg.checkpoint_every == 0 or step == total:
                save()
        if stop.signum is not None:
            save()
    bar.close()
    interrupted = step < total
    if not interrupted and record:
        atomic_write_text(run_dir / "summary.json", json.dumps(record, indent=2) + "\n")
    elif not record and (run_dir / "summary.json").is_file():  # resumed a finished run: nothing to do
        record = json.loads((run_dir / "summary.json").read_text())
    return TrainResult(step, total, record.get("loss", float("nan")), interrupted)
