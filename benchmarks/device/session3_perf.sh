#!/usr/bin/env bash
# Session 3 performance run on the lent H200 (torch 2.11+cu130, Triton 3.6.0, transformers 5.17.0;
# fla-core carried as .carry/fla_core-0.6.0-py3-none-any.whl; Dao's causal-conv1d only if a wheel
# from build_dao.sh is carried in .carry/dao/ - every part runs without it).
#
#   bash benchmarks/device/session3_perf.sh "$OUT" [PARTS]      (from the repo root; carry .carry)
#
# PARTS: comma list of tests,conv,sweep,selfcheck,model,decode,profile, or "kernels" (=
# tests,conv,sweep,selfcheck: ~3.5 min) or "model" (= model,decode,profile: ~4 min); default all
# (~8 min, under the 10-minute command limit: a part is skipped, with a log line, when less than
# its timeout is left of BUDGET seconds, default 570). Writes into OUT:
#   log.txt                 everything printed
#   tests.txt               GPU kernel tests (conv, launcher, decode graphs, FLA route gpu tests)
#   kernels.json            conv fwd / fwd+bwd / update at (1,4096) (8,4096) (1,65536): fastpath,
#                           torch, torch.compile, FLA, Dao if present; copy bandwidth; targets block
#   fla_640/fla_640_sweep.json   #640 reproduction sweep (time-boxed)
#   fla_dqkwg.json          FLA chunk rule fwd+bwd per dqkwg route mode + the self-check verdict
#                           for the Qwen3.5 configuration, accuracy vs float64
#   bench/bench.json        fastpath bench, 8-layer Qwen3.5-27B preset, bf16, B=1, L=4096:
#                           reference (torch fallback), fla (FLA alone), fastpath [, fla+dao]
#   decode/decode_graphs.json    greedy decode eager vs CUDA-graph replay per config
#   gdn/gdn_layer_profile.json   one GDN layer fwd+bwd, top CUDA kernels per route
set -uo pipefail
out=${1:?usage: session3_perf.sh OUTDIR [PARTS]}
parts=${2:-all}
budget=${BUDGET:-570}
case "$parts" in
  all) parts=tests,conv,sweep,selfcheck,model,decode,profile ;;
  kernels) parts=tests,conv,sweep,selfcheck ;;
  model) parts=model,decode,profile ;;
esac
mkdir -p "$out"
source benchmarks/device/peers_env.sh   # sets root, t0, logging, PYTHONPATH (fastpath + FLA)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
dao_path=""
if python3 -c "import sys, torch; sys.path.insert(0, '$root/.dev/dao'); import causal_conv1d_cuda" 2>/dev/null; then
  dao_path=":$root/.dev/dao"; echo "Dao causal-conv1d: present (peer rows included)"
else
  echo "Dao causal-conv1d: not present (its rows are skipped)"
fi
has() { [[ ",$parts," == *",$1,"* ]]; }
left() { echo $(( budget - ($(date +%s) - t0) )); }
# run PART TIMEOUT CMD...: run when the part is selected and its timeout fits what is left.
run() {
  local part=$1 limit=$2; shift 2
  has "$part" || return 0
  if [ "$(left)" -lt "$limit" ]; then echo "== $part SKIPPED: $(left) s left < its $limit s"; return 0; fi
  echo "== $part (timeout $limit s) at $(( $(date +%s) - t0 )) s"
  timeout "$limit" "$@"
  echo "== $part exit $? at $(( $(date +%s) - t0 )) s"
}

run tests 150 bash -c "python3 -m pytest -q -x -p no:cacheprovider --tb=short tests/test_causal_conv1d.py \
  tests/test_launch.py tests/test_decode_graphs.py 2>&1 | tee '$out/tests.txt'; \
  python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/test_fla_dqkwg.py 2>&1 | tee -a '$out/tests.txt'"
run conv 110 env PYTHONPATH="$PYTHONPATH$dao_path" python3 benchmarks/conv_kernels.py --compile --out "$out/kernels.json"
run selfcheck 75 python3 benchmarks/fla_dqkwg_gpu.py --out "$out/fla_dqkwg.json"
run sweep 70 python3 benchmarks/fla_640_sweep.py --budget-s 40 --out "$out/fla_640"
configs=reference,fla,fastpath
[ -n "$dao_path" ] && configs=$configs,fla+dao
run model 170 env PYTHONPATH="$PYTHONPATH$dao_path" python3 -m fastpath bench qwen3.5-27b --layers 8 \
  --dtype bf16 --seq-len 4096 --batch 1 --decode-tokens 32 --repeats 3 --warmup 1 \
  --configs "$configs" --out "$out/bench"
run decode 120 python3 benchmarks/decode_graphs_gpu.py --layers 8 --prompt 256 --tokens 32 \
  --configs reference,fla,fastpath --out "$out/decode"
run profile 75 python3 benchmarks/gdn_layer_profile.py --iters 5 --out "$out/gdn"
echo "== done at $(( $(date +%s) - t0 )) s"
date -u
