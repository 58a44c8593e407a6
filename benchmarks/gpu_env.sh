# Sourced by benchmarks/gpu_check.sh and benchmarks/gpu_all.sh (after they set DIR, their output
# folder): the Python environment of the GPU scripts and `part`, which runs one part of them.
# Needs only python3 with torch, transformers, numpy, pandas, networkx, typer, tqdm and pytest: the
# repository is imported from its folder (no pip install); tomli_w, when missing, is installed
# from the wheel in .whl/ (unpacked into a temporary folder).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

# The repository's packages under their installed names, without installing anything.
SITE="$(mktemp -d)/site"
trap 'rm -rf "$(dirname "$SITE")"' EXIT
mkdir -p "$SITE"
ln -s "$REPO/generators/synthlab_generators" "$SITE/synthlab_generators"
ln -s "$REPO/experiments" "$SITE/synthlab_experiments"
if ! "$PY" -c "import tomli_w" 2>/dev/null; then  # a pure-python wheel: unpacking it installs it
  for whl in "$REPO"/.whl/tomli_w-*.whl; do
    [ -f "$whl" ] && "$PY" -m zipfile -e "$whl" "$SITE" && echo "tomli_w from $whl"
  done
  if ! "$PY" -c "import sys; sys.path.insert(0, '$SITE'); import tomli_w" 2>/dev/null; then
    # no wheel carried: a stand-in that imports (synthlab.serialize does) and fails only if TOML is written
    echo "warning: tomli_w missing and not in .whl/: a stand-in that cannot write TOML is used"
    printf 'def dumps(obj):\n    raise RuntimeError("tomli_w is not installed")\n' > "$SITE/tomli_w.py"
  fi
fi
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"

START=$SECONDS
part() {  # part NAME TIMEOUT COMMAND...: run under a timeout, log to DIR/NAME.log, never stop the script
  local name="$1" limit="$2"; shift 2
  echo "=== $name (timeout ${limit}s) at +$((SECONDS - START))s"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after +$((SECONDS - START))s"
  echo "$rc" > "$DIR/$name.rc"
}
