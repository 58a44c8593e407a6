"""Atomic file writes: a reader (or a process killed mid-write) sees the old file or the new one,
never half of one. Every module that writes results, configs, checkpoints or figures uses these.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call `write(tmp)` on a hidden temporary sibling, fsync it, then rename it onto `path`.

    The temporary name keeps `path`'s suffix (matplotlib picks the format from it) and carries the
    process id, so concurrent writers of the same file never share a temporary.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
