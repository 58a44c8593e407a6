"""synthlab.training.trainer: schedule, optimizer groups, resume equivalence, signals, bad input, learning."""

from __future__ import annotations

import json
import math
import os
import signal

import pytest
import torch

from synthlab import serialize
from synthlab.cli.train import resolve_run_config
from synthlab.errors import SynthlabError
from synthlab.models import ModelConfig, build_model
from synthlab.training.configs import TrainConfig
from synthlab.training.optim import lr_factor
from synthlab.training.run_folders import load_checkpoint
from synthlab.training.trainer import build_optimizer, train
from synthlab_generators import TASKS, write_dataset

TINY_MODEL = {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_seq_len": 128}
TINY_DATA = {
    "mano": {"L": 2, "n_train": 400, "n_test": 50, "mod": 5},
    "bios": {"n_people": 40},
    "multihop": {"hops": 2, "layers": 3, "per_layer": 8, "relations": 3, "train_fraction": 0.5, "n_test": 20},
    "reach": {"nodes": 16, "max_diameter": 3, "n_train": 200, "n_test": 20, "edge_repeats": 2},
}


@pytest.fixture(scope="session")
def datasets(tmp_path_factory):
    """Tiny datasets written by the real generators, one per task (generated on first use)."""
    root = tmp_path_factory.mktemp("data")
    made = {}

    def get(task):
        if task not in made:
            if task not in TASKS:
                pytest.skip(f"no {task} generator yet")
            spec = TASKS[task]
            made[task] = write_dataset(spec, spec.params_cls(**TINY_DATA[task]), 0, root / task)
        return made[task]

    return get


def run_config(data, task, model=None, **train):
    train = {"steps": 12, "batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "log_every": 1, **train}
    return resolve_run_config({}, {**TINY_MODEL, **(model or {})}, {"task": task, "data": str(data), **train})


def losses_of(run_dir):
    return [json.loads(line)["loss_per_step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_lr_warms_up_then_decays_to_the_floor():
    values = [lr_factor(s, warmup=10, total=100, min_ratio=0.1) for s in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[9:], values[10:]))  # non-increasing after warmup
    assert lr_factor(100, warmup=10, total=100, min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(55, warmup=10, total=100, min_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos = 0


@pytest.mark.parametrize("schedule", ["constant", "wsd"])
def test_constant_and_wsd_hold_the_peak_after_warmup(schedule):
    values = [
        lr_factor(s, warmup=10, total=100, min_ratio=0.1, schedule=schedule, decay_fraction=0.2) for s in range(100)
    ]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    stable = values[10:80]
    assert all(v == 1.0 for v in stable)
    if schedule == "constant":
        assert all(v == 1.0 for v in values[80:])
    else:  # a linear cooldown over the last 20 steps, ending at min_ratio
        assert all(a > b for a, b in zip(values[79:], values[80:]))
        assert values[99] == pytest.approx(0.1)


def test_weight_decay_only_on_matrices():
    model = build_model(ModelConfig(vocab_size=20, **TINY_MODEL))
    optimizer = build_optimizer(model, TrainConfig.flat(steps=1, weight_decay=0.3))
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.3 for p in g["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (p.dim() >= 2), name
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))


@pytest.mark.parametrize("task,model", [("mano", {"loops": 2}), ("bios", {"loops": 1})])
def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(tmp_path, datasets, monkeypatch, task, model):
    """SIGTERM mid-run writes a checkpoint; --resume then logs exactly the losses of a straight run."""
    handler_before = signal.getsignal(signal.SIGTERM)  # not always SIG_DFL: Ray installs its own
    run = run_config(datasets(task), task, model, checkpoint_every=5)
    assert train(tmp_path / "straight", run, progress=False).step == 12

    calls = {"n": 0}
    original = train.__globals__["Batcher"].next_batch

    def next_batch_then_signal(self):
        calls["n"] += 1
        if calls["n"] == 7:  # the signal arrives during step 7: it finishes, checkpoints, stops
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(train.__globals__["Batcher"], "next_batch", next_batch_then_signal)
    result = train(tmp_path / "resumed", run, progress=False)
    assert result.interrupted and result.step == 7
    assert load_checkpoint(tmp_path / "resumed")["step"] == 7
    monkeypatch.undo()
    assert train(tmp_path / "resumed", None, progress=False).step == 12
    assert losses_of(tmp_path / "resumed") == losses_of(tmp_path / "straight")  # bit for bit
    assert signal.getsignal(signal.SIGTERM) == handler_before  # handlers restored


@pytest.mark.parametrize("task", ["mano", "bios", "multihop", "reach"])
def test_a_short_run_lowers_the_loss(tmp_path, datasets, task):
    run = run_config(datasets(task), task, steps=25, lr=1e-2, warmup_steps=3, batch_size=4 if task == "bios" else 8)
    train(tmp_path / "run", run, progress=False)
    losses = [step[-1] for step in losses_of(tmp_path / "run")]
    assert sum(losses[-5:]) / 5 < 0.8 * losses[0]  # against the untrained model (its first batch)


def test_bad_input_is_one_readable_line(tmp_path, datasets):
    data = datasets("mano")
    with pytest.raises(SynthlabError, match="does not match"):
        run_config(data, "bios")
    with pytest.raises(SynthlabError, match="did you mean 'optim.lr'"):
        resolve_run_config({"train": {"lrr": 1.0}}, {}, {"data": str(data), "steps": 1})
    with pytest.raises(SynthlabError, match="did you mean 'd_model'"):
        resolve_run_config({"model": {"d_modle": 8}}, {}, {"data": str(data), "steps": 1})
    with pytest.raises(SynthlabError, match="exactly one of"):
        run_config(data, "mano", exposures=2.0)
    # the flag replaces the file's choice of length
    file = {"train": {"steps": 5}}
    assert resolve_run_config(file, TINY_MODEL, {"data": str(data), "exposures": 2.0}).train.schedule.steps is None


def test_corrupt_checkpoint_and_occupied_out(tmp_path, datasets):
    run = run_config(datasets("mano"), "mano", steps=2)
    train(tmp_path / "run", run, progress=False)
    with pytest.raises(SynthlabError, match="not empty"):
        train(tmp_path / "run", run, progress=False)
    path = tmp_path / "run" / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:1000])
    before = path.read_bytes()
    with pytest.raises(SynthlabError, match="corrupt checkpoint"):
        train(tmp_path / "run", None, progress=False)
    assert path.read_bytes() == before


def test_exposures_set_the_length_and_config_round_trips(tmp_path, datasets):
    run = run_config(datasets("bios"), "bios", steps=None, exposures=2.0, batch_size=4)
    train(tmp_path / "run", run, progress=False)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    derived = saved.pop("derived")
    assert derived["pack"] is True
    assert (derived["processes"], derived["threads"]) == (1, torch.get_num_threads())  # how it was run
    assert derived["total_steps"] == math.ceil(2.0 * derived["rows_per_epoch"] / 4)
    assert serialize.to_dict(serialize.from_dict(type(run), saved)) == serialize.to_dict(run)
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["batcher"]["epoch"] >= 1


@pytest.mark.parametrize("loss", ["mean", "ouro"])
def test_per_step_objectives_train_every_step(tmp_path, datasets, loss):
    run = run_config(datasets("mano"), "mano", {"loops": 3, "exit_gate": True}, steps=6, loss=loss)
    train(tmp_path / "run", run, progress=False)
    lines = losses_of(tmp_path / "run")
    assert all(len(per_step) == 3 and all(math.isfinite(v) for v in per_step) for per_step in lines)
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["model"]
    fresh = build_model(run.model, seed=0).state_dict()
    gate_moved = not torch.equal(state["exit_gate.weight"], fresh["exit_gate.weight"])
    assert gate_moved == (loss == "ouro")  # only stage I sends gradients to the exit gate


def test_ouro_stage2_trains_the_gate_alone_from_a_stage1_run(tmp_path, datasets):
    data = datasets("mano")
    stage1 = run_config(data, "mano", {"loops": 3, "exit_gate": True}, steps=4, loss="ouro")
    train(tmp_path / "stage1", stage1, progress=False)
    without_start = run_config(data, "mano", {"loops": 3, "exit_gate": True}, steps=4, loss="ouro_stage2")
    with pytest.raises(SynthlabError, match="init_from"):
        train(tmp_path / "bad", without_start, progress=False)
    assert not (tmp_path / "bad").exists()
    stage2 = run_config(
        data, "mano", {"loops": 3, "exit_gate": True}, steps=4, loss="ouro_stage2", init_from=str(tmp_path / "stage1")
    )
    train(tmp_path / "stage2", stage2, progress=False)
    before = torch.load(tmp_path / "stage1" / "checkpoint.pt", weights_only=True)["model"]
    after = torch.load(tmp_path / "stage2" / "checkpoint.pt", weights_only=True)["model"]
    for name, tensor in after.items():
        assert torch.equal(tensor, before[name]) != name.startswith("exit_gate."), name
