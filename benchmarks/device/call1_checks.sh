#!/usr/bin/env bash
# Device call 1 of 3 (lent H200): GPU tests at real shapes while Dao's CUDA peer builds, then the
# kernel benchmark with every peer in one process.
#   bash benchmarks/device/call1_checks.sh "$OUT"      (from the repo root; carry .carry)
# Writes OUT/{log.txt, dao_build.txt, fla_dqkwg.json, doctor.json, kernels.json} and OUT/dao/ (the
# built Dao wheel in parts: copy them to .carry/dao/ for calls 2 and 3).
set -uo pipefail
out=${1:?usage: call1_checks.sh OUTDIR}
root=$PWD
t0=$(date +%s)
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 COLUMNS=120
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -m pip install -q --no-deps --target .dev/site .carry/fla_core-0.6.0-py3-none-any.whl
dao=""
if [ ! -d .dev/dao/causal_conv1d ]; then
  bash benchmarks/device/build_dao.sh .carry/causal_conv1d-1.7.0.tar.gz .dev/dao "$out/dao" >"$out/dao_build.txt" 2>&1 &
  dao=$!
fi
export PYTHONPATH="$root/src:$root/.dev/site"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
echo "== kernel + FLA-route tests at GPU shapes"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_causal_conv1d.py tests/test_fla_dqkwg.py
echo "pytest exit: $? at $(( $(date +%s) - t0 )) s"
echo "== FLA #640 dqkwg route check"
timeout 90 python3 benchmarks/fla_dqkwg_gpu.py --out "$out/fla_dqkwg.json"
echo "fla check exit: $? at $(( $(date +%s) - t0 )) s"
if [ -n "$dao" ]; then echo "== waiting for the Dao build"; wait "$dao"; echo "dao build exit: $?"; tail -4 "$out/dao_build.txt"; fi
echo "== doctor on the GPU host (Dao's wheel + fla on the path)"
PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout 60 python3 -m fastpath doctor --json --model qwen3.5-27b >"$out/doctor.json"
echo "doctor exit: $?"
left=$(( 585 - ($(date +%s) - t0) ))
echo "== causal_conv1d kernels (copy, torch, FLA, Dao CUDA, fastpath), ${left}s left"
if [ "$left" -gt 60 ]; then
  PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout "$left" python3 benchmarks/conv_kernels.py --out "$out/kernels.json" --host-costs
  echo "kernel bench exit: $?"
fi
date -u
