#!/usr/bin/env bash
# compute-sanitizer memcheck over fastpath's GPU test groups, at small sizes (the lent H200:
# torch 2.11+cu130, Triton 3.6, compute-sanitizer from CUDA 13.0).
#
#   bash benchmarks/device/memcheck.sh OUTDIR          (from the repo root)
#
# Prints per group the sanitizer's "ERROR SUMMARY: N errors" (summed over the processes of the
# group) and the kernels the errors were reported in; logs land in OUTDIR/memcheck_<group>.txt.
# Exit 0: every group ran to its summary with 0 errors; 1: some group has sanitizer errors;
# 2: no errors seen, but some group timed out or printed no summary (inconclusive).
#
# Groups (MEMCHECK_GROUPS, comma list; all by default), each one pytest process under
# `compute-sanitizer --tool memcheck`, all at once (MEMCHECK_PARALLEL=0: one after another):
# (files under tests/kernels/ but the decode graphs' tests/proof/test_decode_graphs.py)
#   conv    causal_conv1d/test_causal_conv1d.py, causal_conv1d/test_launch.py,
#           causal_conv1d/test_split_outputs.py (not the torch.compile tests)
#   ssd     ssd/test_ssd_gpu.py, ssd/test_ssd_update.py, ssd/test_mamba_split_conv_scan.py
#           (not the mamba_ssm comparison: its kernels are not ours; MAMBA_SRC is unset)
#   sscan   selective_scan/test_selective_scan_gpu.py without the 1x8192x4096 / 2x5120x1024 /
#           8x1024x4096 cases (the float64 step-loop reference at those lengths alone outlasts the
#           limit), the swept tile configs cut to config0 (tl.flip adjoint) and config7 (reverse scan)
#   tile    selective_scan/test_selective_scan_fwd_variants.py, its GPU test at D = 8192 for the
#           opt-in tile forward's default config ([None]) and its time-segmented ones (cfg11-cfg14:
#           the states pass, the segment combine, the outputs pass)
#   sscanseq selective_scan/test_selective_scan_bwd_seq.py, the default time-walking backward: its
#           tests at tiny shapes compiled on CUDA (not the every-config test at L = 1134)
#   glue    gdn_gates/test_gates_gpu.py (not the 4-layer 27B routing test)
#   norm    zc_rmsnorm/test_zc_rmsnorm.py, swiglu/test_swiglu.py, rotary/test_rotary.py and
#           embedding/test_embedding.py, their GPU tests (the zero-centred RMSNorm at 27B row
#           widths, the SwiGLU product at 27B's MLP width, the RoPE of 27B's q and k at L = 4096,
#           the embedding backward over 27B's 248k-row table)
#   lce     linear_ce/test_linear_ce.py, its small odd-shape GPU test (the 27B head is too large)
#   stats   state_stats/test_state_stats.py, its GPU test (capture's one-pass state checks at 4096 x 5120)
#   decode  tests/proof/test_decode_graphs.py, eager (CPU-or-GPU) tests
#   graphs  tests/proof/test_decode_graphs.py, the CUDA-graph tests: with the caching allocator ON,
#           because PyTorch refuses PYTORCH_NO_CUDA_MEMORY_CACHING during graph capture
#           ("Deliberately don't use cudaMallocMaybeCapturing here, to force an error",
#           https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp);
#           there an overrun that stays inside one of the allocator's segments is not seen
# MEMCHECK_K_<GROUP> replaces a group's -k expression.
#
# Small sizes: the GPU test files fix their shapes in code, so the big cases are left out by -k
# above, and a pytest plugin written to OUTDIR (loaded with -p) caps every Hypothesis test at
# MEMCHECK_EXAMPLES examples (default 4; the conv / update / split-conv property tests draw
# 12-60 at full size). The tests themselves are not changed.
#
# Sanitizer settings (https://docs.nvidia.com/compute-sanitizer/ComputeSanitizer/index.html):
#   --tool memcheck --leak-check no --report-api-errors no (torch and Triton probe the driver
#   with calls that may fail on purpose) --target-processes all (pytest's subprocesses too)
#   --error-exitcode 86 (apart from pytest's own 1) --show-backtrace device --print-limit 200,
#   --padding 64 where this compute-sanitizer has it (a pad after every allocation, so an
#   overrun into a neighbouring allocation is still reported), and
#   --kernel-name-exclude regex=$MEMCHECK_EXCLUDE: PyTorch's and cuBLAS's own kernels run
#   uninstrumented (the float64 references are thousands of them); fastpath's Triton kernels
#   (plain, unmangled names such as _fwd_kernel) are always checked. MEMCHECK_EXCLUDE= (empty)
#   checks every kernel.
# PYTORCH_NO_CUDA_MEMORY_CACHING=1: "Use of a caching allocator can interfere with memory checking
# tools such as cuda-memcheck. To debug memory errors using cuda-memcheck, set
# PYTORCH_NO_CUDA_MEMORY_CACHING=1" (https://pytorch.org/docs/stable/notes/cuda.html, memory
# management): otherwise a Triton kernel reading past its tensor reads inside a larger cached
# block that memcheck counts as allocated.
#
# Limits: MEMCHECK_TIMEOUT seconds per group (default 300; cold Triton cache included). The
# whole call takes about MEMCHECK_TIMEOUT + 30 s with the groups in parallel.
set -uo pipefail
out=${1:?usage: memcheck.sh OUTDIR}
mkdir -p "$out"
root=$PWD
limit=${MEMCHECK_TIMEOUT:-300}
examples=${MEMCHECK_EXAMPLES:-4}
groups=${MEMCHECK_GROUPS:-conv,ssd,sscan,tile,sscanseq,glue,norm,lce,stats,decode,graphs}
exclude=${MEMCHECK_EXCLUDE-'^_Z|at::native|at6native|c10::|cublas|cutlass|gemm|gemv|nvjet|xmma|cudnn|splitKreduce'}
t0=$(date +%s)
at() { echo "$(( $(date +%s) - t0 )) s"; }

sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-13.0/bin/compute-sanitizer; do
  [ -n "$sanitizer" ] || { [ -x "$c" ] && sanitizer=$c; }
done
if [ -z "$sanitizer" ]; then echo "memcheck: compute-sanitizer not found (set COMPUTE_SANITIZER)"; exit 2; fi
"$sanitizer" --version | tail -2
help=$("$sanitizer" --help 2>&1)

export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1
export PYTHONPATH="$root/src:$root/.dev/site:$out/plugin${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$root/.dev/triton-cache}
export MEMCHECK_EXAMPLES=$examples
unset MAMBA_SRC TRITON_INTERPRET

mkdir -p "$out/plugin"
cat > "$out/plugin/memcheck_small.py" <<'EOF'
"""pytest plugin for memcheck runs: every Hypothesis test draws at most MEMCHECK_EXAMPLES
examples (its own @settings stay otherwise as written)."""

import os


def pytest_collection_modifyitems(items):
    cap = int(os.environ.get("MEMCHECK_EXAMPLES", "4"))
    try:
        from hypothesis import settings
    except ImportError:
        return
    for item in items:
        fn = getattr(item, "obj", None)
        current = getattr(fn, "_hypothesis_internal_use_settings", None)  # read at each call
        if current is not None and current.max_examples > cap:
            fn._hypothesis_internal_use_settings = settings(current, max_examples=cap)
EOF

flags=(--tool memcheck --leak-check no --report-api-errors no --target-processes all
       --error-exitcode 86 --show-backtrace device --print-limit 200)
extra=()
grep -q -- "--padding" <<< "$help" && extra+=(--padding 64)
if [ -n "$exclude" ] && grep -q -- "--kernel-name-exclude" <<< "$help"; then
  extra+=(--kernel-name-exclude "regex=$exclude")
fi
# the optional flags must parse here (a non-CUDA program runs in a second), else they are dropped;
# compute-sanitizer 2025.3 exits non-zero for a program that never calls CUDA ("Target
# application terminated before first instrumented API call"): the flags parsed, so keep them
probe_ok() {
  "$sanitizer" "${flags[@]}" "${extra[@]}" true > "$out/memcheck_flags.txt" 2>&1 ||
    grep -q "terminated before first instrumented API call" "$out/memcheck_flags.txt"
}
if [ "${#extra[@]}" -gt 0 ] && ! probe_ok; then
  echo "memcheck: $sanitizer refused '${extra[*]}' ($(tail -1 "$out/memcheck_flags.txt")): running without them"
  extra=()
fi
flags+=(${extra[@]+"${extra[@]}"})
echo "memcheck flags: ${flags[*]}"
echo "groups: $groups; $limit s each; Hypothesis examples <= $examples; TRITON_CACHE_DIR=$TRITON_CACHE_DIR"

declare -A files kexpr caching
kt=tests/kernels
files[conv]="$kt/causal_conv1d/test_causal_conv1d.py $kt/causal_conv1d/test_launch.py $kt/causal_conv1d/test_split_outputs.py"
kexpr[conv]="not torch_compile"
files[ssd]="$kt/ssd/test_ssd_gpu.py $kt/ssd/test_ssd_update.py $kt/ssd/test_mamba_split_conv_scan.py"
kexpr[ssd]="not agrees_with_mamba_ssm"
files[sscan]="$kt/selective_scan/test_selective_scan_gpu.py"
kexpr[sscan]="not falcon_and_mamba_shapes and not forward_only_long_batch and not (every_swept_config and not (config0 or config7))"
files[tile]="$kt/selective_scan/test_selective_scan_fwd_variants.py"
kexpr[tile]="tile_gpu_falcon_shapes and (None or cfg11 or cfg12 or cfg13 or cfg14)"
files[sscanseq]="$kt/selective_scan/test_selective_scan_bwd_seq.py"
kexpr[sscanseq]="not gpu_every_sweep_config"
files[glue]="$kt/gdn_gates/test_gates_gpu.py"
kexpr[glue]="not 27b_layers"
files[decode]="tests/proof/test_decode_graphs.py"
kexpr[decode]="not on_cuda"
files[graphs]="tests/proof/test_decode_graphs.py"
kexpr[graphs]="on_cuda"
caching[graphs]=1
files[norm]="$kt/zc_rmsnorm/test_zc_rmsnorm.py $kt/swiglu/test_swiglu.py $kt/rotary/test_rotary.py $kt/embedding/test_embedding.py"
kexpr[norm]="gpu_at_27b_sizes or gpu_at_27b_mlp_size or gpu_at_27b_attention_size"
files[lce]="$kt/linear_ce/test_linear_ce.py"
kexpr[lce]="small_odd_shapes"
files[stats]="$kt/state_stats/test_state_stats.py"
kexpr[stats]="gpu_at_27b_state_size"

declare -A pids
start_group() {  # its own process group, so a timeout ends pytest and its children too
  local g=$1 log="$out/memcheck_$1.txt" var="MEMCHECK_K_${1^^}"
  local k=${!var:-${kexpr[$1]}}
  local alloc=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
  [ -n "${caching[$g]:-}" ] && alloc=(-u PYTORCH_NO_CUDA_MEMORY_CACHING)
  echo "== $g: ${files[$g]} -k '$k'${caching[$g]:+ (caching allocator on)}" | tee "$log"
  # shellcheck disable=SC2086  # files[...] is a word list
  setsid env "${alloc[@]}" "$sanitizer" "${flags[@]}" python3 -m pytest -q -p no:cacheprovider \
    -p memcheck_small --tb=short -rfE --durations=5 ${files[$g]} -k "$k" >> "$log" 2>&1 &
  pids[$g]=$!
}
finish_group() {  # wait for a group within the limit, then kill its process group
  local g=$1 pid=${pids[$1]} deadline=$2
  while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 2; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "TIMEOUT after $limit s" >> "$out/memcheck_$g.txt"
    kill -TERM -- "-$pid" 2>/dev/null; sleep 10; kill -KILL -- "-$pid" 2>/dev/null
  fi
  wait "$pid"; echo "exit $?" >> "$out/memcheck_$g.txt"
}

IFS=, read -ra order <<< "$groups"
for g in "${order[@]}"; do
  [ -n "${files[$g]:-}" ] || { echo "== unknown group '$g'"; continue; }
  start_group "$g"
  if [ "${MEMCHECK_PARALLEL:-1}" = 0 ]; then finish_group "$g" $(( $(date +%s) + limit )); fi
done
if [ "${MEMCHECK_PARALLEL:-1}" != 0 ]; then
  deadline=$(( $(date +%s) + limit ))
  for g in "${!pids[@]}"; do finish_group "$g" "$deadline"; done
fi

echo "== memcheck results at $(at)"
status=0
for g in "${order[@]}"; do
  log="$out/memcheck_$g.txt"
  [ -f "$log" ] || continue
  sums=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$log" | grep -oE "[0-9]+")
  errors=0; for n in $sums; do errors=$(( errors + n )); done
  tests=$(grep -E "^[0-9]+ (passed|failed|skipped|deselected|error)|^=+ .*(passed|failed|error|skipped|deselected).* in [0-9.]+s" "$log" | tail -1)
  seen=$(grep -cE "^=+ +(Invalid|Misaligned|Out-of-range|Hardware exception|Malloc|Free)" "$log")
  kernels=$(grep -oE "^=+ +at [A-Za-z_][A-Za-z0-9_]*" "$log" | awk '{print $NF}' | sort | uniq -c | sort -rn | head -8 | awk '{printf "%s x%s, ", $2, $1}')
  if [ -z "$sums" ]; then
    echo "$g: NO ERROR SUMMARY ($(tail -2 "$log" | tr '\n' ' ')) ${tests:+| $tests} | $seen error reports before the cut${kernels:+ | in: ${kernels%, }}"
    if [ "$seen" -gt 0 ]; then status=1; elif [ "$status" = 0 ]; then status=2; fi
  else
    echo "$g: ERROR SUMMARY: $errors errors | ${tests:-no pytest summary} | $(tail -1 "$log")${kernels:+ | in: ${kernels%, }}"
    if [ "$errors" -gt 0 ]; then status=1; fi
    if grep -q "^TIMEOUT" "$log" && [ "$status" = 0 ]; then status=2; fi
  fi
done
echo "== memcheck end at $(at): exit $status"
exit "$status"
