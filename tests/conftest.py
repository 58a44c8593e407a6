"""Tests run on the CPU unless marked `cuda`.

On a GPU machine `device = auto` would switch unmarked tests to CUDA with bf16 autocast, where
bit-identical resume is not guaranteed (non-deterministic attention backward). So every test not
marked `cuda` sees no GPU (torch.cuda.is_available() is False here, CUDA_VISIBLE_DEVICES is empty
for the processes it starts), and `cuda` tests are skipped where there is no GPU:
`pytest -m cuda` runs them on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from synthlab_generators import TASKS, write_dataset


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def cpu_unless_marked_cuda(request, monkeypatch):
    if request.node.get_closest_marker("cuda") is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    yield


@pytest.fixture(scope="module")
def mano(tmp_path_factory):
    """A tiny Mano dataset (L = 2, mod 5, 200 training records) for the CLI tests of a module."""
    spec = TASKS["mano"]
    return write_dataset(
        spec, spec.params_cls(L=2, n_train=200, n_test=20, mod=5), 0, tmp_path_factory.mktemp("d") / "mano"
    )


# A small dataset of every task (the tokenizer tests encode each vocabulary word as well as the
# generated text).
TASK_PARAMS = {
    "bios": dict(n_people=40),
    "mano": dict(L=4, n_train=300, n_test=20, n_test_per_length=5),
    "multihop": dict(layers=4, per_layer=12, relations=4, hops=2, n_test=20),
    "reach": dict(nodes=24, max_diameter=4, n_train=60, n_test=16, edge_repeats=2),
}


@pytest.fixture(scope="session")
def task_datasets(tmp_path_factory):
    """{task: dataset folder} for each registered task, written once per pytest run."""
    root = tmp_path_factory.mktemp("tasks")
    assert sorted(TASK_PARAMS) == sorted(TASKS)  # a new task joins this fixture
    return {
        name: write_dataset(TASKS[name], TASKS[name].params_cls(**params), 0, root / name)
        for name, params in TASK_PARAMS.items()
    }
