"""Generation speed: the library against a straightforward pure-Python generator, same run.

Targets: mano L=24 with 1,000,000 training records in <= 30 s on 2 CPU cores; bios
N=100,000 in <= 30 s. Both are timed end to end (generate, write, hash) through
`write_dataset`. The baselines below are what one would write first: a recursive tree per
record, `random.Random`, `json.dumps` per line. They run on `--baseline-share` of the records
(the full size would take minutes) and are compared per record; rounds interleave baseline and
library so that machine noise hits both.

    .venv/bin/python benchmarks/bench_gen.py [--mano-n 1000000] [--bios-n 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from synthlab_generators import TASKS, write_dataset
from synthlab_generators.bios_words import ATTRIBUTES, MONTHS, QUESTIONS, TEMPLATES, pools

# --- pure-Python baselines ------------------------------------------------------------------


def baseline_mano(n_train: int, n_test: int, L: int, mod: int, seed: int, out: Path) -> None:
    rnd = random.Random(seed)

    def tree(length: int) -> list[str]:
        if length == 0:
            return [str(rnd.randrange(mod))]
        left = rnd.randrange(length)
        return [rnd.choice("+-*")] + tree(left) + tree(length - 1 - left)

    def value(tokens: list[str], i: int = 0) -> tuple[int, int]:
        if tokens[i] not in "+-*":
            return int(tokens[i]), i + 1
        a, j = value(tokens, i + 1)
        b, k = value(tokens, j)
        result = {"+": a + b, "-": a - b, "*": a * b}[tokens[i]]
        return result % mod, k

    def record(length: int) -> dict:
        expr = tree(length)
        return {
            "prompt": f"<bos> <len_{length}> {' '.join(expr)} <ans>",
            "answer": str(value(expr)[0]),
            "length": length,
        }

    test = {}
    while len(test) < n_test:
        rec = record(L)
        test[rec["prompt"]] = rec
    with (out / "test.jsonl").open("w") as fh:
        for rec in test.values():
            fh.write(json.dumps(rec) + "\n")
    with (out / "train.jsonl").open("w") as fh:
        written = 0
        while written < n_train:
            rec = record(rnd.randint(1, L))
            if rec["prompt"] not in test:
                fh.write(json.dumps(rec) + "\n")
                written += 1


def baseline_bios(n_people: int, seed: int, out: Path) -> None:
    rnd = random.Random(seed)
    p = pools()
    names = set()
    with (out / "train.jsonl").open("w") as train, (out / "test.jsonl").open("w") as test:
        for i in range(n_people):
            while True:
                name = f"{rnd.choice(p['first'])} {rnd.choice(p['middle'])} {rnd.choice(p['last'])}"
                if name not in names:
                    names.add(name)
                    break
            female = rnd.random() < 0.5
            company = rnd.randrange(len(p["employer"]))
            values = {
                "birth_date": f"{rnd.choice(MONTHS)} {rnd.randint(1, 28)} , {rnd.randint(1900, 2099)}",
                "birth_city": rnd.choice(p["birth_city"]).replace(",", " ,"),
                "university": rnd.choice(p["university"]).replace(",", " ,"),
                "major": rnd.choice(p["major"]),
                "work_city": p["work_city"][company].replace(",", " ,"),
                "employer": p["employer"][company].replace(",", " ,"),
            }
            words, spans = [], {}
            for k, attribute in enumerate(ATTRIBUTES):
                for part in rnd.choice(TEMPLATES[attribute]).split():
                    start = len(words)
                    if part == "{V}":
                        words += values[attribute].split()
                        spans[attribute] = [start, len(words)]
                    elif part.startswith("{"):
                        if k == 0 and "name" not in spans:
                            words += name.split() + (["'s"] if part in ("{P}", "{p}") else [])
                            spans["name"] = [start, start + 3]
                        else:
                            pronoun = {"{S}": "He", "{s}": "he", "{P}": "His", "{p}": "his", "{o}": "him"}[part]
                            if female:
                                pronoun = {"He": "She", "he": "she", "His": "Her", "his": "her", "him": "her"}[pronoun]
                            words.append(pronoun)
                    else:
                        words.append(part)
            train.write(json.dumps({"text": " ".join(words), "person": i, "spans": spans}) + "\n")
            for attribute in ATTRIBUTES:
                question = "<bos> " + QUESTIONS[attribute].format(name=name) + " <ans>"
                test.write(
                    json.dumps({"question": question, "answer": values[attribute], "person": i, "attribute": attribute})
                    + "\n"
                )


# --- timing -----------------------------------------------------------------------------------


def timed(fn) -> tuple[float, float]:
    """Wall-clock and CPU seconds of fn(tmp_dir); CPU time shows what a shared, busy machine
    hides (the library is single-threaded, so it needs one of the two cores)."""
    with tempfile.TemporaryDirectory() as tmp:
        wall, cpu = time.perf_counter(), time.process_time()
        fn(Path(tmp))
        return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mano-n", type=int, default=1_000_000, help="mano training records")
    parser.add_argument("--bios-n", type=int, default=100_000, help="bios people")
    parser.add_argument("--baseline-share", type=float, default=0.1, help="share of the records the baselines generate")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    args = parser.parse_args()

    cases = {
        "mano L=24": (
            args.mano_n,
            lambda n, out: baseline_mano(n, 3000, 24, 23, 0, out),
            lambda n, out: write_dataset(TASKS["mano"], TASKS["mano"].params_cls(L=24, n_train=n), 0, out / "d"),
            30.0,
        ),
        "bios": (
            args.bios_n,
            lambda n, out: baseline_bios(n, 0, out),
            lambda n, out: write_dataset(TASKS["bios"], TASKS["bios"].params_cls(n_people=n), 0, out / "d"),
            30.0,
        ),
    }
    print(
        f"{'case':<10} {'records':>9} {'library wall s':>15} {'library cpu s':>14} "
        f"{'baseline cpu s/rec':>19} {'speed-up (cpu)':>15}  target"
    )
    for case, (n, baseline, library, target) in cases.items():
        n_base = max(1, int(n * args.baseline_share))
        base_cpu, lib_wall, lib_cpu = [], [], []
        for _ in range(args.rounds):
            base_cpu.append(timed(lambda out: baseline(n_base, out))[1] / n_base)
            wall, cpu = timed(lambda out: library(n, out))
            lib_wall.append(wall)
            lib_cpu.append(cpu)
        verdict = "ok" if min(lib_wall) <= target else "MISSED (wall)"
        print(
            f"{case:<10} {n:>9} {min(lib_wall):>15.2f} {min(lib_cpu):>14.2f} "
            f"{min(base_cpu):>19.2e} {min(base_cpu) * n / min(lib_cpu):>14.1f}x  "
            f"<= {target:.0f} s wall: {verdict}"
        )


if __name__ == "__main__":
    main()
