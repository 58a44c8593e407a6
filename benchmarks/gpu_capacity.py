"""Knowledge capacity at 1000 exposures on one GPU: Physics-of-LMs-3.3-shaped models, plain and looped.

Generates bioS(N), trains GPT-2-block models (the paper's GPT2-l-h: d = 64 h, l layers, h heads;
tied head, 0.02 init) for 1000 exposures with the lab's trainer (packed rows, bf16 autocast and
torch.compile on CUDA), once with 1 loop and once with 4 at the same unique parameters, estimates
each model's bits (Definition 4.3, synthlab.capacity) and prints bits/param per model. The paper's
figure is printed on its own labelled line as the reference, never as a result.

The population must hold at least `--min-ratio` bits per parameter of the model: max_bits(N) / P
>= 3 is checked before any training, so a model at the paper's 2 bits/param fills at most two
thirds of the data and the figure measures the model, not the data (`--dry-run` reports the ratio
without requiring it).

    python benchmarks/gpu_capacity.py --out results/capacity/gpu      # one H200
    python benchmarks/gpu_capacity.py --dry-run --out /tmp/gpu_cap     # tiny, on the CPU

Default size (N = 40,000, GPT2-2-2 = d 128 x 2 layers, P about 0.75M with the used embedding rows:
max_bits / P = 3.2): 2.3G training tokens per model, 1 + 4 passes of compute in all; the 8-minute
budget needs about 25M tokens/s for the plain model, not yet measured on an H200.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PAPER_BITS_PER_PARAM = 2.0  # Physics of LMs 3.3 at 1000 exposures: the reference line, not a result

FULL = dict(
    n_people=40_000,
    d_model=128,
    n_layers=2,
    n_heads=2,
    exposures=1000,
    batch_size=192,
    seq_len=512,
    lr=1e-3,
    warmup_steps=1000,
    device="auto",
    compile=True,
)
TINY = dict(
    n_people=40,
    d_model=16,
    n_layers=1,
    n_heads=2,
    exposures=2,
    batch_size=8,
    seq_len=128,
    lr=3e-3,
    warmup_steps=5,
    device="cpu",
    compile=False,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="new or empty folder for the data, runs and gpu_capacity.json")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, ratio not required")
    parser.add_argument(
        "--loops", default="1,4", help="loop counts to train at the same unique parameters (default 1,4)"
    )
    parser.add_argument(
        "--n-people", type=int, default=None, help=f"N (default {FULL['n_people']}; dry run {TINY['n_people']})"
    )
    parser.add_argument(
        "--min-ratio", type=float, default=3.0, help="required max_bits / P of the population (default 3.0)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the weights (default 0)")
    return parser.parse_args(argv)


def train_one(root: Path, data: Path, size: dict, loops: int, seed: int) -> Path:
    from synthlab.cli.train import resolve_run_config
    from synthlab.train import train

    model = {
        "d_model": size["d_model"],
        "n_layers": size["n_layers"],
        "n_heads": size["n_heads"],
        "loops": loops,
        "max_seq_len": size["seq_len"],
        "tie_head": True,
        "init_std": 0.02,
    }
    keys = ("exposures", "batch_size", "seq_len", "lr", "warmup_steps", "device", "compile")
    run = resolve_run_config(
        {},
        model,
        {
            "data": str(data),
            "seed": seed,
            "weight_decay": 0.1,
            "beta2": 0.98,
            "eps": 1e-6,
            "checkpoint_every": 10**9,
            **{k: size[k] for k in keys},
        },
    )
    run_dir = root / f"loops{loops}"
    train(run_dir, run, progress=False)
    return run_dir


def main(argv=None) -> None:
    from synthlab import SynthlabError
    from synthlab.capacity import estimate_capacity, max_bits, used_token_ids
    from synthlab.data import load_dataset
    from synthlab.files import atomic_write_text
    from synthlab.models import ModelConfig, build_model, count_params
    from synthlab_generators import TASKS, write_dataset

    args = parse_args(argv)
    size = dict(TINY if args.dry_run else FULL)
    size["n_people"] = args.n_people or size["n_people"]
    loops = [int(t) for t in args.loops.split(",")]
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise SynthlabError(f"--out {out} is not empty")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        raise SynthlabError("no CUDA device: run with --dry-run to check the path on the CPU")

    data = out / "bios"
    write_dataset(TASKS["bios"], TASKS["bios"].params_cls(n_people=size["n_people"]), args.seed, data)
    used = used_token_ids(load_dataset(data, "bios"))
    shape = ModelConfig(
        vocab_size=max(used) + 1,
        d_model=size["d_model"],
        n_layers=size["n_layers"],
        n_heads=size["n_heads"],
        max_seq_len=size["seq_len"],
        tie_head=True,
    )
    params = count_params(build_model(shape), used_token_ids=used)
    ratio = max_bits(size["n_people"]) / params
    print(
        f"bioS(N = {size['n_people']:,}): max {max_bits(size['n_people']):,.0f} bits; GPT2-{size['n_layers']}-"
        f"{size['n_heads']} (d {size['d_model']}): P = {params:,} with the used embedding rows; max_bits / P = "
        f"{ratio:.2f}; {size['exposures']} exposures"
    )
    if ratio < args.min_ratio and not args.dry_run:
        raise SynthlabError(f"the population holds {ratio:.2f} bits/param, below --min-ratio {args.min_ratio}")

    rows = []
    for t in loops:
        start = time.perf_counter()
        run_dir = train_one(out / "runs", data, size, t, args.seed)
        seconds = time.perf_counter() - start
        report = estimate_capacity(run_dir, device="cpu" if args.dry_run else "auto")
        rows.append(
            {
                "loops": t,
                "params": report["params"],
                "bits": report["bits"],
                "bits_per_param": report["bits_per_param"],
                "fraction_of_max": report["fraction_of_max"],
                "train_s": seconds,
                "per_attribute": report["per_attribute"],
            }
        )
        print(
            f"loops {t}: {report['bits']:,.0f} bits, {report['bits_per_param']:.3f} bits/param "
            f"({report['fraction_of_max']:.1%} of the data), trained in {seconds:.0f} s"
        )
    print(
        f"reference: Physics of LMs 3.3 at 1000 exposures, about {PAPER_BITS_PER_PARAM:g} bits/param (paper, not measured here)"
    )
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.dry_run else "cpu"
    atomic_write_text(
        out / "gpu_capacity.json",
        json.dumps(
            {
                "size": size,
                "max_bits": max_bits(size["n_people"]),
                "params": params,
                "ratio": ratio,
                "device": device,
                "dry_run": args.dry_run,
                "torch": torch.__version__,
                "models": rows,
            },
            indent=2,
        )
        + "\n",
    )


if __name__ == "__main__":
    from synthlab import SynthlabError

    try:
        main()
    except SynthlabError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
