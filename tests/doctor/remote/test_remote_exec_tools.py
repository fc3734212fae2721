"""`doctor --on` through container exec tools: `docker exec -i`, `kubectl exec -i POD --`, and the
seed story's `ssh HOST pct exec 200 --`.

The tools are fakes written here (no docker daemon, cluster or Proxmox on a CI box), but the
container they enter is real isolation: a mount namespace (`unshare -m`) in which the host's CUDA
13.0 and its nvcc wrapper are hidden and the container's own bin/ leads PATH. So a probe that
really ran "inside" reports the container's toolchain, not the host's. The fakes keep the real
tools' stdin rules: docker/kubectl pass stdin only with -i, pct always does.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sshd_server import ThrowawaySshd

HOST_CUDA = "/usr/local/cuda-13.0"

FAKECTR = r"""#!/bin/sh
# fakectr ROOT CMD...: run CMD as if inside the container whose files are ROOT
root=$1; shift
exec unshare -m sh -c '
  r=$1; shift
  for d in /usr/local/cuda-13.0 /usr/local/cuda; do
    if [ -d "$d" ] && [ ! -L "$d" ]; then mount --bind "$r/empty" "$d" || exit 97; fi
  done
  for f in /usr/local/bin/nvcc /usr/bin/nvcc; do
    if [ -f "$f" ]; then mount --bind "$r/empty-file" "$f" || exit 97; fi
  done
  PATH="$r/bin:/usr/bin:/bin" exec "$@"' fakectr "$root" "$@"
"""

FAKE_DOCKER = r"""#!/bin/sh
# fake docker: only `docker exec [-i|-it|--interactive] [-e K=V|-u U|-w D]... NAME CMD...`
[ "$1" = exec ] || { echo "fake docker: only exec is emulated" >&2; exit 125; }
shift; stdin=0
while [ $# -gt 0 ]; do
  case "$1" in
    -i|-it|-ti|--interactive) stdin=1; shift ;;
    -e|-u|-w) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
name=$1; shift
[ -d "$FAKE_CONTAINERS/$name" ] || { echo "Error response from daemon: No such container: $name" >&2; exit 1; }
[ "$stdin" = 1 ] || exec </dev/null
exec "$FAKE_CONTAINERS/fakectr" "$FAKE_CONTAINERS/$name" "$@"
"""

FAKE_KUBECTL = r"""#!/bin/sh
# fake kubectl: only `kubectl exec [-i|--stdin] POD -- CMD...`
[ "$1" = exec ] || { echo "fake kubectl: only exec is emulated" >&2; exit 1; }
shift; stdin=0; pod=""
while [ $# -gt 0 ]; do
  case "$1" in
    -i|-it|-ti|--stdin|--stdin=true) stdin=1; shift ;;
    --) shift; break ;;
    -*) shift ;;
    *) pod=$1; shift ;;
  esac
done
[ -d "$FAKE_CONTAINERS/$pod" ] || { echo "Error from server (NotFound): pods \"$pod\" not found" >&2; exit 1; }
[ "$stdin" = 1 ] || exec </dev/null
exec "$FAKE_CONTAINERS/fakectr" "$FAKE_CONTAINERS/$pod" "$@"
"""

FAKE_PCT = r"""#!/bin/sh
# fake pct: only `pct exec VMID -- CMD...` (stdin is always attached, as with Proxmox's pct)
[ "$1" = exec ] || { echo "fake pct: only exec is emulated" >&2; exit 255; }
vmid=$2
[ "$3" = "--" ] || { echo "400 too many arguments" >&2; exit 255; }
shift 3
[ -d "$FAKE_CONTAINERS/$vmid" ] || { echo "Configuration file 'nodes/pve/lxc/$vmid.conf' does not exist" >&2; exit 255; }
exec "$FAKE_CONTAINERS/fakectr" "$FAKE_CONTAINERS/$vmid" "$@"
"""


def _need_container() -> None:
    """Skip unless a mount namespace can hide this machine's CUDA (root, unshare, CUDA present)."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a mount namespace")
    r = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"unshare -m failed: {r.stderr.strip()}")
    if not os.path.isdir(HOST_CUDA):
        pytest.skip("not this workplace image: no host CUDA to hide")


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fake tools in a bin dir; containers: gpu1 (its own nvcc 12.8), 200 (no nvcc at all)."""
    root = tmp_path_factory.mktemp("containers")
    tools = root / "tools"
    tools.mkdir()
    _exe(tools / "docker", FAKE_DOCKER)
    _exe(tools / "kubectl", FAKE_KUBECTL)
    _exe(tools / "pct", FAKE_PCT)
    ctrs = root / "ctrs"
    ctrs.mkdir()
    _exe(ctrs / "fakectr", FAKECTR)
    for name in ("gpu1", "200"):
        (ctrs / name / "bin").mkdir(parents=True)
        (ctrs / name / "empty").mkdir()
        (ctrs / name / "empty-file").write_text("")
    _exe(ctrs / "gpu1" / "bin" / "nvcc",  # what CUDA 12.8 Update 1's nvcc prints
         "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
         "echo 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    return {"tools": tools, "ctrs": ctrs}


def _doctor(world: dict[str, Path], *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{world['tools']}:{os.environ['PATH']}",
               FAKE_CONTAINERS=str(world["ctrs"]), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "fastpath", "doctor", *args], capture_output=True,
                          text=True, env=env, timeout=180)


def _nvcc_versions(report: dict) -> set[str]:
    return {c.get("version") for c in report["facts"]["nvcc_candidates"] if c["kind"] == "nvcc"}


@pytest.mark.parametrize("prefix", ["docker exec -i gpu1", "docker exec -e X=1 --interactive gpu1",
                                    "kubectl exec -i gpu1 --"])
def test_probe_runs_inside_the_container(world, prefix):
    _need_container()
    out = _doctor(world, "--on", prefix, "--json", "--probe", "static")
    assert out.returncode in (0, 1), out.stderr
    report = json.loads(out.stdout)
    assert _nvcc_versions(report) == {"12.8.93"}, report["facts"]["nvcc_candidates"]
    assert report["facts"]["probe"]["target"] == prefix


@pytest.mark.parametrize("prefix", ["docker exec gpu1", "kubectl exec gpu1 --",
                                    "podman exec -e A=1 gpu1"])
def test_exec_without_stdin_is_a_usage_error(world, prefix):
    out = _doctor(world, "--on", prefix)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "without -i does not pass stdin" in lines[0], out.stderr


@pytest.mark.parametrize(("prefix", "message"), [
    ("docker exec -i nosuch", "No such container: nosuch"),
    ("kubectl exec -i nosuch --", 'pods "nosuch" not found'),
])
def test_unknown_container_is_one_clear_line(world, prefix, message):
    out = _doctor(world, "--on", prefix)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_seed_story_ssh_then_pct_exec(world, sshd: ThrowawaySshd):
    """`ssh HOST pct exec 200 --`: container 200 has no nvcc although the host has CUDA 13.0;
    the probe, run in there through two hops, says so, and the plan shows 48 of 64 layers slow
    (the container's python has no kernels, nor transformers: the plan covers every release)."""
    _need_container()
    remote_env = ["env", f"PATH={world['tools']}:/usr/bin:/bin", f"FAKE_CONTAINERS={world['ctrs']}"]
    prefix = shlex.join(sshd.prefix(*remote_env, "pct", "exec", "200", "--"))
    out = _doctor(world, "--on", prefix, "--json", "--model", "qwen3.5-27b")
    # no GPU in there, but causal-conv1d is missing: a blocker on any GPU, so BLOCKED (exit 1)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["verdict"] == "blocked"
    assert _nvcc_versions(report) == set()
    assert report["facts"]["cuda_home"]["has_nvcc"] is False
    assert report["model"]["layers_slow"] == 48 and report["model"]["layers_total"] == 64
    missing = _doctor(world, "--on", shlex.join(sshd.prefix(*remote_env, "pct", "exec", "201", "--")))
    assert missing.returncode != 0
    assert "201.conf' does not exist" in missing.stderr.strip().splitlines()[-1]


def test_fleet_from_an_ansible_inventory_of_pods(world, tmp_path):
    """An inventory host with `ansible_connection=kubectl` is probed inside its pod."""
    _need_container()
    inv = tmp_path / "hosts.ini"
    inv.write_text("[pods]\ntrainer ansible_connection=kubectl ansible_kubectl_pod=gpu1\n"
                   "gone ansible_connection=kubectl ansible_kubectl_pod=nosuch\n")
    out = _doctor(world, "--hosts", str(inv), "--json", "--timeout", "60")
    report = json.loads(out.stdout)
    by_name = {t["name"]: t for t in report["targets"]}
    assert by_name["trainer"]["status"] == "ok", by_name["trainer"]["error"]
    assert _nvcc_versions(by_name["trainer"]["report"]) == {"12.8.93"}
    assert by_name["gone"]["status"] != "ok" and 'pods "nosuch" not found' in by_name["gone"]["error"]
    # 1 when the diagnosed target is blocked (causal-conv1d missing), else 3 for the failed one
    assert out.returncode == (1 if by_name["trainer"]["report"]["exit_code"] == 1 else 3)
