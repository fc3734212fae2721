#!/usr/bin/env bash
# Session 3, device call 1 (lent H200), right after the rooms reorganisation:
#  - Dao's causal-conv1d builds in the background (its wheel comes back in parts for later calls);
#  - the GPU kernel tests at real shapes on the reorganised tree;
#  - doctor (full and static) vs `python -m torch.utils.collect_env`, side by side, FLA present;
#  - the causal_conv1d benchmark with every peer once Dao is built (baseline for "unchanged").
#   bash benchmarks/device/session3_call1.sh "$OUT"    (carry .carry)
set -uo pipefail
out=${1:?usage: session3_call1.sh OUTDIR}
root=$PWD
t0=$(date +%s)
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 COLUMNS=120
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -m pip install -q --no-deps --target .dev/site .carry/fla_core-0.6.0-py3-none-any.whl
bash benchmarks/device/build_dao.sh .carry/causal_conv1d-1.7.0.tar.gz .dev/dao "$out/dao" >"$out/dao_build.txt" 2>&1 &
dao=$!
export PYTHONPATH="$root/src:$root/.dev/site"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
echo "== kernel + FLA-route tests at GPU shapes (reorganised tree)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_causal_conv1d.py tests/test_launch.py tests/test_fla_dqkwg.py 2>&1 | tail -15
echo "pytest exit: ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s"
echo "== doctor vs collect_env (3 runs each, FLA on the path)"
python3 - "$out/doctor_speed_before.json" <<'PY'
import json, statistics, subprocess, sys, time
runs = {"collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
        "doctor_full": [sys.executable, "-m", "fastpath", "doctor", "--model", "qwen3.5-27b"],
        "doctor_static": [sys.executable, "-m", "fastpath", "doctor", "--probe", "static"]}
res = {}
for name, cmd in runs.items():
    ts = []
    for _ in range(3):
        t = time.perf_counter(); p = subprocess.run(cmd, capture_output=True, timeout=120)
        ts.append(time.perf_counter() - t)
    res[name] = {"seconds": ts, "median": statistics.median(ts), "rc": p.returncode}
    print(name, ["%.2f" % x for x in ts], "median %.2f" % res[name]["median"], "rc", p.returncode)
json.dump(res, open(sys.argv[1], "w"), indent=1)
PY
echo "== waiting for the Dao build at $(( $(date +%s) - t0 )) s"; wait "$dao"; echo "dao build exit: $?"; tail -3 "$out/dao_build.txt"
left=$(( 570 - ($(date +%s) - t0) ))
echo "== causal_conv1d kernels (copy, torch, FLA, Dao CUDA, fastpath), ${left}s left"
if [ "$left" -gt 60 ]; then
  PYTHONPATH="$PYTHONPATH:$root/.dev/dao" timeout "$left" python3 benchmarks/conv_kernels.py --out "$out/kernels_before.json" --host-costs 2>&1 | tail -40
fi
date -u
