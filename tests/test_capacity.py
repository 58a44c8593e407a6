"""The capacity estimate: the formula on hand-computed numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from synthlab.capacity import ATTRIBUTE_VALUES, N0, S0, PersonLosses, capacity_bits, capacity_report, max_bits


def test_pools_match_mission():
    assert N0 == 160_000_000 and math.log2(N0) == pytest.approx(27.25, abs=0.005)
    assert math.log2(S0) == pytest.approx(47.59, abs=0.005)


def test_formula_on_a_hand_computed_example():
    # a loss of ln(N0) - 10 ln 2 nats on the name is 10 bits better than uniform, per person
    n = 1000
    p1 = math.log(N0) - 10 * math.log(2)
    p2 = math.log(S0) - 20 * math.log(2)
    assert capacity_bits(n, p1, p2) == pytest.approx(n * (10 + 20))
    # max for 1000 people: names carry log2(160000) = 17.29 bits, attributes 47.59
    assert max_bits(n) == pytest.approx(1000 * (17.2877 + 47.5916), rel=1e-4)


def test_terms_worse_than_uniform_count_as_zero():
    n = 10
    p2 = math.log(S0) - 5 * math.log(2)
    assert capacity_bits(n, 2 * math.log(N0), p2) == pytest.approx(n * 5)
    assert capacity_bits(n, 100.0, 100.0) == 0.0


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
    from synthlab.train import train
    from synthlab_generators import TASKS, write_dataset

    data = root / "bios"
    if not data.exists():
        write_dataset(TASKS["bios"], TASKS["bios"].params_cls(n_people=8), 0, data)
    model = {"d_model": 48, "n_heads": 2, "n_layers": 1, "max_seq_len": 128}
    run = resolve_run_config({}, model, {"data": str(data), "steps": steps, "batch_size": 4, "lr": lr, "warmup_steps": 5})
    train(root / name, run, progress=False)
    return root / name


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory):
    return bios_run(tmp_path_factory.mktemp("cap"), "untrained", steps=1, lr=1e-9)


def test_untrained_model_stores_nothing(untrained_run):
    from synthlab.capacity import estimate_capacity

    report = estimate_capacity(untrained_run, device="cpu")
    assert report["bits"] == 0.0
    assert report["bits_name"] < 0 and report["bits_attributes"] < 0  # worse than uniform over the pools
    saved = json.loads((untrained_run / "capacity.json").read_text())
    assert {"p1", "p2", "n_people", "bits", "max_bits", "params", "bits_per_param"} <= saved.keys()
    assert saved["params"] < saved["params_all"]  # unused embedding rows are not counted


def test_bios_eval_reports_qa_and_biography_recall_per_attribute(untrained_run):
    from synthlab.evaluate import evaluate_run

    result = evaluate_run(untrained_run, device="cpu")
    assert result["n_examples"] == 8 * 6 and result["group_key"] == "attribute"
    assert set(result["accuracy_per_group"]) == {"birth_date", "birth_city", "university", "major", "work_city", "employer"}
    assert set(result["biography_recall"]) == {"name", "gender", *result["accuracy_per_group"]}
    assert all(0 <= row["accuracy"] <= 1 and row["loss"] > 0 for row in result["biography_recall"].values())


@pytest.mark.slow
def test_a_model_that_memorises_tiny_n_approaches_the_maximum(tmp_path):
    from synthlab.capacity import estimate_capacity

    from synthlab.evaluate import evaluate_run

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

    from synthlab.capacity import person_losses
    from synthlab.data import load_dataset
    from synthlab.runs import open_run

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
