"""fastpath.doctor.remote over a real OpenSSH server on 127.0.0.1 and real local argv prefixes."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sshd_server import ThrowawaySshd, closed_port, pid_alive

from fastpath.doctor.remote import parse_facts, parse_prefix, probe_remote, probe_target
from fastpath.shared.errors import TargetError, UsageError


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_cuda(tmp_path: Path) -> Path:
    """A fake CUDA 12.8 toolkit + nvidia-smi + dpkg-query, as seen by a target without python."""
    home = tmp_path / "cuda-12.8"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime.h").write_text("/* fake */\n")
    _script(
        home / "bin" / "nvcc",
        'echo "nvcc: NVIDIA (R) Cuda compiler driver"\n'
        'echo "Cuda compilation tools, release 12.8, V12.8.93"\n',
    )
    _script(
        home / "bin" / "nvidia-smi",
        'case "$1" in\n'
        '  --query-gpu=*) echo "0, NVIDIA H200, 570.86.15, 9.0, 143771"\n'
        '                 echo "1, NVIDIA H200, 570.86.15, 9.0, 143771" ;;\n'
        '  *) echo "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8 |" ;;\n'
        "esac\n",
    )
    _script(home / "bin" / "dpkg-query", 'echo "ii |cuda-nvcc-12-8|12.8.93-1"\n')
    return home


def test_python_probe_over_ssh(sshd: ThrowawaySshd) -> None:
    facts = probe_remote(sshd.prefix("env", "FASTPATH_PROBE_SKIP=imports"), timeout=60)
    assert facts["schema"] == "fastpath.facts/1"
    assert facts["probe"]["kind"] == "python"
    assert facts["host"]["kernel"] == os.uname().release  # it really ran on "the target"
    assert "127.0.0.1" in facts["probe"]["target"]
    assert isinstance(facts["nvcc_candidates"], list)


def test_no_python_target_gets_sh_probe(
    sshd: ThrowawaySshd, no_python_toolbox: Path, fake_cuda: Path
) -> None:
    """python3 cannot be found on the target: the sh probe still reports the toolchain facts
    (under dash + GNU tools, and under busybox ash + applets)."""
    path = f"{fake_cuda}/bin:{no_python_toolbox}"
    prefix = sshd.prefix("env", "-i", f"PATH={path}", f"CUDA_HOME={fake_cuda}", "HF_TOKEN=hunter2")
    facts = probe_remote(prefix, timeout=30)
    assert facts["probe"]["kind"] == "sh"
    errors = facts["probe"]["errors"]
    for key in ("torch", "triton", "packages", "nvrtc"):
        assert facts[key] is None
        assert errors[key] == "could not collect: no python on target"
    [nvcc] = [c for c in facts["nvcc_candidates"] if c["realpath"].startswith(str(fake_cuda))]
    assert nvcc["version"] == "12.8.93" and (nvcc["major"], nvcc["minor"]) == (12, 8) and nvcc["kind"] == "nvcc"
    assert set(nvcc["found_by"]) == {"PATH", "CUDA_HOME"}  # same file found two ways: one entry
    assert facts["cuda_home"]["torch_would_use"] == str(fake_cuda)
    assert facts["cuda_home"]["how"] == "CUDA_HOME"
    assert facts["cuda_home"]["headers"] == {"cuda_runtime.h": True, "cusparse.h": False}
    assert [g["name"] for g in facts["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert facts["gpus"][1] == {
        "index": 1, "name": "NVIDIA H200", "driver": "570.86.15", "compute_capability": "9.0",
        "memory_mib": 143771, "source": "nvidia-smi --query-gpu",
    }
    assert facts["driver"]["cuda_version"] == "12.8"
    assert facts["package_db"]["dpkg"] == [{"name": "cuda-nvcc-12-8", "version": "12.8.93-1"}]
    assert facts["host"]["kernel"] == os.uname().release
    assert facts["env"]["HF_TOKEN"] == "<redacted>"
    assert "hunter2" not in json.dumps(facts)


def test_explicit_python_missing_says_which(sshd: ThrowawaySshd, no_python_bin: Path) -> None:
    prefix = sshd.prefix("env", "-i", f"PATH={no_python_bin}")
    facts = probe_remote(prefix, python="/opt/py3.12/bin/python3", timeout=30)
    assert facts["probe"]["kind"] == "sh"
    assert "'/opt/py3.12/bin/python3' not found on target" in facts["probe"]["errors"]["torch"]


def test_unreachable_is_one_line(sshd: ThrowawaySshd) -> None:
    with pytest.raises(TargetError) as exc:
        probe_remote(sshd.prefix(port=closed_port()), timeout=30)
    message = str(exc.value)
    assert message.startswith("unreachable: ") and "Connection refused" in message
    assert "\n" not in message


def test_timeout_kills_the_whole_process_group(hang_target: tuple[Path, Path]) -> None:
    script, pidfile = hang_target
    pidfile.unlink(missing_ok=True)
    started = time.monotonic()
    with pytest.raises(TargetError, match=r"^timed out after 1.5s$"):
        probe_remote([str(script)], timeout=1.5)
    assert time.monotonic() - started < 10  # returned, did not wait for the 600 s sleep
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child), "the target's child process survived the timeout"


def test_non_json_and_empty_output(tmp_path: Path) -> None:
    chatty = _script(tmp_path / "chatty", 'echo "Welcome to the cluster"\n')
    with pytest.raises(TargetError, match=r"^non-JSON output: 'Welcome to the cluster'$"):
        probe_remote([str(chatty)], timeout=10)
    with pytest.raises(TargetError, match=r"^no output$"):
        probe_remote(["true"], timeout=10)
    failing = _script(tmp_path / "failing", 'echo "container 200 does not exist" >&2\nexit 2\n')
    with pytest.raises(TargetError, match=r"^exit 2: container 200 does not exist$"):
        probe_remote([str(failing)], timeout=10)
    with pytest.raises(TargetError, match="no such program on this machine"):
        probe_remote(["/nonexistent/dockr", "exec", "-i", "c"], timeout=10)


def test_banner_before_facts_is_skipped() -> None:
    out = b'Last login: yesterday\n{"schema": "fastpath.facts/1", "probe": {}}\n'
    assert parse_facts(out) == {"schema": "fastpath.facts/1", "probe": {}}
    assert parse_facts(b"[1, 2]") is None
    assert parse_facts(b"") is None


def test_prefix_parsing() -> None:
    assert parse_prefix("ssh h pct exec 200 --") == ["ssh", "h", "pct", "exec", "200", "--"]
    assert parse_prefix("ssh 'h;touch PWNED'") == ["ssh", "h;touch PWNED"]
    with pytest.raises(UsageError):
        parse_prefix("ssh 'unterminated")
    with pytest.raises(UsageError):
        parse_prefix("   ")


def test_injection_strings_stay_strings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefix words with shell syntax reach the target verbatim: no local shell ever sees them."""
    monkeypatch.chdir(tmp_path)
    facts = probe_remote(
        "env 'CUDA_HOME=$(id)' 'CUDA_PATH=h;touch PWNED' FASTPATH_PROBE_SKIP=imports", timeout=60
    )
    assert facts["env"]["CUDA_HOME"] == "$(id)"
    assert facts["env"]["CUDA_PATH"] == "h;touch PWNED"
    assert not (tmp_path / "PWNED").exists()
    assert "uid=" not in json.dumps(facts)


def test_injection_in_ssh_host_name(
    sshd: ThrowawaySshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host named `h;touch PWNED` or `$(id)` reaches ssh as one argv word: ssh refuses it as a
    host name, nothing runs locally, and the reason is reported on one line."""
    monkeypatch.chdir(tmp_path)
    for alias in ("h;touch PWNED", "$(id)"):
        prefix = [*sshd.ssh_args(), "-o", "HostName=127.0.0.1", "-l", sshd.user, alias]
        with pytest.raises(TargetError) as exc:
            probe_remote(prefix, timeout=30)
        assert str(exc.value) == "unreachable: hostname contains invalid characters"
    assert not (tmp_path / "PWNED").exists()


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastpath", "doctor", *args],
        capture_output=True, text=True, timeout=timeout,
    )


def test_cli_on_with_model_uses_the_targets_facts(
    sshd: ThrowawaySshd, no_python_bin: Path, tmp_path: Path
) -> None:
    """`fastpath doctor --on PREFIX --model X --json`: the plan uses the TARGET's transformers.

    The target's site-packages is a fake environment holding transformers 4.57.1 (this machine
    has 5.x), so a plan computed from local facts would name the wrong version.
    """
    site = tmp_path / "site-packages"
    dist = site / "transformers-4.57.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 4.57.1\n")
    prefix = shlex.join(
        sshd.prefix("env", f"FASTPATH_PROBE_SITE_PACKAGES={site}", "FASTPATH_PROBE_SKIP=imports",
                    "HF_TOKEN=hunter2")
    )
    run = _cli("--on", prefix, "--model", "qwen3.5-27b", "--json")
    report = json.loads(run.stdout)
    # the target has no GPU: a verdict (3 is UNKNOWN: nothing blocks, no GPU to judge), not an error
    assert report["verdict"] != "error" and run.returncode in (0, 1, 3), run.stderr
    facts = report["facts"]
    assert facts["probe"]["kind"] == "python" and "127.0.0.1" in facts["probe"]["target"]
    assert facts["packages"]["transformers"]["version"] == "4.57.1"
    assert report["model"]["transformers"] == "4.57.1"
    assert "hunter2" not in run.stdout + run.stderr

    # a target without python: still a report, the plan says what it could not know
    prefix = shlex.join(sshd.prefix("env", "-i", f"PATH={no_python_bin}"))
    run = _cli("--on", prefix, "--model", "qwen3.5-27b")
    assert run.returncode in (0, 1, 3), run.stderr
    assert not run.stdout.startswith("ERROR") and "Traceback" not in run.stderr
    assert "no python on target" in run.stdout


def test_cli_on_failures_are_one_line(sshd: ThrowawaySshd, hang_target: tuple[Path, Path]) -> None:
    runs = [
        (_cli("--on", shlex.join(sshd.prefix(port=closed_port()))), "unreachable: "),
        (_cli("--on", str(hang_target[0]), "--timeout", "1"), "timed out after 1s"),
        (_cli("--on", "ssh 'unterminated"), "cannot split target prefix"),
    ]
    for run, needle in runs:
        assert run.returncode in (2, 3)  # bad prefix: 2; unreachable / timed out: 3
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], run.stderr
        assert lines[0].startswith("fastpath doctor: error: ")


def test_nothing_is_written_on_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both probes (Python with its torch import, and sh) leave HOME, TMPDIR, the cache dir and
    the working directory of the target untouched."""
    home, tmp, cwd = tmp_path / "home", tmp_path / "tmp", tmp_path / "cwd"
    for d in (home, tmp, cwd):
        d.mkdir()
    monkeypatch.chdir(cwd)
    prefix = ["env", f"HOME={home}", f"TMPDIR={tmp}", f"XDG_CACHE_HOME={home}/.cache"]
    assert probe_remote(prefix, timeout=120)["probe"]["kind"] == "python"
    assert probe_remote(prefix, python="no-such-python3", timeout=60)["probe"]["kind"] == "sh"
    assert [p for p in tmp_path.rglob("*") if p not in (home, tmp, cwd)] == []


def test_daemon_holding_the_pipes_does_not_hang(tmp_path: Path) -> None:
    """A target that leaves a daemonised process holding stdout/stderr (an ssh ControlPersist
    master does this) still returns promptly with its facts."""
    pidfile = tmp_path / "daemon.pid"
    target = _script(
        tmp_path / "leaves-daemon",
        'echo \'{"schema": "fastpath.facts/1", "probe": {"kind": "python"}}\'\n'
        f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' &\n"
        "sleep 0.2\n",
    )
    try:
        started = time.monotonic()
        facts = probe_remote([str(target)], timeout=30)
        assert facts["probe"]["kind"] == "python"
        assert time.monotonic() - started < 15  # not the 30 s timeout
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), 9)


def test_cancelling_a_probe_kills_the_target(hang_target: tuple[Path, Path]) -> None:
    """Ctrl-C (task cancellation) must not leave the target running: it sits in its own session,
    so it never saw the terminal's SIGINT."""
    script, pidfile = hang_target
    pidfile.unlink(missing_ok=True)

    async def cancel_soon() -> None:
        task = asyncio.ensure_future(probe_target([str(script)], timeout=100))
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_soon(), timeout=30))
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)
