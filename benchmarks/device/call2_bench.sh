#!/usr/bin/env bash
# Device call 2 of 3 (lent H200): the kernel benchmark with every peer in one process, then the
# FLA #640 route tests and check (call 1 runs them while Dao builds, where they can time out).
#   bash benchmarks/device/call2_bench.sh "$OUT"      (carry .carry, with .carry/dao/ from call 1)
# Writes OUT/{log.txt, kernels.json, fla_dqkwg.json}.
set -uo pipefail
out=${1:?usage: call2_bench.sh OUTDIR}
source benchmarks/device/peers_env.sh
echo "== causal_conv1d kernels: copy, torch, FLA, Dao CUDA, fastpath"
PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout 240 python3 benchmarks/conv_kernels.py --out "$out/kernels.json" --host-costs
echo "kernel bench exit: $?"
echo "== FLA-route tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_fla_dqkwg.py
echo "pytest exit: $?"
echo "== FLA #640 dqkwg route check"
timeout 120 python3 benchmarks/fla_dqkwg_gpu.py --out "$out/fla_dqkwg.json"
echo "fla check exit: $?"
date -u
