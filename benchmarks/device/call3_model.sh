#!/usr/bin/env bash
# Device call 3 of 3 (lent H200): the kernel benchmark (Dao included), the GPU-only FLA-route
# tests, then the model benchmark with every config in one run (Dao included).
#   bash benchmarks/device/call3_model.sh "$OUT"      (carry .carry, with .carry/dao/ from call 1)
# Writes OUT/{log.txt, kernels.json, bench/bench.json, bench/bench.md, bench/bench.png}.
set -uo pipefail
out=${1:?usage: call3_model.sh OUTDIR}
source benchmarks/device/peers_env.sh
echo "== causal_conv1d kernels: copy, torch, FLA, Dao CUDA, fastpath"
PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout 200 python3 benchmarks/conv_kernels.py --out "$out/kernels.json" --host-costs
echo "kernel bench exit: $? at $(( $(date +%s) - t0 )) s"
echo "== FLA-route GPU tests"
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -k "transformers_torch_path or with_route_gpu" tests/test_fla_dqkwg.py
echo "pytest exit: $? at $(( $(date +%s) - t0 )) s"
left=$(( 575 - ($(date +%s) - t0) ))
echo "== model bench: qwen3.5-27b, 8 layers, bf16, B=1, L=4096, ${left}s left"
mkdir -p "$out/bench"
PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout "$left" python3 -m fastpath bench qwen3.5-27b --layers 8 \
  --dtype bf16 --seq-len 4096 --batch 1 --decode-tokens 64 --repeats 5 --warmup 2 \
  --configs reference,fastpath,fla,fla+dao --out "$out/bench"
echo "bench exit: $? at $(( $(date +%s) - t0 )) s"
date -u
