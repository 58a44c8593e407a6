"""What the encoded-dataset cache (DIR/.train_tokens.npz, synthlab.data.token_cache) saves at the start
of a run: `training_examples` on a newly opened dataset with the cache in place (a hit: train.jsonl
hashed, the .npz read) against the same call encoding from the records (train.jsonl read as JSON,
every record encoded), in one run, interleaved, the best of --rounds each. The first call, which
encodes and writes the cache, is timed apart. Both give byte-identical arrays (checked here).

Datasets: bioS at calib64's largest N (23,701 people; pool_scale 0.1) and at its smallest (3,447),
and mano at the cpu preset's size (n_train 100,000, mod 7, L 3), generated once into --cache.

Measured (one thread, load average 3.3 on 2 cores, two training jobs running, the best of 5 rounds):

    dataset                 fresh encode   cache hit   ratio   first call (encode + write)   train.jsonl
    bioS N 23,701               1.386 s     0.0296 s   46.8x         1.842 s                   11.6 MB
    bioS N 3,447                0.121 s     0.0042 s   28.7x         0.165 s                    1.7 MB
    mano n_train 100,000        1.355 s     0.0154 s   88.0x         2.111 s                    7.2 MB

so a run's start saves about 1.4 s at the largest calibration dataset and mano's cpu size (the
first run of a dataset pays about 0.5 s more to write the cache).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_encode_cache.py [--rounds 5] [--cache DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from synthlab.data.datasets import ENCODED, _encode_training, load_dataset, training_examples
from synthlab_generators import TASKS, write_dataset

DATASETS = {
    "bioS N 23,701": ("bios", {"n_people": 23701, "pool_scale": 0.1}),
    "bioS N 3,447": ("bios", {"n_people": 3447, "pool_scale": 0.1}),
    "mano n_train 100,000": ("mano", {"n_train": 100000, "mod": 7, "L": 3}),
}


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per variant (default: 5)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "synthlab-bench-encode")
    args = parser.parse_args()
    print(f"{'dataset':<24} {'fresh s':>8} {'hit s':>8} {'ratio':>6} {'first s':>8} {'train.jsonl MB':>15}")
    for label, (task, overrides) in DATASETS.items():
        spec = TASKS[task]
        params = replace(spec.params_cls(), **overrides)
        folder = args.cache / f"{task}-{'-'.join(f'{k}{v}' for k, v in sorted(overrides.items()))}"
        if not folder.is_dir():
            write_dataset(spec, params, 0, folder)
        (folder / ENCODED).unlink(missing_ok=True)  # the cache is this benchmark's own file
        first, _ = timed(lambda ds=load_dataset(folder): training_examples(ds))
        fresh, hit = [], []
        for _ in range(args.rounds):  # each call on a newly opened dataset: its records not read yet
            seconds, encoded = timed(lambda ds=load_dataset(folder): _encode_training(ds))
            fresh.append(seconds)
            seconds, cached = timed(lambda ds=load_dataset(folder): training_examples(ds))
            hit.append(seconds)
            for f in fields(encoded):
                a, b = getattr(encoded, f.name), getattr(cached, f.name)
                assert a.dtype == b.dtype and np.array_equal(a, b), f"{label}: {f.name} differs from a fresh encode"
        size = (folder / "train.jsonl").stat().st_size / 1e6
        print(
            f"{label:<24} {min(fresh):>8.3f} {min(hit):>8.4f} {min(fresh) / min(hit):>5.1f}x {first:>8.3f} {size:>15.1f}"
        )


if __name__ == "__main__":
    main()
