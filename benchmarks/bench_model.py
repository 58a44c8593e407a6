"""Training speed of the synthlab model against a minimal reference GPT, measured in one run.

Both train (forward, backward, AdamW) on random tokens at the same sizes and architecture (pre-norm
RMSNorm, RoPE, GELU MLP, no bias, tied head, causal SDPA). Rounds interleave the two models (and
alternate which goes first) so that noise on a shared machine hits both; tokens/s are medians over
rounds. Target: synthlab / reference >= 0.95 at loops = 1, i.e. the flexibility of the
one configurable model costs nothing. MFU uses synthlab's analytic training FLOPs (3 x forward,
`flops_per_token`) against an fp32 matmul peak measured in the same run.

    .venv/bin/python benchmarks/bench_model.py [--d-model 256 --layers 4 --seq 256 --batch 16]
        [--loops 1] [--threads 2] [--rounds 7] [--steps 3] [--exit]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from synthlab.models import ModelConfig, build_model, flops_per_token, last_step_loss


# --- the reference: a GPT written the short way ----------------------------------------------------
class RefBlock(nn.Module):
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x, cos, sin):
        B, S, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def rope(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

        y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, S, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class RefGPT(nn.Module):
    def __init__(self, vocab: int, d: int, n_heads: int, n_layers: int, seq: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(RefBlock(d, n_heads) for _ in range(n_layers))
        self.ln_f = nn.RMSNorm(d, eps=1e-5)
        dh = d // n_heads
        freqs = torch.outer(torch.arange(seq).float(), 10000.0 ** (-torch.arange(0, dh, 2) / dh))
        freqs = torch.cat([freqs, freqs], -1)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, self.cos[: idx.shape[1]], self.sin[: idx.shape[1]])
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


# --- measurement -----------------------------------------------------------------------------------
def matmul_peak(n: int = 1024, repeats: int = 20) -> float:
    """Sustained fp32 matmul FLOP/s on this machine and thread count (best of a few tries)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 * repeats / best


def train_steps(loss_fn, model, optimizer, idx, targets, steps: int) -> float:
    """Seconds for `steps` training steps (forward, backward, AdamW)."""
    start = time.perf_counter()
    for _ in range(steps):
        loss = loss_fn(model, idx, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def exit_savings(cfg: ModelConfig, idx: torch.Tensor, rounds: int) -> None:
    """Early exit saves real time: forward_exit with a rule every token meets at step 2 against
    the full depth (static:T), interleaved, on a loops >= 4 copy of the model."""
    T = max(cfg.loops, 4)
    model = build_model(dataclasses.replace(cfg, loops=T)).eval()
    seconds: dict[str, list[float]] = {f"static:{T}": [], "diff:1e9": []}
    steps = {}
    for _ in range(rounds):
        for rule in seconds:
            start = time.perf_counter()
            steps[rule] = model.forward_exit(idx, rule).steps_computed
            seconds[rule].append(time.perf_counter() - start)
    full, early = (statistics.median(v) for v in seconds.values())
    print(
        f"early exit (loops={T}): static:{T} ran {steps[f'static:{T}']} steps in {full:.2f} s; "
        f"diff:1e9 ran {steps['diff:1e9']} steps in {early:.2f} s; time ratio {early / full:.2f} "
        f"(steps ratio {steps['diff:1e9'] / T:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--loops", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="training steps per model per round")
    parser.add_argument("--exit", action="store_true", help="also time early exit against the full depth (inference)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cfg = ModelConfig(
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_heads=args.heads,
        n_layers=args.layers,
        max_seq_len=args.seq,
        loops=args.loops,
    )
    torch.manual_seed(0)  # the reference's init (weights do not matter for speed)
    models = {
        "reference": RefGPT(args.vocab, args.d_model, args.heads, args.layers, args.seq),
        "synthlab": build_model(cfg).train(),
    }
    losses = {"reference": lambda m, i, t: m(i, t), "synthlab": lambda m, i, t: last_step_loss(m(i).step_logits, t)}
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    tokens = args.batch * args.seq
    n_ref = sum(p.numel() for p in models["reference"].parameters())
    n_syn = sum(p.numel() for p in models["synthlab"].parameters())
    print(
        f"d={args.d_model} layers={args.layers} loops={args.loops} seq={args.seq} "
        f"batch={args.batch} vocab={args.vocab} threads={args.threads} fp32; "
        f"params reference={n_ref} synthlab={n_syn}"
    )

    for name in models:  # warm-up (allocator, kernels)
        train_steps(losses[name], models[name], optimizers[name], idx, targets, 1)
    rates: dict[str, list[float]] = {name: [] for name in models}
    peaks = []
    for r in range(args.rounds):
        order = list(models) if r % 2 == 0 else list(models)[::-1]
        for name in order:
            seconds = train_steps(losses[name], models[name], optimizers[name], idx, targets, args.steps)
            rates[name].append(tokens * args.steps / seconds)
        peaks.append(matmul_peak())
    ref, syn = statistics.median(rates["reference"]), statistics.median(rates["synthlab"])
    ratios = [s / r for s, r in zip(rates["synthlab"], rates["reference"])]
    peak = statistics.median(peaks)
    train_flops = 3 * flops_per_token(cfg, args.seq)
    print(f"reference: {ref:,.0f} tokens/s (median of {args.rounds} rounds)")
    print(f"synthlab:  {syn:,.0f} tokens/s")
    print(
        f"ratio synthlab/reference: {syn / ref:.3f} (median of per-round ratios "
        f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}) "
        f"target >= 0.95 at loops=1"
    )
    print(
        f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s; training FLOPs/token {train_flops:,}; "
        f"MFU synthlab {syn * train_flops / peak:.1%}, reference {ref * train_flops / peak:.1%}"
        + ("" if args.loops == 1 else " (reference MFU uses synthlab's looped FLOPs: ignore)")
    )
    if args.exit:
        exit_savings(cfg, idx, args.rounds)


if __name__ == "__main__":
    main()
