#!/usr/bin/env bash
# The L = 2 Mano pair again with training seed 1 (same data), run in parallel, to see seed spread.
# Usage: bash results/train/commands_mano2_seed1.sh {base|loop}
set -euo pipefail
S=".venv/bin/synthlab"
MANO="--task mano --data data/mano-L2-mod7 --steps 4000 --d-model 64 --n-layers 1 --n-heads 4 --max-seq-len 64
      --batch-size 64 --lr 3e-3 --warmup-steps 200 --weight-decay 0.1 --log-every 50 --checkpoint-every 1000 --threads 1 --no-progress --seed 1"
case "$1" in
  base) $S train $MANO --loops 1 --out runs/manoL2-base-1x1-seed1 && $S eval runs/manoL2-base-1x1-seed1 ;;
  loop) $S train $MANO --loops 4 --out runs/manoL2-loop-1x4-seed1 && $S eval runs/manoL2-loop-1x4-seed1 --steps 8 ;;
esac
