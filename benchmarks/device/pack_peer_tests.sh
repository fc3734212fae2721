#!/usr/bin/env bash
# Pack mamba_ssm's own op test files into the git-ignored .carry/mamba_peer for a device call
# (tests/peer runs them against fastpath; they are never committed to this repository).
#
#   bash benchmarks/device/pack_peer_tests.sh [SOURCE] [REF]      (from the repo root)
#
# SOURCE: a state-spaces/mamba git checkout or bare git dir (https://github.com/state-spaces/mamba;
#         default: /work/.mirror/state-spaces+mamba/repo, else a fresh clone into a temp dir).
# REF:    default v2.3.2.post1 (commit a14b1dff0454a3bc27d9eb31355dc01e4b2490ec), the release whose
#         PyPI sdist (mamba_ssm-2.3.2.post1.tar.gz, no tests/ inside) parts.sh unpacks as mamba_ssm.
#         The three files are byte-identical at main e9594ce (2026-07-23).
# Writes .carry/mamba_peer/{tests/ops/..., mamba_ssm/ (the same commit, for MAMBA_SRC), UPSTREAM}
# and, when none is in .carry, an einops wheel (mamba_ssm's tests and modules import einops).
set -euo pipefail
src=${1:-/work/.mirror/state-spaces+mamba/repo}
ref=${2:-v2.3.2.post1}
dest=.carry/mamba_peer
files=(tests/ops/test_selective_scan.py tests/ops/triton/test_selective_state_update.py
       tests/ops/triton/test_ssd.py)
if [ ! -e "$src" ]; then
  tmp=$(mktemp -d)
  git clone --quiet --bare https://github.com/state-spaces/mamba "$tmp/mamba.git"
  src="$tmp/mamba.git"
fi
if git --git-dir="$src" rev-parse --git-dir > /dev/null 2>&1; then
  gitdir=$src
else
  gitdir=$(git -C "$src" rev-parse --absolute-git-dir)
fi
commit=$(git --git-dir="$gitdir" rev-parse "$ref^{commit}")
rm -rf "$dest" && mkdir -p "$dest"
git --git-dir="$gitdir" archive "$commit" "${files[@]}" mamba_ssm | tar x -C "$dest"
echo "state-spaces/mamba $commit ($ref) https://github.com/state-spaces/mamba/tree/$commit" \
  > "$dest/UPSTREAM"
if ! ls .carry/whl/einops-*.whl .carry/mamba_peer/einops-*.whl > /dev/null 2>&1; then
  python3 -m pip download -q --no-deps --only-binary :all: einops -d "$dest" \
    || echo "pack_peer_tests: no einops wheel fetched (the device must have einops)" >&2
fi
echo "packed into $dest: $(cat "$dest/UPSTREAM")"
du -sh "$dest"
