#!/usr/bin/env bash
# Build Dao-AILab causal-conv1d (the compiled peer) from its PyPI sdist on the device, sm_90 only,
# in place under .build/ so it never touches the device's site-packages.
# Usage: bash benchmarks/device/build_dao.sh SDIST OUTDIR   -> OUTDIR holds causal_conv1d/ + causal_conv1d_cuda*.so
set -euo pipefail
sdist=$1; out=$2
mkdir -p "$out"
tmp=$(mktemp -d)
tar xzf "$sdist" -C "$tmp"
src=$(echo "$tmp"/causal_conv1d-*)
# Restrict the arch list to the H200's sm_90 (setup.py ignores TORCH_CUDA_ARCH_LIST): ~5 min on 16 cores.
python3 - "$src/setup.py" <<'PY'
import sys, pathlib
p = pathlib.Path(sys.argv[1]); s = p.read_text()
marker = "    if FORCE_CXX11_ABI:"
assert marker in s, "setup.py layout changed"
s = s.replace(marker, '    cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]\n' + marker, 1)
p.write_text(s)
PY
cd "$src"
start=$(date +%s)
CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-16} python3 setup.py build_ext --inplace
echo "dao build seconds: $(( $(date +%s) - start ))"
cp -r causal_conv1d causal_conv1d_cuda*.so "$out"/
