#!/usr/bin/env bash
# mamba_ssm's own op tests against fastpath's functions on the GPU (tests/peer; its conftest.py
# says how the harness swaps the functions under test and widens the grids).
#
#   bash benchmarks/device/peer.sh OUTDIR        (from the repo root; carry .carry)
#   bash benchmarks/device/peer.sh --key         (this tree's state key, below; no GPU: check on the
#                                                 CPU that a seed will be taken before a call)
#
# Where the upstream files come from: state-spaces/mamba (https://github.com/state-spaces/mamba),
# tests/ops/test_selective_scan.py, tests/ops/triton/test_selective_state_update.py and
# tests/ops/triton/test_ssd.py at tag v2.3.2.post1, commit a14b1dff0454a3bc27d9eb31355dc01e4b2490ec
# (byte-identical at main e9594ce, 2026-07-23). The PyPI sdist mamba_ssm-2.3.2.post1.tar.gz ships
# no tests/, so benchmarks/device/pack_peer_tests.sh packs them (and mamba_ssm/ of the same commit,
# and an einops wheel) into the git-ignored .carry/mamba_peer before the call; .carry/mamba_peer/
# UPSTREAM names the commit. mamba_ssm itself is imported from the sdist parts.sh unpacks
# (.dev/mamba/mamba_ssm-2.3.2.post1) when it is there, else from .carry/mamba_peer.
#
# Environment (parts.sh's conventions: PYTHONPATH holds src and .dev/site; set here when unset):
#   PEER_GRIDS            comma list, run in order (default "default,wide")
#   PEER_DEFAULT_TIMEOUT  seconds for the file-as-written grid (default 180), PEER_DEFAULT_SHARDS (4)
#   PEER_WIDE_TIMEOUT     seconds for the widened grid (default 360), PEER_WIDE_SHARDS (15: a process a
#                         core but one on the 16-core device; a case's time grows with its L, about
#                         3 s at L = 4096 against 0.4 s at L = 8 in the JUnit times of
#                         benchmarks/results/h100-2026-12-07-session29/call3-peer-tile, as the
#                         reference's Python loop over time would: likely CPU work, not GPU)
#   PEER_K                an extra pytest -k expression (default none)
#   PEER_RESUME=1         continue the previous call's grids on this (still warm) machine: cases
#                         already finished are not run again and the counts cover every call;
#                         default 0 starts afresh. The state lives in .dev/peer (PEER_STATE).
#   PEER_SEED=DIR         continue a call made on another machine (a later session): DIR is that
#                         call's OUTDIR/peer (state.tgz + state_key.txt, which every call writes).
#                         With PEER_RESUME=1 on a machine that holds a state of this tree's key,
#                         that state wins and the seed is not taken (the same command can then
#                         be repeated on the warm machine).
# The state's key has two parts. cases=: a sha256 over the code that decides a case's outcome
# (each file with its full-line comments dropped, so a corrected comment keeps a finished grid; kernels/
# selective_scan, kernels/ssd, kernels/causal_conv1d, the kernels/*.py they share, the
# causal_conv1d face, tests/peer but for the judge's two files and test_mamba_ssm_suites.py, which
# holds only the harness's own CPU tests, the upstream commit, the FASTPATH_SSCAN_* switches set);
# judge=: over
# tests/peer/float64_judge.py and conftest.py (the judge and the harness plumbing: shards, the done
# list, the judge hook), which decide no outcome of a case whose upstream assertions passed.
# A seed or resumed state is taken whole when both match; when only judge= differs, every case
# that went to the judge (or failed) runs again and the rest stands; when cases= differs, every
# case runs again. So every counted case ran on the kernels of this tree. A finished case with no
# outcome on record runs again either way (benchmarks/device/peer_state.py adopt).
# Each grid runs as SHARDS pytest processes sharing the GPU (PEER_SHARD=i/n); a process cut by its
# limit gets SIGINT, so pytest still writes its JUnit XML for the cases it finished (and the done
# list holds each case's outcome, for a process killed before it wrote the XML). A case that
# loses the CUDA context (illegal memory access) stops its own process (named in its log).
# An upstream tolerance failure goes to the float64 judge (tests/peer/float64_judge.py): a case it
# passes counts as "passed_float64_judge", never as "passed", and is listed with fastpath's and the
# same-dtype reference's distances from float64 (JUnit property float64_judge; every verdict also
# in OUTDIR/peer/<grid>_judged.jsonl).
# Output: OUTDIR/peer/<grid>_<call>_<i>.{xml,txt} (every call's), OUTDIR/peer/summary.json,
# counts printed at the end (benchmarks/device/peer_state.py: the state between calls, the counts).
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: peer.sh OUTDIR | --key" >&2; exit 2; }
out=$1
root=$PWD
export MAMBA_PEER_TESTS=${MAMBA_PEER_TESTS:-$root/.carry/mamba_peer}
peer_sources() {  # the files whose hash keys the state; $1 = cases (all but the judge) or judge
  if [ "$1" = judge ]; then ls tests/peer/float64_judge.py tests/peer/conftest.py; return; fi
  { find src/fastpath/kernels/selective_scan src/fastpath/kernels/ssd src/fastpath/kernels/causal_conv1d \
      src/fastpath/causal_conv1d tests/peer -name '*.py' ! -name float64_judge.py ! -name conftest.py \
      ! -name test_mamba_ssm_suites.py
    ls src/fastpath/kernels/*.py; } | LC_ALL=C sort
}
code_sums() {  # "sha256  path" per file read from stdin, over its code: full-line comments dropped
  local f
  while read -r f; do printf '%s  %s\n' "$(sed '/^[[:space:]]*#/d' "$f" | sha256sum | cut -c1-64)" "$f"; done
}
# the scan's kernel switches decide outcomes too (FASTPATH_SSCAN_BWD=chunked runs another backward);
# with none set the key is the sources' alone
cases_key=$(peer_sources cases | code_sums | { cat; cat "$MAMBA_PEER_TESTS/UPSTREAM" 2>/dev/null
            env | grep '^FASTPATH_SSCAN_' | LC_ALL=C sort; } | sha256sum | cut -c1-16)
judge_key=$(peer_sources judge | code_sums | sha256sum | cut -c1-16)
key="cases=$cases_key judge=$judge_key"
if [ "$out" = --key ]; then
  [ -f "$MAMBA_PEER_TESTS/UPSTREAM" ] || echo "peer: no $MAMBA_PEER_TESTS/UPSTREAM: a key without it matches no device call's" >&2
  echo "$key"; exit 0
fi
dir="$out/peer"; mkdir -p "$dir"
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1
export PYTHONPATH=${PYTHONPATH:-$root/src:$root/.dev/site}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$root/.dev/triton-cache}
if [ -z "${MAMBA_SRC:-}" ]; then
  MAMBA_SRC=$MAMBA_PEER_TESTS
  [ -d .dev/mamba/mamba_ssm-2.3.2.post1/mamba_ssm ] && MAMBA_SRC=$root/.dev/mamba/mamba_ssm-2.3.2.post1
fi
export MAMBA_SRC
if ! python3 -c "import einops" 2>/dev/null; then
  whl=$(ls "$MAMBA_PEER_TESTS"/einops-*.whl .carry/whl/einops-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] && python3 -m pip install -q --no-deps --target .dev/site "$whl"
fi
echo "peer: tests $(cat "$MAMBA_PEER_TESTS/UPSTREAM" 2>/dev/null || echo "$MAMBA_PEER_TESTS (no UPSTREAM)")"
echo "peer: mamba_ssm from $MAMBA_SRC"
t0=$(date +%s)
state=${PEER_STATE:-$root/.dev/peer}
[ "${PEER_RESUME:-0}" = 1 ] || rm -rf "$state"
mkdir -p "$state"
echo "peer: sources key $key"
adopt() {  # adopt FOLDER KEY: keep what FOLDER's state may keep under this tree's key (see above)
  local folder=$1 theirs=$2
  if [ "$theirs" = "$key" ]; then
    python3 benchmarks/device/peer_state.py adopt "$folder"
  elif [ "${theirs%% *}" = "cases=$cases_key" ]; then
    python3 benchmarks/device/peer_state.py adopt "$folder" --rejudge
  else
    echo "peer: NOT continuing: its key '${theirs:-(none)}' is not this tree's '$key' (kernels or suites changed): every case runs again"
    rm -rf "${folder:?}"/* && return 1
  fi
}
resumed=0
if [ "${PEER_RESUME:-0}" = 1 ] && ls "$state"/*_done.txt > /dev/null 2>&1; then
  adopt "$state" "$(cat "$state/key.txt" 2>/dev/null)" && resumed=1
fi
if [ -n "${PEER_SEED:-}" ] && [ "$resumed" = 1 ]; then
  # the warm state went on from the seed (or from a later call): the seed would throw that away
  echo "peer: seed $PEER_SEED not taken: PEER_RESUME=1 continues this machine's own state"
elif [ -n "${PEER_SEED:-}" ]; then
  if [ -f "$PEER_SEED/state.tgz" ]; then
    rm -rf "${state:?}"/* && tar xzf "$PEER_SEED/state.tgz" -C "$state" && echo "peer: seed $PEER_SEED" \
      && adopt "$state" "$(cat "$PEER_SEED/state_key.txt" 2>/dev/null)"
  else
    echo "peer: NOT continuing from $PEER_SEED: no state.tgz there: every case runs again"
  fi
fi
echo "$key" > "$state/key.txt"
call=$(date +%s)

run_grid() {  # run_grid GRID LIMIT SHARDS
  local grid=$1 limit=$2 n=$3 pids="" i
  PEER_GRID=$grid python3 -m pytest tests/peer -m gpu -q -p no:cacheprovider --collect-only \
    ${PEER_K:+-k "$PEER_K"} > "$dir/${grid}_collect.txt" 2>&1
  touch "$state/${grid}_done.txt"
  echo "== peer $grid: $(tail -1 "$dir/${grid}_collect.txt"), $(wc -l < "$state/${grid}_done.txt") done before;" \
    "$n processes, limit $limit s, at $(( $(date +%s) - t0 )) s"
  for (( i = 0; i < n; i++ )); do
    PEER_GRID=$grid PEER_SHARD=$i/$n PEER_DONE="$state/${grid}_done.txt" \
      PEER_JUDGE_LOG="$state/${grid}_judged.jsonl" timeout -s INT -k 30 "$limit" \
      python3 -m pytest tests/peer -m gpu -q -p no:cacheprovider --tb=short -rfE \
      ${PEER_K:+-k "$PEER_K"} --junitxml="$state/${grid}_${call}_$i.xml" > "$state/${grid}_${call}_$i.txt" 2>&1 &
    pids="$pids $!"
  done
  wait $pids
  cp "$state/${grid}"_*_*.xml "$state/${grid}"_*_*.txt "$state/${grid}_judged.jsonl" "$state/${grid}_done.txt" \
    "$dir"/ 2>/dev/null
  tar czf "$dir/state.tgz" -C "$state" . && echo "$key" > "$dir/state_key.txt"  # PEER_SEED for a later call
  grep -h "lost the CUDA context\|KeyboardInterrupt\|^ERROR " "$state/${grid}_${call}"_*.txt | sort | uniq -c | head -20
}

IFS=, read -ra grids <<< "${PEER_GRIDS:-default,wide}"
for grid in "${grids[@]}"; do
  case $grid in
    default) run_grid default "${PEER_DEFAULT_TIMEOUT:-180}" "${PEER_DEFAULT_SHARDS:-4}" ;;
    wide) run_grid wide "${PEER_WIDE_TIMEOUT:-360}" "${PEER_WIDE_SHARDS:-15}" ;;
    *) echo "== peer: unknown grid '$grid' (default, wide)" ;;
  esac
done

python3 benchmarks/device/peer_state.py summary "$dir" "${grids[@]}"
echo "== peer end at $(( $(date +%s) - t0 )) s"
