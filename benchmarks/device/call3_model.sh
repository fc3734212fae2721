#!/usr/bin/env bash
# Device call 3 of 3 (lent H200): the model benchmark, every config in one run (Dao included),
# then verify with whatever time is left.
#   bash benchmarks/device/call3_model.sh "$OUT"      (carry .carry, with .carry/dao/ from call 1)
# Writes OUT/{log.txt, bench/bench.json, bench/bench.md, bench/bench.png, verify.json}.
set -uo pipefail
out=${1:?usage: call3_model.sh OUTDIR}
root=$PWD
t0=$(date +%s)
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 COLUMNS=120
date -u
[ -d .dev/site/fla ] || python3 -m pip install -q --no-deps --target .dev/site .carry/fla_core-0.6.0-py3-none-any.whl
[ -d .dev/dao/causal_conv1d ] || bash benchmarks/device/install_dao.sh .carry/dao .dev/dao
export PYTHONPATH="$root/src:$root/.dev/site"
echo "== model bench: qwen3.5-27b, 8 layers, bf16, B=1, L=4096"
mkdir -p "$out/bench"
PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout 420 python3 -m fastpath bench qwen3.5-27b --layers 8 \
  --dtype bf16 --seq-len 4096 --batch 1 --decode-tokens 64 --repeats 5 --warmup 2 \
  --configs reference,fastpath,fla,fla+dao --out "$out/bench"
echo "bench exit: $? at $(( $(date +%s) - t0 )) s"
left=$(( 580 - ($(date +%s) - t0) ))
if [ "$left" -gt 60 ]; then
  echo "== verify qwen3.5-27b (8 layers, bf16, fwd+bwd, decode), ${left}s left"
  timeout "$left" python3 -m fastpath verify qwen3.5-27b --layers 8 --dtype bf16 --seq-len 1024 \
    --batch 2 --backward --decode-tokens 16 --save "$out/verify.json"
  echo "verify exit: $?"
fi
date -u
