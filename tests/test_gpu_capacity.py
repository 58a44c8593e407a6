"""benchmarks/gpu_capacity.py --dry-run: the GPU capacity benchmark's whole path (data, plain and
looped training, the estimate, the report) at tiny sizes on the CPU."""

import json
import sys
from pathlib import Path

import pytest

from synthlab import SynthlabError
from synthlab.capacity import max_bits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_capacity  # noqa: E402


def test_dry_run_reports_each_model_beside_the_labelled_reference(tmp_path, capsys):
    gpu_capacity.main(["--dry-run", "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "gpu_capacity.json").read_text())
    assert [m["loops"] for m in report["models"]] == [1, 4]
    assert {m["params"] for m in report["models"]} == {report["params"]}  # looping adds no unique parameter
    assert report["ratio"] == pytest.approx(max_bits(40) / report["params"])
    for model in report["models"]:
        assert model["bits_per_param"] == pytest.approx(model["bits"] / report["params"])
        assert f"loops {model['loops']}: {model['bits']:,.0f} bits, {model['bits_per_param']:.3f} bits/param" in printed
    # the paper's figure appears once, on its own line, marked as the paper's
    assert [line for line in printed.splitlines() if "Physics of LMs" in line] == [
        "reference: Physics of LMs 3.3 at 1000 exposures, about 2 bits/param (paper, not measured here)"
    ]


def test_refuses_a_full_run_without_cuda_and_a_used_out_folder(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(SynthlabError, match="not empty"):
        gpu_capacity.main(["--dry-run", "--out", str(tmp_path)])
    if not __import__("torch").cuda.is_available():
        with pytest.raises(SynthlabError, match="no CUDA device"):
            gpu_capacity.main(["--out", str(tmp_path / "new")])
