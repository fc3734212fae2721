#!/usr/bin/env bash
# Session 3, device call 2 (lent H200): the kernels after the perf work and the new SSD kernels.
#   bash benchmarks/device/session3_call2.sh "$OUT"     (carry .carry: fla wheel, Dao wheel parts,
#                                                        the mamba-ssm 2.3.2.post1 sdist)
# 1. session3_perf.sh kernels: GPU conv/launch/decode-graph/FLA tests, conv benchmark with every
#    peer (Dao built in call 1), the FLA dqkwg self-check, the #640 sweep if time is left;
# 2. the SSD kernels' GPU tests against float64 and mamba_ssm's own op, then benchmarks/ssd.py.
# Everything lands in OUT/w and is packed into OUT/call2.tgz at the end.
set -uo pipefail
out=${1:?usage: session3_call2.sh OUTDIR}
w="$out/w"; mkdir -p "$w"
T0=$(date +%s)
mkdir -p .dev/mamba && tar xzf .carry/mamba_ssm-2.3.2.post1.tar.gz -C .dev/mamba
msrc=$(echo "$PWD"/.dev/mamba/mamba_ssm-*)
BUDGET=330 bash benchmarks/device/session3_perf.sh "$w" kernels
export PYTHONPATH="$PWD/src:$PWD/.dev/site" PYTHONUNBUFFERED=1
echo "== ssd gpu tests at $(( $(date +%s) - T0 )) s" | tee -a "$w/log.txt"
MAMBA_SRC="$msrc" timeout 80 python3 -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/test_ssd_gpu.py 2>&1 | tail -25 | tee -a "$w/log.txt"
echo "== ssd bench at $(( $(date +%s) - T0 )) s" | tee -a "$w/log.txt"
timeout $(( 560 - ($(date +%s) - T0) )) python3 benchmarks/ssd.py --out "$w/ssd" --mamba-src "$msrc" 2>&1 | tail -40 | tee -a "$w/log.txt"
echo "== end at $(( $(date +%s) - T0 )) s" | tee -a "$w/log.txt"
tar czf "$out/call2.tgz" -C "$out" w && cp "$w/log.txt" "$out/log.txt" && rm -rf "$w"
