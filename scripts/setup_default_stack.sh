#!/usr/bin/env bash
# The stack a new user gets today: a plain venv (no system site-packages) with exactly what
# `pip install ".[kernels]"` resolves from the package index on the day (newest transformers,
# the `kernels` it requires, torch and the Triton torch pins), plus fla-core, the package the
# GatedDeltaNet route needs. tests/routing/test_enable_matrix.py runs the whole enable matrix there as
# version "default" and fails the day a release changes how an op is reached.
#
# No pins on purpose: every run resolves again (`pip install -U`), so CI tests what users install
# that day. The resolved versions are written to .venvs/tf-default/.fastpath-stack for the log.
#
# Disk: torch's CUDA build with its nvidia-* libraries takes about 6 GB in the venv (5.8 GB on
# 2026-12-05: torch 2.14.1). A machine with less free space than NEED_MB gets no venv and a reason
# in .venvs/tf-default.unbuilt instead (the tests that use it skip, quoting it); so does a machine
# whose disk fills during the install. Any other failure of the install fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DIR=${FASTPATH_VENVS:-.venvs}/tf-default
NEED_MB=${FASTPATH_DEFAULT_STACK_MB:-8000}
UNBUILT="$DIR.unbuilt"
mkdir -p "$(dirname "$DIR")"
rm -f "$UNBUILT"

unbuilt() {  # why: no venv, the reason kept for the tests' skip messages
  rm -rf "$DIR"
  echo "$1" > "$UNBUILT"
  echo "   $DIR: NOT BUILT: $1"
  exit 0
}

free_mb=$(df -Pm "$(dirname "$DIR")" | awk 'NR == 2 {print $4}')
if [ -n "$free_mb" ] && [ "$free_mb" -lt "$NEED_MB" ]; then
  unbuilt "$free_mb MB free on the disk of $(dirname "$DIR"), the default stack needs about $NEED_MB MB (torch's CUDA build)"
fi
[ -x "$DIR/bin/python" ] || "$PY" -m venv "$DIR"
# --no-cache-dir: the wheels (about 3 GB) would otherwise stay in pip's cache beside the venv.
# pip's output is kept in memory, not in a file: on a full disk a log file could not be written.
if ! out=$("$DIR/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir -U ".[kernels]" \
    fla-core einops 2>&1); then
  if printf '%s\n' "$out" | grep -q "No space left on device"; then
    unbuilt "the disk of $(dirname "$DIR") filled during the install (it had $free_mb MB free)"
  fi
  printf '%s\n' "$out" | grep -v "WARNING: Location" | tail -20 >&2
  exit 1
fi
"$DIR/bin/python" - > "$DIR/.fastpath-stack" <<'PYEOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("transformers", "kernels", "torch", "triton", "fla-core")))
PYEOF
echo "   $DIR: $(cat "$DIR/.fastpath-stack")"
