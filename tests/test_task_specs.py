"""Every per-task fact lives in the task's SPEC, and the generators depend on nothing in synthlab.

Each task's `shape(params)` (computed from the params alone) is checked against datasets the
generator really writes, read back the way training reads them.
"""

import ast
import dataclasses
import math
import pickle
from pathlib import Path

import pytest

import synthlab_generators
from synthlab import errors
from synthlab.data.datasets import ENCODED, load_dataset, qa_sequence, training_examples
from synthlab.evaluation import capacity
from synthlab_generators import TASKS, bios, common, write_dataset

COMMON_FILES = {"meta.json", "vocab.json", "train.jsonl", "test.jsonl"}
# (task, params): two or more small settings per task, each generated in well under a second.
SETTINGS = [
    ("mano", {"L": 3, "n_train": 200, "n_test": 5}),
    ("mano", {"L": 6, "n_train": 300, "n_test": 10, "ops": "asmd", "mod": 7}),
    ("bios", {"n_people": 60}),
    ("bios", {"n_people": 40, "variant": "multi2"}),
    ("bios", {"n_people": 60, "variant": "permute"}),
    ("bios", {"n_people": 60, "variant": "fullname"}),
    ("bios", {"n_people": 60, "pool_scale": 0.1}),
    ("multihop", {"layers": 3, "per_layer": 3, "relations": 2, "hops": 2, "n_test": 2}),
    ("multihop", {"layers": 5, "per_layer": 6, "relations": 3, "hops": 3, "n_test": 20, "train_fraction": 0.3}),
    ("reach", {"nodes": 12, "max_diameter": 2, "n_train": 10, "n_test": 4}),
    (
        "reach",
        {
            "nodes": 23,
            "max_diameter": 3,
            "n_train": 40,
            "n_test": 10,
            "context_edges": 10,
            "edge_repeats": 3,
            "edge_queries": 2,
            "distance_decay": 0.5,
            "lookup_queries": 30,
        },
    ),  # uneven layers: 6, 6, 6, 5
]
# Tasks whose every record's length is known from the params: shape is exact, not an estimate.
EXACT = ("mano", "multihop", "reach")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """(task, params) -> (spec, params, dataset folder), each setting generated once."""
    out = {}
    for i, (task, kwargs) in enumerate(SETTINGS):
        spec = TASKS[task]
        params = spec.params_cls(**kwargs)
        folder = write_dataset(spec, params, seed=i, out=tmp_path_factory.mktemp(task) / "d")
        out[i] = (spec, params, folder)
    return out


@pytest.mark.parametrize("i", range(len(SETTINGS)), ids=[f"{t}-{k}" for t, k in SETTINGS])
def test_shape_matches_generated_data(generated, i):
    spec, params, folder = generated[i]
    shape = spec.shape(params)
    ds = load_dataset(folder, spec.name)

    assert shape.vocab_size == len(ds.tokenizer) == ds.meta["vocab_size"]

    train = training_examples(ds)
    lengths = train.lengths.tolist()
    test = [sum(map(len, qa_sequence(ds, r))) for r in ds.records("test")]
    longest_inputs = max(lengths + test) - 1
    if spec.pack:
        assert shape.row_len is None
    elif spec.name in EXACT:
        assert shape.row_len == longest_inputs
    else:
        assert shape.row_len >= longest_inputs

    assert shape.train_records == len(lengths)
    measured = sum(lengths) / len(lengths)
    if spec.name in ("multihop", "reach"):  # record counts and lengths are fixed by the params
        assert shape.tokens_per_record == pytest.approx(measured, rel=1e-12)
    else:  # an expectation over the generator's draws
        assert shape.tokens_per_record == pytest.approx(measured, rel=0.1)


@pytest.mark.parametrize("i", range(len(SETTINGS)), ids=[f"{t}-{k}" for t, k in SETTINGS])
def test_spec_facts_match_generated_data(generated, i):
    spec, params, folder = generated[i]
    written = {p.name for p in folder.iterdir()} - {".verified.json", ENCODED}  # the caches a load leaves
    assert written == COMMON_FILES | set(spec.extra_files)
    ds = load_dataset(folder, spec.name)
    assert all(spec.group_key in r for r in ds.records("test"))
    fields = {f.name for f in dataclasses.fields(spec.params_cls)}
    params_now = spec.params_cls(**ds.meta["params"])
    assert spec.data_columns and all(hasattr(params_now, name) for name in spec.data_columns)
    assert set(ds.meta["params"]) == fields


def test_spec_values():
    facts = {name: (s.extra_files, s.group_key, s.headline, s.pack, dict(s.data_columns)) for name, s in TASKS.items()}
    assert facts == {
        "bios": (("people.jsonl",), "attribute", "bits_per_param", True, {"n_people": "n_people"}),
        "mano": ((), "length", "accuracy", False, {"L": "L"}),
        "multihop": (
            ("facts.jsonl",),
            "hops",
            "accuracy",
            False,
            {"train_fraction": "train_fraction", "n_train": "train_questions", "head_layers": "head_layers"},
        ),
        "reach": (("graph.json",), "group", "accuracy", False, {"max_diameter": "diameter"}),
    }
    spec = TASKS["bios"]
    with pytest.raises(TypeError):
        spec.data_columns["x"] = "y"  # read-only
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_shape_of_default_params():
    """The defaults the sweeps start from; bios's mean matches the 58.1 tokens measured on its data
    (subject-first templates since commit 29272ea)."""
    shapes = {name: s.shape(s.params_cls()) for name, s in TASKS.items()}
    assert shapes["mano"] == common.TaskShape(4 + 24 + 3 + 23, 2 * 24 + 4, 24 + 6, TASKS["mano"].params_cls().n_train)
    assert shapes["bios"].vocab_size == 2779 and shapes["bios"].row_len is None
    assert shapes["bios"].tokens_per_record == pytest.approx(58.1, abs=0.1)
    assert (shapes["multihop"].vocab_size, shapes["multihop"].row_len) == (4 + 5 + 20 + 500, 15)
    assert (shapes["reach"].vocab_size, shapes["reach"].row_len) == (4 + 9 + 64, 4 * 16 + 7)


def _pool_size(name: str) -> int:
    text = (Path(bios.__file__).parent / "pools" / f"{name}.txt").read_text(encoding="utf-8")
    return sum(1 for line in text.splitlines() if line.strip())


def test_capacity_constants_come_from_the_pools():
    assert (
        capacity.N0
        == bios.name_values()
        == (_pool_size("first_name") * _pool_size("middle_name") * _pool_size("last_name"))
    )
    birth_dates = len(bios.MONTHS) * bios.N_DAYS * bios.n_years()
    assert (
        capacity.S0
        == math.prod(bios.attribute_values().values())
        == (
            len(bios.GENDERS)
            * birth_dates
            * _pool_size("city")
            * _pool_size("university")
            * _pool_size("field")
            * _pool_size("company")
        )
    )
    scored = ["gender"] + [a for a in bios.ATTRIBUTES if a not in capacity.SCORED_AS]
    assert list(capacity.ATTRIBUTE_VALUES) == scored


def test_generators_import_nothing_from_synthlab():
    folder = Path(synthlab_generators.__file__).parent
    modules = sorted(folder.glob("*.py"))
    assert {"common.py", "writer.py", "bios.py", "mano.py"} <= {p.name for p in modules}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            bad = [n for n in names if n == "synthlab" or n.startswith("synthlab.")]
            assert not bad, f"{path.name}:{node.lineno} imports {bad}"


def test_the_task_package_has_its_own_error_and_the_lab_meets_it_as_its_own(tmp_path):
    from synthlab import serialize
    from synthlab.files import check_out

    assert issubclass(errors.SynthlabError, common.TaskError) and not hasattr(common, "SynthlabError")
    with pytest.raises(common.TaskError) as raised:
        TASKS["mano"].params_cls(L=0)
    assert type(raised.value) is common.TaskError  # the generators raise their own type
    with pytest.raises(errors.SynthlabError, match="--L"):  # the lab's entry points turn it into the lab's
        serialize.from_dict(TASKS["mano"].params_cls, {"L": 0})
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(errors.SynthlabError, match="not empty"):
        check_out(tmp_path / "full", overwrite=False)
