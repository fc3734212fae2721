#!/usr/bin/env bash
# Install everything the test suite needs on a fresh CPU machine, then run it.
# Used by the README's quick start and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch CPU wheel (local disk on the dev/CI machines), Triton (its interpreter runs the kernels on CPU).
"$PY" -m pip install -q "torch==2.13.0" "triton" 
"$PY" -m pip install -q -e ".[test]"
# transformers versions side by side, sharing this torch (see scripts/transformers_matrix.sh).
if [ -x scripts/transformers_matrix.sh ]; then
  bash scripts/transformers_matrix.sh
fi

export TRITON_INTERPRET=1
"$PY" -m ruff check src tests benchmarks
"$PY" -m pytest -q "$@"
