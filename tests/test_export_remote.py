"""`synthlab export --format remote`: any model of the lab (loops, sandwich, exit gate, controller,
gates, the recipe options) as a folder transformers loads alone with trust_remote_code: the lab's
logits at any number of steps, `generate` the lab's greedy answer, AutoTokenizer the lab's ids."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.data.datasets import load_dataset
from synthlab.models import ModelConfig, build_model
from synthlab.ouroboros.export import export_model
from synthlab.training.run_folders import open_run

transformers = pytest.importorskip("transformers")
SHAPE = dict(d_model=32, n_heads=2, n_layers=3, max_seq_len=32)
FAMILIES = {  # one model per family the lab trains (experiments/*.toml), random weights
    "plain": dict(),
    "ouro_exit": dict(loops=4, exit_gate=True),
    "sandwich_concat": dict(topology="sandwich", n_prelude=1, n_coda=1, loops=3, injection="concat"),
    "sandwich_add_zero": dict(topology="sandwich", n_prelude=1, n_coda=1, loops=2, injection="add", state_init="zero"),
    "controller": dict(loops=3, controller="controller", recurrence_gate=True, step_norm=True),
    "static_lora": dict(loops=2, controller="static_lora"),
    "recipe": dict(loops=2, positions="learned", tie_head=False, mlp="swiglu", norm="sandwich", bias=True),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_loads_alone_with_the_labs_logits_and_greedy_answer(family, mano, tmp_path):
    data = load_dataset(mano)
    model = build_model(ModelConfig(vocab_size=len(data.tokenizer), **SHAPE, **FAMILIES[family]), seed=3).eval()
    folder = export_model(model, data.tokenizer, tmp_path / f"remote_{family}", fmt="remote")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = torch.tensor([data.encode_prompt("<len_2> + 3 4 <ans>")])
    loops = model.config.loops
    with torch.no_grad():
        for steps in (None, loops + 2):  # the trained depth, and past it per call
            diff = (hf(ids, steps=steps).logits - model(ids, steps=steps).logits).abs().max()
            assert float(diff) <= 1e-5, (family, steps, float(diff))
        ours = model.generate(ids, 6).tokens
        assert torch.equal(hf.generate(ids, max_new_tokens=6, do_sample=False), ours)
    deeper = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, steps=loops + 1)
    with torch.no_grad():
        assert float((deeper.eval()(ids).logits - model(ids, steps=loops + 1).logits).abs().max()) <= 1e-5


def test_the_export_command_writes_a_looped_run_with_its_tokenizer_and_card(mano, tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "remote_run"
    tiny = ["--d-model", 32, "--n-heads", 2, "--n-layers", 1, "--loops", 3, "--max-seq-len", 32, "--batch-size", 8]
    runner = CliRunner()
    trained = runner.invoke(
        app, [str(a) for a in ["train", "--data", mano, "--out", run_dir, "--steps", 3, *tiny, "--no-progress"]]
    )
    assert trained.exit_code == 0, trained.output
    refused = runner.invoke(app, ["export", str(run_dir), "--out", str(tmp_path / "q")])
    assert refused.exit_code == 2 and "--format remote" in refused.output, refused.output
    result = runner.invoke(app, ["export", str(run_dir), "--format", "remote", "--out", str(out)])
    assert result.exit_code == 0 and "trust_remote_code=True" in result.output, result.output
    assert "trust_remote_code=True" in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"]
    model, _, _ = open_run(run_dir)
    data = load_dataset(mano)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    prompt = "<bos> <len_2> + 3 4 <ans>"
    ids = tok(prompt, return_tensors="pt").input_ids
    assert ids[0].tolist() == data.encode_prompt(prompt)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    with torch.no_grad():
        assert torch.equal(hf.generate(ids, max_new_tokens=4), model.generate(ids, 4).tokens)
