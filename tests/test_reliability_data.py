"""No silent wrong data and no traceback from a hostile dataset, results table or option: a
vocabulary permuted at the same size, meta.json pointing outside its folder, malformed records,
repeated rows, empty metrics, degenerate fits, absurd numbers. Each case is a crafted file in
tmp_path whose meta.json is made consistent again, as a careful attacker would."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from test_reliability import FAKE, TINY, invoke, one_error_line

from synthlab.files import sha256_file


def _edited(dataset, folder, name, content: bytes):
    """A copy of `dataset` whose file `name` is `content`, its meta.json sha256 and size updated."""
    shutil.copytree(dataset, folder)
    (folder / ".verified.json").unlink(missing_ok=True)
    (folder / name).write_bytes(content)
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"][name] = {"bytes": len(content), "sha256": sha256_file(folder / name)}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture(scope="module")
def run(mano, tmp_path_factory):
    out = tmp_path_factory.mktemp("r") / "run"
    result = invoke("train", "--data", mano, "--out", out, "--steps", 2, *TINY)
    assert result.exit_code == 0, result.output
    return out


def test_eval_refuses_a_vocabulary_permuted_at_the_same_size(run, mano, tmp_path):
    vocab = json.loads((mano / "vocab.json").read_text())
    words = vocab["tokens"]
    words[-1], words[-2] = words[-2], words[-1]  # two ids swapped: the same size, other meanings
    edited = _edited(mano, tmp_path / "permuted", "vocab.json", json.dumps(vocab).encode())
    one_error_line(invoke("eval", run, "--data", edited, "--device", "cpu"), "vocab.json", "ids")
    assert invoke("eval", run, "--data", mano, "--device", "cpu").exit_code == 0  # its own vocabulary


def test_a_meta_json_listing_a_file_outside_the_dataset_is_refused(mano, tmp_path):
    (tmp_path / "outside.txt").write_text("not the dataset's\n")
    folder = tmp_path / "d"
    shutil.copytree(mano, folder)
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"]["../outside.txt"] = {"bytes": 18, "sha256": sha256_file(tmp_path / "outside.txt")}
    (folder / "meta.json").write_text(json.dumps(meta))
    result = invoke("train", "--data", folder, "--out", tmp_path / "r", "--steps", 1, *TINY)
    one_error_line(result, "meta.json", "../outside.txt")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "line, needle",
    [
        ('{"prompt": "a b <ans>", "length": 1}', "'answer'"),
        ('{"prompt": 17, "answer": "x", "length": 1}', "'prompt' must be a string"),
        ("[1, 2, 3]", "not a record"),
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not UTF-8"),
    ],
)
def test_a_malformed_training_record_is_one_line_naming_file_and_line(mano, tmp_path, line, needle):
    lines = (mano / "train.jsonl").read_bytes().splitlines(keepends=True)
    bad = line if isinstance(line, bytes) else line.encode()
    folder = _edited(mano, tmp_path / "d", "train.jsonl", b"".join([*lines[:4], bad + b"\n", *lines[4:]]))
    result = invoke("train", "--data", folder, "--out", tmp_path / "r", "--steps", 1, *TINY)
    one_error_line(result, "train.jsonl:5", needle)


@pytest.mark.parametrize(
    "args, needle",
    [(["--seed", -1], "seed"), (["--loops", 1_000_000], "loops"), (["--n-layers", 10**9], "n_layers")],
)
def test_absurd_training_numbers_are_refused_before_any_work(mano, tmp_path, args, needle):
    one_error_line(invoke("train", "--data", mano, "--out", tmp_path / "r", "--steps", 1, *TINY, *args), needle)
    assert not (tmp_path / "r").exists()


def test_a_config_json_with_a_billion_layers_is_refused_before_building(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = json.loads((copy / "config.json").read_text())
    config["model"]["n_layers"] = 10**9
    (copy / "config.json").write_text(json.dumps(config))
    one_error_line(invoke("eval", copy, "--device", "cpu"), "n_layers")


@pytest.fixture
def sweep_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE.parent.parent))
    out = tmp_path / "sweep"
    result = invoke("sweep", FAKE, "--runner", "sweep_fake_runner", "--out", out)
    assert result.exit_code == 0, result.output
    return out


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def test_plot_and_report_refuse_a_repeated_row(sweep_dir, tmp_path):
    rows = _rows(sweep_dir / "results.csv")
    _write(sweep_dir / "results.csv", [*rows, rows[1]])
    one_error_line(invoke("plot", FAKE, sweep_dir, "--out", tmp_path / "fig"), rows[1]["point_id"], "repeated")
    one_error_line(invoke("report", sweep_dir, "--out", tmp_path / "report.md"), rows[1]["point_id"], "repeated")
    assert not (tmp_path / "fig").exists() and not (tmp_path / "report.md").exists()


def test_plot_refuses_a_metric_empty_in_every_row(sweep_dir, tmp_path):
    rows = _rows(sweep_dir / "results.csv")
    _write(sweep_dir / "results.csv", [{**r, "accuracy": ""} for r in rows])
    one_error_line(
        invoke("plot", FAKE, sweep_dir, "--metric", "accuracy", "--out", tmp_path / "fig"), "accuracy", "empty"
    )


def test_a_killed_sweep_worker_ends_the_driver_in_one_line_and_a_rerun_resumes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE.parent.parent))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "killing_runner.py").write_text(
        "import os, signal\n"
        "from sweep_fake_runner import estimate_seconds, parse, run_point as fake_point\n"
        "def run_point(config, run_dir, *, cache_dir):\n"
        "    if config['model']['width'] == 2 and not os.environ.get('SPARE'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)  # what kill -9 or the OOM killer does\n"
        "    return fake_point(config, run_dir, cache_dir=cache_dir)\n"
    )
    out = tmp_path / "sweep"
    args = ["sweep", FAKE, "--preset", "cpu", "--runner", "killing_runner", "--out", out, "--jobs", 2]
    one_error_line(invoke(*args), "rerun the same command")
    monkeypatch.setenv("SPARE", "1")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert len(_rows(out / "results.csv")) == 4


def _table(path, rows):
    path.write_text("params,tokens,loss\n" + "".join(f"{n},{d},{loss}\n" for n, d, loss in rows))
    return path


def test_a_fit_warns_where_a_variable_of_the_law_does_not_vary(tmp_path):
    one_size = _table(tmp_path / "one.csv", [(1e6, d, 3.0 + 1e9 / d) for d in (1e9, 2e9, 4e9, 8e9, 16e9, 32e9, 64e9)])
    result = invoke("fit", "chinchilla", one_size, "--bootstrap", 0, "--lack-of-fit-resamples", 0)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "params = 1e+06 in every row" in warnings[0], result.output
    flat = _table(tmp_path / "flat.csv", [(2e6, 1e9, 3.0 + 0.01 * i) for i in range(6)])
    result = invoke("fit", "power", flat, "--bootstrap", 0, "--lack-of-fit-resamples", 0)
    warnings = [line for line in result.output.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "params = 2e+06 in every row" in warnings[0], result.output


@pytest.mark.parametrize(
    "option, value", [("--compute", "inf"), ("--compute", "nan"), ("--delta", "nan"), ("--delta", "inf")]
)
def test_a_fit_refuses_a_non_finite_option_naming_it(tmp_path, option, value):
    table = _table(
        tmp_path / "t.csv",
        [(n, d, 2 + 1e3 / n**0.3 + 1e4 / d**0.3) for n in (1e6, 4e6, 16e6) for d in (1e9, 4e9, 16e9)],
    )
    one_error_line(invoke("fit", "chinchilla", table, "--bootstrap", 0, option, value), option)
