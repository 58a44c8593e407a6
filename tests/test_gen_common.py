"""What every task shares: the registry and its CLI, meta.json, vocab.json and the tokenizer,
all-or-nothing writing."""

import dataclasses
import hashlib
import json

import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.data.tokenizer import WordTokenizer
from synthlab.errors import SynthlabError
from synthlab_generators import TASKS, Dataset, write_dataset
from synthlab_generators.common import flag_of

runner = CliRunner()
SMALL = {
    "mano": ["--L", "3", "--n-train", "50", "--n-test", "5"],
    "bios": ["--n-people", "5"],
    "multihop": ["--layers", "3", "--per-layer", "3", "--relations", "2", "--hops", "2", "--n-test", "2"],
    "reach": ["--nodes", "12", "--max-diameter", "2", "--n-train", "10", "--n-test", "4"],
}
TEXT_FIELDS = ("prompt", "question", "text")


def test_registry_matches_cli():
    assert sorted(TASKS) == sorted(SMALL)
    for name, spec in TASKS.items():
        result = runner.invoke(app, ["gen", name, "--help"], env={"COLUMNS": "400"})  # rich wraps at COLUMNS
        assert result.exit_code == 0
        for f in dataclasses.fields(spec.params_cls):
            assert flag_of(spec.params_cls, f.name) in result.output
            assert f.metadata["help"]
        for flag in ("--seed", "--out", "--overwrite"):
            assert flag in result.output
        spec.params_cls()  # the defaults are valid


@pytest.mark.parametrize("task", sorted(SMALL))
def test_meta_vocab_and_tokenizer_cover_every_file(tmp_path, task):
    out = tmp_path / "d"
    result = runner.invoke(app, ["gen", task, *SMALL[task], "--seed", "5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "meta.json").read_text())
    assert meta["task"] == task and meta["seed"] == 5
    assert set(meta["params"]) == {f.name for f in dataclasses.fields(TASKS[task].params_cls)}
    on_disk = {p.name for p in out.iterdir()} - {"meta.json"}
    assert set(meta["files"]) == on_disk >= {"vocab.json", "train.jsonl", "test.jsonl"}
    for name, info in meta["files"].items():
        assert info["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    tok = WordTokenizer.from_file(out)
    assert tok.tokens[:4] == ["<pad>", "<bos>", "<eos>", "<ans>"] and tok.pad_id == 0
    assert len(tok) == meta["vocab_size"]
    for name in on_disk:
        if not name.endswith(".jsonl") or name == "people.jsonl":
            continue
        records = [json.loads(line) for line in (out / name).read_text().splitlines()]
        assert len(records) == meta["counts"][name[:-6]]
        for rec in records:
            for field in TEXT_FIELDS:
                if field in rec:
                    assert tok.decode(tok.encode(rec[field])) == rec[field]
            if "answer" in rec:
                tok.encode(rec["answer"])
            for field in ("prompt", "question"):  # what the model sees before the answer
                if field in rec:
                    assert rec[field].startswith("<bos> ") and rec[field].endswith(" <ans>")


def test_tokenizer_errors(tmp_path):
    tok = WordTokenizer(["<pad>", "<bos>", "<eos>", "<ans>", "a", "b"], ["<pad>", "<bos>", "<eos>", "<ans>"])
    assert tok.encode("a  b\ta") == [4, 5, 4] and tok.id("<ans>") == 3 == tok.ans_id
    assert tok.decode([1, 4, 5]) == "<bos> a b"
    with pytest.raises(SynthlabError, match="'c'"):
        tok.encode("a c")
    with pytest.raises(SynthlabError, match="'zz'"):
        tok.id("zz")
    with pytest.raises(SynthlabError, match="-1"):
        tok.decode([-1])
    with pytest.raises(SynthlabError, match="not found"):
        WordTokenizer.from_file(tmp_path / "missing.json")


def test_default_out_is_per_params_and_seed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed in ("0", "0", "1"):
        result = runner.invoke(app, ["gen", "mano", *SMALL["mano"], "--seed", seed, "--overwrite"])
        assert result.exit_code == 0, result.output
    folders = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert len(folders) == 2 and all(f.startswith("mano-") for f in folders)


def test_failure_midway_leaves_nothing(tmp_path):
    def lines():
        yield '{"prompt": "<bos> <ans>"}\n'
        raise RuntimeError("generator crashed")

    def generate(params, rng):
        return Dataset(tokens=[], files={"train.jsonl": lines()}, counts={"train": 1})

    spec = dataclasses.replace(TASKS["mano"], name="broken", generate=generate, help="a task that fails")
    out = tmp_path / "d"
    out.mkdir()
    (out / "old.txt").write_text("kept")
    with pytest.raises(RuntimeError):
        write_dataset(spec, TASKS["mano"].params_cls(L=2), 0, out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert (out / "old.txt").read_text() == "kept"


def test_out_that_is_a_file(tmp_path):
    target = tmp_path / "f"
    target.write_text("x")
    result = runner.invoke(app, ["gen", "bios", "--n-people", "3", "--out", str(target)])
    assert result.exit_code == 2 and "--out" in result.output
    assert target.read_text() == "x"


# Each task's output at a small setting, seed 0, with the generator version that wrote it. A change
# to a generator that changes these bytes must raise its SPEC.version (then update the line
# here): the version is part of the dataset cache key and the default folder name, so a sweep
# does not reuse a dataset (or a model trained on one) that the generator no longer writes.
FINGERPRINTS = {
    "mano": ({"L": 3, "n_train": 50, "n_test": 5}, 1, "09a40cded1cc5d35"),
    "bios": ({"n_people": 5}, 1, "20d1852b81c17cc6"),
    "multihop": ({"layers": 3, "per_layer": 3, "relations": 2, "hops": 2, "n_test": 2}, 1, "adc8450294f3bf0a"),
    "reach": ({"nodes": 12, "max_diameter": 2, "n_train": 10, "n_test": 4}, 1, "e3f9eee89402caa7"),
}


@pytest.mark.parametrize("task", sorted(FINGERPRINTS))
def test_a_generator_whose_output_changes_raises_its_version(tmp_path, task):
    assert sorted(FINGERPRINTS) == sorted(TASKS)
    params, version, fingerprint = FINGERPRINTS[task]
    spec = TASKS[task]
    out = write_dataset(spec, spec.params_cls(**params), seed=0, out=tmp_path / "d")
    digest = hashlib.sha256()
    for path in sorted(out.iterdir()):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    assert (spec.version, digest.hexdigest()[:16]) == (version, fingerprint), (
        f"{task}'s output changed: raise its SPEC.version and update FINGERPRINTS"
    )


def test_the_generator_version_names_another_dataset_from_version_2(monkeypatch):
    from synthlab.cli.gen import default_out

    spec = TASKS["mano"]
    params = spec.params_cls(L=2, n_train=20, n_test=2)
    before = default_out("mano", params, 0)
    assert spec.version_key() == {}  # version 1: the names and cache keys made before versions
    monkeypatch.setitem(TASKS, "mano", dataclasses.replace(spec, version=2))
    assert TASKS["mano"].version_key() == {"generator_version": 2} and default_out("mano", params, 0) != before
