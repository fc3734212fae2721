#!/usr/bin/env bash
# The optional dependencies of `fastpath capture` (safetensors, datasets, pyarrow: the speculators
# offline layout), so tests/capture/test_capture*.py run their layout checks instead of skipping
# them.
# Named one by one, not as ".[capture]": that extra includes [kernels], whose fla-core must stay out
# of the system python (transformers binds FLA at import wherever it imports; see setup_fla.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
deps=$("$PY" - <<'PYEOF'
import re, tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["capture"]
print(" ".join(d for d in extra if not re.match(r"fastpath-kit\b", d)))
PYEOF
)
# shellcheck disable=SC2086  # a word list of requirement specifiers without spaces
"$PY" -m pip install -q --disable-pip-version-check $deps
