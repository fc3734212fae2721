"""`fastpath doctor --hosts FILE` over a real sshd: a 9-target fleet with an unreachable host, a
hanging one, targets without python, injection attempts and a secret in a prefix.

The fleet runs twice per session (JSON, then the table), shared by the tests below.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from sshd_server import ThrowawaySshd, closed_port, pid_alive

from fastpath.doctor.fleet import majority_outliers, run_fleet

# per-target timeout: the hanging target costs this much per run; generous for a loaded CI box
TIMEOUT = 8.0


def _fake_cuda(root: Path, version: str) -> Path:
    home = root / f"cuda-{version}"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "Cuda compilation tools, release {version}, V{version}.1"\n')
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return home


@dataclass
class FleetRun:
    expected: list[str]
    code_json: int
    out_json: str
    seconds_json: float
    code_table: int
    out_table: str
    workdir: Path
    hang_pidfile: Path


def _args(hosts: Path, **kw: object) -> argparse.Namespace:
    base = dict(hosts=str(hosts), limit=None, jobs=None, timeout=TIMEOUT, python=None, model=None, json=False)
    base.update(kw)
    return argparse.Namespace(**base)


def _run(args: argparse.Namespace) -> tuple[int, str, float]:
    buf = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(buf):
        code = run_fleet(args)
    return code, buf.getvalue(), time.monotonic() - started


@pytest.fixture(scope="module")
def fleet(
    sshd: ThrowawaySshd,
    no_python_bin: Path,
    hang_target: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> FleetRun:
    """Write a 9-line prefix-list fleet file and run it (JSON with --model, then the table)."""
    root = tmp_path_factory.mktemp("fleet")
    workdir = root / "cwd"
    workdir.mkdir()
    cuda128, cuda130 = _fake_cuda(root, "12.8"), _fake_cuda(root, "13.0")
    hang_script, pidfile = hang_target

    def nopy(cuda: Path) -> list[str]:
        return sshd.prefix("env", "-i", f"PATH={cuda}/bin:{no_python_bin}")

    lines = [
        ("ok", sshd.prefix("env", "FASTPATH_PROBE_SKIP=imports", "HF_TOKEN=hunter2")),
        ("ok", nopy(cuda128)),
        ("ok", nopy(cuda128)),
        ("ok", nopy(cuda128)),
        ("ok", nopy(cuda130)),  # the odd one out: a different nvcc
        ("unreachable", sshd.prefix(port=closed_port())),
        ("timeout", [str(hang_script), "ssh", "gpu-node-7"]),
        ("ok", ["env", "CUDA_HOME=$(id)", "CUDA_PATH=h;touch PWNED", "FASTPATH_PROBE_SKIP=imports"]),
        ("unreachable", [*sshd.ssh_args(), "-o", "HostName=127.0.0.1", "h;touch PWNED"]),
    ]
    path = root / "fleet.txt"
    path.write_text("# test fleet\n" + "".join(shlex.join(argv) + "\n" for _, argv in lines))
    old = os.getcwd()
    os.chdir(workdir)  # a PWNED file would land here
    try:
        pidfile.unlink(missing_ok=True)
        code_json, out_json, seconds = _run(_args(path, json=True, model="qwen3.5-27b"))
        code_table, out_table, _ = _run(_args(path))
    finally:
        os.chdir(old)
    return FleetRun([s for s, _ in lines], code_json, out_json, seconds, code_table, out_table,
                    workdir, pidfile)


def test_fleet_json(fleet: FleetRun) -> None:
    report = json.loads(fleet.out_json)
    assert fleet.code_json == 1  # the reachable targets lack causal-conv1d: blocked on any GPU
    assert report["schema"] == "fastpath.fleet/1" and report["exit_code"] == 1
    targets = report["targets"]
    assert [t["status"] for t in targets] == fleet.expected, [t["error"] for t in targets]
    assert targets[5]["error"].startswith("unreachable: ") and "Connection refused" in targets[5]["error"]
    assert targets[6]["error"] == f"timed out after {TIMEOUT:g}s"
    assert targets[8]["error"] == "unreachable: hostname contains invalid characters"
    assert fleet.seconds_json < 60  # the 600 s hang did not hold the run
    # the hanging target's child was killed with its process group
    child = int(fleet.hang_pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child), "the hanging target's child survived"
    # every ok target carries its full report, facts included, and a plan from its own facts
    for t in targets:
        if t["status"] == "ok":
            assert t["report"]["facts"]["schema"] == "fastpath.facts/1"
            assert t["report"]["model"]["model"].startswith("qwen3.5-27b")
    assert [targets[i]["report"]["facts"]["probe"]["kind"] for i in (0, 1, 4, 7)] == [
        "python", "sh", "sh", "python"
    ]
    # injection attempts stayed data
    assert targets[7]["report"]["facts"]["env"]["CUDA_HOME"] == "$(id)"
    assert not (fleet.workdir / "PWNED").exists()
    assert "uid=" not in fleet.out_json
    # secrets: neither the prefix, the label nor the facts carry the value
    assert "hunter2" not in fleet.out_json
    assert "HF_TOKEN=<redacted>" in targets[0]["prefix"]


def test_fleet_table_marks_the_odd_one_out(fleet: FleetRun) -> None:
    targets = json.loads(fleet.out_json)["targets"]
    # four targets without python, three with the 12.8 toolkit: the 13.0 one is the odd one out
    nvcc = [t["table_row"]["nvcc"] for t in targets[1:5]]
    assert nvcc[0] == nvcc[1] == nvcc[2] != nvcc[3]
    assert "12.8.1" in nvcc[0] and "12.8.1" not in nvcc[3] and "13.0.1" in nvcc[3]
    assert [("nvcc" in t["differs_from_majority"]) for t in targets[1:5]] == [False] * 3 + [True]
    assert all(t["differs_from_majority"] == [] for t in targets if t["status"] != "ok")

    out = fleet.out_table
    assert fleet.code_table == 1
    assert f"{nvcc[3]} *" in out and f"{nvcc[0]} *" not in out  # the cell is marked in the table
    assert "* differs from the majority of the fleet" in out
    assert "probe: static (nothing imported on the targets" in out  # the fleet default says so
    # the table wraps at the terminal's width, and a long tmp path (an xdist worker's) moves the
    # break into the error text: read the words, not the lines
    words = " ".join(out.split())
    assert f"timed out after {TIMEOUT:g}s" in words and "unreachable: " in words
    assert "h;touch PWNED" in out  # the hostile name is shown as data
    assert "hunter2" not in out


def test_majority_outliers() -> None:
    cols = {"GPU": "H200 (9.0)", "driver": "570", "torch": "2.11.0+cu130", "nvcc": "13.0",
            "causal_conv1d": "missing", "fla": "0.6.0", "verdict": "slow"}
    rows = [dict(cols) for _ in range(4)] + [dict(cols, driver="535"), dict(cols, torch="x")]
    ok = [True] * 5 + [False]
    marks = majority_outliers(rows, ok)
    assert marks[4] == {"driver"}
    assert marks[5] == set()  # failed targets are not compared
    assert all(not m for m in marks[:4])
    tie = majority_outliers([dict(cols, nvcc="12.8"), dict(cols)], [True, True])
    assert tie == [set(), set()]  # 1 vs 1: no majority, nothing marked


def test_cli_limit_and_usage_errors(tmp_path: Path) -> None:
    """Through the real CLI: bad input is one line and exit 2, never a traceback."""
    fleet_file = tmp_path / "fleet.txt"
    fleet_file.write_text("ssh gpu1\n")
    cmd = [sys.executable, "-m", "fastpath", "doctor", "--hosts"]
    runs = [
        subprocess.run([*cmd, str(tmp_path / "nope.txt")], capture_output=True, text=True, timeout=60),
        subprocess.run([*cmd, str(fleet_file), "--limit", "gpu"], capture_output=True, text=True, timeout=60),
    ]
    for run, needle in zip(runs, ("no such file", "--limit needs an Ansible inventory"), strict=True):
        assert run.returncode == 2, run.stderr
        assert needle in run.stderr
        assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1



def test_fleet_probe_static_by_default_full_on_request(sshd: ThrowawaySshd, tmp_path: Path) -> None:
    """Fleets default to the import-free probe (`python3 - --static` on the target);
    `--probe full` imports torch and the kernel packages there."""
    path = tmp_path / "one.txt"
    path.write_text(shlex.join(sshd.prefix()) + "\n")
    modes = {}
    for probe in (None, "full"):
        _code, out, _ = _run(_args(path, json=True, probe=probe))
        target = json.loads(out)["targets"][0]
        assert target["status"] == "ok", target["error"]
        facts = target["report"]["facts"]
        modes[probe] = facts
    assert "imports" in modes[None]["probe"]["options"]["skip"]
    assert "imports" not in modes["full"]["probe"]["options"]["skip"]
    static_torch, full_torch = modes[None]["torch"], modes["full"]["torch"]
    assert (static_torch is None) == (full_torch is None)
    if full_torch is not None:  # the same torch seen both ways
        assert static_torch["source"].startswith("static")
        assert full_torch["source"].startswith("import torch")
        assert static_torch["version"] == full_torch["version"]
        assert static_torch["cuda"] == full_torch["cuda"]
        assert static_torch["cxx11_abi"] == full_torch["cxx11_abi"]
    for name, pkg in modes["full"]["packages"].items():  # same verdicts, without importing
        static_ok = modes[None]["packages"][name]["import"]["ok"]
        if pkg["import"]["ok"] is None:  # full mode skips triton's import without a GPU
            assert static_ok in (None, True), name
        else:
            assert static_ok == pkg["import"]["ok"], name
