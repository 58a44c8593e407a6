"""Local text corpora for the Qwen2 system: read, tokenise, pack into fixed-length sequences, or lay
out one document per row (padded with PAD, which is never a target)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from synthlab.errors import SynthlabError

PAD = -1  # padding of per-document rows: read as token 0 by the system, never a target of the loss


def _read_text(path: Path) -> str:
    """`path` as UTF-8 text; bytes that are not (a binary file, another encoding) are a
    SynthlabError naming the line."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = err.start
    else:
        bad = data.find(b"\0")
        if bad < 0:
            return text
    line = data[:bad].count(b"\n") + 1
    raise SynthlabError(f"corpus: {path} line {line} is not UTF-8 text (byte {bad + 1}; a binary file?)")


def read_texts(path: str | Path, text_field: str = "text") -> list[str]:
    """Documents of a corpus file: .txt (blank-line separated), .jsonl (one object a line, field
    `text_field`) or .parquet (column `text_field`)."""
    path = Path(path)
    if not path.is_file():
        raise SynthlabError(f"corpus: file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".txt", ".text", ".md"):
        docs = [block.strip() for block in _read_text(path).split("\n\n")]
    elif suffix in (".jsonl", ".json"):
        docs = []
        for number, line in enumerate(_read_text(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise SynthlabError(f"corpus: {path} line {number} is not JSON: {err}") from None
            if not isinstance(record, dict) or text_field not in record:
                raise SynthlabError(f"corpus: {path} line {number} has no '{text_field}' field")
            if not isinstance(record[text_field], str):
                raise SynthlabError(f"corpus: {path} line {number}: '{text_field}' is not a string")
            docs.append(record[text_field])
    elif suffix == ".parquet":
        # pandas: only for a Parquet corpus (the package loads this module, a sweep's workers too)
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except ImportError:
            raise SynthlabError(f"corpus: reading {path} needs a Parquet engine (pip install pyarrow)") from None
        if text_field not in frame.columns:
            raise SynthlabError(f"corpus: {path} has no column '{text_field}' (columns: {list(frame.columns)})")
        docs = frame[text_field].astype(str).tolist()
    else:
        raise SynthlabError(f"corpus: unsupported file type '{suffix}' (use .txt, .jsonl or .parquet)")
    docs = [d for d in docs if d]
    if not docs:
        raise SynthlabError(f"corpus: {path} holds no text")
    return docs


def pack(docs: list[str], tokenizer, seq_len: int, max_sequences: int | None = None) -> torch.Tensor:
    """(N, seq_len) token ids: documents tokenised, each followed by EOS (when the tokenizer has
    one), concatenated and cut into consecutive windows; the incomplete tail is dropped."""
    if seq_len < 2:
        raise SynthlabError(f"seq_len must be >= 2 (one shift needs two tokens), got {seq_len}")
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    stream: list[int] = []
    budget = None if max_sequences is None else max_sequences * seq_len
    for ids in tokenizer(docs, add_special_tokens=False)["input_ids"]:
        stream.extend(ids + eos)
        if budget is not None and len(stream) >= budget:
            break
    n = len(stream) // seq_len
    if max_sequences is not None:
        n = min(n, max_sequences)
    if n == 0:
        raise SynthlabError(f"corpus: {len(stream)} tokens is less than one sequence of seq_len {seq_len}")
    return torch.tensor(stream[: n * seq_len], dtype=torch.long).view(n, seq_len)


def documents(docs: list[str], tokenizer, seq_len: int, max_sequences: int | None = None) -> torch.Tensor:
    """(N, seq_len) token ids, one document per row, as a synthlab base is trained (no attention
    across documents): BOS (when the tokenizer has one), the document, EOS (when it has one), cut
    at seq_len, then PAD."""
    if seq_len < 2:
        raise SynthlabError(f"seq_len must be >= 2 (one shift needs two tokens), got {seq_len}")
    docs = docs[:max_sequences]
    rows = torch.full((len(docs), seq_len), PAD, dtype=torch.long)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for row, ids in zip(rows, tokenizer(docs, add_special_tokens=False)["input_ids"]):
        ids = (bos + ids + eos)[:seq_len]
        row[: len(ids)] = torch.tensor(ids)
    return rows


def split_heldout(sequences: torch.Tensor, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, heldout): the LAST `fraction` of the packed sequences is held out, so no held-out
    window shares tokens with a training window (at least one sequence each side)."""
    n_heldout = max(1, round(len(sequences) * fraction))
    if n_heldout >= len(sequences):
        raise SynthlabError(f"corpus: {len(sequences)} sequences is too few to hold out {fraction:.0%}")
    return sequences[:-n_heldout], sequences[-n_heldout:]
