"""`synthlab export --format qwen2`: the exported folder loads in transformers alone and computes
the same logits as the synthlab model; its tokenizer is the dataset's word vocabulary; models
Qwen2 cannot express are refused with one line."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from synthlab.cli import app  # noqa: E402
from synthlab.data.datasets import Dataset  # noqa: E402
from synthlab.data.tokenizer import WordTokenizer  # noqa: E402
from synthlab.errors import SynthlabError  # noqa: E402
from synthlab.files import new_file_mode  # noqa: E402
from synthlab.models import ModelConfig, build_model  # noqa: E402
from synthlab.ouroboros.checkpoint import load_tokenizer  # noqa: E402
from synthlab.ouroboros.export import export_model, qwen2_refusal  # noqa: E402
from synthlab.training.configs import TrainConfig  # noqa: E402
from synthlab.training.run_folders import RunConfig  # noqa: E402
from synthlab_generators import TASKS, write_dataset  # noqa: E402

QWEN2 = dict(
    d_model=32, n_heads=4, n_layers=3, max_seq_len=96, mlp="swiglu", qkv_bias=True, init_std=0.02
)  # the float tolerances below are set for this init scale
SHAPES = {
    "tied": dict(tie_head=True),
    "untied": dict(tie_head=False),
    "no_qkv_bias": dict(qkv_bias=False, rope_base=500.0),
    "plain_sandwich": dict(topology="sandwich", n_prelude=1, n_coda=1, injection="none", state_init="input"),
}


@pytest.fixture(scope="module")
def bios(tmp_path_factory):
    spec = TASKS["bios"]
    return write_dataset(spec, spec.params_cls(n_people=40), 0, tmp_path_factory.mktemp("d") / "bios")


def _random_model(vocab_size: int, **overrides):
    """A model whose every weight (biases and norm gains included) is far from its init."""
    model = build_model(ModelConfig(vocab_size=vocab_size, **{**QWEN2, **overrides}), seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_exported_logits_equal_synthlabs(shape, bios, tmp_path):
    tokenizer = WordTokenizer.from_file(bios)
    model = _random_model(len(tokenizer), **SHAPES[shape])
    export_model(model, tokenizer, tmp_path / "qwen2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "qwen2", dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen2ForCausalLM"
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == model.config.tie_head
    ids = torch.randint(0, len(tokenizer), (3, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, theirs = model(ids).logits, hf(ids).logits
    assert ours.abs().max() > 1.0  # logits far from 0: the comparison below is not vacuous
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=2e-5)


def _lab_sequences(folder):
    """(text, the lab's ids) of every training and test sequence of a dataset, as the lab builds
    them: documents wrapped in <bos> ... <eos>, QA prompts (which start with <bos>) with their answer."""
    ds = Dataset(folder)
    for split in ("train", "test"):
        for record in ds.records(split):
            if "text" in record:
                yield f"<bos> {record['text']} <eos>", ds.encode_text(record["text"])
            else:
                prompt = record.get("prompt") or record["question"]
                yield f"{prompt} {record['answer']}", ds.encode_prompt(prompt) + ds.encode(str(record["answer"]))


@pytest.mark.parametrize("task", ["bios", "mano", "multihop", "reach"])
def test_auto_classes_give_the_labs_ids_text_and_logits(task, task_datasets, tmp_path, capfd):
    folder = task_datasets[task]
    tokenizer = WordTokenizer.from_file(folder)
    model = _random_model(len(tokenizer), max_seq_len=512)
    export_model(model, tokenizer, tmp_path / "qwen2")
    assert "Writing model shards" not in capfd.readouterr().err  # no progress bar in a sweep's log
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "qwen2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "qwen2", dtype=torch.float32).eval()
    assert len(auto) == len(tokenizer) == hf.config.vocab_size  # no token of its own added
    specials = {"<pad>": auto.pad_token_id, "<bos>": auto.bos_token_id, "<eos>": auto.eos_token_id}
    assert specials == {tok: tokenizer.id(tok) for tok in specials}
    whole = "<bos> " + " ".join(t for t in tokenizer.tokens if t != "<bos>")  # every token, specials included
    assert (
        auto(whole)["input_ids"] == [1, 0, *range(2, len(tokenizer))] and auto.decode(auto(whole)["input_ids"]) == whole
    )
    sequences = list(_lab_sequences(folder))
    assert len(sequences) > 30
    for text, ids in sequences:
        assert auto(text)["input_ids"] == ids, text
        assert auto.decode(ids) == text
    longest = max(sequences, key=lambda s: len(s[1]))[1][:512]
    batch = torch.tensor([longest])
    with torch.no_grad():
        ours = model(batch).logits
        theirs = hf(torch.tensor([auto(tokenizer.decode(longest))["input_ids"]])).logits
    assert ours.abs().max() > 1.0  # logits far from 0: the comparison below is not vacuous
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=2e-5)
    # OUROBOROS reads an exported base's documents with the lab's tokenizer: a bare first word counts
    lab = load_tokenizer(tmp_path / "qwen2")
    text = sequences[0][0].removeprefix("<bos> ")
    assert lab(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text)
    assert (lab.pad_token_id, lab.bos_token_id, lab.eos_token_id) == (0, 1, 2)


@pytest.mark.parametrize(
    "overrides, culprit",
    [
        (dict(loops=2), "loops = 2"),
        (dict(mlp="gelu"), "mlp = gelu"),
        (dict(positions="learned"), "positions = learned"),
        (dict(norm="sandwich"), "norm = sandwich"),
        (dict(norm_type="layernorm"), "norm_type = layernorm"),
        (dict(bias=True), "bias = true"),
        (dict(exit_gate=True), "exit_gate"),
        (dict(topology="sandwich", n_prelude=1, n_coda=1, injection="add"), "injection = add"),
    ],
)
def test_models_qwen2_cannot_express_are_refused_with_one_line(overrides, culprit, tmp_path):
    config = ModelConfig(vocab_size=50, **{**QWEN2, **overrides})
    why = qwen2_refusal(config)
    assert why is not None and culprit in why and "\n" not in why
    with pytest.raises(SynthlabError, match="Qwen2 cannot express"):
        export_model(
            build_model(config), WordTokenizer(["<pad>"] + [f"w{i}" for i in range(49)], ["<pad>"]), tmp_path / "out"
        )
    assert not (tmp_path / "out").exists()


def _trained_run(data, run_dir, **model):
    from synthlab.training.trainer import train

    config = RunConfig(
        ModelConfig(vocab_size=len(WordTokenizer.from_file(data)), **{**QWEN2, **model}),
        TrainConfig.flat(task="bios", data=str(data), steps=2, batch_size=4, seq_len=96, warmup_steps=1, log_every=1),
    )
    train(run_dir, config, progress=False)
    return run_dir


def test_cli_exports_a_trained_run_and_refuses_a_looped_one(bios, tmp_path):
    from synthlab.training.run_folders import load_model

    run = _trained_run(bios, tmp_path / "run")
    result = CliRunner().invoke(app, ["export", str(run), "--format", "qwen2", "--out", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q", dtype=torch.float32).eval()
    ids = torch.randint(0, hf.config.vocab_size, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, load_model(run)(ids).logits, rtol=1e-5, atol=2e-5)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "q").iterdir()}
    assert set(modes.values()) == {new_file_mode()}, modes  # model.safetensors too (safetensors writes 0600)
    card = (tmp_path / "q" / "README.md").read_text()
    for part in (
        "# synthlab bios model",
        '"d_model": 32',
        '"steps": 2',
        '"n_people": 40',
        "## Evaluation",
        "Not evaluated",
        "Final logged training record",
    ):
        assert part in card, part
    assert (
        WordTokenizer.from_file(tmp_path / "q" / "synthlab_vocab.json").tokens == WordTokenizer.from_file(bios).tokens
    )
    from synthlab.evaluation.evaluate import evaluate_run

    scored = evaluate_run(run, device="cpu", train_sample=10)
    result = CliRunner().invoke(app, ["export", str(run), "--format", "qwen2", "--out", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output  # its own earlier export: replaced
    card = (tmp_path / "q" / "README.md").read_text()
    assert (
        f"| eval/steps1.json | {scored['n_examples']} | {scored['accuracy']:.4f} |" in card
        and "Not evaluated" not in card
    )

    looped = _trained_run(bios, tmp_path / "looped", loops=2)
    result = CliRunner().invoke(app, ["export", str(looped), "--out", str(tmp_path / "q2")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [result.output.strip()]
    assert result.output.startswith("error: Qwen2 cannot express this model: loops = 2")
    result = CliRunner().invoke(app, ["export", str(run), "--format", "llama", "--out", str(tmp_path / "q3")])
    assert result.exit_code == 2 and "--format must be one of qwen2" in result.output
