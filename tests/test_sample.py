"""`synthlab sample`: the greedy continuation is the argmax of a full recomputation at every
token; sampling is reproducible from its seed; bad input is one error line."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.data.datasets import load_dataset
from synthlab.training.run_folders import open_run

runner = CliRunner()
PROMPT = "<len_2> + 3 4 <ans>"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def looped_run(mano, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sample") / "run"
    tiny = ["--d-model", 32, "--n-heads", 2, "--n-layers", 1, "--loops", 2, "--max-seq-len", 32, "--batch-size", 8]
    result = invoke("train", "--data", mano, "--out", run_dir, "--steps", 4, *tiny, "--threads", 1, "--no-progress")
    assert result.exit_code == 0, result.output
    return run_dir


def recomputed(run_dir, mano, prompt: str, new: int, steps: int | None) -> str:
    """Greedy decoding by a full forward pass over the whole sequence for every token (no cache)."""
    model, _, _ = open_run(run_dir)
    data = load_dataset(mano)
    ids = data.encode_prompt(prompt)
    for _ in range(new):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids]), steps=steps).logits[0, -1].argmax()))
    out = ids[-new:]
    return data.tokenizer.decode(out[: out.index(data.eos_id)] if data.eos_id in out else out)


@pytest.mark.parametrize("steps", [None, 3])
def test_greedy_sampling_is_the_argmax_of_a_full_recomputation(looped_run, mano, steps):
    more = ["--steps", steps] if steps else []
    result = invoke("sample", looped_run, "--prompt", PROMPT, "--prompt", "<len_1> * 2 2 <ans>", *more, "--threads", 1)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines == [recomputed(looped_run, mano, p, 8, steps) for p in (PROMPT, "<len_1> * 2 2 <ans>")]
    assert max(len(line.split()) for line in lines) == 8  # one compared in full (the other may stop at <eos>)


def test_sampling_is_reproducible_from_its_seed(looped_run):
    def drawn(seed: int) -> str:
        result = invoke("sample", looped_run, "--prompt", PROMPT, "--temperature", 1.5, "--seed", seed)
        assert result.exit_code == 0, result.output
        return result.output

    assert drawn(0) == drawn(0) and len({drawn(s) for s in range(4)}) > 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "<len_2> + 3 foo <ans>"], "--prompt '<len_2> + 3 foo <ans>': unknown token 'foo'"),
        (["--prompt", PROMPT, "--temperature", -1], "--temperature must be"),
        (["--prompt", PROMPT, "--max-new-tokens", 40], "exceeds max_seq_len=32"),
        (["--prompt", PROMPT, "--steps", 99], "--steps must lie in 1..32"),
        (["--prompt", PROMPT, "--kv", "middle"], "kv_strategy 'middle'"),
    ],
)
def test_bad_input_is_one_error_line(looped_run, args, message):
    result = invoke("sample", looped_run, *args)
    assert result.exit_code == 2 and result.output.startswith("error: ") and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
