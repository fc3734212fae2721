"""SIGTERM and SIGHUP clean up like SIGINT. `timeout 3 fastpath doctor --hosts
fleet.txt --timeout 100` left ten `sleep` targets orphaned (PPID 1); CI cancellations send
SIGTERM. Every target's process group is killed, the doctor exits 128+signal with one line, and
asyncio prints nothing after the interrupt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hostile_fakes import env


def _sleepers(tag: str) -> list[int]:
    """pids of live processes whose command line carries `tag`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag.encode() in cmdline and state != "Z":
            out.append(int(entry))
    return out


def _children(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                out += [int(p) for p in fh.read().split()]
        except OSError:
            continue
    return out


def _wait_for(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.parametrize(("sig", "mode"), [(signal.SIGTERM, "hosts"), (signal.SIGHUP, "hosts"),
                                           (signal.SIGINT, "hosts"), (signal.SIGTERM, "on")])
def test_signal_kills_every_target(tmp_path: Path, sig: signal.Signals, mode: str) -> None:
    tag = f"fastpath-hostile-{uuid.uuid4().hex[:12]}"
    # each target: a shell that leaves a `sleep` child (the shape of ssh -> remote command)
    prefix = f"sh -c 'sleep 1000; :' {tag}"  # the tag is the shell's $0: only the shell has it
    if mode == "hosts":
        hosts = tmp_path / "fleet.txt"
        hosts.write_text(f"{prefix}\n" * 10)
        args = ["--hosts", str(hosts)]
        expected = 10
    else:
        args = ["--on", prefix]
        expected = 1
    proc = subprocess.Popen([sys.executable, "-m", "fastpath", "doctor", *args, "--timeout", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    def started() -> bool:
        shells = _sleepers(tag)
        return len(shells) >= expected and len(_children(shells)) >= expected

    shells: list[int] = []
    try:
        assert _wait_for(started, 60), "targets did not start"
        shells = _sleepers(tag)
        children = _children(shells)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        leftovers = [pid for pid in shells if os.path.exists(f"/proc/{pid}")]
        for pid in leftovers:  # this test's own targets (each leads its process group)
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err.decode()
    text = err.decode()
    assert "Traceback" not in text and "Unknown child process" not in text, text
    assert "loop is closed" not in text.lower() and "Task was destroyed" not in text, text
    assert len(text.strip().splitlines()) <= (2 if mode == "hosts" else 1), text
    # nothing left: neither the shells nor their sleep children (no PPID-1 orphans)
    assert _wait_for(lambda: not _sleepers(tag), 10), "targets left running"
    assert _wait_for(lambda: not any(os.path.exists(f"/proc/{c}") and
                                     open(f"/proc/{c}/stat").read().rsplit(")", 1)[1].split()[0]
                                     != "Z" for c in children), 10), "orphaned children"


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_unread_stdin_leaves_no_asyncio_noise(how: str) -> None:
    """A target that never reads its stdin, sent a little more than a pipe holds (the probe is
    over 64 KiB; the rest stays in asyncio's buffer, below its flow-control mark), then stopped by the timeout or by a cancellation (what SIGTERM does): asyncio logged
    InvalidStateError from pipe_connection_lost, because the stdin-closed future had been
    cancelled with the task awaiting it."""
    code = f"""
import asyncio
from fastpath.doctor.remote import run_command

async def main():
    work = run_command(["sh", "-c", "sleep 1000"], b"x" * 70_000, timeout=1.0)
    if {how!r} == "timeout":
        assert (await work).timed_out
        return
    task = asyncio.ensure_future(work)
    await asyncio.sleep(0.5)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass

asyncio.run(main())
print("done")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env(), timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert proc.stderr == "", proc.stderr
