"""OUROBOROS on a Qwen2.5-3B-shaped model with random bf16 weights: can one GPU train and evaluate it?

Builds the 36-layer Qwen2.5-3B shape (hidden 2048, intermediate 11008, 16 heads, 2 KV heads, vocab
151936) with random weights (no download), cuts it into the reference split (0-7 | 18 | 28-35),
computes the SVD bases, then for the controller variant:
  - a causality check on the device (change a later token; earlier logits must not move),
  - one training step (forward, backward, AdamW) at each training depth (default 4, 8, 16),
  - one evaluation (no grad) at each depth (default 1, 4, 8, 16), and the truncated / full baselines,
printing seconds, tokens/s and peak memory for each. Random weights say nothing about loss values;
this measures feasibility and speed only.

    python benchmarks/gpu_ouroboros.py                # CUDA, bf16, batch 4 x 2048 tokens
    python benchmarks/gpu_ouroboros.py --tiny         # the same path on CPU with a tiny config

The HF initialiser draws from torch's global generator, seeded here with --seed.
"""

from __future__ import annotations

import argparse
import time

import torch

SHAPE_3B = dict(
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1e6,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
SHAPE_TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny config on CPU (float32) to check the path")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 2048; tiny 32)")
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per step (default 4; tiny 2)")
    parser.add_argument("--train-depths", default="4,8,16", help="depths of the training steps")
    parser.add_argument("--eval-depths", default="1,4,8,16", help="depths of the evaluations")
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and token ids")
    return parser.parse_args()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(device: torch.device, fn):
    """(result, seconds, peak GiB since the start of fn; 0 on the CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    start = time.perf_counter()
    result = fn()
    sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return result, seconds, peak


def main() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from synthlab.ouroboros import OuroborosConfig, OuroborosLM, lm_loss, summary
    from synthlab.ouroboros.train import OuroborosTrainConfig, make_optimizer

    args = parse_args()
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --tiny to check the path on the CPU")
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    seq_len = args.seq_len or (32 if args.tiny else 2048)
    batch_size = args.batch_size or (2 if args.tiny else 4)
    train_depths = [int(d) for d in args.train_depths.split(",")]
    eval_depths = [int(d) for d in args.eval_depths.split(",")]
    tokens = batch_size * seq_len
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for the float32 gate / controller matmuls
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")

    torch.manual_seed(args.seed)
    config = Qwen2Config(**(SHAPE_TINY if args.tiny else SHAPE_3B), attn_implementation=args.attn)
    with torch.device(device):
        base, seconds, _ = measure(device, lambda: Qwen2ForCausalLM._from_config(config, dtype=dtype))
    base.eval().requires_grad_(False)
    print(
        f"random {'tiny' if args.tiny else 'Qwen2.5-3B-shaped'} base: "
        f"{sum(p.numel() for p in base.parameters()) / 1e9:.3f}B params, {dtype}, built in {seconds:.1f}s"
    )

    generator = torch.Generator().manual_seed(args.seed)
    model, seconds, peak = measure(device, lambda: OuroborosLM(base, OuroborosConfig(), generator))
    info = summary(model)
    print(
        f"system: split prelude {info['split']['prelude'][0]}-{info['split']['prelude'][-1]}, recurrent "
        f"{info['split']['recurrent']}, coda {info['split']['coda'][0]}-{info['split']['coda'][-1]}; "
        f"trainable {info['trainable_params']:,} ({info['trainable_breakdown']}); SVD bases in {seconds:.1f}s, "
        f"peak {peak:.1f} GiB"
    )

    ids_gen = torch.Generator().manual_seed(args.seed + 1)
    batch = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=ids_gen).to(device)

    # Causality on this device and kernel: controller heads made non-zero so pooling matters.
    with torch.no_grad():
        for p in model.controller.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=ids_gen).to(p))
        probe = batch[:1, :64].clone()
        edit = probe.shape[1] * 5 // 8
        changed = probe.clone()
        changed[:, edit] = (changed[:, edit] + 1) % config.vocab_size
        before, after = model(probe, 2).float(), model(changed, 2).float()
        leak = (before[:, :edit] - after[:, :edit]).abs().max().item()
        reach = (before[:, edit:] - after[:, edit:]).abs().max().item()
        model.controller.heads.weight.zero_()
        model.controller.heads.bias.zero_()
    print(f"causality: max |change| before the edited token {leak:.2e} (must be 0), after it {reach:.2e}")

    optimizer = make_optimizer(model, OuroborosTrainConfig())

    def train_step(depth):
        loss = lm_loss(model(batch, depth), batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    model.train()
    measure(device, lambda: train_step(1))  # warm-up: kernel selection, allocator, optimizer state
    print(f"\ntraining step (batch {batch_size} x {seq_len} = {tokens} tokens)")
    for depth in train_depths:
        loss, seconds, peak = measure(device, lambda d=depth: train_step(d))
        print(
            f"  depth {depth:2d}: loss {loss:.3f}  {seconds:6.2f}s  {tokens / seconds:9.0f} tok/s  "
            f"peak {peak:6.1f} GiB  (effective batch 32: {seconds * 32 / batch_size:.1f}s/step)"
        )

    model.eval()
    print("\nevaluation (no grad)")
    with torch.no_grad():
        rows = [(f"controller depth {d:2d}", model, d) for d in eval_depths]
        rows += [
            (name, OuroborosLM(base, OuroborosConfig(variant=name), generator), 1) for name in ("truncated", "base")
        ]
        for name, system, depth in rows:
            loss, seconds, peak = measure(device, lambda s=system, d=depth: lm_loss(s(batch, d), batch).item())
            print(
                f"  {name:20s}: loss {loss:.3f}  {seconds:6.2f}s  {tokens / seconds:9.0f} tok/s  peak {peak:6.1f} GiB"
            )


if __name__ == "__main__":
    main()
