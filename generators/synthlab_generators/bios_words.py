"""The words of bioS: the attribute value pools (shipped in `pools/` with their licence notice),
the birth dates, the sentence templates, questions and pronouns, and the closed vocabulary built
from them. bios.py draws people from these and renders their biographies."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

POOLS = Path(__file__).parent / "pools"
MONTHS = (
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
)
FIRST_YEAR, N_YEARS, N_DAYS = 1900, 200, 28
ATTRIBUTES = ("birth_date", "birth_city", "university", "major", "work_city", "employer")

# Placeholders: {S} the subject at the start of a sentence (the full name where the biography
# names the person, else He / She), {s} a later subject (he / she), {p} a possessive (his / her;
# "NAME 's" in the fullname variant), {V} the attribute value. Punctuation is already a separate
# token. Every template starts with {S}, and the words before {V} of one template are never the
# first words of another template (of any attribute): the test re-derives both from generated text.
TEMPLATES = {
    "birth_date": (
        "{S} was born on {V} .",
        "{S} came into this world on {V} .",
        "{S} has a birthday on {V} .",
        "{S} entered the world on {V} .",
        "{S} gives {V} as {p} date of birth .",
        "{S} first saw the light of day on {V} .",
        "{S} was brought into the world on {V} .",
        "{S} arrived on {V} .",
        "{S} was welcomed into the world on {V} .",
        "{S} has been alive since {V} .",
        "{S} was welcomed by the family on {V} .",
        "{S} began life on {V} .",
        "{S} was born early in the morning of {V} .",
        "{S} has celebrated every birthday since {V} .",
        "{S} marks {V} as {p} date of birth .",
        "{S} lists {V} as {p} birth date .",
        "{S} is recorded as born on {V} .",
        "{S} was delivered on {V} .",
        "{S} started out in life on {V} .",
        "{S} drew a first breath on {V} .",
        "{S} holds a birth certificate dated {V} .",
        "{S} was born , according to the records , on {V} .",
    ),
    "birth_city": (
        "{S} was born in {V} .",
        "{S} spent the early years in {V} .",
        "{S} has a birthplace in {V} .",
        "{S} hails from {V} .",
        "{S} came into the world in {V} .",
        "{S} is a native of {V} .",
        "{S} grew up in {V} , where {s} was born .",
        "{S} regards {V} as {p} hometown .",
        "{S} was born and raised in {V} .",
        "{S} has roots in {V} .",
        "{S} calls {V} {p} birthplace .",
        "{S} started life in {V} .",
        "{S} first opened {p} eyes in {V} .",
        "{S} originally comes from {V} .",
        "{S} names {V} as {p} place of birth .",
        "{S} was delivered in a hospital in {V} .",
        "{S} traces {p} origins to {V} .",
        "{S} was welcomed by a family in {V} .",
        "{S} was brought up in {V} , the city of {p} birth .",
        "{S} spent a childhood in {V} .",
        "{S} is originally from {V} .",
        "{S} was raised in {V} .",
    ),
    "university": (
        "{S} studied at {V} .",
        "{S} graduated from {V} .",
        "{S} attended {V} .",
        "{S} was schooled at {V} .",
        "{S} is a graduate of {V} .",
        "{S} completed a degree at {V} .",
        "{S} pursued higher education at {V} .",
        "{S} counts {V} as {p} alma mater .",
        "{S} enrolled at {V} .",
        "{S} spent the college years at {V} .",
        "{S} earned a degree from {V} .",
        "{S} was educated at {V} .",
        "{S} went to college at {V} .",
        "{S} took classes at {V} .",
        "{S} went to university at {V} .",
        "{S} holds a degree from {V} .",
        "{S} did undergraduate work at {V} .",
        "{S} studied for a degree at {V} .",
        "{S} was admitted to {V} .",
        "{S} spent four years at {V} .",
        "{S} finished undergraduate studies at {V} .",
        "{S} was a student at {V} .",
    ),
    "major": (
        "{S} majored in {V} .",
        "{S} read {V} in college .",
        "{S} had a major in {V} .",
        "{S} specialized in {V} .",
        "{S} focused on {V} .",
        "{S} earned a degree in {V} .",
        "{S} completed studies in {V} .",
        "{S} picked {V} as {p} field of study .",
        "{S} chose {V} as {p} major .",
        "{S} concentrated on {V} .",
        "{S} pursued a degree in {V} .",
        "{S} devoted {p} studies to {V} .",
        "{S} graduated with a major in {V} .",
        "{S} took up {V} .",
        "{S} made {V} {p} academic focus .",
        "{S} received training in {V} .",
        "{S} obtained a degree in {V} .",
        "{S} dedicated the college years to {V} .",
        "{S} learned {V} in college .",
        "{S} developed expertise in {V} .",
        "{S} explored {V} as {p} field of study .",
        "{S} became a student of {V} .",
    ),
    "work_city": (
        "{S} works in {V} .",
        "{S} is employed in {V} .",
        "{S} has a job in {V} .",
        "{S} goes to a workplace in {V} .",
        "{S} spends the working days in {V} .",
        "{S} commutes to work in {V} .",
        "{S} built a career in {V} .",
        "{S} has an office in {V} .",
        "{S} earns a living in {V} .",
        "{S} found work in {V} .",
        "{S} is based in {V} for work .",
        "{S} reports to work in {V} .",
        "{S} relocated to {V} for work .",
        "{S} practices {p} profession in {V} .",
        "{S} holds a position in {V} .",
        "{S} pursues a career in {V} .",
        "{S} works out of {V} .",
        "{S} does {p} job in {V} .",
        "{S} moved to {V} to work .",
        "{S} lives a professional life in {V} .",
        "{S} clocks in every day in {V} .",
        "{S} is employed at an office in {V} .",
    ),
    "employer": (
        "{S} works for {V} .",
        "{S} is employed by {V} .",
        "{S} gets paid by {V} .",
        "{S} has a job at {V} .",
        "{S} works at {V} .",
        "{S} is on the staff of {V} .",
        "{S} receives a salary from {V} .",
        "{S} joined {V} .",
        "{S} holds a position at {V} .",
        "{S} is part of the team at {V} .",
        "{S} was hired by {V} .",
        "{S} serves at {V} .",
        "{S} is a member of the workforce of {V} .",
        "{S} is on the books of {V} .",
        "{S} builds a career at {V} .",
        "{S} draws a paycheck from {V} .",
        "{S} is an employee of {V} .",
        "{S} is employed with {V} .",
        "{S} contributes to {V} .",
        "{S} is on the payroll of {V} .",
        "{S} took a job with {V} .",
        "{S} works as a staff member at {V} .",
    ),
}
QUESTIONS = {
    "birth_date": "When was {name} born ?",
    "birth_city": "Where was {name} born ?",
    "university": "Which university did {name} attend ?",
    "major": "What did {name} study ?",
    "work_city": "Where does {name} work ?",
    "employer": "Which company does {name} work for ?",
}
PRONOUNS = {"{S}": ("He", "She"), "{s}": ("he", "she"), "{p}": ("his", "her")}  # (male, female)
GENDERS = ("male", "female")


def value_tokens(value: str) -> tuple[str, ...]:
    """A pool value as tokens: split on spaces, commas as separate tokens."""
    return tuple(value.replace(",", " ,").split())


def in_use(size: int, pool_scale: float) -> int:
    """How many entries of a pool of `size` a population of this pool scale draws from: the first
    ceil(scale x size), at least one (all of them at scale 1, Physics of LMs 3.3's bioS)."""
    return max(1, math.ceil(pool_scale * size - 1e-9))


def n_years(pool_scale: float = 1.0) -> int:
    """Birth years in use: FIRST_YEAR onward, N_YEARS of them at scale 1."""
    return in_use(N_YEARS, pool_scale)


@cache
def pools(pool_scale: float = 1.0) -> dict[str, tuple[str, ...]]:
    """Pool name -> the values a population of this scale draws from (the first `in_use` of each
    file, in file order; each employer keeps its headquarters city)."""
    full = _pool_files()
    if pool_scale == 1.0:
        return full
    out = {key: values[: in_use(len(values), pool_scale)] for key, values in full.items()}
    out["work_city"] = full["work_city"][: len(out["employer"])]
    return out


@cache
def _pool_files() -> dict[str, tuple[str, ...]]:
    """Pool name -> values, in file order (employer and work city split from company.txt)."""

    def read(name: str) -> tuple[str, ...]:
        lines = (POOLS / f"{name}.txt").read_text(encoding="utf-8").splitlines()
        return tuple(line.strip() for line in lines if line.strip())

    companies = [line.split(";") for line in read("company")]
    out = {
        "first": read("first_name"),
        "middle": read("middle_name"),
        "last": read("last_name"),
        "birth_city": read("city"),
        "university": read("university"),
        "major": read("field"),
        "employer": tuple(name.strip() for name, _ in companies),
        "work_city": tuple(city.strip() for _, city in companies),
    }
    for values in out.values():  # bios.py formats its lines without a JSON encoder
        assert not any('"' in v or "\\" in v or "{" in v for v in values)
    for key in ("first", "middle", "last"):  # a full name is bios.NAME_TOKENS tokens
        assert all(len(value_tokens(v)) == 1 for v in out[key])
    return out


@cache
def ended_values(pool_scale: float = 1.0) -> dict[str, frozenset[tuple[str, ...]]]:
    """Attribute -> the values (as tokens) that are a token prefix of another of the same pool in
    use ("Business" of "Business Administration"): their span takes in the template's next token."""
    out = {}
    for key in ATTRIBUTES[1:]:
        values = {value_tokens(v) for v in pools(pool_scale)[key]}
        out[key] = frozenset(a for a in values for b in values if len(b) > len(a) and b[: len(a)] == a)
    return out


def date_tokens(month: int, day: int, year: int) -> tuple[str, ...]:
    return (MONTHS[month - 1], str(day), ",", str(year))


def tokens(pool_scale: float = 1.0) -> list[str]:
    """The closed vocabulary (without specials): template, question and pool words, for the pools
    and birth years of this scale (at scale 1 every word of every pool file)."""
    words: dict[str, None] = {}
    for text in [t for ts in TEMPLATES.values() for t in ts] + list(QUESTIONS.values()):
        words.update(dict.fromkeys(w for w in text.split() if not w.startswith("{")))
    for pair in PRONOUNS.values():
        words.update(dict.fromkeys(pair))
    words["'s"] = None
    words.update(dict.fromkeys(MONTHS))
    words.update(dict.fromkeys(str(d) for d in range(1, N_DAYS + 1)))
    words.update(dict.fromkeys(str(y) for y in range(FIRST_YEAR, FIRST_YEAR + n_years(pool_scale))))
    for values in pools(pool_scale).values():
        for value in values:
            words.update(dict.fromkeys(value_tokens(value)))
    return list(words)
