#!/usr/bin/env bash
# Install the Dao wheel that build_dao.sh split into parts (carried in DIR) into TARGET_DIR.
# Usage: bash benchmarks/device/install_dao.sh DIR TARGET_DIR ; exits 1 when DIR holds no wheel.
set -euo pipefail
dir=$1; target=$2
first=$(ls "$dir"/causal_conv1d-*.whl.part-00 2>/dev/null | head -1) || true
[ -n "$first" ] || { echo "no Dao wheel parts in $dir"; exit 1; }
whl=$(basename "${first%.part-00}")
tmp=$(mktemp -d)
cat "$dir/$whl".part-* > "$tmp/$whl"
sha256sum "$tmp/$whl"
python3 -m pip install -q --no-deps --target "$target" "$tmp/$whl"
ls "$target"
