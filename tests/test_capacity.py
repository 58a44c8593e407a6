"""The capacity estimate: the formula on hand-computed numbers, N0 and S0 from the pool files, and
the whole estimate (spans -> per-person sums -> bits) on oracles whose losses are known exactly."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from synthlab.evaluation.capacity import (
    ATTRIBUTE_VALUES,
    N0,
    S0,
    PersonLosses,
    Population,
    capacity_bits,
    capacity_report,
    max_bits,
    span_losses,
)
from synthlab_generators import TASKS, write_dataset
from synthlab_generators.bios_words import POOLS, value_tokens


def pool_file(name: str) -> list[str]:
    return [line for line in (POOLS / f"{name}.txt").read_text(encoding="utf-8").splitlines() if line.strip()]


def pools_in_use(scale: float) -> dict[str, list[str]]:
    """The values a population of this pool scale draws from, read here from the pool files: the
    first ceil(scale x size) lines of each (an employer with its headquarters city)."""

    def first(lines: list[str]) -> list[str]:
        return lines[: math.ceil(round(scale * len(lines), 9))]

    companies = [line.split(";") for line in first(pool_file("company"))]
    return {
        "first": first(pool_file("first_name")),
        "middle": first(pool_file("middle_name")),
        "last": first(pool_file("last_name")),
        "birth_city": first(pool_file("city")),
        "university": first(pool_file("university")),
        "major": first(pool_file("field")),
        "employer": [name.strip() for name, _ in companies],
        "work_city": [city.strip() for _, city in companies],
        "years": [str(y) for y in first(list(range(1900, 2100)))],
    }


def test_n0_and_s0_are_the_generators_pools():
    """N0 and S0 counted from the pool files the generator draws from (and the paper's figures)."""
    assert N0 == len(pool_file("first_name")) * len(pool_file("middle_name")) * len(pool_file("last_name"))
    dates = 12 * 28 * 200
    assert S0 == 2 * dates * len(pool_file("city")) * len(pool_file("university")) * len(pool_file("field")) * len(
        pool_file("company")
    )
    assert N0 == 160_000_000 and math.log2(N0) == pytest.approx(27.25, abs=0.005)
    assert math.log2(S0) == pytest.approx(47.59, abs=0.005)


def test_a_scaled_population_counts_the_pools_in_use():
    """pool_scale 0.1: 40 x 40 x 100 names; 20 birth years, 20 cities, 30 universities, 10 majors
    and 27 employers (ceil of 26.3)."""
    p = pools_in_use(0.1)
    population = Population.of(0.1)
    assert population.name_values == len(p["first"]) * len(p["middle"]) * len(p["last"]) == 40 * 40 * 100
    assert population.attribute_values == {
        "gender": 2,
        "birth_date": 12 * 28 * 20,
        "birth_city": 20,
        "university": 30,
        "major": 10,
        "employer": 27,
    }
    assert max_bits(100, population) == pytest.approx(100 * math.log2(160_000 / 100 * population.tuples))


def test_formula_on_a_hand_computed_example():
    # a loss of ln(N0) - 10 ln 2 nats on the name is 10 bits better than uniform, per person
    n = 1000
    p1 = math.log(N0) - 10 * math.log(2)
    p2 = math.log(S0) - 20 * math.log(2)
    assert capacity_bits(n, p1, p2) == pytest.approx(n * (10 + 20))
    # max for 1000 people: names carry log2(160000) = 17.29 bits, attributes 47.59
    assert max_bits(n) == pytest.approx(1000 * (17.2877 + 47.5916), rel=1e-4)


def test_terms_are_not_clipped():
    """Definition 4.3 sums the two terms as they are: a name term worse than uniform subtracts."""
    n = 10
    p2 = math.log(S0) - 5 * math.log(2)
    assert capacity_bits(n, 2 * math.log(N0), p2) == pytest.approx(n * (5 - math.log2(N0)))


def test_report_breakdown_adds_up():
    rng = np.random.default_rng(0)
    n = 50
    losses = PersonLosses(
        name=rng.uniform(5, 10, n),
        attributes={a: rng.uniform(0, math.log(v), n) for a, v in ATTRIBUTE_VALUES.items()},
    )
    report = capacity_report(losses, params=1000)
    assert report["p2"] == pytest.approx(sum(float(v.mean()) for v in losses.attributes.values()))
    assert sum(row["bits"] for row in report["per_attribute"].values()) == pytest.approx(report["bits_attributes"])
    assert report["bits_per_param"] == pytest.approx(report["bits"] / 1000)
    # a model that predicts each attribute at least as well as uniform stores >= 0 bits for it
    assert all(row["bits"] >= 0 for row in report["per_attribute"].values())


def bios_run(root, name, steps, lr):
    """Train a tiny model on bioS(N = 8) (the dataset is generated once per root)."""
    from synthlab.cli.train import resolve_run_config
    from synthlab.training.trainer import train
    from synthlab_generators import TASKS, write_dataset

    data = root / "bios"
    if not data.exists():
        write_dataset(TASKS["bios"], TASKS["bios"].params_cls(n_people=8), 0, data)
    model = {"d_model": 48, "n_heads": 2, "n_layers": 1, "max_seq_len": 128}
    run = resolve_run_config(
        {}, model, {"data": str(data), "steps": steps, "batch_size": 4, "lr": lr, "warmup_steps": 5}
    )
    train(root / name, run, progress=False)
    return root / name


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory):
    return bios_run(tmp_path_factory.mktemp("cap"), "untrained", steps=1, lr=1e-9)


def test_untrained_model_stores_nothing(untrained_run):
    from synthlab.evaluation.capacity import estimate_capacity

    report = estimate_capacity(untrained_run, device="cpu")
    assert report["bits_name"] < 0 and report["bits_attributes"] < 0  # worse than uniform over the pools
    assert report["bits"] == pytest.approx(report["bits_name"] + report["bits_attributes"]) and report["bits"] < 0
    saved = json.loads((untrained_run / "capacity.json").read_text())
    assert {
        "p1",
        "p2",
        "n_people",
        "bits",
        "max_bits",
        "params",
        "bits_per_param",
        "bits_per_param_nonemb",
    } <= saved.keys()
    assert saved["params_nonemb"] < saved["params"] < saved["params_all"]  # unused embedding rows are not counted
    assert saved["bits_per_param_nonemb"] == pytest.approx(saved["bits"] / saved["params_nonemb"])


def test_a_capacity_row_carries_its_ceiling_and_exposures(tmp_path):
    """The results row holds exposures, max_bits and the P bits_per_param divides by, so the
    ceiling max_bits / P reads off the table."""
    from synthlab.cli.train import resolve_run_config
    from synthlab.evaluation.capacity import estimate_capacity
    from synthlab.sweeps.results_table import capacity_metrics
    from synthlab.training.trainer import train

    write_dataset(TASKS["bios"], TASKS["bios"].params_cls(n_people=8), 0, tmp_path / "bios")
    model = {"d_model": 16, "n_heads": 2, "n_layers": 1, "max_seq_len": 128}
    run = resolve_run_config({}, model, {"data": str(tmp_path / "bios"), "exposures": 2, "batch_size": 4})
    train(tmp_path / "run", run, progress=False)
    row = capacity_metrics(estimate_capacity(tmp_path / "run", device="cpu"))
    assert row["exposures"] == 2 and row["max_bits"] == pytest.approx(max_bits(8))
    assert row["bits"] / row["params_capacity"] == pytest.approx(row["bits_per_param"])


def test_a_kept_checkpoint_is_a_point_of_the_learning_curve(tmp_path):
    """The estimate at the last kept checkpoint re-derives the final one; an earlier checkpoint is
    read with its own weights and tokens seen, into its own file."""
    from synthlab.cli.train import resolve_run_config
    from synthlab.evaluation.capacity import estimate_capacity
    from synthlab.training.trainer import train

    write_dataset(TASKS["bios"], TASKS["bios"].params_cls(n_people=8), 0, tmp_path / "bios")
    model = {"d_model": 16, "n_heads": 2, "n_layers": 1, "max_seq_len": 128}
    run = resolve_run_config(
        {},
        model,
        {
            "data": str(tmp_path / "bios"),
            "steps": 6,
            "batch_size": 2,
            "lr": 1e-2,
            "warmup_steps": 1,
            "checkpoint_every": 3,
            "keep_checkpoints": 5,
        },
    )
    train(tmp_path / "run", run, progress=False)
    final = estimate_capacity(tmp_path / "run", device="cpu")
    last = estimate_capacity(tmp_path / "run", device="cpu", checkpoint=6)
    early = estimate_capacity(tmp_path / "run", device="cpu", checkpoint=3)
    assert last["bits"] == pytest.approx(final["bits"]) and last["checkpoint"] == 6
    assert early["bits"] != pytest.approx(final["bits"]) and early["tokens_seen"] < last["tokens_seen"]
    rows = json.loads((tmp_path / "run" / "config.json").read_text())["derived"]["rows_per_epoch"]
    assert early["exposures"] == pytest.approx(3 * 2 / rows) and last["exposures"] == pytest.approx(
        2 * early["exposures"]
    )
    assert early["run_exposures"] is None  # a run set by steps has no exposure budget
    saved = json.loads((tmp_path / "run" / "capacity_checkpoint3.json").read_text())
    assert saved["bits"] == pytest.approx(early["bits"])


def test_bios_eval_reports_qa_and_biography_recall_per_attribute(untrained_run):
    from synthlab.evaluation.evaluate import evaluate_run

    result = evaluate_run(untrained_run, device="cpu")
    assert result["n_examples"] == 8 * 6 and result["group_key"] == "attribute"
    assert set(result["accuracy_per_group"]) == {
        "birth_date",
        "birth_city",
        "university",
        "major",
        "work_city",
        "employer",
    }
    assert set(result["biography_recall"]) == {"name", "gender", *result["accuracy_per_group"]}
    assert all(0 <= row["accuracy"] <= 1 and row["loss"] > 0 for row in result["biography_recall"].values())


@pytest.mark.slow
def test_a_model_that_memorises_tiny_n_approaches_the_maximum(tmp_path):
    from synthlab.evaluation.capacity import estimate_capacity
    from synthlab.evaluation.evaluate import evaluate_run

    run_dir = bios_run(tmp_path, "memorised", steps=150, lr=1e-2)
    report = estimate_capacity(run_dir, device="cpu")
    assert report["fraction_of_max"] > 0.8
    assert report["p1"] == pytest.approx(math.log(8), abs=1.0)  # only the first name token is uncertain
    recall = evaluate_run(run_dir, device="cpu")["biography_recall"]
    assert min(recall[a]["accuracy"] for a in ("birth_city", "university", "major", "employer")) > 0.8


def test_person_losses_re_derived_by_hand(untrained_run):
    """The name and attribute sums equal a direct forward pass summed over the spans."""
    import torch
    import torch.nn.functional as F

    from synthlab.data.datasets import load_dataset
    from synthlab.evaluation.capacity import person_losses
    from synthlab.training.run_folders import open_run

    model, run, _ = open_run(untrained_run)
    data = load_dataset(run.train.data)
    losses = person_losses(model, data, device=torch.device("cpu"), batch_size=3)
    record = data.records("train")[5]
    ids = torch.tensor([[data.bos_id, *data.tokenizer.encode(record["text"]), data.eos_id]])
    with torch.no_grad():
        per_token = F.cross_entropy(model(ids[:, :-1]).logits[0], ids[0, 1:], reduction="none")
    # text token k is sequence token k + 1, predicted at position k
    span = lambda name: float(per_token[slice(*record["spans"][name])].sum())  # noqa: E731
    person = record["person"]
    assert losses.name[person] == pytest.approx(span("name"), rel=1e-4)
    assert losses.attributes["major"][person] == pytest.approx(span("major"), rel=1e-4)
    assert losses.attributes["employer"][person] == pytest.approx(span("employer") + span("work_city"), rel=1e-4)


# --- oracles: per-token losses known exactly, fed through the spans and the per-person sums ---


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def prefix_loss(sequences: list[tuple[str, ...]], tokens: list[str]) -> float:
    """-ln P(tokens) for a model uniform over `sequences` (conditioned on nothing else)."""
    matches = sum(seq[: len(tokens)] == tuple(tokens) for seq in sequences)
    return -math.log(matches / len(sequences))


def oracle_losses(records, people, knows: bool, scale: float = 1.0) -> list[np.ndarray]:
    """Each text token's loss for an oracle that knows every attribute and is uniform over the N
    names of the data (`knows`), or is uniform over each pool in use (names: over first x middle x
    last). A span's whole loss sits on its first token (only span sums are read). A value is read
    through the template's next token (the model knows the template): a span that stopped short
    of the token that ends a value would show it as a lower loss than ln(pool size)."""
    p = pools_in_use(scale)
    names = [tuple(person["name"].split()) for person in people]
    out = []
    for record in records:
        words, spans = record["text"].split(), record["spans"]
        loss = np.zeros(len(words))
        name = words[slice(*spans["name"])]
        loss[spans["name"][0]] = (
            prefix_loss(names, name) if knows else math.log(len(p["first"]) * len(p["middle"]) * len(p["last"]))
        )
        if "gender" in spans:
            loss[spans["gender"][0]] = 0.0 if knows else math.log(2)
        if not knows:
            person = people[record["person"]]
            loss[spans["birth_date"][0]] = math.log(12 * 28 * len(p["years"]))

            def pool(attribute):  # the pool's values, each followed by this template's next word
                start = spans[attribute][0]
                after = words[start + len(value_tokens(person[attribute]))]
                return [value_tokens(v) + (after,) for v in p[attribute]]

            for attribute in ("birth_city", "university", "major"):
                loss[spans[attribute][0]] = prefix_loss(pool(attribute), words[slice(*spans[attribute])])
            # work city and employer: one draw of the employer, spans in text order
            first, second = sorted(("work_city", "employer"), key=lambda a: spans[a][0])
            a_tokens, b_tokens = tuple(words[slice(*spans[first])]), tuple(words[slice(*spans[second])])
            fits_a = [i for i, seq in enumerate(pool(first)) if seq[: len(a_tokens)] == a_tokens]
            seconds = pool(second)
            fits_b = [i for i in fits_a if seconds[i][: len(b_tokens)] == b_tokens]
            loss[spans[first][0]] = -math.log(len(fits_a) / len(p["employer"]))
            loss[spans[second][0]] = -math.log(len(fits_b) / len(fits_a))
        out.append(loss)
    return out


@pytest.fixture(
    scope="module",
    params=[("single", 1.0), ("multi3", 1.0), ("permute", 1.0), ("fullname", 1.0), ("single", 0.1), ("fullname", 0.1)],
    ids=lambda p: f"{p[0]}-scale{p[1]}",
)
def oracle_data(request, tmp_path_factory):
    variant, scale = request.param
    out = tmp_path_factory.mktemp("oracle") / f"{variant}-{scale}"
    params = TASKS["bios"].params_cls(n_people=300, variant=variant, pool_scale=scale)
    write_dataset(TASKS["bios"], params, 1, out)
    return read_jsonl(out / "train.jsonl"), read_jsonl(out / "people.jsonl"), scale


def test_an_oracle_that_knows_everything_reaches_the_data_maximum(oracle_data):
    records, people, scale = oracle_data
    losses = span_losses(records, oracle_losses(records, people, knows=True, scale=scale), len(people))
    report = capacity_report(losses, params=1, population=Population.of(scale))
    fullname = "gender" not in records[0]["spans"]  # no pronoun: the gender is not in the text
    p, n = pools_in_use(scale), len(people)
    names = len(p["first"]) * len(p["middle"]) * len(p["last"])
    tuples = (
        2 * 12 * 28 * len(p["years"]) * math.prod(len(p[a]) for a in ("birth_city", "university", "major", "employer"))
    )
    assert report["p1"] == pytest.approx(math.log(n))
    maximum = n * math.log2(names / n * tuples)
    assert report["max_bits"] == pytest.approx(maximum, rel=1e-12)
    assert report["bits"] == pytest.approx(maximum - (n if fullname else 0), rel=1e-9)


def test_a_model_uniform_over_each_pool_stores_nothing(oracle_data):
    records, people, scale = oracle_data
    losses = span_losses(records, oracle_losses(records, people, knows=False, scale=scale), len(people))
    report = capacity_report(losses, params=1, population=Population.of(scale))
    assert report["bits_name"] == pytest.approx(0.0, abs=1e-6)
    assert report["bits"] == pytest.approx(0.0, abs=1e-6)
    for attribute, row in report["per_attribute"].items():
        assert row["loss"] == pytest.approx(math.log(Population.of(scale).attribute_values[attribute])), attribute


def test_the_peak_is_the_population_size_with_the_best_mean_over_seeds():
    import pandas as pd

    from synthlab.evaluation.capacity import peak_capacity

    # Model A (P 100): N 10 holds 0.5 and 0.7 (mean 0.6), N 20 holds 0.9 and 0.5 (mean 0.7, the
    # peak though its best single seed ties N 10's); model B (P 200, 4 loops) peaks at N 10, where
    # it stores 95% of the data: a lower bound.
    rows = [
        (100, 1, 10, 0.5, 0.2),
        (100, 1, 10, 0.7, 0.3),
        (100, 1, 20, 0.9, 0.4),
        (100, 1, 20, 0.5, 0.2),
        (200, 4, 10, 1.0, 0.95),
        (200, 4, 20, 0.4, 0.3),
    ]
    table = pd.DataFrame(rows, columns=["params", "loops", "n_people", "bits_per_param", "fraction_of_max"])
    table["bits"] = table["bits_per_param"] * table["params"]
    peaks = peak_capacity(table)
    assert list(peaks["n_people"]) == [20, 10]
    assert peaks["bits_per_param"].tolist() == pytest.approx([0.7, 1.0])
    assert peaks["se"].iloc[0] == pytest.approx(0.2)  # sd 0.2828 / sqrt 2
    assert peaks["seeds"].tolist() == [2, 1]
    assert peaks["n_tried"].tolist() == ["10, 20", "10, 20"]
    assert peaks["data_limited"].tolist() == [False, True]


def test_the_learning_curve_reads_every_kept_checkpoint(tmp_path, monkeypatch):
    """`synthlab capacity --curve`: one row per kept checkpoint, oldest first, each the estimate at
    that checkpoint (its file too, reused when read again), the last the final weights'; a run keeping one checkpoint and
    --curve beside --checkpoint are refused before any work."""
    from typer.testing import CliRunner

    from synthlab.cli import app
    from synthlab.cli.train import resolve_run_config
    from synthlab.evaluation.capacity import estimate_capacity
    from synthlab.training.trainer import train

    write_dataset(TASKS["bios"], TASKS["bios"].params_cls(n_people=8), 0, tmp_path / "bios")
    model = {"d_model": 16, "n_heads": 2, "n_layers": 1, "max_seq_len": 128}
    flat = {"data": str(tmp_path / "bios"), "steps": 6, "batch_size": 2, "lr": 1e-2, "warmup_steps": 1}
    train(tmp_path / "run", resolve_run_config({}, model, {**flat, "checkpoint_every": 2, "keep_checkpoints": 5}))
    out = CliRunner().invoke(app, ["capacity", str(tmp_path / "run"), "--curve", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    curve = pd.read_csv(tmp_path / "run" / "capacity_curve.csv")
    assert curve["checkpoint"].tolist() == [2, 4, 6] and curve["exposures"].is_monotonic_increasing
    for step, bpp in zip(curve["checkpoint"], curve["bits_per_param"]):
        saved = json.loads((tmp_path / "run" / f"capacity_checkpoint{step}.json").read_text())
        assert saved["bits_per_param"] == pytest.approx(bpp)
    assert curve["bits_per_param"].iloc[-1] == pytest.approx(
        estimate_capacity(tmp_path / "run", device="cpu")["bits_per_param"]
    )
    assert out.output.count("bits/param") == 3
    # Read again, the estimates on disk are reused; a checkpoint rewritten since is read anew.
    import os

    from synthlab.evaluation import capacity

    read = []

    def estimate(run_dir, checkpoint, **kw):  # records which checkpoints are read anew
        read.append(checkpoint)
        return {"checkpoint": checkpoint, "exposures": 0.0, "bits": 0.0, "bits_per_param": 0.0}

    monkeypatch.setattr(capacity, "estimate_capacity", estimate)
    again = capacity.learning_curve(tmp_path / "run", device="cpu")
    assert again["checkpoint"].tolist() == [2, 4, 6]
    assert again["bits_per_param"].tolist() == pytest.approx(curve["bits_per_param"].tolist())
    assert read == []
    later = (tmp_path / "run" / "capacity_checkpoint4.json").stat().st_mtime + 10
    os.utime(tmp_path / "run" / "checkpoint-4.pt", (later, later))
    anew = capacity.learning_curve(tmp_path / "run", device="cpu")
    assert read == [4] and anew["bits_per_param"].tolist()[0::2] == pytest.approx(
        curve["bits_per_param"][0::2].tolist()
    )
    (tmp_path / "run" / "capacity_checkpoint2.json").write_text("{not json")  # damaged: read anew
    (tmp_path / "run" / "capacity_checkpoint6.json").write_text("[]")  # not a report: read anew
    read.clear()
    capacity.learning_curve(tmp_path / "run", device="cpu")
    assert read == [2, 4, 6]  # 4 again: the stand-in wrote no report for it
    both = CliRunner().invoke(app, ["capacity", str(tmp_path / "run"), "--curve", "--checkpoint", "2"])
    assert both.exit_code != 0 and "either" in both.output
    train(tmp_path / "bare", resolve_run_config({}, model, {**flat, "keep_checkpoints": 1}))
    bare = CliRunner().invoke(app, ["capacity", str(tmp_path / "bare"), "--curve", "--device", "cpu"])
    assert bare.exit_code != 0 and "two or more kept checkpoints" in bare.output
