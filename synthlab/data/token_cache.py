"""Arrays computed from a dataset once and kept beside it, in the dataset folder `synthlab gen`
wrote (e.g. the encoded training split: benchmarks/bench_encode_cache.py measures what it saves).

The cache is one `.npz` file (numpy's own format, read with allow_pickle=False) holding the
arrays and the key they were computed under (a JSON text: the sha256 of the source files' bytes
as they are now, the vocabulary, the encoding rules' version). A read finds the key it asks for or
computes the arrays again, so an edited or regenerated dataset, another vocabulary or a damaged
cache file never gives stale arrays. Where the folder cannot be written (read-only data) the
arrays are computed at every start and nothing is kept.
"""

from __future__ import annotations

import contextlib
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from synthlab.errors import SynthlabError
from synthlab.files import atomic_write

_KEY = "__key__"  # the array holding the key's JSON text


def cached_arrays(
    path: Path, key: dict[str, Any], compute: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The arrays `compute()` returns, read from the .npz at `path` when it was written under an
    equal `key` (JSON-able), else computed and written there (atomically; skipped where `path`'s
    folder cannot be written)."""
    text = json.dumps(key, sort_keys=True)
    try:
        with np.load(path, allow_pickle=False) as stored:
            if _KEY in stored.files and str(stored[_KEY]) == text:
                return {name: stored[name] for name in stored.files if name != _KEY}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # absent, unreadable or damaged: compute
        pass
    arrays = compute()
    with contextlib.suppress(SynthlabError):  # a read-only dataset: encoded at every start instead

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays, **{_KEY: np.array(text)})

        atomic_write(path, write)
    return arrays
