"""Probe (commit ef6f890) for C7: how alike are a looped model's keys and values across recurrent steps?
For each run: the cosine similarity, per position and head, between step t's K (and V) and step 1's
and step T's, averaged over the first 64 training biographies (prefill of each, no decoding).
usage: python results/kvcache/kv_similarity.py RUN_DIR [RUN_DIR ...]  (a kvcache sweep's runs/<id>)
It reads the model's own step function (`_embed_prelude`, `_core_step`), as `generate`'s prefill does."""

import sys

import torch

from synthlab.data.datasets import load_dataset
from synthlab.models.recurrence import initial_state
from synthlab.training.run_folders import open_run, trained_data

torch.manual_seed(0)
for run_dir in sys.argv[1:]:
    model, run, derived = open_run(f"{run_dir}/model", torch.device("cpu"))
    data = load_dataset(trained_data(f"{run_dir}/model", run, derived), run.train.task)
    texts = [data.encode_text(r["text"]) for r in data.records("train")[:64]]
    T = model.config.loops
    sims = {name: torch.zeros(T, 2) for name in ("k", "v")}
    with torch.no_grad():
        for ids in texts:
            idx = torch.tensor([ids[: model.config.max_seq_len]])
            rope = model._rope(0, idx.shape[1])
            e, _ = model._embed_prelude(idx, rope, None)
            h, per_step = initial_state(model.config.state_init, e, model.config.state_init_std, None), []
            for t in range(T):
                h, kvs, _ = model._core_step(h, e, t, rope)
                per_step.append(kvs[0])
            for j, name in enumerate(("k", "v")):
                for t in range(T):
                    for col, ref in enumerate((0, T - 1)):
                        a, b = per_step[t][j], per_step[ref][j]
                        sims[name][t, col] += torch.nn.functional.cosine_similarity(a, b, dim=-1).mean() / len(texts)
    print(run_dir, f"loops {T}, d_model {model.config.d_model}")
    for name in ("k", "v"):
        print(
            f"  {name}: cos with step 1: "
            + " ".join(f"{x:.3f}" for x in sims[name][:, 0].tolist())
            + " | with step T: "
            + " ".join(f"{x:.3f}" for x in sims[name][:, 1].tolist())
        )
