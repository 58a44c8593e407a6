"""Checkpoints off the training thread, at a cadence that does not grow with the run.

A checkpoint is written in three parts: a snapshot of the training state copied to host memory
on the training thread (the next step changes the weights and optimizer moments in place, so
the writer must never read them), then `torch.save`, fsync, sha256 and the rename into place in
a background thread while training goes on. One write is in flight at a time: the next
snapshot first waits for it, so host memory holds at most one copy of the state. An error of
the writer is raised on the training thread at the next checkpoint or at `close`.

How often: every `checkpoint_every` steps, or with `checkpoints` K, K checkpoints evenly spaced
over the run (a 200,000-step run with K = 20 writes one every 10,000 steps, where every 200
steps would write 1,000 of them).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import torch


def every(total_steps: int, checkpoint_every: int, checkpoints: int = 0) -> int:
    """Steps between checkpoints: checkpoint_every, or with `checkpoints` K the run's steps over K."""
    if checkpoints:
        return max(1, math.ceil(total_steps / checkpoints))
    return checkpoint_every


def to_host(obj: Any) -> Any:
    """A copy of a state (nested dicts, lists, tuples of tensors and plain values) whose tensors are
    new host tensors: nothing the training thread changes afterwards reaches it."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(v) for v in obj)
    return obj


class Writer:
    """Writes states with `write(state)` in a background thread, one at a time (see the module)."""

    def __init__(self, write: Callable[[dict[str, Any]], None]):
        self._write = write
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, state: dict[str, Any]) -> None:
        """Snapshot `state` now and write it in the background."""
        self.wait()
        snapshot = to_host(state)
        self._thread = threading.Thread(target=self._run, args=(snapshot,), name="checkpoint-writer")
        self._thread.start()

    def _run(self, snapshot: dict[str, Any]) -> None:
        try:
            self._write(snapshot)
        except BaseException as err:  # raised on the training thread by wait()
            self._error = err

    def wait(self) -> None:
        """Block until the write in flight is on disk; raise its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    close = wait

    def settle(self) -> None:
        """Let the write in flight finish, its error dropped: for a run already stopping on an
        error of its own (which is the one to report), so that nothing writes into the folder after."""
        if self._thread is not None:
            self._thread.join()
            self._thread, self._error = None, None
