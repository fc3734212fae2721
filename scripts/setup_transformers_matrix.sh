#!/usr/bin/env bash
# Side-by-side transformers versions for tests/routing/test_enable_matrix.py.
# One venv per version under .venvs/, created with --system-site-packages so they all share the
# system python's CPU torch, triton and the editable fastpath; only transformers and the hub
# packages it pins are installed per venv. Idempotent: a venv with a matching stamp is skipped.
#
#   4.57.6  needs huggingface_hub<1.0 (pip resolves it inside the venv)
#   5.12.1  the module-level-globals + lazy_load_kernel era (5.3-5.14), USE_HUB_KERNELS ignored
#   5.17.0  is the system python's own transformers (no venv; tests run it in-process too)
#   5.23.0  grouped-value GatedDeltaNet heads, packed-sequence ValueError on the torch path
#   5.25.0  requires kernels>=0.19.1: installed with --no-deps + its other requirements (tests the
#           path without `kernels`), and a second venv "5.25.0-kernels" adds kernels 0.17.2, older
#           than 5.25 accepts, to test an installed `kernels` that fails its version check, offline.
#           (The default stack, scripts/setup_default_stack.sh, has the kernels 5.25 requires.)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENVS=${FASTPATH_VENVS:-.venvs}
PIP_FLAGS=(-q --disable-pip-version-check)
FULL_MB=${FASTPATH_FULL_DISK_MB:-256}  # a failed install with less free than this counts as a full disk
mkdir -p "$VENVS"

make_venv() {  # name, then pip install arguments...
  local name=$1; shift
  local dir="$VENVS/tf-$name" stamp="$*" out
  rm -f "$dir.unbuilt"
  if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.fastpath-stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "   $dir: ready"
    return 0
  fi
  echo "   $dir: creating"
  rm -rf "$dir"
  # pip's output is kept in memory, not in a file: on a full disk a log file could not be written.
  # shellcheck disable=SC2068
  if ! out=$({ "$PY" -m venv --system-site-packages "$dir" && eval "$@"; } 2>&1); then
    local free_mb
    free_mb=$(df -Pm "$VENVS" | awk 'NR == 2 {print $4}')
    # A full disk is the machine's limit, not fastpath's: no venv, and the reason kept for the skip
    # messages of the tests that use it (tests/support/repo_paths.py), as the default stack does.
    # (venv's ensurepip hides the ENOSPC, so the free space left decides as well as pip's message.)
    if printf '%s\n' "$out" | grep -q "No space left on device" || [ "${free_mb:-0}" -lt "$FULL_MB" ]; then
      rm -rf "$dir"
      echo "the disk of $VENVS filled while installing transformers $name ($free_mb MB left)" > "$dir.unbuilt"
      echo "   $dir: NOT BUILT: $(cat "$dir.unbuilt")"
      return 0
    fi
    printf '%s\n' "$out" | grep -v "WARNING: Location" | tail -20 >&2
    return 1
  fi
  echo "$stamp" > "$dir/.fastpath-stamp"
}

pip_in() { local dir="$VENVS/tf-$1"; shift; "$dir/bin/python" -m pip install "${PIP_FLAGS[@]}" "$@"; }

# transformers 5.25.0's requirements minus `kernels` (from its wheel METADATA).
TF525_DEPS=("huggingface-hub>=2.4.0,<3.0" "numpy>=1.17" "packaging>=20.0" "pyyaml>=5.1"
  "regex>=2025.10.22" "tokenizers>=0.23.1,<0.24.0" "typer" "safetensors>=0.8.0" "tqdm>=4.60")

make_venv 4.57.6 'pip_in 4.57.6 "transformers==4.57.6"' &
make_venv 5.12.1 'pip_in 5.12.1 "transformers==5.12.1"' &
make_venv 5.23.0 'pip_in 5.23.0 "transformers==5.23.0"' &
make_venv 5.25.0 'pip_in 5.25.0 --no-deps "transformers==5.25.0" && pip_in 5.25.0 "${TF525_DEPS[@]}"' &
make_venv 5.25.0-kernels 'pip_in 5.25.0-kernels --no-deps "transformers==5.25.0" && pip_in 5.25.0-kernels "${TF525_DEPS[@]}" "kernels==0.17.2"' &
fail=0
for job in $(jobs -p); do wait "$job" || fail=1; done
exit $fail
