"""Data-parallel training across processes: `torchrun --nproc-per-node K -m synthlab train ...`.

torchrun starts K copies of the command and tells each its place through the environment
(`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`). `process_group` joins them
(gloo on CPU, NCCL on CUDA, one GPU per process); without torchrun it is one process and nothing
changes. Every process builds the same batcher and draws the same global batch; `share` gives
process r its contiguous slice of rows, so K processes together train on exactly the batch one
process would, and DDP averages their gradients. Only the main process (rank 0) writes files.
A SIGINT or SIGTERM reaching any process (`StopOnSignal`) stops all of them at one step (`stop_now`).
`shard` is the other way to run a model across processes, for one that does not fit a device:
PyTorch's FSDP (fully_shard) keeps 1/K of its parameters on each process.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from synthlab.data.datasets import Rows
from synthlab.errors import SynthlabError
from synthlab.files import die_with_parent


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """The process that writes the run's files."""
        return self.rank == 0


@contextlib.contextmanager
def process_group(device: torch.device) -> Iterator[tuple[World, torch.device]]:
    """(World, this process's device) for the duration of a run.

    Under torchrun with more than one process this joins the process group (and leaves it at the
    end), and the process ends when the one that started it does; on CUDA each process takes the
    GPU of its LOCAL_RANK. A group someone else started is used as it is. After an error the group is left to the process's exit: leaving it waits on
    the others, and one of them may be gone.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        yield World(), device
        return
    die_with_parent()  # a rank outlives no torchrun agent (kill -9 of the agent included)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    yield World(dist.get_rank(), dist.get_world_size()), device
    if started:
        gc.collect()  # a DDP wrapper freed later, by chance, would wait on the others where they are not
        dist.destroy_process_group()


def reporting() -> bool:
    """Whether this process reports on the command line: the only one, or rank 0 of those torchrun
    started (the others would print the same lines again)."""
    return os.environ.get("RANK", "0") == "0"


def lost_peer(err: BaseException) -> bool:
    """Whether an error is a collective failing because another process died or stopped
    answering (NCCL raises DistError; gloo a RuntimeError from its transport)."""
    return isinstance(err, dist.DistError) or (isinstance(err, RuntimeError) and "gloo" in str(err))


@contextlib.contextmanager
def peers_lost_as_error(world: World, where) -> Iterator[None]:
    """A collective failing because another process died (`lost_peer`) becomes one SynthlabError
    line: "process R of K lost contact with the others " + where() (called then: e.g. the step)."""
    try:
        yield
    except RuntimeError as err:
        if not lost_peer(err):
            raise
        raise SynthlabError(f"process {world.rank} of {world.size} lost contact with the others {where()}") from None


def check_split(batch_size: int, world: World, grad_accum: int) -> None:
    """The batch must split evenly into processes x micro-batches."""
    if batch_size % (world.size * grad_accum):
        raise SynthlabError(
            f"train.batch.batch_size {batch_size} does not split into {world.size} processes x "
            f"{grad_accum} micro-batches (train.batch.grad_accum); make it a multiple of "
            f"{world.size * grad_accum}"
        )


def share(rows: Rows, index: int, parts: int) -> Rows:
    """Part `index` of `parts` equal contiguous slices of the rows (a process's share of a batch,
    or a micro-batch of it)."""
    n = len(rows) // parts
    return rows.take(np.arange(index * n, (index + 1) * n))


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """The model as the processes run it: DDP across processes (it averages the gradients in
    backward), the model itself in one process. Checkpoints keep the unwrapped model's state.
    Every parameter that requires a gradient must get one in each step (the trainer freezes
    what its objective does not reach).
    """
    if world.size == 1:
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def no_sync(wrapped: torch.nn.Module, sync: bool):
    """Skip the gradient all-reduce in backward unless `sync` (the last micro-batch of a step)."""
    if sync or not hasattr(wrapped, "no_sync"):
        return contextlib.nullcontext()
    return wrapped.no_sync()


def sum_over(world: World, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor summed over all processes (the tensors themselves in one process)."""
    if world.size == 1:
        return list(tensors)
    out = []
    for t in tensors:
        t = t.detach().clone()
        dist.all_reduce(t)
        out.append(t)
    return out


def average_gradients(world: World, params: list[torch.nn.Parameter]) -> None:
    """Each parameter's gradient replaced by its mean over the processes, in one all-reduce (the
    manual form of what DDP does in backward, for a model whose few trainable parameters sit on
    a large frozen one: DDP would first broadcast every frozen weight)."""
    if world.size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world.size
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def check_shardable(world: World, device: torch.device) -> None:
    """FSDP needs several processes and a device its collectives run on (gloo: CPU, NCCL: CUDA)."""
    if world.size == 1:
        raise SynthlabError(
            "FSDP shards the model across processes and this is the only one: start the command "
            "with torchrun --nproc-per-node K (K >= 2)"
        )
    if device.type not in ("cpu", "cuda"):
        raise SynthlabError(f"FSDP runs on cpu (gloo) or cuda (NCCL), not on {device.type}")


def shard(
    model: torch.nn.Module,
    units: list[torch.nn.Module],
    keep: list[torch.nn.Parameter],
    world: World,
    device: torch.device,
) -> None:
    """Shard `model` in place with PyTorch's FSDP (`fully_shard`) over the processes: each module
    of `units` (e.g. the decoder layers) one group, the rest of `model` the root group; every
    process keeps 1/K of each group's parameters on `device` and gathers a group's whole weights
    for its forward (and backward) only. `model` must be called as a whole (its forward first).
    The parameters in `keep` stay whole on every process (moved to `device`), their gradients
    left to the caller (`average_gradients`): the few trainable ones on a large frozen model.
    """
    check_shardable(world, device)
    mesh = init_device_mesh(device.type, (world.size,))
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh, ignored_params=set(keep))
    for p in keep:
        p.data = p.data.to(device)


def fill_from_rank0(
    module: torch.nn.Module,
    full: dict[str, torch.Tensor],
    buffers: dict[str, torch.Tensor],
    world: World,
    device: torch.device,
) -> None:
    """Give `module`, built on the meta device and sharded by `shard`, its weights from rank 0: rank 0
    passes the whole state dict `full` and the module's `buffers` (host tensors), the others pass
    {}; each parameter is broadcast in turn and every process keeps its own shard, so no process
    but rank 0 ever holds the whole module, and rank 0 only in host memory (read once per run).
    Buffers (the non-persistent rotary tables are in no state dict) are broadcast whole."""
    module.to_empty(device=device)
    set_model_state_dict(
        module, full if world.main else {}, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    for name, buffer in list(module.named_buffers()):
        value = buffers[name].to(device) if world.main else torch.empty_like(buffer, device=device)
        dist.broadcast(value, 0)
        owner, _, leaf = name.rpartition(".")
        module.get_submodule(owner)._buffers[leaf] = value


def most_held(world: World, params, device: torch.device) -> int:
    """The largest number of parameter elements of `params` that one process holds (of a sharded
    parameter, its own shard)."""
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
    if world.size == 1:
        return local
    t = torch.tensor([local], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


# Steps between the processes' polls of a stop signal: a poll is an all-reduce and a host sync, which
# every step would cost the GPUs their lead over the host; a stop then waits up to this many steps.
STOP_POLL = 16


class StopOnSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks after each step (then checkpoints and exits)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def stop_now(world: World, signalled: bool, step: int, device: torch.device) -> bool:
    """Whether the run stops before `step` (a signal reached this process: `signalled`): in one
    process at once; across processes every STOP_POLL steps, all of them at the same step."""
    if world.size == 1:
        return signalled
    return step % STOP_POLL == 0 and any_of(world, signalled, device)


def any_of(world: World, flag: bool, device: torch.device) -> bool:
    """True on every process when `flag` is true on any (e.g. a stop signal reached one of them)."""
    if world.size == 1:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def device_rng_state(device: torch.device) -> torch.Tensor | None:
    """The RNG state of this process's own device (None on the CPU): one state, so that a run
    resumes on any number of GPUs (the states of every visible GPU would not fit a node with fewer)."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_device_rng_state(state, device: torch.device) -> None:
    """Restore `device_rng_state` on this process's device; a checkpoint that kept a list, one state
    per visible GPU, gives the state of the GPU with this device's index (else its first)."""
    if device.type != "cuda" or state is None:
        return
    if isinstance(state, (list, tuple)):
        state = state[device.index or 0] if (device.index or 0) < len(state) else state[0]
    torch.cuda.set_rng_state(state, device)
