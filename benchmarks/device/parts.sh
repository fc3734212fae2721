#!/usr/bin/env bash
# Device calls on the lent H200 (sessions 4-5) (torch 2.11+cu130, Triton 3.6.0, transformers 5.17.0).
#
#   bash benchmarks/device/parts.sh "$OUT" PARTS        (from the repo root; carry .carry)
#
# .carry holds fla_core-0.6.0-py3-none-any.whl, causal_conv1d-1.7.0.tar.gz, mamba_ssm-2.3.2.post1
# .tar.gz, whl/ (datasets, dill, multiprocess for capture) and, after the first call, dao/ (the
# Dao causal-conv1d wheel in parts, built by the `dao` part: ~5 min on the device's CPUs).
# PARTS (comma list, run in the order given; a step is skipped, with a log line, when less than
# its timeout is left of BUDGET seconds, default 560):
#   dao        build Dao's causal-conv1d in the background (wheel parts come back in OUT/dao)
#   ssd        benchmarks/ssd.py --profile --update $SSD_FLAGS (scan vs mamba_ssm, per-kernel
#              split, decode step)
#   tests      GPU tests in the background: conv/launch/decode graphs | FLA route + verify/bench |
#              SSD (vs mamba_ssm); TESTS=conv,fla,ssd[,capture] picks groups. Correctness only: put timing
#              parts before `tests` or after `wait` (which collects them; the end does too)
#   verify     fastpath verify on the GPU: qwen3.5-27b 8 layers (the #14 gate), nemotron-h-8b,
#              granite-4.0-h-small, falcon-h1-7b, zamba2-7b, bamba-9b, mamba2 (bf16, --backward)
#   dqkwg      tests/test_verify_gpu.py -k bf16 under FASTPATH_FLA_DQKWG=auto, torch, fla
#   fla        FLA dqkwg self-check route accuracy/speed, then the #640 sweep
#   doctor     doctor vs collect_env, 5 runs each (after the Dao build: nothing else loads the CPU)
#   conv       benchmarks/conv_kernels.py with every peer (Dao if built)
#   model      fastpath bench qwen3.5-27b 8 layers B=1 L=4096: reference, fla, fastpath, fla+dao
#              (MODEL_CONFIGS picks others, e.g. fastpath,fastpath+compile)
#   decode     CUDA-graph greedy decode per config
#   mamba      benchmarks/mamba_model.py (Nemotron-H 6 layers: fallback, mamba_ssm+torch conv,
#              mamba_ssm+fastpath conv, fastpath)
#   capture    benchmarks/capture_speed.py (fast vs fallback, verification on)
#   gdnnorm    benchmarks/gdn_norm_gpu.py (GDN gated norm eager vs FLA fused), if present
#   profile    benchmarks/gdn_layer_profile.py (one Qwen3.5 GDN layer fwd+bwd under torch.profiler)
#   mprofile   benchmarks/model_profile.py (8-layer Qwen3.5: GPU time per kernel family, GEMM ceiling;
#              MPROFILE_CONFIGS, default fastpath,fla+dao,reference; fastpath+compile is one more)
# Everything lands in OUT/w, packed into OUT/results.tgz at the end; the log is OUT/log.txt.
set -uo pipefail
out=${1:?usage: parts.sh OUTDIR PARTS}
parts=${2:?usage: parts.sh OUTDIR PARTS}
budget=${BUDGET:-560}
w="$out/w"; mkdir -p "$w"
root=$PWD
t0=$(date +%s)
exec > >(tee -a "$w/log.txt") 2>&1
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 COLUMNS=120
# One Triton cache for every process of the call (later processes skip compiles and autotuning).
export TRITON_CACHE_DIR="$root/.dev/triton-cache" TRITON_CACHE_AUTOTUNING=1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
[ -d .dev/site/fla ] || python3 -m pip install -q --no-deps --target .dev/site .carry/fla_core-0.6.0-py3-none-any.whl
if [ -d .carry/whl ] && [ ! -d .dev/site/datasets ]; then
  python3 -m pip install -q --no-deps --no-compile --target .dev/site .carry/whl/*.whl
fi
mkdir -p .dev/mamba && [ -d .dev/mamba/mamba_ssm-2.3.2.post1 ] || tar xzf .carry/mamba_ssm-2.3.2.post1.tar.gz -C .dev/mamba
msrc="$root/.dev/mamba/mamba_ssm-2.3.2.post1"
export PYTHONPATH="$root/src:$root/.dev/site"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'

left() { echo $(( budget - ($(date +%s) - t0) )); }
at() { echo "$(( $(date +%s) - t0 )) s"; }
run() {  # run PART TIMEOUT CMD...
  local part=$1 limit=$2; shift 2
  if [ "$(left)" -lt "$limit" ]; then echo "== $part SKIPPED: $(left) s left < its $limit s"; return 0; fi
  echo "== $part (timeout $limit s) at $(at)"
  timeout "$limit" "$@"
  echo "== $part exit $? at $(at)"
}
dao_ok() { python3 -c "import sys, torch; sys.path.insert(0, '$root/.dev/dao'); import causal_conv1d_cuda" 2>/dev/null; }

dao_pid=""
dao_path=""
dao_ready() {  # wait for a background Dao build, then put Dao on the peers' path if it imports
  if [ -n "$dao_pid" ]; then
    echo "== waiting for the Dao build at $(at)"; wait "$dao_pid"; echo "dao build exit $? at $(at)"
    tail -4 "$w/dao_build.txt"; dao_pid=""
  fi
  if dao_ok; then dao_path=":$root/.dev/dao"; echo "Dao causal-conv1d: present"; else echo "Dao causal-conv1d: absent"; fi
}
if [ -d .carry/dao ] && [ ! -d .dev/dao/causal_conv1d ]; then
  bash benchmarks/device/install_dao.sh .carry/dao .dev/dao > "$w/dao_install.txt" 2>&1
fi

part_dao() {
  [ -d .dev/dao/causal_conv1d ] && return 0
  MAX_JOBS=12 bash benchmarks/device/build_dao.sh .carry/causal_conv1d-1.7.0.tar.gz .dev/dao \
    "$out/dao" > "$w/dao_build.txt" 2>&1 &
  dao_pid=$!
}
part_ssd() {
  run ssd 200 python3 benchmarks/ssd.py --out "$w/ssd" --mamba-src "$msrc" --profile --update ${SSD_FLAGS:-}
}
# GPU tests in the background (correctness only): TESTS=conv,fla,ssd[,capture] picks the groups; the
# `wait` part (or the end) collects them.
test_pids=""
pyt() { python3 -m pytest -q -p no:cacheprovider --tb=short --durations=8 "$@"; }
group() {  # group NAME PYTEST-ARGS...
  local name=$1; shift
  [[ ",${TESTS:-conv,fla,ssd}," == *",$name,"* ]] || return 0
  (timeout "${TEST_TIMEOUT:-330}" bash -c "$(declare -f pyt); pyt $*" > "$w/tests_$name.txt" 2>&1
   echo "exit $?" >> "$w/tests_$name.txt") &
  test_pids="$test_pids $!"
}
part_tests() {
  echo "== tests (${TESTS:-conv,fla,ssd}) in the background at $(at)"
  group conv tests/test_causal_conv1d.py tests/test_launch.py tests/test_decode_graphs.py
  group fla -v -m gpu tests/test_fla_dqkwg.py tests/test_gdn_norm.py tests/test_verify_gpu.py \
    tests/test_bench_gpu.py
  MAMBA_SRC="$msrc" group ssd -m gpu tests/test_ssd_gpu.py tests/test_ssd_update.py \
    tests/test_mamba_split_conv_scan.py
  group capture -m gpu tests/test_capture_writes.py  # pinned staging + side-stream copies (#15)
}
part_wait() {
  [ -n "$test_pids" ] || return 0
  echo "== waiting for the tests at $(at)"; wait $test_pids; test_pids=""
  for f in "$w"/tests_*.txt; do echo "-- $f"; tail -14 "$f"; done
}
part_verify() {
  mkdir -p "$w/verify"
  # VERIFY="model:layers ..." (default: the #14 gate and the Mamba2 family at real shapes)
  for spec in ${VERIFY:-qwen3.5-27b:8 nemotron-h-8b:4 granite-4.0-h-small:4 falcon-h1-7b:3 zamba2-7b:3 bamba-9b:3 mamba2-codestral-7b:3}; do
    m=${spec%%:*}; n=${spec##*:}
    run "verify-$m" 150 python3 -m fastpath verify "$m" --layers "$n" --dtype bf16 --seq-len 1024 \
      --batch 2 --backward --save "$w/verify/$m.json"
  done
}
part_dqkwg() {  # the tiny-Qwen3.5 GPU verify (bf16, backward) per FLA dqkwg route mode
  for mode in ${DQKWG_MODES:-auto torch fla}; do
    mkdir -p "$w/fpcache-$mode"
    run "dqkwg-$mode" 150 env FASTPATH_CACHE_DIR="$w/fpcache-$mode" FASTPATH_FLA_DQKWG="$mode" \
      python3 -m pytest -q -p no:cacheprovider --tb=line -m gpu tests/test_verify_gpu.py -k bf16
    find "$w/fpcache-$mode" -type f | head -3 | xargs -r cat | head -60
  done
}
part_fla() {
  run fla-selfcheck 150 python3 benchmarks/fla_dqkwg_gpu.py --out "$w/fla_dqkwg.json"
  run fla-sweep 100 python3 benchmarks/fla_640_sweep.py --budget-s 70 --out "$w/fla_640"
}
part_doctor() {
  dao_ready
  run doctor 150 python3 benchmarks/doctor_speed.py --out "$w/doctor" -n 5 --no-profile
}
part_conv() {
  dao_ready
  run conv 120 env PYTHONPATH="$PYTHONPATH$dao_path" python3 benchmarks/conv_kernels.py \
    --compile --host-costs --out "$w/kernels.json"
}
part_model() {
  dao_ready
  local configs=${MODEL_CONFIGS:-reference,fla,fastpath}
  [ -n "$dao_path" ] && [ -z "${MODEL_CONFIGS:-}" ] && configs=$configs,fla+dao
  run model 240 env PYTHONPATH="$PYTHONPATH$dao_path" python3 -m fastpath bench qwen3.5-27b --layers 8 \
    --dtype bf16 --seq-len 4096 --batch 1 --decode-tokens 32 --repeats 3 --warmup 1 \
    --configs "$configs" ${MODEL_FLAGS:-} --out "$w/bench"
}
part_decode() {
  run decode 150 python3 benchmarks/decode_graphs_gpu.py --layers 8 --prompt 256 --tokens 32 \
    --configs reference,fla,fastpath --out "$w/decode"
}
part_mamba() {
  dao_ready
  run mamba 200 env MAMBA_SRC="$msrc" PYTHONPATH="$PYTHONPATH$dao_path" python3 benchmarks/mamba_model.py \
    --mamba-src "$msrc" --out "$w/mamba"
}
part_capture() {
  run capture 200 python3 benchmarks/capture_speed.py --out "$w/capture" --rows "${CAPTURE_ROWS:-64}"
}
part_gdnnorm() {
  [ -f benchmarks/gdn_norm_gpu.py ] || { echo "== gdnnorm: no benchmarks/gdn_norm_gpu.py"; return 0; }
  run gdnnorm 90 python3 benchmarks/gdn_norm_gpu.py --out "$w/gdn_norm.json"
}

part_profile() {
  run profile 150 python3 benchmarks/gdn_layer_profile.py --out "$w/profile"
}
part_mprofile() {
  dao_ready
  run mprofile 240 env PYTHONPATH="$PYTHONPATH$dao_path" python3 benchmarks/model_profile.py \
    --out "$w/mprofile" --configs "${MPROFILE_CONFIGS:-fastpath,fla+dao,reference}"
}

IFS=, read -ra order <<< "$parts"
for part in "${order[@]}"; do
  if declare -F "part_$part" > /dev/null; then "part_$part"; else echo "== unknown part '$part'"; fi
done
part_wait
[ -n "$dao_pid" ] && dao_ready
echo "== end at $(at)"; date -u
du -sh .dev/triton-cache 2>/dev/null
cp "$w/log.txt" "$out/log.txt"
tar czf "$out/results.tgz" -C "$out" w && rm -rf "$w"
