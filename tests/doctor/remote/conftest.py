"""Fixtures for the remote/fleet tests: a real sshd on 127.0.0.1 and target environments."""

from __future__ import annotations

import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd_server import ThrowawaySshd, sshd_missing_reason, start_sshd

# The utilities the sh probe uses; a "no python" target gets only these (and no python).
SH_PROBE_TOOLS = ("sh", "sed", "tr", "uname", "date", "env", "readlink", "getconf", "cat")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThrowawaySshd]:
    reason = sshd_missing_reason()
    if reason:
        pytest.skip(reason)
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


def _toolbox(root: Path, kind: str) -> Path:
    bindir = root / kind / "bin"
    bindir.mkdir(parents=True)
    for tool in SH_PROBE_TOOLS:
        if kind == "busybox":
            (bindir / tool).symlink_to(shutil.which("busybox") or "/bin/busybox")
            continue
        for base in ("/usr/bin", "/bin"):
            src = Path(base) / tool
            if src.exists():
                (bindir / tool).symlink_to(src)
                break
    assert not any("python" in p.name for p in bindir.iterdir())
    return bindir


@pytest.fixture(scope="session")
def no_python_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding sh and the few tools probe.sh needs, and no python at all.

    Used as `env -i PATH=<dir>` at the end of a target prefix, so the target really cannot find
    an interpreter (the remote login shell still can, the command it runs cannot).
    """
    return _toolbox(tmp_path_factory.mktemp("nopy"), "debian")


@pytest.fixture(scope="session", params=["debian", "busybox"])
def no_python_toolbox(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like no_python_bin, for both dash + GNU tools and busybox (ash + its applets, the usual
    small container without python)."""
    if request.param == "busybox" and shutil.which("busybox") is None:
        pytest.skip("busybox not installed (scripts/setup_sshd.sh installs busybox-static)")
    return _toolbox(tmp_path_factory.mktemp("nopy"), request.param)


@pytest.fixture(scope="session")
def hang_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A target 'connector' that ignores its arguments and hangs, leaving a child behind.

    Returns (script, pidfile): the pid of the child `sleep` lands in pidfile, so a test can check
    that the whole process group was killed on timeout, not only the first process.
    """
    d = tmp_path_factory.mktemp("hang")
    pidfile = d / "child.pid"
    script = d / "hang-target"
    script.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pidfile}\nwait\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, pidfile

