"""Runner modules keep resolving under the names older commands and scripts used."""

import importlib

from synthlab.sweeps.runner_protocol import MOVED_RUNNERS, load_runner


def test_old_runner_names_load_the_moved_modules():
    assert "synthlab.point_runner" in MOVED_RUNNERS  # `synthlab sweep --runner synthlab.point_runner`
    for old, new in MOVED_RUNNERS.items():
        assert load_runner(old) is importlib.import_module(new)
