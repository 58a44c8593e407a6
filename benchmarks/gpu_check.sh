#!/usr/bin/env bash
# The GPU check: one script, under 9 minutes on one H100/H200, numbers to a file.
#
#   bash benchmarks/gpu_check.sh [--out DIR] [--dry-run] [--parts throughput,learn,...]
#
# Writes DIR/gpu_check.json and DIR/gpu_check.md (DIR: --out, else $OUT, else results/gpu), a log
# per part, and DIR/parts/*.json as each part goes. Parts, each in its own process under its own
# timeout so one failure does not eat the budget (see benchmarks/gpu_check.py):
#   throughput (135 s)  d = 1024 Mano model vs a reference GPT, eager and compiled: tokens/s, MFU
#   learn       (75 s)  a 200-step Mano run through the real trainer: the loss falls, 1-operator accuracy
#   ouroboros   (85 s)  the OUROBOROS system on a random Qwen2.5-3B: step time, peak memory, trainables
#   calibrate  (110 s)  the cost model's inputs (benchmarks/gpu_calibrate.py): peak memory of the largest
#                       preset shapes with and without activation checkpointing, compiled MFU at d = 128-384
#                       on packed rows (dense mask and flex_attention), the real trainer against a bare
#                       loop and the time a checkpoint adds; writes DIR/cost_calibration.json, which
#                       `synthlab sweep NAME --preset gpu --dry-run --calibration FILE` reads
#   pytest      (80 s)  pytest -m cuda (tests/test_cuda.py, tests/test_packed_attention.py)
# --parts: the parts to run (default all five, in this order). The environment: benchmarks/gpu_env.sh.
# --dry-run runs the same code on the CPU at tiny sizes in about a minute.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
DIR="${OUT:-$REPO/results/gpu}"
DRY=""
PARTS="throughput,learn,ouroboros,calibrate,pytest"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) DIR="$2"; shift 2 ;;
    --dry-run) DRY="--dry-run"; shift ;;
    --parts) PARTS="$2"; shift 2 ;;
    *) echo "usage: $0 [--out DIR] [--dry-run] [--parts P1,P2,...]" >&2; exit 2 ;;
  esac
done
. "$REPO/benchmarks/gpu_env.sh"

# Each part's limit (seconds); the environment may lower them (benchmarks/gpu_all.sh does).
if [ -n "$DRY" ]; then T_THROUGHPUT=120; T_LEARN=120; T_OURO=120; T_CALIB=240; T_PYTEST=120; else
  T_THROUGHPUT=${T_THROUGHPUT:-135}; T_LEARN=${T_LEARN:-75}; T_OURO=${T_OURO:-85}; T_CALIB=${T_CALIB:-110}
  T_PYTEST=${T_PYTEST:-80}; fi  # 8.9 minutes at most by default, kills (+10 s each) included
want() { case ",$PARTS," in *",$1,"*) return 0 ;; esac; return 1; }
want throughput && part throughput "$T_THROUGHPUT" "$PY" benchmarks/gpu_check.py throughput --out "$DIR" $DRY
want learn && part learn "$T_LEARN" "$PY" benchmarks/gpu_check.py learn --out "$DIR" $DRY
want ouroboros && part ouroboros "$T_OURO" "$PY" benchmarks/gpu_check.py ouroboros --out "$DIR" $DRY
want calibrate && part calibrate "$T_CALIB" "$PY" benchmarks/gpu_calibrate.py --out "$DIR" $DRY
# the cuda tests (skipped on a CPU)
want pytest && part pytest "$T_PYTEST" "$PY" -m pytest -m cuda -q -p no:cacheprovider tests/test_cuda.py tests/test_packed_attention.py
"$PY" benchmarks/gpu_check.py report --out "$DIR" $DRY
echo "=== done in $((SECONDS - START))s: $DIR/gpu_check.md"
for f in "$DIR"/*.rc; do printf '%s=%s ' "$(basename "$f" .rc)" "$(cat "$f")"; done; echo
