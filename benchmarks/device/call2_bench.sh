#!/usr/bin/env bash
# Device call 2 of 2 (lent H200): every timing, side by side in one run.
#   bash benchmarks/device/call2_bench.sh "$OUT"      (right after call 1, on the warm machine)
# Writes OUT/{log.txt, kernels.json, kernels.png, bench/bench.json, bench/bench.md, bench/bench.png}.
set -uo pipefail
out=${1:?usage: call2_bench.sh OUTDIR}
root=$PWD
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 COLUMNS=120
date -u
[ -d .dev/site/fla ] || python3 -m pip install -q --no-deps --target .dev/site .carry/fla_core-0.6.0-py3-none-any.whl
if [ ! -d .dev/dao/causal_conv1d ]; then
  echo "machine went cold: rebuilding Dao"; bash benchmarks/device/build_dao.sh .carry/causal_conv1d-1.7.0.tar.gz .dev/dao
fi
export PYTHONPATH="$root/src:$root/.dev/site:$root/.dev/dao"
echo "== causal_conv1d kernels: copy, torch, FLA, Dao CUDA, fastpath"
timeout 200 python3 benchmarks/causal_conv1d.py --out "$out/kernels.json" --host-costs
python3 benchmarks/plot_causal_conv1d.py "$out/kernels.json" --out "$out/kernels.png" || true
echo "== model bench: qwen3.5-27b, 8 layers, bf16, B=1, L=4096"
mkdir -p "$out/bench"
timeout 330 python3 -m fastpath bench qwen3.5-27b --layers 8 --dtype bf16 --seq-len 4096 --batch 1 \
  --decode-tokens 64 --repeats 5 --warmup 2 --configs reference,fastpath,fla,fla+dao --out "$out/bench"
echo "bench exit: $?"
date -u
