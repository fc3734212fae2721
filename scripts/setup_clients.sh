#!/usr/bin/env bash
# The drafter-training clients of `fastpath capture`, for tests/capture/test_clients_capture.py and
# tests/doctor/test_clients_doctor.py: speculators and
# SpecForge, each in its own venv under .venvs/ (created with --system-site-packages, so torch,
# triton, transformers and fastpath come from the system python and nothing installed here changes
# what the rest of the suite sees). Each venv is pinned, and a second leg takes the newest release
# on PyPI when it is newer than the pin (`pip index versions`); today both pins are the newest
# releases (speculators 0.9.0, specforge 0.2.0), so there is no second leg yet.
#
# speculators: installed with --no-deps plus its runtime requirements by hand, leaving out
#   torchvision and torchaudio: from PyPI they are CUDA builds for another torch, and with them
#   installed `import transformers` fails on the CPU torch (transformers imports torchvision when it
#   is there). Its own pins are kept (datasets<=5.1.0, loguru<=0.7.3), torch and transformers are the
#   system's (it allows torch 2.9-2.14.1 and transformers 5.0-5.19).
# specforge: its metadata pins torch==2.11.0, transformers==5.8.1 and sglang==0.5.14 (a CUDA server),
#   none of which its offline readers (specforge/data/preprocessing.py OfflineEagle3Dataset,
#   specforge/runtime/data_plane/offline_reader.py OfflineManifestReader) or its target head
#   (specforge/modeling/target/target_head.py) import. So it is installed with --no-deps and only
#   what those modules import is added (they run on the system's torch 2.13 / transformers 5.17;
#   the tests say so in their skip reasons if that ever stops working).
# Idempotent: a venv whose stamp matches is kept. FASTPATH_CLIENTS_NEWEST=0 skips the newest-release
# check (offline machines).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ROOT=${FASTPATH_CLIENTS_DIR:-.venvs}
PIPQ=(-m pip install -q --disable-pip-version-check)

# What the system python has: the venvs must never replace these.
CONSTRAINTS="$ROOT/clients-constraints.txt"
mkdir -p "$ROOT"
"$PY" - > "$CONSTRAINTS" <<'EOF'
import importlib.metadata as md
for name in ("torch", "triton", "transformers", "safetensors", "huggingface_hub", "numpy"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
EOF

SPECULATORS_DEPS=("hs-connectors==0.9.0" "openai>=2.0.0" "loguru>=0.7.2,<=0.7.3" "aiohttp" "protobuf"
                  "psutil" "datasets>=4.0.0,<=5.1.0" "pydantic-settings>=2.0.0" "typer>=0.12.0" "rich" "click")
SPECFORGE_DEPS=("datasets" "pydantic" "tqdm" "pyyaml" "psutil")

# install_client NAME VERSION DEPS...: one venv, .venvs/NAME-VERSION
install_client() {
  local name=$1 version=$2
  shift 2
  local dest="$ROOT/$name-$version"
  local stamp="$name==$version $* | $(tr '\n' ' ' < "$CONSTRAINTS")"
  if [ -x "$dest/bin/python" ] && [ "$(cat "$dest/.fastpath-stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "   $dest: ready"
    return 0
  fi
  local start=$SECONDS
  rm -rf "$dest"
  local log="$ROOT/$name-$version.log"
  # pip's resolver complains about the requirements left out on purpose: kept in the log.
  if ! { "$PY" -m venv --system-site-packages "$dest" \
      && "$dest/bin/python" "${PIPQ[@]}" --no-deps "$name==$version" \
      && "$dest/bin/python" "${PIPQ[@]}" -c "$CONSTRAINTS" "$@" \
      && { "$dest/bin/python" -m pip uninstall -q -y torchvision torchaudio || true; } \
      && "$dest/bin/python" -c "import $name"; } > "$log" 2>&1; then
    tail -5 "$log" >&2
    echo "   $dest: FAILED (log: $log)" >&2
    return 1
  fi
  echo "$stamp" > "$dest/.fastpath-stamp"
  echo "   $dest: installed $name==$version ($((SECONDS - start)) s)"
}

# newest NAME: the newest release on the index, or nothing (offline, or FASTPATH_CLIENTS_NEWEST=0).
newest() {
  [ "${FASTPATH_CLIENTS_NEWEST:-1}" = "1" ] || return 0
  "$PY" -m pip index versions "$1" 2>/dev/null | sed -n "s/^$1 (\([^)]*\)).*/\1/p" | head -1
}

SPECULATORS_PIN=0.9.0
SPECFORGE_PIN=0.2.0
install_client speculators "$SPECULATORS_PIN" "${SPECULATORS_DEPS[@]}"
install_client specforge "$SPECFORGE_PIN" "${SPECFORGE_DEPS[@]}"

# Second leg: the newest release, when it is not the pin. Its runtime requirements are assumed
# unchanged; if it does not install or import on CPU the leg is skipped with the reason (the pinned
# leg still runs), and tests/capture/test_clients_capture.py runs against every .venvs/<client>-*
# that exists.
for client in speculators specforge; do
  pin_var="${client^^}_PIN"
  deps_var="${client^^}_DEPS[@]"
  latest=$(newest "$client")
  if [ -z "$latest" ]; then
    echo "   $client: newest release not looked up (offline or FASTPATH_CLIENTS_NEWEST=0)"
  elif [ "$latest" = "${!pin_var}" ]; then
    echo "   $client: the pin ${!pin_var} is the newest release"
  elif ! (install_client "$client" "$latest" "${!deps_var}"); then
    rm -rf "${ROOT:?}/$client-$latest"
    echo "   $client $latest (newest) does not install or import on this CPU machine: second leg skipped"
  fi
done
