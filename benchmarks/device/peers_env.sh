# Sourced by the device call scripts after `out` is set: log everything to $out/log.txt, install
# the carried peers once per warm machine (FLA from its wheel, Dao from call 1's wheel parts), and
# put fastpath + FLA on PYTHONPATH. Dao stays off it: add "$root/.dev/dao" where it is a peer.
root=$PWD
t0=$(date +%s)
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 COLUMNS=120
date -u
[ -d .dev/site/fla ] || python3 -m pip install -q --no-deps --target .dev/site .carry/fla_core-0.6.0-py3-none-any.whl
[ -d .dev/dao/causal_conv1d ] || bash benchmarks/device/install_dao.sh .carry/dao .dev/dao
export PYTHONPATH="$root/src:$root/.dev/site"
