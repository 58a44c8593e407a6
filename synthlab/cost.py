"""Model size and training cost of a sweep point: the `params` / `train_flops` columns, and the
time estimate `synthlab sweep --dry-run` prints before anything has run.

FLOPs count 3 x the forward pass (forward + backward) over every row position, padding included.
Before the data exists, the row length and the number of rows come from the task's `shape`
(`synthlab_generators` TaskSpec), computed from the generator params.
"""

from __future__ import annotations

import math
from typing import Any

from synthlab import config as configlib
from synthlab.models import ModelConfig, build_model, count_params, flops_per_token

# Training FLOP/s assumed until a finished point of the sweep has measured one. Measured on an idle
# 2-core machine with one torch thread per run (two runs side by side, train_flops / train_s):
# 1.0e10 for the d = 32 bioS capacity model (its 2,772-token softmax is memory-bound), 0.6-1.3e10
# for the d = 32 scaling models, 1.5-3e10 for d = 64 and 2.2e10 for the d = 128 multihop model.
DEFAULT_FLOPS_PER_S = 2e10


def size_metrics(run_config: dict[str, Any]) -> dict[str, Any]:
    """Unique and non-embedding parameters, and the training FLOPs, of a run's config.json."""
    model_config = configlib.from_dict(ModelConfig, run_config["model"])
    model = build_model(model_config)
    derived = run_config["derived"]
    positions = derived["total_steps"] * run_config["train"]["batch_size"] * derived["seq_len"]
    # with the `last` objective training reads out only the last step (synthlab.train.step_losses)
    per_token = flops_per_token(model_config, derived["seq_len"], all_steps=run_config["train"]["loss"] != "last")
    return {"params": count_params(model), "params_nonemb": count_params(model, exclude_embedding=True),
            "train_flops": 3 * per_token * positions}


def positions(point) -> tuple[int, int]:
    """(total optimizer steps, row length) of a PointConfig, from the task's shape."""
    train = point.train
    shape = point.spec.shape(point.data)
    pack = train.pack if train.pack is not None else point.spec.pack
    seq = (train.seq_len or point.model.max_seq_len) if pack else shape.row_len
    if train.steps:
        return train.steps, seq
    records = shape.train_records
    if pack:  # next-fit packing leaves about a third of an example free per row (measured on bioS)
        inputs = shape.tokens_per_record - 1
        rows = records * inputs / max(1.0, seq - inputs / 3)
    else:
        rows = records
    return math.ceil(train.exposures * rows / train.batch_size), seq


def estimate_seconds(point, *, finished: list[dict[str, str]]) -> float:
    """Training time: FLOPs of the point over the FLOP/s measured by finished runs of the sweep."""
    measured = [(float(r["train_flops"]), float(r["train_s"])) for r in finished if r.get("train_flops")]
    rate = sum(f for f, _ in measured) / sum(s for _, s in measured) if measured else DEFAULT_FLOPS_PER_S
    steps, seq = positions(point)
    all_steps = point.train.loss != "last"
    return 3 * flops_per_token(point.model, seq, all_steps=all_steps) * steps * point.train.batch_size * seq / rate
