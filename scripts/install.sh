#!/usr/bin/env bash
# Creates .venv and installs synthlab into it (editable) with the test extras.
#
# Torch: if the environment has no torch yet, machines without an NVIDIA driver get the CPU
# build pinned in SYNTHLAB_TORCH (default torch==2.13.0, the CPU wheel that these project
# machines carry on disk, so nothing multi-GB is downloaded); machines with `nvidia-smi` get
# whatever `torch` resolves to. Set SYNTHLAB_TORCH to any pip requirement to choose yourself.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip >/dev/null
if ! $py -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then default_torch="torch"; else default_torch="torch==2.13.0"; fi
    $py -m pip install -q "${SYNTHLAB_TORCH:-$default_torch}"
fi
$py -m pip install -q -e ".[test]"
echo "installed synthlab into .venv ($($py -c 'import torch; print("torch", torch.__version__)'))"
