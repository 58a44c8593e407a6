"""The model card (README.md) of an exported run: what the model was trained on, how, and how it
was evaluated, all read from the run folder (config.json, summary.json, eval/*.json) and the
dataset's meta.json; nothing is typed in by hand, and a missing part is said to be missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from synthlab import serialize
from synthlab.training.configs import flat_train
from synthlab.training.run_folders import RunConfig

_FRONT_MATTER = """---
library_name: transformers
pipeline_tag: text-generation
tags: [synthlab, qwen2, synthetic-data]
---
"""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _block(data: dict[str, Any]) -> str:
    return "```json\n" + json.dumps(data, indent=2, default=str) + "\n```\n"


def _evaluation(run_dir: Path) -> str:
    files = sorted((run_dir / "eval").glob("*.json")) if (run_dir / "eval").is_dir() else []
    results = [(p, r) for p in files if (r := _read_json(p)) is not None]
    if not results:
        return (
            "Not evaluated on a test split when exported (`synthlab eval RUN_DIR` scores the answers of "
            "the dataset's test.jsonl and writes RUN_DIR/eval/*.json).\n"
        )
    lines = [
        "`synthlab eval` scored the answers of the dataset's test split, teacher-forced: an answer is right "
        "when the most likely token is the answer's at every answer position; the loss is summed over the "
        "answer tokens.\n",
        "| file | examples | accuracy | mean answer loss, nats (last recurrent step) |",
        "|---|---|---|---|",
    ]
    for path, r in results:
        loss = r.get("answer_loss_per_step") or [float("nan")]
        lines.append(
            f"| eval/{path.name} | {r.get('n_examples', '?')} | {r.get('accuracy', float('nan')):.4f} "
            f"| {loss[-1]:.4f} |"
        )
    return "\n".join(lines) + "\n"


def model_card(
    run_dir: str | Path, run: RunConfig, derived: dict[str, Any], data_dir: str | Path, remote: bool = False
) -> str:
    """README.md text for the export of the run in `run_dir` trained on the dataset `data_dir`
    (`remote`: exported with the lab's model code, `synthlab export --format remote`)."""
    exported, trust = (
        ("with its own model code (remote code)", ", trust_remote_code=True")
        if remote
        else ("as a Qwen2ForCausalLM", "")
    )
    run_dir, data_dir = Path(run_dir), Path(data_dir)
    meta = _read_json(data_dir / "meta.json") or {}
    summary = _read_json(run_dir / "summary.json")
    task = run.train.task or meta.get("task", "?")
    dataset = {key: meta[key] for key in ("task", "seed", "params", "counts", "vocab_size") if key in meta}
    final = (
        "Final logged training record (summary.json):\n\n" + _block(summary)
        if summary
        else "The run has no summary.json (it was interrupted); the weights are its last checkpoint's.\n"
    )
    return "\n".join(
        [
            _FRONT_MATTER,
            f"# synthlab {task} model\n",
            f"A {run.model.n_layers}-layer, d_model {run.model.d_model} language model trained from scratch by synthlab "
            f"on its synthetic `{task}` task, exported {exported} with the task's word vocabulary "
            f"({run.model.vocab_size} tokens).\n",
            "## Use\n",
            "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"tok = AutoTokenizer.from_pretrained(FOLDER)\nmodel = AutoModelForCausalLM.from_pretrained(FOLDER{trust})\n"
            "ids = tok(PROMPT, return_tensors='pt').input_ids  # PROMPT as in the dataset, '<bos> ... <ans>'\n```\n",
            "Every training sequence starts with `<bos>`; the tokenizer reads whitespace-separated words of the "
            "vocabulary, each written with the space before it, so a text that does not start with `<bos>` "
            "must start with a space (a bare first word is dropped). `synthlab_vocab.json` is the dataset's "
            "vocabulary as synthlab reads it.\n",
            "## Task and training data\n",
            f"Dataset folder `{data_dir}` (its meta.json):\n",
            _block(dataset),
            f"sha256 of the dataset files at training start: {'recorded in config.json' if derived.get('data_sha256') else 'not recorded'}.\n",
            "## Model configuration\n",
            _block(serialize.to_dict(run.model)),
            "## Training recipe\n",
            _block(flat_train(serialize.to_dict(run.train))),  # the recipe as its flags name it
            "Derived at training start:\n",
            _block({k: v for k, v in derived.items() if k != "data_sha256"}),
            final,
            "## Evaluation\n",
            _evaluation(run_dir),
        ]
    )
