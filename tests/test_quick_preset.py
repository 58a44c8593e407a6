"""The capacity experiment's `quick` preset stores real knowledge in both models of its grid.

Runs the preset through the library (the lab's runner, synthlab.sweeps.lab_runner: generate, train,
capacity) and reads the results.csv columns `loops` and `fraction_of_max`.
"""

from __future__ import annotations

import pytest

from synthlab.sweeps import driver, experiments
from synthlab.sweeps import lab_runner as point_runner
from synthlab.sweeps.results_table import read_rows

# Measured (experiments/capacity.toml, quick): fraction_of_max 0.75 (1 loop) and 0.57 (4 loops),
# the same on two runs; the bound is about half of the smaller.
MIN_FRACTION = 0.3


@pytest.mark.slow  # two bioS trainings of 750 steps: about 1.5 CPU-minutes in all
def test_quick_capacity_preset_stores_knowledge_in_both_models(tmp_path):
    results = driver.run_sweep(
        experiments.load("capacity"), "quick", tmp_path, runner=point_runner, jobs=2, progress=False
    )
    fractions = {int(r["loops"]): float(r["fraction_of_max"]) for r in read_rows(results)}
    assert set(fractions) == {1, 4}
    assert all(f > MIN_FRACTION for f in fractions.values()), fractions
