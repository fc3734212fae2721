#!/usr/bin/env bash
# Session 3, device call 4 (lent H200): what call 3's time limit cut off.
#   bash benchmarks/device/session3_call4.sh "$OUT"     (carry .carry, with .carry/whl: datasets,
#                                                        dill, multiprocess wheels for capture)
# 1. fastpath bench, 8-layer Qwen3.5-27B preset, bf16, B=1, L=4096, prefill + forward+backward:
#    reference (torch fallback), FLA + Dao CUDA, fastpath.enable() (FLA dqkwg self-checked);
# 2. fastpath capture throughput, fast path vs fallback, verification on.
set -uo pipefail
out=${1:?usage: session3_call4.sh OUTDIR}
source benchmarks/device/peers_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target .dev/site .carry/whl/*.whl
step() {  # step NAME MAX_SECONDS CMD...
  local name=$1 max=$2; shift 2
  local left=$(( 290 - ($(date +%s) - t0) ))
  [ "$left" -lt "$max" ] && max=$left
  if [ "$max" -lt 30 ]; then echo "== $name SKIPPED ($left s left)"; return; fi
  echo "== $name (timeout $max s) at $(( $(date +%s) - t0 )) s"
  timeout "$max" "$@"; echo "== $name exit $? at $(( $(date +%s) - t0 )) s"
}
step bench 160 env PYTHONPATH="$PYTHONPATH:$root/.dev/dao" COLUMNS=120 python3 -m fastpath bench \
  qwen3.5-27b --layers 8 --dtype bf16 --seq-len 4096 --batch 1 --repeats 3 --warmup 1 \
  --phases prefill,train --configs reference,fla+dao,fastpath --out "$out/bench"
step capture 120 python3 benchmarks/capture_speed.py --out "$out/capture" --rows 16
date -u
