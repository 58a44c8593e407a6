"""Atomic file writes: a reader (or a process killed mid-write) sees the old file or the new one,
never half of one. Every module that writes results, configs, checkpoints or figures uses these.
Also: file locks (`filelock`), folders built once under a content-hash name (`cached_dir`),
`check_writable`, which commands call on their outputs before they start any work, and
`die_with_parent` for worker processes (which write into these folders).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from synthlab.errors import SynthlabError, from_tasks
from synthlab.serialize import content_hash
from synthlab_generators import writer
from synthlab_generators.writer import sha256_file

__all__ = [
    "as_new_file",
    "atomic_write",
    "atomic_write_text",
    "cached_dir",
    "check_out",
    "check_writable",
    "die_with_parent",
    "file_lock",
    "folder_lock",
    "make_temp_sibling",
    "new_file_mode",
    "replace_dir",
    "sha256_file",
    "warn",
]


def _lab(task_function: Callable) -> Callable:
    """A function of the generators' writer (one implementation, shared) raising SynthlabError."""

    def function(*args, **kwargs):
        with from_tasks():
            return task_function(*args, **kwargs)

    function.__name__, function.__doc__ = task_function.__name__, task_function.__doc__
    return function


check_writable = _lab(writer.check_writable)
make_temp_sibling, replace_dir = _lab(writer.make_temp_sibling), _lab(writer.replace_dir)


# What marks a folder as another command's output: (file, keys its JSON holds, what it is).
_OUTPUTS = (
    ("config.json", {"model", "train"}, "a training run"),
    ("run.json", {"base", "corpus", "ouroboros", "train", "variants"}, "an OUROBOROS training run"),
    ("summary.json", {"trainable_params", "split"}, "an OUROBOROS build"),
    ("sweep.json", set(), "a sweep"),
    ("meta.json", set(), "a dataset"),
)


def lab_output(folder: Path) -> str | None:
    """What lab command's output `folder` holds (`a training run`, `a sweep`, ...), None for none."""
    for name, keys, what in _OUTPUTS:
        try:
            found = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and keys <= set(found):
            return what
    return None


def check_out(
    out: Path,
    overwrite: bool,
    *,
    own: Callable[[Path], bool] | None = None,
    source: Path | None = None,
    kind: str | None = None,
) -> None:
    """Fail early (before any work) if the folder `out` cannot be (re)placed: the generators' rule
    (never the working directory or `source`; a non-empty folder only with `overwrite` or when
    `own(out)` says it is this command's earlier output), and never another command's output
    (`lab_output`), even with `overwrite`: only output of the command's own `kind` (`lab_output`'s
    words, "a dataset") may be replaced, and that with `overwrite`."""
    out = Path(out)
    if out.is_dir() and not (own is not None and own(out)):
        other = lab_output(out)
        if other is not None and other != kind:
            raise SynthlabError(f"--out {out} holds {other}, not this command's output: choose a new folder")
    _lab(writer.check_out)(out, overwrite, own=own, source=source)


def warn(message: str) -> None:
    """One `warning: ...` line on stderr (a damaged file skipped, a fallback taken)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def new_file_mode() -> int:
    """The mode open() gives a new file: 0o666 less the process umask (0o644 under umask 022), read
    without changing the umask where /proc shows it (changing it is process-wide, threads see it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def as_new_file(path: str | Path) -> None:
    """Give `path` the mode of a newly created file. Writers that go through their own temporary file
    (safetensors) leave it 0600, which collaborators on a shared machine cannot read; nothing the
    lab writes is secret."""
    os.chmod(path, new_file_mode())


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call `write(tmp)` on a hidden temporary sibling, fsync it, then rename it onto `path` with the
    mode of a new file (`as_new_file`).

    The temporary name keeps `path`'s suffix (matplotlib picks the format from it) and carries the
    process id, so concurrent writers of the same file never share a temporary.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        as_new_file(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):  # no space left, no permission: one line naming the real file
            raise SynthlabError(f"cannot write {path}: {err.strerror or err}") from None
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path`, waited for (released by the OS if its holder dies, kill -9 included)."""
    # filelock imports asyncio: about 25 ms of the CLI's start (`python -X importtime`), which loads this module
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path):
        yield


@contextlib.contextmanager
def folder_lock(folder: Path, what: str, hold: bool = True) -> Iterator[None]:
    """Hold `folder`'s lock while the block runs (with `hold`), without waiting for it: a folder
    another process holds is a SynthlabError naming that process. Once held, temporary files a
    killed writer left in the folder (`.NAME.PID.tmp...`, see `atomic_write`) are removed."""
    from filelock import FileLock, Timeout

    if not hold:
        yield
        return
    lock, pid_file = FileLock(folder / ".lock"), folder / ".lock.pid"
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = pid_file.read_text().strip() if pid_file.is_file() else "?"
        raise SynthlabError(f"{folder} is in use by PID {holder} ({what}); wait for it or stop it") from None
    try:
        for stale in folder.glob(".*.tmp*"):
            if stale.is_file() and _stale_temporary(stale.name):
                stale.unlink(missing_ok=True)
        atomic_write_text(pid_file, f"{os.getpid()}\n")
        yield
    finally:
        pid_file.unlink(missing_ok=True)
        lock.release()


_TEMPORARY = re.compile(r"\.[^/]+\.(\d+)\.tmp(\.[^./]*)?")  # atomic_write's: .STEM.PID.tmp[.SUFFIX]


def _stale_temporary(name: str) -> bool:
    """Whether `name` is a temporary file of `atomic_write` whose writer is gone: the exact pattern
    and a process id no process has now (a user's `.notes.tmp.txt` is never one)."""
    match = _TEMPORARY.fullmatch(name)
    if match is None:
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False
    return False


def die_with_parent() -> None:
    """End this process when its parent ends (a sweep's worker when the driver is killed, kill -9
    included): Linux's parent-death signal, elsewhere a thread that watches the parent's pid."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it ended before the call
            os._exit(1)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def cached_dir(cache_dir: Path, key: dict[str, Any], build: Callable[[Path], None], prefix: str = "") -> Path:
    """`cache_dir/<prefix><hash of key>`, built once by `build(tmp_dir)` and renamed into place.

    Concurrent callers wait on a lock and then reuse the finished folder; a build killed midway
    leaves only a temporary folder, which the next builder deletes.
    """
    path = Path(cache_dir) / f"{prefix}{content_hash(key)}"
    if path.is_dir():
        return path
    with file_lock(path.with_name(f".{path.name}.lock")):
        if path.is_dir():
            return path
        tmp = path.with_name(f".{path.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        os.replace(tmp, path)
    return path
