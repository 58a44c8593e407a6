#!/usr/bin/env bash
# The GPU measurements in one call: at most 12 minutes on one H200, everything under one folder.
#
#   bash benchmarks/gpu_all.sh [--out DIR] [--dry-run]          (DIR: --out, else $OUT)
#
# Parts in order of value, each in its own processes under its own time limit (`timeout`, killed
# 10 s after it), each writing as it goes, so a part cut short or failing keeps what it measured
# and the next part still runs; the limits are printed first and sum to at most 720 s:
#   check     the GPU check (benchmarks/gpu_check.sh, parts learn, calibrate, pytest): the real
#             trainer on CUDA with bf16 autocast, the cost calibration (DIR/cost_calibration.json:
#             memory, compiled MFU at d = 128-384, the trainer against a bare loop), pytest -m cuda
#             (the compiled step among them)
#   capacity  benchmarks/gpu_capacity.py: the capacity presets calib64 and calib1000-64 (d 64 x 1
#             and x 2 layers, N at data ceilings of about 1.5, 3 and 6 bits/param, a larger N;
#             loops 1 and 4; 100 and 1000 exposures) as far as its budget goes, several at a time;
#             peak bits/param per model over N beside the paper's (DIR/capacity/gpu_capacity.md)
#   cost      benchmarks/gpu_cost_check.py: the sweep dry run's estimate of two real gpu-preset
#             points (plain and looped) against their timed stages, with and without the calibration
#   mfu       benchmarks/gpu_mfu.py: MFU of a bare training step at d = 64, 128, 256, 1024, eager
#             and compiled
# At the end DIR/gpu_check.json and DIR/gpu_check.md gather every part's DIR/parts/*.json and exit
# code. --dry-run: every part on the CPU at toy sizes (the cuda tests collected and skipped).
set -u
DIR="${OUT:-}"
DRY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) DIR="$2"; shift 2 ;;
    --dry-run) DRY="--dry-run"; shift ;;
    *) echo "usage: $0 [--out DIR] [--dry-run]" >&2; exit 2 ;;
  esac
done
if [ -z "$DIR" ]; then echo "error: no output folder: pass --out DIR or set OUT" >&2; exit 2; fi
. "$(cd "$(dirname "$0")" && pwd)/gpu_env.sh"

# Limits in seconds. check: its parts' own limits below (+10 s each to kill) and its report.
export T_LEARN=45 T_CALIB=110 T_PYTEST=70
T_CHECK=270; T_CAPACITY=200; CAPACITY_BUDGET=180; T_COST=110; T_MFU=80
TOTAL=$((T_CHECK + T_CAPACITY + T_COST + T_MFU + 4 * 10))
echo "limits (s, each +10 to kill): check $T_CHECK (learn $T_LEARN, calibrate $T_CALIB, pytest $T_PYTEST)," \
  "capacity $T_CAPACITY (cases within $CAPACITY_BUDGET), cost $T_COST, mfu $T_MFU; at most $TOTAL s in all"
if [ "$TOTAL" -gt 720 ]; then echo "error: the limits sum to $TOTAL s, over 720" >&2; exit 2; fi
if [ -n "$DRY" ]; then  # the CPU at toy sizes: limits that only stop a hang
  T_CHECK=600; T_CAPACITY=150; CAPACITY_BUDGET=60; T_COST=120; T_MFU=120
fi

part check "$T_CHECK" bash benchmarks/gpu_check.sh --out "$DIR" --parts learn,calibrate,pytest $DRY
part capacity "$T_CAPACITY" "$PY" benchmarks/gpu_capacity.py --out "$DIR/capacity" --budget-s "$CAPACITY_BUDGET" $DRY
part cost "$T_COST" "$PY" benchmarks/gpu_cost_check.py --out "$DIR" --calibration "$DIR/cost_calibration.json" $DRY
part mfu "$T_MFU" "$PY" benchmarks/gpu_mfu.py --out "$DIR" $DRY
"$PY" benchmarks/gpu_check.py report --out "$DIR" $DRY > /dev/null
# the capacity runs' datasets and checkpoints, which this script made, go (their configs, metrics,
# final weights and capacity.json stay), so that DIR is small enough to keep
rm -rf "$DIR/capacity/cache"
find "$DIR/capacity/runs" \( -name 'checkpoint*.pt' -o -name 'checkpoint*.pt.sha256' \) -delete 2>/dev/null
echo "=== done in $((SECONDS - START))s: $DIR/gpu_check.md, $DIR/capacity/gpu_capacity.md"
for f in "$DIR"/*.rc; do printf '%s=%s ' "$(basename "$f" .rc)" "$(cat "$f")"; done; echo
