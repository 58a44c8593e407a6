"""Crash paths of a GPU node, tested on the CPU with faked devices: a run resumed on fewer GPUs,
the empty --out check under torchrun, and the torch version the code needs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import torch

from synthlab.cli.train import resolve_run_config
from synthlab.errors import SynthlabError
from synthlab.training import distributed
from synthlab.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_seq_len": 128}


class FakeGpus:
    """torch.cuda's RNG functions over `n` fake devices (a state is a small tensor per device)."""

    def __init__(self, monkeypatch, n: int):
        self.n, self.states = n, {i: torch.tensor([i], dtype=torch.uint8) for i in range(n)}
        for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def _index(self, device) -> int:
        index = device if isinstance(device, int) else (torch.device(device).index or 0)
        if index >= self.n:
            raise IndexError(f"CUDA device {index} of {self.n}")  # what torch raises in substance
        return index

    def get_rng_state(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()

    def get_rng_state_all(self):
        return [self.get_rng_state(i) for i in range(self.n)]

    def set_rng_state_all(self, states):
        for i, state in enumerate(states):
            self.set_rng_state(state, i)


def test_a_run_checkpointed_on_eight_gpus_resumes_on_two(monkeypatch):
    """A checkpoint keeps the RNG state of the process's own GPU (synthlab.training.engine.TrainState through
    distributed.device_rng_state), which any process of a job on fewer GPUs can restore; the state
    of every visible GPU (get_rng_state_all) could not be restored on a node with fewer."""
    eight = FakeGpus(monkeypatch, 8)
    eight.states[0] = torch.tensor([42], dtype=torch.uint8)
    saved = distributed.device_rng_state(torch.device("cuda", 0))
    two = FakeGpus(monkeypatch, 2)
    for index in (0, 1):  # rank 0 and rank 1 of a two-GPU job: each restores the saved device's state
        distributed.set_device_rng_state(saved, torch.device("cuda", index))
        assert int(two.states[index]) == 42
    with pytest.raises(IndexError):  # what a checkpoint of every GPU's state did
        two.set_rng_state_all(eight.get_rng_state_all())


def test_a_checkpoint_with_every_gpus_state_still_resumes_on_fewer(monkeypatch):
    two = FakeGpus(monkeypatch, 2)
    states = [torch.tensor([10 + i], dtype=torch.uint8) for i in range(8)]  # written before: one per GPU
    distributed.set_device_rng_state(states, torch.device("cuda", 1))
    assert int(two.states[1]) == 11


def test_a_late_process_does_not_see_rank_0s_files_as_an_occupied_out(tmp_path, mano, monkeypatch):
    """Under NCCL, joining the group does not wait for the others: rank 0 may have written
    config.json before rank 1 looks. Rank 1 must not check the folder itself; it learns rank 0's
    answer in a collective after the group exists (here faked: it reaches that collective)."""
    run = resolve_run_config({}, TINY_MODEL, {"task": "mano", "data": str(mano), "steps": 4, "batch_size": 8})
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")  # rank 0 got there first
    import contextlib

    @contextlib.contextmanager
    def group(device):
        yield distributed.World(rank=1, size=2), device

    asked = []

    def any_of(world, flag, device):
        asked.append((world.rank, flag))
        raise RuntimeError("reached the collective")

    monkeypatch.setattr(distributed, "process_group", group)
    monkeypatch.setattr(distributed, "any_of", any_of)
    with pytest.raises(RuntimeError, match="reached the collective"):
        train(out, run, progress=False)
    assert asked == [(1, False)]  # rank 1 passes no verdict of its own


def test_rank_0_still_refuses_an_occupied_out(tmp_path, mano):
    run = resolve_run_config({}, TINY_MODEL, {"task": "mano", "data": str(mano), "steps": 4, "batch_size": 8})
    (tmp_path / "x").write_text("user file")
    with pytest.raises(SynthlabError, match="is not empty"):
        train(tmp_path, run, progress=False)
    assert (tmp_path / "x").read_text() == "user file"


# The newest torch feature each pattern in the code needs (checked in the PyTorch docs of each
# release): nn.RMSNorm arrived in 2.4, the public torch.distributed.fsdp.fully_shard in 2.6 and
# its ignored_params in 2.7, torch.nn.attention.flex_attention in 2.5. Where the two the floor
# rests on came from: nn.RMSNorm is pytorch/pytorch#121364 ("Add RMSNorm module", merged
# 2024-03-29, "will be available in 2.4"); fully_shard's ignored_params is pytorch/pytorch#146631
# ("Support ignoring parameters in FSDP2", opened 2025-02-06, after 2.6.0 of 2025-01-29 and before
# the 2.7 branch cut; pytorch/pytorch#148242 of 2025-03-01 asks about it on main and #149074
# documents it), so 2.7.0 (2025-04-23) is the first release with it.
FEATURES = {
    r"nn\.RMSNorm\(": (2, 4),
    r"torch\.nn\.attention\.flex_attention": (2, 5),
    r"from torch\.distributed\.fsdp import fully_shard": (2, 6),
    r"ignored_params=": (2, 7),
}


def test_pyproject_asks_for_the_torch_the_code_needs():
    code = "\n".join(p.read_text() for p in (ROOT / "synthlab").rglob("*.py"))
    used = [version for pattern, version in FEATURES.items() if re.search(pattern, code)]
    assert (2, 4) in used and (2, 7) in used  # the patterns still find what the code uses
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(re.fullmatch(r"torch>=(\d+)\.(\d+)", d) for d in deps if d.startswith("torch"))
    assert (int(floor[1]), int(floor[2])) >= max(used)


def test_sweep_stages_run_on_the_device_the_model_trained_on(tmp_path, monkeypatch):
    """A model trained on a GPU is evaluated there (it was evaluated on the CPU: ~26 h of one thread
    for the scaling preset's held-out work). Faked: the run's config says it trained on cuda."""
    import json

    from synthlab.sweeps import experiments
    from synthlab.sweeps import lab_runner as point_runner

    real_train = point_runner.train_model

    def trained_on_cuda(point, data_dir, model_dir, nproc=0):
        metrics = real_train(point, data_dir, model_dir, nproc)
        config = json.loads((model_dir / "config.json").read_text())
        config["derived"]["device"] = "cuda"
        (model_dir / "config.json").write_text(json.dumps(config))
        return metrics

    class Reached(Exception):
        pass

    def evaluate_run(run_dir, *, device="auto", **options):
        raise Reached(device)

    monkeypatch.setattr(point_runner, "train_model", trained_on_cuda)
    monkeypatch.setattr(point_runner, "evaluate_run", evaluate_run)
    point = experiments.load("mano").points("smoke")[0]
    with pytest.raises(Reached, match="cuda"):
        point_runner.run_point(point_runner.parse(point.config), tmp_path / "run", cache_dir=tmp_path / "cache")


def test_processes_poll_for_a_stop_without_a_host_sync_every_step(monkeypatch):
    calls = []
    monkeypatch.setattr(distributed, "any_of", lambda world, flag, device: calls.append(flag) or flag)
    world = distributed.World(rank=0, size=2)
    stops = [distributed.stop_now(world, step >= 20, step, torch.device("cpu")) for step in range(64)]
    assert len(calls) == 64 // distributed.STOP_POLL  # one collective every STOP_POLL steps, not 64
    assert stops.index(True) == 32  # the first poll after the signal; every process stops there
    assert distributed.stop_now(distributed.World(), True, 5, torch.device("cpu"))  # one process: at once


def test_the_gpu_dry_run_counts_the_hosts_work():
    """Packing (every epoch of a packed task), checkpoints (20 per gpu point) and evaluation appear
    beside the GPU hours, at host rates measured on this machine; what the GPU waits for is in gpu_h."""
    from synthlab.sweeps import cost, experiments
    from synthlab.sweeps import lab_runner as point_runner

    capacity = point_runner.parse(experiments.load("capacity").points("gpu")[-1].config)
    mano = point_runner.parse(experiments.load("mano").points("gpu")[-1].config)
    assert "pack_h" not in cost.gpu_cost(mano)  # no host rates in use: the GPU's hours alone
    bare = cost.gpu_cost(capacity)
    rates = cost.host_rates(repeats=1)
    assert all(0 < v < 1e-3 for v in rates.values())
    with cost.measured(host_rates={"pack_s_per_example": 1e-6, "write_s_per_byte": 1e-9, "snapshot_s_per_byte": 1e-10}):
        packed, unpacked = cost.gpu_cost(capacity), cost.gpu_cost(mano)
    assert packed["pack_h"] > 0 and unpacked["pack_h"] == 0
    assert packed["ckpt_n"] == unpacked["ckpt_n"] == 20 and unpacked["ckpt_h"] > 0
    assert unpacked["eval_h"] > 0
    # what the GPU waits for is in the point's hours, the evaluation in its own share
    assert packed["gpu_h_shared"] == pytest.approx(bare["gpu_h_shared"] + packed["stall_h"], abs=0.011)
    assert packed["gpu_h"] == pytest.approx(packed["gpu_h_shared"] + packed["eval_h"], abs=0.011)


def test_a_gpu_checks_calibration_recosts_the_presets(tmp_path):
    """cost.py reads the file benchmarks/gpu_calibrate.py writes: measured MFU (interpolated in d)
    times the trainer's share of a bare loop, and the memory ratio; a dry run's file is refused."""
    import json

    from synthlab.sweeps import cost, experiments
    from synthlab.sweeps import lab_runner as point_runner

    point = point_runner.parse(experiments.load("capacity").points("gpu")[-1].config)
    point = type(point)(**{**vars(point), "train": point.train.replaced(compile=True)})
    assumed = cost.gpu_cost(point)
    path = tmp_path / "cost_calibration.json"
    measured = {
        "device": "H200",
        "dry_run": False,
        "compiled_mfu_packed": {"sdpa": {"128": {"layers": 0.10, "head": 0.10}, "384": {"layers": 0.30, "head": 0.30}}},
        "memory_measured_over_predicted": 1.2,
        "trainer_vs_bare": 0.5,
        "checkpoint_s": 0.1,
    }
    path.write_text(json.dumps(measured))
    with cost.measured(calibration=cost.load_calibration(path)):
        at = cost.gpu_cost(point)
        d = point.model.d_model
        expected = 0.5 * (0.10 + (min(max(d, 128), 384) - 128) / 256 * 0.20)
        assert at["mfu"] == pytest.approx(expected)
        assert at["peak_gib"] == pytest.approx(assumed["peak_gib"] * 1.2, rel=0.01)
    assert cost.gpu_cost(point)["mfu"] == assumed["mfu"]
    path.write_text(json.dumps({**measured, "dry_run": True}))
    with pytest.raises(SynthlabError, match="dry-run"):
        cost.load_calibration(path)
    path.write_text(json.dumps({**measured, "compiled_mfu_packed": {"sdpa": {"128": 0.10}}}))  # the older format
    with pytest.raises(SynthlabError, match="one MFU per d, written before the check measured the layers"):
        cost.load_calibration(path)
