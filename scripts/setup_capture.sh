#!/usr/bin/env bash
# The optional dependencies of `fastpath capture` (safetensors, datasets, pyarrow: the speculators
# offline layout), so tests/test_capture*.py run their layout checks instead of skipping them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check -e ".[capture]"
