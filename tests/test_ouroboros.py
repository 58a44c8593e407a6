"""OUROBOROS on a tiny random Qwen2 that the test saves with save_pretrained and loads back through
the real path (synthlab.ouroboros.checkpoint.load_base): causality, zero init, equivalences with plain
HF, SVD bases, training, the 3B-shape parameter count, the CLI."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from synthlab.errors import SynthlabError  # noqa: E402
from synthlab.ouroboros import OuroborosConfig, OuroborosLM, lm_loss, lora_bases, resolve_split, trainable_breakdown  # noqa: E402
from synthlab.ouroboros.checkpoint import load_base, load_tokenizer, meta_base  # noqa: E402
from synthlab.ouroboros.data import pack, read_texts, split_heldout  # noqa: E402
from synthlab.ouroboros.lora import TARGETS, mean_residual, target_linear  # noqa: E402
from synthlab.ouroboros.train import OuroborosTrainConfig, mean_loss, train  # noqa: E402
from tests.tiny_qwen2 import save_checkpoint  # noqa: E402

WORDS = "the a cat dog bird sat ran flew on under over mat log tree and then . red blue".split()


def _corpus_docs(n_docs: int, seed: int) -> list[str]:
    # A tiny grammar with structure to learn: "the <colour> <animal> <verb> <prep> the <thing> ."
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    docs = []
    for _ in range(n_docs):
        sentences = [
            f"the {pick(['red', 'blue'])} {pick(['cat', 'dog', 'bird'])} {pick(['sat', 'ran', 'flew'])} "
            f"{pick(['on', 'under', 'over'])} the {pick(['mat', 'log', 'tree'])} ."
            for _ in range(4)
        ]
        docs.append(" ".join(sentences))
    return docs


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matrices: a second intra-op thread only adds synchronisation, and on a shared 2-core
    # machine it waits for the other process's load.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 6-layer random Qwen2 + a WordLevel tokenizer saved like a real checkpoint folder."""
    return save_checkpoint(tmp_path_factory.mktemp("tiny_qwen2"), WORDS, _corpus_docs(60, 1))


def _base(checkpoint, attn="sdpa"):
    return load_base(checkpoint, device=torch.device("cpu"), dtype=torch.float32, attn=attn)


def _system(base, variant="controller", seed=0, **overrides):
    return OuroborosLM(base, OuroborosConfig(variant=variant, **overrides), torch.Generator().manual_seed(seed))


def _randomise_trainables(model, seed=1):
    # At init the controller heads are zero, which would make any pooling look causal; give every
    # trainable parameter a random value so a future-reading pooling would show up.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.5 * torch.randn(p.shape, generator=g))


def test_loading_prints_no_progress_bar_and_leaves_the_setting_alone(checkpoint, capfd):
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    _base(checkpoint)
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_default_split_matches_reference_and_scales():
    assert resolve_split(36, OuroborosConfig()) == resolve_split(
        36, OuroborosConfig(prelude_layers=8, coda_layers=8, recurrent_layer=18)
    )
    split = resolve_split(36, OuroborosConfig())
    assert (split.prelude, split.recurrent, split.coda) == (tuple(range(8)), 18, tuple(range(28, 36)))
    assert split.removed == tuple(i for i in range(8, 28) if i != 18)
    tiny = resolve_split(4, OuroborosConfig())
    assert (tiny.prelude, tiny.recurrent, tiny.coda, tiny.removed) == ((0,), 2, (3,), (1,))
    with pytest.raises(SynthlabError, match="recurrent_layer"):
        resolve_split(36, OuroborosConfig(recurrent_layer=30))


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_every_variant_is_causal(checkpoint, attn):
    base = _base(checkpoint, attn)
    ids = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 32
    for variant in ("controller", "static", "nogate", "truncated", "base"):
        model = _system(base, variant)
        _randomise_trainables(model)
        with torch.no_grad():
            before, after = model(ids, depth=3), model(changed, depth=3)
        torch.testing.assert_close(before[:, :7], after[:, :7], msg=f"{variant} under {attn} leaks the future")
        assert not torch.allclose(before[:, 7:], after[:, 7:]), variant  # the change does reach later positions


def test_controller_deltas_are_zero_at_init(checkpoint):
    base = _base(checkpoint)
    controller, static = _system(base, "controller"), _system(base, "static")
    h = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(0)) * 5
    for step in range(controller.config.max_steps):
        assert torch.count_nonzero(controller.step_deltas(h, step)) == 0
        assert torch.count_nonzero(static.step_deltas(h, step)) == 0
    # The gate starts at sigmoid(-2): 88% of the old state kept, whatever the input.
    g = torch.sigmoid(controller.gate(torch.randn(3, 64, generator=torch.Generator().manual_seed(2))))
    torch.testing.assert_close(g, torch.full_like(g, 1 / (1 + torch.e**2)))
    # Zero deltas: the two systems differ only in where delta comes from, so they agree exactly.
    ids = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(controller(ids, 4), static(ids, 4))


def test_truncated_and_base_equal_plain_hf_layers(checkpoint):
    hf = _base(checkpoint)
    truncated, full = _system(hf, "truncated"), _system(hf, "base")
    split = truncated.split
    kept = [*split.prelude, split.recurrent, *split.coda]
    # The same HF layers run by HF's own forward (its own mask and rotary code), as a shorter model.
    short = copy.deepcopy(_base(checkpoint))
    short.model.layers = torch.nn.ModuleList(short.model.layers[i] for i in kept)
    short.config.num_hidden_layers = len(kept)
    short.config.layer_types = short.config.layer_types[: len(kept)]
    ids = torch.randint(0, 32, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(truncated(ids), short(ids, use_cache=False).logits)
        torch.testing.assert_close(full(ids), hf(ids).logits)
        # One shift, the same convention as HF's loss with labels = input ids.
        torch.testing.assert_close(lm_loss(full(ids), ids), hf(ids, labels=ids).loss)


def test_svd_bases_at_full_rank_reconstruct_the_mean_residual(checkpoint):
    base = _base(checkpoint)
    model = _system(base, "controller", rank=64)  # >= every dimension of the tiny model: full rank
    split, layers = model.split, base.model.layers
    for target in TARGETS:
        weights = [target_linear(layers[i], target).weight for i in split.removed]
        expected = torch.stack(weights).mean(0) - target_linear(layers[split.recurrent], target).weight
        wrapped = target_linear(layers[split.recurrent], target)
        torch.testing.assert_close(wrapped.lora_b @ wrapped.lora_a, expected, atol=1e-5, rtol=1e-4)
    # Below full rank: the best rank-r approximation (Eckart-Young: error = the dropped singular values).
    residual = mean_residual(layers, split, "up")
    a, b = lora_bases(residual, 4)
    s = torch.linalg.svdvals(residual)
    torch.testing.assert_close(torch.linalg.matrix_norm(residual - b @ a), s[4:].norm(), atol=1e-5, rtol=1e-4)


def test_a_few_training_steps_lower_the_loss(checkpoint):
    base = _base(checkpoint)
    tokenizer = load_tokenizer(checkpoint)
    sequences = pack(read_texts(checkpoint / "train.jsonl"), tokenizer, 24)
    train_seqs, heldout = split_heldout(sequences, 0.2)
    config = OuroborosTrainConfig(
        steps=12, seq_len=24, micro_batch_size=8, grad_accum=1, lr=1e-2, warmup_steps=2, depths=(1, 2)
    )
    for variant in ("controller", "static"):
        model = _system(base, variant)
        before = mean_loss(model, heldout, 2, 16)
        log = train(model, train_seqs, config, progress=False)
        after = mean_loss(model, heldout, 2, 16)
        assert len(log) == 12 and {row["depth"] for row in log} <= {1, 2}
        assert after < before - 0.05, (variant, before, after)
    # Seeded data order, depth draws and init: a rerun reproduces the run.
    rerun = train(_system(base, "static"), train_seqs, config, progress=False)
    assert [row["loss"] for row in rerun] == [row["loss"] for row in log]
    # The frozen base did not move.
    torch.testing.assert_close(_base(checkpoint).model.embed_tokens.weight, base.model.embed_tokens.weight)


def test_qwen25_3b_shape_has_about_9_2m_trainable_parameters(tmp_path):
    path = tmp_path / "config.json"
    transformers.Qwen2Config(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ).to_json_file(path)
    model = _system(meta_base(path), "controller")
    total = trainable_breakdown(model)["total"]
    assert abs(total - 9.2e6) <= 0.1e6, total
    # Re-derived from the architecture: gate (2d -> d), per-step norms and step embeddings (S x d),
    # controller MLP d -> H -> 7 r. Nothing of the base or the SVD bases is trainable.
    d, s, h, r = 2048, 16, 320, 32
    assert total == (2 * d * d + d) + 2 * s * d + (d + 1) * h + (h + 1) * 7 * r
    wrapped = target_linear(model.base.model.layers[18], "gate")
    assert wrapped.lora_a.shape == (32, 2048) and wrapped.lora_b.shape == (11008, 32)
    assert not any(p.requires_grad for p in model.base.parameters())


def test_parquet_corpus_reads_the_same_documents(tmp_path):
    pytest.importorskip("pyarrow")
    import pandas as pd

    docs = _corpus_docs(5, 2)
    pd.DataFrame({"text": docs}).to_parquet(tmp_path / "c.parquet")
    assert read_texts(tmp_path / "c.parquet") == docs


def test_corpus_formats_agree_and_packing_is_contiguous(checkpoint, tmp_path):
    docs = _corpus_docs(5, 2)
    (tmp_path / "c.txt").write_text("\n\n".join(docs))
    assert read_texts(tmp_path / "c.txt") == docs
    assert read_texts(checkpoint / "train.jsonl")[:5] == _corpus_docs(60, 1)[:5]
    tokenizer = load_tokenizer(checkpoint)
    packed = pack(docs, tokenizer, 10)
    stream = sum((tokenizer(d)["input_ids"] + [tokenizer.eos_token_id] for d in docs), [])
    assert packed.flatten().tolist() == stream[: packed.numel()]
    assert tokenizer.unk_token_id not in packed  # the test tokenizer covers the corpus
    (tmp_path / "c.xyz").write_text("a")
    with pytest.raises(SynthlabError, match="unsupported"):
        read_texts(tmp_path / "c.xyz")


def test_cli_build_train_eval(checkpoint, tmp_path):
    from typer.testing import CliRunner

    from synthlab.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["ouroboros", "build", "--base", str(checkpoint), "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["split"]["recurrent"] == 3 and summary["rank"] == 32 and summary["alpha"] == 16.0
    assert summary["trainable_params"] == trainable_breakdown(_system(_base(checkpoint)))["total"]

    (tmp_path / "other.txt").write_text("\n\n".join(d.replace("the", "a") for d in _corpus_docs(20, 3)))
    run = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "ouroboros",
            "train",
            "--base",
            str(checkpoint),
            "--corpus",
            str(checkpoint / "train.jsonl"),
            "--out",
            str(run),
            "--variants",
            "controller,nogate",
            "--steps",
            "2",
            "--seq-len",
            "16",
            "--micro-batch-size",
            "4",
            "--grad-accum",
            "1",
            "--depths",
            "1,2",
            "--max-steps",
            "4",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (run / "controller" / "trainable.safetensors").is_file() and (run / "nogate" / "train_log.csv").is_file()
    assert "\r" not in result.output and "train controller: step 2/2 (100%)" in result.output  # plain lines off a tty
    result = runner.invoke(
        app, ["ouroboros", "eval", str(run), "--depths", "1,2,4", "--corpus", str(tmp_path / "other.txt")]
    )
    assert result.exit_code == 0, result.output
    assert "\r" not in result.output and "eval: evaluation 16/16 (100%)" in result.output
    for variant in ("controller", "nogate", "truncated", "base"):
        assert f"  {variant}: " in result.output  # each row explained
    table = __import__("pandas").read_csv(run / "results.csv")
    for corpus, rows in table[table["depth"] == 1].groupby("corpus"):
        loss = rows.set_index("variant")["loss"]
        assert (f"{corpus}: base is" in result.output) == (loss["base"] > loss["truncated"])
    table = __import__("pandas").read_csv(run / "results.csv")
    assert set(table["variant"]) == {"controller", "nogate", "truncated", "base"}
    assert set(table["corpus"]) == {"heldout", "other"} and set(table["depth"]) == {1, 2, 4}
    assert (run / "c11_loss_vs_depth.png").stat().st_size > 0

    bad = runner.invoke(app, ["ouroboros", "eval", str(run), "--depths", "1,9"])
    assert bad.exit_code == 2 and "depths" in bad.output


def test_gpu_script_runs_its_tiny_path(monkeypatch, capsys):
    # benchmarks/gpu_ouroboros.py is meant for a GPU; --tiny runs the same code on the CPU so the
    # script cannot rot between runs on a GPU.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_ouroboros.py"
    spec = importlib.util.spec_from_file_location("gpu_ouroboros", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr("sys.argv", ["gpu_ouroboros.py", "--tiny", "--train-depths", "2", "--eval-depths", "1,2"])
    script.main()
    out = capsys.readouterr().out
    assert "before the edited token 0.00e+00" in out
    assert "depth  2: loss" in out and "truncated" in out and "base" in out


def test_training_resumes_bit_identically(checkpoint, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import synthlab.ouroboros.runs as runs
    from synthlab.ouroboros.runs import train_run

    config = OuroborosTrainConfig(
        steps=6,
        seq_len=16,
        micro_batch_size=8,
        grad_accum=2,
        lr=1e-2,
        warmup_steps=2,
        depths=(1, 2, 3),
        checkpoint_every=2,
    )
    args = (str(checkpoint), str(checkpoint / "train.jsonl"))
    system = OuroborosConfig(max_steps=4)
    train_run(*args, tmp_path / "whole", ["controller", "static"], system, config, progress=False)

    real_write, stops = runs.atomic_write, []

    def stop_after_first_state(path, write):  # a kill right after the step-2 checkpoint of each variant
        real_write(path, write)
        if path.name == runs.STATE and path.parent.name not in stops:
            stops.append(path.parent.name)
            raise KeyboardInterrupt

    real_train, starts = runs.train, []

    def recording_train(model, *a, resume=None, **kw):
        starts.append((model.config.variant, 0 if resume is None else resume["step"]))
        return real_train(model, *a, resume=resume, **kw)

    monkeypatch.setattr(runs, "atomic_write", stop_after_first_state)
    monkeypatch.setattr(runs, "train", recording_train)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            train_run(*args, tmp_path / "stopped", ["controller", "static"], system, config, progress=False)
    assert stops == ["controller", "static"]
    assert torch.load(tmp_path / "stopped" / "static" / runs.STATE, weights_only=True)["step"] == 2
    train_run(*args, tmp_path / "stopped", ["controller", "static"], system, config, progress=False)
    # each variant restarted from its step-2 checkpoint; the finished controller was not trained again
    assert starts == [("controller", 0), ("controller", 2), ("static", 0), ("static", 2)]
    for variant in ("controller", "static"):
        whole, resumed = tmp_path / "whole" / variant, tmp_path / "stopped" / variant
        assert (whole / runs.LOG).read_text() == (resumed / runs.LOG).read_text()
        a, b = load_file(whole / runs.CHECKPOINT), load_file(resumed / runs.CHECKPOINT)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert not (resumed / runs.STATE).exists()
    with pytest.raises(SynthlabError, match="another OUROBOROS run"):
        train_run(
            *args,
            tmp_path / "stopped",
            ["controller", "static"],
            system,
            dataclasses.replace(config, lr=2e-2),
            progress=False,
        )


def test_per_document_rows_are_padded_and_padding_is_never_scored(checkpoint):
    from synthlab.ouroboros.data import PAD, documents

    tokenizer = load_tokenizer(checkpoint)
    docs = _corpus_docs(3, 5)
    rows = documents(docs, tokenizer, 40)
    lengths = []
    for row, doc in zip(rows, docs):
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert row[: len(ids)].tolist() == ids and (row[len(ids) :] == PAD).all()
        lengths.append(len(ids))
    model = _system(_base(checkpoint), "controller")
    _randomise_trainables(model)
    with torch.no_grad():  # a padded row scores as the same row cut at its end (the system is causal)
        cut = [lm_loss(model(row[None, :n], 2), row[None, :n]) for row, n in zip(rows, lengths)]
        for row, loss in zip(rows, cut):
            torch.testing.assert_close(lm_loss(model(row[None], 2), row[None]), loss)
    expected = sum(float(loss) * (n - 1) for loss, n in zip(cut, lengths)) / sum(n - 1 for n in lengths)
    assert mean_loss(model, rows, 2, batch_size=2) == pytest.approx(expected, rel=1e-6)


def test_a_lost_process_is_one_error_line(checkpoint, tmp_path, monkeypatch):
    import synthlab.ouroboros.runs as runs

    def lost(*args, **kwargs):  # what a collective raises when another torchrun process died (gloo)
        raise RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:4711")

    monkeypatch.setattr(runs, "train", lost)
    config = OuroborosTrainConfig(steps=2, seq_len=16, micro_batch_size=4, grad_accum=1, depths=(1,))
    with pytest.raises(SynthlabError, match=r"process 0 of 1 lost contact .* \(rerun the same command to resume\)"):
        runs.train_run(
            str(checkpoint),
            str(checkpoint / "train.jsonl"),
            tmp_path / "run",
            ["controller"],
            OuroborosConfig(max_steps=4),
            config,
            progress=False,
        )
