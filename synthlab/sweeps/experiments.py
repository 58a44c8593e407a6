"""Experiments as data: load a TOML definition, pick a preset, expand its grid into points.

A definition (one file per experiment in the top-level `experiments/` folder, installed as the
`synthlab_experiments` package) looks like this:

    name = "mano"                    # must match the file name
    claim = "C2"                     # the claim it tests (docs/claims.md)
    title = "Looping improves knowledge manipulation"
    task = "mano"                    # generator task of the data section
    plot = "mano"                    # optional: a built-in figure (synthlab.plots.PLOTTERS); without
                                     # it, the generic figure of the grid and the task's metric
    stages = ["train", "eval"]       # what each point runs: train, gate, eval, heldout (held-out LM
                                     # loss, synthlab.evaluation.heldout), generate, capacity, export (as
                                     # Qwen2), ouroboros (C11 on the export)
    notes = "..."                    # optional: what is measured and how (shown in reports)

    [base.data]   ...                # generator parameters (+ seed)
    [base.model]  ...                # ModelConfig fields
    [base.train]  ...                # TrainConfig fields
    [base.eval]   ...                # EvalOptions fields (synthlab.training.configs)
    [base.gate]   ...                # GateOptions (stage "gate": Ouro stage II, synthlab.training.configs)
    [base.ouroboros] ...             # stage "ouroboros" (after "export"): synthlab.ouroboros.stage

    [presets.smoke]                  # a preset overrides base sections, may repeat training over
    seeds = 3                        # seeds (see below) ...
    [presets.smoke.train]
    steps = 50
    [presets.smoke.grid]             # ... and defines the grid (a cartesian product of axes)
    "data.L" = [3, 4]                # an axis over one field: "section.field" = [values]
    arch = [                         # a named axis: each value sets several fields at once
      { label = "2x1", "model.n_layers" = 2, "model.loops" = 1 },
      { label = "1x2", "model.n_layers" = 1, "model.loops" = 2 },
    ]

Seeds: `seeds = 3` (the training seeds 0, 1, 2) or `seeds = [0, 5]` in a preset repeats every grid
point once per training seed (`train.seed`: the initial weights and the data order) on the same
dataset; `data_seeds = 2` (or a list) adds the data seed (`data.seed`: a fresh dataset) as its own
axis. They are the outermost axes, factors `seed` and `data_seed` (results.csv columns of those
names). A seed equal to the one the preset's sections already give (0 unless `train.seed` /
`data.seed` is set) sets nothing, so adding `seeds = 3` to a one-seed preset keeps the ids (and the
finished runs) of its seed-0 points. A grid axis may not set a field a seed key sets. The report
aggregates over both: mean, standard error and n per remaining grid cell.

Inheritance: `like = "other"` in a preset starts it from preset `other` (after that preset's own
`like`): each section merged field by field with its own on top, its `seeds`, `data_seeds` and
`grid` where it gives them, else the other's. The resolved preset is what the points come from,
so writing a preset with `like` instead of in full keeps its point ids.

Screens: `screen = true` in a preset marks it as choosing a setting (a learning rate, say) on
seeds that decide no claim: its table is reported, and no rule is decided on it (`is_screen`).
A preset made `like` a screen is one too unless it says `screen = false`. A screen's `choose`
table states how it chooses (synthlab.claims.screens; `screen_choice`); the report applies it.

Verdicts: `[[verdicts]]` tables state, per claim, the rule that decides it from the results
(synthlab.claims.verdicts: paired differences over seeds, per cell with `each`, their one-sided bounds
against a threshold or a margin; `synthlab sweep --seeds N` overrides a preset's seeds, `with_seeds`); `[[laws]]` tables, a claim that the loss follows a law, decided from the fit `synthlab fit
--save` wrote (its convergence, bootstrap, R^2 and hold-out R^2). `synthlab report` prints each one
in its claims table.

A definition needs at least one preset; the shipped ones all carry `smoke`, `cpu` and `gpu`
(PRESETS). docs/experiments.md documents the format with a worked example. `load` checks the
structure (keys, sections, presets, axes); `validate_points` checks every point of a preset against the real
config classes (generator params, ModelConfig, TrainConfig, EvalOptions). A point is one resolved config dict
{"task", "data", "model", "train", "eval", "stages"} (+ "gate" where a definition sets it) plus its
factors (axis -> value or label);
its id is a content hash of the resolved config, so editing a grid never renames old points.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.resources
import itertools
import math
from pathlib import Path
from typing import Any

import tomllib

from synthlab.claims.rules import parse_law_rules, parse_rules
from synthlab.claims.screens import Choice, parse_choice
from synthlab.errors import SynthlabError
from synthlab.serialize import content_hash
from synthlab.sweeps.stages import STAGE_SPECS
from synthlab.training.configs import flat_train, ouroboros_train_keys

SECTIONS = ("data", "model", "train", "eval", "gate", "ouroboros")
# Sections every resolved config carries; the others only where a definition sets them, so adding a
# section kind never changes the content hash (the id) of existing points.
ALWAYS_SECTIONS = ("data", "model", "train", "eval")
PRESETS = ("smoke", "cpu", "gpu")  # the presets every shipped definition carries
_TOP_KEYS = {"name", "claim", "title", "task", "plot", "stages", "notes", "base", "presets", "verdicts", "laws"}
# seed keys of a preset -> (factor name, the section.field each value sets)
MAX_POINTS = 100_000  # a sweep's points at most: a larger grid is refused before any point is built
SEED_KEYS = {"seeds": ("seed", "train.seed"), "data_seeds": ("data_seed", "data.seed")}
_PRESET_KEYS = set(SECTIONS) | {"grid", "like", "screen", "choose"} | set(SEED_KEYS)


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point: what the row's factor columns say and the fully resolved config."""

    factors: dict[str, Any]
    config: dict[str, Any]

    @property
    def point_id(self) -> str:
        return content_hash(self.config)

    @property
    def train_id(self) -> str:
        """Points that differ only in evaluation options share one trained model (one run dir)."""
        return content_hash(train_part(self.config))


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    claim: str
    title: str
    task: str
    plot: str
    stages: tuple[str, ...]
    base: dict[str, dict[str, Any]]
    presets: dict[str, dict[str, Any]]
    notes: str = ""
    source: str = ""
    verdicts: tuple[Any, ...] = ()  # synthlab.claims.rules.Rule, in file order
    laws: tuple[Any, ...] = ()  # synthlab.claims.rules.LawRule: claims decided from a saved law fit

    def is_screen(self, preset: str) -> bool:
        """Whether the preset is a screen: its table decides no rule (module docstring, Screens)."""
        return bool(self.presets.get(preset, {}).get("screen", False))

    def screen_choice(self, preset: str) -> Choice | None:
        """The rule by which a screen preset chooses its setting (its `choose` table), if it states one."""
        table = self.presets.get(preset, {}).get("choose") if self.is_screen(preset) else None
        return None if table is None else parse_choice(table, f"presets.{preset}")

    def points(self, preset: str) -> list[Point]:
        """The preset's grid, expanded in a stable order (axes in file order, values in order)."""
        if preset not in self.presets:
            raise SynthlabError(f"unknown preset '{preset}' for {self.name} (have {', '.join(self.presets)})")
        spec = self.presets[preset]
        base = {
            s: {**self.base.get(s, {}), **spec.get(s, {})}
            for s in SECTIONS
            if s in ALWAYS_SECTIONS or s in self.base or s in spec
        }
        axes = seed_axes(spec, base) + list(spec.get("grid", {}).items())
        points = []
        for combo in itertools.product(*(values for _, values in axes)):
            config = copy.deepcopy(base)
            factors: dict[str, Any] = {}
            for (axis, _), value in zip(axes, combo):
                if "." in axis:
                    section, field = axis.split(".", 1)
                    config.setdefault(section, {})[field] = value
                    factors[axis] = value
                else:
                    for key, val in value.items():
                        if key != "label":
                            section, field = key.split(".", 1)
                            config.setdefault(section, {})[field] = val
                    factors[axis] = value["label"]
            config.update(task=self.task, stages=list(self.stages))
            points.append(Point(factors=factors, config=hashed_form(config)))
        ids = [p.point_id for p in points]
        if len(set(ids)) != len(ids):
            raise SynthlabError(f"{self.name}.{preset}: two grid points resolve to the same config")
        return points


def seed_axes(spec: dict[str, Any], base: dict[str, dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """A preset's `seeds` / `data_seeds` as named axes; the seed its sections already give sets nothing."""
    axes = []
    for key, (factor, target) in SEED_KEYS.items():
        if key not in spec:
            continue
        section, field = target.split(".")
        current = base.get(section, {}).get(field, 0)
        values = seed_list(spec[key], key)
        axes.append((factor, [{"label": s} if s == current else {"label": s, target: s} for s in values]))
    return axes


def seed_list(value: Any, key: str) -> list[int]:
    """`seeds = 3` -> [0, 1, 2]; a list of distinct integers >= 0 as given."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_POINTS:
            raise SynthlabError(f"{key} must be in 1..{MAX_POINTS:,}, got {value}")
        return list(range(value))
    if (
        not isinstance(value, list)
        or not value
        or len(set(value)) != len(value)
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in value)
    ):
        raise SynthlabError(f"{key} must be a count or a list of distinct integers >= 0, got {value!r}")
    return value


def with_seeds(experiment: Experiment, preset: str, seeds: Any) -> Experiment:
    """The experiment with `preset` run over `seeds` (a count or a list, as the `seeds` key takes)
    instead of the seeds its definition gives (`synthlab sweep --seeds`); seed 0 keeps its ids."""
    if preset not in experiment.presets:
        raise SynthlabError(f"unknown preset '{preset}' for {experiment.name} (have {', '.join(experiment.presets)})")
    spec = {**experiment.presets[preset], "seeds": seeds}
    _check_seeds(spec, f"{experiment.name}: presets.{preset} with --seeds")
    _check_size(spec, f"{experiment.name}: presets.{preset} with --seeds")
    return dataclasses.replace(experiment, presets={**experiment.presets, preset: spec})


def hashed_form(sections: dict[str, Any]) -> dict[str, Any]:
    """A definition's (or a point's) sections in the form a point's id hashes, whichever form they
    were written in: [train] flat (`lr`, also for `[train.optim]` tables and "train.optim.lr" axes;
    synthlab.training.configs.flat_train), [ouroboros] under its keys' names before the renaming
    (`batch_size`): the ids of every point written before sections stay as they were."""
    out = dict(sections)
    if isinstance(out.get("train"), dict):
        out["train"] = flat_train(out["train"])
    if isinstance(out.get("ouroboros"), dict):
        out["ouroboros"] = ouroboros_train_keys(out["ouroboros"], old=True)
    return out


def train_part(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that determines the trained model."""
    return {k: config[k] for k in ("task", "data", "model", "train")}


def data_part(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that determines the dataset (the data cache key)."""
    return {"task": config["task"], **config["data"]}


# --- loading ---------------------------------------------------------------------------------


def builtin_dir() -> Path:
    """The shipped definitions: `experiments/` beside this package in a source tree (so a checkout
    reads its own, whichever checkout the environment was installed from), else the installed
    `synthlab_experiments`."""
    source = Path(__file__).resolve().parent.parent.parent / "experiments"
    if (source / "__init__.py").is_file():
        return source
    return Path(str(importlib.resources.files("synthlab_experiments")))


def available() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.toml"))


def load(name_or_path: str | Path) -> Experiment:
    """An experiment by shipped name (`capacity`) or by path to a TOML file; validated."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = builtin_dir() / f"{name_or_path}.toml"
        if not path.is_file():
            raise SynthlabError(f"unknown experiment '{name_or_path}' (have {', '.join(available())})")
    if not path.is_file():
        raise SynthlabError(f"experiment file not found: {path}")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SynthlabError(f"cannot parse {path}: {err}") from None
    return parse(raw, source=str(path))


def load_recorded(definition: str) -> Experiment:
    """The definition a sweep recorded (sweep.json's `definition`): its path, or a shipped
    definition of the same file name when the path is gone (a sweep reported on another machine)."""
    path = Path(definition)
    if not path.is_file() and (builtin_dir() / path.name).is_file():
        path = builtin_dir() / path.name
    return load(path)


def recorded_path(definition: str) -> str:
    """The definition as sweep.json records it: `experiments/<file>` for a shipped one, so that a
    sweep folder copied out of the checkout it ran in (into results/, say) reads the definition of
    the checkout it is reported from (load_recorded), not a path in the first; else its path."""
    path = Path(definition).resolve()
    if path.parent == builtin_dir().resolve():
        return f"experiments/{path.name}"
    return str(path)


def shown_path(definition: str) -> str:
    """A definition's path as a report names it: relative to the working folder or the source tree
    where it lies inside one, `experiments/<file>` for a shipped definition, else as given."""
    path = Path(definition)
    if not path.is_absolute():
        return path.as_posix()
    for root in (Path.cwd(), builtin_dir().parent):
        if path.is_relative_to(root.resolve()):
            return path.relative_to(root.resolve()).as_posix()
    if path.parent.name == "experiments" and (builtin_dir() / path.name).is_file():
        return f"experiments/{path.name}"
    return path.as_posix()


def parse(raw: dict[str, Any], source: str = "<dict>") -> Experiment:
    """Check the structure of a definition (names, sections, presets, axes) and build it."""
    where = Path(source).name
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise SynthlabError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(_TOP_KEYS)})")
    for key in ("name", "claim", "title", "task", "stages", "presets"):
        if key not in raw:
            raise SynthlabError(f"{where}: missing key '{key}'")
    if source.endswith(".toml") and Path(source).stem != raw["name"]:
        raise SynthlabError(f"{where}: name '{raw['name']}' does not match the file name")
    stages = tuple(raw["stages"])
    bad = [s for s in stages if s not in STAGE_SPECS]
    if bad or "train" not in stages:
        raise SynthlabError(
            f"{where}: stages must include 'train' and be among {tuple(STAGE_SPECS)}, got {list(stages)}"
        )
    base = raw.get("base", {})
    _check_sections(base, set(SECTIONS), f"{where}: base")
    base = hashed_form(base)
    if not isinstance(raw["presets"], dict) or not raw["presets"]:
        raise SynthlabError(f"{where}: no preset (add e.g. [presets.smoke])")
    presets = resolve_likes({k: hashed_form(v) if isinstance(v, dict) else v for k, v in raw["presets"].items()}, where)
    if "gate" not in stages and ("gate" in base or any("gate" in p for p in presets.values())):
        raise SynthlabError(f"{where}: a [gate] section needs the 'gate' stage in stages")
    for name, spec in presets.items():
        _check_sections(spec, _PRESET_KEYS, f"{where}: presets.{name}")
        if not isinstance(spec.get("screen", False), bool):
            raise SynthlabError(f"{where}: presets.{name}: screen must be true or false, got {spec['screen']!r}")
        if "choose" in spec:
            if not spec.get("screen", False):
                raise SynthlabError(f"{where}: presets.{name}: `choose` states a screen's rule; add screen = true")
            parse_choice(spec["choose"], f"{where}: presets.{name}")  # its columns are checked against the table
        _check_grid(spec.get("grid", {}), f"{where}: presets.{name}.grid")
        _check_seeds(spec, f"{where}: presets.{name}")
        _check_size(spec, f"{where}: presets.{name}")
    verdicts = parse_rules(raw.get("verdicts", []), where)
    laws = parse_law_rules(raw.get("laws", []), where)
    return Experiment(
        name=raw["name"],
        claim=raw["claim"],
        title=raw["title"],
        task=raw["task"],
        plot=raw.get("plot", ""),
        stages=stages,
        base=base,
        presets=presets,
        notes=raw.get("notes", ""),
        source=source,
        verdicts=verdicts,
        laws=laws,
    )


def resolve_likes(presets: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """Every preset with its `like` chain applied (module docstring, Inheritance); file order kept."""
    resolved: dict[str, dict[str, Any]] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> dict[str, Any]:
        if name in resolved:
            return resolved[name]
        spec = presets[name]
        if not isinstance(spec, dict):
            raise SynthlabError(f"{where}: presets.{name} must be a table")
        parent = spec.get("like")
        if parent is None:
            resolved[name] = spec
            return spec
        if not isinstance(parent, str) or parent not in presets:
            raise SynthlabError(f"{where}: presets.{name}: like = {parent!r} names no preset")
        if parent in chain or parent == name:
            raise SynthlabError(
                f"{where}: presets.{name}: `like` goes round in a circle ({' -> '.join((*chain, name, parent))})"
            )
        merged = dict(resolve(parent, (*chain, name)))
        for key, value in spec.items():
            if key in SECTIONS and isinstance(merged.get(key), dict) and isinstance(value, dict):
                merged[key] = {**merged[key], **value}
            elif key != "like":
                merged[key] = value
        resolved[name] = merged
        return merged

    return {name: resolve(name, ()) for name in presets}


def _check_sections(table: dict[str, Any], allowed: set[str], where: str) -> None:
    for key, value in table.items():
        if key not in allowed:
            raise SynthlabError(f"{where}: unknown section '{key}' (allowed: {sorted(allowed)})")
        if key in SECTIONS and not isinstance(value, dict):
            raise SynthlabError(f"{where}.{key} must be a table")


def _check_seeds(spec: dict[str, Any], where: str) -> None:
    """Seed keys well formed, and no grid axis setting a field that a seed key sets."""
    for key, (factor, target) in SEED_KEYS.items():
        if key not in spec:
            continue
        try:
            seed_list(spec[key], key)
        except SynthlabError as err:
            raise SynthlabError(f"{where}: {err}") from None
        for axis, values in spec.get("grid", {}).items():
            sets = {axis} if "." in axis else {k for v in values if isinstance(v, dict) for k in v}
            if target in sets or axis == factor:
                raise SynthlabError(f"{where}: grid axis '{axis}' sets {target}, which `{key}` sets; drop one")


def _check_size(spec: dict[str, Any], where: str) -> None:
    """A preset's points (seeds x data seeds x every axis), counted before any is built."""
    counts = [len(v) for v in spec.get("grid", {}).values()]
    counts += [len(seed_list(spec[key], key)) for key in SEED_KEYS if key in spec]
    if math.prod(counts) > MAX_POINTS:
        raise SynthlabError(
            f"{where}: {' x '.join(map(str, counts))} = {math.prod(counts):,} points, more than the "
            f"{MAX_POINTS:,} a sweep may hold: shrink the grid or the seeds"
        )


def _check_grid(grid: dict[str, Any], where: str) -> None:
    for axis, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SynthlabError(f"{where}.{axis} must be a non-empty list")
        if "." in axis:
            section = axis.split(".", 1)[0]
            if section not in SECTIONS:
                raise SynthlabError(f"{where}.{axis}: section '{section}' is not one of {SECTIONS}")
            continue
        labels = []
        for value in values:
            if not isinstance(value, dict) or "label" not in value:
                raise SynthlabError(f"{where}.{axis}: a named axis takes tables with a 'label'")
            for key in value:
                if key != "label" and key.split(".", 1)[0] not in SECTIONS:
                    raise SynthlabError(f"{where}.{axis}: key '{key}' must be 'section.field'")
            labels.append(value["label"])
        if len(set(labels)) != len(labels):
            raise SynthlabError(f"{where}.{axis}: labels must be unique")
