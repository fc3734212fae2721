#!/usr/bin/env bash
# Device call 4 (lent H200): after a change to the decode-step launch (kernels/compiled_launch.py), the kernel
# tests at GPU shapes and the update + host-cost timings, peers included.
#   bash benchmarks/device/call4_launch.sh "$OUT"      (carry .carry, with .carry/dao/ from call 1)
# Writes OUT/{log.txt, kernels_quick.json}.
set -uo pipefail
out=${1:?usage: call4_launch.sh OUTDIR}
source benchmarks/device/peers_env.sh
echo "== kernel tests at GPU shapes"
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_causal_conv1d.py tests/test_launch.py
echo "pytest exit: $?"
echo "== update + host costs: torch, FLA, Dao CUDA, fastpath"
PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout 150 python3 benchmarks/conv_kernels.py --quick --out "$out/kernels_quick.json" --host-costs
echo "kernel bench exit: $?"
date -u
