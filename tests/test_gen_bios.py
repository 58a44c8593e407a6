"""bioS generator: spans and QA answers re-derived from people.jsonl, unique names, variants,
determinism, bad input."""

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from synthlab.cli import app
from synthlab.data.tokenizer import WordTokenizer
from synthlab_generators.bios_words import POOLS, TEMPLATES, pools

runner = CliRunner()
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
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


def prefix_values(pool_values: dict) -> dict[str, set[tuple[str, ...]]]:
    """Attribute -> values that are a token prefix of another value of the same pool (re-derived)."""
    out = {}
    for attribute in ATTRIBUTES[1:]:
        values = {tuple(v.replace(",", " ,").split()) for v in pool_values[attribute]}
        out[attribute] = {a for a in values if any(b != a and b[: len(a)] == a for b in values)}
    return out


PREFIX_VALUES = prefix_values(pools())


def check_biography(rec: dict, person: dict, with_gender: bool, prefixes: dict = PREFIX_VALUES) -> None:
    words = rec["text"].split()
    spans = rec["spans"]
    assert words[slice(*spans["name"])] == person["name"].split()
    for attribute in ATTRIBUTES:
        value = expected_tokens(person, attribute)
        start, end = spans[attribute]
        assert words[start : start + len(value)] == value, attribute
        # a value that is a prefix of another takes in the token that ends it, and only then
        assert end - start == len(value) + (tuple(value) in prefixes.get(attribute, ())), attribute
        assert start > spans["name"][0]  # no value precedes the name
    if with_gender:
        (pronoun,) = words[slice(*spans["gender"])]
        assert pronoun in PRONOUNS[person["gender"]]
        assert not any(w in PRONOUNS["male"] | PRONOUNS["female"] for w in words[: spans["gender"][0]])
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


def test_a_pool_scale_draws_from_the_first_values_of_each_pool(tmp_path):
    """--pool-scale 0.1: every value is one of the first ceil(0.1 x size) lines of its pool file
    (read here), each of those shows up among 2,000 people, birth years are 1900-1919, the spans
    hold with the prefixes of the pools in use, and the vocabulary is smaller than at scale 1."""
    out = tmp_path / "d"
    gen(out, "--n-people", "2000", "--pool-scale", "0.1")

    def first(name: str) -> list[str]:
        lines = [
            line.strip() for line in (POOLS / f"{name}.txt").read_text(encoding="utf-8").splitlines() if line.strip()
        ]
        return lines[: math.ceil(round(0.1 * len(lines), 9))]

    companies = [line.split(";") for line in first("company")]
    in_use = {
        "birth_city": first("city"),
        "university": first("university"),
        "major": first("field"),
        "employer": [name.strip() for name, _ in companies],
        "work_city": [city.strip() for _, city in companies],
    }
    people = read(out / "people.jsonl")
    names = [p["name"].split() for p in people]
    for k, pool in enumerate(("first_name", "middle_name", "last_name")):
        assert {n[k] for n in names} <= set(first(pool)), pool
    assert {n[0] for n in names} == set(first("first_name"))  # 40 names among 2,000 people: all drawn
    for attribute, values in in_use.items():
        assert {p[attribute] for p in people} == set(values), attribute
    assert {p["birth_date"]["year"] for p in people} == set(range(1900, 1920))
    prefixes = prefix_values(in_use)
    for rec in read(out / "train.jsonl"):
        check_biography(rec, people[rec["person"]], with_gender=True, prefixes=prefixes)
    gen(tmp_path / "full", "--n-people", "10")
    scaled, full = (WordTokenizer.from_file(d / "vocab.json") for d in (out, tmp_path / "full"))
    assert len(scaled) < len(full) / 4


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


def sentences(rec: dict, person: dict) -> list[list[str]]:
    """A biography as sentences of items: "<name>" for the first full name, "<attribute>" for a
    value (its own tokens, not the end token), "<gender>" for the first pronoun, else the word."""
    words, spans = rec["text"].split(), rec["spans"]
    marks = {spans["name"][0]: ("<name>", 3), spans["gender"][0]: ("<gender>", 1)}
    marks.update({spans[a][0]: (f"<{a}>", len(expected_tokens(person, a))) for a in ATTRIBUTES})
    out, sentence, i = [], [], 0
    while i < len(words):
        item, width = marks.get(i, (words[i], 1))
        sentence.append(item if item != "<gender>" else words[i] + "<gender>")
        i += width
        if item == ".":
            out.append(sentence)
            sentence = []
    assert not sentence and len(out) == len(ATTRIBUTES)
    return out


@pytest.mark.parametrize("variant", ["single", "multi5", "permute"])
def test_scored_tokens_pay_for_the_person_not_the_template(tmp_path, variant):
    """Re-derived from the text of male biographies (female "her" is both possessive and object):
    every sentence starts with the subject (the name, then He), and whatever preceded a value, the
    first pronoun or a value's next token in one sentence is always followed by that same item,
    across all sentences of all attributes: the template is known when a scored token comes."""
    out = tmp_path / "d"
    gen(out, "--n-people", "1200", "--variant", variant, "--seed", "3")
    people = read(out / "people.jsonl")
    bios = [
        sentences(r, people[r["person"]]) for r in read(out / "train.jsonl") if people[r["person"]]["gender"] == "male"
    ]
    follows: dict[tuple[str, ...], set[str]] = {}
    for bio in bios:
        for sentence in bio:
            for i in range(1, len(sentence)):
                follows.setdefault(tuple(sentence[:i]), set()).add(sentence[i])
    scored = {f"<{a}>" for a in ATTRIBUTES}
    checked = 0
    for bio in bios:
        assert bio[0][0] == "<name>" and all(s[0] in ("He", "He<gender>") for s in bio[1:])
        gender = [(k, i) for k, s in enumerate(bio) for i, item in enumerate(s) if item.endswith("<gender>")]
        assert len(gender) == 1
        k, i = gender[0]
        assert (k, i) == (1, 0) or k == 0  # He opening the second sentence, or inside the first
        for sentence in bio:
            for i in range(1, len(sentence)):
                if sentence[i] in scored or sentence[i - 1] in scored or sentence[i].endswith("<gender>"):
                    assert len(follows[tuple(sentence[:i])]) == 1, (sentence[:i], follows[tuple(sentence[:i])])
                    checked += 1
    assert checked > 1000


def test_spans_are_the_same_in_every_variant(tmp_path):
    """Same seed, same people: a person's spans hold the same tokens (and take an end token for the
    same values) whichever the variant and template."""
    seen: dict[int, dict] = {}
    for variant in ("single", "multi5", "permute"):
        gen(tmp_path / variant, "--n-people", "200", "--variant", variant, "--seed", "5")
        people = read(tmp_path / variant / "people.jsonl")
        for rec in read(tmp_path / variant / "train.jsonl"):
            words, person = rec["text"].split(), people[rec["person"]]
            own = {"name": 3, **{a: len(expected_tokens(person, a)) for a in ATTRIBUTES}}
            view = {k: (words[s : s + own[k]], e - s) for k, (s, e) in rec["spans"].items() if k in own}
            assert seen.setdefault(rec["person"], view) == view, (variant, rec["person"])
    assert len(seen) == 200


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


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--n-people", "0"], "--n-people"),
        (["--n-people", "160000001"], "--n-people"),
        (["--variant", "multi0"], "--variant"),
        (["--variant", "shuffled"], "--variant"),
    ],
)
def test_bad_input(tmp_path, args, flag):
    result = runner.invoke(app, ["gen", "bios", *args, "--out", str(tmp_path / "d")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0]
    assert list(tmp_path.iterdir()) == []
