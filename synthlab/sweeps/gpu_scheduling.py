"""Which GPUs a sweep's points run on: a pure bookkeeping of GPU memory, no torch.

A local sweep on a node with G GPUs gives each worker its own GPU set through
`CUDA_VISIBLE_DEVICES` (set in a fresh process before CUDA starts): a point trained in its worker
takes one GPU, a point trained under torchrun with K processes takes K distinct GPUs (torchrun's
LOCAL_RANK 0..K-1 then index the set; no other point runs on them: a shared GPU would slow one rank
and with it the whole job). Points whose estimated peak memory (the runner's optional
`gpu_memory_gib(point)`, `synthlab.sweeps.cost.peak_gib` for the lab's runner) fits beside the others
share a GPU; a point with no estimate takes a GPU to itself. `Gpus` is the ledger the driver keeps;
Ray gets the same estimate as a fractional GPU request (`ray_gpus`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import multiprocessing
import os
from dataclasses import dataclass, field

from synthlab.errors import SynthlabError

# Of a GPU's memory, the part the estimates may fill: the rest is the CUDA context (about 0.5 GiB a
# process), the allocator's fragmentation and the estimate's error (within 4% of measured activations).
USABLE = 0.9
# Ray's fractional requests are rounded up to this step (Ray packs fractions of 1/16 exactly).
RAY_STEP = 1 / 16
# A Ray cluster's GPU memory where the driver's machine has no GPU to measure (the 80 GiB of an
# A100 / H100: a fraction asked of a larger GPU is then on the safe side).
RAY_GPU_GIB = 80.0


@dataclass(frozen=True)
class Demand:
    """What a point needs: `gpus` distinct GPUs, each with `gib` of memory (None: a whole GPU)."""

    gpus: int = 1
    gib: float | None = None


@dataclass
class Gpus:
    """The free memory of each of a node's GPUs (GiB): `take` a demand's GPUs, `give` them back."""

    total_gib: list[float]
    free_gib: list[float] = field(default_factory=list)
    whole: set[int] = field(default_factory=set)  # GPUs a point holds alone (see `alone`)

    def __post_init__(self) -> None:
        self.free_gib = [USABLE * t for t in self.total_gib] if not self.free_gib else list(self.free_gib)

    def fits(self, demand: Demand) -> bool:
        """Whether the demand could ever be placed on this node (on its empty GPUs)."""
        if demand.gpus > len(self.total_gib):
            return False
        need = demand.gib if demand.gib is not None else 0.0
        return sum(USABLE * t >= need for t in self.total_gib) >= demand.gpus

    @staticmethod
    def alone(demand: Demand) -> bool:
        """Whether the demand holds its GPUs alone: a point with no estimate, a torchrun point."""
        return demand.gib is None or demand.gpus > 1

    def take(self, demand: Demand) -> tuple[int, ...] | None:
        """The GPUs the demand gets now (the fullest that fit first, so that large points find empty
        ones), their memory marked as used; None when they are not free now."""
        idle = [i for i in range(len(self.total_gib)) if i not in self.whole]
        if self.alone(demand):
            empty = [i for i in idle if math.isclose(self.free_gib[i], USABLE * self.total_gib[i])]
            chosen = empty[: demand.gpus]
        else:
            room = sorted((i for i in idle if self.free_gib[i] >= demand.gib), key=lambda i: (self.free_gib[i], i))
            chosen = room[: demand.gpus]
        if len(chosen) < demand.gpus:
            return None
        for i in chosen:
            if self.alone(demand):
                self.whole.add(i)
            else:
                self.free_gib[i] -= demand.gib
        return tuple(sorted(chosen))

    def give(self, gpus: tuple[int, ...], demand: Demand) -> None:
        """Return what `take` gave for `demand`."""
        for i in gpus:
            if self.alone(demand):
                self.whole.discard(i)
            else:
                self.free_gib[i] = min(USABLE * self.total_gib[i], self.free_gib[i] + demand.gib)


def visible(gpus: tuple[int, ...], parent: str | None = None) -> str:
    """The CUDA_VISIBLE_DEVICES of a worker given node GPUs `gpus` (indices into the parent's own
    CUDA_VISIBLE_DEVICES when it has one: a sweep started inside a Slurm allocation keeps to it)."""
    names = [n.strip() for n in parent.split(",")] if parent else None
    return ",".join(names[i] if names else str(i) for i in gpus)


def default_jobs(n_gpus: int) -> int:
    """Parallel workers when --jobs is not given: one per GPU, else one."""
    return max(1, n_gpus)


def idle_cores() -> tuple[int, float]:
    """(this process's usable cores, the 1-minute load average) of this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores, os.getloadavg()[0]


def default_threads(processes: int = 1) -> tuple[int, str]:
    """Torch threads per process when none are asked, for `processes` processes starting now on
    this machine: its idle cores (usable cores less the load average, rounded down) shared among them,
    at least one, so a busy machine gets one thread a process (threads waiting for busy cores made
    a small model 26x slower than one thread). Also the line that says why."""
    cores, load = idle_cores()
    threads = max(1, int(cores - load) // max(1, processes))
    why = f"{threads} torch thread{'s' * (threads > 1)} per process: load average {load:.1f} on {cores} cores"
    return threads, why + (f", shared by {processes} processes" if processes > 1 else "")


def ray_gpus(demand: Demand, cluster_gpus: float, gpu_gib: float) -> float:
    """What a point asks Ray for: 0 on a cluster without GPUs (Ray then hides them: the point trains
    on the CPU), K whole GPUs for a torchrun point of K processes, else the share of one GPU its
    estimated peak memory needs (rounded up to RAY_STEP; a whole one without an estimate)."""
    if cluster_gpus <= 0:
        return 0
    if demand.gpus > 1 or demand.gib is None:
        return demand.gpus
    return min(1.0, math.ceil(demand.gib / (USABLE * gpu_gib) / RAY_STEP) * RAY_STEP)


def ray_resources(unit, cluster_gpus: float, gpu_gib: float = RAY_GPU_GIB) -> dict[str, float]:
    """What one sweep unit (`synthlab.sweeps.executor.Unit`) asks Ray for: its CPU threads, and `ray_gpus`
    (a task that asks for no GPU gets CUDA_VISIBLE_DEVICES="" from Ray and would train on the
    CPU); a point trained under torchrun with K processes asks K GPUs and K times the CPUs."""
    processes = max(1, unit.nproc)
    return {"num_cpus": max(1, unit.threads) * processes, "num_gpus": ray_gpus(unit.demand, cluster_gpus, gpu_gib)}


def local_gpus() -> list[float]:
    """Total memory (GiB) of each GPU this process sees; [] without CUDA. torch is imported here
    only: the driver's callers without GPUs never pay for it."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return []
    import torch  # the CLI imports this module at its start (`default_threads`)

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(torch.cuda.device_count())]


def run_placed(items: list, demands: list[Demand], gpus: Gpus, jobs: int, start, on_done) -> None:
    """Run every item with at most `jobs` at once, each started (`start(item, its GPUs)` -> a
    concurrent.futures Future) when its demand fits what the running ones leave free; in order,
    a later item that fits passing one that waits for room. `on_done(result)` gets each result as
    it comes. A demand no GPU of the node can ever meet is a SynthlabError before anything starts.
    """
    for demand in demands:
        if not gpus.fits(demand):
            what = f"{demand.gpus} GPU(s)" + (f" of {demand.gib:.1f} GiB" if demand.gib is not None else "")
            raise SynthlabError(
                f"a point needs {what} and this node has {len(gpus.total_gib)} of "
                f"{', '.join(f'{t:.0f}' for t in gpus.total_gib)} GiB ({USABLE:.0%} usable)"
            )
    pending = list(zip(items, demands))
    running: dict = {}
    while pending or running:
        for entry in list(pending):
            if len(running) >= jobs:
                break
            got = gpus.take(entry[1])
            if got is not None:
                running[start(entry[0], got)] = (got, entry[1])
                pending.remove(entry)
        done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
        for future in done:
            gpus.give(*running.pop(future))
            on_done(future.result())


def run_on_gpus(units: list, gpus_gib: list[float], jobs: int, work, on_done) -> None:
    """`work(unit)` of each sweep unit (a dataclass with `demand` and `cuda_visible`) in a fresh
    spawn process of its own, its `cuda_visible` set to the GPUs `run_placed` gives it (a process
    per unit: CUDA_VISIBLE_DEVICES only counts before CUDA starts in a process)."""
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")

    def start(unit, got: tuple[int, ...]):
        pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        future = pool.submit(work, dataclasses.replace(unit, cuda_visible=visible(got, parent)))
        pool.shutdown(wait=False)
        return future

    run_placed(units, [u.demand for u in units], Gpus(list(gpus_gib)), jobs, start, on_done)


def run_on_ray(units: list, address: str | None, work, on_done) -> None:
    """`work(unit)` of each sweep unit as a Ray task asking `ray_resources` (of the driver's GPU
    memory, else RAY_GPU_GIB); `on_done(result)` as each finishes."""
    import ray  # an optional extra (synthlab[ray]): only a sweep with --executor ray needs it

    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    remote = ray.remote(work)
    gpus = ray.cluster_resources().get("GPU", 0)
    gib = min(local_gpus() or [RAY_GPU_GIB])
    pending = [remote.options(**ray_resources(unit, gpus, gib)).remote(unit) for unit in units]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        on_done(ray.get(ready[0]))
