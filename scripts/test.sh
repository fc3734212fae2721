#!/usr/bin/env bash
# Install everything the test suite needs on a fresh CPU machine, then run it.
# Used by the README's quick start and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Nothing here installs twice on a fresh machine: pip's cache would only double the disk it takes.
export PIP_NO_CACHE_DIR=1
# The free disk first: the extra venvs below are left unbuilt (their tests skip, saying why) on a full one.
df -Pm . | awk 'NR == 2 {print "== disk: " $4 " MB free"}'

# torch CPU wheel (local disk on the dev/CI machines), Triton (its interpreter runs the kernels on CPU).
"$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0" "triton==3.9.0"
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"
# The in-process integration tests run against this transformers; others get their own venvs.
"$PY" -m pip install -q --disable-pip-version-check "transformers==5.17.0"
# Extra environments the tests use (an sshd, transformers versions side by side, ...). The largest,
# today's default stack (about 6 GB), goes last: on a short disk it is the one left unbuilt (its
# script says why in .venvs/tf-default.unbuilt, and the tests that use it skip quoting that).
for setup in $(ls scripts/setup_*.sh | grep -v setup_default_stack.sh) scripts/setup_default_stack.sh; do
  [ -e "$setup" ] || continue
  echo "== $setup"
  PYTHON="$PY" bash "$setup"
done
for unbuilt in "${FASTPATH_VENVS:-.venvs}"/*.unbuilt; do
  if [ -e "$unbuilt" ]; then echo "== NOT BUILT: ${unbuilt%.unbuilt}: $(cat "$unbuilt")"; fi
done

export TRITON_INTERPRET=1
"$PY" -m ruff check --no-cache src tests benchmarks
# Two workers, one test file each at a time (a file's module fixtures, such as the fleet's sshd
# run, are built once); FASTPATH_TEST_WORKERS=0 runs everything in this process. Files go out in
# collection order (tests/conftest.py puts the heavy ones first), not in xdist's default order
# (most tests first), which left the long-running files of few tests to the end.
WORKERS=${FASTPATH_TEST_WORKERS:-2}
if [ "$WORKERS" = 0 ]; then
  "$PY" -m pytest -q "$@"
else
  "$PY" -m pytest -q -n "$WORKERS" --dist loadfile --no-loadscope-reorder "$@"
fi
