#!/usr/bin/env bash
# The one device harness (the lent H200: torch 2.11+cu130, Triton 3.6.0, transformers 5.17.0).
#
#   bash benchmarks/device/parts.sh "$OUT" PARTS        (from the repo root; carry .carry)
#
# .carry (git-ignored) holds fla_core-0.6.0-py3-none-any.whl, causal_conv1d-1.7.0.tar.gz,
# mamba_ssm-2.3.2.post1.tar.gz, whl/ (liger-kernel, mambapy, datasets, dill, multiprocess) and,
# after a call that ran `dao`, dao/ (the Dao causal-conv1d wheel in parts: ~5 min of device CPU).
#
# Rules every part keeps (a part that breaks one is a bug):
# - a timing part runs only the phases it reports (bench gets --phases explicitly);
# - every result is on disk the moment it is measured (one bench call per configuration, scripts
#   that rewrite their JSON after each row), so a part cut by its limit keeps what it finished;
# - limits fit a cold machine (empty Triton cache); a part is skipped, with a log line, when less
#   than its limit is left of BUDGET seconds (default 560).
#
# PARTS (comma list, run in the order given):
#   dao       build Dao's causal-conv1d in the background (wheel parts come back in OUT/dao)
#   tests     GPU tests in the background (correctness only; `wait` or the end collects them);
#             TESTS picks groups: conv, fla, ssd, capture, sscan (Mamba1 kernels), layouts (every
#             B/C layout of the Mamba-1 scan), tile (the GPU test of the tile forward, the default
#             one; TILE_K narrows it with -k), glue (GDN glue), norm (zero-centred RMSNorm, SwiGLU,
#             RoPE, the embedding's one-pass backward), lce (the fused LM head + cross-entropy and
#             its route)
#   check     the TESTS groups in the foreground; a failure ends the call (every later part is
#             skipped), so no device time goes to timing kernels that are wrong
#   sweep     FLA #640 reproduction, all 48 cases: one process per tiling, in the background
#   verify    fastpath verify --backward, bf16 on the GPU; VERIFY="preset:layers[:batch] ..."
#   dqkwg     tests/proof/test_verify_gpu.py -k bf16 under FASTPATH_FLA_DQKWG=auto, torch, fla
#   fla       FLA dqkwg self-check route accuracy/speed
#   doctor    doctor vs collect_env, 5 runs each
#   conv      benchmarks/conv_kernels.py with every peer (Dao if built)
#   ssd       benchmarks/ssd.py --profile --update (Mamba-2 scan vs mamba_ssm)
#   sscan     benchmarks/selective_scan.py (Mamba-1 scan and update vs transformers' torch paths)
#   sscanncu  Nsight Compute over one call per Mamba-1 scan kernel (benchmarks/sscan_ncu.py;
#             NCU_FLAGS, e.g. "--variants tile,seq --cases 1x4096,8x4096 --bwd"), details + raw CSV
#   mamba1    benchmarks/mamba1_model.py (Falcon-Mamba and Jamba shaped models, prefill + train)
#   model     fastpath bench qwen3.5-27b 8 layers B=1 L=4096, phases prefill,train, one bench per
#             configuration (MODEL_CONFIGS; default reference,fastpath,fla+dao when Dao is there)
#   decode    the same model's decode and CUDA-graph decode, one bench per configuration
#   mamba     benchmarks/mamba_model.py (Nemotron-H 6 layers vs mamba_ssm's Triton SSD)
#   capture   benchmarks/capture_speed.py (capture vs its plain forward vs the fallback; steady state
#             from CAPTURE_ROWS against CAPTURE_SHORT_ROWS, fixed costs apart; CAPTURE_PATHS;
#             CAPTURE_DIAGNOSE=1 adds device profiles and the loop's sync points)
#   warmup    fastpath warmup --train per WARMUP_MODELS (default "qwen3.5-27b:8 kimi-linear-48b-a3b:2
#             olmo-hybrid:4"), each on an empty TRITON_CACHE_DIR; autotune decisions merged into
#             OUT/w/warmup/autotune-decisions.json
#   coldstart benchmarks/cold_start.py per COLD_MODELS (same default), COLD_CONFIGS (fastpath),
#             COLD_SCENARIOS (shipped,cold,warm,warmup,seeded); TRITON_CACHE_AUTOTUNING unset, as for a user;
#             COLD_DECISIONS=FILE seeds the seeded scenario from FILE (the shipped
#             src/fastpath/routing/autotune_data/sm_90.json) instead of the warmup scenario's
#   gdnnorm   benchmarks/gdn_norm_gpu.py (GDN gated norm eager vs FLA fused)
#   profile   benchmarks/gdn_layer_profile.py (one Qwen3.5 GDN layer under torch.profiler)
#   cerows    benchmarks/linear_ce_gpu.py --rows-sweep (the LM loss's cross-entropy row kernel alone at
#             each access order; CEROWS_SWEEP, default its own; bf16 logits at Qwen3.5-27B's vocabulary)
#   embedding benchmarks/embedding_gpu.py (the embedding's weight gradient: torch's fill + scatter vs
#             fastpath's one-pass kernel at each launch of EMBEDDING_LAUNCHES, beside a fill of the
#             table; Qwen3.5-27B's 248k x 5120 bf16 table at 4096 and 32768 tokens)
#   mprofile  benchmarks/model_profile.py (8-layer Qwen3.5: GPU time per kernel family, the split of
#             elementwise/other, the device's idle time and the host syncs; MPROFILE_CONFIGS, default
#             fastpath,fastpath+liger; MPROFILE_TIMEOUT, default 240)
#   peer      mamba_ssm's own op test files against fastpath's functions (benchmarks/device/peer.sh;
#             carry .carry/mamba_peer, packed by benchmarks/device/pack_peer_tests.sh; PEER_GRIDS;
#             PEER_SEED=DIR continues a grid from an earlier call's OUTDIR/peer, on the same sources)
#   memcheck  compute-sanitizer memcheck over every GPU test group, small shapes
#             (benchmarks/device/memcheck.sh)
#   hub       transformers 5.25 + kernels 0.19.1 (carried in .carry/tf525) offline on the GPU:
#             explain() before/after enable(), a training step, from_pretrained with Hub kernels on
#             (benchmarks/hub_wrappers_gpu.py)
#   wait      collect the background tests and sweep
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
if [ -d .carry/whl ] && [ ! -d .dev/site/liger_kernel ]; then
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

# Background work (correctness only, never beside a timing part): GPU tests and the #640 sweep.
bg_pids=""
group() {  # group NAME PYTEST-ARGS...
  local name=$1; shift
  [[ ",${TESTS:-conv,fla,ssd,sscan,glue}," == *",$name,"* ]] || return 0
  # SIGINT at the limit: pytest then still prints its summary (which tests failed, and why)
  (timeout -s INT -k 30 "${TEST_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider --tb=short \
     --durations=8 "$@" > "$w/tests_$name.txt" 2>&1
   echo "exit $?" >> "$w/tests_$name.txt") &
  bg_pids="$bg_pids $!"
}
part_tests() {
  echo "== tests (${TESTS:-conv,fla,ssd,sscan,glue}) in the background at $(at)"
  local k=tests/kernels r=tests/routing p=tests/proof
  group conv $k/causal_conv1d/test_causal_conv1d.py $k/causal_conv1d/test_launch.py $k/causal_conv1d/test_split_outputs.py \
    $p/test_decode_graphs.py
  group fla -v -m gpu $k/gated_delta_rule/test_fla_dqkwg.py $r/test_norm_route.py $p/test_verify_gpu.py \
    $p/test_bench_gpu.py
  MAMBA_SRC="$msrc" group ssd -m gpu $k/ssd/test_ssd_gpu.py $k/ssd/test_ssd_update.py \
    $k/ssd/test_mamba_split_conv_scan.py
  group capture -m gpu tests/capture/test_capture_writes.py tests/capture/test_capture.py $k/state_stats/test_state_stats.py \
    $p/test_model_profile.py
  group sscan -m gpu $k/selective_scan/test_selective_scan_gpu.py $k/selective_scan/test_mamba1_gpu.py \
    $k/selective_scan/test_mamba_inner.py $k/selective_scan/test_selective_scan_update.py \
    $k/selective_scan/test_selective_scan_seq.py $k/selective_scan/test_selective_scan_fwd_variants.py \
    $k/selective_scan/test_selective_scan_bwd_seq.py
  group tile -m gpu $k/selective_scan/test_selective_scan_fwd_variants.py -k "${TILE_K:-tile_gpu}"
  group layouts $k/selective_scan/test_selective_scan_layouts.py \
    $k/selective_scan/test_selective_scan_long_state.py \
    $k/selective_scan/test_selective_scan_bwd_seq.py  # every test, compiled on CUDA
  group glue -m gpu $k/gdn_gates/test_gates_gpu.py $r/test_liger_compose.py
  group norm -m gpu $k/zc_rmsnorm/test_zc_rmsnorm.py $k/swiglu/test_swiglu.py $k/rotary/test_rotary.py \
    $k/embedding/test_embedding.py
  group lce -m gpu $k/linear_ce/test_linear_ce.py $r/test_lm_head_route.py
  group warmup -m gpu $p/test_warmup.py
}
part_check() {  # foreground GPU tests; a failure spends no more device time on this call
  echo "== check (${TESTS:-conv,fla,ssd,sscan,glue}) at $(at)"
  part_tests; local pids=$bg_pids; bg_pids=""; local bad=0
  for pid in $pids; do wait "$pid" || bad=1; done
  for f in "$w"/tests_*.txt; do echo "-- $f"; tail -6 "$f"; grep -q "^exit 0$" "$f" || bad=1; done
  if [ "$bad" = 1 ]; then echo "== check FAILED at $(at): skipping every later part"; budget=0; fi
}
part_sweep() {  # FLA #640: 48 cases, one process per tiling (compiling is CPU work: they overlap)
  mkdir -p "$w/fla_640"
  for t in 128 64 32; do
    (timeout "${SWEEP_TIMEOUT:-420}" python3 benchmarks/fla_640_sweep.py --out "$w/fla_640" \
       --tilings "$t" --budget-s "${SWEEP_BUDGET:-380}" > "$w/fla_640/log_t$t.txt" 2>&1
     echo "exit $?" >> "$w/fla_640/log_t$t.txt") &
    bg_pids="$bg_pids $!"
  done
  echo "== sweep (3 processes) in the background at $(at)"
}
part_wait() {
  [ -n "$bg_pids" ] || return 0
  echo "== waiting for the background work at $(at)"; wait $bg_pids; bg_pids=""
  for f in "$w"/tests_*.txt "$w"/fla_640/log_t*.txt; do [ -f "$f" ] && { echo "-- $f"; tail -14 "$f"; }; done
}
part_verify() {
  mkdir -p "$w/verify"
  # VERIFY="preset:layers[:batch] ..." (default: the Mamba-1 family, Kimi-Linear and OLMo-hybrid)
  for spec in ${VERIFY:-falcon-mamba-7b:3 mamba-2.8b:4 jamba-mini-1.7:4:1 zamba-7b:4:1 kimi-linear-48b-a3b:2:1 olmo-hybrid:4}; do
    IFS=: read -r m n b <<< "$spec"
    run "verify-$m" "${VERIFY_TIMEOUT:-150}" python3 -m fastpath verify "$m" --layers "$n" --dtype bf16 \
      --seq-len 1024 --batch "${b:-2}" --backward --save "$w/verify/$m.json"
  done
}
part_dqkwg() {  # the tiny-Qwen3.5 GPU verify (bf16, backward) per FLA dqkwg route mode
  for mode in ${DQKWG_MODES:-auto torch fla}; do
    mkdir -p "$w/fpcache-$mode"
    run "dqkwg-$mode" 150 env FASTPATH_CACHE_DIR="$w/fpcache-$mode" FASTPATH_FLA_DQKWG="$mode" \
      python3 -m pytest -q -p no:cacheprovider --tb=line -m gpu tests/proof/test_verify_gpu.py -k bf16
  done
}
part_fla() {
  run fla-selfcheck 150 python3 benchmarks/fla_dqkwg_gpu.py --out "$w/fla_dqkwg.json"
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
part_ssd() {
  run ssd 200 python3 benchmarks/ssd.py --out "$w/ssd" --mamba-src "$msrc" --profile --update ${SSD_FLAGS:-}
}
part_sscan() {
  run sscan "${SSCAN_TIMEOUT:-200}" python3 benchmarks/selective_scan.py --out "$w/sscan" ${SSCAN_FLAGS:-}
}
part_cerows() {
  run cerows "${CEROWS_TIMEOUT:-150}" python3 benchmarks/linear_ce_gpu.py \
    --rows-sweep "${CEROWS_SWEEP:-0,0r,1x,1xr,2x,2xr,4xr}" --out "$w/cerows.json"
}
part_embedding() {
  run embedding "${EMBEDDING_TIMEOUT:-150}" python3 benchmarks/embedding_gpu.py \
    ${EMBEDDING_LAUNCHES:+--launches "$EMBEDDING_LAUNCHES"} --out "$w/embedding.json"
}
part_sscanncu() {  # Nsight Compute's full set over one call per scan kernel (benchmarks/sscan_ncu.py)
  run sscanncu "${NCU_TIMEOUT:-300}" ncu --clock-control none --profile-from-start off --set full \
    --import-source no -f -o "$w/sscan_ncu" python3 benchmarks/sscan_ncu.py ${NCU_FLAGS:-}
  [ -f "$w/sscan_ncu.ncu-rep" ] && ncu -i "$w/sscan_ncu.ncu-rep" --page details --print-details all \
    > "$w/sscan_ncu_details.txt" 2>&1
  [ -f "$w/sscan_ncu.ncu-rep" ] && ncu -i "$w/sscan_ncu.ncu-rep" --page raw --csv > "$w/sscan_ncu_raw.csv" 2>&1
  [ -f "$w/sscan_ncu.ncu-rep" ] && ncu -i "$w/sscan_ncu.ncu-rep" --page source --print-source sass --csv \
    > "$w/sscan_ncu_sass.csv" 2>&1
  rm -f "$w/sscan_ncu.ncu-rep"  # the text keeps what is read; the report alone can pass what comes back
  return 0
}
part_mamba1() {
  run mamba1 "${MAMBA1_TIMEOUT:-240}" python3 benchmarks/mamba1_model.py --out "$w/mamba1" ${MAMBA1_FLAGS:-}
}
bench_each() {  # bench_each PART PHASES LIMIT CONFIG... : one bench process per configuration
  local part=$1 phases=$2 limit=$3; shift 3
  for c in "$@"; do
    run "$part-$c" "$limit" env PYTHONPATH="$PYTHONPATH$dao_path" python3 -m fastpath bench qwen3.5-27b \
      --layers 8 --dtype bf16 --seq-len 4096 --batch 1 --decode-tokens 32 --repeats 3 --warmup 1 \
      --phases "$phases" --configs "$c" ${MODEL_FLAGS:-} --out "$w/$part/$c"
  done
}
part_model() {
  dao_ready
  local configs=${MODEL_CONFIGS:-reference,fastpath}
  [ -n "$dao_path" ] && [ -z "${MODEL_CONFIGS:-}" ] && configs=$configs,fla+dao
  IFS=, read -ra cs <<< "$configs"
  bench_each model prefill,train "${MODEL_TIMEOUT:-150}" "${cs[@]}"
}
part_decode() {
  IFS=, read -ra cs <<< "${DECODE_CONFIGS:-reference,fastpath}"
  bench_each decode decode,decode-graph "${DECODE_TIMEOUT:-240}" "${cs[@]}"
}
part_mamba() {
  dao_ready
  run mamba 200 env MAMBA_SRC="$msrc" PYTHONPATH="$PYTHONPATH$dao_path" python3 benchmarks/mamba_model.py \
    --mamba-src "$msrc" --out "$w/mamba"
}
part_capture() {
  run capture "${CAPTURE_TIMEOUT:-300}" python3 benchmarks/capture_speed.py --out "$w/capture" \
    --rows "${CAPTURE_ROWS:-128}" --short-rows "${CAPTURE_SHORT_ROWS:-32}" \
    --paths "${CAPTURE_PATHS:-fast,fallback}" ${CAPTURE_DIAGNOSE:+--diagnose}
}
part_warmup() {  # each model on its own empty cache; the decisions merge into one file
  mkdir -p "$w/warmup"
  for spec in ${WARMUP_MODELS:-qwen3.5-27b:8 kimi-linear-48b-a3b:2 olmo-hybrid:4}; do
    IFS=: read -r m n <<< "$spec"
    rm -rf "$root/.dev/warmup-cache/$m"
    run "warmup-$m" "${WARMUP_TIMEOUT:-300}" env -u TRITON_CACHE_AUTOTUNING \
      TRITON_CACHE_DIR="$root/.dev/warmup-cache/$m" python3 -m fastpath warmup "$m" --layers "$n" \
      --batch 1 --seq 4096 --train --save-decisions "$w/warmup/autotune-decisions.json"
  done
}
part_coldstart() {  # as a user: TRITON_CACHE_AUTOTUNING unset, every scenario on its own cache dir
  mkdir -p "$w/cold_start"
  for spec in ${COLD_MODELS:-qwen3.5-27b:8 kimi-linear-48b-a3b:2 olmo-hybrid:4}; do
    IFS=: read -r m n <<< "$spec"
    run "coldstart-$m" "${COLD_TIMEOUT:-540}" env -u TRITON_CACHE_AUTOTUNING python3 benchmarks/cold_start.py \
      --model "$m" --layers "$n" --batch 1 --seq 4096 --configs "${COLD_CONFIGS:-fastpath}" \
      --scenarios "${COLD_SCENARIOS:-shipped,cold,warm,warmup,seeded}" --timeout "${COLD_RUN_TIMEOUT:-400}" \
      ${COLD_DECISIONS:+--decisions "$COLD_DECISIONS"} \
      --out "$w/cold_start/$m"
  done
}
part_gdnnorm() {
  run gdnnorm 90 python3 benchmarks/gdn_norm_gpu.py --out "$w/gdn_norm.json"
}
part_profile() {
  run profile 150 python3 benchmarks/gdn_layer_profile.py --out "$w/profile"
}
part_mprofile() {
  dao_ready
  run mprofile "${MPROFILE_TIMEOUT:-240}" env PYTHONPATH="$PYTHONPATH$dao_path" python3 benchmarks/model_profile.py \
    --out "$w/mprofile" --configs "${MPROFILE_CONFIGS:-fastpath,fastpath+liger}"
}

part_peer() {
  run peer "${PEER_TIMEOUT:-560}" env MAMBA_SRC="$msrc" bash benchmarks/device/peer.sh "$w"
}
part_memcheck() {
  # MEMCHECK_TIMEOUT is each group's limit (memcheck.sh); the part gets a minute more for its summary
  run memcheck $(( ${MEMCHECK_TIMEOUT:-300} + 60 )) bash benchmarks/device/memcheck.sh "$w/memcheck"
}
part_hub() {  # its own site dir: transformers 5.25 must not shadow 5.17 for the other parts
  local site=/tmp/tf525site
  [ -d "$site/transformers" ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --target "$site" .carry/tf525/*.whl
  run hub "${HUB_TIMEOUT:-240}" env -u USE_HUB_KERNELS PYTHONPATH="$site:$PYTHONPATH" HF_HUB_OFFLINE=1 \
    python3 benchmarks/hub_wrappers_gpu.py --out "$w/hub_wrappers.json"
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
