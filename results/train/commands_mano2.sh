#!/usr/bin/env bash
# Second Mano pair (the first, L = 4, stayed near chance for both models): L = 2, mod 7, where one
# layer run once has to compose two operations. Usage: bash results/train/commands_mano2.sh {data|chain}
set -euo pipefail
S=".venv/bin/synthlab"
MANO="--task mano --data data/mano-L2-mod7 --steps 4000 --d-model 64 --n-layers 1 --n-heads 4 --max-seq-len 64
      --batch-size 64 --lr 3e-3 --warmup-steps 200 --weight-decay 0.1 --log-every 50 --checkpoint-every 1000 --threads 1 --no-progress"
case "$1" in
  data) $S gen mano --L 2 --mod 7 --n-train 50000 --n-test 1000 --seed 0 --out data/mano-L2-mod7 ;;
  chain)
    $S train $MANO --loops 1 --out runs/manoL2-base-1x1
    $S eval runs/manoL2-base-1x1
    $S train $MANO --loops 4 --out runs/manoL2-loop-1x4
    $S eval runs/manoL2-loop-1x4
    $S eval runs/manoL2-loop-1x4 --steps 8 ;;
esac
