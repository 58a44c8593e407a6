#!/usr/bin/env bash
# The committed results under results/train/ were made by exactly these commands, from the repo
# root, on the shared 2-core CPU machine (two chains in parallel, one torch thread each).
# Usage: bash results/train/commands.sh {data|chain_a|chain_b}
set -euo pipefail
S=".venv/bin/synthlab"
BIOS="--task bios --data data/bios-n2000 --exposures 20 --d-model 16 --n-layers 2 --n-heads 2 --max-seq-len 256
      --batch-size 32 --lr 5e-3 --warmup-steps 30 --weight-decay 0.02 --log-every 10 --checkpoint-every 100 --threads 1 --no-progress"
MANO="--task mano --data data/mano-L4-mod7 --steps 5000 --d-model 64 --n-layers 1 --n-heads 4 --max-seq-len 64
      --batch-size 64 --lr 3e-3 --warmup-steps 200 --weight-decay 0.1 --log-every 50 --checkpoint-every 1000 --threads 1 --no-progress"
case "$1" in
  data)
    $S gen bios --n-people 2000 --seed 0 --out data/bios-n2000
    $S gen mano --L 4 --mod 7 --n-train 50000 --n-test 1000 --seed 0 --out data/mano-L4-mod7 ;;
  chain_a)  # plain models: bioS 2x1, Mano Base 1x1
    $S train $BIOS --loops 1 --out runs/bios-plain-2x1
    $S capacity runs/bios-plain-2x1
    $S eval runs/bios-plain-2x1
    $S train $MANO --loops 1 --out runs/mano-base-1x1
    $S eval runs/mano-base-1x1 ;;
  chain_b)  # looped models with the same unique parameters: bioS 2x4, Mano Loop 1x4
    $S train $BIOS --loops 4 --out runs/bios-loop-2x4
    $S capacity runs/bios-loop-2x4
    $S eval runs/bios-loop-2x4
    $S train $MANO --loops 4 --out runs/mano-loop-1x4
    $S eval runs/mano-loop-1x4
    $S eval runs/mano-loop-1x4 --steps 8
    $S eval runs/mano-loop-1x4 --exit kl:0.01 ;;
esac
