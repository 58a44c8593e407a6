"""Learning speed: synthlab's model and training step against a minimal reference GPT, same batches.

What it measures
    Both models train on exactly the same batches, in the same order: a dataset of `--task`
    (mano, multihop or bios) is generated with the library (`synthlab_generators.write_dataset`)
    into a temporary folder, read with `synthlab.data.datasets.load_dataset` and cut into batches by
    `synthlab.data.datasets.Batcher` (packed with document ids for bioS, one example per row otherwise, as
    `synthlab train` does); each batch is handed to both models. The two trainings are interleaved
    (one step of synthlab's, one step of the reference's) so machine noise hits both alike.

    - synthlab: `synthlab.models.build_model(ModelConfig(...))`, trained with the lab's own step
      (`build_optimizer`, `lr_schedule`, `model_forward`, `step_losses`, `to_device` and
      `synthlab.training.engine.step`, as `synthlab.training.trainer`). Defaults are `synthlab train`'s defaults; `--synthlab
      k=v,...` overrides ModelConfig and TrainConfig fields.
    - reference: a ~60-line nanoGPT-style decoder (benchmarks/reference_gpt.py: token + learned absolute
      position embedding, pre-LayerNorm blocks with biases, causal SDPA attention (and the same
      document mask as synthlab's on packed rows), GELU MLP, final LayerNorm, untied head, PyTorch
      default init), AdamW(lr, weight_decay=0, default betas), constant lr, no warmup, no
      clipping, cross-entropy on the batch's loss-mask positions (the answer tokens of QA tasks,
      every token of a biography).

    Both are scored at each step of `--eval-at` by the lab's own scorers (`synthlab.evaluation.evaluate`):
    - mano, multihop: `GroupProbe`, teacher-forced exact match of the answer (equal to greedy
      decoding) per group, on held-out test prompts and on distinct training prompts (up to
      `--max-eval` of each group): Mano per length l (`train_acc_l1`: the one-operator training
      prompts; `acc_l2`: held-out l = 2), multihop per hop count (`train_acc_h1`: the atomic
      facts; `train_acc_h2`: the 2-hop training questions; `acc_h2`: held-out 2-hop questions);
    - bios: `biography_recall` over every training biography: the summed loss (nats) of the
      name's tokens (`name_nats`) and of an attribute value's tokens, averaged over the six
      attributes (`attr_nats`), and the fraction of attribute values whose every token is the
      argmax (`attr_acc`).

How to read the output
    One line per evaluation step: for each metric the synthlab value, the reference value and
    their ratio syn / ref (accuracy: above 1 = synthlab ahead; nats: below 1 = synthlab ahead),
    then the mean training objective of both since the previous evaluation. Every group's
    numbers are in the `--out` JSON/CSV, beside the full configuration of both models.

Examples (one thread; the task's default data, model size and step counts unless given):
    python benchmarks/bench_learning.py --task mano
    python benchmarks/bench_learning.py --task multihop --synthlab tie_head=false,positions=learned,\\
        init=torch,bias=true,norm_type=layernorm,schedule=constant,weight_decay=0,grad_clip=0
    python benchmarks/bench_learning.py --task bios --data n_people=100 --steps 500 --eval-at 250,500
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tempfile
import time
import types
import typing
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from reference_gpt import RefGPT, RefScored, ref_step  # benchmarks/, beside this script

from synthlab import serialize
from synthlab.data.datasets import Batcher, load_dataset, training_examples
from synthlab.evaluation.evaluate import biography_recall
from synthlab.evaluation.groups import GroupProbe, group_columns, group_label
from synthlab.models import ModelConfig, build_model
from synthlab.training import engine
from synthlab.training.configs import TrainConfig, flat_types
from synthlab.training.distributed import World
from synthlab.training.objectives import model_forward, step_losses, to_device
from synthlab.training.trainer import build_optimizer, lr_schedule
from synthlab_generators import TASKS, write_dataset
from synthlab_generators.bios import ATTRIBUTES

# Per task: generator params, model and training sizes, and the metrics printed (key, header).
TASK_DEFAULTS = {
    "mano": {
        "data": {"L": 2, "mod": 7, "n_train": 100_000, "n_test": 500},
        "d_model": 128,
        "n_layers": 2,
        "batch_size": 128,
        "lr": 1e-3,
        "steps": 1500,
        "eval_at": "250,500,1000,1500",
    },
    "multihop": {
        "data": {"hops": 2, "layers": 3, "per_layer": 30, "relations": 6, "n_test": 300, "train_fraction": 0.6},
        "d_model": 128,
        "n_layers": 1,
        "batch_size": 128,
        "lr": 1e-3,
        "steps": 1000,
        "eval_at": "250,500,1000",
    },
    "bios": {
        "data": {"n_people": 200},
        "d_model": 64,
        "n_layers": 1,
        "batch_size": 4,
        "lr": 3e-3,
        "steps": 750,
        "seq_len": 128,
        "eval_at": "250,500,750",
    },
}


def metric_keys(task: str, data: dict) -> list[str]:
    if task == "mano":
        return ["train_acc_l1", f"acc_l{data['L']}"]
    if task == "multihop":
        return ["train_acc_h1", f"train_acc_h{data['hops']}", f"acc_h{data['hops']}"]
    return ["name_nats", "attr_nats", "attr_acc"]


# ----------------------------------------------------------------------------------------------
# synthlab's step (synthlab.training.engine.step with the lab's losses, as synthlab.training.trainer, without the run directory)
# ----------------------------------------------------------------------------------------------
class SynthlabTrainer:
    def __init__(self, model, cfg: TrainConfig, total: int):
        self.cfg = cfg
        self.forward = model_forward(model)
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)
        self.state = engine.TrainState(model, build_optimizer(model, cfg), lr_schedule(cfg, total))

    def step(self, inputs, targets, mask, doc_ids) -> float:
        def micro(_):
            objective, _ = step_losses(self.forward, inputs, targets, mask, doc_ids, self.cfg, self.generator, False)
            return objective, (objective.detach(),)

        done = engine.step(self.state, 1, micro, world=World(), grad_clip=self.cfg.optim.grad_clip, check=False)
        return float(done.logged[0])


# ----------------------------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------------------------
def _parse_value(tp, text: str, key: str):
    """A command-line string as the dataclass field type `tp` (bool, int, float, str, optionals, tuples)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null"):
            return None
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _parse_value(args[0], text, key)
    if origin is tuple:
        return tuple(text.split("+")) if text else ()
    if tp is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise SystemExit(f"{key}: expected true/false, got {text!r}")
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise SystemExit(f"{key}: expected {tp.__name__}, got {text!r}") from None
    return text


def parse_pairs(text: str, flag: str) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        if "=" not in item:
            raise SystemExit(f"{flag}: expected key=value, got {item!r}")
        pairs.append(tuple(s.strip() for s in item.split("=", 1)))
    return pairs


def parse_overrides(text: str) -> tuple[dict, dict]:
    """'k=v,k=v' -> (ModelConfig overrides, TrainConfig overrides), typed by the field annotations."""
    model_hints, train_hints = typing.get_type_hints(ModelConfig), flat_types()
    model_over, train_over = {}, {}
    for key, value in parse_pairs(text, "--synthlab"):
        if key in model_hints and key != "vocab_size":
            model_over[key] = _parse_value(model_hints[key], value, f"--synthlab {key}")
        elif key in train_hints:
            train_over[key] = _parse_value(train_hints[key], value, f"--synthlab {key}")
        else:
            raise SystemExit(f"--synthlab: {key!r} is neither a ModelConfig nor a TrainConfig field")
    return model_over, train_over


def parse_data(task: str, text: str) -> dict:
    """The task's default generator params with `--data k=v,...` applied (typed by the params class)."""
    hints = typing.get_type_hints(TASKS[task].params_cls)
    data = dict(TASK_DEFAULTS[task]["data"])
    for key, value in parse_pairs(text, "--data"):
        if key not in hints:
            raise SystemExit(f"--data: {key!r} is not a parameter of {task} ({', '.join(hints)})")
        data[key] = _parse_value(hints[key], value, f"--data {key}")
    return data


# ----------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------
class Scorer:
    """Every metric of one model on the task's fixed evaluation sets, through the lab's scorers."""

    def __init__(self, ds, task: str, max_eval: int, device: torch.device):
        self.ds, self.task, self.device = ds, task, device
        self.probe = None if task == "bios" else GroupProbe(ds, per_group=max_eval, seed=0)
        self.people = len(ds.records("train"))

    @torch.no_grad()
    def __call__(self, model) -> dict[str, float]:
        if self.probe is not None:
            return group_columns(self.probe.groups(model, self.device))
        recall = biography_recall(model, self.ds, device=self.device, people=self.people)
        out = {
            "name_nats": recall["name"]["loss"],
            "attr_nats": float(np.mean([recall[a]["loss"] for a in ATTRIBUTES])),
            "attr_acc": float(np.mean([recall[a]["accuracy"] for a in ATTRIBUTES])),
        }
        for name, r in recall.items():
            out[f"acc_{name}"], out[f"nats_{name}"] = r["accuracy"], r["loss"]
        return out

    def sizes(self) -> dict[str, int]:
        if self.probe is None:
            return {"biographies": self.people}
        key = TASKS[self.task].group_key
        return {
            ("train_" if split == "train" else "") + group_label(key, g): n
            for split, (_, _, groups) in self.probe.items.items()
            for g, n in Counter(groups).items()
        }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--task", choices=sorted(TASK_DEFAULTS), default="mano", help="task (default mano)")
    ap.add_argument(
        "--data",
        default="",
        help="k=v,... generator params over the task's defaults "
        "(mano L=2,mod=7,n_train=100000,n_test=500; multihop hops=2,layers=3,per_layer=30,relations=6,"
        "n_test=300,train_fraction=0.6; bios n_people=200)",
    )
    ap.add_argument("--data-seed", type=int, default=0, help="seed of the generated data")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and of the batch order")
    ap.add_argument("--d-model", type=int, help="default: mano, multihop 128; bios 64")
    ap.add_argument("--n-layers", type=int, help="default: mano 2; multihop, bios 1")
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--batch-size", type=int, help="rows per batch (default: mano, multihop 128; bios 4)")
    ap.add_argument("--seq-len", type=int, help="packed row length (bios only; default 128)")
    ap.add_argument("--lr", type=float, help="both models' lr (default: mano, multihop 1e-3; bios 3e-3)")
    ap.add_argument("--steps", type=int, help="default: mano 1500, multihop 1000, bios 750")
    ap.add_argument(
        "--eval-at",
        help="comma-separated step counts (default: mano 250,500,1000,1500; multihop 250,500,1000; bios 250,500,750)",
    )
    ap.add_argument("--max-eval", type=int, default=2000, help="at most this many prompts per group and split")
    ap.add_argument(
        "--synthlab",
        default="",
        help="k=v,... overrides of synthlab's ModelConfig / TrainConfig "
        "fields, e.g. tie_head=false,positions=learned,init=torch,bias=true,norm_type=layernorm,"
        "schedule=constant,weight_decay=0,grad_clip=0",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: both models train there in float32 (default cpu)")
    ap.add_argument("--out", help="write the table to OUT.json and OUT.csv (suffix replaced)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    task, spec = args.task, TASKS[args.task]
    for key, value in TASK_DEFAULTS[task].items():
        if getattr(args, key, "n/a") is None:
            setattr(args, key, value)
    data = parse_data(task, args.data)
    eval_at = sorted({int(s) for s in args.eval_at.split(",") if s.strip()})
    eval_at = [s for s in eval_at if 0 < s <= args.steps] or [args.steps]
    model_over, train_over = parse_overrides(args.synthlab)

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_dataset(spec, spec.params_cls(**data), seed=args.data_seed, out=Path(tmp) / task)
        ds = load_dataset(folder, task)
        scorer = Scorer(ds, task, args.max_eval, device)  # reads train and test while the folder exists
    examples = training_examples(ds)
    seq_len = args.seq_len if spec.pack else int(examples.lengths.max()) - 1
    batcher = Batcher(
        examples, batch_size=args.batch_size, seq_len=seq_len, pack=spec.pack, pad_id=ds.pad_id, seed=args.seed
    )
    vocab = len(ds.tokenizer)

    mcfg = serialize.merge(
        ModelConfig(vocab_size=vocab, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads), model_over
    )
    tcfg = TrainConfig.flat(
        **{
            "task": task,
            "seed": args.seed,
            "batch_size": args.batch_size,
            "steps": args.steps,
            "lr": args.lr,
            "pack": spec.pack,
            "seq_len": seq_len if spec.pack else None,
            "device": device.type,
            **train_over,
        }
    )
    syn = build_model(mcfg, seed=tcfg.seed).to(device)
    syn_trainer = SynthlabTrainer(syn, tcfg, args.steps)
    torch.manual_seed(args.seed)
    ref = RefGPT(vocab, args.d_model, args.n_layers, args.n_heads, mcfg.max_seq_len).to(device)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.0)
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    config = {
        "data": {
            "task": task,
            **data,
            "seed": args.data_seed,
            "vocab_size": vocab,
            "seq_len": seq_len,
            "batch_size": args.batch_size,
            "pack": spec.pack,
            "batch_seed": args.seed,
        },
        "synthlab": {
            "model": serialize.to_dict(mcfg),
            "train": serialize.to_dict(tcfg),
            "params": n_params(syn),
            "overrides": args.synthlab,
        },
        "reference": {
            "d_model": args.d_model,
            "n_layers": args.n_layers,
            "n_heads": args.n_heads,
            "d_ff": 4 * args.d_model,
            "positions": "learned",
            "norm": "LayerNorm (bias)",
            "bias": True,
            "tie_head": False,
            "init": "torch default",
            "optimizer": "AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=0)",
            "lr": args.lr,
            "schedule": "constant, no warmup",
            "grad_clip": 0,
            "params": n_params(ref),
        },
        "steps": args.steps,
        "eval_at": eval_at,
        "threads": args.threads,
        "device": args.device,
    }
    keys = metric_keys(task, data)
    sizes = scorer.sizes()
    print(
        f"# data: {task} {data}; {len(examples)} examples, {batcher.rows_per_epoch} rows of {seq_len} per epoch; "
        f"eval sets {sizes}"
    )
    print(f"# synthlab: {n_params(syn)} params; overrides: {args.synthlab or '(synthlab train defaults)'}")
    print(f"# reference: {n_params(ref)} params")
    print(
        f"{'step':>6} "
        + " ".join(f"{'syn ' + k:>{len(k) + 4}} {'ref ' + k:>{len(k) + 4}} {'ratio':>6}" for k in keys)
        + f" {'syn loss':>9} {'ref loss':>9}",
        flush=True,
    )

    rows, syn_losses, ref_losses = [], [], []
    t_syn = t_ref = 0.0
    for step in range(1, args.steps + 1):
        inputs, targets, mask, doc_ids = to_device(batcher.next_batch(), device)
        t0 = time.perf_counter()
        syn.train()
        syn_losses.append(syn_trainer.step(inputs, targets, mask, doc_ids))
        t1 = time.perf_counter()
        ref.train()
        ref_losses.append(ref_step(ref, ref_opt, inputs, targets, mask, doc_ids))
        t2 = time.perf_counter()
        t_syn, t_ref = t_syn + t1 - t0, t_ref + t2 - t1
        if not (math.isfinite(syn_losses[-1]) and math.isfinite(ref_losses[-1])):
            print(f"# non-finite loss at step {step}: synthlab {syn_losses[-1]}, reference {ref_losses[-1]}")
        if step in eval_at:
            syn.eval(), ref.eval()
            scores = {"syn": scorer(syn), "ref": scorer(RefScored(ref))}
            row = {
                "step": step,
                "syn_loss": float(np.mean(syn_losses)),
                "ref_loss": float(np.mean(ref_losses)),
                "syn_s_per_step": t_syn / step,
                "ref_s_per_step": t_ref / step,
            }
            for who, values in scores.items():
                row.update({f"{who}_{k}": v for k, v in values.items()})
            cells = []
            for k in keys:
                s, r = scores["syn"][k], scores["ref"][k]
                row[f"ratio_{k}"] = s / r if r > 0 else float("nan")
                cells.append(f"{s:>{len(k) + 4}.3f} {r:>{len(k) + 4}.3f} {row[f'ratio_{k}']:>6.2f}")
            rows.append(row)
            syn_losses, ref_losses = [], []
            print(f"{step:>6} " + " ".join(cells) + f" {row['syn_loss']:>9.4f} {row['ref_loss']:>9.4f}", flush=True)
    print(f"# seconds per step: synthlab {t_syn / args.steps:.4f}, reference {t_ref / args.steps:.4f}")

    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps({"config": config, "eval_sets": sizes, "rows": rows}, indent=1))
        with open(out.with_suffix(".csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"# wrote {out.with_suffix('.json')} and {out.with_suffix('.csv')}")


if __name__ == "__main__":
    main()
