"""Model size and training cost of a sweep point: the `params` / `train_flops` columns, its steps
and row length before the data exists (`positions`; synthlab.sweeps.step_rate times its steps on
the CPU for `synthlab sweep --dry-run`), and the GPU cost model (`gpu_cost`: tokens, FLOPs,
activation and peak memory, hours on one H200) the dry run prints for a gpu preset.

FLOPs count 3 x the forward pass (forward + backward) over every row position, padding included.
Before the data exists, the row length and the number of rows come from the task's `shape`
(`synthlab_generators` TaskSpec), computed from the generator params.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from synthlab import serialize
from synthlab.data.datasets import Examples, pack_rows
from synthlab.errors import SynthlabError
from synthlab.files import sha256_file
from synthlab.models import (
    LoopedGPT,
    ModelConfig,
    activation_bytes_per_token,
    build_model,
    count_params,
    flops_per_token,
    flops_per_token_parts,
    layer_activation_bytes,
)
from synthlab.training.configs import flat_train


def size_metrics(run_config: dict[str, Any]) -> dict[str, Any]:
    """Unique and non-embedding parameters, and the training FLOPs, of a run's config.json."""
    model_config = serialize.from_dict(ModelConfig, run_config["model"])
    model = build_model(model_config)
    derived = run_config["derived"]
    train = flat_train(run_config["train"])  # a config.json of either age
    positions = derived["total_steps"] * train["batch_size"] * derived["seq_len"]
    # with the `last` objective training reads out only the last step (synthlab.training.objectives.step_losses)
    per_token = flops_per_token(model_config, derived["seq_len"], all_steps=train["loss"] != "last")
    return {
        "params": count_params(model),
        "params_nonemb": count_params(model, exclude_embedding=True),
        "train_flops": 3 * per_token * positions,
    }


def positions(point) -> tuple[int, int]:
    """(total optimizer steps, row length) of a PointConfig, from the task's shape."""
    train = point.train
    shape = point.spec.shape(point.data)
    pack = train.batch.pack if train.batch.pack is not None else point.spec.pack
    seq = (train.batch.seq_len or point.model.max_seq_len) if pack else shape.row_len
    if train.schedule.steps:
        return train.schedule.steps, seq
    return math.ceil(train.schedule.exposures * rows_per_epoch(point, seq) / train.batch.batch_size), seq


def rows_per_epoch(point, seq: int) -> float:
    """Rows of one pass over the training records (packed or one per row)."""
    shape = point.spec.shape(point.data)
    pack = point.train.batch.pack if point.train.batch.pack is not None else point.spec.pack
    if not pack:
        return shape.train_records
    inputs = shape.tokens_per_record - 1  # next-fit leaves about a third of an example free per row (bioS)
    return shape.train_records * inputs / max(1.0, seq - inputs / 3)


# --- one GPU: the cost model `synthlab sweep NAME --preset gpu --dry-run` prints ----------------
# One H200 as measured in results/gpu (dense bf16 peak of the H100/H200 class; about 140 GiB).
# Model FLOPs utilisation assumed: 35% compiled, 25% eager, just under what the d = 1024 Mano
# 2x6 point reached there (38.6% / 25.7%); small shapes are launch-bound and run below it.
GPU = "H200"
GPU_PEAK_FLOPS = 989e12
GPU_MEMORY_GIB = 140.0
ASSUMED_MFU = {True: 0.35, False: 0.25}  # by train.system.compile
# the loss's per-token working set per readout: bf16 logits, their float32 copy, the saved
# log-softmax and its gradient (2 + 4 + 4 + 4 bytes per vocabulary entry)
LOSS_BYTES_PER_LOGIT = 14
GIB = 2**30


# OUROBOROS on the Qwen2.5-3B shape (3.09B bf16 base), measured on one H200 (results/gpu,
# gpu_check.json part "ouroboros"): seconds and peak GiB per micro-batch of 4 x 2048 tokens, by depth.
OUROBOROS_3B_MEASURED = {4: (0.185, 32.03), 8: (0.248, 38.41), 16: (0.373, 51.15)}
OUROBOROS_3B_BASE_GIB = 3.09e9 * 2 / GIB


def ouroboros_cost(options) -> tuple[int, float, float]:
    """(tokens, hours, peak GiB) of the OUROBOROS stage of a point (`options`: its parsed
    [ouroboros] section), from the Qwen2.5-3B step times and memory measured on one H200: both
    linear in depth (least squares through the three measured depths), time and activation memory
    proportional to the tokens of a micro-batch. Assumes that shape; evaluation not counted."""
    t = options.train
    depths = sorted(OUROBOROS_3B_MEASURED)
    seconds, peak = (np.polyfit(depths, [OUROBOROS_3B_MEASURED[d][i] for d in depths], 1) for i in (0, 1))
    scale = t.micro_batch_size * t.seq_len / (4 * 2048)
    micro_batches = t.steps * t.grad_accum
    hours = micro_batches * scale * float(np.mean(np.polyval(seconds, t.depths))) / 3600
    peak_gib = OUROBOROS_3B_BASE_GIB + scale * (float(np.polyval(peak, max(t.depths))) - OUROBOROS_3B_BASE_GIB)
    return micro_batches * t.micro_batch_size * t.seq_len, hours, peak_gib


_PARAMS: dict[str, int] = {}  # unique_params by the config's JSON


def unique_params(model: ModelConfig) -> int:
    """Unique parameters of `model`, counted on a meta-device build once per distinct config (a gpu
    preset's points share a few shapes; building each is most of a dry run's time)."""
    key = json.dumps(serialize.to_dict(model), sort_keys=True)
    if key not in _PARAMS:
        with torch.device("meta"):
            _PARAMS[key] = count_params(LoopedGPT(model))
    return _PARAMS[key]


def peak_gib(
    model: ModelConfig,
    seq_len: int,
    tokens: int,
    *,
    all_steps: bool,
    masked: bool = False,
    dense: bool = False,
    checkpoint: bool = False,
) -> float:
    """Peak training memory of `model` on a micro-batch of `tokens` tokens in rows of seq_len: 18
    bytes per parameter (float32 weights, gradients, two AdamW moments; bf16 weight copies), the
    activations kept (and, with checkpoint, one step recomputed), the loss's logits."""
    kept, recomputed = activation_bytes_per_token(
        model, seq_len, all_steps=all_steps, masked=masked, dense=dense, checkpoint=checkpoint
    )
    params = unique_params(model)
    readouts = model.loops if all_steps else 1
    return (18 * params + (kept + recomputed + readouts * model.vocab_size * LOSS_BYTES_PER_LOGIT) * tokens) / GIB


def gpu_cost(point, *, exact: bool = False) -> dict[str, Any]:
    """Tokens, FLOPs, activation and peak memory and hours of a PointConfig on one GPU.

    Memory is `peak_gib` for one micro-batch (batch_size / grad_accum rows). With host rates in use
    (`use_host_rates`) the host's columns (`host_cost`: packing, checkpoints, evaluation) are
    beside them; its critical-path part (`stall_h`) is in gpu_h and gpu_h_shared, evaluation in gpu_h. Packed rows are
    counted with a dense attention (the H x S probabilities kept: the worst case of the kernel
    choice); the fused figure is printed beside it. Hours: training FLOPs (4/3 of them with
    checkpointing: one more forward) plus the forward-only gate stage, at ASSUMED_MFU of the peak.
    gpu_h_shared: the part of gpu_h that points of one trained model share (its training); an
    OUROBOROS stage is each point's own (`ouroboros_cost`; on a given checkpoint, all of it).
    exact: the hours unrounded (the dry run prints them to 0.01 h; benchmarks/cost_check.py times
    points of seconds).
    """
    ouroboros = getattr(point, "ouroboros", None) if "ouroboros" in point.stages else None
    if ouroboros is not None and ouroboros.source.base is not None:  # no synthlab model is trained
        tokens, hours, peak = ouroboros_cost(ouroboros)
        return {
            "tokens": tokens,
            "pflop": math.nan,
            "layer_mib": "-",
            "act_gib": "-",
            "peak_gib": round(peak, 1),
            "gpu_h": round(hours, 2),
            "gpu_h_shared": 0.0,
            "mfu": math.nan,
        }
    train, model = point.train, point.model
    steps, seq = positions(point)
    all_steps = train.loss != "last"
    pack = train.batch.pack if train.batch.pack is not None else point.spec.pack
    tokens = steps * train.batch.batch_size * seq
    per_token = flops_per_token(model, seq, all_steps=all_steps)
    flops = 3 * per_token * tokens
    work = flops * (4 / 3 if train.system.activation_checkpointing else 1)
    if "gate" in point.stages:
        work += per_token * point.gate.steps * train.batch.batch_size * seq
    micro = train.batch.batch_size // train.batch.grad_accum * seq  # tokens per micro-batch

    def act(checkpoint: bool, dense: bool) -> float:
        kept, recomputed = activation_bytes_per_token(
            model, seq, all_steps=all_steps, masked=pack, dense=dense and pack, checkpoint=checkpoint
        )
        return (kept + recomputed) * micro / GIB

    layer = {
        dense: layer_activation_bytes(model, seq, masked=pack, dense=dense) * micro / 2**20 for dense in (False, True)
    }
    mfu = calibrated_mfu(model, seq, all_steps=all_steps, compile=train.system.compile, packed=pack)
    peak = peak_gib(
        model,
        seq,
        micro,
        all_steps=all_steps,
        masked=pack,
        dense=pack,
        checkpoint=train.system.activation_checkpointing,
    )
    if _calibration.get("memory_measured_over_predicted"):
        peak *= max(1.0, _calibration["memory_measured_over_predicted"])
    shared = work / (mfu * peak_flops()) / 3600
    host = host_cost(point, shared, exact=exact) if _host_rates else {}
    shared += host.get("stall_h", 0.0)  # the host's part on the critical path
    own = host.get("eval_h", 0.0)  # evaluation runs on the GPU, once per point
    if ouroboros is not None:  # on the exported synthlab base
        tokens_own, hours_own, peak_own = ouroboros_cost(ouroboros)
        tokens, peak, own = tokens + tokens_own, max(peak, peak_own), own + hours_own
    return {
        **host,
        "tokens": tokens,
        "pflop": round(flops / 1e15, 1),
        "layer_mib": f"{layer[False]:.0f}/{layer[True]:.0f}" if pack else f"{layer[False]:.0f}",
        "act_gib": f"{act(False, pack):.1f}/{act(True, pack):.1f}",
        "peak_gib": round(peak, 1),
        "gpu_h": shared + own if exact else round(shared + own, 2),
        "gpu_h_shared": shared if exact else round(shared, 2),
        "mfu": mfu,
    }


# --- the host's share: packing, checkpoints, evaluation --------------------------------------
# Host rates are measured on the machine that runs the dry run (`host_rates`; the dry run passes
# them to `use_host_rates`): next-fit packing per example, writing a checkpoint (torch.save and its
# sha256, off the training thread) and the host copy of the training thread's snapshot, per byte.
STATE_BYTES_PER_PARAM = 12  # a checkpoint: float32 weights and AdamW's two moments
_host_rates: dict[str, float] = {}  # in use (read by the dry run's summary)


def host_rates(repeats: int = 3) -> dict[str, float]:
    """Seconds per packed example and per checkpoint byte (written; snapshot), measured here: the
    best of `repeats` tries (other work on the machine only slows a try down)."""
    n, size = 20_000, 32 * 2**20
    examples = Examples.from_lists([[1] * 25] * n, [1] * n)
    state = {"w": torch.zeros(size // 4)}
    best = {"pack_s_per_example": math.inf, "write_s_per_byte": math.inf, "snapshot_s_per_byte": math.inf}
    for _ in range(repeats):
        start = time.perf_counter()
        pack_rows(examples, np.random.default_rng(0).permutation(n), 512, 0)
        best["pack_s_per_example"] = min(best["pack_s_per_example"], (time.perf_counter() - start) / n)
        start = time.perf_counter()
        snapshot = {k: v.clone() for k, v in state.items()}
        best["snapshot_s_per_byte"] = min(best["snapshot_s_per_byte"], (time.perf_counter() - start) / size)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            torch.save(snapshot, f"{tmp}/c.pt")
            sha256_file(f"{tmp}/c.pt")
            best["write_s_per_byte"] = min(best["write_s_per_byte"], (time.perf_counter() - start) / size)
    return best


def use_host_rates(rates: dict[str, float] | None) -> None:
    """From now on `gpu_cost` adds the host's columns at these rates (None: none)."""
    _host_rates.clear()
    _host_rates.update(rates or {})


def host_cost(point, gpu_h: float, *, exact: bool = False) -> dict[str, Any]:
    """The host's work of a point next to `gpu_h` hours of training: packing every epoch and writing
    the checkpoints (both off the training thread now, so they cost GPU time only where they outlast
    it), the snapshots the training thread takes, and evaluation (every eval stage as one forward
    over the training records, at the same MFU: an estimate, not a measurement). Hours each;
    `stall_h` is the part on the critical path (snapshots, and packing beyond the GPU's epoch time)."""
    train, shape = point.train, point.spec.shape(point.data)
    steps, seq = positions(point)
    pack = train.batch.pack if train.batch.pack is not None else point.spec.pack
    rates = _host_rates
    params = unique_params(point.model)
    epochs = steps * train.batch.batch_size / rows_per_epoch(point, seq)
    pack_h = epochs * shape.train_records * rates["pack_s_per_example"] / 3600 if pack else 0.0
    every = (
        -(-steps // train.checkpoint.checkpoints) if train.checkpoint.checkpoints else train.checkpoint.checkpoint_every
    )
    count = -(-steps // every)
    state = STATE_BYTES_PER_PARAM * params
    write_h = count * state * rates["write_s_per_byte"] / 3600
    snapshot_h = count * state * rates["snapshot_s_per_byte"] / 3600
    stages = sum(s in point.stages for s in ("eval", "heldout", "generate", "capacity"))
    eval_flops = stages * shape.train_records * shape.tokens_per_record * flops_per_token(point.model, seq)
    mfu = calibrated_mfu(point.model, seq, all_steps=True, compile=train.system.compile, packed=pack)
    eval_h = eval_flops / (mfu * peak_flops()) / 3600
    stall_h = snapshot_h + max(0.0, pack_h - gpu_h) + max(0.0, write_h - gpu_h)
    hours = {"pack_h": pack_h, "ckpt_n": count, "ckpt_h": write_h, "eval_h": eval_h, "stall_h": stall_h}
    return {k: v if exact or k == "ckpt_n" else round(v, 3) for k, v in hours.items()}


# --- recalibration from the GPU check (benchmarks/gpu_calibrate.py -> cost_calibration.json) ------
_calibration: dict[str, Any] = {}


def load_calibration(path) -> dict[str, Any]:
    """The calibration file the GPU check writes (OUT/cost_calibration.json), checked: one measured
    on a GPU (a --dry-run's, measured on the CPU at tiny sizes, calibrates nothing)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise SynthlabError(f"--calibration {path}: cannot read it ({err})") from None
    if not isinstance(data, dict) or "compiled_mfu_packed" not in data:
        raise SynthlabError(f"--calibration {path}: not a cost_calibration.json of benchmarks/gpu_check.sh")
    if data.get("dry_run"):
        raise SynthlabError(f"--calibration {path}: written by a --dry-run on the CPU; run the check on a GPU")
    for key in ("compiled_mfu_packed", "eager_mfu_packed"):
        for kind, by_d in (data.get(key) or {}).items():
            parts = [v for v in by_d.values() if v is not None]
            if not all(isinstance(v, dict) and {"layers", "head"} <= set(v) for v in parts):
                raise SynthlabError(
                    f"--calibration {path}: {key}.{kind} holds one MFU per d, written before the check "
                    "measured the layers and the head apart; run the check again"
                )
    return data


def use_calibration(data: dict[str, Any] | None) -> None:
    """From now on `gpu_cost` uses these measurements (None: the assumed constants again)."""
    _calibration.clear()
    _calibration.update(data or {})


@contextlib.contextmanager
def measured(calibration: dict[str, Any] | None = None, host_rates: dict[str, float] | None = None) -> Iterator[None]:
    """Inside the block `gpu_cost` uses this calibration and these host rates (None: none); what was
    in use before comes back after it, so a dry run or a test leaves no costs behind in the process."""
    before = dict(_calibration), dict(_host_rates)
    use_calibration(calibration)
    use_host_rates(host_rates)
    try:
        yield
    finally:
        use_calibration(before[0])
        use_host_rates(before[1])


def peak_flops() -> float:
    """The device's peak FLOP/s the MFUs are fractions of: the calibration's (`peak_flops`: the
    device it was measured on, e.g. the CPU of benchmarks/cost_check.py), else the H200's."""
    return _calibration.get("peak_flops") or GPU_PEAK_FLOPS


def calibrated_mfu(model: ModelConfig, seq_len: int, *, all_steps: bool, compile: bool, packed: bool) -> float:
    """The MFU a point's training reaches. With a calibration in use and packed rows: each part of
    the model (`flops_per_token_parts`: the layers, and the head) at its own measured MFU on packed
    rows (compiled, or eager for an eager point when the calibration has `eager_mfu_packed`), at the
    nearest d (interpolated in d; the shape's attention kind), their FLOPs-weighted harmonic mean
    (a looped model spends more of its step in the layers than the plain model it was measured
    on), times the real trainer's share of a bare loop. Else ASSUMED_MFU."""
    key = "compiled_mfu_packed" if compile else "eager_mfu_packed"
    measured = {int(d): parts for d, parts in _calibration.get(key, {}).get(model.attention, {}).items() if parts}
    if not (packed and measured):
        return ASSUMED_MFU[compile]
    ds = sorted(measured)
    flops = flops_per_token_parts(model, seq_len, all_steps=all_steps)
    seconds = sum(n / float(np.interp(model.d_model, ds, [measured[d][part] for d in ds])) for part, n in flops.items())
    return sum(flops.values()) / seconds * (_calibration.get("trainer_vs_bare") or 1.0)


def part_mfus(steps: list[tuple[dict[str, int], float]], peak: float) -> dict[str, float]:
    """The MFU of each part (`flops_per_token_parts`: "layers", "head") from two measured training
    steps of models whose parts differ in proportion (e.g. one layer and six): each step's seconds
    is the sum over parts of its FLOPs over (MFU x peak), two equations in two unknowns. Where a
    part's time comes out at or below zero (lost in the noise of the other) the two cannot be told
    apart: both get the one rate that fits both steps best. `steps`: (FLOPs per part, seconds) of
    each step."""
    (first, t1), (second, t2) = steps
    parts = ("layers", "head")
    matrix = np.array([[first[p] for p in parts], [second[p] for p in parts]], dtype=float)
    try:
        layers, head = np.linalg.solve(matrix, [t1, t2])
    except np.linalg.LinAlgError:
        raise ValueError("the two steps have their parts in the same proportion: they cannot separate them") from None
    if min(layers, head) <= 0:  # one rate for both: the one that fits both steps best, through zero
        layers = head = float(np.dot(matrix.sum(axis=1), [t1, t2]) / np.dot(matrix.sum(axis=1), matrix.sum(axis=1)))
    return {"layers": float(1 / (layers * peak)), "head": float(1 / (head * peak))}
