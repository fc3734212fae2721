#!/usr/bin/env bash
# Build Dao-AILab causal-conv1d (the compiled peer) from its PyPI sdist on the device, sm_90 only,
# as a wheel installed into a --target folder, so it never touches the device's site-packages and
# the doctor sees real dist-info + a real compiled .so there.
# Usage: bash benchmarks/device/build_dao.sh SDIST TARGET_DIR [WHEEL_OUT_DIR]
# SDIST (put it in .carry/, git-ignored): https://files.pythonhosted.org/packages/f4/d1/
#   eba27735f31bd5527d39a3c7f693e6ded7b844cab275db719a15ad37b6cd/causal_conv1d-1.7.0.tar.gz
# WHEEL_OUT_DIR gets the wheel in 15 MiB parts (the device tool returns files of <= 16 MiB), so a
# later call can carry it back instead of building again (the machine goes cold 30 s after a call).
set -euo pipefail
sdist=$1; target=$2; wheel_out=${3:-}
tmp=$(mktemp -d)
tar xzf "$sdist" -C "$tmp"
src=$(echo "$tmp"/causal_conv1d-*)
# Restrict the arch list to the H200's sm_90 (setup.py ignores TORCH_CUDA_ARCH_LIST): ~7 min on 16 cores.
python3 - "$src/setup.py" <<'PY'
import sys, pathlib
p = pathlib.Path(sys.argv[1]); s = p.read_text()
marker = "    if FORCE_CXX11_ABI:"
assert marker in s, "setup.py layout changed"
s = s.replace(marker, '    cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]\n' + marker, 1)
p.write_text(s)
PY
start=$(date +%s)
CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-16} \
  python3 -m pip wheel -q --no-build-isolation --no-deps -w "$tmp/wheels" "$src"
echo "dao build seconds: $(( $(date +%s) - start ))"
python3 -m pip install -q --no-deps --target "$target" "$tmp"/wheels/causal_conv1d-*.whl
ls -la "$tmp"/wheels "$target"
if [ -n "$wheel_out" ]; then
  mkdir -p "$wheel_out"
  whl=$(basename "$tmp"/wheels/causal_conv1d-*.whl)
  (cd "$tmp/wheels" && sha256sum "$whl" && split -b 15M -d "$whl" "$wheel_out/$whl.part-")
  ls -la "$wheel_out"
fi
