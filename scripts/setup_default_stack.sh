#!/usr/bin/env bash
# The stack a new user gets today: a plain venv (no system site-packages) with exactly what
# `pip install ".[kernels]"` resolves from the package index on the day (newest transformers,
# the `kernels` it requires, torch and the Triton torch pins), plus fla-core, the package the
# GatedDeltaNet route needs. tests/routing/test_enable_matrix.py runs the whole enable matrix there as
# version "default" and fails the day a release changes how an op is reached.
#
# No pins on purpose: every run resolves again (`pip install -U`), so CI tests what users install
# that day. The resolved versions are written to .venvs/tf-default/.fastpath-stack for the log.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DIR=${FASTPATH_VENVS:-.venvs}/tf-default
[ -x "$DIR/bin/python" ] || "$PY" -m venv "$DIR"
"$DIR/bin/python" -m pip install -q --disable-pip-version-check -U ".[kernels]" fla-core einops
"$DIR/bin/python" - > "$DIR/.fastpath-stack" <<'PYEOF'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("transformers", "kernels", "torch", "triton", "fla-core")))
PYEOF
echo "   $DIR: $(cat "$DIR/.fastpath-stack")"
