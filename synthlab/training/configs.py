"""Typed configs, one dataclass per concern, shared by the CLI, run folders and sweeps.

- `ModelConfig` (synthlab.models): the architecture.
- `TrainConfig`: optimisation and data settings of one training run.
- `EvalOptions`: how a trained model is scored (the `[eval]` section of an experiment).
- `GateOptions`: Ouro stage II after a stage I model (the `[gate]` section).
- `OuroborosConfig`, `OuroborosTrainConfig`: the OUROBOROS system and its training
  (synthlab.ouroboros), here so that the CLI builds their flags without importing torch.
- `PointConfig`: one sweep point, every section parsed into its class once (`parse_point`); the
  point runner passes this object on, nothing downstream reads the raw dict again.

Each check lives in the class that owns the field (`__post_init__`); errors are one line naming
`section.field`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from synthlab import serialize
from synthlab.conditions import parse as parse_conditions
from synthlab.errors import SynthlabError
from synthlab.models import KV_STRATEGIES, ModelConfig
from synthlab.serialize import option
from synthlab.training.optim import OPTIMIZER_IMPLS, SCHEDULES
from synthlab_generators import TASKS

LOSSES = ("last", "mean", "ouro", "ouro_stage2")


def _finite(where: str, **values: float) -> None:
    for name, value in values.items():
        if value is not None and not math.isfinite(value):
            raise SynthlabError(f"{where}{name} must be a finite number, got {value}")


@dataclass
class TrainConfig:
    """Optimisation and data settings; `steps` or `exposures` (epochs over the data) sets the length."""

    task: str = option("", "Task of the data: bios, mano, multihop or reach (checked against DIR/meta.json).")
    data: str = option("", "Dataset folder written by `synthlab gen`.")
    seed: int = option(0, "Seed of the initial weights and the data order.")
    batch_size: int = option(64, "Rows per batch.")
    grad_accum: int = option(
        1,
        "Split each batch into this many micro-batches, gradients accumulated (same "
        "loss as one batch, less memory); batch_size must divide by it.",
    )
    seq_len: int | None = option(None, "Row length when packing (default: the model's max_seq_len).")
    pack: bool | None = option(
        None, "Pack several examples per row with document masking (default: the task's choice, bios only)."
    )
    steps: int | None = option(None, "Optimizer steps (or use exposures).")
    exposures: float | None = option(None, "Passes over the training data (bioS: times each biography is seen).")
    lr: float = option(1e-3, "Peak learning rate.")
    schedule: str = option(
        "cosine", "Learning-rate schedule after the linear warmup: cosine, constant or wsd (warmup-stable-decay)."
    )
    min_lr_ratio: float = option(0.1, "cosine (and wsd's cooldown) decay to lr times this.")
    decay_fraction: float = option(0.2, "wsd: share of the run spent in the final linear cooldown.")
    warmup_steps: int = option(50, "Linear warmup steps.")
    weight_decay: float = option(0.1, "AdamW weight decay on 2-D weights (not norms, biases, gains).")
    beta1: float = option(0.9, "AdamW beta1.")
    beta2: float = option(0.98, "AdamW beta2.")
    eps: float = option(1e-8, "AdamW epsilon.")
    grad_clip: float = option(1.0, "Gradient norm clip (0: off).")
    optimizer_impl: str = option(
        "default",
        "torch AdamW's kernel: default (a loop per tensor on the CPU), foreach or fused (benchmarks/README.md "
        "has the measured factors; the same update up to rounding).",
    )
    cpu_bf16: bool = option(
        False,
        "On the CPU, bf16 autocast in training (for CPUs with bf16 units; without them 3-6x slower at d 16-64: "
        "benchmarks/bench_shapes.py --bf16 measures it); off: float32, the committed presets' numerics.",
    )
    loss: str = option(
        "last",
        "Objective: last (last step), mean (of steps), ouro (stage I, needs the exit gate) "
        "or ouro_stage2 (gate only, LM frozen, needs init_from).",
    )
    entropy_beta: float = option(0.05, "Ouro stage I entropy weight.")
    init_from: str | None = option(
        None, "Start from the weights of this run directory's checkpoint (e.g. stage II after stage I)."
    )
    checkpoint_every: int = option(1000, "Write a checkpoint every K steps (unless train.checkpoints is set).")
    checkpoints: int = option(
        0,
        "Write K checkpoints evenly spaced over the run, one every ceil(steps / K) steps, "
        "whatever its length (0: every train.checkpoint_every steps).",
    )
    keep_checkpoints: int = option(
        2, "Checkpoints kept, the newest K (a damaged newest one falls back to an older one)."
    )
    log_every: int = option(10, "Append to metrics.jsonl every K steps.")
    eval_every: int = option(
        0,
        "Every K steps, log per-group accuracy and answer loss on fixed samples of held-out "
        "and training prompts to metrics.jsonl (eval/acc_l1, eval/train_acc_l1, ...; 0: off).",
    )
    stop_when: str = option(
        "",
        "End the run, finished, at the first eval_every probe whose columns meet this condition, e.g. "
        "'train_acc_l1 >= 0.99 and train_acc_l2 >= 0.99' (a verdict's `requires` grammar; the names "
        "results.csv gives the probe's columns, or metrics.jsonl's eval/...); steps or exposures stays "
        "the upper bound and the learning-rate schedule stays laid out over it: the rule stops the run, "
        "it does not rescale the schedule (empty: train to the budget).",
    )
    device: str = option("auto", "auto (CUDA with bf16 if present, else CPU fp32), cpu or cuda.")
    compile: bool = option(False, "torch.compile the model (with step_sampling: each block, since the depth varies).")
    activation_checkpointing: bool = option(
        False,
        "Activation checkpointing per recurrent step: keep each step's input "
        "state only and recompute the step (core and readout) in the backward "
        "pass; the same loss and gradients, far less activation memory for "
        "about one more forward pass of compute.",
    )
    tensorboard: bool = option(
        False,
        "Also log the metrics to RUN_DIR/tensorboard (needs the tensorboard package: "
        "pip install 'synthlab[tensorboard]').",
    )
    wandb: str | None = option(
        None,
        "Also log the metrics to Weights & Biases, in this project (needs the wandb "
        "package: pip install 'synthlab[wandb]'; WANDB_MODE=offline keeps the run in "
        "RUN_DIR/wandb for `wandb sync`).",
    )
    tf32: bool = option(
        True, "On CUDA, TF32 tensor cores for the float32 matmuls autocast leaves (false: full float32)."
    )

    def __post_init__(self) -> None:
        if self.task not in ("", *TASKS):
            raise SynthlabError(f"train.task must be one of {', '.join(TASKS)}, not {self.task!r}")
        if (self.steps is None) == (self.exposures is None):
            raise SynthlabError("set exactly one of train.steps (--steps) and train.exposures (--exposures)")
        _finite(
            "train.",
            lr=self.lr,
            min_lr_ratio=self.min_lr_ratio,
            weight_decay=self.weight_decay,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            grad_clip=self.grad_clip,
            entropy_beta=self.entropy_beta,
            exposures=self.exposures,
            decay_fraction=self.decay_fraction,
        )
        if self.steps is not None and self.steps < 1:
            raise SynthlabError(f"train.steps must be >= 1, got {self.steps}")
        if self.exposures is not None and self.exposures <= 0:
            raise SynthlabError(f"train.exposures must be > 0, got {self.exposures}")
        for name in ("batch_size", "grad_accum", "checkpoint_every", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise SynthlabError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_every < 0:
            raise SynthlabError(f"train.eval_every must be >= 0 (0: off), got {self.eval_every}")
        if self.stop_when:
            _check_stop_rule(self.stop_when, self.eval_every)
        if self.seed < 0:  # numpy's generators take no negative seed
            raise SynthlabError(f"train.seed (--seed) must be >= 0, got {self.seed}")
        if self.checkpoints < 0:
            raise SynthlabError(
                f"train.checkpoints must be >= 0 (0: every train.checkpoint_every steps), got {self.checkpoints}"
            )
        if self.batch_size % self.grad_accum:
            raise SynthlabError(f"train.grad_accum {self.grad_accum} must divide train.batch_size {self.batch_size}")
        if self.seq_len is not None and self.seq_len < 2:
            raise SynthlabError(f"train.seq_len must be >= 2, got {self.seq_len}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise SynthlabError("train.lr must be > 0, train.min_lr_ratio in [0, 1], train.warmup_steps >= 0")
        if self.schedule not in SCHEDULES:
            raise SynthlabError(f"train.schedule must be one of {', '.join(SCHEDULES)}, not {self.schedule!r}")
        if not 0 < self.decay_fraction <= 1:
            raise SynthlabError(f"train.decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0):
            raise SynthlabError("train.beta1 and train.beta2 must be in [0, 1), train.eps > 0")
        if self.weight_decay < 0 or self.grad_clip < 0 or self.entropy_beta < 0:
            raise SynthlabError("train.weight_decay, train.grad_clip and train.entropy_beta must be >= 0")
        if self.optimizer_impl not in OPTIMIZER_IMPLS:
            raise SynthlabError(
                f"train.optimizer_impl must be one of {', '.join(OPTIMIZER_IMPLS)}, not {self.optimizer_impl!r}"
            )
        if self.loss not in LOSSES:
            raise SynthlabError(f"train.loss must be one of {', '.join(LOSSES)}, not {self.loss!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise SynthlabError(f"train.device must be auto, cpu or cuda, not {self.device!r}")


# The columns the probe logs (synthlab.evaluation.groups.group_columns: held-out and training
# accuracy, answer loss and count per group); which groups a dataset has is checked when it is loaded.
_PROBE_COLUMN = re.compile(r"^(train_)?(acc|answer_loss|n)_\w+$")


def _check_stop_rule(text: str, eval_every: int) -> None:
    if not eval_every:
        raise SynthlabError(
            "train.stop_when reads the probe of train.eval_every: set train.eval_every (--eval-every K)"
        )
    for column, _, _ in parse_conditions(text, "train.stop_when", prefix="eval/"):
        if not _PROBE_COLUMN.match(column):
            raise SynthlabError(
                f"train.stop_when: {column} is no column of the probe (it logs acc_<group>, train_acc_<group>, "
                "answer_loss_<group>, train_answer_loss_<group>, n_<group>, train_n_<group>)"
            )


@dataclass
class EvalOptions:
    """The `[eval]` section of an experiment: how the trained model is scored."""

    steps: int | None = option(None, "Recurrent steps at evaluation (default: the trained loops).")
    exit: str | None = option(None, "Exit rule per token: static:T, q:0.8, diff:0.01 or kl:0.001.")
    kv: str | None = option(None, "Decode-time KV-cache strategy: full, first, last or mean.")
    agreement: bool = option(False, "Report the step x step answer agreement matrix.")
    batch_size: int = option(256, "Examples per forward pass.")
    checkpoint: int | None = option(
        None,
        "heldout stage: score the checkpoint of this optimizer step instead of the "
        "final model (the run must keep it: train.keep_checkpoints).",
    )
    heldout_rows: int = option(64, "heldout stage: rows of a fresh dataset (same generator, another seed) scored.")
    max_prompts: int | None = option(
        None,
        "eval stage: score at most this many test prompts (and as many of each other set), each group its even share.",
    )

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise SynthlabError(f"eval.steps must be >= 1, got {self.steps}")
        if (self.checkpoint is not None and self.checkpoint < 1) or self.heldout_rows < 1:
            raise SynthlabError("eval.checkpoint and eval.heldout_rows must be >= 1")
        if self.kv is not None and self.kv not in KV_STRATEGIES:
            raise SynthlabError(f"eval.kv must be one of {', '.join(KV_STRATEGIES)}, not {self.kv!r}")
        if self.exit is not None:
            from synthlab.models.exits import parse_exit_rule  # torch: only when a rule is given

            parse_exit_rule(self.exit)
        if self.batch_size < 1:
            raise SynthlabError(f"eval.batch_size must be >= 1, got {self.batch_size}")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise SynthlabError(f"eval.max_prompts must be >= 1, got {self.max_prompts}")


@dataclass
class GateOptions:
    """The `[gate]` section (stage "gate"): Ouro stage II after the stage I model is trained.

    The exit gate alone is trained on the frozen stage I model (train.loss = ouro_stage2, starting
    from its weights), and the point is evaluated with that model: static, diff and kl exits are
    unchanged by it (the LM is frozen), the learned q: exit gets the stage II gate. The values are
    checked by the stage II run's TrainConfig when the point is parsed.
    """

    steps: int = option(500, "Stage II steps (the exit gate alone).")
    lr: float = option(1e-3, "Stage II peak learning rate.")
    warmup_steps: int = option(50, "Stage II warmup steps.")


@dataclass
class PointConfig:
    """One sweep point, typed: the generator params, model, train, eval and gate options."""

    task: str
    data: Any  # the task's generator params dataclass
    data_seed: int
    data_key: dict[str, Any]  # the data section as written (with its seed): the dataset cache key
    model: ModelConfig  # vocab_size from the task's shape (checked against the data when trained)
    train: TrainConfig
    eval: EvalOptions = field(default_factory=EvalOptions)
    gate: GateOptions = field(default_factory=GateOptions)
    stages: tuple[str, ...] = ("train",)
    ouroboros: Any = None  # stage ouroboros: synthlab.ouroboros.stage.OuroborosOptions, parsed by the point runner

    @property
    def spec(self):
        return TASKS[self.task]

    def stage2_train(self, stage1: TrainConfig, init_from: str) -> TrainConfig:
        """The TrainConfig of this point's Ouro stage II run on the stage I model in `init_from`."""
        return dataclasses.replace(
            stage1,
            loss="ouro_stage2",
            init_from=init_from,
            steps=self.gate.steps,
            exposures=None,
            lr=self.gate.lr,
            warmup_steps=self.gate.warmup_steps,
            stop_when="",  # stage I's rule: the frozen LM met it already, the gate would stop at once
        )


def parse_point(config: dict[str, Any]) -> PointConfig:
    """Every section of a resolved point config parsed into its class (no data is generated)."""
    task = config["task"]
    if task not in TASKS:
        raise SynthlabError(f"task '{task}' has no generator (have {', '.join(TASKS)})")
    spec = TASKS[task]
    fields = dict(config["data"])
    seed = fields.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SynthlabError(f"data.seed must be an integer >= 0, got {seed!r}")
    params = serialize.from_dict(spec.params_cls, fields, where="data.")
    if "vocab_size" in config["model"]:
        raise SynthlabError("model.vocab_size comes from the data; do not set it in an experiment")
    model = serialize.from_dict(
        ModelConfig, {**config["model"], "vocab_size": spec.shape(params).vocab_size}, where="model."
    )
    train = serialize.from_dict(TrainConfig, {**config["train"], "task": task}, where="train.")
    stages = tuple(
        config.get("stages", ("train",))
    )  # names checked by the point runner (synthlab.sweeps.lab_runner.STAGES)
    point = PointConfig(
        task,
        params,
        seed,
        dict(config["data"]),
        model,
        train,
        serialize.from_dict(EvalOptions, config.get("eval", {}), where="eval."),
        serialize.from_dict(GateOptions, config.get("gate", {}), where="gate."),
        stages,
    )
    check_run(model, train)
    if "gate" in stages:
        if train.loss != "ouro":
            raise SynthlabError('the gate stage (Ouro stage II) needs a stage I model: train.loss = "ouro"')
        point.stage2_train(train, "stage1")  # validates the gate options as a TrainConfig
    return point


def check_run(model: ModelConfig, train: TrainConfig) -> None:
    """Checks that involve both the model and the training options."""
    if train.loss.startswith("ouro") and not model.exit_gate:
        raise SynthlabError(f"train.loss = {train.loss} needs the exit gate (--exit-gate)")
    if train.loss == "ouro_stage2" and train.init_from is None:
        raise SynthlabError(
            "train.loss = ouro_stage2 trains the gate of a trained model: set train.init_from (--init-from RUN_DIR)"
        )


VARIANTS = ("controller", "static", "nogate", "truncated", "base")
LOOPED_VARIANTS = ("controller", "static", "nogate")


@dataclass
class OuroborosConfig:
    """How to cut the base and what to train; None split fields take the proportional default."""

    variant: str = option("controller", "System variant: controller, static, nogate, truncated or base.")
    prelude_layers: int | None = option(
        None,
        "Prelude layers (default: round(8 L / 36) of the base's L layers, at least 1, fewer "
        "where the base is too shallow).",
    )
    recurrent_layer: int | None = option(
        None, "Index of the recurrent layer (default: L // 2, or the middle of what lies between prelude and coda)."
    )
    coda_layers: int | None = option(
        None, "Coda layers (default: round(8 L / 36), at least 1, fewer where the base is too shallow)."
    )
    rank: int = option(32, "LoRA rank r of the fixed SVD bases.")
    alpha: float = option(16.0, "LoRA alpha; the update is scaled by alpha / r.")
    controller_hidden: int = option(320, "Width of the controller MLP.")
    max_steps: int = option(16, "Largest recurrent depth (per-step norms and step embeddings).")
    gate_bias: float = option(-2.0, "Initial bias of the update gate (sigmoid(-2) = 0.12: small first updates).")

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise SynthlabError(f"variant must be one of {', '.join(VARIANTS)}, got '{self.variant}'")
        for name in ("rank", "controller_hidden", "max_steps"):
            if getattr(self, name) < 1:
                raise SynthlabError(f"{name} must be >= 1, got {getattr(self, name)}")
        _finite("", alpha=self.alpha, gate_bias=self.gate_bias)
        if self.alpha <= 0:
            raise SynthlabError(f"alpha must be > 0, got {self.alpha}")


@dataclass
class OuroborosTrainConfig:
    """One training run of one looped variant (reference values in the comments)."""

    steps: int = option(1000, "Optimiser steps per variant.")
    seq_len: int = option(2048, "Packed sequence length.")
    batch_size: int = option(4, "Sequences per micro-batch.")
    grad_accum: int = option(8, "Micro-batches per step (8 x 4: an effective batch of 32 sequences, as the reference).")
    lr: float = option(3e-4, "Peak learning rate.")
    min_lr: float = option(1e-6, "Learning rate at the end of the cosine.")
    weight_decay: float = option(0.01, "AdamW weight decay on the trainable matrices.")
    betas: tuple[float, float] = option((0.9, 0.95), "AdamW betas.")
    warmup_steps: int | None = option(
        None, "Linear warmup steps (default: min(2000, steps // 10); the reference uses 2000)."
    )
    grad_clip: float = option(1.0, "Gradient norm clip (0: none).")
    depths: tuple[int, ...] = option((4, 8, 16), "Recurrent depths, one drawn uniformly per step (one value: fixed).")
    heldout_fraction: float = option(0.05, "Share of the corpus's sequences held out for evaluation.")
    checkpoint_every: int = option(
        0,
        "Save the whole training state every K steps (0: at the end only); rerunning "
        "the same command resumes a variant from its last checkpoint.",
    )
    seed: int = option(0, "Seed of the data order, the depth draws and the controller's init.")
    per_document: bool = option(
        False,
        "One document per sequence (padded, BOS first: how a synthlab base was trained) instead of a packed stream.",
    )
    tf32: bool = option(True, "On CUDA, TF32 tensor cores for the float32 gate and controller matmuls.")

    def __post_init__(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise SynthlabError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise SynthlabError(f"seq_len must be >= 2, got {self.seq_len}")
        if not self.depths or min(self.depths) < 1:
            raise SynthlabError(f"depths must be positive integers, got {self.depths}")
        if not 0 < self.heldout_fraction < 1:
            raise SynthlabError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        _finite("", lr=self.lr, min_lr=self.min_lr, weight_decay=self.weight_decay, grad_clip=self.grad_clip)
        _finite("", **{f"betas[{i}]": b for i, b in enumerate(self.betas)})
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise SynthlabError(f"betas must be two numbers in [0, 1), got {self.betas}")
        for name in ("weight_decay", "grad_clip", "checkpoint_every", "seed", "warmup_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise SynthlabError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise SynthlabError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise SynthlabError(f"min_lr must be in [0, lr], got {self.min_lr}")

    @property
    def warmup(self) -> int:
        return min(2000, self.steps // 10) if self.warmup_steps is None else self.warmup_steps
