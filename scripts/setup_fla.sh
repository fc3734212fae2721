#!/usr/bin/env bash
# fla-core for tests/kernels/gated_delta_rule/test_fla_dqkwg.py (and the other fla tests),
# installed into its own directory (.venvs/fla), NOT into the
# system python: transformers 5.17 routes chunk_gated_delta_rule to fla whenever `import fla`
# works, which would change what other tests exercise. The tests put the directory on sys.path
# of a subprocess only.
#
# Only fla-core: it carries fla.ops / fla.modules / fla.backends (all we and transformers import).
# flash-linear-attention 0.6.0 is not a bare meta-package (it adds fla/layers and fla/models on
# top of fla-core), but nothing here needs those. fla-core's one hard requirement is einops;
# torch/triton come from the system python. Idempotent: a matching stamp skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${FASTPATH_FLA_PATH:-.venvs/fla}
PKGS=("fla-core==0.6.0" "einops")
stamp="${PKGS[*]}"
if [ -f "$DEST/fla/__init__.py" ] && [ "$(cat "$DEST/.fastpath-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "   $DEST: ready"
  exit 0
fi
rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$DEST" "${PKGS[@]}"
echo "$stamp" > "$DEST/.fastpath-stamp"
echo "   $DEST: installed ${PKGS[*]}"
