#!/usr/bin/env bash
# Install everything the test suite needs on a fresh CPU machine, then run it.
# Used by the README's quick start and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch CPU wheel (local disk on the dev/CI machines), Triton (its interpreter runs the kernels on CPU).
"$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0" "triton==3.9.0"
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"
# The in-process integration tests run against this transformers; others get their own venvs.
"$PY" -m pip install -q --disable-pip-version-check "transformers==5.17.0"
# Extra environments the tests use (an sshd, transformers versions side by side, ...).
for setup in scripts/setup_*.sh; do
  [ -e "$setup" ] || continue
  echo "== $setup"
  PYTHON="$PY" bash "$setup"
done

export TRITON_INTERPRET=1
"$PY" -m ruff check --no-cache src tests benchmarks
# Two workers, one test file each at a time (a file's module fixtures, such as the fleet's sshd
# run, are built once); FASTPATH_TEST_WORKERS=0 runs everything in this process.
WORKERS=${FASTPATH_TEST_WORKERS:-2}
if [ "$WORKERS" = 0 ]; then
  "$PY" -m pytest -q "$@"
else
  "$PY" -m pytest -q -n "$WORKERS" --dist loadfile "$@"
fi
