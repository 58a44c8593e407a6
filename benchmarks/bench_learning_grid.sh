#!/usr/bin/env bash
# bench_learning over a grid: one run of benchmarks/bench_learning.py per line of ARGS_FILE, P at a
# time, inside OUT_DIR (each line's --out is relative to it; a log beside each table).
#
#   bash benchmarks/bench_learning_grid.sh ARGS_FILE OUT_DIR [P]     (P default 1)
#   DEVICE=cuda bash benchmarks/bench_learning_grid.sh ...           (both models of every run on the GPU)
#
# Then: python benchmarks/bench_learning_seeds.py OUT_DIR/...  (paired differences over seeds).
# Runs without an install when python3 has the dependencies (the repository's packages are linked
# under their installed names), as on a bare GPU machine; LIMIT=seconds stops the grid.
set -u
[ $# -ge 2 ] || { echo "usage: $0 ARGS_FILE OUT_DIR [P]" >&2; exit 2; }
ARGS="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
OUT_DIR="$2"; P="${3:-1}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
if ! "$PY" -c "import synthlab_generators" 2>/dev/null; then
  SITE="$(mktemp -d)"
  ln -s "$REPO/generators/synthlab_generators" "$SITE/synthlab_generators"
  ln -s "$REPO/experiments" "$SITE/synthlab_experiments"
  "$PY" -c "import tomli_w" 2>/dev/null || "$PY" -m zipfile -e "$REPO"/.whl/tomli_w-*.whl "$SITE"
  export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PY REPO DEVICE="${DEVICE:-cpu}"
mkdir -p "$OUT_DIR" && cd "$OUT_DIR"
one() {  # one run: its arguments as on a line of ARGS_FILE
  local out="" prev="" arg
  for arg in "$@"; do [ "$prev" = "--out" ] && out="$arg"; prev="$arg"; done
  mkdir -p "$(dirname "$out")"
  "$PY" "$REPO/benchmarks/bench_learning.py" --device "$DEVICE" "$@" > "$out.log" 2>&1
  echo "$(date +%T) exit $? $out"
}
export -f one
timeout "${LIMIT:-0}" xargs -P "$P" -L 1 bash -c 'one "$@"' _ < "$ARGS"
