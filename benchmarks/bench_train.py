"""Training throughput with data loading vs the model alone, measured in the same run.

    .venv/bin/python benchmarks/bench_train.py [--task bios|mano] [--rounds 5] [--steps 10]

End-to-end = what `synthlab train` does per step: the batcher's next batch (packing a new epoch
when one ends), tensors to the device, forward, masked loss, backward, clip, AdamW (`synthlab.training.engine.step`).
Model-only = the same step on one fixed batch (no data work at all). Rounds alternate the two so
that load from other processes hits both alike; the ratio of their step rates is printed (target
>= 0.9). Also printed: the data work alone per batch (packing included) and the ratio it implies,
which is immune to that noise, and the full `train()` call (startup, metrics, checkpoints).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from synthlab.cli.train import resolve_run_config
from synthlab.data.datasets import load_dataset
from synthlab.models import build_model
from synthlab.training import engine
from synthlab.training.distributed import World
from synthlab.training.objectives import model_forward, step_losses, to_device
from synthlab.training.trainer import build_optimizer, lr_schedule, prepare_run, train
from synthlab_generators import TASKS, write_dataset

DATA = {"bios": {"n_people": 1000}, "mano": {"L": 8, "n_train": 20000, "n_test": 100}}
MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 256}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="bios", choices=sorted(DATA))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed chunk")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        spec = TASKS[args.task]
        data_dir = write_dataset(spec, spec.params_cls(**DATA[args.task]), 0, Path(tmp) / "data")
        train_flags = {"data": str(data_dir), "steps": 10**6, "batch_size": args.batch_size}
        run = resolve_run_config({}, MODEL, train_flags)
        derived, batcher = prepare_run(run, load_dataset(data_dir))
        device = torch.device("cpu")
        model = build_model(run.model)
        state = engine.TrainState(
            model, build_optimizer(model, run.train), lr_schedule(run.train, derived["total_steps"])
        )
        generator = torch.Generator().manual_seed(0)
        fixed = to_device(batcher.next_batch(), device)
        forward = model_forward(model)

        def step(batch) -> None:
            def micro(_):
                objective, _ = step_losses(forward, *batch, run.train, generator, False)
                return objective, (objective.detach(),)

            engine.step(state, 1, micro, world=World(), grad_clip=run.train.optim.grad_clip, check=False)

        def timed(batch_source) -> float:
            start = time.perf_counter()
            for _ in range(args.steps):
                step(batch_source())
            return time.perf_counter() - start

        step(fixed)  # warm-up
        end_to_end = model_only = 0.0
        for _ in range(args.rounds):
            end_to_end += timed(lambda: to_device(batcher.next_batch(), device))
            model_only += timed(lambda: fixed)
        n = args.rounds * args.steps
        start = time.perf_counter()
        for _ in range(n):  # the data work alone, over the same number of batches
            to_device(batcher.next_batch(), device)
        data_only = time.perf_counter() - start
        print(
            f"task {args.task}: rows {args.batch_size} x {derived['seq_len']} (pack={derived['pack']}), "
            f"{derived['rows_per_epoch']} rows per epoch, epochs crossed: {batcher.epoch}"
        )
        print(f"model only:  {n / model_only:8.2f} steps/s")
        print(f"end to end:  {n / end_to_end:8.2f} steps/s (data loading included)")
        print(
            f"data only:   {1e3 * data_only / n:8.2f} ms per batch "
            f"(bound on the ratio: {model_only / (model_only + data_only):.3f})"
        )
        print(f"ratio end-to-end / model-only: {model_only / end_to_end:.3f} (target >= 0.9)")

        run = resolve_run_config({}, MODEL, {**train_flags, "steps": n, "log_every": 10, "checkpoint_every": n})
        start = time.perf_counter()
        train(Path(tmp) / "run", run, progress=False)
        print(
            f"full train() call, {n} steps incl. startup, logging, checkpoint: {n / (time.perf_counter() - start):8.2f} steps/s"
        )


if __name__ == "__main__":
    main()
