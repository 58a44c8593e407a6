"""Typed configs, one dataclass per concern, shared by the CLI, run folders and sweeps.

- `ModelConfig` (synthlab.models): the architecture.
- `TrainConfig`: one training run. At its top what the run learns from and its objective (task,
  data, seed, loss, entropy_beta); everything else in a section per concern, as lingua's
  `TrainArgs` and torchtitan's job config nest theirs, each section owned by the package that acts
  on it: `batch` (`synthlab.data.options.BatchConfig`: what a step reads), `optim` and `schedule`
  (`synthlab.training.optim`: AdamW; the run's length, its learning-rate course and the rule that
  may end it), `checkpoint` and `system` (here: checkpoints and the start, device and kernels:
  their owners, the checkpointer and run_folders, load torch, which the CLI must not), `logging`
  (`synthlab.training.loggers`: metrics, the probe, TensorBoard / W&B). A run.toml writes them as
  `[train.optim]`; the CLI's flags stay flat (`--lr`), grouped in --help by section.
  `nested_train` / `flat_train` convert between the sections and the flat `[train]` table runs and
  presets wrote before them: old run folders load, presets keep their point ids (hashed flat).
- `EvalOptions`: how a trained model is scored (the `[eval]` section of an experiment).
- `GateOptions`: Ouro stage II after a stage I model (the `[gate]` section).
- `OuroborosConfig`, `OuroborosTrainConfig`: the OUROBOROS system and its training
  (synthlab.ouroboros), here so that the CLI builds their flags without importing torch.
- `PointConfig`: one sweep point, every section parsed into its class once (`parse_point`); the
  point runner passes this object on, nothing downstream reads the raw dict again.

Each check lives in the class that owns the field (`__post_init__`; checks across sections on
TrainConfig); errors are one line naming `section.field`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from synthlab import serialize
from synthlab.data.options import BatchConfig
from synthlab.errors import SynthlabError
from synthlab.models import KV_STRATEGIES, ModelConfig
from synthlab.serialize import check_at_least, check_finite, option, section
from synthlab.training.loggers import LoggingConfig
from synthlab.training.optim import OptimConfig, ScheduleConfig
from synthlab_generators import TASKS

LOSSES = ("last", "mean", "ouro", "ouro_stage2")


@dataclass
class CheckpointConfig:
    """`[train.checkpoint]`: when checkpoints are written, how many are kept, and the run whose
    weights this one starts from."""

    checkpoint_every: int = option(1000, "Write a checkpoint every K steps (unless checkpoints is set).")
    checkpoints: int = option(
        0,
        "Write K checkpoints evenly spaced over the run, one every ceil(steps / K) steps, "
        "whatever its length (0: every checkpoint_every steps).",
    )
    keep_checkpoints: int = option(
        2, "Checkpoints kept, the newest K (a damaged newest one falls back to an older one)."
    )
    init_from: str | None = option(
        None, "Start from the weights of this run directory's checkpoint (e.g. stage II after stage I)."
    )

    def __post_init__(self) -> None:
        check_at_least(
            "train.checkpoint.", 1, checkpoint_every=self.checkpoint_every, keep_checkpoints=self.keep_checkpoints
        )
        if self.checkpoints < 0:
            raise SynthlabError(
                "train.checkpoint.checkpoints must be >= 0 (0: every train.checkpoint.checkpoint_every steps), "
                f"got {self.checkpoints}"
            )


@dataclass
class SystemConfig:
    """`[train.system]`: where and how the computation runs; none of it changes what is computed
    beyond floating-point rounding (cpu_bf16 and tf32: the rounding itself)."""

    device: str = option("auto", "auto (CUDA with bf16 if present, else CPU fp32), cpu or cuda.")
    compile: bool = option(False, "torch.compile the model (with step_sampling: each block, since the depth varies).")
    activation_checkpointing: bool = option(
        False,
        "Activation checkpointing per recurrent step: keep each step's input "
        "state only and recompute the step (core and readout) in the backward "
        "pass; the same loss and gradients, far less activation memory for "
        "about one more forward pass of compute.",
    )
    tf32: bool = option(
        True, "On CUDA, TF32 tensor cores for the float32 matmuls autocast leaves (false: full float32)."
    )
    cpu_bf16: bool = option(
        False,
        "On the CPU, bf16 autocast in training (for CPUs with bf16 units; without them 3-6x slower at d 16-64: "
        "benchmarks/bench_shapes.py --bf16 measures it); off: float32, the committed presets' numerics.",
    )

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise SynthlabError(f"train.system.device must be auto, cpu or cuda, not {self.device!r}")


@dataclass
class TrainConfig:
    """One training run: what it learns from and its objective at the top, each concern a section."""

    task: str = option("", "Task of the data: bios, mano, multihop or reach (checked against DIR/meta.json).")
    data: str = option("", "Dataset folder written by `synthlab gen`.")
    seed: int = option(0, "Seed of the initial weights and the data order.")
    loss: str = option(
        "last",
        "Objective: last (last step), mean (of steps), ouro (stage I, needs the exit gate) "
        "or ouro_stage2 (gate only, LM frozen, needs init_from).",
    )
    entropy_beta: float = option(0.05, "Ouro stage I entropy weight.")
    batch: BatchConfig = section(BatchConfig, "train.batch: the optimizer batch and its rows")
    optim: OptimConfig = section(OptimConfig, "train.optim: AdamW")
    schedule: ScheduleConfig = section(ScheduleConfig, "train.schedule: the run's length and learning rate")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "train.checkpoint: checkpoints and the start")
    logging: LoggingConfig = section(LoggingConfig, "train.logging: metrics, the probe, loggers")
    system: SystemConfig = section(SystemConfig, "train.system: device and kernels")

    def __post_init__(self) -> None:
        if self.task not in ("", *TASKS):
            raise SynthlabError(f"train.task must be one of {', '.join(TASKS)}, not {self.task!r}")
        check_finite("train.", entropy_beta=self.entropy_beta)
        if self.seed < 0:  # numpy's generators take no negative seed
            raise SynthlabError(f"train.seed (--seed) must be >= 0, got {self.seed}")
        if self.entropy_beta < 0:
            raise SynthlabError(f"train.entropy_beta must be >= 0, got {self.entropy_beta}")
        if self.loss not in LOSSES:
            raise SynthlabError(f"train.loss must be one of {', '.join(LOSSES)}, not {self.loss!r}")
        if self.schedule.stop_when and not self.logging.eval_every:
            raise SynthlabError(
                "train.schedule.stop_when reads the probe of train.logging.eval_every: set it (--eval-every K)"
            )

    @classmethod
    def flat(cls, **settings: Any) -> TrainConfig:
        """A TrainConfig from settings named as their flags are (`steps=10, lr=3e-4`)."""
        return serialize.from_dict(cls, nested_train(settings), where="train.")

    def replaced(self, **settings: Any) -> TrainConfig:
        """A copy with `settings` changed, named as their flags are (`lr=3e-4`; None: unset)."""
        data = serialize.to_dict(self)
        for name, value in nested_train(settings).items():
            data[name] = {**data[name], **value} if isinstance(value, dict) else value
        return serialize.from_dict(TrainConfig, data, where="train.")


# The sections of TrainConfig, and the flat key of each of their fields: its `[train]` key before
# sections, still its CLI flag (`--lr`), the field's name except where its section took the name.
_SECTIONS = {
    f.name: typing.get_type_hints(TrainConfig)[f.name]
    for f in dataclasses.fields(TrainConfig)
    if "section" in f.metadata
}
_FLAT_OF = {(name, f.name): f.name for name, cls in _SECTIONS.items() for f in dataclasses.fields(cls)} | {
    ("schedule", "kind"): "schedule"
}
_FLAT_KEYS = {flat: path for path, flat in _FLAT_OF.items()}


def flat_types() -> dict[str, Any]:
    """Each flat key of a `[train]` table (`lr`) with its field's type."""
    top = {k: v for k, v in typing.get_type_hints(TrainConfig).items() if k not in _SECTIONS}
    return top | {flat: typing.get_type_hints(_SECTIONS[s])[f] for flat, (s, f) in _FLAT_KEYS.items()}


def nested_train(train: dict[str, Any]) -> dict[str, Any]:
    """A `[train]` table in its sections (`{"optim": {"lr": ...}}`), from one in any of the forms
    written so far: flat (`lr`: run folders and presets from before sections, and `--set train.lr`),
    dotted (`optim.lr`: a grid axis or `--set train.optim.lr`) or nested already; the inverse of
    `flat_train`. Keys it does not know are passed on for the config's check to name."""
    out: dict[str, Any] = {}
    for key, value in flat_train(train).items():
        name, dot, field_name = key.partition(".")  # "optim.lrr": a section's unknown field, named by it
        if key in _FLAT_KEYS:
            name, field_name = _FLAT_KEYS[key]
        elif not (dot and name in _SECTIONS):
            out[key] = value
            continue
        out.setdefault(name, {})[field_name] = value
    return out


def flat_train(train: dict[str, Any]) -> dict[str, Any]:
    """A `[train]` table in the flat form (`lr`, `schedule`, ...) whatever form it was written in:
    the form a sweep point's id hashes, so that sections renamed no point."""
    out: dict[str, Any] = {}
    for key, value in train.items():
        name, dot, rest = key.partition(".")
        if name in _SECTIONS and (dot or isinstance(value, dict)):
            for field_name, inner in ({rest: value} if dot else value).items():
                out[_FLAT_OF.get((name, field_name), f"{name}.{field_name}")] = inner
        else:
            out[key] = value
    return out


@dataclass
class EvalOptions:
    """The `[eval]` section of an experiment: how the trained model is scored."""

    steps: int | None = option(None, "Recurrent steps at evaluation (default: the trained loops).")
    exit: str | None = option(None, "Exit rule per token: static:T, q:0.8, diff:0.01 or kl:0.001.")
    kv: str | None = option(None, "Decode-time KV-cache strategy: full, first, last or mean.")
    agreement: bool = option(False, "Report the step x step answer agreement matrix.")
    batch_size: int = option(
        256, "Examples per forward pass: a chunk that bounds memory, not an optimizer batch (nothing is trained)."
    )
    checkpoint: int | None = option(
        None,
        "heldout stage: score the checkpoint of this optimizer step instead of the "
        "final model (the run must keep it: train.checkpoint.keep_checkpoints).",
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
        return stage1.replaced(
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
    train = serialize.from_dict(TrainConfig, nested_train({**config["train"], "task": task}), where="train.")
    stages = tuple(config.get("stages", ("train",)))  # names checked by the point runner (synthlab.sweeps.stages)
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
    if train.loss == "ouro_stage2" and train.checkpoint.init_from is None:
        raise SynthlabError(
            "train.loss = ouro_stage2 trains the gate of a trained model: set train.checkpoint.init_from "
            "(--init-from RUN_DIR)"
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
        check_finite("", alpha=self.alpha, gate_bias=self.gate_bias)
        if self.alpha <= 0:
            raise SynthlabError(f"alpha must be > 0, got {self.alpha}")


@dataclass
class OuroborosTrainConfig:
    """One training run of one looped variant (reference values in the comments)."""

    steps: int = option(1000, "Optimiser steps per variant.")
    seq_len: int = option(2048, "Packed sequence length.")
    micro_batch_size: int = option(
        4, "Sequences per micro-batch (one forward and backward pass; the optimizer batch is grad_accum of them)."
    )
    grad_accum: int = option(8, "Micro-batches per step (8 x 4: an optimizer batch of 32 sequences, as the reference).")
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
        for name in ("steps", "seq_len", "micro_batch_size", "grad_accum"):
            if getattr(self, name) < 1:
                raise SynthlabError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise SynthlabError(f"seq_len must be >= 2, got {self.seq_len}")
        if not self.depths or min(self.depths) < 1:
            raise SynthlabError(f"depths must be positive integers, got {self.depths}")
        if not 0 < self.heldout_fraction < 1:
            raise SynthlabError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        check_finite("", lr=self.lr, min_lr=self.min_lr, weight_decay=self.weight_decay, grad_clip=self.grad_clip)
        check_finite("", **{f"betas[{i}]": b for i, b in enumerate(self.betas)})
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


# OuroborosTrainConfig's fields renamed since run.json files and presets were written: new -> old.
_OUROBOROS_OLD_NAMES = {"micro_batch_size": "batch_size"}


def ouroboros_train_keys(values: dict[str, Any], *, old: bool = False) -> dict[str, Any]:
    """OuroborosTrainConfig's keys (among others, passed on) under their current names, from a
    run.json or preset of either age; `old`: under the names before the renaming, the form a
    point's id and a stage's folder hash, so that the renaming moved no point."""
    renames = {new: was for new, was in _OUROBOROS_OLD_NAMES.items()}
    if not old:
        renames = {was: new for new, was in renames.items()}
    return {renames.get(key, key): value for key, value in values.items()}
