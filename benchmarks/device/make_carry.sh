#!/usr/bin/env bash
# Rebuild the git-ignored .carry folder every device call names in `carry` (a new session's machine
# starts without it): the wheels and sdists parts.sh installs on the lent H200 (Python 3.12,
# x86-64, no internet), fetched here from PyPI.
#
#   bash benchmarks/device/make_carry.sh          (from the repo root; then carry [".carry"])
#
# .carry/fla_core-0.6.0-py3-none-any.whl              the FLA route (parts.sh installs it first)
# .carry/causal_conv1d-1.7.0.tar.gz                   Dao's CUDA peer, built by the `dao` part
# .carry/mamba_ssm-2.3.2.post1.tar.gz                 mamba_ssm's references (MAMBA_SRC) and Triton SSD
# .carry/whl/                                         liger-kernel, mambapy, datasets and their pure deps
# .carry/tf525/                                       the `hub` part: transformers 5.25.0 + kernels 0.19.1
# .carry/mamba_peer/                                  the `peer` part (benchmarks/device/pack_peer_tests.sh)
# Everything travels with the working tree (64 MiB a call): the script prints the total.
set -euo pipefail
dest=.carry
mkdir -p "$dest/whl" "$dest/tf525"
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
fetch() {  # fetch DIR NAME==VERSION...: wheels only, no dependencies (each is named)
  local dir=$1; shift
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: "${plat[@]}" \
    -d "$dir" "$@"
}
fetch "$dest" fla-core==0.6.0
# the sdists as published (pip download would build their metadata, which needs torch and nvcc)
python3 - "$dest" causal-conv1d==1.7.0 mamba-ssm==2.3.2.post1 <<'PYEOF'
import json, sys, urllib.request
from pathlib import Path
dest = Path(sys.argv[1])
for spec in sys.argv[2:]:
    name, version = spec.split("==")
    meta = json.load(urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60))
    sdist = next(u for u in meta["releases"][version] if u["packagetype"] == "sdist")
    target = dest / sdist["filename"]
    if not target.exists():
        urllib.request.urlretrieve(sdist["url"], target)
    print("sdist", target)
PYEOF
fetch "$dest/whl" liger-kernel==0.8.5 mambapy datasets dill multiprocess einops xxhash
fetch "$dest/tf525" transformers==5.25.0 kernels==0.19.1 huggingface_hub==2.4.0 httpx2 httpcore2 \
  truststore tomlkit click hf_xet
[ -d "$dest/mamba_peer" ] || bash benchmarks/device/pack_peer_tests.sh \
  || echo "make_carry: no .carry/mamba_peer (pack_peer_tests.sh needs a state-spaces/mamba checkout); the peer part needs it" >&2
ls "$dest" "$dest/whl" "$dest/tf525"
du -sh "$dest"
