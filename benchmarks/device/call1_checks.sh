#!/usr/bin/env bash
# Device call 1 of 2 (lent H200): correctness at real shapes while the Dao peer builds.
#   bash benchmarks/device/call1_checks.sh "$OUT"      (from the repo root; carry .carry)
# Writes OUT/{log.txt, dao_build.txt, fla_dqkwg.json, verify.json, verify_packed.json, doctor.json}.
# Leaves .dev/site (fla-core) and .dev/dao (Dao causal-conv1d built for sm_90) for call 2.
set -uo pipefail
out=${1:?usage: call1_checks.sh OUTDIR}
root=$PWD
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 COLUMNS=120
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -m pip install -q --no-deps --target .dev/site .carry/fla_core-0.6.0-py3-none-any.whl
dao=""
if [ ! -d .dev/dao/causal_conv1d ]; then
  bash benchmarks/device/build_dao.sh .carry/causal_conv1d-1.7.0.tar.gz .dev/dao >"$out/dao_build.txt" 2>&1 &
  dao=$!
fi
export PYTHONPATH="$root/src:$root/.dev/site"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
echo "== kernel + FLA-route tests at GPU shapes"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_causal_conv1d.py tests/test_fla_dqkwg.py
echo "== FLA #640 dqkwg route check"
timeout 120 python3 benchmarks/fla_dqkwg_gpu.py --out "$out/fla_dqkwg.json"
echo "== verify qwen3.5-27b (8 layers, bf16, fwd+bwd, decode)"
timeout 150 python3 -m fastpath verify qwen3.5-27b --layers 8 --dtype bf16 --seq-len 1024 --batch 2 \
  --backward --decode-tokens 16 --save "$out/verify.json"
echo "verify exit: $?"
echo "== verify qwen3.5-27b packed sequences"
timeout 90 python3 -m fastpath verify qwen3.5-27b --layers 8 --dtype bf16 --seq-len 1024 --batch 2 \
  --packed --decode-tokens 0 --save "$out/verify_packed.json"
echo "verify --packed exit: $?"
if [ -n "$dao" ]; then echo "== waiting for the Dao build"; wait "$dao"; echo "dao build exit: $?"; tail -3 "$out/dao_build.txt"; fi
echo "== doctor on the GPU host (Dao's wheel + fla on the path)"
PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout 60 python3 -m fastpath doctor --json --model qwen3.5-27b >"$out/doctor.json"
echo "doctor exit: $?"
date -u
