#!/usr/bin/env bash
# Issue 5 on the GPU: verify, then bench, Qwen3.5-27B dimensions cut to 8 layers (6 GatedDeltaNet
# + 2 attention), random weights, bf16. Run from the repo root on the device:
#   bash benchmarks/device/verify_bench_qwen35.sh "$OUT" [SEQ_LEN]
# Writes OUT/verify.json, OUT/verify.txt, OUT/bench/{bench.json,bench.md,bench.png}; exit status is
# verify's (0 pass, 1 mismatch), so a failing verify is never hidden behind a good bench.
# Dao causal-conv1d / fla are used by the bench's peer configs only if importable (PYTHONPATH).
set -uo pipefail
out=${1:?usage: verify_bench_qwen35.sh OUTDIR [SEQ_LEN]}
seq=${2:-4096}
mkdir -p "$out/bench"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1
export COLUMNS=120
python3 -m fastpath verify qwen3.5-27b --layers 8 --dtype bf16 --seq-len 1024 --batch 2 --backward \
  --decode-tokens 16 --save "$out/verify.json" 2>"$out/verify.stderr.txt" | tee "$out/verify.txt"
verify_rc=${PIPESTATUS[0]}
echo "verify exit status: $verify_rc"
python3 -m fastpath bench qwen3.5-27b --layers 8 --dtype bf16 --seq-len "$seq" --batch 1 \
  --decode-tokens 64 --repeats 5 --warmup 2 --out "$out/bench" 2>"$out/bench/bench.stderr.txt"
echo "bench exit status: $?"
tail -n 3 "$out/bench/bench.stderr.txt"
exit "$verify_rc"
