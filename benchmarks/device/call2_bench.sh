#!/usr/bin/env bash
# Device call 2 of 3 (lent H200): the kernel benchmark (again, if call 1 ran short) and verify.
#   bash benchmarks/device/call2_bench.sh "$OUT" [--no-kernels]   (carry .carry, with .carry/dao/)
# Writes OUT/{log.txt, kernels.json, verify.json, verify_packed.json}.
set -uo pipefail
out=${1:?usage: call2_bench.sh OUTDIR}
root=$PWD
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 COLUMNS=120
date -u
[ -d .dev/site/fla ] || python3 -m pip install -q --no-deps --target .dev/site .carry/fla_core-0.6.0-py3-none-any.whl
[ -d .dev/dao/causal_conv1d ] || bash benchmarks/device/install_dao.sh .carry/dao .dev/dao
export PYTHONPATH="$root/src:$root/.dev/site"
if [ "${2:-}" != "--no-kernels" ]; then
  echo "== causal_conv1d kernels: copy, torch, FLA, Dao CUDA, fastpath"
  PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout 200 python3 benchmarks/causal_conv1d.py --out "$out/kernels.json" --host-costs
fi
echo "== verify qwen3.5-27b (8 layers, bf16, fwd+bwd, decode)"
timeout 150 python3 -m fastpath verify qwen3.5-27b --layers 8 --dtype bf16 --seq-len 1024 --batch 2 \
  --backward --decode-tokens 16 --save "$out/verify.json"
echo "verify exit: $?"
echo "== verify qwen3.5-27b packed sequences"
timeout 90 python3 -m fastpath verify qwen3.5-27b --layers 8 --dtype bf16 --seq-len 1024 --batch 2 \
  --packed --decode-tokens 0 --save "$out/verify_packed.json"
echo "verify --packed exit: $?"
date -u
