"""Write a generated dataset to DIR, all or nothing.

DIR/meta.json   task, every parameter, seed, record counts, synthlab version, sha256 of each file
DIR/vocab.json  {"special_tokens": [...], "tokens": [...]} (tokens: the full list in id order)
DIR/*.jsonl     JSON Lines, UTF-8
DIR/*.json      task extras (e.g. reach's graph.json)

Everything is written into a temporary sibling folder and renamed to DIR at the end, so an error
or Ctrl-C never leaves a half-written dataset. Nothing here depends on time or the machine: the
same task, params and seed give byte-identical files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

import numpy as np

from synthlab_generators.common import SPECIAL_TOKENS, TaskError, TaskSpec


def _lab_version() -> str:
    """The installed synthlab distribution's version (this package ships inside it)."""
    try:
        return version("synthlab")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def check_writable(path: str | Path, what: str = "--out") -> None:
    """Fail early, with one line naming `path`, if files cannot be written at `path` (a file or a
    folder, existing or to be created with its parents); nothing is left behind.

    A probe file is created and removed in the folder that will receive them (the nearest existing
    one), so read-only file systems and missing permissions are caught, not only modes.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise TaskError(f"cannot write {what} {path}: {folder} is a file, not a folder")
    try:
        handle, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise TaskError(f"cannot write {what} {path}: {err.strerror or err}") from None


def check_out(
    out: Path, overwrite: bool, *, own: Callable[[Path], bool] | None = None, source: Path | None = None
) -> None:
    """Fail early (before any work) if the folder `out` cannot be (re)placed: never the working
    directory or a folder holding it (`.`, `..`), nor `source` (what the command reads) or a folder
    holding it, even with `overwrite`; a non-empty folder only with `overwrite` or when `own(out)`
    says it is this command's earlier output."""
    out = Path(out)
    where = out.resolve()
    if where == Path.cwd().resolve() or where in Path.cwd().resolve().parents:
        raise TaskError(f"--out {out} is the working directory or holds it: choose a new folder")
    if source is not None and (where == Path(source).resolve() or where in Path(source).resolve().parents):
        raise TaskError(f"--out {out} is {source} or holds it: choose a new folder")
    if out.exists() and not out.is_dir():
        raise TaskError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite and not (own is not None and own(out)):
        raise TaskError(f"--out {out} is not empty (pass --overwrite to replace it)")
    if out.is_dir():  # the temporary sibling goes beside it; moving it aside rewrites its '..'
        check_writable(out.parent)
    check_writable(out)


def _write_json(path: Path, obj: Any, indent: int | None = 1) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False, indent=indent, sort_keys=True) + "\n", encoding="utf-8")


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of a file's bytes (read in blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def make_temp_sibling(out: Path) -> Path:
    """A new hidden folder beside `out`, where `out`'s replacement is built."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the dataset folder should not be
        return tmp
    except OSError as err:
        raise TaskError(f"--out {out}: cannot write there ({err.strerror})") from None


def replace_dir(tmp: Path, out: Path) -> None:
    """Rename tmp -> out; an existing out (empty, or --overwrite) is removed only after."""
    old = None
    try:
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / "data")
        os.rename(tmp, out)
    except OSError as err:
        if old is not None and (old / "data").exists() and not out.exists():
            os.rename(old / "data", out)  # put the old folder back
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise TaskError(f"--out {out}: cannot replace it ({err.strerror or err})") from None
    if old is not None:
        shutil.rmtree(old)


def write_dataset(
    spec: TaskSpec,
    params: Any,
    seed: int,
    out: str | Path,
    overwrite: bool = False,
    progress: Callable[[int], Any] | None = None,
) -> Path:
    """Generate `spec` with `params` from `seed` and write it to `out`; returns the folder.

    progress: a factory, called with the number of records to write, of a display with
    update(records) and close() (the CLI passes synthlab.progress.Progress); none by default.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TaskError(f"--seed must be an integer >= 0 (got {seed!r})")
    out = Path(out)
    check_out(out, overwrite)
    tmp = make_temp_sibling(out)
    try:
        dataset = spec.generate(params, np.random.default_rng(seed))
        vocab = {"special_tokens": list(SPECIAL_TOKENS), "tokens": list(SPECIAL_TOKENS) + list(dataset.tokens)}
        if len(set(vocab["tokens"])) != len(vocab["tokens"]):
            raise AssertionError(f"{spec.name}: duplicate tokens in the vocabulary")
        _write_json(tmp / "vocab.json", vocab)
        bar = progress(sum(dataset.counts.get(Path(n).stem, 0) for n in dataset.files)) if progress else None
        for name, content in dataset.files.items():
            if name.endswith(".json"):
                _write_json(tmp / name, content, indent=None)  # data: one compact line
                continue
            with (tmp / name).open("w", encoding="utf-8", newline="\n") as fh:
                for chunk in content:
                    fh.write(chunk)
                    if bar is not None:
                        bar.update(chunk.count("\n"))
        if bar is not None:
            bar.close()
        files = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in sorted(tmp.iterdir())}
        meta = {
            "task": spec.name,
            "params": dataclasses.asdict(params),  # JSON below: tuples become lists
            "seed": int(seed),
            "counts": dataset.counts,
            "vocab_size": len(vocab["tokens"]),
            "synthlab_version": _lab_version(),
            "files": files,
            "info": dataset.extra,
        }
        _write_json(tmp / "meta.json", meta)
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
