"""bioS generator: spans and QA answers re-derived from people.jsonl, unique names, variants,
determinism, bad input."""

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.tokenizer import WordTokenizer
from synthlab_generators.bios import TEMPLATES

runner = CliRunner()
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
ATTRIBUTES = ["birth_date", "birth_city", "university", "major", "work_city", "employer"]
PRONOUNS = {"male": {"He", "he", "His", "his", "him"}, "female": {"She", "she", "Her", "her"}}


def gen(out: Path, *args: str) -> None:
    result = runner.invoke(app, ["gen", "bios", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def expected_tokens(person: dict, attribute: str) -> list[str]:
    """The value as it must appear in text, derived from people.jsonl on its own."""
    if attribute == "birth_date":
        d = person["birth_date"]
        return [MONTHS[d["month"] - 1], str(d["day"]), ",", str(d["year"])]
    return person[attribute].replace(",", " ,").split()


def check_biography(rec: dict, person: dict, with_gender: bool) -> None:
    words = rec["text"].split()
    spans = rec["spans"]
    assert words[slice(*spans["name"])] == person["name"].split()
    for attribute in ATTRIBUTES:
        assert words[slice(*spans[attribute])] == expected_tokens(person, attribute), attribute
    if with_gender:
        (pronoun,) = words[slice(*spans["gender"])]
        assert pronoun in PRONOUNS[person["gender"]]
        assert not any(w in PRONOUNS["male"] | PRONOUNS["female"]
                       for w in words[: spans["gender"][0]])
    else:
        assert "gender" not in spans


def test_single_spans_answers_names(tmp_path):
    out = tmp_path / "d"
    gen(out, "--n-people", "300", "--seed", "4")
    people = read(out / "people.jsonl")
    train = read(out / "train.jsonl")
    test = read(out / "test.jsonl")
    assert len(people) == len(train) == 300 and len(test) == 300 * 6
    assert len({p["name"] for p in people}) == 300
    assert [r["person"] for r in train] == list(range(300))
    for rec in train:
        person = people[rec["person"]]
        check_biography(rec, person, with_gender=True)
        starts = [rec["spans"][a][0] for a in ATTRIBUTES]
        assert starts == sorted(starts)  # fixed sentence order
        assert rec["spans"]["name"][1] <= rec["text"].split().index(".")  # first sentence
    for rec in test:
        person = people[rec["person"]]
        assert rec["question"].startswith("<bos> ") and rec["question"].endswith(" ? <ans>")
        assert person["name"] in rec["question"]
        assert rec["answer"].split() == expected_tokens(person, rec["attribute"])
    assert Counter(r["attribute"] for r in test) == {a: 300 for a in ATTRIBUTES}
    # attributes are uniform and independent: every month and gender shows up
    assert {p["birth_date"]["month"] for p in people} == set(range(1, 13))
    assert {p["gender"] for p in people} == {"male", "female"}
    tok = WordTokenizer.from_file(out / "vocab.json")
    for rec in train:
        tok.encode(rec["text"])
    for rec in test:
        tok.encode(rec["question"] + " " + rec["answer"])


def test_work_city_is_the_employers_hq(tmp_path):
    out = tmp_path / "d"
    gen(out, "--n-people", "400")
    hq: dict[str, str] = {}
    for p in read(out / "people.jsonl"):
        assert hq.setdefault(p["employer"], p["work_city"]) == p["work_city"]


@pytest.mark.parametrize("variant", ["multi3", "permute", "fullname"])
def test_variants(tmp_path, variant):
    out = tmp_path / "d"
    gen(out, "--n-people", "100", "--variant", variant)
    people = read(out / "people.jsonl")
    train = read(out / "train.jsonl")
    per_person = Counter(r["person"] for r in train)
    assert set(per_person.values()) == {3 if variant == "multi3" else 1}
    for rec in train:
        check_biography(rec, people[rec["person"]], with_gender=variant != "fullname")
    if variant == "multi3":
        texts = {}
        for rec in train:
            texts.setdefault(rec["person"], set()).add(rec["text"])
        assert sum(len(t) == 3 for t in texts.values()) > 90  # fresh templates
    if variant == "permute":
        orders = {tuple(sorted(ATTRIBUTES, key=lambda a: r["spans"][a][0])) for r in train}
        assert len(orders) > 50
    if variant == "fullname":
        for rec in train:
            name = people[rec["person"]]["name"]
            assert rec["text"].count(name) >= 6


def test_templates_enough_and_distinct():
    for attribute, templates in TEMPLATES.items():
        assert len(set(templates)) == len(templates) >= 20, attribute
        for t in templates:
            assert t.split().count("{V}") == 1 and t.endswith(" .")


def test_determinism(tmp_path):
    gen(tmp_path / "a", "--n-people", "50", "--seed", "7")
    gen(tmp_path / "b", "--n-people", "50", "--seed", "7")
    gen(tmp_path / "c", "--n-people", "50", "--seed", "8")
    for name in ("meta.json", "vocab.json", "people.jsonl", "train.jsonl", "test.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a/people.jsonl").read_bytes() != (tmp_path / "c/people.jsonl").read_bytes()


@pytest.mark.parametrize("args, flag", [
    (["--n-people", "0"], "--n-people"),
    (["--n-people", "160000001"], "--n-people"),
    (["--variant", "multi0"], "--variant"),
    (["--variant", "shuffled"], "--variant"),
])
def test_bad_input(tmp_path, args, flag):
    result = runner.invoke(app, ["gen", "bios", *args, "--out", str(tmp_path / "d")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0]
    assert list(tmp_path.iterdir()) == []
