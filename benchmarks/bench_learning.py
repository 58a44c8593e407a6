"""Learning speed: synthlab's model and training step against a minimal reference GPT on Mano.

What it measures
    Both models train on exactly the same batches, in the same order: a Mano dataset is generated
    with the library (`synthlab_generators.write_dataset`) into a temporary folder, read with
    `synthlab.data.load_dataset` and cut into unpacked batches by `synthlab.data.Batcher`; each
    batch is handed to both models. The two trainings are interleaved (one step of synthlab's, one
    step of the reference's) so machine noise hits both alike.

    - synthlab: `synthlab.models.build_model(ModelConfig(...))`, trained with the lab's own step
      (`build_optimizer`, `build_scheduler`, `model_forward`, `step_losses`, `to_device`, gradient
      clipping as in `synthlab.train`). Defaults are the lab's defaults; `--synthlab k=v,...`
      overrides ModelConfig and TrainConfig fields.
    - reference: a ~60-line nanoGPT-style decoder defined in this file (token + learned absolute
      position embedding, pre-LayerNorm blocks with biases, causal SDPA attention, GELU MLP, final
      LayerNorm, untied head, PyTorch default init), AdamW(lr, weight_decay=0, default betas),
      constant lr, no warmup, no clipping, cross-entropy on the batch's loss-mask positions (the
      answer token).

    At each step of `--eval-at` both are scored by teacher-forced argmax of the answer token after
    `<ans>` (one answer token, so this equals greedy decoding) on:
    - `l1 train`: every distinct one-operator (l = 1) training prompt (3 ops x mod^2 = 147 for
      mod 7): how well the single operations are learned;
    - `held-out l=k`: the test split for k = L (prompts never trained on); for k < L the distinct
      training prompts of that length (the generator holds out only length-L prompts).

How to read the output
    One line per evaluation step:
        step | syn l1 | ref l1 | syn held | ref held | ratio | syn loss | ref loss
    where `held` is the held-out accuracy at l = L, `ratio` = syn held / ref held (1.0: the lab's
    recipe learns as fast as the reference; well below 1: it learns slower), and the losses are the
    mean training objective over the steps since the previous evaluation. Per-length accuracies
    are in the `--out` JSON/CSV, beside the full configuration of both models.

Example (the issue's setting, one thread):
    python benchmarks/bench_learning.py --steps 1500 --eval-at 250,500,1000,1500
    python benchmarks/bench_learning.py --synthlab tie_head=false,positions=learned,init=torch,\\
        bias=true,norm_type=layernorm,schedule=constant,warmup_steps=0,weight_decay=0,grad_clip=0,beta2=0.999
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
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from synthlab import config as configlib
from synthlab.data import Batcher, load_dataset, training_examples
from synthlab.models import ModelConfig, build_model
from synthlab.options import TrainConfig
from synthlab.train import build_optimizer, build_scheduler, model_forward, step_losses, to_device
from synthlab_generators import TASKS, write_dataset


# ----------------------------------------------------------------------------------------------
# the reference GPT (nanoGPT style)
# ----------------------------------------------------------------------------------------------
class RefAttention(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, S, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, S, D))


class RefBlock(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), RefAttention(d, n_heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class RefGPT(nn.Module):
    def __init__(self, vocab: int, d: int, n_layers: int, n_heads: int, block_size: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(RefBlock(d, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def ref_step(model, optimizer, inputs, targets, mask) -> float:
    logits = model(inputs)
    loss = F.cross_entropy(logits[mask], targets[mask])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


# ----------------------------------------------------------------------------------------------
# synthlab's step (as synthlab.train._Trainer.train_step, without the run directory)
# ----------------------------------------------------------------------------------------------
class SynthlabTrainer:
    def __init__(self, model, cfg: TrainConfig, total: int):
        self.model, self.cfg = model, cfg
        self.forward = model_forward(model)
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)
        self.optimizer = build_optimizer(model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg, total)

    def step(self, inputs, targets, mask, doc_ids) -> float:
        objective, _ = step_losses(self.forward, inputs, targets, mask, doc_ids, self.cfg, self.generator, False)
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return float(objective.detach())


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
        raise SystemExit(f"--synthlab {key}: expected true/false, got {text!r}")
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise SystemExit(f"--synthlab {key}: expected {tp.__name__}, got {text!r}") from None
    return text


def parse_overrides(text: str) -> tuple[dict, dict]:
    """'k=v,k=v' -> (ModelConfig overrides, TrainConfig overrides), typed by the field annotations."""
    model_hints, train_hints = typing.get_type_hints(ModelConfig), typing.get_type_hints(TrainConfig)
    model_over, train_over = {}, {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        if "=" not in item:
            raise SystemExit(f"--synthlab: expected key=value, got {item!r}")
        key, value = (s.strip() for s in item.split("=", 1))
        if key in model_hints and key != "vocab_size":
            model_over[key] = _parse_value(model_hints[key], value, key)
        elif key in train_hints:
            train_over[key] = _parse_value(train_hints[key], value, key)
        else:
            raise SystemExit(f"--synthlab: {key!r} is neither a ModelConfig nor a TrainConfig field")
    return model_over, train_over


# ----------------------------------------------------------------------------------------------
# evaluation
# ----------------------------------------------------------------------------------------------
def eval_sets(ds, L: int, max_prompts: int) -> dict[str, list[dict]]:
    """Name -> records: 'l1 train' (all distinct l=1 training prompts) and 'held l=k' for k = 1..L."""
    train, test = ds.records("train"), ds.records("test")
    distinct: dict[int, dict[str, dict]] = {}
    for r in train:
        distinct.setdefault(int(r["length"]), {}).setdefault(r["prompt"], r)
    sets = {"l1 train": list(distinct.get(1, {}).values())}
    for k in range(1, L + 1):
        recs = [r for r in test if int(r["length"]) == k] if k == L else list(distinct.get(k, {}).values())
        sets[f"held l={k}"] = recs[:max_prompts]
    return sets


def encode_set(ds, records):
    """Groups of equal prompt length: [(input ids (N, P), answer ids (N,))]."""
    groups: dict[int, tuple[list, list]] = {}
    for r in records:
        prompt = ds.encode_prompt(r["prompt"])
        answer = ds.tokenizer.encode(str(r["answer"]))
        assert len(answer) == 1, "this benchmark scores one-token answers"
        groups.setdefault(len(prompt), ([], []))
        groups[len(prompt)][0].append(prompt)
        groups[len(prompt)][1].append(answer[0])
    return [(torch.tensor(p), torch.tensor(a)) for p, a in groups.values()]


@torch.no_grad()
def accuracy(logits_fn, groups) -> float:
    right = total = 0
    for inputs, answers in groups:
        for i in range(0, len(inputs), 512):
            pred = logits_fn(inputs[i:i + 512])[:, -1].argmax(-1)  # the position of <ans>
            right += int((pred == answers[i:i + 512]).sum())
            total += len(pred)
    return right / max(total, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--L", type=int, default=2, help="Mano's maximum number of operators (default 2)")
    ap.add_argument("--mod", type=int, default=7, help="Mano's modulus (default 7)")
    ap.add_argument("--n-train", type=int, default=100_000)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--data-seed", type=int, default=0, help="seed of the generated data")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and of the batch order")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--eval-at", default="250,500,1000,1500", help="comma-separated step counts")
    ap.add_argument("--max-eval", type=int, default=2000, help="at most this many prompts per held-out set")
    ap.add_argument("--synthlab", default="", help="k=v,... overrides of synthlab's ModelConfig / TrainConfig "
                    "fields, e.g. tie_head=false,positions=learned,init=torch,bias=true,norm_type=layernorm,"
                    "schedule=constant,warmup_steps=0,weight_decay=0,grad_clip=0,beta2=0.999")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--out", help="write the table to OUT.json and OUT.csv (suffix replaced)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    eval_at = sorted({int(s) for s in args.eval_at.split(",") if s.strip()})
    eval_at = [s for s in eval_at if 0 < s <= args.steps] or [args.steps]
    model_over, train_over = parse_overrides(args.synthlab)

    with tempfile.TemporaryDirectory() as tmp:
        spec = TASKS["mano"]
        folder = write_dataset(spec, spec.params_cls(L=args.L, mod=args.mod, n_train=args.n_train, n_test=args.n_test),
                               seed=args.data_seed, out=Path(tmp) / "mano")
        ds = load_dataset(folder, "mano")
        ds.records("train"), ds.records("test")  # read while the folder exists
    examples = training_examples(ds)
    seq_len = int(examples.lengths.max()) - 1
    batcher = Batcher(examples, batch_size=args.batch_size, seq_len=seq_len, pack=False, pad_id=ds.pad_id, seed=args.seed)
    vocab = len(ds.tokenizer)

    mcfg = configlib.merge(ModelConfig(vocab_size=vocab, d_model=args.d_model, n_layers=args.n_layers,
                                       n_heads=args.n_heads), model_over)
    tcfg = configlib.merge(TrainConfig(task="mano", seed=args.seed, batch_size=args.batch_size, steps=args.steps,
                                       lr=args.lr, pack=False, device="cpu"), train_over)
    syn = build_model(mcfg, seed=tcfg.seed)
    syn_trainer = SynthlabTrainer(syn, tcfg, args.steps)
    torch.manual_seed(args.seed)
    ref = RefGPT(vocab, args.d_model, args.n_layers, args.n_heads, seq_len + 8)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.0)
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    config = {
        "data": {"task": "mano", "L": args.L, "mod": args.mod, "n_train": args.n_train, "n_test": args.n_test,
                 "seed": args.data_seed, "vocab_size": vocab, "seq_len": seq_len, "batch_size": args.batch_size,
                 "pack": False, "batch_seed": args.seed},
        "synthlab": {"model": configlib.to_dict(mcfg), "train": configlib.to_dict(tcfg), "params": n_params(syn),
                     "overrides": args.synthlab},
        "reference": {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads, "d_ff": 4 * args.d_model,
                      "positions": "learned", "norm": "LayerNorm (bias)", "bias": True, "tie_head": False,
                      "init": "torch default", "optimizer": "AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=0)",
                      "lr": args.lr, "schedule": "constant, no warmup", "grad_clip": 0, "params": n_params(ref)},
        "steps": args.steps, "eval_at": eval_at, "threads": args.threads,
    }
    sets = {name: encode_set(ds, recs) for name, recs in eval_sets(ds, args.L, args.max_eval).items()}
    sizes = {name: sum(len(a) for _, a in groups) for name, groups in sets.items()}
    print(f"# data: mano L={args.L} mod={args.mod} n_train={args.n_train}; {len(examples)} examples, rows of {seq_len}; "
          f"eval sets {sizes}")
    print(f"# synthlab: {n_params(syn)} params; overrides: {args.synthlab or '(lab defaults)'}")
    print(f"# reference: {n_params(ref)} params")
    held = f"held l={args.L}"
    header = f"{'step':>6} {'syn l1':>7} {'ref l1':>7} {'syn held':>9} {'ref held':>9} {'ratio':>6} {'syn loss':>9} {'ref loss':>9}"
    print(header, flush=True)

    syn_fn = lambda x: syn(x, all_steps=False).logits  # noqa: E731
    rows, syn_losses, ref_losses = [], [], []
    t_syn = t_ref = 0.0
    for step in range(1, args.steps + 1):
        inputs, targets, mask, doc_ids = to_device(batcher.next_batch(), torch.device("cpu"))
        t0 = time.perf_counter()
        syn.train()
        syn_losses.append(syn_trainer.step(inputs, targets, mask, doc_ids))
        t1 = time.perf_counter()
        ref.train()
        ref_losses.append(ref_step(ref, ref_opt, inputs, targets, mask))
        t2 = time.perf_counter()
        t_syn, t_ref = t_syn + t1 - t0, t_ref + t2 - t1
        if not (math.isfinite(syn_losses[-1]) and math.isfinite(ref_losses[-1])):
            print(f"# non-finite loss at step {step}: synthlab {syn_losses[-1]}, reference {ref_losses[-1]}")
        if step in eval_at:
            syn.eval(), ref.eval()
            acc = {name: {"synthlab": accuracy(syn_fn, g), "reference": accuracy(ref, g)} for name, g in sets.items()}
            row = {"step": step, "syn_loss": float(np.mean(syn_losses)), "ref_loss": float(np.mean(ref_losses)),
                   "syn_s_per_step": t_syn / step, "ref_s_per_step": t_ref / step}
            for name, a in acc.items():
                key = name.replace(" ", "_").replace("=", "")
                row[f"syn_{key}"], row[f"ref_{key}"] = a["synthlab"], a["reference"]
            sh, rh = acc[held]["synthlab"], acc[held]["reference"]
            row["ratio_held"] = sh / rh if rh > 0 else float("nan")
            rows.append(row)
            syn_losses, ref_losses = [], []
            print(f"{step:>6} {acc['l1 train']['synthlab']:>7.3f} {acc['l1 train']['reference']:>7.3f} "
                  f"{sh:>9.3f} {rh:>9.3f} {row['ratio_held']:>6.2f} {row['syn_loss']:>9.4f} {row['ref_loss']:>9.4f}",
                  flush=True)
    print(f"# seconds per step: synthlab {t_syn / args.steps:.4f}, reference {t_ref / args.steps:.4f}")
    print("# per-length held-out accuracy (synthlab / reference) at the last step: " + ", ".join(
        f"{name}: {acc[name]['synthlab']:.3f} / {acc[name]['reference']:.3f}" for name in sets if name.startswith("held")))

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
