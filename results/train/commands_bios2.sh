#!/usr/bin/env bash
# Second bioS capacity pair (after the first, d = 16, stored nothing measurable): more optimizer
# steps per exposure (batch 8 rows) and d = 32, N = 3000 so the data still holds more bits than
# 2 bits/param of the model. Usage: bash results/train/commands_bios2.sh {data|plain|loop}
set -euo pipefail
S=".venv/bin/synthlab"
BIOS="--task bios --data data/bios-n3000 --exposures 20 --d-model 32 --n-layers 1 --n-heads 2 --max-seq-len 256
      --batch-size 8 --lr 3e-3 --warmup-steps 50 --weight-decay 0.02 --log-every 25 --checkpoint-every 200 --threads 1 --no-progress"
case "$1" in
  data) $S gen bios --n-people 3000 --seed 0 --out data/bios-n3000 ;;
  plain)
    $S train $BIOS --loops 1 --out runs/bios3k-plain-1x1
    $S capacity runs/bios3k-plain-1x1
    $S eval runs/bios3k-plain-1x1 ;;
  loop)
    $S train $BIOS --loops 4 --out runs/bios3k-loop-1x4
    $S capacity runs/bios3k-loop-1x4
    $S eval runs/bios3k-loop-1x4 ;;
esac
