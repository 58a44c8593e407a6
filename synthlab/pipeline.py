"""The real point runner of a sweep: data (cached) -> train (resumable) -> [gate] -> evaluate -> capacity.

`run_point(config, run_dir, cache_dir=...)` takes one resolved grid point (synthlab.experiments)
and returns its metrics as a flat dict, one value per results.csv column:

- descriptors: `model` (a label such as "2x6" or "1+2x4+1 concat"), `loops`, `params` (unique
  parameters), and the task's headline data parameter (`L`, `n_people`, `train_fraction`,
  `diameter`) so plots never depend on which options happened to be grid axes;
- training: `train_steps`, `tokens` (tokens seen), `train_loss` (mean of the last logged 10% of
  steps), `loss` (the same; the scaling experiment's D is tokens and its loss is this one: in
  the first epoch a training batch is unseen data, so it estimates the held-out loss), `train_s`;
- eval stage: `accuracy` (exact match at the evaluated depth), `answer_loss`, `acc_step_<t>`
  per recurrent step, `agree_<i>_<j>` (with eval.agreement), `strategy`, `threshold`,
  `mean_exit_step` (with eval.exit: `accuracy` is then the exit accuracy), `kv`, `kv_bytes`
  (with eval.kv: `accuracy` is then real greedy generation's);
- generate stage (bioS): `kv`, `kv_bytes`, `accuracy` of real greedy generation of each attribute
  value from the biography before it, with eval.kv's decode-time cache strategy;
- gate stage (Ouro stage II): `gate_steps`, `gate_loss`, `gate_s`; later stages use its model;
- capacity stage: `p1`, `p2`, `bits`, `max_bits`, `bits_per_param`, `fraction_of_max`,
  `params_capacity` (P as the estimate counts it: used embedding rows only).

The model is trained in `run_dir/model` (synthlab.train's run directory): an existing checkpoint
is resumed, a finished run is reused by every point that evaluates it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

from synthlab import config as configlib
from synthlab.errors import SynthlabError
from synthlab.experiments import content_hash, data_part
from synthlab.sweep import cached_dir

# The data parameter each task's plots are drawn against (generator field -> results column).
DATA_COLUMNS = {"L": "L", "n_people": "n_people", "train_fraction": "train_fraction", "max_diameter": "diameter"}


@dataclasses.dataclass
class EvalOptions:
    """The `[eval]` section of an experiment: how the trained model is scored."""

    steps: int | None = None  # recurrent steps at evaluation (None: the trained loops)
    exit: str | None = None  # exit rule: static:T | q:0.8 | diff:0.01 | kl:0.001
    kv: str | None = None  # decode-time KV-cache strategy: full | first | last | mean
    agreement: bool = False  # report the step x step answer agreement matrix
    batch_size: int = 256

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise SynthlabError(f"eval.steps must be >= 1, got {self.steps}")
        if self.kv is not None and self.kv not in ("full", "first", "last", "mean"):
            raise SynthlabError(f"eval.kv must be full, first, last or mean, not {self.kv!r}")
        if self.exit is not None:
            from synthlab.models.exits import parse_exit_rule

            parse_exit_rule(self.exit)


@dataclasses.dataclass
class GateOptions:
    """The `[gate]` section (stage "gate"): Ouro stage II after the stage I model is trained.

    The exit gate alone is trained on the frozen stage I model (train.loss = ouro_stage2, starting
    from its weights), and the point is evaluated with that model: static, diff and kl exits are
    unchanged by it (the LM is frozen), the learned q: exit gets the stage II gate.
    """

    steps: int = 500
    lr: float = 1e-3
    warmup_steps: int = 50

    def __post_init__(self) -> None:
        if self.steps < 1 or not self.lr > 0 or self.warmup_steps < 0:
            raise SynthlabError("gate.steps must be >= 1, gate.lr > 0 and gate.warmup_steps >= 0")


def _data_params(config: dict[str, Any]):
    from synthlab_generators import TASKS

    task = config["task"]
    if task not in TASKS:
        raise SynthlabError(f"task '{task}' has no generator (have {', '.join(TASKS)})")
    fields = dict(config["data"])
    seed = fields.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SynthlabError(f"data.seed must be an integer >= 0, got {seed!r}")
    return TASKS[task], configlib.from_dict(TASKS[task].params_cls, fields, where="data."), seed


def _run_config(config: dict[str, Any], data_dir: Path | None, vocab_size: int):
    from synthlab.models import ModelConfig
    from synthlab.train import RunConfig, TrainConfig

    model = configlib.from_dict(ModelConfig, {**config["model"], "vocab_size": vocab_size}, where="model.")
    train = configlib.from_dict(TrainConfig, {**config["train"], "task": config["task"],
                                              "data": str(data_dir or "")}, where="train.")
    return RunConfig(model, train)


def check_config(config: dict[str, Any]) -> None:
    """Validate every section against the real config classes (no data is generated)."""
    _data_params(config)
    if "vocab_size" in config["model"]:
        raise SynthlabError("model.vocab_size comes from the data; do not set it in an experiment")
    _run_config(config, None, vocab_size=64)
    configlib.from_dict(EvalOptions, config["eval"], where="eval.")
    configlib.from_dict(GateOptions, config.get("gate", {}), where="gate.")
    if "gate" in config["stages"] and config["train"].get("loss") != "ouro":
        raise SynthlabError("the gate stage (Ouro stage II) needs a stage I model: train.loss = \"ouro\"")


def dataset(config: dict[str, Any], cache_dir: Path) -> Path:
    """The point's dataset, generated once per (task, params, seed) into the cache."""
    from synthlab_generators import write_dataset

    spec, params, seed = _data_params(config)
    return cached_dir(cache_dir, data_part(config), lambda tmp: write_dataset(spec, params, seed, tmp),
                      prefix=f"{config['task']}-")


def train_model(config: dict[str, Any], data_dir: Path, model_dir: Path) -> dict[str, Any]:
    """Train (or resume, or reuse) the point's model in model_dir; returns the training metrics."""
    from synthlab.data import load_dataset

    def new_run():
        vocab = len(load_dataset(data_dir, config["task"]).tokenizer)
        return _run_config(config, data_dir, vocab)

    _train_or_resume(model_dir, new_run)
    return _train_metrics(model_dir)


def train_gate(config: dict[str, Any], model_dir: Path, run_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Ouro stage II on the trained stage I model in model_dir; returns (its run dir, gate_* metrics).

    One stage II run per gate config, beside the stage I model (points that share both share it).
    """
    from synthlab.train import load_run

    options = configlib.from_dict(GateOptions, config.get("gate", {}), where="gate.")
    gate_dir = run_dir / f"gate-{content_hash(dataclasses.asdict(options))}"

    def new_run():
        stage1, _ = load_run(model_dir)
        stage1.train = dataclasses.replace(
            stage1.train, loss="ouro_stage2", init_from=str(model_dir.resolve()), steps=options.steps,
            exposures=None, lr=options.lr, warmup_steps=options.warmup_steps)
        return stage1

    _train_or_resume(gate_dir, new_run)
    stage2 = _train_metrics(gate_dir)
    return gate_dir, {"gate_steps": stage2["train_steps"], "gate_loss": stage2["train_loss"],
                      "gate_s": stage2["train_s"]}


def _train_or_resume(run_dir: Path, new_run) -> None:
    """Reuse a finished run, resume one from its checkpoint, or start `new_run()` (a RunConfig) afresh."""
    from synthlab.train import train

    if (run_dir / "summary.json").is_file():
        return
    if (run_dir / "checkpoint.pt").is_file():
        result = train(run_dir, progress=False)  # resume from the last checkpoint
    else:
        shutil.rmtree(run_dir, ignore_errors=True)  # killed before its first checkpoint
        result = train(run_dir, new_run(), progress=False)
    if result.interrupted:
        raise KeyboardInterrupt(f"training in {run_dir} interrupted by a signal (checkpoint written)")


def _logged(model_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A run's metrics.jsonl records, and their last 10% (what `loss` and the per-step losses average)."""
    lines = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines() if line]
    return lines, lines[-max(1, len(lines) // 10):]


def _train_metrics(model_dir: Path) -> dict[str, Any]:
    lines, tail = _logged(model_dir)
    loss = sum(r["loss"] for r in tail) / len(tail)
    # training time, measured: each log line's tokens since the previous line over its tokens/s
    seconds, before = 0.0, 0
    for r in lines:
        seconds += (r["tokens"] - before) / max(r["tokens_per_s"], 1e-9)
        before = r["tokens"]
    return {"train_steps": lines[-1]["step"], "tokens": lines[-1]["tokens"], "train_loss": loss, "loss": loss,
            "train_s": seconds}


def step_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per (run, recurrent step) of a finished sweep, for the step-wise law (`synthlab fit steps`).

    Each run's row is repeated for t = 1..loops with `step` = t and `loss` = the training loss read
    out after step t (the mean over the last logged 10% of optimizer steps, like `loss`); the
    per-step accuracy columns are dropped (they belong to the run, not to the step).
    """
    from synthlab.sweep import read_rows

    rows = read_rows(Path(sweep_dir) / "results.csv")
    if not rows:
        raise SynthlabError(f"no results.csv rows in {sweep_dir} (run `synthlab sweep` first)")
    out = []
    for row in rows:  # every logged record has every step's loss (train.py reads all steps out on log steps)
        _, tail = _logged(_model_dir(Path(sweep_dir), row["run_dir"]))
        per_step = [sum(r["loss_per_step"][t] for r in tail) / len(tail) for t in range(len(tail[0]["loss_per_step"]))]
        base = {k: v for k, v in row.items() if not k.startswith(("acc_step_", "agree_"))}
        out.extend({**base, "step": t, "loss": loss} for t, loss in enumerate(per_step, 1))
    return out


def _model_dir(sweep_dir: Path, run_dir: str) -> Path:
    """A point's trained model: under run_dir as recorded, else under this sweep's runs/ (moved sweeps)."""
    for candidate in (Path(run_dir), sweep_dir / "runs" / Path(run_dir).name):
        if (candidate / "model" / "metrics.jsonl").is_file():
            return candidate / "model"
    raise SynthlabError(f"no model/metrics.jsonl for run {run_dir} (looked beside {sweep_dir} too)")


def describe(config: dict[str, Any]) -> dict[str, Any]:
    """Columns that say what was trained, whatever the grid axes were."""
    from synthlab.models import ModelConfig

    m = configlib.from_dict(ModelConfig, {**config["model"], "vocab_size": 1})  # defaults filled in
    if m.topology == "sandwich":
        label = f"{m.n_prelude}+{m.n_core}x{m.loops}+{m.n_coda} {m.injection}"
        if m.state_init != "input":
            label += f" init={m.state_init}"
    else:
        label = f"{m.n_layers}x{m.loops}"
    out = {"model": label, "loops": m.loops, "d_model": m.d_model}
    out.update({column: config["data"][field] for field, column in DATA_COLUMNS.items() if field in config["data"]})
    return out


def eval_metrics(result: dict[str, Any], options: EvalOptions) -> dict[str, Any]:
    """Flatten an evaluate_run result into results.csv columns."""
    out = {"accuracy": result["accuracy"], "accuracy_at_trained_depth": result["accuracy_at_trained_depth"],
           "answer_loss": result["answer_loss_per_step"][-1], "eval_steps": result["eval_steps"],
           "n_test": result.get("n_examples")}
    out.update({f"acc_step_{t}": a for t, a in enumerate(result["accuracy_per_step"], 1)})
    if options.agreement:
        for i, row in enumerate(result["agreement"], 1):
            out.update({f"agree_{i}_{j}": a for j, a in enumerate(row, 1)})
    if options.exit is not None:
        kind, _, value = options.exit.partition(":")
        out.update(strategy=kind, threshold=float(value), mean_exit_step=result["mean_exit_step"],
                   accuracy=result["exit_accuracy"], accuracy_all_steps=result["accuracy"])
    if options.kv is not None:
        out.update(kv=options.kv, kv_bytes=result["kv_cache_bytes_per_sequence"], accuracy=result["kv_accuracy"],
                   accuracy_teacher_forced=result["accuracy"])
    return out


def run_point(config: dict[str, Any], run_dir: Path, *, cache_dir: Path) -> dict[str, Any]:
    """Generate, train, evaluate and (for bioS) measure capacity; returns the row's metrics."""
    from synthlab.evaluate import evaluate_run

    data_dir = dataset(config, cache_dir)
    model_dir = Path(run_dir) / "model"
    metrics = {**describe(config), **train_model(config, data_dir, model_dir)}
    metrics.update(_size_metrics(json.loads((model_dir / "config.json").read_text())))
    stages = config["stages"]
    if "gate" in stages:  # evaluate the stage II model from here on
        model_dir, gate_metrics = train_gate(config, model_dir, Path(run_dir))
        metrics.update(gate_metrics)
    if "eval" in stages:
        options = configlib.from_dict(EvalOptions, config["eval"], where="eval.")
        result = evaluate_run(model_dir, steps=options.steps, exit_rule=options.exit, kv=options.kv,
                              batch_size=options.batch_size)
        metrics.update(eval_metrics(result, options))
    if "generate" in stages:
        options = configlib.from_dict(EvalOptions, config["eval"], where="eval.")
        metrics.update(biography_generation(model_dir, options))
    if "capacity" in stages:
        metrics.update(capacity_metrics(model_dir))
    return metrics


def _size_metrics(run_config: dict[str, Any]) -> dict[str, Any]:
    """Unique and non-embedding parameters, and the training FLOPs (3 x forward, padding included)."""
    from synthlab.models import ModelConfig, build_model, count_params, flops_per_token

    model_config = configlib.from_dict(ModelConfig, run_config["model"])
    model = build_model(model_config)
    derived = run_config["derived"]
    positions = derived["total_steps"] * run_config["train"]["batch_size"] * derived["seq_len"]
    # with the `last` objective training reads out only the last step (synthlab.train.step_losses)
    per_token = flops_per_token(model_config, derived["seq_len"], all_steps=run_config["train"]["loss"] != "last")
    return {"params": count_params(model), "params_nonemb": count_params(model, exclude_embedding=True),
            "train_flops": 3 * per_token * positions}


def capacity_metrics(model_dir: Path) -> dict[str, Any]:
    from synthlab.capacity import estimate_capacity

    report = estimate_capacity(model_dir)
    keys = ("p1", "p2", "bits", "max_bits", "bits_per_param", "fraction_of_max", "n_people")
    out = {k: report[k] for k in keys if k in report}
    out["params_capacity"] = report["params"]  # P as the estimate counts it (used embedding rows only)
    return out


def biography_generation(model_dir: Path, options: EvalOptions, people: int = 100) -> dict[str, Any]:
    """bioS recall by real greedy generation with a KV-cache strategy (C7).

    A trained bioS model has memorised biographies, not QA, so the generation test is the text it
    was trained on: the biography up to an attribute value is the prompt, the value's tokens
    (2-5 of them: "March 26 , 2094") the answer. Prompts of equal length and answers of equal
    length are batched together, so no padding enters the caches.
    """
    import numpy as np
    import torch

    from synthlab.data import load_dataset
    from synthlab.train import load_trained_model

    model, run, _ = load_trained_model(model_dir, "cpu")
    data = load_dataset(run.train.data, "bios")
    groups: dict[tuple[int, int], list[tuple[list[int], list[int]]]] = {}
    for record in data.records("train")[:people]:
        ids = data.encode_text(record["text"])  # <bos> first: token j of the text is ids[j + 1]
        for attribute, (start, end) in record["spans"].items():
            if attribute != "name":
                prompt, answer = ids[: start + 1], ids[start + 1 : end + 1]
                groups.setdefault((len(prompt), len(answer)), []).append((prompt, answer))
    correct = total = 0
    cache_bytes = 0.0
    with torch.no_grad():
        for (n_prompt, n_answer), items in sorted(groups.items()):
            idx = torch.tensor([p for p, _ in items])
            out = model.generate(idx, max_new_tokens=n_answer, kv_strategy=options.kv or "full", steps=options.steps)
            generated = out.tokens[:, n_prompt:].numpy()
            correct += int((generated == np.array([a for _, a in items])).all(1).sum())
            total += len(items)
            cache_bytes = max(cache_bytes, out.cache_bytes / len(items))
    return {"kv": options.kv or "full", "accuracy": correct / total, "kv_bytes": cache_bytes, "n_answers": total}


# --- cost estimates for `synthlab sweep --dry-run` -------------------------------------------------

# Training FLOP/s assumed until a finished point of the sweep has measured one. Measured on an idle
# 2-core machine with one torch thread per run (two runs side by side, train_flops / train_s):
# 1.0e10 for the d = 32 bioS capacity model (its 2,772-token softmax is memory-bound), 0.6-1.3e10
# for the d = 32 scaling models, 1.5-3e10 for d = 64 and 2.2e10 for the d = 128 multihop model.
DEFAULT_FLOPS_PER_S = 2e10
# Tokens per bioS biography with <bos> and <eos>: 57.2 on average (500 generated people, seed 0).
BIOS_TOKENS = 57.2


def _shape_guess(task: str, data: dict[str, Any]) -> tuple[int, int | None]:
    """(vocabulary size, unpacked row length) before the data exists, from the generators' formats."""
    if task == "bios":  # 2,772 tokens with the shipped pools; packed rows
        return 2772, None
    if task == "mano":  # <bos> <len_l> expr (2L + 1) <ans> answer, inputs one shorter
        return data.get("mod", 23) + data.get("L", 24) + 12, 2 * data.get("L", 24) + 4
    if task == "multihop":  # <bos> who is the r of the r ... of e ? <ans> answer
        hops = data.get("hops", 3)
        return data.get("layers", 5) * data.get("per_layer", 100) + data.get("relations", 20) + 16, 3 * hops + 6
    diameter = data.get("max_diameter", 8)  # reach: "u -> v ," per context edge, then the question
    edges = data.get("context_edges", 0) or 2 * diameter
    return data.get("nodes", 64) + 12, 4 * edges + 8


def _positions(config: dict[str, Any], cache_dir: Path) -> tuple[int, int]:
    """(total optimizer steps, row length): exact from the cached dataset, else from the params."""
    train, data = config["train"], config["data"]
    cached = Path(cache_dir) / f"{config['task']}-{content_hash(data_part(config))}"
    if cached.is_dir():
        from synthlab.data import load_dataset
        from synthlab.train import prepare_run

        dataset = load_dataset(cached, config["task"])
        derived, _ = prepare_run(_run_config(config, cached, len(dataset.tokenizer)), dataset)
        return derived["total_steps"], derived["seq_len"]
    _, unpacked = _shape_guess(config["task"], data)
    seq = unpacked or train.get("seq_len") or config["model"].get("max_seq_len", 256)
    if train.get("steps"):
        return train["steps"], seq
    per_person = int(data.get("variant", "single")[5:] or 1) if data.get("variant", "").startswith("multi") else 1
    rows = data.get("n_people", 1000) * per_person * BIOS_TOKENS / seq
    return math.ceil(train["exposures"] * rows / train.get("batch_size", 64)), seq


def estimate_seconds(config: dict[str, Any], *, cache_dir: Path, finished: list[dict[str, str]]) -> float:
    """Training time: FLOPs of the point over the FLOP/s measured by finished runs of the sweep."""
    from synthlab.models import ModelConfig, flops_per_token

    measured = [(float(r["train_flops"]), float(r["train_s"])) for r in finished if r.get("train_flops")]
    rate = sum(f for f, _ in measured) / sum(s for _, s in measured) if measured else DEFAULT_FLOPS_PER_S
    steps, seq = _positions(config, cache_dir)
    vocab, _ = _shape_guess(config["task"], config["data"])
    model = configlib.from_dict(ModelConfig, {**config["model"], "vocab_size": vocab})
    positions = steps * config["train"].get("batch_size", 64) * seq
    all_steps = config["train"].get("loss", "last") != "last"
    return 3 * flops_per_token(model, seq, all_steps=all_steps) * positions / rate
