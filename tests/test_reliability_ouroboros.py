"""OUROBOROS on hostile input: every absurd option, a binary corpus, a weights file of the wrong
shapes is one `error:` line (exit 2) naming the option or the file, before any work."""

from __future__ import annotations

import pytest
from test_ouroboros import checkpoint  # noqa: F401  (the tiny Qwen2 fixture)
from test_reliability import invoke, one_error_line
from test_reliability_files import ouroboros_train


@pytest.mark.parametrize(
    "option, value, needle",
    [
        ("--betas", "nan,0.9", "betas"),
        ("--betas", "1.5,0.9", "betas"),
        ("--grad-clip", "-1", "grad_clip"),
        ("--warmup-steps", "-1", "warmup_steps"),
        ("--checkpoint-every", "-1", "checkpoint_every"),
        ("--seed", "-1", "seed"),
        ("--alpha", "nan", "alpha"),
        ("--gate-bias", "inf", "gate_bias"),
    ],
)
def test_ouroboros_train_refuses_absurd_options(checkpoint, tmp_path, option, value, needle):  # noqa: F811
    one_error_line(ouroboros_train(checkpoint, tmp_path / "run", option, value), needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, value", [("--alpha", "nan"), ("--gate-bias", "inf"), ("--alpha", "-inf")])
def test_ouroboros_build_refuses_non_finite_options(checkpoint, tmp_path, option, value):  # noqa: F811
    args = ["ouroboros", "build", "--base-config", checkpoint / "config.json", "--out", tmp_path / "b"]
    one_error_line(invoke(*args, option, value), option.strip("-").replace("-", "_"))
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("name", ["corpus.txt", "corpus.jsonl"])
def test_a_binary_or_non_utf8_corpus_is_one_line_naming_its_line(checkpoint, tmp_path, name):  # noqa: F811
    corpus = tmp_path / name
    text = '{"text": "the cat sat ."}\n' if name.endswith(".jsonl") else "the cat sat .\n\n"
    corpus.write_bytes(text.encode() * 2 + b"\xff\xfe\x00binary\n")
    result = invoke(
        "ouroboros", "train", "--base", checkpoint, "--corpus", corpus, "--out", tmp_path / "run", "--steps", 1
    )
    one_error_line(result, str(corpus), "line", "UTF-8")


@pytest.fixture(scope="module")
def trained(checkpoint, tmp_path_factory):  # noqa: F811
    run = tmp_path_factory.mktemp("o") / "run"
    result = ouroboros_train(checkpoint, run)
    assert result.exit_code == 0, result.output
    return run


@pytest.mark.parametrize("option, value", [("--batch-size", 0), ("--max-sequences", 0), ("--max-sequences", -1)])
def test_ouroboros_eval_refuses_counts_below_one(trained, option, value):
    one_error_line(invoke("ouroboros", "eval", trained, "--depths", "1,2", option, value), option)
    assert not (trained / "results.csv").exists()


def test_weights_of_the_wrong_shapes_are_one_line(trained, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    path = copy / "static" / "trainable.safetensors"
    state = load_file(str(path))
    name = sorted(state)[0]
    state[name] = state[name].new_zeros(*(s + 1 for s in state[name].shape))
    save_file(state, str(path))
    one_error_line(invoke("ouroboros", "eval", copy, "--depths", "1,2"), str(path), name, "shape")
