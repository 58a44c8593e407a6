"""bioS(N): synthetic biographies of N people (knowledge capacity, Physics of LMs 3.3).

Each person has a unique full name (first x middle x last from pools of 400 / 400 / 1000), a
gender, a birth date (12 months x 28 days x 200 years), a birth city (200), a university (300),
a major (100) and an employer (263) whose headquarters city is the work city. Attributes are
drawn uniformly and independently. The pools ship in `pools/` with their licence notice
(read in bios_words.py, with the sentence templates and the vocabulary). `pool_scale` below 1
draws from the first ceil(scale x size) entries of every pool and of the birth years (months and
days stay whole): fewer values, a smaller vocabulary, the same templates; the capacity estimate
takes N0 and S0 from the pools in use.

Files
  people.jsonl  one person a line: name, gender, birth_date {month (1-12), day, year},
                birth_city, university, major, employer, work_city (the pools' own spelling).
  train.jsonl   one biography a line: `text`, `person` (index into people.jsonl), `spans`:
                attribute -> [start, end) token positions in text.split() for `name` (the full
                name's first occurrence), `gender` (the first pronoun; absent in the fullname
                variant, which has none) and the six attribute values (with the token after
                the value where the value is a prefix of another, see below).
  test.jsonl    one QA record per person and attribute: `question` ("<bos> ... ? <ans>"),
                `answer` (the value's tokens), `person`, `attribute`.

A biography is six sentences in a fixed order (birth date, birth city, university, major, work
city, employer), each from one of 22 templates per attribute drawn at random. The first sentence
uses the full name and later ones pronouns. Variants: `single` (one biography per person),
`multiM` (M biographies per person, templates drawn afresh for each: the paper's multi5, fresh
templates per exposure of a person), `permute` (sentence order shuffled per biography),
`fullname` (the full name in every sentence). Pool values are tokenized by splitting on spaces
with commas as their own token ("Princeton , NJ"); biography texts carry no special tokens.

The spans are what the capacity estimate (Physics of LMs 3.3, Definition 4.3) scores, so a
scored token must pay only for a fact about the person, never for which template was drawn (as in
the paper's generator), in every variant alike:
- every sentence starts with its subject (the full name, else He / She): the name is read before
  any value, no value or date starts a sentence, and the first pronoun (the `gender` span) has a
  form the template forces (He, or a pronoun in a template already determined), so it pays for
  the gender alone;
- the words before a value never begin another template of any attribute (across attributes too,
  for `permute`): at the value the template, the attribute and the words after it are known;
- where a value is a token prefix of another of its pool ("Business" / "Business Administration",
  "Caterpillar" / "Caterpillar Inc."), its span takes in the next template token: deciding that
  the value ends is part of recalling it, so a model uniform over a pool pays log(pool size).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

import numpy as np
from tqdm import tqdm

from synthlab_generators.bios_words import (
    ATTRIBUTES,
    FIRST_YEAR,
    GENDERS,
    MONTHS,
    N_DAYS,
    PRONOUNS,
    QUESTIONS,
    TEMPLATES,
    date_tokens,
    ended_values,
    n_years,
    pools,
    tokens,
    value_tokens,
)
from synthlab_generators.common import (
    SPECIAL_TOKENS,
    Dataset,
    TaskParams,
    TaskShape,
    TaskSpec,
    chunked,
    json_line,
    param,
)

SPAN_KEYS = ("name", "gender", *ATTRIBUTES)


@dataclass(frozen=True)
class BiosParams(TaskParams):
    """Parameters of `synthlab gen bios`."""

    n_people: int = param(1_000, "Number of people N (unique full names; at most 400 x 400 x 1000).")
    pool_scale: float = param(
        1.0,
        "Share of every value pool in use (names, birth years, cities, universities, majors, "
        "employers): the first ceil(share x size) of each. 1: Physics of LMs 3.3's bioS.",
    )
    variant: str = param(
        "single",
        "single (one biography per person), multiM (M biographies "
        "per person, e.g. multi5), permute (sentence order "
        "shuffled), fullname (full name in every sentence).",
    )

    def __post_init__(self) -> None:
        scale = self.pool_scale
        self.require(
            isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale <= 1,
            "pool_scale",
            "must be a number in (0, 1]",
        )
        self.require_int("n_people", 1, name_values(scale))
        multi = re.fullmatch(r"multi(\d+)", self.variant)
        self.require(
            self.variant in ("single", "permute", "fullname")
            or (multi is not None and 1 <= int(multi.group(1)) <= 100),
            "variant",
            "must be single, permute, fullname or multiM with M in 1..100",
        )

    @property
    def biographies_per_person(self) -> int:
        return int(self.variant[5:]) if self.variant.startswith("multi") else 1


def name_values(pool_scale: float = 1.0) -> int:
    """N0: the number of distinct full names (first x middle x last pool sizes in use)."""
    p = pools(pool_scale)
    return len(p["first"]) * len(p["middle"]) * len(p["last"])


def attribute_values(pool_scale: float = 1.0) -> dict[str, int]:
    """Values each attribute is drawn from uniformly, in the order capacity scores them; the
    product is S0. The work city is the employer's headquarters, so it adds no values of its
    own and is scored with the employer."""
    p = pools(pool_scale)
    return {
        "gender": len(GENDERS),
        "birth_date": len(MONTHS) * N_DAYS * n_years(pool_scale),
        "birth_city": len(p["birth_city"]),
        "university": len(p["university"]),
        "major": len(p["major"]),
        "employer": len(p["employer"]),
    }


def _draw_people(n: int, pool_scale: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    p = pools(pool_scale)
    names = rng.choice(name_values(pool_scale), size=n, replace=False)  # unique full names
    first, rest = np.divmod(names, len(p["middle"]) * len(p["last"]))
    middle, last = np.divmod(rest, len(p["last"]))
    return {
        "first": first,
        "middle": middle,
        "last": last,
        "gender": rng.integers(0, 2, n),
        "month": rng.integers(1, 13, n),
        "day": rng.integers(1, N_DAYS + 1, n),
        "year": rng.integers(FIRST_YEAR, FIRST_YEAR + n_years(pool_scale), n),
        "birth_city": rng.integers(0, len(p["birth_city"]), n),
        "university": rng.integers(0, len(p["university"]), n),
        "major": rng.integers(0, len(p["major"]), n),
        "employer": rng.integers(0, len(p["employer"]), n),
    }


class _Person:
    """One person's full name and attribute values as token strings (built once)."""

    def __init__(self, draws: dict[str, list[int]], i: int, tok: dict, ended: dict) -> None:
        self.name = " ".join(
            tok["first"][draws["first"][i]] + tok["middle"][draws["middle"][i]] + tok["last"][draws["last"][i]]
        )
        self.gender = draws["gender"][i]
        employer = draws["employer"][i]
        values = (
            date_tokens(draws["month"][i], draws["day"][i], draws["year"][i]),
            tok["birth_city"][draws["birth_city"][i]],
            tok["university"][draws["university"][i]],
            tok["major"][draws["major"][i]],
            tok["work_city"][employer],
            tok["employer"][employer],
        )  # in ATTRIBUTES order
        self.values = [" ".join(v) for v in values]
        self.value_lengths = [len(v) for v in values]
        self.span_lengths = [len(v) + (v in ended.get(a, ())) for a, v in zip(ATTRIBUTES, values)]


# How a sentence refers to the person: the full name at the first mention then pronouns (the
# biography's first sentence), pronouns only (later sentences), the full name always (fullname).
NAME_FIRST, PRONOUNS_ONLY, NAME_ALWAYS = 0, 1, 2
NAME_TOKENS = 3  # first, middle, last: every name pool entry is one token


@dataclass(frozen=True)
class _Sentence:
    """A template filled for one way of referring to a person of one gender.

    `text` keeps two fields, {n} (the full name) and {v} (the value). Token offsets count from
    the sentence start without the value's tokens; the value's length is added to an offset
    when the span comes after the value."""

    text: str
    n_tokens: int  # tokens besides the value's
    value_at: int
    name_at: tuple[int, bool] | None  # (offset, after the value?) of the first full name
    pronoun_at: tuple[int, bool] | None  # (offset, after the value?) of the first pronoun


def _compile(template: str, mode: int, gender: int) -> _Sentence:
    """Resolve a template's placeholders for one mode and gender, once, ahead of generation."""
    words: list[str] = []
    count, value_at, name_at, pronoun_at = 0, -1, None, None
    for part in template.split():
        if part == "{V}":
            words.append("{v}")
            value_at = count
        elif part in PRONOUNS and (mode == NAME_ALWAYS or (mode == NAME_FIRST and not name_at)):
            name_at = name_at or (count, value_at >= 0)
            words.append("{n}" + (" 's" if part == "{p}" else ""))
            count += NAME_TOKENS + (part == "{p}")
        elif part in PRONOUNS:
            pronoun_at = pronoun_at or (count, value_at >= 0)
            words.append(PRONOUNS[part][gender])
            count += 1
        else:
            words.append(part)
            count += 1
    return _Sentence(" ".join(words), count, value_at, name_at, pronoun_at)


@cache
def _compiled() -> list[list[list[list[_Sentence]]]]:
    """[attribute][template][mode][gender] -> _Sentence."""
    return [
        [
            [[_compile(t, mode, g) for g in range(len(GENDERS))] for mode in (NAME_FIRST, PRONOUNS_ONLY, NAME_ALWAYS)]
            for t in TEMPLATES[a]
        ]
        for a in ATTRIBUTES
    ]


def _biography(
    person: _Person, template_ids: list[int], order: list[int], fullname: bool
) -> tuple[str, dict[str, tuple[int, int]]]:
    """The text of one biography and the [start, end) token spans of the first full name, the
    first pronoun and each value."""
    compiled = _compiled()
    pieces: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    position = 0
    for k, a in enumerate(order):
        mode = NAME_ALWAYS if fullname else NAME_FIRST if k == 0 else PRONOUNS_ONLY
        sentence = compiled[a][template_ids[a]][mode][person.gender]
        length = person.value_lengths[a]
        pieces.append(sentence.text.format(n=person.name, v=person.values[a]))
        start = position + sentence.value_at
        spans[ATTRIBUTES[a]] = (start, start + person.span_lengths[a])
        if sentence.name_at and "name" not in spans:
            start = position + sentence.name_at[0] + length * sentence.name_at[1]
            spans["name"] = (start, start + NAME_TOKENS)
        if sentence.pronoun_at and "gender" not in spans:
            start = position + sentence.pronoun_at[0] + length * sentence.pronoun_at[1]
            spans["gender"] = (start, start + 1)
        position += sentence.n_tokens + length
    return " ".join(pieces), spans


def generate(params: BiosParams, rng: np.random.Generator) -> Dataset:
    n, scale = params.n_people, params.pool_scale
    draws = {k: v.tolist() for k, v in _draw_people(n, scale, rng).items()}
    tok = {k: [value_tokens(v) for v in vs] for k, vs in pools(scale).items()}
    ended = ended_values(scale)
    people = [_Person(draws, i, tok, ended) for i in range(n)]

    per_person = params.biographies_per_person
    n_bios = n * per_person
    template_ids = np.stack([rng.integers(0, len(TEMPLATES[a]), n_bios) for a in ATTRIBUTES], axis=1).tolist()
    orders = np.tile(np.arange(len(ATTRIBUTES)), (n_bios, 1))
    if params.variant == "permute":
        orders = rng.permuted(orders, axis=1)
    orders = orders.tolist()
    fullname = params.variant == "fullname"

    def train_lines():
        for b in tqdm(range(n_bios), desc="bios", unit="bio", disable=None, mininterval=1):
            person = b % n  # multiM: round r holds everyone's r-th biography
            text, spans = _biography(people[person], template_ids[b], orders[b], fullname)
            # json.dumps layout, formatted directly (3x faster; no token needs escaping)
            listed = ", ".join(f'"{key}": [{spans[key][0]}, {spans[key][1]}]' for key in SPAN_KEYS if key in spans)
            yield f'{{"text": "{text}", "person": {person}, "spans": {{{listed}}}}}\n'

    def people_lines():
        p = pools(scale)
        for i in range(n):
            employer = draws["employer"][i]
            yield json_line(
                {
                    "name": people[i].name,
                    "gender": GENDERS[draws["gender"][i]],
                    "birth_date": {"month": draws["month"][i], "day": draws["day"][i], "year": draws["year"][i]},
                    "birth_city": p["birth_city"][draws["birth_city"][i]],
                    "university": p["university"][draws["university"][i]],
                    "major": p["major"][draws["major"][i]],
                    "employer": p["employer"][employer],
                    "work_city": p["work_city"][employer],
                }
            )

    def test_lines():
        for i, person in enumerate(people):
            for attribute, answer in zip(ATTRIBUTES, person.values):
                question = QUESTIONS[attribute].format(name=person.name)
                yield (
                    f'{{"question": "<bos> {question} <ans>", "answer": "{answer}", '
                    f'"person": {i}, "attribute": "{attribute}"}}\n'
                )

    return Dataset(
        tokens=tokens(scale),
        files={
            "people.jsonl": chunked(people_lines()),
            "train.jsonl": chunked(train_lines()),
            "test.jsonl": chunked(test_lines()),
        },
        counts={"people": n, "train": n_bios, "test": n * len(ATTRIBUTES)},
        extra={
            "bits_name_pool": float(np.log2(name_values(scale))),
            "templates_per_attribute": {a: len(ts) for a, ts in TEMPLATES.items()},
        },
    )


def _mean_tokens(values) -> float:
    return sum(len(value_tokens(v)) for v in values) / len(values)


def shape(params: BiosParams) -> TaskShape:
    """Vocabulary from the pools and templates; biographies are packed (no row length). Tokens
    per biography (<bos> and <eos> included) are its exact expectation: templates and values
    are drawn uniformly, the name fills the first sentence's first reference (every sentence's
    in the fullname variant) and the gender does not change a sentence's length."""
    p, compiled = pools(params.pool_scale), _compiled()
    value = {
        "birth_date": 4.0,
        "birth_city": _mean_tokens(p["birth_city"]),
        "university": _mean_tokens(p["university"]),
        "major": _mean_tokens(p["major"]),
        "work_city": _mean_tokens(p["work_city"]),
        "employer": _mean_tokens(p["employer"]),
    }

    def sentence(a: int, mode: int) -> float:  # mean over templates (and genders)
        lengths = [s.n_tokens for t in compiled[a] for s in t[mode]]
        return sum(lengths) / len(lengths)

    n = len(ATTRIBUTES)
    if params.variant == "fullname":
        modes = [{NAME_ALWAYS: 1.0}] * n
    elif params.variant == "permute":  # each attribute leads with probability 1 / n
        modes = [{NAME_FIRST: 1 / n, PRONOUNS_ONLY: 1 - 1 / n}] * n
    else:  # the fixed order: the first attribute's sentence names the person
        modes = [{NAME_FIRST: 1.0}] + [{PRONOUNS_ONLY: 1.0}] * (n - 1)
    mean = 2 + sum(
        value[a] + sum(w * sentence(i, mode) for mode, w in modes[i].items()) for i, a in enumerate(ATTRIBUTES)
    )
    return TaskShape(
        vocab_size=len(SPECIAL_TOKENS) + len(tokens(params.pool_scale)),
        row_len=None,
        tokens_per_record=mean,
        train_records=params.n_people * params.biographies_per_person,
    )


SPEC = TaskSpec(
    name="bios",
    params_cls=BiosParams,
    generate=generate,
    help="bioS(N): synthetic biographies of N people with spans, and QA test records.",
    shape=shape,
    extra_files=("people.jsonl",),
    group_key="attribute",
    headline="bits_per_param",
    pack=True,
    data_columns={"n_people": "n_people"},
)
