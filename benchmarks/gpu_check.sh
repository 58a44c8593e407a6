#!/usr/bin/env bash
# The GPU check: one script, under 9 minutes on one H100/H200, numbers to a file.
#
#   bash benchmarks/gpu_check.sh [--out DIR] [--dry-run]
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
# Needs only python3 with torch, transformers, numpy, pandas, networkx, typer, tqdm and pytest: the
# repository is imported from its folder (no pip install); tomli_w, when missing, is installed
# from the wheel in .whl/ (unpacked into a temporary folder). --dry-run runs the same code on the CPU at tiny
# sizes in about a minute.
set -u
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
DIR="${OUT:-$REPO/results/gpu}"
DRY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) DIR="$2"; shift 2 ;;
    --dry-run) DRY="--dry-run"; shift ;;
    *) echo "usage: $0 [--out DIR] [--dry-run]" >&2; exit 2 ;;
  esac
done
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

# The repository's packages under their installed names, without installing anything.
SITE="$(mktemp -d)/site"
mkdir -p "$SITE"
ln -s "$REPO/generators/synthlab_generators" "$SITE/synthlab_generators"
ln -s "$REPO/experiments" "$SITE/synthlab_experiments"
if ! "$PY" -c "import tomli_w" 2>/dev/null; then  # a pure-python wheel: unpacking it installs it
  for whl in "$REPO"/.whl/tomli_w-*.whl; do
    [ -f "$whl" ] && "$PY" -m zipfile -e "$whl" "$SITE" && echo "tomli_w from $whl"
  done
  if ! "$PY" -c "import sys; sys.path.insert(0, '$SITE'); import tomli_w" 2>/dev/null; then
    # no wheel carried: a stand-in that imports (synthlab.config does) and fails only if TOML is written
    echo "warning: tomli_w missing and not in .whl/: a stand-in that cannot write TOML is used"
    printf 'def dumps(obj):\n    raise RuntimeError("tomli_w is not installed")\n' > "$SITE/tomli_w.py"
  fi
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"

if [ -n "$DRY" ]; then T_THROUGHPUT=120; T_LEARN=120; T_OURO=120; T_CALIB=240; T_PYTEST=120; else
  T_THROUGHPUT=135; T_LEARN=75; T_OURO=85; T_CALIB=110; T_PYTEST=80; fi  # 8.9 minutes at most, kills (+10 s each) included
START=$SECONDS
part() {  # part NAME TIMEOUT COMMAND...: run under a timeout, log to DIR/NAME.log, never stop the script
  local name="$1" limit="$2"; shift 2
  echo "=== $name (timeout ${limit}s) at +$((SECONDS - START))s"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after +$((SECONDS - START))s"
  echo "$rc" > "$DIR/$name.rc"
}
part throughput "$T_THROUGHPUT" "$PY" benchmarks/gpu_check.py throughput --out "$DIR" $DRY
part learn "$T_LEARN" "$PY" benchmarks/gpu_check.py learn --out "$DIR" $DRY
part ouroboros "$T_OURO" "$PY" benchmarks/gpu_check.py ouroboros --out "$DIR" $DRY
part calibrate "$T_CALIB" "$PY" benchmarks/gpu_calibrate.py --out "$DIR" $DRY
part pytest "$T_PYTEST" "$PY" -m pytest -m cuda -q -p no:cacheprovider tests/test_cuda.py tests/test_packed_attention.py  # skipped on a CPU
"$PY" benchmarks/gpu_check.py report --out "$DIR" $DRY
rm -rf "$(dirname "$SITE")"
echo "=== done in $((SECONDS - START))s: $DIR/gpu_check.md"
for f in "$DIR"/*.rc; do printf '%s=%s ' "$(basename "$f" .rc)" "$(cat "$f")"; done; echo
