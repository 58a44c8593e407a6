"""Training-time depth sampling under torch.compile: the depth is a host draw, and the compiled
code is traced once whatever depths are drawn (no graph break, no recompilation per depth)."""

from __future__ import annotations

import torch
import torch._dynamo
from test_train import datasets, losses_of, run_config  # noqa: F401  (datasets is a fixture)
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

from synthlab.training.trainer import train


def test_sampled_depths_reuse_one_compiled_block(tmp_path, datasets, monkeypatch):
    compiled = CompileCounter()  # an eager backend that counts the graphs it is given
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: real_compile(fn, backend=compiled))
    torch._dynamo.reset()
    counters.clear()
    runs = {}
    for on in (True, False):
        runs[on] = tmp_path / f"compile{on}"
        config = run_config(
            datasets("mano"),
            "mano",
            {"loops": 3, "step_sampling": True},
            steps=12,
            loss="mean",
            device="cpu",
            compile=on,
        )
        train(runs[on], config, progress=False)
    depths = [len(step) for step in losses_of(runs[True])]  # the mean objective logs every step's loss
    assert len(set(depths)) >= 3, depths
    assert compiled.frame_count == 1  # the block, traced once for every depth
    assert not counters["graph_break"] and not counters["recompiles"]
    assert losses_of(runs[True]) == losses_of(runs[False])
