#!/usr/bin/env bash
# Session 3, device call 3 (lent H200): whole models side by side.
#   bash benchmarks/device/session3_call3.sh "$OUT"     (carry .carry)
# 1. fastpath bench, 8-layer Qwen3.5-27B preset, bf16, B=1, L=4096: reference (torch fallback),
#    FLA alone, FLA + Dao CUDA, fastpath.enable(): prefill, forward+backward, eager decode;
# 2. greedy decode with CUDA graphs (StaticCache) per configuration;
# 3. the 6-layer Nemotron-H-8B-shaped model: fallback, mamba_ssm SSD (+ torch or fastpath conv),
#    fastpath; decode update at B=64;
# 4. fastpath capture throughput, fast path vs fallback, verification on.
# Each step gets at most what is left of a 560 s budget; results are packed into OUT/call3.tgz.
set -uo pipefail
out=${1:?usage: session3_call3.sh OUTDIR}
w="$out/w"; mkdir -p "$w"
source benchmarks/device/peers_env.sh   # root, t0, logging to $out/log.txt, fastpath + FLA on the path
exec > >(tee -a "$w/log.txt") 2>&1
mkdir -p .dev/mamba && tar xzf .carry/mamba_ssm-2.3.2.post1.tar.gz -C .dev/mamba
msrc=$(echo "$root"/.dev/mamba/mamba_ssm-*)
dao=":$root/.dev/dao"
python3 -c "import sys, torch; sys.path.insert(0, '$root/.dev/dao'); import causal_conv1d_cuda; print('Dao present')" || dao=""
step() {  # step NAME MAX_SECONDS CMD...
  local name=$1 max=$2; shift 2
  local left=$(( 560 - ($(date +%s) - t0) ))
  [ "$left" -lt "$max" ] && max=$left
  if [ "$max" -lt 30 ]; then echo "== $name SKIPPED ($left s left)"; return; fi
  echo "== $name (timeout $max s) at $(( $(date +%s) - t0 )) s"
  timeout "$max" "$@"; echo "== $name exit $? at $(( $(date +%s) - t0 )) s"
}
configs=reference,fla,fastpath; [ -n "$dao" ] && configs=reference,fla,fla+dao,fastpath
step bench 175 env PYTHONPATH="$PYTHONPATH$dao" COLUMNS=120 python3 -m fastpath bench qwen3.5-27b \
  --layers 8 --dtype bf16 --seq-len 4096 --batch 1 --decode-tokens 32 --repeats 3 --warmup 1 \
  --configs "$configs" --out "$w/bench"
step decode 110 python3 benchmarks/decode_graphs_gpu.py --layers 8 --prompt 256 --tokens 32 \
  --configs reference,fla,fastpath --out "$w/decode"
step mamba 150 python3 benchmarks/mamba_model.py --out "$w/mamba" --mamba-src "$msrc"
step capture 130 python3 benchmarks/capture_speed.py --out "$w/capture" --rows 24
date -u
tar czf "$out/call3.tgz" -C "$out" w && rm -rf "$w"
