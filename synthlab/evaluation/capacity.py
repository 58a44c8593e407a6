"""Knowledge capacity of a model trained on bioS: bits stored and bits per parameter.

Physics of LMs 3.3, Definition 4.3 (docs/claims.md, C1), exactly:

    bits = N log2(N0 / e^p1) + N log2(S0 / e^p2),    R = bits / P

- p1: cross-entropy in nats SUMMED over the tokens of a person's full name (given the text before
  it, i.e. its first occurrence in the biography), averaged over people;
- p2: the same, summed over the tokens of all the person's attribute values (the generator's
  spans: a value that is a prefix of another includes the token that ends it);
- N0 = 400 * 400 * 1000 names, S0 = 2 * (12 * 28 * 200) * 200 * 300 * 100 * 263 attribute tuples,
  both read from the generator's pools (from the pools in use where the dataset was generated with
  a pool_scale below 1: `Population.of`);
- P: unique parameters (a looped block counted once), with the embedding rows of the tokens that
  occur in the training data and no others. This is the P the paper's 1 and 2 bit/param lines
  are drawn against (its GPT2-l-h has about 12 l (64h)^2 + V_used 64h parameters: the embedding
  counts, as a store of knowledge like any other weight), so `bits_per_param` is the figure to set
  beside them. `bits_per_param_nonemb` divides by the non-embedding parameters instead: at cpu
  scale the embedding is most of P, and this shows what the transformer blocks hold per weight.

The terms are not clipped: a model that predicts a pool worse than the uniform distribution over
it (an untrained one spreads probability over the whole vocabulary) has a negative term, and the
sum is the definition's figure. The maximum for N people is N log2(N0 / N) + N log2 S0: names are
unique, so once the N names are known the best prediction of the next biography's name is uniform
over them (p1 = ln N); a model that knows every attribute has p2 = 0.

The work city is a function of the employer (its headquarters), so the work-city and employer
tokens are scored together as one attribute with 263 values: whichever comes first in the text
carries the information and the other is then determined (as far as the first fixes it).

The functions that read a model import torch's modules (scoring, the run folder, the parameter
count) inside them: `synthlab.plots.tasks` draws with `peak_capacity`, and the plots package loads
without torch (`synthlab fit --plot`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from synthlab.data.datasets import load_dataset, training_examples
from synthlab.errors import SynthlabError
from synthlab.files import atomic_write_text
from synthlab_generators import bios

LOG2E = math.log2(math.e)
# Span names in the data that are scored as part of another attribute.
SCORED_AS = {"work_city": "employer"}


@dataclass(frozen=True)
class Population:
    """What people are drawn from: N0 full names and, per attribute, its values (in the order
    capacity scores them; the product is S0; "employer" includes the work-city tokens, see above)."""

    name_values: int
    attribute_values: dict[str, int]

    @property
    def tuples(self) -> int:
        """S0."""
        return math.prod(self.attribute_values.values())

    @classmethod
    def of(cls, pool_scale: float = 1.0) -> Population:
        """The population of bioS generated at this pool scale (1: the shipped pools, whole)."""
        return cls(bios.name_values(pool_scale), bios.attribute_values(pool_scale))


BIOS = Population.of()  # the shipped pools: 400 x 400 x 1000 names
N0, ATTRIBUTE_VALUES, S0 = BIOS.name_values, BIOS.attribute_values, BIOS.tuples


def term_bits(n_people: int, values: float, nats: float) -> float:
    """N log2(values / e^nats): bits a loss of `nats` per person shows beyond the uniform guess."""
    return n_people * (math.log2(values) - nats * LOG2E)


def capacity_bits(n_people: int, p1: float, p2: float, population: Population = BIOS) -> float:
    """bits(F) of Definition 4.3: the two terms summed as they are (no clipping)."""
    return term_bits(n_people, population.name_values, p1) + term_bits(n_people, population.tuples, p2)


def max_bits(n_people: int, population: Population = BIOS) -> float:
    """The most a model can store about N people: N log2(N0 / N) + N log2 S0."""
    return n_people * (math.log2(population.name_values / n_people) + math.log2(population.tuples))


def peak_capacity(table: pd.DataFrame, *, data_limited: float = 0.9) -> pd.DataFrame:
    """Each model's peak capacity ratio, as Physics of LMs 3.3 reads it: over the population sizes
    N a model was trained on, the N with the highest mean bits/param over seeds. A model is its
    unique parameter count and loops. `data_limited`: a peak whose runs store this share of the
    data's bits or more is limited by the data, so its ratio is a lower bound of the model's."""
    counted = "params_capacity" if "params_capacity" in table else "params"  # P as the estimate counts it
    cells = (
        table.groupby(["params", "loops", "n_people"])
        .agg(
            params_counted=(counted, "mean"),
            bits=("bits", "mean"),
            bits_per_param=("bits_per_param", "mean"),
            se=("bits_per_param", lambda v: v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else np.nan),
            seeds=("bits_per_param", "size"),
            fraction_of_max=("fraction_of_max", "mean"),
        )
        .reset_index()
    )
    tried = cells.groupby(["params", "loops"])["n_people"].agg(lambda n: ", ".join(f"{v:,}" for v in sorted(n)))
    peaks = cells.loc[cells.groupby(["params", "loops"])["bits_per_param"].idxmax()].reset_index(drop=True)
    peaks["n_tried"] = [tried[(p, loops)] for p, loops in zip(peaks["params"], peaks["loops"])]
    peaks["data_limited"] = peaks["fraction_of_max"] >= data_limited
    return peaks.sort_values(["params", "loops"]).reset_index(drop=True)


@dataclass(frozen=True)
class PersonLosses:
    """Summed losses per person (nats), averaged over that person's biographies where several."""

    name: np.ndarray  # (N,)
    attributes: dict[str, np.ndarray]  # attribute -> (N,), keys of ATTRIBUTE_VALUES


def capacity_report(
    losses: PersonLosses, params: int, params_nonemb: int | None = None, population: Population = BIOS
) -> dict:
    """Every number of the estimate, from per-person summed losses, the parameter count P (used
    embedding rows included) and, where given, the non-embedding count."""
    n = len(losses.name)
    p1 = float(losses.name.mean())
    per_attribute = {a: float(v.mean()) for a, v in losses.attributes.items()}
    p2 = float(sum(per_attribute.values()))
    bits = capacity_bits(n, p1, p2, population)
    values = population.attribute_values
    report = {
        "n_people": n,
        "p1": p1,
        "p2": p2,
        "bits_name": term_bits(n, population.name_values, p1),
        "bits_attributes": term_bits(n, population.tuples, p2),
        "bits": bits,
        "max_bits": max_bits(n, population),
        "fraction_of_max": bits / max_bits(n, population),
        "params": params,
        "bits_per_param": bits / params,
        "per_attribute": {
            a: {
                "loss": per_attribute[a],
                "values": values[a],
                "bits": term_bits(n, values[a], per_attribute[a]),
            }
            for a in per_attribute
        },
    }
    if params_nonemb is not None:
        report.update(params_nonemb=params_nonemb, bits_per_param_nonemb=bits / params_nonemb)
    return report


def person_losses(model, data, *, device, batch_size: int = 64, steps: int | None = None) -> PersonLosses:
    """Summed last-step losses of each person's name and attribute tokens in the training biographies.

    The model reads every biography as it was trained (`<bos> text <eos>`, one per row); text token
    k sits at position k + 1, so its loss is entry k of `score_texts`.
    """
    from synthlab.evaluation.scoring import score_texts  # torch: see the module docstring

    records = data.records("train")
    losses, _ = score_texts(model, data, records, device=device, steps=steps, batch_size=batch_size)
    n = len(data.records("people"))
    if len(set(r["person"] for r in records)) < n:
        raise SynthlabError(
            f"{data.path}: {n - len(set(r['person'] for r in records))} people have no biography in train.jsonl"
        )
    return span_losses(records, losses, n)


def span_losses(records: list[dict], token_losses: list[np.ndarray], n_people: int) -> PersonLosses:
    """Per-person sums over the spans of each biography record, given each text token's loss
    (`token_losses[i][k]`: token k of record i's text). With several biographies per person (multiM)
    the sums are averaged over that person's biographies."""
    sums = {key: np.zeros(n_people) for key in ("name", *ATTRIBUTE_VALUES)}
    seen = np.zeros(n_people)
    has_gender = np.zeros(n_people, dtype=bool)
    for record, loss in zip(records, token_losses):
        person = record["person"]
        seen[person] += 1
        for span_name, (start, end) in record["spans"].items():
            key = SCORED_AS.get(span_name, span_name)
            sums[key][person] += loss[start:end].sum()
            has_gender[person] |= key == "gender"
    # without a pronoun (the fullname variant) the gender cannot be read: no evidence, log 2 nats
    sums["gender"] = np.where(has_gender, sums["gender"], math.log(2) * seen)
    mean = {key: value / seen for key, value in sums.items()}
    return PersonLosses(mean.pop("name"), mean)


def used_token_ids(data) -> set[int]:
    """Token ids that occur in the training sequences (the embedding rows that count in P)."""
    return set(np.unique(training_examples(data).tokens).tolist())


def estimate_capacity(
    run_dir: str | Path,
    *,
    data_dir: str | Path | None = None,
    batch_size: int = 64,
    device: str = "auto",
    steps: int | None = None,
    checkpoint: int | None = None,
) -> dict:
    """The capacity report of a bioS run; written to RUN_DIR/capacity.json (capacity_steps{T}.json
    when read at `steps` recurrent steps, capacity_checkpoint{S}.json for the kept checkpoint of
    optimizer step S: a point of the learning curve) and returned. `data_dir`: the run's dataset if
    it moved."""
    from synthlab.evaluation.evaluate import check_eval_steps  # torch: see the module docstring
    from synthlab.models import count_params
    from synthlab.training.run_folders import load_run, open_checkpoint, open_run, resolve_device, trained_data

    run_dir = Path(run_dir)
    dev = resolve_device(device)
    check_eval_steps(steps, load_run(run_dir)[0].model.loops)
    if checkpoint is None:
        model, run, derived = open_run(run_dir, dev)
    else:
        model, run, tokens_seen = open_checkpoint(run_dir, checkpoint, dev)
        derived = load_run(run_dir)[1]
    if run.train.task != "bios":
        raise SynthlabError(f"capacity needs a run trained on bios; {run_dir} was trained on {run.train.task}")
    data = load_dataset(trained_data(run_dir, run, derived, moved_to=data_dir), "bios")
    losses = person_losses(model, data, device=dev, batch_size=batch_size, steps=steps)
    pool_scale = data.meta.get("params", {}).get("pool_scale", 1.0)
    report = capacity_report(
        losses,
        count_params(model, used_token_ids=used_token_ids(data)),
        count_params(model, exclude_embedding=True),
        Population.of(pool_scale),
    )
    report.update(
        {
            "params_all": count_params(model),
            "model": {k: getattr(run.model, k) for k in ("d_model", "n_layers", "n_heads", "loops", "topology")},
            "steps": steps or run.model.loops,
            "exposures": run.train.schedule.exposures,
            "pool_scale": pool_scale,
            "data": str(data.path),
        }
    )
    if checkpoint is not None:
        # The passes over the data the checkpoint has made (the global batch is train.batch.batch_size rows
        # whatever the number of processes), beside the run's whole budget.
        seen = checkpoint * run.train.batch.batch_size / derived["rows_per_epoch"]
        report.update(
            checkpoint=checkpoint, tokens_seen=tokens_seen, exposures=seen, run_exposures=run.train.schedule.exposures
        )
    atomic_write_text(_report_path(run_dir, steps, checkpoint), json.dumps(report, indent=2) + "\n")
    return report


def _report_path(run_dir: str | Path, steps: int | None, checkpoint: int | None) -> Path:
    """Where `estimate_capacity` writes its report (see its docstring)."""
    name = "capacity.json" if steps is None else f"capacity_steps{steps}.json"
    return Path(run_dir) / (name if checkpoint is None else name.replace(".json", f"_checkpoint{checkpoint}.json"))


def learning_curve(run_dir: str | Path, *, on_point=None, **estimate) -> pd.DataFrame:
    """The capacity estimate at each kept checkpoint of a bioS run, oldest first (`estimate_capacity`
    at each, so each also lands in its capacity_checkpoint{S}.json): one row per checkpoint with
    its optimizer step, the exposures it had made, bits and bits/param. Flat at the end means the
    run had saturated (C1's regime); still rising means its bits are a lower bound of the model's.
    `on_point(row)` is called as each is read (a checkpoint's estimate is a full pass over the data).
    A checkpoint whose estimate is already on disk and still valid (`_estimate_on_disk`) is not read
    again, so a curve stopped part way, or read checkpoint by checkpoint while the run trains, goes on
    where it was."""
    from synthlab.training.run_folders import checkpoint_files, load_run

    load_run(run_dir)  # a run folder at all, before its checkpoints are counted
    kept = {int(f.stem[len("checkpoint-") :]): f for f in checkpoint_files(run_dir) if f.stem != "checkpoint"}
    if len(kept) < 2:
        raise SynthlabError(
            f"a learning curve needs two or more kept checkpoints; {run_dir} has {len(kept)} "
            "(train with train.checkpoints and train.keep_checkpoints above 1)"
        )
    rows = []
    for step, weights in sorted(kept.items()):
        report = _estimate_on_disk(_report_path(run_dir, estimate.get("steps"), step), weights, step)
        report = report or estimate_capacity(run_dir, checkpoint=step, **estimate)
        rows.append({k: report[k] for k in ("checkpoint", "exposures", "bits", "bits_per_param")})
        if on_point is not None:
            on_point(rows[-1])
    return pd.DataFrame(rows)


def _estimate_on_disk(path: Path, weights: Path, step: int) -> dict | None:
    """The report `estimate_capacity` wrote at `path` for the checkpoint of optimizer step `step`
    (file `weights`), if it is there and was written after that file (a checkpoint rewritten since,
    by a run restarted in the same folder, is read again); None otherwise, and for a file that is not
    such a report (damaged, or edited by hand), which is then read anew and written over."""
    if not path.is_file() or path.stat().st_mtime < weights.stat().st_mtime:
        return None
    try:
        report = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return report if isinstance(report, dict) and report.get("checkpoint") == step else None
